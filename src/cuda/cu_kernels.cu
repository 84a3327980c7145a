/* The CUDA kernels, each a float32 transcription of the CPU reference op it replaces
 * (src/cpu/forward.c, src/cpu/ops.c), and their launchers (declared in cu_common.h). */
#include "cuda/cu_common.h"
#include "cuda/cu_dev.h"
#include <limits.h>
#include <cuda_fp16.h>
#include <mma.h>
using namespace nvcuda;
#include <math.h>
#include <stdlib.h>

/* Code J of a word as the float 1 + q/16 (4-bit) or 1 + q/256 (8-bit): the code is moved
 * into the top of the mantissa of 1.0, a shift and an and-or instead of an int-to-float
 * conversion, which runs at a quarter of the FMA rate and bounded the matrix-vector kernels.
 * Exact; the caller folds the 1 into the group bias: sum q x = 16 (sum f x - sum x). */
template <int J>
__device__ __forceinline__ float q4_f1(uint32_t v) {
    uint32_t t = J <= 4 ? v << (19 - 4 * J) : v >> (4 * J - 19);
    return __uint_as_float((t & 0x00780000u) | 0x3F800000u);
}
template <int J>
__device__ __forceinline__ float q8_f1(uint32_t v) {
    uint32_t t = J <= 1 ? v << (15 - 8 * J) : v >> (8 * J - 15);
    return __uint_as_float((t & 0x007F8000u) | 0x3F800000u);
}


/* Block-wide sum; every thread gets the result. sh needs 32 floats. */
__device__ float block_sum(float v, float *sh) {
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = (blockDim.x + WARP - 1) / WARP;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float r = 0;
    for (int i = 0; i < nw; i++) r += sh[i];
    return r;
}

/* Elements c..c+7 of row r of expert e (c % 8 == 0); columns past the end read as 0. */
__device__ __forceinline__ void load8(const dmat &m, int e, int r, int c, float out[8]) {
    if (m.type == LW_Q) {
        const char *wb = (const char *)m.w + (long long)e * m.ew;
        int ng = m.cols / m.group;
        size_t gi = (size_t)r * ng + c / m.group;
        float sc = ld_sb((const char *)m.s + (long long)e * m.es, m.sbt, gi);
        float bi = ld_sb((const char *)m.b + (long long)e * m.es, m.sbt, gi);
        size_t el = (size_t)r * m.cols + c;
        if (m.bits == 4) {
            uint32_t q = ((const uint32_t *)wb)[el / 8];
#pragma unroll
            for (int j = 0; j < 8; j++) out[j] = sc * (float)((q >> (4 * j)) & 15u) + bi;
        } else {
            uint2 q = *(const uint2 *)((const uint32_t *)wb + el / 4);
#pragma unroll
            for (int j = 0; j < 4; j++) out[j] = sc * (float)((q.x >> (8 * j)) & 255u) + bi;
#pragma unroll
            for (int j = 0; j < 4; j++) out[4 + j] = sc * (float)((q.y >> (8 * j)) & 255u) + bi;
        }
        return;
    }
    size_t el = (size_t)r * m.cols + c;
    int full = c + 8 <= m.cols && (m.cols % 8) == 0;
    if (m.type == LW_BF16 || m.type == LW_F16) {
        const uint16_t *p = (const uint16_t *)((const char *)m.w + (long long)e * m.ew) + el;
        if (full) {
            uint4 v = *(const uint4 *)p;
            uint32_t wv[4] = { v.x, v.y, v.z, v.w };
#pragma unroll
            for (int j = 0; j < 4; j++) {
                uint16_t lo = (uint16_t)(wv[j] & 0xffffu), hi = (uint16_t)(wv[j] >> 16);
                out[2 * j] = m.type == LW_BF16 ? bf2f(lo) : h2f(lo);
                out[2 * j + 1] = m.type == LW_BF16 ? bf2f(hi) : h2f(hi);
            }
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) out[j] = c + j < m.cols ? (m.type == LW_BF16 ? bf2f(p[j]) : h2f(p[j])) : 0.f;
        }
    } else {
        const float *p = (const float *)((const char *)m.w + (long long)e * m.ew) + el;
        if (full) {
            float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
            out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
            out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) out[j] = c + j < m.cols ? p[j] : 0.f;
        }
    }
}

lily_code cu_fail(lily_status *st, cudaError_t e, const char *what, const char *file, int line) {
    return lily_err(st, LILY_EDEVICE, "CUDA error %s (%s) in %s at %s:%d", cudaGetErrorName(e), cudaGetErrorString(e), what, file, line);
}

/* ---- matrix-vector: one warp per weight row, all T (<= NT) inputs at once ---- */
template <int NT>
__global__ void __launch_bounds__(256) k_mv(dmat m, const float *__restrict__ X, int ldx, int T, float *__restrict__ Y,
                                            int ldy, const int *eidx, int xdiv) {
    CU_PDL();
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int r = blockIdx.x * 8 + warp;
    if (r >= m.rows) return;
    int slot = blockIdx.y, e = 0;
    const float *x = X;
    float *y = Y;
    if (eidx) { /* slot mode: one input row per slot */
        e = eidx[slot];
        x = X + (size_t)(slot / xdiv) * ldx;
        y = Y + (size_t)slot * ldy;
        T = 1;
    }
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    int vec = (ldx % 4) == 0;
    for (int c = lane * 8; c < m.cols; c += WARP * 8) {
        float w8[8];
        load8(m, e, r, c, w8);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= T) break;
            const float *xp = x + (size_t)t * ldx + c;
            if (vec && c + 8 <= m.cols) {
                float4 a = *(const float4 *)xp, b = *(const float4 *)(xp + 4);
                acc[t] += w8[0] * a.x + w8[1] * a.y + w8[2] * a.z + w8[3] * a.w + w8[4] * b.x + w8[5] * b.y + w8[6] * b.z + w8[7] * b.w;
            } else {
                for (int j = 0; j < 8 && c + j < m.cols; j++) acc[t] += w8[j] * xp[j];
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= T) break;
        float v = warp_sum(acc[t]);
        if (lane == 0) y[(size_t)t * ldy + r] = v;
    }
}

/* ---- tiled: 64 inputs x 64 weight rows per block, 32 columns per step, on the tensor
 * cores in TF32 (fp32 accumulate): weights are dequantized into shared memory as fp32,
 * rounded to TF32 in the fragments. Eight warps, each 16 inputs x 32 rows. ---- */
#define TBM 64
#define TBN 64
#define TBK 32
#define TLD (TBK + 4)
__global__ void __launch_bounds__(256) k_mm_tiled(dmat m, const float *__restrict__ X, int ldx, int T,
                                                  float *__restrict__ Y, int ldy, dsort so, int xdiv) {
    CU_PDL();
    __shared__ __align__(32) float Ws[TBM * TLD];
    __shared__ __align__(32) float Xs[TBN * TLD];
    __shared__ __align__(32) float Cs[TBN * (TBM + 4)];
    int tid = threadIdx.x, warp = tid / WARP;
    int e = 0, n = T, base = 0;
    if (so.count) {
        e = blockIdx.z;
        n = so.count[e];
        base = so.off[e];
    }
    int r0 = blockIdx.x * TBM, t0 = blockIdx.y * TBN;
    if (t0 >= n) return;
    int lr = tid / 4, seg = (tid % 4) * 8, lt = tid / 4;
    const float *xrow = NULL;
    if (t0 + lt < n) {
        int srow = base + t0 + lt;
        int xr = so.count ? (xdiv ? so.src[srow] / xdiv : srow) : srow;
        xrow = X + (size_t)xr * ldx;
    }
    int wt = (warp / 2) * 16, wr = (warp % 2) * 32; /* this warp's inputs and rows within the tile */
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc[2];
    wmma::fill_fragment(acc[0], 0.0f);
    wmma::fill_fragment(acc[1], 0.0f);
    /* the next step's weights and inputs are loaded into registers while this step multiplies */
    float w8[8], x8[8];
    if (r0 + lr < m.rows && seg < m.cols) load8(m, e, r0 + lr, seg, w8);
    else for (int j = 0; j < 8; j++) w8[j] = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) x8[j] = (xrow && seg + j < m.cols) ? xrow[seg + j] : 0.f;
    for (int k0 = 0; k0 < m.cols; k0 += TBK) {
#pragma unroll
        for (int j = 0; j < 8; j++) Ws[lr * TLD + seg + j] = w8[j];
#pragma unroll
        for (int j = 0; j < 8; j++) Xs[lt * TLD + seg + j] = x8[j];
        __syncthreads();
        int k1 = k0 + TBK;
        if (k1 < m.cols) {
            if (r0 + lr < m.rows && k1 + seg < m.cols) load8(m, e, r0 + lr, k1 + seg, w8);
            else for (int j = 0; j < 8; j++) w8[j] = 0.f;
#pragma unroll
            for (int j = 0; j < 8; j++) x8[j] = (xrow && k1 + seg + j < m.cols) ? xrow[k1 + seg + j] : 0.f;
        }
#pragma unroll
        for (int kk = 0; kk < TBK; kk += 8) {
            wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
            wmma::load_matrix_sync(fa, Xs + wt * TLD + kk, TLD);
#pragma unroll
            for (int i = 0; i < fa.num_elements; i++) fa.x[i] = wmma::__float_to_tf32(fa.x[i]);
#pragma unroll
            for (int f = 0; f < 2; f++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> fb;
                wmma::load_matrix_sync(fb, Ws + (wr + 16 * f) * TLD + kk, TLD);
#pragma unroll
                for (int i = 0; i < fb.num_elements; i++) fb.x[i] = wmma::__float_to_tf32(fb.x[i]);
                wmma::mma_sync(acc[f], fa, fb, acc[f]);
            }
        }
        __syncthreads();
    }
    wmma::store_matrix_sync(Cs + wt * (TBM + 4) + wr, acc[0], TBM + 4, wmma::mem_row_major);
    wmma::store_matrix_sync(Cs + wt * (TBM + 4) + wr + 16, acc[1], TBM + 4, wmma::mem_row_major);
    __syncthreads();
    for (int i = tid; i < TBN * TBM; i += blockDim.x) {
        int t = i / TBM, r = i % TBM;
        if (t0 + t < n && r0 + r < m.rows) Y[(size_t)(base + t0 + t) * ldy + r0 + r] = Cs[t * (TBM + 4) + r];
    }
}

/* The same tile in plain fp32 FMA: exact to fp32, for small batches (the fixtures) and the
 * router. Split-K (kslice < cols, dense only): block z sums columns [z kslice, (z+1) kslice)
 * into its own partial, Y + z pstride, which k_sum_splits adds up in split order. */
__global__ void __launch_bounds__(256) k_mm_simt(dmat m, const float *__restrict__ X, int ldx, int T,
                                                  float *__restrict__ Y, int ldy, dsort so, int xdiv, int kslice,
                                                  size_t pstride) {
    CU_PDL();
    __shared__ float Ws[TBK][TBM + 4];
    __shared__ float Xs[TBK][TBN + 4];
    int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    int e = 0, n = T, base = 0;
    if (so.count) {
        e = blockIdx.z;
        n = so.count[e];
        base = so.off[e];
    }
    int r0 = blockIdx.x * TBM, t0 = blockIdx.y * TBN;
    if (t0 >= n) return;
    int kbeg = 0, kend = m.cols;
    if (!so.count && kslice < m.cols) {
        kbeg = blockIdx.z * kslice;
        kend = min(kbeg + kslice, m.cols);
        Y += (size_t)blockIdx.z * pstride;
    }
    /* this thread's loads: weight row lr, input row lt, columns seg..seg+7 */
    int lr = tid / 4, seg = (tid % 4) * 8;
    int lt = tid / 4;
    const float *xrow = NULL;
    if (t0 + lt < n) {
        int srow = base + t0 + lt;
        int xr = so.count ? (xdiv ? so.src[srow] / xdiv : srow) : srow;
        xrow = X + (size_t)xr * ldx;
    }
    float acc[4][4] = {};
    for (int k0 = kbeg; k0 < kend; k0 += TBK) {
        float w8[8];
        if (r0 + lr < m.rows && k0 + seg < kend) load8(m, e, r0 + lr, k0 + seg, w8);
        else for (int j = 0; j < 8; j++) w8[j] = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) Ws[seg + j][lr] = w8[j];
#pragma unroll
        for (int j = 0; j < 8; j++) Xs[seg + j][lt] = (xrow && k0 + seg + j < kend) ? xrow[k0 + seg + j] : 0.f;
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < TBK; k++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = Ws[k][tx + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; j++) b[j] = Xs[k][ty + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int t = t0 + ty + 16 * j;
        if (t >= n) continue;
        float *yr = Y + (size_t)(base + t) * ldy;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = r0 + tx + 16 * i;
            if (r < m.rows) yr[r] = acc[i][j];
        }
    }
}

/* ---- quantized matrix-vector for one input row (decode), for up to MVQ_MAX matrices that
 * read the same input in one launch: LPR lanes per weight row, each lane reading 16 bytes
 * of codes at a time; the input row is staged in shared memory (swizzled so the lanes'
 * float4 reads hit distinct banks), optionally as silu(X) * X2 (SwiGLU fused into the
 * down projection). Needs 4- or 8-bit codes, cols % 32 == 0, group % 32 == 0. ---- */
