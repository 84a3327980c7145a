/* x86-64 kernels with AVX2, FMA and F16C, compiled for those instructions function by
 * function (target attributes) so the rest of the library stays baseline x86-64; the
 * dispatcher calls them only after __builtin_cpu_supports says the CPU has all three.
 *
 * Every output element is an 8-lane FMA accumulation over its row in column order, one
 * fixed horizontal sum, then the scalar tail: the same steps whichever tile variant
 * (rows x tokens) computes it. */
#include "cpu/fast.h"
#ifdef MM_HAVE_AVX2
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define AI static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8") /* register tiles: constant trip counts, fully unrolled */

enum { MR = 4, NR = 3 }; /* register tile: 4 rows x 3 tokens = 12 accumulators */

TGT AI float hsum(__m256 v) { /* ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)) */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

TGT AI __m256 load8(lw_type ty, const void *w, size_t i) {
    if (ty == LW_F32) return _mm256_loadu_ps((const float *)w + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (ty == LW_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

TGT AI float load1(lw_type ty, const void *w, size_t i) {
    if (ty == LW_F32) return ((const float *)w)[i];
    uint16_t h = ((const uint16_t *)w)[i];
    return ty == LW_BF16 ? lily_bf16_to_f32(h) : lily_f16_to_f32(h);
}

/* ---- fused: float-type row against nt <= 4 tokens, converted in registers ---- */
TGT AI void f_fused(const mm_args *a, int r, int t0, const int nt, const lw_type ty) {
    int n = a->cols, n8 = n & ~7;
    const void *w = (const char *)a->W->w + (size_t)r * n * (ty == LW_F32 ? 4 : 2);
    const float *x[MM_FUSED_T];
    __m256 acc[MM_FUSED_T];
    UNROLL
    for (int t = 0; t < nt; t++) { x[t] = a->X + (size_t)(t0 + t) * n; acc[t] = _mm256_setzero_ps(); }
    for (int i = 0; i < n8; i += 8) {
        __m256 wv = load8(ty, w, (size_t)i);
        UNROLL
        for (int t = 0; t < nt; t++) acc[t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[t] + i), acc[t]);
    }
    UNROLL
    for (int t = 0; t < nt; t++) {
        float tail = 0;
        for (int i = n8; i < n; i++) tail += load1(ty, w, (size_t)i) * x[t][i];
        a->Y[(size_t)(t0 + t) * a->rows + r] = hsum(acc[t]) + tail;
    }
}

/* ---- fused: quantized row against nt <= 4 tokens; codes never leave registers ---- */
TGT AI void q_fused(const mm_args *a, int r, int t0, const int nt, const int bits) {
    const lw_mat *W = a->W;
    const int per = 32 / bits;
    int n = a->cols, ng = n / W->group, bpg = W->group / (8 * per);
    const __m256i mask = _mm256_set1_epi32((1 << bits) - 1);
    const uint32_t *q = (const uint32_t *)W->w + (size_t)r * (n / per);
    const float *x[MM_FUSED_T], *xs[MM_FUSED_T];
    __m256 tot[MM_FUSED_T];
    float bacc[MM_FUSED_T];
    UNROLL
    for (int t = 0; t < nt; t++) {
        x[t] = a->X + (size_t)(t0 + t) * n; xs[t] = a->xsum + (size_t)(t0 + t) * ng;
        tot[t] = _mm256_setzero_ps(); bacc[t] = 0;
    }
    for (int g = 0; g < ng; g++) {
        __m256 ga[MM_FUSED_T];
        UNROLL
        for (int t = 0; t < nt; t++) ga[t] = _mm256_setzero_ps();
        for (int bb = 0; bb < bpg; bb++) {
            size_t blk = (size_t)g * bpg + bb, off = blk * 8 * per;
            __m256i v = _mm256_loadu_si256((const __m256i *)(q + blk * 8));
            UNROLL
            for (int k = 0; k < per; k++) {
                __m256 c = _mm256_cvtepi32_ps(_mm256_and_si256(v, mask));
                v = bits == 4 ? _mm256_srli_epi32(v, 4) : _mm256_srli_epi32(v, 8);
                UNROLL
                for (int t = 0; t < nt; t++) ga[t] = _mm256_fmadd_ps(c, _mm256_loadu_ps(x[t] + off + (size_t)k * 8), ga[t]);
            }
        }
        size_t gi = (size_t)r * ng + g;
        __m256 sv = _mm256_set1_ps(mm_sb(W->scales, W->sb_type, gi));
        float b = mm_sb(W->biases, W->sb_type, gi);
        UNROLL
        for (int t = 0; t < nt; t++) { tot[t] = _mm256_fmadd_ps(sv, ga[t], tot[t]); bacc[t] += b * xs[t][g]; }
    }
    UNROLL
    for (int t = 0; t < nt; t++) a->Y[(size_t)(t0 + t) * a->rows + r] = hsum(tot[t]) + bacc[t];
}

#define FUSED_NT(CALL) do { switch (nt) { case 1: CALL(1); break; case 2: CALL(2); break; \
    case 3: CALL(3); break; default: CALL(4); break; } } while (0)

TGT static void fused_row(const mm_args *a, int r, int t0, int nt) {
    const lw_mat *W = a->W;
#define QF4(N) q_fused(a, r, t0, N, 4)
#define QF8(N) q_fused(a, r, t0, N, 8)
#define FF32(N) f_fused(a, r, t0, N, LW_F32)
#define FB16(N) f_fused(a, r, t0, N, LW_BF16)
#define FF16(N) f_fused(a, r, t0, N, LW_F16)
    switch (W->type) {
    case LW_Q: if (W->bits == 4) FUSED_NT(QF4); else FUSED_NT(QF8); break;
    case LW_F32: FUSED_NT(FF32); break;
    case LW_BF16: FUSED_NT(FB16); break;
    case LW_F16: FUSED_NT(FF16); break;
    }
#undef QF4
#undef QF8
#undef FF32
#undef FB16
#undef FF16
}

/* ---- tiled: rows decoded once into a float tile, reused for every token ---- */
TGT AI void q_to_tile(const lw_mat *W, int r, float *out, const int bits) {
    const int per = 32 / bits;
    int n = W->cols, ng = n / W->group, bpg = W->group / (8 * per);
    const __m256i mask = _mm256_set1_epi32((1 << bits) - 1);
    const uint32_t *q = (const uint32_t *)W->w + (size_t)r * (n / per);
    for (int g = 0; g < ng; g++) {
        size_t gi = (size_t)r * ng + g;
        __m256 sv = _mm256_set1_ps(mm_sb(W->scales, W->sb_type, gi)), bv = _mm256_set1_ps(mm_sb(W->biases, W->sb_type, gi));
        for (int bb = 0; bb < bpg; bb++) {
            size_t blk = (size_t)g * bpg + bb;
            float *o = out + blk * 8 * per;
            __m256i v = _mm256_loadu_si256((const __m256i *)(q + blk * 8));
            UNROLL
            for (int k = 0; k < per; k++) {
                _mm256_storeu_ps(o + k * 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, mask)), sv, bv));
                v = bits == 4 ? _mm256_srli_epi32(v, 4) : _mm256_srli_epi32(v, 8);
            }
        }
    }
}

