/* Times tok_encode on a text file (load excluded): best of R runs, one thread.
 * usage: tok_bench TOKENIZER TEXT [RUNS] -> "lily: BYTES bytes, TOKENS tokens, SECONDS s, MB/s" */
#include <stdio.h>
#include <stdlib.h>
#include "tokenizer/tokenizer.h"
#include "util/util.h"

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: tok_bench TOKENIZER TEXT [RUNS]\n"); return 2; }
    int runs = argc > 3 ? atoi(argv[3]) : 3;
    lily_status st;
    tok_tokenizer *t;
    if (tok_load(argv[1], &t, &st)) { fprintf(stderr, "%s\n", st.msg); return 1; }
    size_t n;
    char *text = lily_read_file(argv[2], &n, &st);
    if (!text) { fprintf(stderr, "%s\n", st.msg); return 1; }
    double best = 1e30, first = 0;
    int ntok = 0;
    for (int r = 0; r < runs; r++) {
        int32_t *ids;
        double t0 = lily_now();
        if (tok_encode(t, text, n, 1, &ids, &ntok, &st)) { fprintf(stderr, "%s\n", st.msg); return 1; }
        double dt = lily_now() - t0;
        if (r == 0) first = dt;
        if (dt < best) best = dt;
        free(ids);
    }
    printf("lily: %zu bytes, %d tokens, first run %.3f s, best %.3f s, %.1f MB/s\n", n, ntok, first, best, n / best / 1e6);
    free(text);
    tok_free(t);
    return 0;
}