__device__ void route_warp(const float *lg, int E, int K, float *p, int *sel, float *wt);

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
 * block (0, 0) also writes to tout), swizzled and scaled into xs, and each chunk's sum into sxs. */
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
                                          float *sxs, const mvq_pre &pre) {
    if (a.f.nw) { /* the norm, fused (mvq_fuse): after the residual add, or after a folded combine */
        __shared__ float red[32];
        float ss = 0;
        for (int i = threadIdx.x; i < nch * 8; i += blockDim.x) {
            int c = i / 8, j = i % 8;
            const float *p = x + c * 32 + j * 4, *ad = a.f.add + c * 32 + j * 4;
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
            if (blockIdx.x == 0 && blockIdx.y == 0) {
                float *o = a.f.tout + c * 32 + j * 4;
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
template <int LPR, int RW>
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
    const bool xsl = a.f.xslot && (int)blockIdx.y == a.f.xslot;
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
    const mvq_pre xp = mvq_preload(a, X, !eidx, nch);
    CU_PDL();
    const float *x = X, *x2 = X2;
    if (eidx) e = mvq_slot_input(a, X, X2, ldx, eidx, xdiv, xsl, slot, x, x2);
    mvq_stage(a, x, x2, X2 != NULL, nch, xs, sxs, xp);
    for (bool first = true; tile < ntiles; tile += gridDim.x, first = false) {
        while (mi + 1 < a.n && tile >= a.blk0[mi + 1]) mi++;
        const dmat &m = xsl ? a.f.xm[mi] : a.m[mi];
        float *y = a.y[mi] + (eidx ? (size_t)slot * a.ldy[mi] : 0);
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
    const bool xsl = a.f.xslot && slot == a.f.xslot;
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
    mvq_stage(a, x, x2, X2 != NULL, nch, xs, sxs, xp);
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

template <int LPR, int RW>
static void mvq_launch(int tiles, int nslots, int one_a_tile, int bt, size_t sm, cudaStream_t s, const mvq_args &a,
                       const float *X, const float *X2, int ldx, const int *eidx, int xdiv) {
    static mvq_kstate ks;
    int gx = mvq_grid(k_mvq<LPR, RW>, ks, tiles, nslots, one_a_tile, bt, sm);
    cu_go(k_mvq<LPR, RW>, dim3(gx, nslots), bt, sm, s)(a, X, X2, ldx, eidx, xdiv);
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
    a.n = n;
    if (fu) a.f = *fu;
    int cols = W[0]->cols, nch = cols / 32, lpr = nch >= 32 ? 32 : nch >= 16 ? 16 : 8, nb = 0;
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
    int rpb = warps * (32 / lpr) * rw;
    for (int i = 0; i < n; i++) {
        a.m[i] = *W[i];
        a.y[i] = Y[i];
        a.ldy[i] = ldy ? ldy[i] : 0;
        a.blk0[i] = nb;
        nb += (W[i]->rows + rpb - 1) / rpb;
    }
    a.blk0[n] = nb;
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
    if (a.f.rlog) { /* no kernel below routes itself: the top-k first, as without rlog */
        cu_router_topk(s, a.f.rlog, 1, a.f.E, a.f.K, a.f.rsel, a.f.rwt);
        a.f.rlog = NULL;
    }
    if (rw == 1 && all4 && !one && cu_mvtc_group(s, &a, sbt, X, X2, ldx, eidx, xdiv, nslots)) return;
    if (rw == 1 && all4 && !one && mvq4_enabled()) {
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

int cu_env_flag(int *cache, const char *name, int def) {
    if (*cache < 0) {
        const char *v = getenv(name);
        *cache = v && *v ? *v != '0' : def;
    }
    return *cache;
}

int cu_pdl_on(void) {
#ifdef __CUDACC_EMU__ /* (the emulator runs launches in order: nothing to overlap) */
    return 0;
#else
    static int on = -1, env = -1;
    if (on < 0) {
        int dev = 0, major = 0;
        on = cu_env_flag(&env, "LILY_CU_PDL", 1) && cudaGetDevice(&dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
        cudaGetLastError();
    }
    return on;
#endif
}

int cu_pdl_stream(void) {
#ifdef __CUDACC_EMU__ /* (cu_go's emulated form never asks) */
    return 0;
#else
    static int env = -1;
    return cu_env_flag(&env, "LILY_CU_PDL_STREAM", 0) && cu_pdl_on();
#endif
}

int cu_env_int(int *cache, const char *name, int def) {
    if (*cache == INT_MIN) {
        const char *v = getenv(name);
        *cache = v && *v ? atoi(v) : def;
    }
    return *cache;
}

int cu_fuse_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_FUSE", 1);
}

int cu_mvqb_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_MVQB", 1);
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
        if (W[i]->bits != W[0]->bits) {
            for (int k = 0; k < n; k++) cu_matvec_rows(s, 1, &W[k], X, X2, ldx, T, &Y[k], &ldy[k]);
            return;
        }
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
        a.n = n;
        int nb = 0;
        for (int i = 0; i < n; i++) {
            a.m[i] = *W[i];
            a.y[i] = y[i];
            a.ldy[i] = ldy[i];
            a.blk0[i] = nb;
            nb += (W[i]->rows + rpb - 1) / rpb;
        }
        a.blk0[n] = nb;
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

static int mv4_ok(const dmat *W) { return cu_mvq_ok(W); }
static void mv4_launch(cudaStream_t s, const dmat *W, const float *X, int ldx, float *Y, int ldy, const int *eidx, int xdiv, int nslots) {
    const dmat *w[1] = { W };
    float *y[1] = { Y };
    int l[1] = { ldy };
    cu_matvec_group(s, 1, w, X, NULL, ldx, y, l, eidx, xdiv, nslots, NULL);
}

static void mv_launch(cudaStream_t s, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy) {
    if (T == 1 && mv4_ok(W)) { mv4_launch(s, W, X, ldx, Y, ldy, NULL, 1, 1); return; }
    if (T >= 2 && mv4_ok(W) && cu_mvqb_enabled()) { cu_matvec_rows(s, 1, &W, X, NULL, ldx, T, &Y, &ldy); return; }
    dim3 g((W->rows + 7) / 8, 1);
    if (T <= 1) cu_go(k_mv<1>, g, 256, 0, s)(*W, X, ldx, T, Y, ldy, NULL, 1);
    else if (T <= 2) cu_go(k_mv<2>, g, 256, 0, s)(*W, X, ldx, T, Y, ldy, NULL, 1);
    else if (T <= 4) cu_go(k_mv<4>, g, 256, 0, s)(*W, X, ldx, T, Y, ldy, NULL, 1);
    else cu_go(k_mv<8>, g, 256, 0, s)(*W, X, ldx, T, Y, ldy, NULL, 1);
}

/* A matrix of a few rows (the shared expert's gate: one) for many tokens, in fp32: a warp a
 * token, the lanes over 8-column pieces. (The 64 x 64 tiles computed 63 rows of padding.) */
__global__ void k_mm_rows(dmat m, const float *__restrict__ X, int ldx, int T, float *__restrict__ Y, int ldy) {
    CU_PDL();
    int t = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (t >= T) return;
    const float *x = X + (size_t)t * ldx;
    for (int r = 0; r < m.rows; r++) {
        float acc = 0;
        for (int c = lane * 8; c < m.cols; c += WARP * 8) {
            float w[8];
            load8(m, 0, r, c, w);
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (c + j < m.cols) acc += w[j] * x[c + j];
        }
        acc = warp_sum(acc);
        if (lane == 0) Y[(size_t)t * ldy + r] = acc;
    }
}

void cu_matmul_variant(cudaStream_t s, int variant, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy) {
    if (variant == 7) {
        cu_go(k_mm_rows, (T + 7) / 8, 256, 0, s)(*W, X, ldx, T, Y, ldy);
        return;
    }
    if (variant == 0) {
        for (int t = 0; t < T; t += 8) mv_launch(s, W, X + (size_t)t * ldx, ldx, T - t < 8 ? T - t : 8, Y + (size_t)t * ldy, ldy);
        return;
    }
    dsort none = { NULL, NULL, NULL, NULL, NULL };
    dim3 g((W->rows + TBM - 1) / TBM, (T + TBN - 1) / TBN, 1);
    if (variant == 1) cu_go(k_mm_simt, g, 256, 0, s)(*W, X, ldx, T, Y, ldy, none, 0, W->cols, 0);
    else cu_go(k_mm_tiled, g, 256, 0, s)(*W, X, ldx, T, Y, ldy, none, 0);
}

/* Y[t][r] = sum over splits, in split order (deterministic, unlike atomics). */
__global__ void k_sum_splits(const float *P, int S, size_t pstride, int T, int rows, float *Y, int ldy) {
    CU_PDL();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * rows) return;
    size_t o = (i / rows) * ldy + i % rows;
    float v = P[o];
    for (int z = 1; z < S; z++) v += P[(size_t)z * pstride + o];
    Y[o] = v;
}

/* The exact fp32 tile for the router at prefill, 8x8 outputs a thread: k_mm_simt's 4x4 read two
 * scalars from shared memory for every two FMAs, and half its instructions were not FMAs; here a
 * k step is four 16-byte shared loads (rows 4tx..4tx+3 and 32+4tx.., tokens 4ty.. and 32+4ty..,
 * conflict-free: a warp reads 8 and 4 distinct float4) for 64 FMAs, and the next step's weights
 * and inputs load into registers meanwhile (without, its two warps a block waited on them: 40 us
 * against k_mm_simt's 34 under Nsight, RESULTS.md). 64 threads a 64x64 tile; X 16-byte aligned;
 * split-K as k_mm_simt (block z sums columns [z kslice, (z+1) kslice) into Y + z pstride), each
 * output a running fp32 sum over its slice in column order. */
#define S8_K 32
/* a thread's share of a k step, columns c .. c + 31 (zeros past kend or where not ok): a weight row,
 * or an input row */
__device__ __forceinline__ void s8_load_w(const dmat &m, int row, bool wok, int c, int kend, float (&w)[S8_K]) {
#pragma unroll
    for (int sg = 0; sg < S8_K / 8; sg++) {
        const int cc = c + 8 * sg;
        float w8[8];
        if (wok && cc < kend) load8(m, 0, row, cc, w8);
        else for (int j = 0; j < 8; j++) w8[j] = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) w[8 * sg + j] = cc + j < kend ? w8[j] : 0.f;
    }
}
__device__ __forceinline__ void s8_load_x(const float *xrow, bool xok, int c, int kend, float (&x)[S8_K]) {
#pragma unroll
    for (int j = 0; j < S8_K / 4; j++) {
        const int cc = c + 4 * j;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (xok && cc + 4 <= kend) v = *(const float4 *)(xrow + cc);
        else if (xok && cc < kend) v.x = xrow[cc], v.y = cc + 1 < kend ? xrow[cc + 1] : 0.f, v.z = cc + 2 < kend ? xrow[cc + 2] : 0.f;
        x[4 * j] = v.x; x[4 * j + 1] = v.y; x[4 * j + 2] = v.z; x[4 * j + 3] = v.w;
    }
}

__global__ void __launch_bounds__(64) k_mm_simt8(dmat m, const float *__restrict__ X, int ldx, int T, float *__restrict__ Y,
                                                 int ldy, int kslice, size_t pstride) {
    CU_PDL();
    __shared__ __align__(16) float Ws[S8_K][68]; /* [k][row of the tile] */
    __shared__ __align__(16) float Xs[S8_K][68]; /* [k][token of the tile] */
    const int tid = threadIdx.x, tx = tid & 7, ty = tid >> 3;
    const int r0 = blockIdx.x * 64, t0 = blockIdx.y * 64;
    const int kbeg = blockIdx.z * kslice, kend = min(kbeg + kslice, m.cols);
    Y += (size_t)blockIdx.z * pstride;
    const bool wok = r0 + tid < m.rows, xok = t0 + tid < T;
    const float *xrow = X + (size_t)(xok ? t0 + tid : 0) * ldx;
    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] = 0.f;
    /* the next step's share is loaded into registers while this step multiplies */
    float wn[S8_K], xn[S8_K];
    s8_load_w(m, r0 + tid, wok, kbeg, kend, wn);
    s8_load_x(xrow, xok, kbeg, kend, xn);
    for (int k0 = kbeg; k0 < kend; k0 += S8_K) {
#pragma unroll
        for (int j = 0; j < S8_K; j++) { Ws[j][tid] = wn[j]; Xs[j][tid] = xn[j]; }
        __syncthreads();
        if (k0 + S8_K < kend) {
            s8_load_w(m, r0 + tid, wok, k0 + S8_K, kend, wn);
            s8_load_x(xrow, xok, k0 + S8_K, kend, xn);
        }
#pragma unroll 4
        for (int k = 0; k < S8_K; k++) {
            const float4 a0 = *(const float4 *)&Ws[k][4 * tx], a1 = *(const float4 *)&Ws[k][32 + 4 * tx];
            const float4 b0 = *(const float4 *)&Xs[k][4 * ty], b1 = *(const float4 *)&Xs[k][32 + 4 * ty];
            const float a[8] = { a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w };
            const float b[8] = { b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w };
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int t = t0 + (j < 4 ? 4 * ty + j : 32 + 4 * ty + j - 4);
        if (t >= T) continue;
        float *yr = Y + (size_t)t * ldy;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int r = r0 + (i < 4 ? 4 * tx + i : 32 + 4 * tx + i - 4);
            if (r < m.rows) yr[r] = acc[i][j];
        }
    }
}

/* k_mm_simt8's 64 x 64 tiles with the products on the tensor cores, each operand split in two TF32
 * parts (three mma: ~22 bits, cu_tf32_split), so the router's choice does not turn on the tensor
 * cores' 10-bit mantissas. Four warps: warp w owns rows 32 (w % 2) .. + 31 and tokens 32 (w / 2)
 * .. + 31 of the tile; threads 0-63 load the weight rows, 64-127 the input rows (k_mm_simt8's 64
 * threads load both), the next step into registers while this one multiplies. A row pitch of 72 floats (8 mod 32) puts a fragment's loads (rows q, columns
 * g) in 32 banks. */
__global__ void __launch_bounds__(128) k_mm_tc3(dmat m, const float *__restrict__ X, int ldx, int T, float *__restrict__ Y,
                                                int ldy, int kslice, size_t pstride) {
    CU_PDL();
    __shared__ __align__(16) float Ws[S8_K][72]; /* [k][row of the tile] */
    __shared__ __align__(16) float Xs[S8_K][72]; /* [k][token of the tile] */
    const int tid = threadIdx.x, w = tid >> 5, g8 = (tid & 31) >> 2, q = tid & 3, lr = tid & 63;
    const int r0 = blockIdx.x * 64, t0 = blockIdx.y * 64, wr = 32 * (w & 1), wt = 32 * (w >> 1);
    const int kbeg = blockIdx.z * kslice, kend = min(kbeg + kslice, m.cols);
    Y += (size_t)blockIdx.z * pstride;
    const bool isw = tid < 64, wok = isw && r0 + lr < m.rows, xok = !isw && t0 + lr < T;
    const float *xrow = X + (size_t)(xok ? t0 + lr : 0) * ldx;
    float acc[2][4][4] = {}; /* rows wr + 16i + g8 (+ 8), tokens wt + 8j + 2q (+ 1) */
    float rn[S8_K];             /* the next step's weight row (threads 0-63) or input row (64-127) */
    auto load = [&](int c) {
        if (isw) s8_load_w(m, r0 + lr, wok, c, kend, rn);
        else s8_load_x(xrow, xok, c, kend, rn);
    };
    load(kbeg);
    for (int k0 = kbeg; k0 < kend; k0 += S8_K) {
        float (*dst)[72] = isw ? Ws : Xs;
#pragma unroll
        for (int j = 0; j < S8_K; j++) dst[j][lr] = rn[j];
        __syncthreads();
        if (k0 + S8_K < kend) load(k0 + S8_K);
#pragma unroll
        for (int k = 0; k < S8_K; k += 8) {
            uint32_t bh[4][2], bl[4][2];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                cu_tf32_split(Xs[k + q][wt + 8 * j + g8], bh[j][0], bl[j][0]);
                cu_tf32_split(Xs[k + q + 4][wt + 8 * j + g8], bh[j][1], bl[j][1]);
            }
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int r = wr + 16 * i + g8;
                uint32_t ah[4], al[4];
                cu_tf32_split(Ws[k + q][r], ah[0], al[0]);
                cu_tf32_split(Ws[k + q][r + 8], ah[1], al[1]);
                cu_tf32_split(Ws[k + q + 4][r], ah[2], al[2]);
                cu_tf32_split(Ws[k + q + 4][r + 8], ah[3], al[3]);
                tc_mma_3xtf32<4>(acc[i], acc[i], ah, al, bh, bl);
            }
        }
        __syncthreads();
    }
    tc_store_32x32(acc, Y, ldy, r0 + wr, t0 + wt, m.rows, T);
}

static int exact_tc_force = -1; /* cu_matmul_exact_tc: -1 the environment's choice */
void cu_matmul_exact_tc(int on) { exact_tc_force = on; }

/* The router at prefill is 256 rows: 64x64 fp32 tiles give 32 blocks at 512 tokens on 132
 * SMs (~6 ms of pp512 over 40 layers, bench/RESULTS.md). Splitting the columns into slices
 * (up to 16, ~512 blocks of k_mm_simt8's two warps) fills the GPU; the slices' partials go to
 * `scr` and are added in a second launch. Still fp32 throughout (each output is a sum of slice
 * sums instead of one running sum: a different rounding, as the CPU's 8-lane order is).
 * LILY_CU_SIMT8=0: k_mm_simt's 4x4 tiles, up to 8 slices, for measuring. */
/* The products of cu_matmul_exact: the number of column slices left in scr ([S][T][ldy], S >= 2) for
 * the caller to add in slice order, or 1 when Y is written. */
static int exact_parts(cudaStream_t s, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy, float *scr,
                       size_t scr_floats) {
    if (T <= 8 || W->rows <= 8) { cu_matmul_variant(s, T <= 8 ? 0 : 7, W, X, ldx, T, Y, ldy); return 1; }
    static int s8 = -1, smx = INT_MIN;
    const int wide = cu_env_flag(&s8, "LILY_CU_SIMT8", 1) && ldx % 4 == 0 && !((uintptr_t)X & 15), want = wide ? 512 : 256;
    int smax = wide ? cu_env_int(&smx, "LILY_CU_EXACT_SPLITS", 16) : 8; /* (for measuring: 2..16) */
    smax = smax < 2 ? 2 : smax > 16 ? 16 : smax;
    int gx = (W->rows + TBM - 1) / TBM, gy = (T + TBN - 1) / TBN, tiles = gx * gy;
    int S = tiles >= want / 2 || !cu_splitk_enabled() ? 1 : want / tiles;
    size_t pstride = (size_t)T * ldy;
    if (S > smax) S = smax;
    if (S > W->cols / TBK) S = W->cols / TBK;
    while (S > 1 && (size_t)S * pstride > scr_floats) S--;
    if (S <= 1) { cu_matmul_variant(s, 1, W, X, ldx, T, Y, ldy); return 1; }
    int kslice = ((W->cols + S - 1) / S + TBK - 1) / TBK * TBK;
    S = (W->cols + kslice - 1) / kslice;
    dsort none = { NULL, NULL, NULL, NULL, NULL };
    static int tc3 = -1; /* LILY_CU_ROUTER_TC=0: the fp32 SIMT tiles */
    if (wide && (exact_tc_force >= 0 ? exact_tc_force : cu_env_flag(&tc3, "LILY_CU_ROUTER_TC", 1)))
        cu_go(k_mm_tc3, dim3(gx, gy, S), 128, 0, s)(*W, X, ldx, T, scr, ldy, kslice, pstride);
    else if (wide) cu_go(k_mm_simt8, dim3(gx, gy, S), 64, 0, s)(*W, X, ldx, T, scr, ldy, kslice, pstride);
    else cu_go(k_mm_simt, dim3(gx, gy, S), 256, 0, s)(*W, X, ldx, T, scr, ldy, none, 0, kslice, pstride);
    return S;
}

void cu_matmul_exact(cudaStream_t s, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy, float *scr,
                     size_t scr_floats) {
    const int S = exact_parts(s, W, X, ldx, T, Y, ldy, scr, scr_floats);
    if (S > 1) {
        size_t n = (size_t)T * W->rows;
        cu_go(k_sum_splits, (unsigned)((n + 255) / 256), 256, 0, s)(scr, S, T * (size_t)ldy, T, W->rows, Y, ldy);
    }
}

/* On by default; LILY_CU_SPLITK=0 runs the router's tiles unsplit, for measuring. */
int cu_splitk_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_SPLITK", 1);
}

void cu_matmul(cudaStream_t s, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy) {
    /* past the matrix-vector's 8 rows the tensor-core GEMM: at 16 rows it already reads each
     * weight once where the TF32/SIMT tiles re-read it per 64-token tile with 4-byte loads */
    if (T > 8 && cu_gemm_q4_enabled() && cu_gemm_q4_ok(W, X, ldx)) cu_gemm_q4(s, W, X, ldx, T, Y, ldy);
    else cu_matmul_variant(s, T <= 8 ? 0 : T < CU_TC_MIN_T ? 1 : 2, W, X, ldx, T, Y, ldy);
}

void cu_matmul_slots(cudaStream_t s, const dmat *W, const int *eidx, const float *X, int xdiv,
                     int ldx, int nslots, float *Y, int ldy) {
    if (mv4_ok(W)) { mv4_launch(s, W, X, ldx, Y, ldy, eidx, xdiv, nslots); return; }
    dim3 g((W->rows + 7) / 8, nslots);
    cu_go(k_mv<1>, g, 256, 0, s)(*W, X, ldx, 1, Y, ldy, eidx, xdiv);
}

void cu_matmul_grouped(cudaStream_t s, const dmat *W, int E, const dsort *so, int xdiv, const float *X,
                       int ldx, int maxcount, float *Y, int ldy) {
    dim3 g((W->rows + TBM - 1) / TBM, (maxcount + TBN - 1) / TBN, E);
    if (maxcount < CU_TC_MIN_T) cu_go(k_mm_simt, g, 256, 0, s)(*W, X, ldx, maxcount, Y, ldy, *so, xdiv, W->cols, 0);
    else cu_go(k_mm_tiled, g, 256, 0, s)(*W, X, ldx, maxcount, Y, ldy, *so, xdiv);
}

/* ---- embedding, norms ---- */
__global__ void k_embed(dmat m, const int *ids, float *x) {
    CU_PDL();
    int t = blockIdx.x, id = ids[t];
    for (int c = threadIdx.x * 8; c < m.cols; c += blockDim.x * 8) {
        float w8[8];
        load8(m, 0, id, c, w8);
        for (int j = 0; j < 8 && c + j < m.cols; j++) x[(size_t)t * m.cols + c + j] = w8[j];
    }
}
void cu_embed(cudaStream_t s, const dmat *E, const int *ids, int T, float *x) {
    cu_go(k_embed, T, 256, 0, s)(*E, ids, x);
}

/* A row's last pass where its output is also a GEMM's packed input: y[c] = x[c] r w[c], and the
 * same values packed (xp_chunk), a thread a chunk of 8 columns. The block's x is complete (the
 * caller's block_sum synced it). n % 128 == 0 and the rows 16-byte aligned (xp_out_ok). */
__device__ __forceinline__ void xp_rows_out(const float *xr, const float *w, float r, int n, float *yr, uint4 *pr) {
    for (int cc = threadIdx.x; cc < n / 8; cc += blockDim.x) {
        const int c = xp_chunk_col(cc);
        const float4 x0 = *(const float4 *)(xr + c), x1 = *(const float4 *)(xr + c + 4);
        const float4 w0 = *(const float4 *)(w + c), w1 = *(const float4 *)(w + c + 4);
        const float4 a = make_float4(x0.x * r * w0.x, x0.y * r * w0.y, x0.z * r * w0.z, x0.w * r * w0.w);
        const float4 b = make_float4(x1.x * r * w1.x, x1.y * r * w1.y, x1.z * r * w1.z, x1.w * r * w1.w);
        *(float4 *)(yr + c) = a;
        *(float4 *)(yr + c + 4) = b;
        pr[cc] = xp_chunk(a, b);
    }
}
/* whether a launch can write its [T][n] output packed too (xp_rows_out's conditions) */
static int xp_out_ok(const uint16_t *yp, int n, int T, const float *y, const float *x, const float *w) {
    return n % 128 == 0 && T > 8 && (long long)T * n < (1ll << 31) && !((uintptr_t)yp & 15) && !((uintptr_t)y & 15) &&
           !((uintptr_t)x & 15) && !((uintptr_t)w & 15);
}

/* yp not NULL: y also in the packed fp16 GEMM input form (xp_chunk), [rows][n / 8] chunks */
__global__ void k_rmsnorm(float *x, const float *add, const float *add2, const float *w, int n, float eps, float *y, uint4 *yp) {
    CU_PDL();
    __shared__ float sh[32];
    float *xr = x + (size_t)blockIdx.x * n;
    const float *ar = add ? add + (size_t)blockIdx.x * n : NULL, *ar2 = add2 ? add2 + (size_t)blockIdx.x * n : NULL;
    float ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i];
        if (ar) { v += ar2 ? ar[i] + ar2[i] : ar[i]; xr[i] = v; } /* (the parts summed first: the product, then the residual) */
        ss += v * v;
    }
    ss = block_sum(ss, sh);
    float r = 1.0f / sqrtf(ss / n + eps);
    float *yr = y + (size_t)blockIdx.x * n;
    if (yp) xp_rows_out(xr, w, r, n, yr, yp + (size_t)blockIdx.x * (n / 8));
    else
        for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * r * w[i];
}
void cu_rmsnorm(cudaStream_t s, float *x, const float *add, const float *w, int n, int T, float eps, float *y) {
    cu_rmsnorm2p(s, x, add, NULL, w, n, T, eps, y, NULL);
}
void cu_rmsnorm2(cudaStream_t s, float *x, const float *add, const float *add2, const float *w, int n, int T, float eps, float *y) {
    cu_rmsnorm2p(s, x, add, add2, w, n, T, eps, y, NULL);
}
int cu_rmsnorm2p(cudaStream_t s, float *x, const float *add, const float *add2, const float *w, int n, int T, float eps, float *y,
                 uint16_t *yp) {
    if (yp && !xp_out_ok(yp, n, T, y, x, w)) yp = NULL;
    cu_go(k_rmsnorm, T, T <= 8 ? 1024 : 256, 0, s)(x, add, add ? add2 : NULL, w, n, eps, y, (uint4 *)yp);
    return yp != NULL;
}

