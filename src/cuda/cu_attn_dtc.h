/* Decode attention on the tensor cores (dtc_run, k_attn_dtc's body in cu_attn.cu): a token's 8 query
 * heads of one KV head (head dim 256, the 35B-A3B shape) over the fp16 cache with mma.sync, in place of
 * k_attn_gqa's SIMT loop, from a context on (cu_attn_tc_at).
 *
 * Why: at long context k_attn_gqa is bound by each key's chain of dependent shuffles (8 heads' dot
 * products summed across the warp) and exponentials, not by bytes: at 32K an attention layer read its
 * keys and values at ~1.6 TB/s of an H100's 3.35 (bench/RESULTS.md session 34). Here a warp takes 8
 * keys a step: the scores, 8 heads x 8 keys, are 16 m16n8k16 tiles (one a 16 dims), the output O^T
 * [256 dims][8 heads] += V^T P^T 16 more, and the softmax two exponentials a lane.
 *
 * Numerics as fp32's: the cache's keys and values are fp16 already, but q and the probabilities P are
 * not, so each goes in as two fp16, hi = fp16(x) and lo = fp16(x - hi) (x to ~2^-22), in the halves of
 * the tiles the shapes leave over: the scores' A rows 8-15 (q's lo; 16 rows for 8 heads) and the
 * output's B rows 8-15 (P's lo, against the same 8 keys' V^T again; k 16 for 8 keys). Neither costs an
 * mma. Products are exact and the sums fp32, as k_attn_gqa's (in another order).
 *
 * Fragments (lane: g = lane / 4, qd = lane % 4; tc_mma's layout). Scores: A = q (row g: head g's hi,
 * row g + 8: its lo), B = K^T (column g: key g of the step), C's rows g and g + 8 summed: head g's
 * scores of keys 2qd, 2qd + 1, the lane's own, so its exponentials and its part of P^T need no
 * exchange. The k index only has to pair A with B: k step 2i + h is dims 32i + 8qd + 4h .. + 3 of lane
 * qd, so a lane reads 16 bytes at 64i + 16qd of its key's row (a key's 4 lanes: 64 contiguous bytes).
 * Output: A = V^T (rows g, g + 8: dims d, d + 1, d = 64jj + 8g + 2p for tile 4jj + p; k: keys 2qd,
 * 2qd + 1, twice), B = P^T (those keys of head g: hi, then lo), C = O^T: dims d, d + 1 of heads 2qd,
 * 2qd + 1. A lane reads 16 bytes at 128jj + 16g of keys 2qd and 2qd + 1: a word is dims d, d + 1 of one
 * key, and a byte permute pairs the two keys' halves of one dim into an A register.
 *
 * A block: W warps over one (token, KV head, key split), the q prep folded in as k_attn_gqa's
 * (a warp a head), warp w taking steps w, w + W, ..; the warps' partials joined in shared memory into one
 * a head, written to part as k_attn_gqa writes them, for k_attn_merge_w. */
#ifndef LILY_CU_ATTN_DTC_H
#define LILY_CU_ATTN_DTC_H
#include "cuda/cu_attn.h"

#define DT_HD 256
#define DT_STEP 8 /* keys a warp's step */
/* shared memory: q's A fragments [16 k steps][32 lanes] uint4; q [8 heads][256] (then the joined
 * output); the W warps' O^T [W][16 tiles][32 lanes] float4; their maxima and sums [W][8] */
#define DT_QF 0
#define DT_QS (16 * 32 * 16)
#define DT_SO (DT_QS + 8 * DT_HD * 4)
#define DT_ML(W) (DT_SO + (W) * 16 * 32 * 16)
#define DT_SMEM(W) (DT_ML(W) + 2 * (W) * 8 * 4)

/* (x, y) as two fp16 pairs: hi rounded, lo what hi leaves (each saturated, x in the low halves) */
static __device__ __forceinline__ void dt_split(float x, float y, uint32_t &hi, uint32_t &lo) {
    hi = cu_h2sat(x, y);
    lo = cu_h2sat(x - h2f((uint16_t)(hi & 0xffffu)), y - h2f((uint16_t)(hi >> 16)));
}

