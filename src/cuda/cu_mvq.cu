/* Decode's float matrix-vector kernels for one input row (k_mvq, k_mvq4) and for 2-8 rows (k_mvqb),
 * where k_mvdp (cu_mvdp.cu) does not take the launch, and their launchers. */
#include "cuda/cu_common.h"
#include "cuda/cu_dev.h"
#include "cuda/cu_kern.h"
#include <limits.h>
#include <cuda_fp16.h>
#include <mma.h>
using namespace nvcuda;
#include <math.h>
#include <stdlib.h>

/* ---- quantized matrix-vector for one input row (decode), for up to MVQ_MAX matrices that
 * read the same input in one launch: LPR lanes per weight row, each lane reading 16 bytes
 * of codes at a time; the input row is staged in shared memory (swizzled so the lanes'
 * float4 reads hit distinct banks), optionally as silu(X) * X2 (SwiGLU fused into the
 * down projection). Needs 4- or 8-bit codes, cols % 32 == 0, group % 32 == 0. ---- */

/* Where a lane group's row of tile t lies: its matrix (mi only grows, as t does) and its row. */
struct mvq_pos {
    const uint4 *w;        /* the row's codes, 16 bytes a chunk (the last row for rows past the matrix) */
    const char *s, *b;     /* its group scales and biases */
    int sbt, lcpg;         /* their type; log2 of the chunks a quantization group (a power of two) */
    int rows, row;
};
__device__ __forceinline__ mvq_pos mvq_locate(const mvq_args &a, bool xsl, int e, int t, int &mi, int rpt, int rib) {
    while (mi + 1 < a.n && t >= a.blk0[mi + 1]) mi++;
    const dmat &m = xsl ? a.f.xm[mi] : a.m[mi];
    mvq_pos p;
    p.sbt = m.sbt; p.lcpg = __ffs(m.group / 32) - 1; p.rows = m.rows;
    p.row = (t - a.blk0[mi]) * rpt + rib;
    const int nch = m.cols / 32, r = min(p.row, m.rows - 1);
    const size_t gi = (size_t)r * (nch >> p.lcpg), sz = m.sbt == LW_F32 ? 4 : 2;
    p.w = (const uint4 *)((const char *)m.w + (long long)e * m.ew) + (size_t)r * nch;
    p.s = (const char *)m.s + (long long)e * m.es + gi * sz;
    p.b = (const char *)m.b + (long long)e * m.es + gi * sz;
    return p;
}
/* chunk c of p's row: its codes, and its group's scale and bias */
template <int SBT>
__device__ __forceinline__ void mvq_load(const mvq_pos &p, int c, uint4 &q, float &sc, float &bi) {
    q = __ldg(p.w + c);
    sc = mvq_sb<SBT>(p.s, p.sbt, c >> p.lcpg);
    bi = mvq_sb<SBT>(p.b, p.sbt, c >> p.lcpg);
}
/* The block's input: x (silu(x) * x2 when has2; rmsnorm(x (+ add)) * nw with the fused norm, which
 * the first block also writes to tout: with k_mvq's ROWS each slot's, its row roff), swizzled and
 * scaled into xs, and each chunk's sum into sxs. A dense launch of several slots (a decode batch's
 * router group, ROWS) reads row `slot` of X and add (roff = slot ldx) and writes row `slot` of Y. */
/* With the fused norm of a dense launch, a thread's first four columns of x (with add: x is then
 * the residual, written two launches back or more, never by the predecessor) and of nw, loaded
 * before the wait, so that the add is the staging's one round trip after it. */