/* ---- Gated DeltaNet ---- */
/* Causal depthwise conv + SiLU: input n < 0 is the carried state's entry n + K - 1. (A thread a
 * channel walking all T tokens in order waited on one load a token: 5 ms of a 512-token prefill;
 * k_conv takes 8.) The state is rewritten by the first token group's blocks, the only ones that
 * read it, after their reads (k_conv_state's launch had done it after). */
__device__ __forceinline__ float conv_in(const float *mixed, const float *state, int cd, int K, int ch, int n) {
    return n >= 0 ? mixed[(size_t)n * cd + ch] : state[(size_t)ch * (K - 1) + n + K - 1];
}
/* A thread a channel and CONV_TT consecutive tokens: the CONV_TT + K - 1 inputs it needs are
 * independent loads issued together, each read once (a thread a token read each input K times,
 * 41 us a layer at 512 tokens on the H200). K <= 8. */
#define CONV_TT 8
/* nnorm > 0: the first nnorm blocks in x are the q and k heads (128 channels each, a block's),
 * which are then l2-normalized per token here (the q heads, the first nnorm / 2, also times
 * 1/sqrt(128)), as k_l2norm_heads would in its own launch. G.g not NULL: one block more in x,
 * which writes the token group's gates (k_gbeta's, a launch fewer). */
/* a head's log decay g = -exp(A_log) softplus(a + dt_bias), x = a + dt_bias */
__device__ __forceinline__ float gdn_g(float x, float alog) { return -expf(alog) * (x > 20.0f ? x : log1pf(expf(x))); }
__device__ __forceinline__ void gbeta_one(const cu_gates &G, int i) {
    const int h = i % G.nv;
    G.beta[i] = sigm_f(G.bb[i]);
    G.g[i] = gdn_g(G.aa[i] + G.dt_bias[h], G.A_log[h]);
}
__global__ void k_conv(const float *mixed, float *state, const float *w, int cd, int K, int T, float *u, int nnorm, cu_gates G) {
    CU_PDL();
    int ch = blockIdx.x * blockDim.x + threadIdx.x, t0 = blockIdx.y * CONV_TT;
    const bool norm = (int)blockIdx.x < nnorm; /* (block-uniform, with cd % 128 == 0 then) */
    if (G.g && blockIdx.x == gridDim.x - 1) {
        const int n = (T - t0 < CONV_TT ? T - t0 : CONV_TT) * G.nv;
        for (int i = threadIdx.x; i < n; i += blockDim.x) gbeta_one(G, t0 * G.nv + i);
        return;
    }
    if (ch >= cd) return;
    float wr[8], x[CONV_TT + 7];
#pragma unroll
    for (int j = 0; j < 8; j++) wr[j] = j < K ? w[(size_t)ch * K + j] : 0.f;
#pragma unroll
    for (int i = 0; i < CONV_TT + 7; i++) {
        const int n = t0 - (K - 1) + i;
        x[i] = i < CONV_TT + K - 1 && n < T ? conv_in(mixed, state, cd, K, ch, n) : 0.f;
    }
    if (blockIdx.y == 0) { /* the last K - 1 inputs become the state (old entries too where T < K - 1) */
        float h[7];
#pragma unroll
        for (int j = 0; j < 7; j++) h[j] = j < K - 1 ? conv_in(mixed, state, cd, K, ch, T - (K - 1) + j) : 0.f;
#pragma unroll
        for (int j = 0; j < 7; j++)
            if (j < K - 1) state[(size_t)ch * (K - 1) + j] = h[j];
    }
    float y[CONV_TT];
#pragma unroll
    for (int tt = 0; tt < CONV_TT; tt++) {
        float s = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) if (j < K) s += wr[j] * x[tt + j];
        y[tt] = silu_fast(s); /* (the IEEE division's slow path was a third of this kernel's instructions) */
    }
    if (norm) {
        __shared__ float part[CONV_TT][4];
        const int lane = threadIdx.x % 32, wp = threadIdx.x / 32;
#pragma unroll
        for (int tt = 0; tt < CONV_TT; tt++) {
            const float v = warp_sum(y[tt] * y[tt]);
            if (lane == 0) part[tt][wp] = v;
        }
        __syncthreads();
        const float sc = (int)blockIdx.x < nnorm / 2 ? 1.0f / sqrtf(128.0f) : 1.0f;
#pragma unroll
        for (int tt = 0; tt < CONV_TT; tt++) y[tt] *= 1.0f / sqrtf(((part[tt][0] + part[tt][1]) + (part[tt][2] + part[tt][3])) + 1e-6f) * sc;
    }
#pragma unroll
    for (int tt = 0; tt < CONV_TT; tt++)
        if (t0 + tt < T) u[(size_t)(t0 + tt) * cd + ch] = y[tt];
}
int cu_conv(cudaStream_t s, const float *mixed, float *state, const float *w, int cd, int K, int T, float *u, int nk, int dk,
            const cu_gates *G) {
    LILY_ASSERT(K >= 1 && K <= 8);
    const int nnorm = dk == 128 && cd % 128 == 0 && 2 * nk * dk <= cd ? 2 * nk : 0;
    cu_gates none;
    memset(&none, 0, sizeof none);
    cu_go(k_conv, dim3((cd + 127) / 128 + (G ? 1 : 0), (T + CONV_TT - 1) / CONV_TT), 128, 0, s)(mixed, state, w, cd, K, T, u, nnorm,
                                                                                                G ? *G : none);
    return nnorm > 0;
}

__global__ void k_l2norm_heads(float *u, int cd, int nk, int dk) {
    CU_PDL();
    __shared__ float sh[32];
    int t = blockIdx.x, hh = blockIdx.y;
    float *v = u + (size_t)t * cd + (size_t)hh * dk;
    float ss = 0;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) ss += v[i] * v[i];
    ss = block_sum(ss, sh);
    float r = 1.0f / sqrtf(ss + 1e-6f) * (hh < nk ? 1.0f / sqrtf((float)dk) : 1.0f);
    for (int i = threadIdx.x; i < dk; i += blockDim.x) v[i] *= r;
}
__global__ void k_gbeta(const float *bb, const float *aa, const float *A_log, const float *dt_bias, int n, int nv,
                        float *g, float *beta) {
    CU_PDL();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const cu_gates G = { bb, aa, A_log, dt_bias, nv, g, beta };
    gbeta_one(G, i);
}
void cu_l2norm_heads(cudaStream_t s, float *u, int T, int cd, int nk, int dk) {
    cu_go(k_l2norm_heads, dim3(T, 2 * nk), 128, 0, s)(u, cd, nk, dk);
}

void cu_gdn_prep(cudaStream_t s, float *u, int T, int cd, int nk, int dk, const float *bb, const float *aa,
                 const float *A_log, const float *dt_bias, int nv, float *g, float *beta, int normed) {
    if (!normed) cu_l2norm_heads(s, u, T, cd, nk, dk);
    if (!bb) return; /* (the gates written by cu_conv) */
    int n = T * nv;
    cu_go(k_gbeta, (n + 255) / 256, 256, 0, s)(bb, aa, A_log, dt_bias, n, nv, g, beta);
}

/* Decode (T = 1) in one launch: blocks [0, 2nk) do conv + SiLU + L2 norm of one q/k head,
 * the next ones conv + SiLU of 128 value channels, the last one g and beta. */