/* One loop step's rows into L2 by bulk prefetch, a lane a row: lane l takes key key0 + l / 2 (below j1), its
 * K row for even l, its V row for odd l (16 keys: a warp's step at U 2). kb, vb: the KV head's column. */
static __device__ __forceinline__ void dtc_pf_step(const uint16_t *kb, const uint16_t *vb, size_t ld, int key0, int j1, int lane) {
    const int key = key0 + (lane >> 1);
    if (key < j1) cu_l2_pf((const char *)((lane & 1 ? vb : kb) + (size_t)key * ld), DT_HD * 2);
}

/* Before the wait (k_attn_dtc, one token, no rows): the K and V rows of each warp's first `its` loop
 * steps into L2 by bulk prefetch, a lane a row (16 keys a step, K and V). Why: the keys below the
 * token's own were written steps ago, so their loads need not wait for the predecessor's q, k and v,
 * nor for the prologue (norms, RoPE, the fold's cache write, q's fragments: ~2-3 us at 32K, while the
 * DRAM idles; bench/RESULTS.md session 45). A hint only: pos read early may be stale, and a stale or
 * racing line costs bytes, never a wrong value (L2 is the GPU's point of coherence). */
template <int U, int W>
static __device__ __forceinline__ void dtc_prefetch(const uint16_t *kc, const uint16_t *vc, int nkv, int n, int tk, int splits, int amin,
                                                    int its) {
    const int kvh = tk % nkv, warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int se = attn_splits_used(splits, amin, n);
    if ((int)blockIdx.y >= se) return;
    const int chunk = (n + se - 1) / se, j0 = blockIdx.y * chunk, j1 = min(n - 1, j0 + chunk); /* (key n - 1: this kernel writes it) */
    static_assert(U * DT_STEP == 16, "a lane a row: 16 keys a step");
    for (int it = 0; it < its; it++)
        dtc_pf_step(kc + (size_t)kvh * DT_HD, vc + (size_t)kvh * DT_HD, (size_t)nkv * DT_HD, j0 + DT_STEP * U * (warp + W * it), j1, lane);
}

/* The tensor cores' decode attention after its wait (k_attn_dtc, cu_attn.cu): block tk = t nkv + kvh over
 * key split blockIdx.y of the token's n keys. q [T][nh][256] (no fold) or the fold P (T 1), qw, kw, fr
 * its weights; kc, vc [ctx][nkv][256] fp16; part as k_attn_gqa's. U: steps a warp loads together (their
 * 8 U keys' rows in flight at once); W warps a block; dt_sm DT_SMEM(W) bytes. */