struct mvq_pre {
    float4 x, w;
};
__device__ __forceinline__ mvq_pre mvq_preload(const mvq_args &a, const float *X, bool dense, int nch) {
    mvq_pre p;
    p.x = p.w = make_float4(0.f, 0.f, 0.f, 0.f);
    const int i = threadIdx.x;
    if (a.f.nw && dense && i < nch * 8) {
        const float *w = a.f.nw + i * 4;
        p.w = make_float4(w[0], w[1], w[2], w[3]);
        if (a.f.add) {
            const float *q = X + i * 4;
            p.x = make_float4(q[0], q[1], q[2], q[3]);
        }
    }
    return p;
}
__device__ __forceinline__ void mvq_stage(const mvq_args &a, const float *x, const float *x2, bool has2, int nch, float4 *xs,
                                          float *sxs, const mvq_pre &pre, size_t roff, bool wout) {
    if (a.f.nw) { /* the norm, fused (mvq_fuse): after the residual add, or after a folded combine */
        __shared__ float red[32];
        float ss = 0;
        for (int i = threadIdx.x; i < nch * 8; i += blockDim.x) {
            int c = i / 8, j = i % 8;
            const float *p = x + c * 32 + j * 4, *ad = a.f.add + roff + c * 32 + j * 4;
            const float4 xv = a.f.add && i == (int)threadIdx.x ? pre.x : make_float4(p[0], p[1], p[2], p[3]);
            float4 v = a.f.add ? make_float4(xv.x + ad[0], xv.y + ad[1], xv.z + ad[2], xv.w + ad[3]) : xv;
            ss += v.x * v.x; ss += v.y * v.y; ss += v.z * v.z; ss += v.w * v.w;
            xs[mvq_sw(c, j)] = v;
        }
        ss = block_sum(ss, red);
        const float r = 1.0f / sqrtf(ss / (nch * 32) + a.f.eps);
        for (int i = threadIdx.x; i < nch * 8; i += blockDim.x) { /* the same elements as this thread staged */
            int c = i / 8, j = i % 8;
            const float *wp = a.f.nw + c * 32 + j * 4;
            const float4 w = i == (int)threadIdx.x ? pre.w : make_float4(wp[0], wp[1], wp[2], wp[3]);
            float4 v = xs[mvq_sw(c, j)];
            v.x = v.x * r * w.x; v.y = v.y * r * w.y; v.z = v.z * r * w.z; v.w = v.w * r * w.w;
            xs[mvq_sw(c, j)] = v;
            if (wout) {
                float *o = a.f.tout + roff + c * 32 + j * 4;
                o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w;
            }
            mvq_scale(xs, c, j);
        }
    } else {
        for (int i = threadIdx.x; i < nch * 8; i += blockDim.x) {
            int c = i / 8, j = i % 8;
            const float *p = x + c * 32 + j * 4;
            float4 v = make_float4(p[0], p[1], p[2], p[3]);
            if (has2) {
                const float *p2 = x2 + c * 32 + j * 4;
                v.x = silu_f(v.x) * p2[0]; v.y = silu_f(v.y) * p2[1]; v.z = silu_f(v.z) * p2[2]; v.w = silu_f(v.w) * p2[3];
            }
            xs[mvq_sw(c, j)] = v;
            mvq_scale(xs, c, j);
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < nch; c += blockDim.x) sxs[c] = mvq_chunk_sum(xs, c);
    __syncthreads();
}

/* chunks of 8-bit codes a lane loads before the wait (2: the router's 2,048 columns over 32 lanes) */
#define MVQ_PRE8 2
/* (one block an SM: 128 registers, where 64 spilled; its launches, decode's router group, are a
 * few dozen blocks) */
template <int LPR, int RW, bool ROWS>
__global__ void __launch_bounds__(512, 1) k_mvq(mvq_args a, const float *__restrict__ X, const float *__restrict__ X2, int ldx,
                                             const int *eidx, int xdiv) {
    extern __shared__ float4 xs[]; /* [cols / 4] the input, swizzled and scaled (mvq_scale) */
    float *sxs = (float *)(xs + m_cols_f4(a)); /* [cols / 32] each chunk's unscaled sum */
    const int RPW = 32 / LPR, ntiles = a.blk0[a.n];
    /* A block stages the input once and walks tiles of rows (blockIdx.x, + gridDim.x, ...):
     * with a tile a block, each 8 KB of codes paid for 8 KB of input staged from L2, two
     * barriers and a block's start, and the lm_head's 286 MB streamed at 1.1 TB/s. */
    int tile = blockIdx.x, mi = 0;
    while (mi + 1 < a.n && tile >= a.blk0[mi + 1]) mi++;
    const bool xsl = a.f.xslot && (int)blockIdx.y >= a.f.xslot;
    const dmat &m0 = xsl ? a.f.xm[mi] : a.m[mi];
    const int nch = m0.cols / 32, slot = blockIdx.y;
    int e = 0;
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, sub = lane % LPR, grp = lane / LPR;
    /* A dense matrix's first chunk of codes and its group constants (first tile) are loaded
     * before the wait on the predecessor (CU_PDL): they are weights, never written, so in the
     * decode graph their latency overlaps the previous kernel. (An expert's index comes from
     * that kernel.) */
    const bool pre = !eidx && m0.bits == 4 && sub < nch;
    uint4 q0[RW];
    float sc0[RW], bi0[RW];
#pragma unroll
    for (int k = 0; k < RW; k++) { q0[k] = make_uint4(0, 0, 0, 0); sc0[k] = bi0[k] = 0.f; }
    if (pre) {
        int rb = (((tile - a.blk0[mi]) * (int)(blockDim.x / WARP) + warp) * RPW + grp) * RW;
        int ng = m0.cols / m0.group, cpg = m0.group / 32;
#pragma unroll
        for (int k = 0; k < RW; k++) {
            int r = min(rb + k, m0.rows - 1);
            q0[k] = __ldg((const uint4 *)m0.w + (size_t)r * nch + sub);
            size_t gi = (size_t)r * ng + sub / cpg;
            sc0[k] = ld_sb((const char *)m0.s, m0.sbt, gi);
            bi0[k] = ld_sb((const char *)m0.b, m0.sbt, gi);
        }
    }
    /* 8-bit codes (decode's router group) likewise, a lane's first MVQ_PRE8 chunks of its first
     * row (one row a lane group): the loop below then starts on codes already in registers, where
     * it had waited on a round trip a chunk after the staging */
    const bool pre8 = !eidx && m0.bits == 8 && RW == 1;
    uint4 p8[MVQ_PRE8][2];
    float ps8[MVQ_PRE8], pb8[MVQ_PRE8];
#pragma unroll
    for (int u = 0; u < MVQ_PRE8; u++) { p8[u][0] = p8[u][1] = make_uint4(0, 0, 0, 0); ps8[u] = pb8[u] = 0.f; }
    if (pre8) {
        const int rb = ((tile - a.blk0[mi]) * (int)(blockDim.x / WARP) + warp) * RPW + grp, r = min(rb, m0.rows - 1);
        const int ng = m0.cols / m0.group, cpg = m0.group / 32;
        const uint4 *wr = (const uint4 *)m0.w + (size_t)r * nch * 2;
#pragma unroll
        for (int u = 0; u < MVQ_PRE8; u++) {
            const int c = sub + u * LPR;
            if (c < nch) {
                p8[u][0] = __ldg(wr + 2 * c);
                p8[u][1] = __ldg(wr + 2 * c + 1);
                const size_t gi = (size_t)r * ng + c / cpg;
                ps8[u] = ld_sb((const char *)m0.s, m0.sbt, gi);
                pb8[u] = ld_sb((const char *)m0.b, m0.sbt, gi);
            }
        }
    }
    /* ROWS: a dense launch of several slots, slot j reading and writing row j (a decode batch's router
     * group); an instance of its own, since the offsets cost one token's router group ~0.5% of tg128
     * (H100, bench/RESULTS.md session 42) */
    const size_t roff = ROWS ? (size_t)slot * ldx : 0;
    const mvq_pre xp = mvq_preload(a, X + roff, !eidx, nch);
    CU_PDL();
    const float *x = X + roff, *x2 = ROWS && X2 ? X2 + roff : X2;
    if (eidx) e = mvq_slot_input(a, X, X2, ldx, eidx, xdiv, xsl, slot, x, x2);
    mvq_stage(a, x, x2, X2 != NULL, nch, xs, sxs, xp, roff, blockIdx.x == 0 && (ROWS || blockIdx.y == 0));
    for (bool first = true; tile < ntiles; tile += gridDim.x, first = false) {
        while (mi + 1 < a.n && tile >= a.blk0[mi + 1]) mi++;
        const dmat &m = xsl ? a.f.xm[mi] : a.m[mi];
        float *y = a.y[mi] + (eidx || ROWS ? (size_t)slot * a.ldy[mi] : 0);
        int rb = (((tile - a.blk0[mi]) * (int)(blockDim.x / WARP) + warp) * RPW + grp) * RW;
        int rr[RW];
#pragma unroll
        for (int k = 0; k < RW; k++) rr[k] = min(rb + k, m.rows - 1);
        int ng = m.cols / m.group, cpg = m.group / 32;
        const char *sp = (const char *)m.s + (long long)e * m.es, *bp = (const char *)m.b + (long long)e * m.es;
        const char *wb = (const char *)m.w + (long long)e * m.ew;
        float acc[RW];
#pragma unroll
        for (int k = 0; k < RW; k++) acc[k] = 0.f;
        if (m.bits == 4) {
#pragma unroll(RW == 1 ? 2 : 1)
            for (int c = sub; c < nch; c += LPR) {
                uint4 q[RW];
                float sc[RW], bi[RW];
#pragma unroll
                for (int k = 0; k < RW; k++) {
                    if (pre && first && c == sub) {
                        q[k] = q0[k];
                        sc[k] = sc0[k];
                        bi[k] = bi0[k];
                        continue;
                    }
                    q[k] = __ldg((const uint4 *)wb + (size_t)rr[k] * nch + c);
                    size_t gi = (size_t)rr[k] * ng + c / cpg;
                    sc[k] = ld_sb(sp, m.sbt, gi);
                    bi[k] = ld_sb(bp, m.sbt, gi);
                }
                float4 xv[8];
#pragma unroll
                for (int j = 0; j < 8; j++) xv[j] = xs[mvq_sw(c, j)];
                const float sx = sxs[c];
#pragma unroll
                for (int k = 0; k < RW; k++) {
                    uint32_t wv[4] = { q[k].x, q[k].y, q[k].z, q[k].w };
                    float sq = 0;
#pragma unroll
                    for (int w = 0; w < 4; w++) {
                        float4 u = xv[2 * w], t = xv[2 * w + 1];
                        uint32_t v = wv[w], h = v >> 12;
                        sq += q4m(v, 0xFu) * u.x + q4m(v, 0xF0u) * u.y + q4m(v, 0xF00u) * u.z + q4m(v, 0xF000u) * u.w
                            + q4m(v, 0xF0000u) * t.x + q4m(h, 0xF00u) * t.y + q4m(h, 0xF000u) * t.z + q4m(h, 0xF0000u) * t.w;
                    }
                    acc[k] += sc[k] * sq + bi[k] * sx;
                }
            }
        } else {
            for (int c = sub, u = 0; c < nch; c += LPR, u++) {
                float4 xv[8];
#pragma unroll
                for (int j = 0; j < 8; j++) xv[j] = mvq_unscale(xs[mvq_sw(c, j)], j);
                const float sx = sxs[c];
#pragma unroll
                for (int k = 0; k < RW; k++) {
                    uint4 q0, q1;
                    float sc, bi;
                    if (pre8 && first && u < MVQ_PRE8) { /* (u < 2: selects, not an indexed array) */
                        q0 = u == 0 ? p8[0][0] : p8[MVQ_PRE8 - 1][0];
                        q1 = u == 0 ? p8[0][1] : p8[MVQ_PRE8 - 1][1];
                        sc = u == 0 ? ps8[0] : ps8[MVQ_PRE8 - 1];
                        bi = u == 0 ? pb8[0] : pb8[MVQ_PRE8 - 1];
                    } else {
                        const uint4 *wr = (const uint4 *)wb + (size_t)rr[k] * nch * 2;
                        q0 = __ldg(wr + 2 * c);
                        q1 = __ldg(wr + 2 * c + 1);
                        size_t gi = (size_t)rr[k] * ng + c / cpg;
                        sc = ld_sb(sp, m.sbt, gi);
                        bi = ld_sb(bp, m.sbt, gi);
                    }
                    uint32_t wv[8] = { q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w };
                    float sq = 0;
#pragma unroll
                    for (int w = 0; w < 8; w++) {
                        uint32_t v = wv[w];
                        sq += (float)(v & 255u) * xv[w].x + (float)((v >> 8) & 255u) * xv[w].y + (float)((v >> 16) & 255u) * xv[w].z + (float)(v >> 24) * xv[w].w;
                    }
                    acc[k] += sc * sq + bi * sx;
                }
            }
        }
#pragma unroll
        for (int k = 0; k < RW; k++) {
            float v = acc[k];
#pragma unroll
            for (int o = LPR / 2; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (rb + k < m.rows && sub == 0) y[rb + k] = v;
        }
    }
    if (a.f.sel && mi == 0) { /* the router's top-k by the block that finishes matrix 0 last (mvq_fuse) */
        __shared__ int last;
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) last = atomicAdd(a.f.count, 1u) == (unsigned)(a.blk0[1] - a.blk0[0] - 1);
        __syncthreads();
        if (last) {
            __threadfence();
            if (threadIdx.x < WARP) route_warp(a.y[0], a.f.E, a.f.K, (float *)xs, a.f.sel, a.f.wt);
            if (threadIdx.x == 0) *a.f.count = 0;
        }
    }
}

/* The same for one row a lane group and 4-bit codes only, software-pipelined: the next chunk's
 * codes (the next tile's first, at a tile's last) are loaded before this chunk is computed, so
 * each warp keeps a load in flight, and only two chunks of codes live in registers. (k_mvq held
 * eight float4s of input a chunk, two chunks unrolled: 64 registers with spills, 4 blocks an SM.)
 * Four chunks ahead in a register ring measured slower on the H200: the kernel is bound by the
 * instructions it issues, not by loads in flight (bench/RESULTS.md). No fused top-k. */
template <int LPR, int SBT>
__global__ void __launch_bounds__(256, 5) k_mvq4(mvq_args a, const float *__restrict__ X, const float *__restrict__ X2, int ldx,
                                              const int *eidx, int xdiv) {
    extern __shared__ float4 xs[];
    float *sxs = (float *)(xs + m_cols_f4(a));
    const int RPW = 32 / LPR, ntiles = a.blk0[a.n], nch = a.m[0].cols / 32;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, sub = lane % LPR, grp = lane / LPR;
    const int rpt = (int)(blockDim.x / WARP) * RPW, rib = warp * RPW + grp, slot = blockIdx.y;
    const bool xsl = a.f.xslot && slot >= a.f.xslot;
    int tile = blockIdx.x, mi = 0, e = 0;
    uint4 q = make_uint4(0, 0, 0, 0);
    float sc = 0.f, bi = 0.f;
    mvq_pos p;
    /* a dense matrix's first chunk is loaded before the wait on the predecessor (weights are
     * never written); an expert's index comes from that kernel */
    if (!eidx) {
        p = mvq_locate(a, xsl, 0, tile, mi, rpt, rib);
        if (sub < nch) mvq_load<SBT>(p, sub, q, sc, bi);
    }
    const mvq_pre xp = mvq_preload(a, X, !eidx, nch);
    CU_PDL();
    const float *x = X, *x2 = X2;
    if (eidx) {
        e = mvq_slot_input(a, X, X2, ldx, eidx, xdiv, xsl, slot, x, x2);
        p = mvq_locate(a, xsl, e, tile, mi, rpt, rib);
        if (sub < nch) mvq_load<SBT>(p, sub, q, sc, bi);
    }
    mvq_stage(a, x, x2, X2 != NULL, nch, xs, sxs, xp, 0, blockIdx.x == 0 && blockIdx.y == 0);
    while (tile < ntiles) {
        float acc = 0.f;
        int nt = tile + gridDim.x, nmi = mi;
        mvq_pos np = p;
        for (int c = sub; c < nch; c += LPR) {
            uint4 qn = make_uint4(0, 0, 0, 0);
            float scn = 0.f, bin = 0.f;
            int cn = c + LPR;
            bool ld = cn < nch;
            if (!ld && nt < ntiles) { np = mvq_locate(a, xsl, e, nt, nmi, rpt, rib); cn = sub; ld = sub < nch; }
            if (ld) mvq_load<SBT>(np, cn, qn, scn, bin);
            acc += mvq_chunk4(q, sc, bi, xs, sxs, c, sub & 7);
            q = qn; sc = scn; bi = bin;
        }
#pragma unroll
        for (int o = LPR / 2; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (p.row < p.rows && sub == 0) a.y[mi][(eidx ? (size_t)slot * a.ldy[mi] : 0) + p.row] = acc;
        tile = nt; mi = nmi; p = np;
    }
}

template <int LPR, int RW, bool ROWS>
static void mvq_launch_r(int tiles, int nslots, int one_a_tile, int bt, size_t sm, cudaStream_t s, const mvq_args &a,
                         const float *X, const float *X2, int ldx, const int *eidx, int xdiv) {
    static mvq_kstate ks;
    int gx = mvq_grid(k_mvq<LPR, RW, ROWS>, ks, tiles, nslots, one_a_tile, bt, sm);
    cu_go(k_mvq<LPR, RW, ROWS>, dim3(gx, nslots), bt, sm, s)(a, X, X2, ldx, eidx, xdiv);
}
template <int LPR, int RW>
static void mvq_launch(int tiles, int nslots, int one_a_tile, int bt, size_t sm, cudaStream_t s, const mvq_args &a,
                       const float *X, const float *X2, int ldx, const int *eidx, int xdiv) {
    if (!eidx && nslots > 1) mvq_launch_r<LPR, RW, true>(tiles, nslots, one_a_tile, bt, sm, s, a, X, X2, ldx, eidx, xdiv);
    else mvq_launch_r<LPR, RW, false>(tiles, nslots, one_a_tile, bt, sm, s, a, X, X2, ldx, eidx, xdiv);
}
template <int LPR, int SBT>
static void mvq4_launch_t(int tiles, int nslots, int bt, size_t sm, cudaStream_t s, const mvq_args &a, const float *X,
                          const float *X2, int ldx, const int *eidx, int xdiv) {
    static mvq_kstate ks;
    int gx = mvq_grid(k_mvq4<LPR, SBT>, ks, tiles, nslots, 0, bt, sm);
    cu_go(k_mvq4<LPR, SBT>, dim3(gx, nslots), bt, sm, s)(a, X, X2, ldx, eidx, xdiv);
}
/* bf16 group constants (MLX's) get their own kernel, without the type's branch a load;
 * sbt: the launch's matrices' common type, -1 when they differ */
template <int LPR>
static void mvq4_launch(int sbt, int tiles, int nslots, int bt, size_t sm, cudaStream_t s, const mvq_args &a, const float *X,
                        const float *X2, int ldx, const int *eidx, int xdiv) {
    if (sbt == LW_BF16) mvq4_launch_t<LPR, LW_BF16>(tiles, nslots, bt, sm, s, a, X, X2, ldx, eidx, xdiv);
    else mvq4_launch_t<LPR, -1>(tiles, nslots, bt, sm, s, a, X, X2, ldx, eidx, xdiv);
}


/* LILY_CU_MVQ4_SBT=0: the kernel that reads the group constants' type at run time for all, for
 * measuring (the kernel test covers that kernel with f16 and f32 scales) */
static int mvq4_sbt_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_MVQ4_SBT", 1);
}

/* LILY_CU_MVQ4=0: 4-bit matrices through k_mvq too, for measuring */
static int mvq4_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_MVQ4", 1);
}

