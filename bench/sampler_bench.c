/* The host sampler on one row of the real vocabulary (248,320): milliseconds per call for
 * the modes a server sees. The row is Gaussian logits (sd 3) plus a few peaks (+12), the
 * shape of a confident model's output; "flat" drops the peaks, the worst case for top-p.
 * build: cc -O2 -Iinclude -Isrc bench/sampler_bench.c build/liblily.a -o build/sampler_bench -lm -pthread -ljansson */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "engine/sampler.h"
#include "util/util.h"

int main(void) {
    int V = 248320;
    float *lg = malloc(sizeof *lg * (size_t)V);
    int32_t *counts = calloc((size_t)V, sizeof *counts);
    lily_rng cr; /* 300 generated tokens so far, for the penalty case */
    lily_rng_seed(&cr, 7);
    for (int k = 0; k < 300; k++) counts[lily_rng_u64(&cr) % (uint64_t)V]++;
    lily_rng r;
    lily_rng_seed(&r, 1);
    static const struct { const char *name; float t; int k; float p, pres; int lp; } cs[] = {
        { "greedy", 0, 0, 1, 0, 0 },
        { "T 0.7, top-k 20, top-p 0.8 (Qwen's default)", 0.7f, 20, 0.8f, 0, 0 },
        { "T 0.6, top-k 20, top-p 0.95, presence 1.5", 0.6f, 20, 0.95f, 1.5f, 0 },
        { "T 1.0, top-p 0.95", 1.0f, 0, 0.95f, 0, 0 },
        { "T 1.0", 1.0f, 0, 1, 0, 0 },
        { "T 0.7, top-k 20, 5 logprobs", 0.7f, 20, 0.8f, 0, 5 },
    };
    for (int flat = 0; flat < 2; flat++) {
        for (int i = 0; i < V; i++) {
            double u1 = lily_rng_uniform(&r) + 1e-12, u2 = lily_rng_uniform(&r);
            lg[i] = (float)(3 * sqrt(-2 * log(u1)) * cos(6.283185307 * u2));
        }
        for (int i = 0; !flat && i < 8; i++) lg[lily_rng_u64(&r) % (uint64_t)V] += 12;
        for (unsigned c = 0; c < sizeof cs / sizeof cs[0]; c++) {
            lily_sampling p;
            lily_sampling_default(&p);
            p.temperature = cs[c].t; p.top_k = cs[c].k; p.top_p = cs[c].p; p.presence_penalty = cs[c].pres; p.n_logprobs = cs[c].lp;
            lily_token t;
            lily_status st;
            int N = 40;
            double best = 1e9;
            for (int rep = 0; rep < 3; rep++) {
                double t0 = lily_now();
                for (int i = 0; i < N; i++) lily_sample_logits(lg, V, &p, &r, cs[c].pres ? counts : NULL, &t, &st);
                double ms = (lily_now() - t0) / N * 1e3;
                if (ms < best) best = ms;
            }
            printf("%s row, %-45s %8.3f ms\n", flat ? "flat  " : "peaked", cs[c].name, best);
        }
    }
    free(lg); free(counts);
    return 0;
}