TGT AI void h_to_tile(const lw_mat *W, int r, float *out, const lw_type ty) {
    int n = W->cols, n8 = n & ~7;
    const uint16_t *p = (const uint16_t *)W->w + (size_t)r * n;
    for (int i = 0; i < n8; i += 8) _mm256_storeu_ps(out + i, load8(ty, p, (size_t)i));
    for (int i = n8; i < n; i++) out[i] = load1(ty, p, (size_t)i);
}

TGT static void row_to_tile(const lw_mat *W, int r, float *out) {
    switch (W->type) {
    case LW_Q: if (W->bits == 4) q_to_tile(W, r, out, 4); else q_to_tile(W, r, out, 8); break;
    case LW_BF16: h_to_tile(W, r, out, LW_BF16); break;
    case LW_F16: h_to_tile(W, r, out, LW_F16); break;
    case LW_F32: break; /* float rows are read in place */
    }
}

/* mr rows (stride ldw) x nr tokens (stride n) -> y[t*ldy + i]. */
TGT AI void micro(const float *w, size_t ldw, const float *X, int n, float *y, size_t ldy, const int mr, const int nr) {
    int n8 = n & ~7;
    __m256 acc[MR][NR];
    UNROLL
    for (int i = 0; i < mr; i++)
        UNROLL
        for (int t = 0; t < nr; t++) acc[i][t] = _mm256_setzero_ps();
    for (int k = 0; k < n8; k += 8) {
        __m256 xv[NR];
        UNROLL
        for (int t = 0; t < nr; t++) xv[t] = _mm256_loadu_ps(X + (size_t)t * n + k);
        UNROLL
        for (int i = 0; i < mr; i++) {
            __m256 wv = _mm256_loadu_ps(w + i * ldw + k);
            UNROLL
            for (int t = 0; t < nr; t++) acc[i][t] = _mm256_fmadd_ps(wv, xv[t], acc[i][t]);
        }
    }
    UNROLL
    for (int i = 0; i < mr; i++)
        UNROLL
        for (int t = 0; t < nr; t++) {
            float tail = 0;
            for (int k = n8; k < n; k++) tail += w[i * ldw + k] * X[(size_t)t * n + k];
            y[(size_t)t * ldy + i] = hsum(acc[i][t]) + tail;
        }
}

TGT static void micro_any(const float *w, size_t ldw, const float *X, int n, float *y, size_t ldy, int mr, int nr) {
#define M(R, C) case R * 4 + C: micro(w, ldw, X, n, y, ldy, R, C); break;
    switch (mr * 4 + nr) {
    M(1, 1) M(1, 2) M(1, 3) M(2, 1) M(2, 2) M(2, 3) M(3, 1) M(3, 2) M(3, 3) M(4, 1) M(4, 2) M(4, 3)
    default: LILY_ASSERT(0);
    }
#undef M
}