int cu_mvq_ok(const dmat *W) {
    return W->type == LW_Q && (W->bits == 4 || W->bits == 8) && W->cols % 32 == 0 && W->group % 32 == 0 && W->cols <= 12288;
}

void cu_matvec_group(cudaStream_t s, int n, const dmat *const *W, const float *X, const float *X2, int ldx,
                     float *const *Y, const int *ldy, const int *eidx, int xdiv, int nslots, const mvq_fuse *fu) {
    mvq_args a;
    memset(&a, 0, sizeof a);
    if (fu) a.f = *fu;
    mvq_args_set(&a, n, W, Y, ldy);
    int cols = W[0]->cols, nch = cols / 32, lpr = nch >= 32 ? 32 : nch >= 16 ? 16 : 8;
    /* rows per lane group: as many as keep at least two blocks per multiprocessor busy */
    int rows = 0;
    for (int i = 0; i < n; i++) rows += W[i]->rows;
    rows *= nslots;
    int rw_max = lpr == 32 ? 4 : lpr == 16 ? 2 : 1;
    /* Rows a lane group walks (the staged input reused across them) and warps a block. Four rows
     * a warp at 128 registers and the input in registers (k_mvx) both measured slower on the H200
     * than one row a warp with 8 warps. LILY_MVQ_RW / LILY_MVQ_WARPS override, for measuring. */
    static int env_rw = -1, env_warps = -1;
    if (env_rw < 0) {
        const char *e1 = getenv("LILY_MVQ_RW"), *e2 = getenv("LILY_MVQ_WARPS");
        env_rw = e1 ? atoi(e1) : 1;
        env_warps = e2 ? atoi(e2) : 8;
        if (env_rw != 1 && env_rw != 2 && env_rw != 4) env_rw = 1;
        if (env_warps != 4 && env_warps != 8 && env_warps != 16) env_warps = 8;
    }
    (void)rows;
    int rw = env_rw < rw_max ? env_rw : rw_max, warps = env_warps;
    int rpb = warps * (32 / lpr) * rw, nb = mvq_tiles(&a, rpb);
    size_t sm = (size_t)cols * sizeof(float) + (size_t)nch * sizeof(float);
    int bt = warps * WARP, one = fu && fu->sel, all4 = 1;
    for (int i = 0; i < n; i++) { /* (k_mvq4 shifts chunk indices to group indices) */
        all4 &= W[i]->bits == 4 && cu_pow2(W[i]->group / 32) && (!fu || !fu->xslot || (fu->xm[i].bits == 4 && fu->xm[i].group == W[i]->group));
    }
    /* the group constants' type common to the launch's matrices, -1 when they differ */
    int sbt = W[0]->sbt;
    for (int i = 0; i < n; i++)
        if (W[i]->sbt != sbt || (fu && fu->xslot && fu->xm[i].sbt != sbt)) sbt = -1;
    if (rw == 1 && !one && cu_mvdp_group(s, &a, sbt, X, X2, ldx, eidx, xdiv, nslots)) return;
    if (a.f.rlog) { /* no kernel below routes itself: the top-k first, as without rlog (a batch's tokens too) */
        cu_router_topk(s, a.f.rlog, (a.f.xslot ? a.f.xslot : nslots) / a.f.K, a.f.E, a.f.K, a.f.rsel, a.f.rwt);
        a.f.rlog = NULL;
    }
    if (rw == 1 && all4 && !one && cu_mvtc_group(s, &a, sbt, X, X2, ldx, eidx, xdiv, nslots)) return;
    if (rw == 1 && all4 && !one && mvq4_enabled() && (eidx || nslots == 1)) { /* (several dense slots: k_mvq's ROWS) */
        if (!mvq4_sbt_enabled()) sbt = -1;
        if (lpr == 32) mvq4_launch<32>(sbt, nb, nslots, bt, sm, s, a, X, X2, ldx, eidx, xdiv);
        else if (lpr == 16) mvq4_launch<16>(sbt, nb, nslots, bt, sm, s, a, X, X2, ldx, eidx, xdiv);
        else mvq4_launch<8>(sbt, nb, nslots, bt, sm, s, a, X, X2, ldx, eidx, xdiv);
    } else if (lpr == 32 && rw == 4) mvq_launch<32, 4>(nb, nslots, one, bt, sm, s, a, X, X2, ldx, eidx, xdiv);
    else if (lpr == 32 && rw == 2) mvq_launch<32, 2>(nb, nslots, one, bt, sm, s, a, X, X2, ldx, eidx, xdiv);
    else if (lpr == 32) mvq_launch<32, 1>(nb, nslots, one, bt, sm, s, a, X, X2, ldx, eidx, xdiv);
    else if (lpr == 16 && rw == 2) mvq_launch<16, 2>(nb, nslots, one, bt, sm, s, a, X, X2, ldx, eidx, xdiv);
    else if (lpr == 16) mvq_launch<16, 1>(nb, nslots, one, bt, sm, s, a, X, X2, ldx, eidx, xdiv);
    else mvq_launch<8, 1>(nb, nslots, one, bt, sm, s, a, X, X2, ldx, eidx, xdiv);
}

