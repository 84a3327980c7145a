/* Decode attention's pieces that its SIMT kernel (k_attn_gqa, cu_attn.cu) and its tensor-core kernel
 * (cu_attn_dtc.h) share: the folded q/k prep and the key splits. static inline: each
 * unit its own copy, so an emulator mutant (cu2cpp.py) breaks only the unit it names. */
#ifndef LILY_CU_ATTN_H
#define LILY_CU_ATTN_H
#include "cuda/cu_common.h"
#include "cuda/cu_dev.h"
#include "cuda/cu_kern.h"

/* Decode's q/k prep folded into attention (one token, one session: a launch a layer fewer):
 * k_qk_prep's per-head norm and RoPE of the raw q (qg, [nh][2 hd] with the gates) and of the new
 * token's k, and the cache write of k and v, done by the attention blocks themselves. */
typedef struct {
    const float *qg, *k, *v;   /* [nh][2 hd] raw q with gates, [nkv][hd] raw k and v */
    const float *qn, *kn;      /* [hd] the q and k norms' weights */
    const float *inv_freq;     /* [rot / 2] */
    uint16_t *kcw, *vcw;       /* the caches (as kc, vc), where the new token's k and v go */
    int rot;                   /* rotated dims, a multiple of 64: a pair (i, i + rot / 2) is one lane's */
    float eps;
} qk_fold;

template <int R, int HW>
static __device__ __forceinline__ void qk_rope(float (&v)[R], const float (&cs)[R], const float (&sn)[R]) {
#pragma unroll
    for (int i = 0; i < HW && i + HW < R; i++) {
        const float a = v[i], b = v[i + HW];
        v[i] = a * cs[i] - b * sn[i];
        v[i + HW] = b * cs[i] + a * sn[i];
    }
}
/* One head's hd values, R a lane (column lane + 32 i), normalized (weights w, the same columns) and rotated by RoPE
 * as k_qk_prep does, in place; cs[i], sn[i] (i < rot / 64): column lane + 32 i's angle. */
template <int R>
static __device__ __forceinline__ void qk_head(float (&v)[R], const float (&w)[R], int rot, float eps, const float (&cs)[R],
                                        const float (&sn)[R]) {
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < R; i++) ss += v[i] * v[i];
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / (R * WARP) + eps);
#pragma unroll
    for (int i = 0; i < R; i++) v[i] = v[i] * r * w[i];
    /* i < hw: the pair's first half, with i + hw; hw a template argument, so v stays in registers */
    switch (rot / 64) {
    case 1: qk_rope<R, 1>(v, cs, sn); break;
    case 2: qk_rope<R, 2>(v, cs, sn); break;
    case 3: qk_rope<R, 3>(v, cs, sn); break;
    default: qk_rope<R, 4>(v, cs, sn); break;
    }
}

/* A lane's pre-wait loads for the fold: the q and k norms' weights and RoPE's frequencies (its columns
 * lane + 32 i). Before the wait: after it, each token streams 2 GB through L2 and they were misses to
 * DRAM on the step's path (as the out-projection's gw, bench/RESULTS.md session 25). */
template <int R>
static __device__ __forceinline__ void qk_fold_weights(const qk_fold &P, float (&qw)[R], float (&kw)[R], float (&fr)[R]) {
    const int lane = threadIdx.x % WARP;
#pragma unroll
    for (int i = 0; i < R; i++) {
        qw[i] = P.qg ? P.qn[lane + WARP * i] : 0.f;
        kw[i] = P.qg ? P.kn[lane + WARP * i] : 0.f;
        fr[i] = P.qg && i < P.rot / 64 ? P.inv_freq[lane + WARP * i] : 0.f;
    }
}
/* The fold (T = 1) by a block of NW warps: its HG query heads hq0 .. (a warp a head) normed and rotated
 * into qs [HG][hd] (times mul), for every warp to read; and, by the block whose keys [j0, j1) hold the
 * new position n - 1, the new key and value written to the cache before its warps read it. Ends with
 * the block's barrier. */
template <int R, int HG, int NW>
static __device__ __forceinline__ void qk_fold_prep(const qk_fold &P, const float (&qw)[R], const float (&kw)[R], const float (&fr)[R], int hq0,
                                             int kvh, int nkv, int n, int j0, int j1, float (*qs)[R * WARP], float mul) {
    const int hd = R * WARP, warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int p = n - 1, hw = P.rot / 64;
    float cs[R], sn[R];
#pragma unroll
    for (int i = 0; i < R; i++) {
        cs[i] = 1.f; sn[i] = 0.f;
        if (i < hw) {
            const float ang = (float)p * fr[i];
            cs[i] = cosf(ang);
            sn[i] = sinf(ang);
        }
    }
    for (int g = warp; g < HG; g += NW) {
        const float *qh = P.qg + (size_t)(hq0 + g) * 2 * hd;
        float v[R];
#pragma unroll
        for (int i = 0; i < R; i++) v[i] = qh[lane + WARP * i];
        qk_head<R>(v, qw, P.rot, P.eps, cs, sn);
#pragma unroll
        for (int i = 0; i < R; i++) qs[g][lane + WARP * i] = v[i] * mul;
    }
    if (j0 <= p && p < j1) { /* (block-uniform) */
        const size_t o = (size_t)p * nkv * hd + (size_t)kvh * hd;
        if (warp == 0) {
            float kv[R];
#pragma unroll
            for (int i = 0; i < R; i++) kv[i] = P.k[(size_t)kvh * hd + lane + WARP * i];
            qk_head<R>(kv, kw, P.rot, P.eps, cs, sn);
#pragma unroll
            for (int i = 0; i < R; i++) P.kcw[o + lane + WARP * i] = cu_f2h(kv[i]);
        } else
            for (int i = threadIdx.x - WARP; i < hd; i += blockDim.x - WARP) P.vcw[o + i] = cu_f2h(P.v[(size_t)kvh * hd + i]);
    }
    __syncthreads(); /* (the q heads, and the block's cache writes, seen by its threads past the barrier) */
}

/* The key splits a token's decode attention uses of its grid's `splits` (amin > 0: one token, n keys):
 * at least amin keys a split past half of them, so short contexts keep half the splits (their partials
 * and their merge cost as before) and long ones get every split's loads in flight (splits > 0). */
static __host__ __device__ __forceinline__ int attn_splits_used(int splits, int amin, int n) {
    if (amin <= 0) return splits;
    const int lo = splits / 2 > 0 ? splits / 2 : 1, se = (n + amin - 1) / amin;
    return se < lo ? lo : se > splits ? splits : se;
}

#endif
