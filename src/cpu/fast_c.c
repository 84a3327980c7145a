/* Portable fast kernels (any C compiler): the same blocking as the AVX2 kernels with
 * eight scalar lanes, which compilers vectorize for whatever the target offers. */
#include "cpu/fast.h"

int mm_fast_supported(const lw_mat *W) {
    if (W->rows < 1 || W->cols < 1) return 0;
    if (W->type == LW_F32) return 1;
    if (W->type == LW_BF16 || W->type == LW_F16) return W->cols <= MM_TILE_FLOATS;
    if (W->type != LW_Q || (W->bits != 4 && W->bits != 8)) return 0;
    int blk = 8 * (32 / W->bits); /* elements in 8 words */
    if (W->sb_type != LW_BF16 && W->sb_type != LW_F16 && W->sb_type != LW_F32) return 0;
    return W->group > 0 && W->group % blk == 0 && W->cols % W->group == 0;
}

void mm_permute(const lw_mat *W, const float *X, int T, float *Xp) {
    int per = 32 / W->bits, blk = 8 * per, n = W->cols;
    for (int t = 0; t < T; t++) {
        const float *x = X + (size_t)t * n;
        float *o = Xp + (size_t)t * n;
        for (int b = 0; b < n; b += blk)
            for (int k = 0; k < per; k++)
                for (int i = 0; i < 8; i++) o[b + k * 8 + i] = x[b + i * per + k];
    }
}

static float hsum8(const float *l) { /* the AVX2 kernels' reduction order */
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* Row r as float32 into out: natural order for float types, block-permuted for Q. */
static void row_to_float(const lw_mat *W, int r, float *out) {
    int n = W->cols;
    switch (W->type) {
    case LW_F32: memcpy(out, (const float *)W->w + (size_t)r * n, (size_t)n * sizeof *out); break;
    case LW_BF16: { const uint16_t *p = (const uint16_t *)W->w + (size_t)r * n; for (int i = 0; i < n; i++) out[i] = lily_bf16_to_f32(p[i]); break; }
    case LW_F16: { const uint16_t *p = (const uint16_t *)W->w + (size_t)r * n; for (int i = 0; i < n; i++) out[i] = lily_f16_to_f32(p[i]); break; }
    case LW_Q: {
        int bits = W->bits, per = 32 / bits, ng = n / W->group, bpg = W->group / (8 * per);
        uint32_t mask = (1u << bits) - 1;
        const uint32_t *q = (const uint32_t *)W->w + (size_t)r * (n / per);
        for (int g = 0; g < ng; g++) {
            float s = mm_sb(W->scales, W->sb_type, (size_t)r * ng + g), b = mm_sb(W->biases, W->sb_type, (size_t)r * ng + g);
            for (int bb = 0; bb < bpg; bb++) {
                const uint32_t *v = q + (size_t)(g * bpg + bb) * 8;
                float *o = out + (size_t)(g * bpg + bb) * 8 * per;
                for (int k = 0; k < per; k++)
                    for (int i = 0; i < 8; i++) o[k * 8 + i] = s * (float)((v[i] >> (bits * k)) & mask) + b;
            }
        }
        break;
    }
    }
}

/* One float row against nt tokens: eight lanes over the multiple-of-8 part, then the tail. */
static void dot_rows(const float *w, int n, const float *X, int ldx, int nt, float *y, int ldy) {
    int n8 = n & ~7;
    for (int t = 0; t < nt; t++) {
        const float *x = X + (size_t)t * ldx;
        float acc[8] = { 0 };
        for (int i = 0; i < n8; i += 8)
            for (int l = 0; l < 8; l++) acc[l] += w[i + l] * x[i + l];
        float tail = 0;
        for (int i = n8; i < n; i++) tail += w[i] * x[i];
        y[(size_t)t * ldy] = hsum8(acc) + tail;
    }
}

/* Quantized row, up to MM_FUSED_T tokens, codes unpacked once per pass and never stored. */
static void q_fused(const mm_args *a, int r, int t0, int nt) {
    const lw_mat *W = a->W;
    int bits = W->bits, per = 32 / bits, n = a->cols, ng = n / W->group, bpg = W->group / (8 * per);
    uint32_t mask = (1u << bits) - 1;
    const uint32_t *q = (const uint32_t *)W->w + (size_t)r * (n / per);
    float tot[MM_FUSED_T][8] = { { 0 } }, bacc[MM_FUSED_T] = { 0 };
    for (int g = 0; g < ng; g++) {
        float s = mm_sb(W->scales, W->sb_type, (size_t)r * ng + g), b = mm_sb(W->biases, W->sb_type, (size_t)r * ng + g);
        float ga[MM_FUSED_T][8] = { { 0 } };
        for (int bb = 0; bb < bpg; bb++) {
            const uint32_t *v = q + (size_t)(g * bpg + bb) * 8;
            size_t off = (size_t)(g * bpg + bb) * 8 * per;
            for (int k = 0; k < per; k++) {
                float c[8];
                for (int i = 0; i < 8; i++) c[i] = (float)((v[i] >> (bits * k)) & mask);
                for (int t = 0; t < nt; t++) {
                    const float *x = a->X + (size_t)(t0 + t) * n + off + k * 8;
                    for (int i = 0; i < 8; i++) ga[t][i] += c[i] * x[i];
                }
            }
        }
        for (int t = 0; t < nt; t++) {
            for (int i = 0; i < 8; i++) tot[t][i] += s * ga[t][i];
            bacc[t] += b * a->xsum[(size_t)(t0 + t) * ng + g];
        }
    }
    for (int t = 0; t < nt; t++) a->Y[(size_t)(t0 + t) * a->rows + r] = hsum8(tot[t]) + bacc[t];
}

void mm_rows_c(const mm_args *a, int r0, int r1) {
    const lw_mat *W = a->W;
    int n = a->cols;
    float tile[MM_TILE_FLOATS];
    int tile_rows = MM_TILE_FLOATS / n;
    if (W->type == LW_Q && (a->T <= MM_FUSED_T || tile_rows < 1)) {
        for (int r = r0; r < r1; r++)
            for (int t0 = 0; t0 < a->T; t0 += MM_FUSED_T)
                q_fused(a, r, t0, a->T - t0 < MM_FUSED_T ? a->T - t0 : MM_FUSED_T);
        return;
    }
    if (W->type == LW_F32) { /* rows used in place */
        for (int r = r0; r < r1; r++) dot_rows((const float *)W->w + (size_t)r * n, n, a->X, n, a->T, a->Y + r, a->rows);
        return;
    }
    LILY_ASSERT(tile_rows >= 1); /* mm_fast_supported keeps 16-bit rows within a tile */
    for (int rb = r0; rb < r1; rb += tile_rows) { /* decode a tile once, reuse it for every token */
        int nr = r1 - rb < tile_rows ? r1 - rb : tile_rows;
        for (int i = 0; i < nr; i++) row_to_float(W, rb + i, tile + (size_t)i * n);
        for (int i = 0; i < nr; i++) dot_rows(tile + (size_t)i * n, n, a->X, n, a->T, a->Y + rb + i, a->rows);
    }
}