/* ---- the same for 2-8 input rows (decode batches). The single-row kernel's pattern (LPR
 * lanes per weight row, 16 bytes of codes a lane a step, the input staged in shared memory,
 * swizzled) with the codes of RW weight rows a lane group dequantized once and multiplied
 * with all T <= NB staged rows: the weights are read once for the batch, and each float4 of
 * input read from shared memory serves RW weight rows (with one row a lane, the staged input,
 * NB x 4 bytes per weight, would be read per weight: shared-memory bound at NB = 8).
 * Shared memory: T rows of cols floats (optionally silu(X) * X2); rows T..NB-1 are neither
 * staged nor computed. Y row t of matrix i at a.y[i] + t * a.ldy[i]. Same conditions as
 * k_mvq (cu_mvq_ok). ---- */
template <int BITS, int NB, int RW>
__device__ __forceinline__ void mvqb_chunk(const uint32_t (&wv)[RW][BITS], const float (&sc)[RW], const float (&bi)[RW],
                                           const float4 *xs, int nch, int c, int T, float (&acc)[RW][NB]) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float4 xv[NB];
#pragma unroll
        for (int t = 0; t < NB; t++)
            xv[t] = t < T ? xs[((size_t)t * nch + c) * 8 + ((j + c) & 7)] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int k = 0; k < RW; k++) {
            /* w = sc q + bi = (16 sc) (1 + q/16) + (bi - 16 sc), without an int-to-float conversion */
            float w0, w1, w2, w3;
            if (BITS == 4) {
                uint32_t v = wv[k][j >> 1];
                float s1 = 16.f * sc[k], b1 = bi[k] - s1;
                if (j & 1) {
                    w0 = fmaf(q4_f1<4>(v), s1, b1); w1 = fmaf(q4_f1<5>(v), s1, b1);
                    w2 = fmaf(q4_f1<6>(v), s1, b1); w3 = fmaf(q4_f1<7>(v), s1, b1);
                } else {
                    w0 = fmaf(q4_f1<0>(v), s1, b1); w1 = fmaf(q4_f1<1>(v), s1, b1);
                    w2 = fmaf(q4_f1<2>(v), s1, b1); w3 = fmaf(q4_f1<3>(v), s1, b1);
                }
            } else {
                uint32_t v = wv[k][j];
                float s1 = 256.f * sc[k], b1 = bi[k] - s1;
                w0 = fmaf(q8_f1<0>(v), s1, b1); w1 = fmaf(q8_f1<1>(v), s1, b1);
                w2 = fmaf(q8_f1<2>(v), s1, b1); w3 = fmaf(q8_f1<3>(v), s1, b1);
            }
#pragma unroll
            for (int t = 0; t < NB; t++)
                if (t < T) acc[k][t] += w0 * xv[t].x + w1 * xv[t].y + w2 * xv[t].z + w3 * xv[t].w;
        }
    }
}