__global__ void k_gdn_prep1(const float *mixed, float *state, const float *w, int K, int nk, int dk, int vd,
                            const float *bb, const float *aa, const float *A_log, const float *dt_bias, int nv,
                            float *u, float *g, float *beta, cu_rows R) {
    CU_PDL();
    __shared__ float sh[32];
    int b = blockIdx.x, kd = nk * dk, nvb = (vd + 127) / 128;
    if (R.pos) { /* decode batch: row blockIdx.y, its session's conv state */
        int row = blockIdx.y;
        size_t cdt = (size_t)2 * kd + vd;
        state = R.conv[row] + R.conv_off;
        mixed += row * cdt; u += row * cdt;
        bb += (size_t)row * nv; aa += (size_t)row * nv; g += (size_t)row * nv; beta += (size_t)row * nv;
    }
    if (b == 2 * nk + nvb) {
        for (int h = threadIdx.x; h < nv; h += blockDim.x) {
            beta[h] = sigm_f(bb[h]);
            g[h] = gdn_g(aa[h] + dt_bias[h], A_log[h]);
        }
        return;
    }
    int c0, n;
    if (b < 2 * nk) { c0 = b * dk; n = dk; }
    else { c0 = 2 * kd + (b - 2 * nk) * 128; n = min(128, 2 * kd + vd - c0); }
    float ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        int ch = c0 + i;
        float *cs = state + (size_t)ch * (K - 1);
        const float *wr = w + (size_t)ch * K;
        float in = mixed[ch], acc = 0;
        for (int j = 0; j < K - 1; j++) acc += wr[j] * cs[j];
        acc += wr[K - 1] * in;
        for (int j = 0; j + 1 < K - 1; j++) cs[j] = cs[j + 1];
        if (K > 1) cs[K - 2] = in;
        float v = silu_f(acc);
        u[ch] = v;
        ss += v * v;
    }
    if (b >= 2 * nk) return;
    ss = block_sum(ss, sh);
    float r = 1.0f / sqrtf(ss + 1e-6f) * (b < nk ? 1.0f / sqrtf((float)dk) : 1.0f);
    for (int i = threadIdx.x; i < n; i += blockDim.x) u[c0 + i] *= r;
}
void cu_gdn_prep1(cudaStream_t s, const float *mixed, float *state, const float *w, int K, int nk, int dk, int vd,
                  const float *bb, const float *aa, const float *A_log, const float *dt_bias, int nv,
                  float *u, float *g, float *beta) {
    int nb = 2 * nk + (vd + 127) / 128 + 1;
    cu_rows none;
    memset(&none, 0, sizeof none);
    cu_go(k_gdn_prep1, nb, 128, 0, s)(mixed, state, w, K, nk, dk, vd, bb, aa, A_log, dt_bias, nv, u, g, beta, none);
}
void cu_gdn_prep1_rows(cudaStream_t s, const cu_rows *R, int n, const float *mixed, const float *w, int K, int nk, int dk,
                       int vd, const float *bb, const float *aa, const float *A_log, const float *dt_bias, int nv,
                       float *u, float *g, float *beta) {
    dim3 nb(2 * nk + (vd + 127) / 128 + 1, n);
    cu_go(k_gdn_prep1, nb, 128, 0, s)(mixed, NULL, w, K, nk, dk, vd, bb, aa, A_log, dt_bias, nv, u, g, beta, *R);
}

/* One delta rule step of state column j, its 128 rows over the four threads p of a quad (32 in
 * each one's sr): decay, d = (v_j - S_j . k) beta, S_j += k d, and the column's output S_j . q,
 * which every thread of the quad returns. */
/* STR: the stride of the four threads' 32-row parts of q and k in shared memory (36 puts the four
 * parts' 16-byte loads in distinct banks; 32 is four-way conflicted) */
template <int STR = 32>
__device__ __forceinline__ float gdn_col_step(float (&sr)[32], const float *qs, const float *ks, int p, float decay, float vj,
                                              float beta) {
    float d = 0.f, out = 0.f;
#pragma unroll
    for (int i = 0; i < 32; i++) { sr[i] *= decay; d += sr[i] * ks[p * STR + i]; }
    d += __shfl_xor_sync(0xffffffffu, d, 1);
    d += __shfl_xor_sync(0xffffffffu, d, 2);
    d = (vj - d) * beta;
#pragma unroll
    for (int i = 0; i < 32; i++) { sr[i] += ks[p * STR + i] * d; out += sr[i] * qs[p * STR + i]; }
    out += __shfl_xor_sync(0xffffffffu, out, 1);
    out += __shfl_xor_sync(0xffffffffu, out, 2);
    return out;
}

/* One block per value head. Fast form (dk = 128): four threads per state column j, each
 * holding 32 rows of column j of S in registers; the generic form keeps S in global memory
 * with one thread per column. */
__global__ void __launch_bounds__(512) k_gdn_rec128(int T, int nk, int nv, int dv, const float *u, int cd, const float *g,
                                                     const float *beta, float *S, float *o, const float *z,
                                                     const float *gw, float eps, cu_rows R) {
    __shared__ float qkb[2][256], red[16]; /* q | k of a step, double-buffered */
    const int dk = 128;
    int h = blockIdx.x, j = threadIdx.x / 4, p = threadIdx.x % 4, kh = h / (nv / nk), kd = nk * dk;
    /* One session's S is loaded before the wait on the predecessor: only this kernel of its layer
     * writes it, and its last write was a launch at least two back (the previous token's graph,
     * or an earlier chunk's kernel, which finished before the predecessor passed its own wait:
     * CU_PDL waits before it lets a successor start). Its 64 KB a block then arrive while the
     * predecessor finishes. (A batch's S pointers are read after the wait, as before.) */
    float *Sh = S ? S + (size_t)h * dk * dv : NULL;
    float sr[32];
    if (!R.pos) {
#pragma unroll
        for (int i = 0; i < 32; i++) sr[i] = Sh[(size_t)(p * 32 + i) * dv + j];
    }
    const float gwj = z ? gw[j] : 0.f;
    CU_PDL();
    if (R.pos) { /* decode batch (T = 1): row blockIdx.y, its session's S */
        int row = blockIdx.y;
        S = R.S[row] + R.S_off;
        u += (size_t)row * cd; g += (size_t)row * nv; beta += (size_t)row * nv; o += (size_t)row * nv * dv;
        if (z) z += (size_t)row * nv * dv;
        Sh = S + (size_t)h * dk * dv;
#pragma unroll
        for (int i = 0; i < 32; i++) sr[i] = Sh[(size_t)(p * 32 + i) * dv + j];
    }
    /* thread i < 256 carries element i of the next step's q | k; every thread its v, g, beta */
    int qk_off = threadIdx.x < 128 ? kh * dk + threadIdx.x : kd + kh * dk + (threadIdx.x - 128);
    float nqk = threadIdx.x < 256 ? u[qk_off] : 0.f, nv_j = u[2 * kd + h * dv + j], ng = g[h], nb = beta[h];
    /* the gated norm's z (and, above, its weight) are fetched with the step's other inputs, not
     * after its sums (a dependent L2 round trip at the end of every decode step) */
    float nz = z ? z[(size_t)h * dv + j] : 0.f;
    for (int t = 0; t < T; t++) {
        float *qs = qkb[t & 1], *ks = qkb[t & 1] + 128;
        if (threadIdx.x < 256) qkb[t & 1][threadIdx.x] = nqk;
        float decay = expf(ng), b = nb, vj = nv_j, zj = nz;
        __syncthreads();
        if (t + 1 < T) { /* the next step's loads fly while this one computes */
            const float *nrow = u + (size_t)(t + 1) * cd;
            if (threadIdx.x < 256) nqk = nrow[qk_off];
            nv_j = nrow[2 * kd + h * dv + j];
            ng = g[(size_t)(t + 1) * nv + h];
            nb = beta[(size_t)(t + 1) * nv + h];
            if (z) nz = z[(size_t)(t + 1) * nv * dv + (size_t)h * dv + j];
        }
        const float out = gdn_col_step(sr, qs, ks, p, decay, vj, b);
        size_t oi = (size_t)t * nv * dv + (size_t)h * dv + j;
        if (z) { /* fused gated RMSNorm of the head's dv outputs (each column counted once) */
            float sq = p == 0 ? out * out : 0.f;
            sq = warp_sum(sq);
            if (threadIdx.x % WARP == 0) red[threadIdx.x / WARP] = sq;
            __syncthreads();
            float tot = 0;
            for (int i = 0; i < (int)(blockDim.x / WARP); i++) tot += red[i];
            float r = 1.0f / sqrtf(tot / dv + eps);
            if (p == 0) o[oi] = out * r * gwj * silu_f(zj);
        } else if (p == 0) o[oi] = out;
    }
#pragma unroll
    for (int i = 0; i < 32; i++) Sh[(size_t)(p * 32 + i) * dv + j] = sr[i];
}
__global__ void k_gdn_rec_gen(int T, int nk, int nv, int dk, int dv, const float *u, int cd, const float *g,
                              const float *beta, float *S, float *o, cu_rows R) {
    CU_PDL();
    extern __shared__ float qk[]; /* q[dk], k[dk] */
    if (R.pos) { /* decode batch (T = 1): row blockIdx.y, its session's S */
        int row = blockIdx.y;
        S = R.S[row] + R.S_off;
        u += (size_t)row * cd; g += (size_t)row * nv; beta += (size_t)row * nv; o += (size_t)row * nv * dv;
    }
    int h = blockIdx.x, j = threadIdx.x, kh = h / (nv / nk), kd = nk * dk;
    float *Sh = S + (size_t)h * dk * dv;
    for (int t = 0; t < T; t++) {
        const float *row = u + (size_t)t * cd;
        __syncthreads();
        for (int i = j; i < dk; i += blockDim.x) { qk[i] = row[kh * dk + i]; qk[dk + i] = row[kd + kh * dk + i]; }
        __syncthreads();
        float decay = expf(g[(size_t)t * nv + h]), b = beta[(size_t)t * nv + h];
        float vj = row[2 * kd + h * dv + j];
        float d = 0, out = 0;
        for (int i = 0; i < dk; i++) { float v = Sh[(size_t)i * dv + j] * decay; Sh[(size_t)i * dv + j] = v; d += v * qk[dk + i]; }
        d = (vj - d) * b;
        for (int i = 0; i < dk; i++) { float v = Sh[(size_t)i * dv + j] + qk[dk + i] * d; Sh[(size_t)i * dv + j] = v; out += v * qk[i]; }
        o[(size_t)t * nv * dv + (size_t)h * dv + j] = out;
    }
}
void cu_gdn_rec(cudaStream_t s, int T, int nk, int nv, int dk, int dv, const float *u, int cd,
                const float *g, const float *beta, float *S, float *o) {
    cu_rows none;
    memset(&none, 0, sizeof none);
    if (dk == 128 && dv * 4 <= 512 && dv >= 64) cu_go(k_gdn_rec128, nv, dv * 4, 0, s)(T, nk, nv, dv, u, cd, g, beta, S, o, NULL, NULL, 0.f, none);
    else cu_go(k_gdn_rec_gen, nv, dv, 2 * (size_t)dk * sizeof(float), s)(T, nk, nv, dk, dv, u, cd, g, beta, S, o, none);
}

static int rec_norm_ok(int dk, int dv) { return dk == 128 && dv * 4 <= 512 && dv >= 64 && dv % 8 == 0; }
int cu_gdn_rec_norm(cudaStream_t s, int T, int nk, int nv, int dk, int dv, const float *u, int cd, const float *g,
                    const float *beta, float *S, float *o, const float *z, const float *gw, float eps) {
    if (!rec_norm_ok(dk, dv)) return 0;
    cu_rows none;
    memset(&none, 0, sizeof none);
    cu_go(k_gdn_rec128, nv, dv * 4, 0, s)(T, nk, nv, dv, u, cd, g, beta, S, o, z, gw, eps, none);
    return 1;
}
int cu_gdn_rec_rows(cudaStream_t s, const cu_rows *R, int n, int nk, int nv, int dk, int dv, const float *u, int cd,
                    const float *g, const float *beta, float *o, const float *z, const float *gw, float eps) {
    if (rec_norm_ok(dk, dv)) {
        cu_go(k_gdn_rec128, dim3(nv, n), dv * 4, 0, s)(1, nk, nv, dv, u, cd, g, beta, NULL, o, z, gw, eps, *R);
        return 1;
    }
    if (dk == 128 && dv * 4 <= 512 && dv >= 64)
        cu_go(k_gdn_rec128, dim3(nv, n), dv * 4, 0, s)(1, nk, nv, dv, u, cd, g, beta, NULL, o, NULL, NULL, 0.f, *R);
    else cu_go(k_gdn_rec_gen, dim3(nv, n), dv, 2 * (size_t)dk * sizeof(float), s)(1, nk, nv, dk, dv, u, cd, g, beta, NULL, o, *R);
    return 0;
}

/* Decode's whole DeltaNet step in one launch (k_gdn_prep1's conv + SiLU + q/k norm + gates, then
 * k_gdn_rec128's step and gated norm, for dk = dv = 128): a block a value head h, 512 threads; threads
 * 0-255 take the conv of its key head's q | k channels, 256-383 its own value channels. The value
 * channels' conv state is the block's own; a key head's q | k state is shared by the nv / nk blocks
 * of its value heads, so the last of them to have read it writes it (cnt [nk], 0 between launches:
 * the last one to count resets it). The conv state and S are read before the wait on the
 * predecessor, as k_gdn_rec128 reads S: only this kernel of its layer writes them in decode.
 * One launch a DeltaNet layer fewer: k_gdn_prep1 added ~3.3 us a layer to the decode step's
 * critical path (the decode timeline, bench/RESULTS.md session 18). */
#define GDN_DEC_KMAX 8
/* A conv channel's state after the step: its K - 1 taps c shifted down one, the new input last
 * (decode's k_gdn_dec128 and k_gdn_dec_split, c read before the wait) */
static __device__ __forceinline__ void gdn_conv_shift(float *state, int ch, int K, const float (&c)[GDN_DEC_KMAX], float in) {
    float *st = state + (size_t)ch * (K - 1);
#pragma unroll
    for (int i = 0; i + 1 < GDN_DEC_KMAX; i++)
        if (i + 1 < K - 1) st[i] = c[i + 1];
    st[K - 2] = in;
}
__global__ void __launch_bounds__(512) k_gdn_dec128(int nk, int nv, int K, const float *__restrict__ mixed, float *state,
                                                     const float *__restrict__ cw, const float *__restrict__ bb, const float *__restrict__ aa,
                                                     const float *__restrict__ A_log, const float *__restrict__ dt_bias, float *S,
                                                     float *__restrict__ o, const float *__restrict__ z, const float *__restrict__ gw,
                                                     float eps, unsigned *cnt) {
    __shared__ float qkb[256], vsh[128], red[16], red2[16];
    __shared__ int last;
    const int dk = 128, dv = 128, tid = threadIdx.x, warp = tid / WARP;
    const int h = blockIdx.x, j = tid / 4, p = tid % 4, ratio = nv / nk, kh = h / ratio, kd = nk * dk;
    const int ch = tid < 128 ? kh * dk + tid : tid < 256 ? kd + kh * dk + (tid - 128) : tid < 384 ? 2 * kd + h * dv + (tid - 256) : -1;
    float *Sh = S + (size_t)h * dk * dv;
    float sr[32], wk[GDN_DEC_KMAX], cs[GDN_DEC_KMAX]; /* (indexed by constants only: registers, not a stack frame) */
#pragma unroll
    for (int i = 0; i < 32; i++) sr[i] = Sh[(size_t)(p * 32 + i) * dv + j];
#pragma unroll
    for (int i = 0; i < GDN_DEC_KMAX; i++) {
        wk[i] = ch >= 0 && i < K - 1 ? cw[(size_t)ch * K + i] : 0.f;
        cs[i] = ch >= 0 && i < K - 1 ? state[(size_t)ch * (K - 1) + i] : 0.f;
    }
    const float wl = ch >= 0 ? cw[(size_t)ch * K + K - 1] : 0.f, gwj = gw[j], alog = A_log[h], dtb = dt_bias[h];
    CU_PDL();
    const float in = ch >= 0 ? mixed[ch] : 0.f, zj = z[(size_t)h * dv + j], bh = bb[h], ah = aa[h];
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < GDN_DEC_KMAX; i++)
        if (i < K - 1) acc += wk[i] * cs[i];
    acc += wl * in;
    const float v = ch >= 0 ? silu_f(acc) : 0.f;
    /* the q and k heads' L2 norms: warps 0-3 hold q, 4-7 k */
    const float ss = warp_sum(v * v);
    if (tid % WARP == 0) red[warp] = ss;
    __syncthreads();
    CU_MARK(0);
    if (tid < 256) {
        const float tot = tid < 128 ? red[0] + red[1] + red[2] + red[3] : red[4] + red[5] + red[6] + red[7];
        qkb[tid] = v * (1.0f / sqrtf(tot + 1e-6f) * (tid < 128 ? 1.0f / sqrtf((float)dk) : 1.0f));
    } else if (tid < 384) vsh[tid - 256] = v;
    if (tid == 0) { /* every thread of the block has read its state (its values are in acc) */
        __threadfence();
        last = atomicAdd(&cnt[kh], 1u) == (unsigned)ratio - 1;
        if (last) cnt[kh] = 0;
    }
    __syncthreads();
    CU_MARK(1);
    if (ch >= 0 && K > 1 && (tid >= 256 || last)) gdn_conv_shift(state, ch, K, cs, in);
    const float beta = sigm_f(bh), decay = expf(gdn_g(ah + dtb, alog)), vj = vsh[j];
    const float out = gdn_col_step(sr, qkb, qkb + 128, p, decay, vj, beta);
    CU_MARK(2);
    float sq = warp_sum(p == 0 ? out * out : 0.f);
    if (tid % WARP == 0) red2[warp] = sq;
    __syncthreads();
    float tot = 0.f;
