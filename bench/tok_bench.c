/* Times tok_encode on a text file (load excluded): best of R runs, one thread; the whole
 * file in one call, then again as its blank-line-separated chunks (many short texts).
 * usage: tok_bench TOKENIZER TEXT [RUNS] */
#include <string.h>
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
    printf("lily whole: %zu bytes, %d tokens, first run %.3f s, best %.3f s, %.1f MB/s\n", n, ntok, first, best, n / best / 1e6);
    tok_free(t);
    tok_load(argv[1], &t, &st); /* fresh word cache */
    best = 1e30;
    long total = 0; int chunks = 0;
    for (int r = 0; r < runs; r++) {
        double t0 = lily_now();
        total = 0; chunks = 0;
        for (char *p = text, *e = text + n; p < e;) {
            char *q = strstr(p, "\n\n");
            size_t len = q ? (size_t)(q - p) + 2 : (size_t)(e - p);
            int32_t *ids; int k;
            if (tok_encode(t, p, len, 1, &ids, &k, &st)) { fprintf(stderr, "%s\n", st.msg); return 1; }
            total += k; chunks++;
            free(ids);
            p += len;
        }
        double dt = lily_now() - t0;
        if (r == 0) first = dt;
        if (dt < best) best = dt;
    }
    printf("lily chunks: %d texts, %ld tokens, first run %.3f s, best %.3f s, %.1f MB/s\n", chunks, total, first, best, n / best / 1e6);
    free(text);
    tok_free(t);
    return 0;
}