template <int LPR, int NB, int RW, int BITS>
__global__ void __launch_bounds__(256, 2) k_mvqb(mvq_args a, const float *__restrict__ X, const float *__restrict__ X2, int ldx, int T) {
    CU_PDL();
    extern __shared__ float4 xs[];
    int mi = 0;
    while (mi + 1 < a.n && (int)blockIdx.x >= a.blk0[mi + 1]) mi++;
    const dmat &m = a.m[mi];
    int nch = m.cols / 32;
    for (int i = threadIdx.x; i < T * nch * 8; i += blockDim.x) {
        int t = i / (nch * 8), k = i % (nch * 8), c = k / 8, j = k % 8;
        const float *p = X + (size_t)t * ldx + c * 32 + j * 4;
        float4 v = make_float4(p[0], p[1], p[2], p[3]);
        if (X2) {
            const float *p2 = X2 + (size_t)t * ldx + c * 32 + j * 4;
            v.x = silu_f(v.x) * p2[0]; v.y = silu_f(v.y) * p2[1]; v.z = silu_f(v.z) * p2[2]; v.w = silu_f(v.w) * p2[3];
        }
        xs[((size_t)t * nch + c) * 8 + ((j + c) & 7)] = v;
    }
    __syncthreads();
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, sub = lane % LPR, grp = lane / LPR;
    int rb = (((blockIdx.x - a.blk0[mi]) * (int)(blockDim.x / WARP) + warp) * (32 / LPR) + grp) * RW;
    int rr[RW];
#pragma unroll
    for (int k = 0; k < RW; k++) rr[k] = min(rb + k, m.rows - 1);
    const char *sp = (const char *)m.s, *bp = (const char *)m.b, *wb = (const char *)m.w;
    int ng = m.cols / m.group, cpg = m.group / 32;
    float acc[RW][NB];
#pragma unroll
    for (int k = 0; k < RW; k++)
#pragma unroll
        for (int t = 0; t < NB; t++) acc[k][t] = 0.f;
    for (int c = sub; c < nch; c += LPR) {
        uint32_t wv[RW][BITS];
        float sc[RW], bi[RW];
#pragma unroll
        for (int k = 0; k < RW; k++) {
            if (BITS == 4) {
                uint4 q = __ldg((const uint4 *)wb + (size_t)rr[k] * nch + c);
                wv[k][0] = q.x; wv[k][1] = q.y; wv[k][2] = q.z; wv[k][3] = q.w;
            } else {
                const uint4 *wr = (const uint4 *)wb + (size_t)rr[k] * nch * 2;
                uint4 q0 = __ldg(wr + 2 * c), q1 = __ldg(wr + 2 * c + 1);
                wv[k][0] = q0.x; wv[k][1] = q0.y; wv[k][2] = q0.z; wv[k][3] = q0.w;
                wv[k][BITS / 2] = q1.x; wv[k][BITS / 2 + 1] = q1.y; wv[k][BITS / 2 + 2] = q1.z; wv[k][BITS - 1] = q1.w;
            }
            size_t gi = (size_t)rr[k] * ng + c / cpg;
            sc[k] = ld_sb(sp, m.sbt, gi);
            bi[k] = ld_sb(bp, m.sbt, gi);
        }
        mvqb_chunk<BITS, NB, RW>(wv, sc, bi, xs, nch, c, T, acc);
    }
    float *y = a.y[mi];
#pragma unroll
    for (int k = 0; k < RW; k++)
#pragma unroll
        for (int t = 0; t < NB; t++) {
            if (t >= T) break;
            float v = acc[k][t];
#pragma unroll
            for (int o = LPR / 2; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (rb + k < m.rows && sub == 0) y[(size_t)t * a.ldy[mi] + rb + k] = v;
        }
}

/* Dynamic shared memory one k_mvqb block may take: two blocks fit an H100/H200 SM (227 KB). */
#define MVQB_SMEM (112 * 1024)

template <int LPR, int NB, int RW, int BITS>
static void mvqb_launch(cudaStream_t s, dim3 g, size_t sm, const mvq_args &a, const float *X, const float *X2, int ldx, int T) {
    static int attr_set; /* above the default 48 KB of dynamic shared memory */
    if (!attr_set) { cudaFuncSetAttribute(k_mvqb<LPR, NB, RW, BITS>, cudaFuncAttributeMaxDynamicSharedMemorySize, MVQB_SMEM); attr_set = 1; }
    cu_go(k_mvqb<LPR, NB, RW, BITS>, g, 256, sm, s)(a, X, X2, ldx, T);
}

template <int LPR, int RW>
static void mvqb_nb(int nb, int bits, cudaStream_t s, dim3 g, size_t sm, const mvq_args &a, const float *X, const float *X2, int ldx, int T) {
    if (bits == 8) {
        if (nb == 2) mvqb_launch<LPR, 2, RW, 8>(s, g, sm, a, X, X2, ldx, T);
        else if (nb == 4) mvqb_launch<LPR, 4, RW, 8>(s, g, sm, a, X, X2, ldx, T);
        else mvqb_launch<LPR, 8, RW, 8>(s, g, sm, a, X, X2, ldx, T);
    } else {
        if (nb == 2) mvqb_launch<LPR, 2, RW, 4>(s, g, sm, a, X, X2, ldx, T);
        else if (nb == 4) mvqb_launch<LPR, 4, RW, 4>(s, g, sm, a, X, X2, ldx, T);
        else mvqb_launch<LPR, 8, RW, 4>(s, g, sm, a, X, X2, ldx, T);
    }
}


void cu_matvec_rows(cudaStream_t s, int n, const dmat *const *W, const float *X, const float *X2, int ldx, int T,
                    float *const *Y, const int *ldy) {
    int cols = W[0]->cols, nch = cols / 32, lpr = nch >= 32 ? 32 : nch >= 16 ? 16 : 8;
    size_t row_bytes = (size_t)cols * sizeof(float);
    int nbmax = 8;
    while (nbmax > 1 && nbmax * row_bytes > MVQB_SMEM) nbmax /= 2;
    /* one weight row a lane group: measured faster on the H200 than 4 (x2 and x4 batches: 327 and
     * 447 tok/s against 269 and 389, bench/RESULTS.md 2026-11-30), where the input float4 read
     * from shared memory would serve 4 rows. LILY_MVQB_RW=4 for measuring. The matrices of one
     * launch share the code width. */
    static int env_rw = -1;
    if (env_rw < 0) {
        const char *e = getenv("LILY_MVQB_RW");
        env_rw = e && atoi(e) == 4 ? 4 : 1;
    }
    for (int i = 1; i < n && T > 1; i++) /* (k_mvq, for one row, takes mixed widths) */
        if (W[i]->bits != W[0]->bits) { /* a launch for each width (the router group: 8-bit router and gates, 4-bit gate|up) */
            const dmat *w[2][MVQ_MAX];
            float *y[2][MVQ_MAX];
            int ld[2][MVQ_MAX], k[2] = { 0, 0 };
            for (int j = 0; j < n; j++) {
                const int b = W[j]->bits != W[0]->bits;
                w[b][k[b]] = W[j]; y[b][k[b]] = Y[j]; ld[b][k[b]++] = ldy[j];
            }
            for (int b = 0; b < 2; b++) cu_matvec_rows(s, k[b], w[b], X, X2, ldx, T, y[b], ld[b]);
            return;
        }
    if (T > 1 && cu_mvdpb(s, n, W, X, X2, ldx, T, Y, ldy)) return;
    int bits = W[0]->bits;
    int rw_max = lpr == 32 ? 4 : lpr == 16 ? 2 : 1, rw = env_rw < rw_max ? env_rw : rw_max;
    int rpb = 8 * (32 / lpr) * rw; /* eight warps */
    for (int t0 = 0; t0 < T; t0 += nbmax) {
        int tn = T - t0 < nbmax ? T - t0 : nbmax;
        const float *x = X + (size_t)t0 * ldx, *x2 = X2 ? X2 + (size_t)t0 * ldx : NULL;
        float *y[MVQ_MAX];
        for (int i = 0; i < n; i++) y[i] = Y[i] + (size_t)t0 * ldy[i];
        if (tn == 1) { cu_matvec_group(s, n, W, x, x2, ldx, y, NULL, NULL, 1, 1, NULL); continue; }
        mvq_args a;
        memset(&a, 0, sizeof a);
        mvq_args_set(&a, n, W, y, ldy);
        const int nb = mvq_tiles(&a, rpb);
        int NBr = tn <= 2 ? 2 : tn <= 4 ? 4 : 8;
        dim3 g(nb, 1);
        size_t sm = (size_t)NBr * row_bytes;
        if (lpr == 32 && rw == 4) mvqb_nb<32, 4>(NBr, bits, s, g, sm, a, x, x2, ldx, tn);
        else if (lpr == 32) mvqb_nb<32, 1>(NBr, bits, s, g, sm, a, x, x2, ldx, tn);
        else if (lpr == 16 && rw == 2) mvqb_nb<16, 2>(NBr, bits, s, g, sm, a, x, x2, ldx, tn);
        else if (lpr == 16) mvqb_nb<16, 1>(NBr, bits, s, g, sm, a, x, x2, ldx, tn);
        else mvqb_nb<8, 1>(NBr, bits, s, g, sm, a, x, x2, ldx, tn);
    }
}
