/* Fast Gated DeltaNet rules: the reference's recurrent and chunked algorithms (ops.c)
 * step for step, with the inner loops as 8-lane dot products and axpys (AVX2+FMA where
 * the CPU has them, portable C otherwise). Only summation order and FMA rounding differ
 * from the reference; tests/test_cpu_fast compares the two. */
#include "cpu/fast.h"
#include <math.h>
#include <stdlib.h>

typedef float (*dot_fn)(const float *a, const float *b, int n);
typedef void (*axpy_fn)(float *y, float a, const float *x, int n); /* y += a x */

static inline __attribute__((always_inline)) float dot_c(const float *a, const float *b, int n) {
    float l[8] = { 0 };
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) l[j] += a[i + j] * b[i + j];
    float s = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
static inline __attribute__((always_inline)) void axpy_c(float *y, float a, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

#ifdef MM_HAVE_AVX2
#include <immintrin.h>
#define TGT __attribute__((target("avx2,fma")))
TGT static inline __attribute__((always_inline)) float dot_avx2(const float *a, const float *b, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    float s = _mm_cvtss_f32(_mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1)));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
TGT static inline __attribute__((always_inline)) void axpy_avx2(float *y, float a, const float *x, int n) {
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}
#endif

/* ---- the algorithms, instantiated per instruction set below ---- */
static inline __attribute__((always_inline)) void recurrent_body(int T, int dk, int dv, const float *q, int ldq, const float *k,
        int ldk, const float *v, int ldv, const float *g, const float *beta, float *S, float *o, int ldo, float *d,
        dot_fn dot, axpy_fn axpy) {
    (void)dot;
    for (int t = 0; t < T; t++) {
        const float *qt = q + (size_t)t * ldq, *kt = k + (size_t)t * ldk, *vt = v + (size_t)t * ldv;
        float decay = expf(g[t]);
        for (int i = 0; i < dk * dv; i++) S[i] *= decay;
        for (int j = 0; j < dv; j++) d[j] = 0;
        for (int i = 0; i < dk; i++) axpy(d, kt[i], S + (size_t)i * dv, dv);
        for (int j = 0; j < dv; j++) d[j] = (vt[j] - d[j]) * beta[t];
        for (int i = 0; i < dk; i++) axpy(S + (size_t)i * dv, kt[i], d, dv);
        float *ot = o + (size_t)t * ldo;
        for (int j = 0; j < dv; j++) ot[j] = 0;
        for (int i = 0; i < dk; i++) axpy(ot, qt[i], S + (size_t)i * dv, dv);
    }
}

enum { CH = 64 };