#pragma unroll
    for (int i = 0; i < 16; i++) tot += red2[i];
    if (p == 0) o[(size_t)h * dv + j] = out * (1.0f / sqrtf(tot / dv + eps)) * gwj * silu_f(zj);
#pragma unroll
    for (int i = 0; i < 32; i++) Sh[(size_t)(p * 32 + i) * dv + j] = sr[i];
}
int cu_gdn_dec_ok(int nk, int nv, int dk, int dv, int K) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_GDN_DEC", 1) && dk == 128 && dv == 128 && K >= 1 && K <= GDN_DEC_KMAX && nk >= 1 &&
           nk <= GDN_DEC_CNT && nv % nk == 0;
}
int cu_gdn_dec(cudaStream_t s, int nk, int nv, int dk, int dv, int K, const float *mixed, float *state, const float *cw,
               const float *bb, const float *aa, const float *A_log, const float *dt_bias, float *S, float *o, const float *z,
               const float *gw, float eps, unsigned *cnt) {
    if (!cu_gdn_dec_ok(nk, nv, dk, dv, K) || !z || !gw || !cnt) return 0;
    cu_go(k_gdn_dec128, nv, 512, 0, s)(nk, nv, K, mixed, state, cw, bb, aa, A_log, dt_bias, S, o, z, gw, eps, cnt);
    return 1;
}

/* The same step split four ways a value head (k_gdn_dec_split): block (h, sp) takes columns
 * 32 sp .. 32 sp + 31 of head h's S, 128 threads. Why: k_gdn_dec128's 32 blocks each wait on 64 KB of S
 * from one SM; the decode timeline (bench/RESULTS.md session 21) put ~4.5 us of a layer's path on
 * that wait, in the column step that first uses S. Here 128 SMs take 16 KB each. What a quarter
 * block cannot do alone is the gated norm (the head's sum of squares spans four blocks): o is
 * written before it, and the out-projection's staging applies it (mvq_fuse.gz, cu_matvec_gated),
 * or k_gated_norm128 does where that launch declines. Every block computes its key head's q and
 * k conv (a channel a thread) and its own 32 value channels; the shared q | k conv state is
 * written by the last of the key head's nv / nk x 4 blocks to count (cnt [nk], 0 between
 * launches), whose count goes out before the column step and is read after it. q and k sit in
 * shared memory at a 36-float stride a thread's part (gdn_col_step<36>: no bank conflicts).
 * On the H200 (session 21): 4.6 us on a layer's path and the gated norm's launch 1.9, against
 * k_gdn_dec128's 7.3: tg128 526.8 -> 534.3 against LILY_CU_GDN_SPLIT=0 (k_gdn_dec128) in one call, 538 with
 * the norm in the out-projection's staging and the shared-memory pad below. */
#define GDN_SPLIT 4
__global__ void __launch_bounds__(128) k_gdn_dec_split(int nk, int nv, int K, const float *__restrict__ mixed, float *state,
                                                       const float *__restrict__ cw, const float *__restrict__ bb,
                                                       const float *__restrict__ aa, const float *__restrict__ A_log,
                                                       const float *__restrict__ dt_bias, float *S, float *__restrict__ o, unsigned *cnt) {
    __shared__ float qs[4 * 36], ks[4 * 36], vsh[32], red[8];
    __shared__ int last;
    const int dk = 128, dv = 128, tid = threadIdx.x, warp = tid / WARP;
    const int h = blockIdx.x, sp = blockIdx.y, j = tid / 4, p = tid % 4, jj = sp * 32 + j;
    const int ratio = nv / nk, kh = h / ratio, kd = nk * dk;
    const int cq = kh * dk + tid, ck = kd + kh * dk + tid, cv = tid < 32 ? 2 * kd + h * dv + sp * 32 + tid : -1;
    float *Sh = S + (size_t)h * dk * dv;
    /* (indexed by constants only: registers, not a stack frame) */
    float sr[32], wq[GDN_DEC_KMAX], wk[GDN_DEC_KMAX], wv[GDN_DEC_KMAX], sq[GDN_DEC_KMAX], sk[GDN_DEC_KMAX], sv[GDN_DEC_KMAX];
#pragma unroll
    for (int i = 0; i < 32; i++) sr[i] = Sh[(size_t)(p * 32 + i) * dv + jj];
#pragma unroll
    for (int i = 0; i < GDN_DEC_KMAX; i++) {
        const bool in = i < K - 1;
        wq[i] = in ? cw[(size_t)cq * K + i] : 0.f;
        sq[i] = in ? state[(size_t)cq * (K - 1) + i] : 0.f;
        wk[i] = in ? cw[(size_t)ck * K + i] : 0.f;
        sk[i] = in ? state[(size_t)ck * (K - 1) + i] : 0.f;
        wv[i] = in && cv >= 0 ? cw[(size_t)cv * K + i] : 0.f;
        sv[i] = in && cv >= 0 ? state[(size_t)cv * (K - 1) + i] : 0.f;
    }
    const float wlq = cw[(size_t)cq * K + K - 1], wlk = cw[(size_t)ck * K + K - 1], wlv = cv >= 0 ? cw[(size_t)cv * K + K - 1] : 0.f;
    const float alog = A_log[h], dtb = dt_bias[h];
    CU_PDL();
    const float iq = mixed[cq], ik = mixed[ck], iv = cv >= 0 ? mixed[cv] : 0.f, bh = bb[h], ah = aa[h];
    float aq = 0.f, ak = 0.f, av = 0.f;
#pragma unroll
    for (int i = 0; i < GDN_DEC_KMAX; i++)
        if (i < K - 1) {
            aq += wq[i] * sq[i];
            ak += wk[i] * sk[i];
            av += wv[i] * sv[i];
        }
    aq += wlq * iq;
    ak += wlk * ik;
    av += wlv * iv;
    const float vq = silu_f(aq), vk = silu_f(ak), vv = cv >= 0 ? silu_f(av) : 0.f;
    const float ssq = warp_sum(vq * vq), ssk = warp_sum(vk * vk);
    if (tid % WARP == 0) {
        red[warp] = ssq;
        red[4 + warp] = ssk;
    }
    __syncthreads();
    unsigned ticket = 0;
    if (tid == 0) { /* every thread of the block has read its conv state (its values are in aq, ak) */
        __threadfence();
        ticket = atomicAdd(&cnt[kh], 1u);
    }
    const float tq = (red[0] + red[1]) + (red[2] + red[3]), tk = (red[4] + red[5]) + (red[6] + red[7]);
    const int pi = (tid / 32) * 36 + tid % 32;
    qs[pi] = vq * (1.0f / sqrtf(tq + 1e-6f) * (1.0f / sqrtf((float)dk)));
    ks[pi] = vk * (1.0f / sqrtf(tk + 1e-6f));
    if (cv >= 0) vsh[tid] = vv;
    __syncthreads();
    const float beta = sigm_f(bh), decay = expf(gdn_g(ah + dtb, alog));
    const float out = gdn_col_step<36>(sr, qs, ks, p, decay, vsh[j], beta);
    if (p == 0) o[(size_t)h * dv + jj] = out;
#pragma unroll
    for (int i = 0; i < 32; i++) Sh[(size_t)(p * 32 + i) * dv + jj] = sr[i];
    if (cv >= 0 && K > 1) gdn_conv_shift(state, cv, K, sv, iv); /* the block's own value channels */
    if (tid == 0) {
        last = ticket == (unsigned)(ratio * GDN_SPLIT) - 1;
        if (last) cnt[kh] = 0;
    }
    __syncthreads();
    if (last && K > 1) {
        gdn_conv_shift(state, cq, K, sq, iq);
        gdn_conv_shift(state, ck, K, sk, ik);
    }
}
int cu_gdn_dec_split(cudaStream_t s, int nk, int nv, int dk, int dv, int K, const float *mixed, float *state, const float *cw,
                     const float *bb, const float *aa, const float *A_log, const float *dt_bias, float *S, float *o, unsigned *cnt) {
    static int on = -1, pad = INT_MIN;
    if (!cu_env_flag(&on, "LILY_CU_GDN_SPLIT", 1) || !cu_gdn_dec_ok(nk, nv, dk, dv, K) || !cnt) return 0;
    /* 60,000 bytes of shared memory a block that it does not use: at most three blocks an SM, where the
     * scheduler otherwise packed the 128 onto the ~40 SMs the in-projection had left free (tg128 +0.3-0.5%
     * on the H200, 30,000 -0.4%, bench/RESULTS.md session 21); LILY_CU_GDN_SPLIT_SMEM=BYTES, for measuring */
    cu_env_int(&pad, "LILY_CU_GDN_SPLIT_SMEM", 60000);
    static int opted = 0;
    const size_t sm = pad > 0 && pad <= 160 * 1024 ? (size_t)pad : 0;
    if (sm > 48 * 1024 && !opted)
        opted = cudaFuncSetAttribute(k_gdn_dec_split, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024) == cudaSuccess;
    cu_go(k_gdn_dec_split, dim3(nv, GDN_SPLIT), 128, sm, s)(nk, nv, K, mixed, state, cw, bb, aa, A_log, dt_bias, S, o, cnt);
    return 1;
}

__global__ void k_gated_norm(float *o, const float *z, const float *gw, int nv, int dv, float eps) {
    CU_PDL();
    __shared__ float sh[32];
    int t = blockIdx.x / nv, h = blockIdx.x % nv;
    float *oh = o + (size_t)t * nv * dv + (size_t)h * dv;
    const float *zh = z + (size_t)t * nv * dv + (size_t)h * dv;
    float ss = 0;
    for (int i = threadIdx.x; i < dv; i += blockDim.x) ss += oh[i] * oh[i];
    ss = block_sum(ss, sh);
    float r = 1.0f / sqrtf(ss / dv + eps);
    for (int i = threadIdx.x; i < dv; i += blockDim.x) oh[i] = oh[i] * r * gw[i] * silu_f(zh[i]);
}
/* The same with a warp a (token, head) for dv = 128, four elements a lane (a block of 128 threads
 * a head and token with a block-wide sum ran at latency: 22 us a layer at 512 tokens). */
/* op not NULL: o also packed (xp_chunk): (token, head) i is the row's 128-column step i % nv,
 * lane l holds its columns 4l..4l+3, so lanes 2m and 2m + 1 hold chunk 4 (m & 3) + (m >> 2) */
__global__ void k_gated_norm128(float *o, const float *z, const float *gw, int n, float eps, uint4 *op) {
    CU_PDL();
    const int i = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (i >= n) return;
    float4 *oh = (float4 *)(o + (size_t)i * 128);
    const float4 v = oh[lane], zz = ((const float4 *)(z + (size_t)i * 128))[lane], w = ((const float4 *)gw)[lane];
    const float ss = warp_sum((v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w));
    const float r = 1.0f / sqrtf(ss / 128 + eps);
    const float4 y = make_float4(v.x * r * w.x * silu_f(zz.x), v.y * r * w.y * silu_f(zz.y), v.z * r * w.z * silu_f(zz.z),
                                 v.w * r * w.w * silu_f(zz.w));
    oh[lane] = y;
    if (op) {
        const float4 b = make_float4(__shfl_xor_sync(0xffffffffu, y.x, 1), __shfl_xor_sync(0xffffffffu, y.y, 1),
                                     __shfl_xor_sync(0xffffffffu, y.z, 1), __shfl_xor_sync(0xffffffffu, y.w, 1));
        const int m = lane >> 1;
        if (!(lane & 1)) op[(size_t)i * 16 + 4 * (m & 3) + (m >> 2)] = xp_chunk(y, b);
    }
}
void cu_gated_norm(cudaStream_t s, float *o, const float *z, const float *gw, int T, int nv, int dv, float eps) {
    cu_gated_norm_p(s, o, z, gw, T, nv, dv, eps, NULL);
}
int cu_gated_norm_p(cudaStream_t s, float *o, const float *z, const float *gw, int T, int nv, int dv, float eps, uint16_t *op) {
    if (dv == 128 && ((uintptr_t)o & 15) == 0 && ((uintptr_t)z & 15) == 0 && ((uintptr_t)gw & 15) == 0) {
        if (op && !xp_out_ok(op, nv * dv, T, o, z, gw)) op = NULL;
        cu_go(k_gated_norm128, (T * nv + 7) / 8, 256, 0, s)(o, z, gw, T * nv, eps, (uint4 *)op);
        return op != NULL;
    }
    cu_go(k_gated_norm, T * nv, 128, 0, s)(o, z, gw, nv, dv, eps);
    return 0;
}

/* ---- gated attention ---- */
__global__ void k_qk_prep(const float *qg, float *q, const float *k, const float *v, const float *qn,
                          const float *kn, int nh, int nkv, int hd, int rot, const float *inv_freq, float eps,
                          const int *pos, float *kc, float *vc, cu_rows R) {
    CU_PDL();
    extern __shared__ float buf[];
    __shared__ float sh[32];
    int t = blockIdx.x, h = blockIdx.y, p = R.pos ? R.pos[t] : *pos + t;
    if (R.pos) { kc = R.kc[t] + R.kv_off; vc = R.vc[t] + R.kv_off; } /* decode batch: row t's own cache */
    const float *src;
    const float *nw;
    float *dst;
    if (h < nh) {
        src = qg + (size_t)t * nh * 2 * hd + (size_t)h * 2 * hd;
        nw = qn;
        dst = q + (size_t)t * nh * hd + (size_t)h * hd;
    } else {
        int kh = h - nh;
        src = k + (size_t)t * nkv * hd + (size_t)kh * hd;
        nw = kn;
        dst = kc + (size_t)p * nkv * hd + (size_t)kh * hd;
        const float *vs = v + (size_t)t * nkv * hd + (size_t)kh * hd;
        float *vd = vc + (size_t)p * nkv * hd + (size_t)kh * hd;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) vd[i] = vs[i];
    }
    float ss = 0;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += src[i] * src[i];
    ss = block_sum(ss, sh);
    float r = 1.0f / sqrtf(ss / hd + eps);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) buf[i] = src[i] * r * nw[i];
    __syncthreads();
    int half = rot / 2;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float val = buf[i];
        if (i < rot) {
            int fi = i < half ? i : i - half;
            float ang = (float)p * inv_freq[fi], cs = cosf(ang), sn = sinf(ang);
            float a = buf[fi], b = buf[fi + half];
            val = i < half ? a * cs - b * sn : b * cs + a * sn;
        }
        dst[i] = val;
    }
}
void cu_qk_prep(cudaStream_t s, const float *qg, float *q, const float *k, const float *v, const float *qn,
                const float *kn, int T, int nh, int nkv, int hd, int rot, const float *inv_freq, float eps,
                const int *pos, float *kc, float *vc) {
    cu_rows none;
    memset(&none, 0, sizeof none);
    cu_go(k_qk_prep, dim3(T, nh + nkv), 128, (size_t)hd * sizeof(float), s)(qg, q, k, v, qn, kn, nh, nkv, hd, rot, inv_freq, eps, pos, kc, vc, none);
}
void cu_qk_prep_rows(cudaStream_t s, const cu_rows *R, int n, const float *qg, float *q, const float *k, const float *v,
                     const float *qn, const float *kn, int nh, int nkv, int hd, int rot, const float *inv_freq, float eps) {
    cu_go(k_qk_prep, dim3(n, nh + nkv), 128, (size_t)hd * sizeof(float), s)(qg, q, k, v, qn, kn, nh, nkv, hd, rot, inv_freq, eps,
                                                                         R->pos, NULL, NULL, *R);
}

