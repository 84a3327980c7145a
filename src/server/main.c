#include <stdio.h>
int main(void) { fprintf(stderr, "lily-server: not built yet\n"); return 2; }
