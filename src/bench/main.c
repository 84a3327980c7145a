#include <stdio.h>
int main(void) { fprintf(stderr, "lily-bench: not built yet\n"); return 2; }