/* Each warp runs an online softmax over its share of one split's keys and leaves
 * (max, sum, acc[hd]) in part; k_attn_merge combines them and applies the gate. */
#define ATT_WARPS 4
#define ATT_MAXR 16
__global__ void __launch_bounds__(ATT_WARPS * WARP) k_attn(const float *q, const float *kc, const float *vc, int nh, int nkv,
                                                           int hd, const int *pos, int splits, float *part, cu_rows rows) {
    CU_PDL();
    int th = blockIdx.x, t = th / nh, h = th % nh, kvh = h / (nh / nkv);
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, R = hd / WARP;
    int n = (rows.pos ? rows.pos[t] : *pos + t) + 1;
    if (rows.pos) { kc = rows.kc[t] + rows.kv_off; vc = rows.vc[t] + rows.kv_off; } /* decode batch: row t's own cache */
    int chunk = (n + splits - 1) / splits, j0 = blockIdx.y * chunk, j1 = min(n, j0 + chunk);
    const float *qh = q + (size_t)t * nh * hd + (size_t)h * hd;
    float qr[ATT_MAXR], acc[ATT_MAXR];
#pragma unroll
    for (int i = 0; i < ATT_MAXR; i++) { qr[i] = i < R ? qh[lane + WARP * i] : 0.f; acc[i] = 0.f; }
    float scale = rsqrtf((float)hd), mx = -INFINITY, l = 0;
    size_t ld = (size_t)nkv * hd;
    for (int j = j0 + warp; j < j1; j += ATT_WARPS) {
        const float *kj = kc + j * ld + (size_t)kvh * hd, *vj = vc + j * ld + (size_t)kvh * hd;
        float d = 0;
#pragma unroll
        for (int i = 0; i < ATT_MAXR; i++) if (i < R) d += qr[i] * kj[lane + WARP * i];
        float sc = warp_sum(d) * scale;
        if (sc > mx) {
            float corr = expf(mx - sc);
            l = l * corr + 1.0f;
#pragma unroll
            for (int i = 0; i < ATT_MAXR; i++) if (i < R) acc[i] = acc[i] * corr + vj[lane + WARP * i];
            mx = sc;
        } else {
            float p = expf(sc - mx);
            l += p;
#pragma unroll
            for (int i = 0; i < ATT_MAXR; i++) if (i < R) acc[i] += p * vj[lane + WARP * i];
        }
    }
    float *pp = part + (((size_t)th * splits + blockIdx.y) * ATT_WARPS + warp) * (hd + 2);
    if (lane == 0) { pp[0] = mx; pp[1] = l; }
#pragma unroll
    for (int i = 0; i < ATT_MAXR; i++) if (i < R) pp[2 + lane + WARP * i] = acc[i];
}
/* The key splits a token's decode attention uses of its grid's `splits` (amin > 0: one token, n keys):
 * at least amin keys a split past half of them, so short contexts keep half the splits (their partials
 * and their merge cost as before) and long ones get every split's loads in flight (splits > 0). */
__host__ __device__ __forceinline__ int attn_splits_used(int splits, int amin, int n) {
    if (amin <= 0) return splits;
    const int lo = splits / 2 > 0 ? splits / 2 : 1, se = (n + amin - 1) / amin;
    return se < lo ? lo : se > splits ? splits : se;
}
__global__ void k_attn_merge(const float *part, const float *qg, int nh, int hd, int np, float *o, const int *pos, int amin) {
    CU_PDL();
    __shared__ float wsh[1024];
    __shared__ float Lsh;
    int th = blockIdx.x, t = th / nh, h = th % nh;
    const float *pp = part + (size_t)th * np * (hd + 2);
    if (amin > 0) np = attn_splits_used(np, amin, *pos + 1); /* (the stride stays the grid's) */
    /* the partials' maxima and sums by the first warp, a partial a lane (one thread walking decode's
     * 64 splits was a chain of dependent loads: 12 us a launch under Nsight) */
    if (threadIdx.x < WARP) {
        const int lane = threadIdx.x;
        float M = -INFINITY;
        for (int p = lane; p < np; p += WARP) M = fmaxf(M, pp[(size_t)p * (hd + 2)]);
        for (int o = 16; o; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        float L = 0;
        for (int p = lane; p < np; p += WARP) {
            float m = pp[(size_t)p * (hd + 2)], w = m == -INFINITY ? 0.f : expf(m - M);
            wsh[p] = w;
            L += w * pp[(size_t)p * (hd + 2) + 1];
        }
        for (int o = 16; o; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
        if (lane == 0) Lsh = L;
    }
    __syncthreads();
    const float *gate = qg + (size_t)t * nh * 2 * hd + (size_t)h * 2 * hd + hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float a = 0;
#pragma unroll 8
        for (int p = 0; p < np; p++) if (wsh[p] != 0.f) a += pp[(size_t)p * (hd + 2) + 2 + i] * wsh[p];
        o[(size_t)t * nh * hd + (size_t)h * hd + i] = a / Lsh * sigm_f(gate[i]);
    }
}
/* Decode's merge of many partials (the GQA form's 64 key splits a head), wide: a block per (token,
 * head, 32 output columns), its 8 warps each folding every 8th partial online (the loads of 8
 * partials issued before their sums), then one warp joining the 8 in shared memory. k_attn_merge
 * read a head's 64 partials with 128 threads, 2 columns each: 16 rounds of loads, 11 us on the
 * decode step's critical path (bench/RESULTS.md, session 18). */
#define AMW_WARPS 8
__global__ void __launch_bounds__(AMW_WARPS * WARP) k_attn_merge_w(const float *part, const float *qg, int nh, int hd, int np,
                                                                  float *o, const int *pos, int amin) {
    CU_PDL();
    __shared__ float sm[AMW_WARPS], sl[AMW_WARPS], sa[AMW_WARPS][WARP];
    const int th = blockIdx.x, t = th / nh, h = th % nh, warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int i = blockIdx.y * WARP + lane; /* hd is a multiple of 32 */
    const float *pp = part + (size_t)th * np * (hd + 2);
    if (amin > 0) np = attn_splits_used(np, amin, *pos + 1); /* (the stride stays the grid's) */
    float M = -INFINITY, L = 0.f, A = 0.f;
    for (int p0 = warp; p0 < np; p0 += AMW_WARPS * 8) {
        float m[8], l[8], a[8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int p = p0 + AMW_WARPS * k;
            const float *q = pp + (size_t)p * (hd + 2);
            m[k] = p < np ? q[0] : -INFINITY;
            l[k] = p < np ? q[1] : 0.f;
            a[k] = p < np ? q[2 + i] : 0.f;
        }
#pragma unroll
        for (int k = 0; k < 8; k++) {
            if (m[k] == -INFINITY) continue; /* an empty split */
            const float mn = fmaxf(M, m[k]), c = expf(M - mn), w = expf(m[k] - mn);
            L = L * c + l[k] * w;
            A = A * c + a[k] * w;
            M = mn;
        }
    }
    if (lane == 0) { sm[warp] = M; sl[warp] = L; }
    sa[warp][lane] = A;
    __syncthreads();
    if (warp) return;
    float Mx = -INFINITY, Ls = 0.f, As = 0.f;
#pragma unroll
    for (int w = 0; w < AMW_WARPS; w++) Mx = fmaxf(Mx, sm[w]);
#pragma unroll
    for (int w = 0; w < AMW_WARPS; w++) {
        const float f = sm[w] == -INFINITY ? 0.f : expf(sm[w] - Mx);
        Ls += f * sl[w];
        As += f * sa[w][lane];
    }
    const float *gate = qg + (size_t)t * nh * 2 * hd + (size_t)h * 2 * hd + hd;
    o[(size_t)t * nh * hd + (size_t)h * hd + i] = As / Ls * sigm_f(gate[i]);
}
/* LILY_CU_MERGE_W=0: decode's merge by k_attn_merge again, for measuring */
static int merge_w_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_MERGE_W", 1);
}

/* GQA form: one block per (token, KV head, split) runs the HG query heads that share the KV
 * head together, so each key and value is read once for all of them. R = hd / 32. */
/* Decode's q/k prep folded into attention (one token, one session: a launch a layer fewer):
 * k_qk_prep's per-head norm and RoPE of the raw q (qg, [nh][2 hd] with the gates) and of the new
 * token's k, and the cache write of k and v, done by the attention blocks themselves. */
typedef struct {
    const float *qg, *k, *v;   /* [nh][2 hd] raw q with gates, [nkv][hd] raw k and v */
    const float *qn, *kn;      /* [hd] the q and k norms' weights */
    const float *inv_freq;     /* [rot / 2] */
    float *kcw, *vcw;          /* the caches (as kc, vc), where the new token's k and v go */
    int rot;                   /* rotated dims, a multiple of 64: a pair (i, i + rot / 2) is one lane's */
    float eps;
} qk_fold;

template <int R, int HW>
__device__ __forceinline__ void qk_rope(float (&v)[R], const float (&cs)[R], const float (&sn)[R]) {
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
__device__ __forceinline__ void qk_head(float (&v)[R], const float (&w)[R], int rot, float eps, const float (&cs)[R],
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

template <int HG, int R>
__global__ void __launch_bounds__(ATT_WARPS * WARP) k_attn_gqa(const float *q, const float *kc, const float *vc, int nh,
                                                               int nkv, const int *pos, int splits, float *part, cu_rows rows,
                                                               qk_fold P, int amin) {
    const int hd = R * WARP;
    int tk = blockIdx.x, t = tk / nkv, kvh = tk % nkv;
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    /* the fold's weights (the q and k norms', RoPE's frequencies: a lane's columns) before the
     * wait: after it, each token streams 2 GB through L2 and they were misses to DRAM on the
     * step's path (as the out-projection's gw, bench/RESULTS.md session 25) */
    float qw[R], kw[R], fr[R];
#pragma unroll
    for (int i = 0; i < R; i++) {
        qw[i] = P.qg ? P.qn[lane + WARP * i] : 0.f;
        kw[i] = P.qg ? P.kn[lane + WARP * i] : 0.f;
        fr[i] = P.qg && i < P.rot / 64 ? P.inv_freq[lane + WARP * i] : 0.f;
    }
    CU_PDL();
    int n = (rows.pos ? rows.pos[t] : *pos + t) + 1;
    if (rows.pos) { kc = rows.kc[t] + rows.kv_off; vc = rows.vc[t] + rows.kv_off; } /* decode batch: row t's own cache */
    const int se = attn_splits_used(splits, amin, n); /* (amin: one token, no rows) */
    if ((int)blockIdx.y >= se) return; /* a split past those used: the merge reads none of its partials */
    int chunk = (n + se - 1) / se, j0 = blockIdx.y * chunk, j1 = min(n, j0 + chunk);
    float qr[HG][R], acc[HG][R], mx[HG], l[HG];
    float scale = rsqrtf((float)hd);
    if (P.qg) { /* (T = 1) the q heads' prep shared by the warps (a warp a head, through shared
                 * memory: every warp reads them all; each warp doing all of them measured 1% slower
                 * than k_qk_prep's launch, this form 0.8% faster, bench/RESULTS.md session 19);
                 * the new key's by the block whose keys end with it, before its warps read the cache */
        __shared__ float qs[HG][R * WARP];
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
        for (int g = warp; g < HG; g += ATT_WARPS) {
            const float *qh = P.qg + (size_t)(kvh * HG + g) * 2 * hd;
            float v[R];
#pragma unroll
            for (int i = 0; i < R; i++) v[i] = qh[lane + WARP * i];
            qk_head<R>(v, qw, P.rot, P.eps, cs, sn);
#pragma unroll
            for (int i = 0; i < R; i++) qs[g][lane + WARP * i] = v[i] * scale;
        }
        if (j0 <= p && p < j1) { /* (block-uniform) */
            const size_t o = (size_t)p * nkv * hd + (size_t)kvh * hd;
            if (warp == 0) {
                float kv[R];
#pragma unroll
                for (int i = 0; i < R; i++) kv[i] = P.k[(size_t)kvh * hd + lane + WARP * i];
                qk_head<R>(kv, kw, P.rot, P.eps, cs, sn);
#pragma unroll
                for (int i = 0; i < R; i++) P.kcw[o + lane + WARP * i] = kv[i];
            } else
                for (int i = threadIdx.x - WARP; i < hd; i += blockDim.x - WARP) P.vcw[o + i] = P.v[(size_t)kvh * hd + i];
        }
        __syncthreads(); /* (the q heads, and the block's cache writes, seen by its threads past the barrier) */
#pragma unroll
        for (int g = 0; g < HG; g++) {
#pragma unroll
            for (int i = 0; i < R; i++) { qr[g][i] = qs[g][lane + WARP * i]; acc[g][i] = 0.f; }
            mx[g] = -INFINITY; l[g] = 0.f;
        }
    } else
#pragma unroll
    for (int g = 0; g < HG; g++) {
        const float *qh = q + (size_t)t * nh * hd + (size_t)(kvh * HG + g) * hd;
#pragma unroll
        for (int i = 0; i < R; i++) { qr[g][i] = qh[lane + WARP * i] * scale; acc[g][i] = 0.f; }
        mx[g] = -INFINITY; l[g] = 0.f;
    }
    size_t ld = (size_t)nkv * hd;
    for (int j = j0 + warp; j < j1; j += ATT_WARPS) {
        const float *kj = kc + j * ld + (size_t)kvh * hd, *vj = vc + j * ld + (size_t)kvh * hd;
        float kr[R], vr[R];
#pragma unroll
        for (int i = 0; i < R; i++) { kr[i] = kj[lane + WARP * i]; vr[i] = vj[lane + WARP * i]; }
#pragma unroll
        for (int g = 0; g < HG; g++) {
            float d = 0;
#pragma unroll
            for (int i = 0; i < R; i++) d += qr[g][i] * kr[i];
            float sc = warp_sum(d);
            float mnew = fmaxf(mx[g], sc), corr = expf(mx[g] - mnew), p = expf(sc - mnew);
            l[g] = l[g] * corr + p;
#pragma unroll
            for (int i = 0; i < R; i++) acc[g][i] = acc[g][i] * corr + p * vr[i];
            mx[g] = mnew;
        }
    }
    /* merge the warps in shared memory: one partial per block and head */
    __shared__ float sm_m[HG][ATT_WARPS], sm_l[HG][ATT_WARPS], sm_a[HG][ATT_WARPS][R * WARP];
#pragma unroll
    for (int g = 0; g < HG; g++) {
        if (lane == 0) { sm_m[g][warp] = mx[g]; sm_l[g][warp] = l[g]; }
#pragma unroll
        for (int i = 0; i < R; i++) sm_a[g][warp][lane + WARP * i] = acc[g][i];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < HG * (hd + 2); idx += blockDim.x) {
        int g = idx / (hd + 2), i = idx % (hd + 2);
        float M = -INFINITY;
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm_m[g][w]);
        float v = 0;
        if (i == 0) v = M;
        else if (M != -INFINITY)
            for (int w = 0; w < ATT_WARPS; w++) {
                float f = sm_m[g][w] == -INFINITY ? 0.f : expf(sm_m[g][w] - M);
                v += f * (i == 1 ? sm_l[g][w] : sm_a[g][w][i - 2]);
            }
        int th = t * nh + kvh * HG + g;
        part[((size_t)th * splits + blockIdx.y) * (hd + 2) + i] = v;
    }
}

size_t cu_attention_part_floats(int T, int nh, int hd, int splits) {
    return (size_t)T * nh * splits * ATT_WARPS * (hd + 2);
}
static const qk_fold qk_none = { NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0.f };
static void attention(cudaStream_t s, const float *q, const float *qg, const float *kc, const float *vc, int T,
                      int nh, int nkv, int hd, const int *pos, int splits, float *part, float *o, const cu_rows &rw,
                      int p0h = -1, void *h16 = NULL, size_t h16_bytes = 0, const qk_fold &P = qk_none, int amin = 0) {
    if (!rw.pos && splits == 1 && cu_attn_tc_ok(T, nh, nkv, hd)) {
        const int np = cu_attn_tc(s, q, qg, kc, vc, T, nh, nkv, pos, o, part, cu_attention_part_floats(T, nh, hd, 1), p0h, h16,
                                  h16_bytes);
        if (np > 1) cu_go(k_attn_merge, T * nh, 128, 0, s)(part, qg, nh, hd, np, o, pos, 0);
        return;
    }
    int hg = nh / nkv, np = splits;
    dim3 gq(T * nkv, splits);
    if (T != 1 || rw.pos) amin = 0;
    if (hd == 256 && hg == 8) cu_go(k_attn_gqa<8, 8>, gq, ATT_WARPS * WARP, 0, s)(q, kc, vc, nh, nkv, pos, splits, part, rw, P, amin);
    else if (hd == 256 && hg == 4) cu_go(k_attn_gqa<4, 8>, gq, ATT_WARPS * WARP, 0, s)(q, kc, vc, nh, nkv, pos, splits, part, rw, P, amin);
    else if (hd == 256 && hg == 2) cu_go(k_attn_gqa<2, 8>, gq, ATT_WARPS * WARP, 0, s)(q, kc, vc, nh, nkv, pos, splits, part, rw, P, amin);
    else if (hd == 128 && hg == 8) cu_go(k_attn_gqa<8, 4>, gq, ATT_WARPS * WARP, 0, s)(q, kc, vc, nh, nkv, pos, splits, part, rw, P, amin);
    else {
        cu_go(k_attn, dim3(T * nh, splits), ATT_WARPS * WARP, 0, s)(q, kc, vc, nh, nkv, hd, pos, splits, part, rw);
        np = splits * ATT_WARPS;
        amin = 0;
    }
    if (np >= 16 && hd % WARP == 0 && merge_w_enabled())
        cu_go(k_attn_merge_w, dim3(T * nh, hd / WARP), AMW_WARPS * WARP, 0, s)(part, qg, nh, hd, np, o, pos, amin);
    else cu_go(k_attn_merge, T * nh, 128, 0, s)(part, qg, nh, hd, np, o, pos, amin);
}
void cu_attention(cudaStream_t s, const float *q, const float *qg, const float *kc, const float *vc, int T,
                  int nh, int nkv, int hd, const int *pos, int splits, float *part, float *o, int amin) {
    cu_rows none;
    memset(&none, 0, sizeof none);
    attention(s, q, qg, kc, vc, T, nh, nkv, hd, pos, splits, part, o, none, -1, NULL, 0, qk_none, amin);
}
int cu_attention_dec(cudaStream_t s, const float *qg, const float *k, const float *v, const float *qn, const float *kn, int nh,
                     int nkv, int hd, int rot, const float *inv_freq, float eps, const int *pos, float *kc, float *vc, int splits,
                     float *part, float *o, int amin) {
    const int hg = nkv > 0 ? nh / nkv : 0;
    if (nkv < 1 || nh % nkv || rot < 64 || rot % 64 || rot > hd || rot > 256 ||
        !((hd == 256 && (hg == 8 || hg == 4 || hg == 2)) || (hd == 128 && hg == 8)))
        return 0;
    const qk_fold P = { qg, k, v, qn, kn, inv_freq, kc, vc, rot, eps };
    cu_rows none;
    memset(&none, 0, sizeof none);
    attention(s, NULL, qg, kc, vc, 1, nh, nkv, hd, pos, splits, part, o, none, -1, NULL, 0, P, amin);
    return 1;
}
int cu_qk_fold_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_QK_FOLD", 1);
}
void cu_attention_h16(cudaStream_t s, const float *q, const float *qg, const float *kc, const float *vc, int T, int nh, int nkv,
                      int hd, const int *pos, int p0h, void *h16, size_t h16_bytes, float *part, float *o) {
    cu_rows none;
    memset(&none, 0, sizeof none);
    attention(s, q, qg, kc, vc, T, nh, nkv, hd, pos, 1, part, o, none, p0h, h16, h16_bytes);
}
void cu_attention_rows(cudaStream_t s, const cu_rows *R, int n, const float *q, const float *qg, int nh, int nkv, int hd,
                       int splits, float *part, float *o) {
    attention(s, q, qg, NULL, NULL, n, nh, nkv, hd, R->pos, splits, part, o, *R);
}

