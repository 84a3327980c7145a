/* The chunked (prefill) and recurrent (decode) Gated DeltaNet forms agree on random
 * inputs, for the real head size and odd ones, across chunk boundaries. */
#include "t.h"
#include "cpu/cpu.h"
#include <stdlib.h>
#include <time.h>

static double rel(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) { double d = (double)a[i] - b[i]; num += d * d; den += (double)b[i] * b[i]; }
    return sqrt(num / (den + 1e-30));
}

static void run(lily_rng *r, int T, int dk, int dv) {
    size_t nq = (size_t)T * dk, nv = (size_t)T * dv;
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nv * 4), *g = malloc((size_t)T * 4), *b = malloc((size_t)T * 4);
    float *S1 = malloc((size_t)dk * dv * 4), *S2 = malloc((size_t)dk * dv * 4), *o1 = malloc(nv * 4), *o2 = malloc(nv * 4);
    for (int t = 0; t < T; t++) { /* l2-normalized q, k as the model feeds them */
        double sq = 0, sk = 0;
        for (int i = 0; i < dk; i++) { q[t * dk + i] = lily_rng_normal(r); k[t * dk + i] = lily_rng_normal(r); sq += q[t * dk + i] * q[t * dk + i]; sk += k[t * dk + i] * k[t * dk + i]; }
        for (int i = 0; i < dk; i++) { q[t * dk + i] /= (float)sqrt(sq) * sqrtf((float)dk); k[t * dk + i] /= (float)sqrt(sk); }
        for (int i = 0; i < dv; i++) v[t * dv + i] = lily_rng_normal(r);
        g[t] = -(float)lily_rng_uniform(r) * 2.0f;
        b[t] = (float)lily_rng_uniform(r);
    }
    for (int i = 0; i < dk * dv; i++) S1[i] = S2[i] = 0.1f * lily_rng_normal(r);
    for (size_t i = 0; i < nv; i++) o1[i] = o2[i] = NAN; /* poison: every output must be written */
    cpu_gdn_recurrent(T, dk, dv, q, dk, k, dk, v, dv, g, b, S1, o1, dv);
    cpu_gdn_chunked(T, dk, dv, q, dk, k, dk, v, dv, g, b, S2, o2, dv);
    double eo = rel(o2, o1, nv), es = rel(S2, S1, (size_t)dk * dv);
    CHECK(eo < 2e-5, "T=%d dk=%d dv=%d output rel err %.3e", T, dk, dv, eo);
    CHECK(es < 2e-5, "T=%d dk=%d dv=%d state rel err %.3e", T, dk, dv, es);
    free(q); free(k); free(v); free(g); free(b); free(S1); free(S2); free(o1); free(o2);
}

int main(void) {
    lily_rng r;
    lily_rng_seed(&r, t_seed("test_gdn"));
    int Ts[] = { 1, 5, 63, 64, 65, 130, 200 };
    for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++) run(&r, Ts[i], 128, 128);
    run(&r, 77, 16, 24);
    run(&r, 129, 7, 3);
    return T_DONE();
}