/* exp(d) for d <= 0 (0 below -87.3, where expf underflows to denormals anyway): 2^k * p(f)
 * with k = round(d log2 e) and p a degree-6 fit of 2^f on [-0.5, 0.5]. */
TGT AI __m256 exp_neg8(__m256 d) {
    __m256 t = _mm256_mul_ps(d, _mm256_set1_ps(1.44269504088896341f));
    __m256 k = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(t, k);
    __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(k), 23);
    __m256 r = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
    return _mm256_and_ps(r, _mm256_cmp_ps(d, _mm256_set1_ps(-87.3f), _CMP_GE_OQ));
}

TGT double sum_exp_avx2(const float *x, int n, float m) {
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    __m256 vm = _mm256_set1_ps(m), big = _mm256_set1_ps(3.402823466e38f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        /* finite lanes only: |v| <= FLT_MAX is false for inf and NaN */
        __m256 fin = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), v), big, _CMP_LE_OQ);
        __m256 e = _mm256_and_ps(exp_neg8(_mm256_sub_ps(_mm256_and_ps(v, fin), vm)), fin);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double l[4], h[4];
    _mm256_storeu_pd(l, lo); _mm256_storeu_pd(h, hi);
    double s = ((l[0] + h[0]) + (l[1] + h[1])) + ((l[2] + h[2]) + (l[3] + h[3]));
    for (; i < n; i++) {
        float v = x[i];
        if (v - v == 0) s += (double)expf(v - m);
    }
    return s;
}

/* |v| <= FLT_MAX: false for inf and NaN */
TGT AI __m256 finite8(__m256 v) {
    return _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), v), _mm256_set1_ps(3.402823466e38f), _CMP_LE_OQ);
}
TGT float max_finite_avx2(const float *x, int n) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 m = ninf;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        m = _mm256_max_ps(m, _mm256_blendv_ps(ninf, v, finite8(v)));
    }
    float l[8], r = -INFINITY;
    _mm256_storeu_ps(l, m);
    for (int j = 0; j < 8; j++) r = l[j] > r ? l[j] : r;
    for (; i < n; i++)
        if (x[i] - x[i] == 0 && x[i] > r) r = x[i];
    return r;
}
TGT int next_above_avx2(const float *x, const int32_t *counts, const uint8_t *pm, int i, int n, float thr) {
    const __m256 t = _mm256_set1_ps(thr);
    for (; i + 8 <= n; i += 8) {
        unsigned m = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), t, _CMP_GT_OQ));
        if (counts) {
            __m256i c = _mm256_loadu_si256((const __m256i *)(counts + i));
            m |= ~(unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(c, _mm256_setzero_si256()))) & 0xffu;
        }
        if (pm) {
            uint64_t b;
            memcpy(&b, pm + i, 8);
            for (int j = 0; j < 8; j++) m |= (unsigned)(((b >> (8 * j)) & 0xffu) != 0) << j;
        }
        if (m) return i + __builtin_ctz(m);
    }
    for (; i < n; i++)
        if (x[i] > thr || (counts && counts[i]) || (pm && pm[i])) return i;
    return n;
}

TGT void mm_rows_avx2(const mm_args *a, int r0, int r1) {
    const lw_mat *W = a->W;
    int n = a->cols, T = a->T;
    int tile_rows = MM_TILE_FLOATS / n;
    if (T <= MM_FUSED_T || tile_rows < 1) {
        LILY_ASSERT(W->type == LW_Q || W->type == LW_F32 || tile_rows >= 1);
        for (int r = r0; r < r1; r++)
            for (int t0 = 0; t0 < T; t0 += MM_FUSED_T) fused_row(a, r, t0, T - t0 < MM_FUSED_T ? T - t0 : MM_FUSED_T);
        return;
    }
    float tile[MM_TILE_FLOATS] __attribute__((aligned(32)));
    for (int rb = r0; rb < r1; rb += tile_rows) {
        int nr = r1 - rb < tile_rows ? r1 - rb : tile_rows;
        const float *base = tile;
        if (W->type == LW_F32) base = (const float *)W->w + (size_t)rb * n;
        else for (int i = 0; i < nr; i++) row_to_tile(W, rb + i, tile + (size_t)i * n);
        for (int t0 = 0; t0 < T; t0 += NR) {
            int nt = T - t0 < NR ? T - t0 : NR;
            for (int i = 0; i < nr; i += MR)
                micro_any(base + (size_t)i * n, (size_t)n, a->X + (size_t)t0 * n, n,
                          a->Y + (size_t)t0 * a->rows + rb + i, (size_t)a->rows, nr - i < MR ? nr - i : MR, nt);
        }
    }
}
#endif