/* ---- MoE ---- */
__device__ void route_warp(const float *lg, int E, int K, float *p, int *sel, float *wt) {
    int lane = threadIdx.x % WARP;
    if (K <= WARP && E <= 8 * WARP) { route_ld<8>(lg, E, K, sel, wt); return; }
    if (K <= WARP && E <= 16 * WARP) { route_ld<16>(lg, E, K, sel, wt); return; }
    float mx = -INFINITY;
    for (int e = lane; e < E; e += WARP) mx = fmaxf(mx, __ldcg(lg + e));
    mx = warp_max(mx);
    float sum = 0;
    for (int e = lane; e < E; e += WARP) { float v = expf(__ldcg(lg + e) - mx); p[e] = v; sum += v; }
    sum = warp_sum(sum);
    for (int e = lane; e < E; e += WARP) p[e] = p[e] / sum;
    __syncwarp();
    float tot = 0;
    for (int j = 0; j < K; j++) {
        float bv = -1.0f;
        int bi = 0x7fffffff;
        for (int e = lane; e < E; e += WARP)
            if (p[e] > bv) { bv = p[e]; bi = e; }
        for (int o = 16; o; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        if (bi >= E) bi = 0; /* only NaN logits (a defect upstream) leave no choice: stay in range */
        if (lane == 0) { sel[j] = bi; wt[j] = bv; }
        tot += bv;
        __syncwarp();
        if (lane == 0) p[bi] = -2.0f; /* taken */
        __syncwarp();
    }
    for (int j = lane; j < K; j += WARP) wt[j] = wt[j] / tot;
}
/* P: the logits are first the sum of S <= 16 column slices P [S][T][E] (pstride apart), added in
 * slice order as k_sum_splits does, by the whole block for its tokens (the slices' loads all in
 * flight before the adds), and written to logits for the warps to read back after the barrier */
__global__ void k_router_topk(float *logits, int T, int E, int K, int *sel, float *wt, const float *P, int S, size_t pstride) {
    CU_PDL();
    extern __shared__ float pr[]; /* [warps][E] */
    int warp = threadIdx.x / WARP;
    int t = blockIdx.x * (blockDim.x / WARP) + warp;
    if (P && K <= WARP && E <= 8 * WARP) {
        /* each warp sums its own token's slices into registers (all 16 x 4 loads of a half in
         * flight before the adds, in slice order as below), writes the logits, routes */
        if (t >= T) return;
        const int lane = threadIdx.x % WARP;
        float v[8];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float pz[4][16];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int e = lane + WARP * (4 * h + i);
                const size_t o = (size_t)t * E + e;
#pragma unroll
                for (int z = 0; z < 16; z++) pz[i][z] = z < S && e < E ? P[(size_t)z * pstride + o] : 0.f;
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int e = lane + WARP * (4 * h + i);
                float a = pz[i][0];
#pragma unroll
                for (int z = 1; z < 16; z++)
                    if (z < S) a += pz[i][z];
                v[4 * h + i] = a;
                if (e < E) logits[(size_t)t * E + e] = a;
            }
        }
        route_regs<8>(v, E, K, sel + (size_t)t * K, wt + (size_t)t * K);
        return;
    }
    if (P) {
        const int t0 = blockIdx.x * (blockDim.x / WARP), n = min(T - t0, (int)(blockDim.x / WARP)) * E;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const size_t o = (size_t)t0 * E + i;
            float pz[16];
#pragma unroll
            for (int z = 0; z < 16; z++) pz[z] = z < S ? P[(size_t)z * pstride + o] : 0.f;
            float v = pz[0];
#pragma unroll
            for (int z = 1; z < 16; z++)
                if (z < S) v += pz[z];
            logits[o] = v;
        }
        __syncthreads();
    }
    if (t >= T) return;
    route_warp(logits + (size_t)t * E, E, K, pr + (size_t)warp * E, sel + (size_t)t * K, wt + (size_t)t * K);
}
void cu_router_topk(cudaStream_t s, const float *logits, int T, int E, int K, int *sel, float *wt) {
    int wpb = 4;
    cu_go(k_router_topk, (T + wpb - 1) / wpb, wpb * WARP, (size_t)wpb * E * sizeof(float), s)((float *)logits, T, E, K, sel, wt,
                                                                                          NULL, 0, 0);
}
void cu_router_exact_topk(cudaStream_t s, const dmat *W, const float *rf, const float *X, int ldx, int T, float *logits, float *scr,
                          size_t scr_floats, int K, int *sel, float *wt) {
    const int E = W->rows, wpb = 4;
    int S = cu_router_tc(s, W, rf, X, ldx, T, logits, E, scr, scr_floats);
    if (!S) S = exact_parts(s, W, X, ldx, T, logits, E, scr, scr_floats);
    cu_go(k_router_topk, (T + wpb - 1) / wpb, wpb * WARP, (size_t)wpb * E * sizeof(float), s)(logits, T, E, K, sel, wt,
                                                                                          S > 1 ? scr : NULL, S, (size_t)T * E);
}

/* Counting sort of the n = T*K slots by expert. The order inside an expert follows the
 * atomics, which changes no row's value: every row is computed on its own. With tiles, also the
 * grouped GEMM's (expert, tile) map as k_moe_tiles writes it, from the counts already in shared
 * memory (a launch a layer fewer). */
#define SORT_R 8
__global__ void k_moe_sort(const int *sel, int n, int E, int *count, int *off, int *src, int *pos, int bt, int *tiles,
                           int max_tiles) {
    CU_PDL();
    extern __shared__ int cnt[]; /* [E] counts, then [E] cursors, then (tiles) [E + 1] tile starts */
    int *cur = cnt + E;
    /* a thread's slots i = b0 + threadIdx.x + j blockDim.x (j < SORT_R) loaded together, so the
     * block waits on one round of loads, not one a slot (the loop of a load and an atomic a slot
     * ran ~8 us at 4,096 slots), and kept for the scatter where one batch holds all n */
    const int per = SORT_R * blockDim.x, one = n <= per;
    int v[SORT_R];
    auto load = [&](int b0) {
#pragma unroll
        for (int j = 0; j < SORT_R; j++) {
            const int i = b0 + threadIdx.x + j * blockDim.x;
            v[j] = i < n ? sel[i] : -1;
        }
    };
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int b0 = 0; b0 < n; b0 += per) {
        load(b0);
#pragma unroll
        for (int j = 0; j < SORT_R; j++)
            if (v[j] >= 0) atomicAdd(&cnt[v[j]], 1);
    }
    __syncthreads();
    int *start = cur + E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        count[e] = cnt[e];
        cur[e] = cnt[e];
        if (tiles) start[e] = (cnt[e] + bt - 1) / bt;
    }
    __syncthreads();
    cu_warp0_exclusive_scan(cur, E, false);
    if (tiles) { /* (warp 0 scans both, one after the other) */
        __syncwarp();
        cu_warp0_exclusive_scan(start, E, true);
    }
    __syncthreads();
    if (tiles) cu_moe_tile_map(start, E, tiles, max_tiles);
    for (int e = threadIdx.x; e < E; e += blockDim.x) off[e] = cur[e]; /* (before the scatter below moves cur) */
    __syncthreads();
    for (int b0 = 0; b0 < n; b0 += per) {
        if (!one) load(b0);
#pragma unroll
        for (int j = 0; j < SORT_R; j++)
            if (v[j] >= 0) {
                const int i = b0 + threadIdx.x + j * blockDim.x, p = atomicAdd(&cur[v[j]], 1);
                src[p] = i;
                pos[i] = p;
            }
    }
}
void cu_moe_sort(cudaStream_t s, const int *sel, int n, int E, int *count, int *off, int *src, int *pos) {
    cu_go(k_moe_sort, 1, 1024, 2 * (size_t)E * sizeof(int), s)(sel, n, E, count, off, src, pos, 1, NULL, 0);
}
void cu_moe_sort_tiles(cudaStream_t s, const int *sel, int n, int E, int *count, int *off, int *src, int *pos, int bt, int *tiles,
                       int max_tiles) {
    cu_go(k_moe_sort, 1, 1024, (3 * (size_t)E + 1) * sizeof(int), s)(sel, n, E, count, off, src, pos, bt, tiles, max_tiles);
}

__global__ void k_swiglu(const float *g, const float *u, float *h, long long n) {
    CU_PDL();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) h[i] = silu_f(g[i]) * u[i];
}
void cu_swiglu(cudaStream_t s, const float *g, const float *u, float *h, long long n) {
    cu_go(k_swiglu, (unsigned)((n + 255) / 256), 256, 0, s)(g, u, h, n);
}

#define COMB_KEEP 8
__global__ void k_moe_combine(float *__restrict__ x, const float *__restrict__ add, const float *__restrict__ D, const int *__restrict__ pos,
                              const float *__restrict__ wt, int K, int H, const float *__restrict__ SD,
                              const float *__restrict__ sr, const float *__restrict__ nw, float eps, float *__restrict__ tout) {
    CU_PDL();
    __shared__ float sh[32];
    int t = blockIdx.x;
    float gs = SD ? sigm_f(sr[t]) : 0.f, ss = 0;
    float *xr = x + (size_t)t * H;
    /* a thread's first COMB_KEEP sums stay in registers for the norm, and their norm weights are
     * fetched before the block's sum: the norm's pass then reads nothing (it re-read x from L2) */
    float keep[COMB_KEEP] = { 0.f }, nwk[COMB_KEEP];
#pragma unroll
    for (int j = 0; j < COMB_KEEP; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        nwk[j] = nw && i < H ? nw[i] : 0.f;
    }
    int j = 0;
    for (int i = threadIdx.x; i < H; i += blockDim.x, j++) {
        float y = 0;
#pragma unroll 8
        for (int k = 0; k < K; k++) {
            int slot = t * K + k, row = pos ? pos[slot] : slot;
            y += wt[slot] * D[(size_t)row * H + i];
        }
        if (SD) y += gs * SD[(size_t)t * H + i];
        float v = (add ? xr[i] + add[(size_t)t * H + i] : xr[i]) + y; /* (x + add) first, as the unfused norm did */
        xr[i] = v;
#pragma unroll
        for (int q = 0; q < COMB_KEEP; q++) if (q == j) keep[q] = v;
        ss += v * v;
    }
    if (!nw) return;
    ss = block_sum(ss, sh);
    float r = 1.0f / sqrtf(ss / H + eps);
#pragma unroll
    for (int q = 0; q < COMB_KEEP; q++) {
        const int i = threadIdx.x + q * blockDim.x;
        if (i < H) tout[(size_t)t * H + i] = keep[q] * r * nwk[q];
    }
    for (int i = threadIdx.x + COMB_KEEP * blockDim.x; i < H; i += blockDim.x) tout[(size_t)t * H + i] = xr[i] * r * nw[i];
}
/* The same for prefill rows, four columns a thread: the token's K rows and weights are read once
 * into shared memory and a thread's K loads of D are 16-byte ones issued together (the form above,
 * a float a thread re-reading pos and wt for every column, waited on its loads: 28 us a layer at
 * 512 tokens). Each element of x sums in the same order, so x gets the same bits; the norm's sum
 * of squares goes in another order. */