static inline __attribute__((always_inline)) void chunked_body(int T, int dk, int dv, const float *q, int ldq, const float *k,
        int ldk, const float *v, int ldv, const float *g, const float *beta, float *S, float *o, int ldo,
        float *G, float *A, float *U, float *Wk, dot_fn dot, axpy_fn axpy) {
    for (int t0 = 0; t0 < T; t0 += CH) {
        int C = T - t0 < CH ? T - t0 : CH;
        const float *Q = q + (size_t)t0 * ldq, *K = k + (size_t)t0 * ldk, *Vv = v + (size_t)t0 * ldv;
        const float *bt = beta + t0;
        float acc = 0;
        for (int i = 0; i < C; i++) { acc += g[t0 + i]; G[i] = acc; }
        for (int i = 0; i < C; i++)
            for (int j = 0; j < i; j++)
                A[i * CH + j] = dot(K + (size_t)i * ldk, K + (size_t)j * ldk, dk) * bt[i] * expf(G[i] - G[j]);
        for (int i = 0; i < C; i++) {
            float *Ui = U + (size_t)i * dv, *Wi = Wk + (size_t)i * dk;
            for (int e = 0; e < dv; e++) Ui[e] = Vv[(size_t)i * ldv + e] * bt[i];
            float eg = expf(G[i]);
            for (int e = 0; e < dk; e++) Wi[e] = K[(size_t)i * ldk + e] * bt[i] * eg;
            for (int j = 0; j < i; j++) {
                float a = A[i * CH + j];
                axpy(Ui, -a, U + (size_t)j * dv, dv);
                axpy(Wi, -a, Wk + (size_t)j * dk, dk);
            }
        }
        for (int i = 0; i < C; i++)
            for (int e = 0; e < dk; e++) axpy(U + (size_t)i * dv, -Wk[(size_t)i * dk + e], S + (size_t)e * dv, dv);
        for (int i = 0; i < C; i++) {
            float *ot = o + (size_t)(t0 + i) * ldo;
            float eg = expf(G[i]);
            for (int j = 0; j < dv; j++) ot[j] = 0;
            for (int e = 0; e < dk; e++) axpy(ot, Q[(size_t)i * ldq + e] * eg, S + (size_t)e * dv, dv);
            for (int m = 0; m <= i; m++) {
                float s = dot(Q + (size_t)i * ldq, K + (size_t)m * ldk, dk) * expf(G[i] - G[m]);
                axpy(ot, s, U + (size_t)m * dv, dv);
            }
        }
        float gl = G[C - 1], el = expf(gl);
        for (int e = 0; e < dk * dv; e++) S[e] *= el;
        for (int m = 0; m < C; m++) {
            float f = expf(gl - G[m]);
            for (int e = 0; e < dk; e++) axpy(S + (size_t)e * dv, K[(size_t)m * ldk + e] * f, U + (size_t)m * dv, dv);
        }
    }
}

#define ARGS int T, int dk, int dv, const float *q, int ldq, const float *k, int ldk, const float *v, int ldv, \
             const float *g, const float *beta, float *S, float *o, int ldo
#define PASS T, dk, dv, q, ldq, k, ldk, v, ldv, g, beta, S, o, ldo

static void rec_c(ARGS, float *d) { recurrent_body(PASS, d, dot_c, axpy_c); }
static void chk_c(ARGS, float *G, float *A, float *U, float *W) { chunked_body(PASS, G, A, U, W, dot_c, axpy_c); }
#ifdef MM_HAVE_AVX2
TGT static void rec_avx2(ARGS, float *d) { recurrent_body(PASS, d, dot_avx2, axpy_avx2); }
TGT static void chk_avx2(ARGS, float *G, float *A, float *U, float *W) { chunked_body(PASS, G, A, U, W, dot_avx2, axpy_avx2); }
#endif

static int use_avx2(cpu_mm_kind kind) {
#ifdef MM_HAVE_AVX2
    return (kind == CPU_MM_AUTO || kind == CPU_MM_AVX2) && cpu_mm_avx2_available();
#else
    (void)kind;
    return 0;
#endif
}

void cpu_gdn_recurrent_fast(ARGS, cpu_mm_kind kind) {
    if (kind == CPU_MM_REF) { cpu_gdn_recurrent(PASS); return; }
    float *d = malloc((size_t)dv * sizeof *d);
    LILY_ASSERT(d);
#ifdef MM_HAVE_AVX2
    if (use_avx2(kind)) rec_avx2(PASS, d); else
#endif
    rec_c(PASS, d);
    free(d);
}

void cpu_gdn_chunked_fast(ARGS, cpu_mm_kind kind) {
    if (kind == CPU_MM_REF) { cpu_gdn_chunked(PASS); return; }
    float *G = malloc(CH * sizeof *G), *A = malloc(CH * CH * sizeof *A);
    float *U = malloc((size_t)CH * dv * sizeof *U), *W = malloc((size_t)CH * dk * sizeof *W);
    LILY_ASSERT(G && A && U && W);
#ifdef MM_HAVE_AVX2
    if (use_avx2(kind)) chk_avx2(PASS, G, A, U, W); else
#endif
    chk_c(PASS, G, A, U, W);
    free(G); free(A); free(U); free(W);
}