template <int U, int W>
static __device__ __forceinline__ void dtc_run(const float *q, const uint16_t *kc, const uint16_t *vc, int nh, int nkv, int n, int tk,
                                               int splits, float *part, const cu_rows &rows, const qk_fold &P, int amin,
                                               const float (&qw)[8], const float (&kw)[8], const float (&fr)[8], unsigned char *dt_sm,
                                               int pfl = 0) {
    uint4 *qf = (uint4 *)(dt_sm + DT_QF);
    float(*qs)[DT_HD] = (float(*)[DT_HD])(dt_sm + DT_QS);
    float4 *so = (float4 *)(dt_sm + DT_SO);
    float *sm_m = (float *)(dt_sm + DT_ML(W)), *sm_l = sm_m + W * 8;
    const int t = tk / nkv, kvh = tk % nkv, hq0 = kvh * 8;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, g = lane >> 2, qd = lane & 3;
    if (rows.pos) { kc = rows.kc[t] + rows.kv_off; vc = rows.vc[t] + rows.kv_off; } /* decode batch: row t's own cache */
    const int se = attn_splits_used(splits, amin, n);
    if ((int)blockIdx.y >= se) return; /* (as k_attn_gqa's: the merge reads none of its partials) */
    const int chunk = (n + se - 1) / se, j0 = blockIdx.y * chunk, j1 = min(n, j0 + chunk);
    if (P.qg) qk_fold_prep<8, 8, W>(P, qw, kw, fr, hq0, kvh, nkv, n, j0, j1, qs, 1.f);
    else {
        for (int i = threadIdx.x; i < 8 * DT_HD; i += blockDim.x) qs[i / DT_HD][i % DT_HD] = q[((size_t)t * nh + hq0) * DT_HD + i];
        __syncthreads();
    }
    /* q's A fragments, k steps warp, warp + W, .. (step 2i + h: dims 32i + 8qd + 4h .. + 3 of head g) */
#pragma unroll
    for (int ks = warp; ks < 16; ks += W) {
        const float4 v = *(const float4 *)&qs[g][32 * (ks / 2) + 8 * qd + 4 * (ks % 2)];
        uint32_t h01, l01, h23, l23;
        dt_split(v.x, v.y, h01, l01);
        dt_split(v.z, v.w, h23, l23);
        qf[ks * WARP + lane] = make_uint4(h01, l01, h23, l23);
    }
    __syncthreads(); /* (every warp reads every fragment; qs is free from here) */

    float O[16][4];
#pragma unroll
    for (int i = 0; i < 16; i++) O[i][0] = O[i][1] = O[i][2] = O[i][3] = 0.f;
    float mx = -INFINITY, l = 0.f; /* head g's running maximum (its 4 lanes alike) and the lane's share of its sum */
    const size_t ld = (size_t)nkv * DT_HD;
    const uint16_t *kb = kc + (size_t)kvh * DT_HD, *vb = vc + (size_t)kvh * DT_HD;
    for (int jb = j0 + DT_STEP * U * warp; jb < j1; jb += DT_STEP * U * W) {
        /* pfl > 0: the warp's rows pfl loop steps ahead into L2 (a lane a K or V row), so the loads
         * that the step's compute leaves idle are not one DRAM round trip each (LILY_CU_ATTN_PFL) */
        if (U * DT_STEP == 16 && pfl > 0) dtc_pf_step(kb, vb, ld, jb + DT_STEP * U * W * pfl, j1, lane);
        /* every load of the U steps first (rows past j1: the last key again, masked below) */
        uint4 kr[U][8], vr[U][2][4];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const uint4 *kp = (const uint4 *)(kb + (size_t)min(jb + DT_STEP * u + g, j1 - 1) * ld) + qd;
#pragma unroll
            for (int i = 0; i < 8; i++) kr[u][i] = kp[4 * i];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const uint4 *vp = (const uint4 *)(vb + (size_t)min(jb + DT_STEP * u + 2 * qd + e, j1 - 1) * ld) + g;
#pragma unroll
                for (int jj = 0; jj < 4; jj++) vr[u][e][jj] = vp[8 * jj];
            }
        }
        /* the scores: even and odd k steps in two accumulators (two chains of 8 mma, not one of 16) */
        float c[U][2][4];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int h = 0; h < 2; h++) c[u][h][0] = c[u][h][1] = c[u][h][2] = c[u][h][3] = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint4 a = qf[(2 * i + h) * WARP + lane];