#define COMB_KMAX 32
__global__ void k_moe_combine4(float *__restrict__ x, const float *__restrict__ add, const float *__restrict__ D,
                               const int *__restrict__ pos, const float *__restrict__ wt, int K, int H,
                               const float *__restrict__ SD, const float *__restrict__ sr, const float *__restrict__ nw,
                               float eps, float *__restrict__ tout, uint4 *__restrict__ tp) {
    CU_PDL();
    __shared__ float sh[32], ws[COMB_KMAX];
    __shared__ int rs[COMB_KMAX];
    const int t = blockIdx.x, H4 = H / 4;
    if ((int)threadIdx.x < K) {
        const int slot = t * K + threadIdx.x;
        rs[threadIdx.x] = pos ? pos[slot] : slot;
        ws[threadIdx.x] = wt[slot];
    }
    __syncthreads();
    const float gs = SD ? sigm_f(sr[t]) : 0.f;
    float ss = 0;
    float4 *xr = (float4 *)(x + (size_t)t * H);
#pragma unroll 2
    for (int i = threadIdx.x; i < H4; i += blockDim.x) {
        float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int k = 0; k < K; k++) {
            const float w = ws[k];
            const float4 d = ((const float4 *)(D + (size_t)rs[k] * H))[i];
            y.x += w * d.x; y.y += w * d.y; y.z += w * d.z; y.w += w * d.w;
        }
        if (SD) {
            const float4 d = ((const float4 *)(SD + (size_t)t * H))[i];
            y.x += gs * d.x; y.y += gs * d.y; y.z += gs * d.z; y.w += gs * d.w;
        }
        float4 v = xr[i];
        if (add) {
            const float4 a = ((const float4 *)(add + (size_t)t * H))[i];
            v.x += a.x; v.y += a.y; v.z += a.z; v.w += a.w;
        }
        v.x += y.x; v.y += y.y; v.z += y.z; v.w += y.w;
        xr[i] = v;
        ss += v.x * v.x;
        ss += v.y * v.y;
        ss += v.z * v.z;
        ss += v.w * v.w;
    }
    if (!nw) return;
    ss = block_sum(ss, sh);
    const float r = 1.0f / sqrtf(ss / H + eps);
    if (tp) xp_rows_out(x + (size_t)t * H, nw, r, H, tout + (size_t)t * H, tp + (size_t)t * (H / 8));
    else
        for (int i = threadIdx.x; i < H; i += blockDim.x) tout[(size_t)t * H + i] = x[(size_t)t * H + i] * r * nw[i];
}
void cu_moe_combine(cudaStream_t s, float *x, const float *add, const float *D, const int *pos, const float *wt, int T, int K,
                    int H, const float *SD, const float *sr, const float *nw, float eps, float *tout) {
    cu_moe_combine_p(s, x, add, D, pos, wt, T, K, H, SD, sr, nw, eps, tout, NULL);
}
int cu_moe_combine_p(cudaStream_t s, float *x, const float *add, const float *D, const int *pos, const float *wt, int T, int K,
                     int H, const float *SD, const float *sr, const float *nw, float eps, float *tout, uint16_t *tp) {
    if (tp && (!nw || !xp_out_ok(tp, H, T, tout, x, nw))) tp = NULL;
    if (T > 8 && K <= COMB_KMAX && H % 4 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)D & 15) == 0 && (!SD || ((uintptr_t)SD & 15) == 0) &&
        (!add || ((uintptr_t)add & 15) == 0))
        cu_go(k_moe_combine4, T, 256, 0, s)(x, add, D, pos, wt, K, H, SD, sr, nw, eps, tout, (uint4 *)tp);
    else {
        cu_go(k_moe_combine, T, T <= 8 ? 1024 : 256, 0, s)(x, add, D, pos, wt, K, H, SD, sr, nw, eps, tout);
        tp = NULL;
    }
    return tp != NULL;
}

/* ---- token choice ---- */
/* Greedy token and its log-probability in two launches: CU_ARGMAX_PARTS blocks each take a
 * contiguous range (its max, the lowest index holding it, and the sum of exp(v - max) over the
 * range), then one warp combines them. (One block of 1,024 threads walking the 248k logits
 * twice took ~70 us a token: the sampler's grid passes were faster than plain greedy.) NaN
 * counts as -inf; ties go to the lowest index. */
__global__ void k_argmax_part(const float *x, int V, float *part) {
    CU_PDL();
    __shared__ float sv[32], sh[32];
    __shared__ int si[32];
    int per = (V + gridDim.x - 1) / gridDim.x, i0 = blockIdx.x * per, i1 = min(V, i0 + per);
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        float v = x[i];
        if (v != v) v = -INFINITY;
        if (bi == 0x7fffffff || v > bv) { bv = v; bi = i; }
    }
    for (int o = 16; o; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    if (lane == 0) { sv[w] = bv; si[w] = bi; }
    __syncthreads();
    bv = sv[0]; bi = si[0];
    for (int i = 1; i < (int)(blockDim.x / WARP); i++)
        if (sv[i] > bv || (sv[i] == bv && si[i] < bi)) { bv = sv[i]; bi = si[i]; }
    float sum = 0;
    for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        float v = x[i];
        if (v == v && bv != -INFINITY) sum += expf(v - bv);
    }
    sum = block_sum(sum, sh);
    if (threadIdx.x == 0) {
        part[3 * blockIdx.x] = bv;
        part[3 * blockIdx.x + 1] = __int_as_float(bi);
        part[3 * blockIdx.x + 2] = sum;
    }
}
__global__ void k_argmax_fin(const float *part, int np, int *out) {
    CU_PDL();
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < np; i += WARP) {
        float v = part[3 * i];
        int k = __float_as_int(part[3 * i + 1]);
        if (k != 0x7fffffff && (bi == 0x7fffffff || v > bv || (v == bv && k < bi))) { bv = v; bi = k; }
    }
    for (int o = 16; o; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi != 0x7fffffff && (bi == 0x7fffffff || ov > bv || (ov == bv && oi < bi))) { bv = ov; bi = oi; }
    }
    float sum = 0;
    for (int i = threadIdx.x; i < np; i += WARP) {
        float v = part[3 * i];
        if (v != -INFINITY && bv != -INFINITY) sum += part[3 * i + 2] * expf(v - bv);
    }
    sum = warp_sum(sum);
    if (threadIdx.x == 0) {
        out[0] = bi == 0x7fffffff ? 0 : bi;
        out[1] = __float_as_int(-logf(sum));
    }
}
/* (max, its lowest index, sum of exp(v - max)) pairs joined: the larger max (the lower index on
 * ties; bi 0x7fffffff: none yet), each sum rescaled to it (a sum under a -inf max is 0) */
__device__ __forceinline__ void amx_join(float &bv, int &bi, float &sum, float ov, int oi, float os) {
    const float m = fmaxf(bv, ov);
    const float s1 = bv == -INFINITY ? 0.f : sum * expf(bv - m), s2 = ov == -INFINITY ? 0.f : os * expf(ov - m);
    if (oi != 0x7fffffff && (bi == 0x7fffffff || ov > bv || (ov == bv && oi < bi))) { bv = ov; bi = oi; }
    sum = s1 + s2;
}
/* The first pass in one read: a thread keeps its running maximum, the lowest index holding it and
 * the sum of exp(v - max) rescaled when the maximum rises, over CU_ARGMAX_PARTS1 blocks (~4 logits
 * a thread at the 248k vocabulary, their loads issued together). k_argmax_part read its 64 ranges
 * twice, ~15 loads a thread each time: 14 us on the decode step's path (bench/RESULTS.md session 18). */
__global__ void __launch_bounds__(256) k_argmax_part1(const float *__restrict__ x, int V, float *part) {
    CU_PDL();
    __shared__ float sv[8], ss[8];
    __shared__ int si[8];
    const int per = (V + gridDim.x - 1) / gridDim.x, i0 = blockIdx.x * per, i1 = min(V, i0 + per);
    float bv = -INFINITY, sum = 0.f;
    int bi = 0x7fffffff;
#pragma unroll 4
    for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        float v = x[i];
        if (v != v) v = -INFINITY; /* NaN: never chosen, not in the sum */
        amx_join(bv, bi, sum, v, i, 1.f);
    }
    for (int o = 16; o; o >>= 1)
        amx_join(bv, bi, sum, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o),
                 __shfl_xor_sync(0xffffffffu, sum, o));
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    if (lane == 0) { sv[w] = bv; si[w] = bi; ss[w] = sum; }
    __syncthreads();
    if (threadIdx.x) return;
    for (int k = 1; k < (int)(blockDim.x / WARP); k++) amx_join(bv, bi, sum, sv[k], si[k], ss[k]);
    part[3 * blockIdx.x] = bv;
    part[3 * blockIdx.x + 1] = __int_as_float(bi);
    part[3 * blockIdx.x + 2] = sum;
}
void cu_argmax(cudaStream_t s, const float *logits, int V, int *out, float *part) {
    static int one = -1; /* LILY_CU_ARGMAX1=0: the two-read first pass, for measuring */
    if (cu_env_flag(&one, "LILY_CU_ARGMAX1", 1)) {
        cu_go(k_argmax_part1, CU_ARGMAX_PARTS1, 256, 0, s)(logits, V, part);
        cu_go(k_argmax_fin, 1, WARP, 0, s)(part, CU_ARGMAX_PARTS1, out);
        return;
    }
    cu_go(k_argmax_part, CU_ARGMAX_PARTS, 256, 0, s)(logits, V, part);
    cu_go(k_argmax_fin, 1, WARP, 0, s)(part, CU_ARGMAX_PARTS, out);
}

/* ---- L2 prefetch (cu_l2_prefetch) ---- */
#define PF_MAX 21 /* regions: three (codes, scales, biases) for each of up to seven matrices */
#define PF_CHUNK 4096 /* bytes a bulk prefetch */
typedef struct {
    int mode;                    /* LILY_CU_PF_MODE (measuring): 0 bulk, 1 a line at a time evict_last, 2 a line */
    const char *p[PF_MAX];       /* region start (16-byte aligned) */
    unsigned long long n[PF_MAX]; /* bytes, a multiple of 16 */
    long long es[PF_MAX];        /* bytes between experts (with sel) */
    const int *sel;              /* [gridDim.y] experts, or NULL */
    const float *rlog;           /* or the router's logits [E]: the block routes itself (top K) */
    int E, K;
    int nr;
} pf_args;

__global__ void __launch_bounds__(128) k_l2_prefetch(pf_args a) {
    CU_PDL();
    __shared__ int rs[WARP];
    __shared__ float rw[WARP];
    if (a.rlog) {
        if (threadIdx.x < WARP) route_ld<8>(a.rlog, a.E, a.K, rs, rw);
        __syncthreads();
    }
    const long long e = a.rlog ? rs[blockIdx.y] : a.sel ? a.sel[blockIdx.y] : 0;
    const unsigned long long i0 = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x, step = (unsigned long long)gridDim.x * blockDim.x;
    for (int r = 0; r < a.nr; r++) {
        const char *base = a.p[r] + e * a.es[r];
        for (unsigned long long c = i0 * PF_CHUNK; c < a.n[r]; c += step * PF_CHUNK) {
            const unsigned long long left = a.n[r] - c;
            const unsigned sz = (unsigned)(left < PF_CHUNK ? left : PF_CHUNK);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            if (a.mode == 0) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + c), "r"(sz) : "memory");
            else if (a.mode == 1)
                for (unsigned o = 0; o < sz; o += 128) asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(base + c + o) : "memory");
            else
                for (unsigned o = 0; o < sz; o += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(base + c + o) : "memory");
#else
            (void)base; (void)sz; /* (the emulator and older GPUs: nothing to do) */
#endif
        }
    }
}

/* LILY_CU_PREFETCH=0: decode's L2 prefetch off (which of its forks run: LILY_CU_PF_PARTS, cu_backend.cu) */
int cu_prefetch_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_PREFETCH", 1);
}

static void l2_prefetch(cudaStream_t s, int n, const dmat *const *W, const int *sel, int slots, const float *rlog, int E, int K) {
    pf_args a;
    memset(&a, 0, sizeof a);
    unsigned long long tot = 0;
    LILY_ASSERT(n >= 0 && 3 * n <= PF_MAX);
    for (int i = 0; i < n; i++) {
        const dmat *m = W[i];
        const unsigned long long wb = cu_mat_w_bytes(m->type, m->rows, m->cols, m->bits),
                                 sb = cu_mat_s_bytes(m->type, m->rows, m->cols, m->group, m->sbt);
        const void *ps[3] = { m->w, m->s, m->b };
        const unsigned long long ns[3] = { wb, sb, sb };
        const long long es[3] = { m->ew, m->es, m->es };
        for (int k = 0; k < 3; k++) {
            /* whole 16-byte units inside the buffer: a bulk prefetch wants both aligned */
            const uintptr_t p0 = ((uintptr_t)ps[k] + 15) & ~(uintptr_t)15, end = ((uintptr_t)ps[k] + ns[k]) & ~(uintptr_t)15;
            if (!ps[k] || end <= p0) continue;
            a.p[a.nr] = (const char *)p0;
            a.n[a.nr] = end - p0;
            a.es[a.nr] = es[k];
            tot += end - p0;
            a.nr++;
        }
    }
    if (!a.nr) return;
    a.sel = sel;
    a.rlog = rlog; a.E = E; a.K = K;
    if (rlog) slots = K;
    static int env = INT_MIN;
    a.mode = cu_env_int(&env, "LILY_CU_PF_MODE", 0);
    const unsigned long long chunks = (tot + PF_CHUNK - 1) / PF_CHUNK;
    int gx = (int)((chunks + 127) / 128);
    gx = gx < 1 ? 1 : gx > 32 ? 32 : gx;
    cu_go(k_l2_prefetch, dim3(gx, sel || rlog ? slots : 1), 128, 0, s)(a);
}
void cu_l2_prefetch(cudaStream_t s, int n, const dmat *const *W, const int *sel, int slots) { l2_prefetch(s, n, W, sel, slots, NULL, 0, 0); }
void cu_l2_prefetch_routed(cudaStream_t s, int n, const dmat *const *W, const float *rlog, int E, int K) {
    LILY_ASSERT(E <= 8 * WARP && K <= WARP);
    l2_prefetch(s, n, W, NULL, 0, rlog, E, K);
}
/* LILY_CU_ROUTE_FUSED=0: decode's top-k in its own launch again, for measuring */
int cu_route_fused(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_ROUTE_FUSED", 1);
}

__global__ void k_set_int(int *p, int v) {
    CU_PDL(); *p = v; }
void cu_set_int(cudaStream_t s, int *p, int v) { cu_go(k_set_int, 1, 1, 0, s)(p, v); }
const void *cu_probe_kernel(void) { return (const void *)k_set_int; }

__global__ void k_step_advance(const int *tok, int *ids, int *pos, int *step, int *ring, int ring_n) {
    CU_PDL();
    int slot = *step % ring_n;
    ids[0] = tok[0];
    ring[2 * slot] = tok[0];
    ring[2 * slot + 1] = tok[1];
    __threadfence_system();
    *pos += 1;
    *step += 1;
}
void cu_step_advance(cudaStream_t s, const int *tok, int *ids, int *pos, int *step, int *ring, int ring_n) {
    cu_go(k_step_advance, 1, 1, 0, s)(tok, ids, pos, step, ring, ring_n);
}
