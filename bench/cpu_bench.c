/* CPU engine timing: prefill of P tokens and G greedy decode steps straight through
 * cpu_forward, best and median of R repetitions (the machine may be shared, so best-of
 * is the steadier number). Built and run by bench/cpu_bench.sh.
 * usage: cpu_bench MODEL [--prompt P] [--gen G] [--reps R] [--kind auto|ref|c|avx2] [--threads N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cpu/cpu.h"
#include "loader/weights.h"

static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: cpu_bench MODEL [--prompt P] [--gen G] [--reps R] [--kind auto|ref|c|avx2] [--threads N]\n"); return 2; }
    int P = 128, G = 16, R = 3, nth = 0;
    const char *kind = "auto";
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--prompt")) P = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--gen")) G = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) R = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) nth = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--kind")) kind = argv[i + 1];
        else { fprintf(stderr, "cpu_bench: unknown option %s\n", argv[i]); return 2; }
    }
    if (P < 1 || G < 0 || R < 1 || R > 100) { fprintf(stderr, "cpu_bench: bad sizes\n"); return 2; }
    cpu_mm_path = !strcmp(kind, "ref") ? CPU_MM_REF : !strcmp(kind, "c") ? CPU_MM_C : !strcmp(kind, "avx2") ? CPU_MM_AVX2 : CPU_MM_AUTO;
    lily_status st = { 0 };
    lily_weights w;
    if (lw_load(argv[1], &w, &st)) { fprintf(stderr, "cpu_bench: %s\n", st.msg); return 1; }
    const lily_config *c = &w.cfg;
    cpu_cache k;
    if (cpu_cache_new(c, P + G + 1, &k, &st)) { fprintf(stderr, "cpu_bench: %s\n", st.msg); return 1; }
    lily_pool *pool = lily_pool_new(nth);
    int32_t *ids = malloc((size_t)P * sizeof *ids);
    lily_rng rng;
    lily_rng_seed(&rng, 7);
    for (int i = 0; i < P; i++) ids[i] = (int32_t)(lily_rng_u64(&rng) % (uint64_t)c->vocab);
    float *logits = malloc((size_t)c->vocab * sizeof *logits);
    double *tp = malloc((size_t)R * sizeof *tp), *td = malloc((size_t)R * sizeof *td);
    for (int r = 0; r < R; r++) {
        cpu_cache_reset(&k, c);
        double t0 = lily_now();
        cpu_forward(&w, &k, pool, ids, P, 0, logits, 0, NULL);
        double t1 = lily_now();
        for (int g = 0; g < G; g++) {
            int32_t best = 0;
            for (int v = 1; v < c->vocab; v++) if (logits[v] > logits[best]) best = v;
            cpu_forward(&w, &k, pool, &best, 1, P + g, logits, 0, NULL);
        }
        double t2 = lily_now();
        tp[r] = P / (t1 - t0); td[r] = G ? G / (t2 - t1) : 0;
        fprintf(stderr, "rep %d: prefill %.2f tok/s, decode %.2f tok/s\n", r + 1, tp[r], td[r]);
    }
    qsort(tp, (size_t)R, sizeof *tp, cmp); qsort(td, (size_t)R, sizeof *td, cmp);
    printf("kind %s threads %d hidden %d layers %d experts %d vocab %d: prefill %d tokens best %.2f median %.2f tok/s; "
           "decode %d tokens best %.2f median %.2f tok/s\n", kind, lily_pool_size(pool), c->hidden, c->n_layers, c->n_experts,
           c->vocab, P, tp[R - 1], tp[R / 2], G, td[R - 1], td[R / 2]);
    free(ids); free(logits); free(tp); free(td);
    cpu_cache_free(&k);
    lily_pool_free(pool);
    lw_free(&w);
    return 0;
}