#pragma unroll
                for (int u = 0; u < U; u++) tc_mma(c[u][h], a.x, a.y, a.z, a.w, cu_word(kr[u][i], 2 * h), cu_word(kr[u][i], 2 * h + 1));
            }
        float s[U][2], mc = -INFINITY;
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float v = ((c[u][0][e] + c[u][1][e]) + (c[u][0][e + 2] + c[u][1][e + 2])) * 0.0625f; /* (1 / sqrt(256)) */
                s[u][e] = jb + DT_STEP * u + 2 * qd + e < j1 ? v : -INFINITY;
                mc = fmaxf(mc, s[u][e]);
            }
        /* online softmax: head g's maximum over its 4 lanes (finite: key jb is in the split) */
        mc = fmaxf(mc, __shfl_xor_sync(0xffffffffu, mc, 1));
        mc = fmaxf(mc, __shfl_xor_sync(0xffffffffu, mc, 2));
        const float mn = fmaxf(mx, mc), corr = expf(mx - mn);
        mx = mn;
        l *= corr;
        uint32_t ph[U], pl[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const float p0 = expf(s[u][0] - mn), p1 = expf(s[u][1] - mn);
            l += p0 + p1;
            dt_split(p0, p1, ph[u], pl[u]);
        }
        /* the output's columns are heads 2qd, 2qd + 1: their factors from those heads' lanes */
        const float ce = __shfl_sync(0xffffffffu, corr, 8 * qd), co = __shfl_sync(0xffffffffu, corr, 8 * qd + 4);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            O[i][0] *= ce; O[i][1] *= co; O[i][2] *= ce; O[i][3] *= co;
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int jj = 0; jj < 4; jj++)
#pragma unroll
                for (int p = 0; p < 4; p++) {
                    const uint32_t w0 = cu_word(vr[u][0][jj], p), w1 = cu_word(vr[u][1][jj], p);
                    const uint32_t ad = __byte_perm(w0, w1, 0x5410), ad1 = __byte_perm(w0, w1, 0x7632); /* dim d, d + 1 of the two keys */
                    tc_mma(O[4 * jj + p], ad, ad1, ad, ad1, ph[u], pl[u]);
                }
    }
    /* join the warps: head g's sum over its lanes; the maxima, sums and O^T tiles into shared memory */
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (qd == 0) { sm_m[warp * 8 + g] = mx; sm_l[warp * 8 + g] = l; }
#pragma unroll
    for (int i = 0; i < 16; i++) so[(warp * 16 + i) * WARP + lane] = make_float4(O[i][0], O[i][1], O[i][2], O[i][3]);
    __syncthreads();
    /* warp w joins tiles w, w + W, .. of every warp (heads 2qd, 2qd + 1 scaled to the block's maxima)
     * into qs [head][dim] */
    float Me = -INFINITY, Mo = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; w++) { Me = fmaxf(Me, sm_m[w * 8 + 2 * qd]); Mo = fmaxf(Mo, sm_m[w * 8 + 2 * qd + 1]); }
#pragma unroll
    for (int i = warp; i < 16; i += W) {
        const int d = 64 * (i / 4) + 8 * g + 2 * (i % 4);
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int w = 0; w < W; w++) {
            const float me = sm_m[w * 8 + 2 * qd], mo = sm_m[w * 8 + 2 * qd + 1];
            const float fe = me == -INFINITY ? 0.f : expf(me - Me), fo = mo == -INFINITY ? 0.f : expf(mo - Mo);
            const float4 v = so[(w * 16 + i) * WARP + lane];
            a.x += fe * v.x; a.y += fo * v.y; a.z += fe * v.z; a.w += fo * v.w;
        }
        qs[2 * qd][d] = a.x; qs[2 * qd + 1][d] = a.y; qs[2 * qd][d + 1] = a.z; qs[2 * qd + 1][d + 1] = a.w;
    }
    __syncthreads();
    /* one partial a head: (max, sum, unnormalized output), as k_attn_gqa's (-inf, 0, .. for no keys) */
    for (int idx = threadIdx.x; idx < 8 * (DT_HD + 2); idx += blockDim.x) {
        const int h = idx / (DT_HD + 2), i = idx % (DT_HD + 2);
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < W; w++) M = fmaxf(M, sm_m[w * 8 + h]);
        float v = M;
        if (i == 1) {
            v = 0.f;
            if (M != -INFINITY)
                for (int w = 0; w < W; w++) v += sm_m[w * 8 + h] == -INFINITY ? 0.f : expf(sm_m[w * 8 + h] - M) * sm_l[w * 8 + h];
        } else if (i > 1) v = M == -INFINITY ? 0.f : qs[h][i - 2];
        part[((size_t)(t * nh + hq0 + h) * splits + blockIdx.y) * (DT_HD + 2) + i] = v;
    }
}

#endif
