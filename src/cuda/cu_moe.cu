/* The MoE's routing (softmax and top-k), the on-GPU sort of slots by expert, SwiGLU and the weighted
 * combine, with their launchers. */
#include "cuda/cu_common.h"
#include "cuda/cu_dev.h"
#include "cuda/cu_kern.h"
#include <limits.h>
#include <cuda_fp16.h>
#include <mma.h>
using namespace nvcuda;
#include <math.h>
#include <stdlib.h>

/* ---- MoE ---- */
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
    if (!S) S = cu_exact_parts(s, W, X, ldx, T, logits, E, scr, scr_floats);
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
