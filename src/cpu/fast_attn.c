/* Fast attention row: the reference's steps (ops.c cpu_attn_row) with float 8-lane dot
 * products for the scores instead of double scalar ones, and an axpy for the weighted sum
 * of values. The softmax (max, expf, double sum) is the reference's. */
#include "cpu/fast.h"
#include <math.h>

static inline __attribute__((always_inline)) void attn_body(int n, int hd, const float *q, const float *k, const float *v,
                                                            int ld, float *sc, float *o, dot_fn dot, axpy_fn axpy) {
    float scale = (float)(1.0 / sqrt((double)hd)), mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        sc[j] = dot(q, k + (size_t)j * ld, hd) * scale;
        if (sc[j] > mx) mx = sc[j];
    }
    double sum = 0;
    for (int j = 0; j < n; j++) { sc[j] = expf(sc[j] - mx); sum += sc[j]; }
    for (int i = 0; i < hd; i++) o[i] = 0;
    for (int j = 0; j < n; j++) axpy(o, (float)(sc[j] / sum), v + (size_t)j * ld, hd);
}

static void attn_c(int n, int hd, const float *q, const float *k, const float *v, int ld, float *sc, float *o) {
    attn_body(n, hd, q, k, v, ld, sc, o, dot_c, axpy_c);
}
#ifdef MM_HAVE_AVX2
__attribute__((target("avx2,fma"))) static void attn_avx2(int n, int hd, const float *q, const float *k, const float *v,
                                                          int ld, float *sc, float *o) {
    attn_body(n, hd, q, k, v, ld, sc, o, dot_avx2, axpy_avx2);
}
#endif

void cpu_attn_row_fast(int n, int hd, const float *q, const float *k, const float *v, int ld, float *sc, float *o,
                       cpu_mm_kind kind) {
    if (kind == CPU_MM_REF) { cpu_attn_row(n, hd, q, k, v, ld, sc, o); return; }
#ifdef MM_HAVE_AVX2
    if ((kind == CPU_MM_AUTO || kind == CPU_MM_AVX2) && cpu_mm_avx2_available()) { attn_avx2(n, hd, q, k, v, ld, sc, o); return; }
#endif
    attn_c(n, hd, q, k, v, ld, sc, o);
}
