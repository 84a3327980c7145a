/* Internal contract between the matmul dispatcher (matmul.c) and the fast kernels
 * (fast_c.c portable, fast_avx2.c x86 AVX2+FMA+F16C).
 *
 * A kernel computes Y[t][r] for rows r0..r1-1 and every token t. The dispatcher cuts
 * a matrix into row tasks whose size depends only on the shape, and each kernel does
 * the same arithmetic for an output element wherever its row and token fall inside the
 * tiles, so results do not depend on the thread count.
 *
 * Quantized matrices (MLX affine, 4 or 8 bits) are read eight uint32 words at a time.
 * Such a block holds 8*per codes (per = 32/bits); lane i of "code slot" k is element
 * i*per + k of the block. The dispatcher hands the kernels X already permuted the same
 * way (mm_permute), so codes are consumed in the order they are unpacked, and the
 * per-group sums of X (xsum) that let the fused kernel apply the bias once per group:
 *   sum_j (s*q_j + b) x_j = s * sum_j q_j x_j + b * sum_j x_j. */
#ifndef LILY_CPU_FAST_H
#define LILY_CPU_FAST_H
#include "cpu/cpu.h"

typedef struct {
    const lw_mat *W;
    int T, rows, cols;
    const float *X;    /* [T][cols]; permuted per 8-word block when W is quantized */
    const float *xsum; /* quantized W: [T][cols/group] sums of X over each group */
    float *Y;          /* [T][rows] */
} mm_args;

typedef void (*mm_rows_fn)(const mm_args *a, int r0, int r1);

enum {
    MM_FUSED_T = 4,       /* up to this many tokens: fused dequant-dot, no tile */
    MM_TILE_FLOATS = 32768 /* stack tile of dequantized rows for larger T (128 KB) */
};

/* Can the fast kernels run W at all? (type, bits 4/8, group a multiple of the block) */
int mm_fast_supported(const lw_mat *W);
/* X[T][cols] -> the block-permuted order the quantized kernels read. */
void mm_permute(const lw_mat *W, const float *X, int T, float *Xp);
static inline float mm_sb(const void *p, lw_type t, size_t i) { /* one scale or bias as float */
    if (t == LW_BF16) return lily_bf16_to_f32(((const uint16_t *)p)[i]);
    if (t == LW_F32) return ((const float *)p)[i];
    return lily_f16_to_f32(((const uint16_t *)p)[i]);
}

void mm_rows_c(const mm_args *a, int r0, int r1);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MM_HAVE_AVX2 1
void mm_rows_avx2(const mm_args *a, int r0, int r1);
/* sum of exp(x[i] - m) over the finite x[i] (m >= every finite x): the sampler's log-partition.
 * A polynomial exp (relative error < 3e-7 a term) summed in double, 8 lanes at a time. */
double sum_exp_avx2(const float *x, int n, float m);
/* The sampler's scans, exact (the same answers as the scalar loops in sampler.c): the
 * largest finite x[i] (-inf when none), and the first i in [i, n) where x[i] > thr or
 * counts[i] != 0 or pm[i] != 0 (counts and pm may be NULL), n when none; NaN is never
 * above. */
float max_finite_avx2(const float *x, int n);
int next_above_avx2(const float *x, const int32_t *counts, const uint8_t *pm, int i, int n, float thr);
#endif

/* 8-lane helpers for the fast sequence kernels (fast_gdn.c, fast_attn.c): dot products sum
 * eight lanes then the tail; axpy is y += a x. */
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
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) float dot_avx2(const float *a, const float *b, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    float s = _mm_cvtss_f32(_mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1)));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) void axpy_avx2(float *y, float a, const float *x, int n) {
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}
#endif

#endif
