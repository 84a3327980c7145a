/* Device helpers shared by the kernel files split from cu_kernels.cu (cu_matmul.cu, cu_mvq.cu,
 * cu_gdn.cu, cu_attn.cu, cu_moe.cu and cu_kernels.cu itself). static: each unit its own copy, so an
 * emulator mutant (tests/cuda/emu/cu2cpp.py) can break one unit's alone (one inline definition shared
 * by the units would let the linker keep the intact one). */
#ifndef LILY_CU_KERN_H
#define LILY_CU_KERN_H
#include "cuda/cu_dev.h"

/* Code J of a word as the float 1 + q/16 (4-bit) or 1 + q/256 (8-bit): the code is moved
 * into the top of the mantissa of 1.0, a shift and an and-or instead of an int-to-float
 * conversion, which runs at a quarter of the FMA rate and bounded the matrix-vector kernels.
 * Exact; the caller folds the 1 into the group bias: sum q x = 16 (sum f x - sum x). */
template <int J>
static __device__ __forceinline__ float q4_f1(uint32_t v) {
    uint32_t t = J <= 4 ? v << (19 - 4 * J) : v >> (4 * J - 19);
    return __uint_as_float((t & 0x00780000u) | 0x3F800000u);
}
template <int J>
static __device__ __forceinline__ float q8_f1(uint32_t v) {
    uint32_t t = J <= 1 ? v << (15 - 8 * J) : v >> (8 * J - 15);
    return __uint_as_float((t & 0x007F8000u) | 0x3F800000u);
}


/* Block-wide sum; every thread gets the result. sh needs 32 floats. */
static inline __device__ float block_sum(float v, float *sh) {
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
static __device__ __forceinline__ void load8(const dmat &m, int e, int r, int c, float out[8]) {
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

/* A warp's softmax over E logits and its top-K (ties to the lower expert), normalized weights. */
static inline __device__ void route_warp(const float *lg, int E, int K, float *p, int *sel, float *wt) {
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

/* A row's last pass where its output is also a GEMM's packed input: y[c] = x[c] r w[c], and the
 * same values packed (xp_chunk), a thread a chunk of 8 columns. The block's x is complete (the
 * caller's block_sum synced it). n % 128 == 0 and the rows 16-byte aligned (xp_out_ok). */
static __device__ __forceinline__ void xp_rows_out(const float *xr, const float *w, float r, int n, float *yr, uint4 *pr) {
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
static inline int xp_out_ok(const uint16_t *yp, int n, int T, const float *y, const float *x, const float *w) {
    return n % 128 == 0 && T > 8 && (long long)T * n < (1ll << 31) && !((uintptr_t)yp & 15) && !((uintptr_t)y & 15) &&
           !((uintptr_t)x & 15) && !((uintptr_t)w & 15);
}

/* cu_matmul.cu's column-sliced fp32 products (cu_matmul_exact; the MoE's exact router too): the
 * number of slices left in scr ([S][T][ldy], S >= 2) for the caller to add in slice order, or 1
 * when Y is written */
int cu_exact_parts(cudaStream_t s, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy, float *scr,
                   size_t scr_floats);

#endif
