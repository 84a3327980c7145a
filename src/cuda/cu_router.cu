/* The prefill router's logits, Y[t][e] = sum_k X[t][k] W[e][k], on the tensor cores to ~fp32
 * accuracy (each operand split in two TF32 parts, three mma: cu_tf32_split), from a copy of the
 * router's weights kept in fp32 in the mma's A-fragment order (cu_router_frag, made at load).
 *
 * Why: k_mm_tc3 (cu_kernels.cu), which reads the router in its stored form, took ~22 us a layer
 * at 512 tokens on the H200 (bench/RESULTS.md session 23) for ~0.8 G multiply-adds: each thread
 * loaded its own weight and input rows (an 8-bit row dequantized per thread, 32 rows a warp
 * instruction), stored them transposed into shared memory and split every fragment it read, so
 * the L1 ran at 71% with a quarter of the warps resident. Here a stage is two coalesced
 * cp.async copies, the weights' fragments are one 16-byte shared load a tile, and the first
 * stages' weights are requested before the launch's wait on its predecessor.
 *
 * Block: 128 threads, 64 experts x 64 tokens, one column slice of kslice (blockIdx.z: partials
 * Y + z pstride as k_mm_tc3's, summed by k_router_topk in slice order). Warp w: experts
 * 32 (w % 2) .. + 31 (two m16 tiles), tokens 32 (w / 2) .. + 31 (four n8 tiles). */
#include "cuda/cu_common.h"
#include "cuda/cu_dev.h"
#include <limits.h>

#define RT_KS 32                      /* columns a stage: four k8 steps */
#define RT_NS 4                       /* stages in the ring, RT_NS - 1 in flight while one computes */
#define RT_XP 36                      /* an input row's pitch in floats: 4 mod 32 puts a B fragment's loads in 32 banks */
#define RT_WF (4 * 4 * 128)           /* a stage's weight fragments: [4 m16 tiles][4 k8][32 lanes][4] floats */
#define RT_STAGE (64 * RT_XP + RT_WF) /* floats a stage: the inputs [64 tokens][RT_XP], then the fragments */
#define RT_WANT 256                   /* blocks the column split aims at (two an SM on the H200's 132) */

static size_t rt_smem(void) { return sizeof(float) * RT_NS * RT_STAGE; }

__global__ void __launch_bounds__(128) k_rtr(const float *__restrict__ rf, int C, const float *__restrict__ X, int ldx, int T,
                                             float *__restrict__ Y, int ldy, int kslice, size_t pstride) {
    extern __shared__ __align__(16) float sm[];
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g8 = lane >> 2, q = lane & 3;
    const int e0 = blockIdx.x * 64, t0 = blockIdx.y * 64, mt0 = 2 * (w & 1), wt = 32 * (w >> 1);
    const int kbeg = blockIdx.z * kslice, nst = kslice / RT_KS, c8 = C / 8;
    Y += (size_t)blockIdx.z * pstride;
    /* a thread's copies: chunks tid + 128 i (i < 4) of each half of a stage; the fragments of m16
     * tile mt for four k8 steps are 2 KB contiguous in rf */
    auto issue_w = [&](int st, int k0) {
        float *Ws = sm + st * RT_STAGE + 64 * RT_XP;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int c = tid + 128 * i, mt = c >> 7, off = c & 127;
            cu_cp<16>(Ws + mt * 512 + off * 4, rf + ((size_t)(e0 / 16 + mt) * c8 + k0 / 8) * 128 + off * 4);
        }
    };
    auto issue_x = [&](int st, int k0) {
        float *Xs = sm + st * RT_STAGE;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int c = tid + 128 * i, r = c >> 3, c4 = c & 7;
            if (t0 + r < T) cu_cp<16>(Xs + r * RT_XP + 4 * c4, X + (size_t)(t0 + r) * ldx + k0 + 4 * c4);
            else *(float4 *)(Xs + r * RT_XP + 4 * c4) = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    };
    /* the weights do not depend on the launch before: their first stages go out before its wait */
    for (int s = 0; s < RT_NS - 1 && s < nst; s++) issue_w(s, kbeg + s * RT_KS);
    CU_PDL();
    for (int s = 0; s < RT_NS - 1; s++) { /* a group a stage (empty past the slice) keeps the wait's count fixed */
        if (s < nst) issue_x(s, kbeg + s * RT_KS);
        cu_cp_commit();
    }
    float acc[2][4][4] = {}; /* experts e0 + 16 (mt0 + i) + g8 (+ 8), tokens t0 + wt + 8j + 2q (+ 1) */
    for (int s = 0; s < nst; s++) {
        cu_cp_wait<RT_NS - 2>();
        __syncthreads(); /* stage s in; stage s - 1, whose buffer the next issue refills, is done */
        const int sn = s + RT_NS - 1;
        if (sn < nst) {
            issue_w(sn % RT_NS, kbeg + sn * RT_KS);
            issue_x(sn % RT_NS, kbeg + sn * RT_KS);
        }
        cu_cp_commit();
        const float *Xs = sm + (s % RT_NS) * RT_STAGE, *Ws = Xs + 64 * RT_XP;
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            uint32_t bh[4][2], bl[4][2];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float *xr = Xs + (wt + 8 * j + g8) * RT_XP + 8 * kk + q;
                cu_tf32_split(xr[0], bh[j][0], bl[j][0]);
                cu_tf32_split(xr[4], bh[j][1], bl[j][1]);
            }
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const float4 a = *(const float4 *)(Ws + ((mt0 + i) * 4 + kk) * 128 + lane * 4);
                uint32_t ah[4], al[4];
                cu_tf32_split(a.x, ah[0], al[0]);
                cu_tf32_split(a.y, ah[1], al[1]);
                cu_tf32_split(a.z, ah[2], al[2]);
                cu_tf32_split(a.w, ah[3], al[3]);
                tc_mma_3xtf32<4>(acc[i], acc[i], ah, al, bh, bl);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e0 + 16 * (mt0 + i) + g8 + 8 * (e >> 1), t = t0 + wt + 8 * j + 2 * q + (e & 1);
                if (t < T) Y[(size_t)t * ldy + r] = acc[i][j][e];
            }
}

int cu_router_frag_ok(int rows, int cols) { return rows > 0 && cols > 0 && rows % 64 == 0 && cols % RT_KS == 0; }

int cu_router_tc_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_RTR", 1);
}

static int rt_force = 0; /* cu_router_tc_splits: 0 the default choice */
void cu_router_tc_splits(int s) { rt_force = s; }

int cu_router_tc(cudaStream_t s, const float *rf, int E, int C, const float *X, int ldx, int T, float *Y, int ldy, float *scr,
                 size_t scr_floats) {
    if (!rf || T < 1 || !cu_router_frag_ok(E, C) || ldx % 4 || ((uintptr_t)X & 15)) return 0;
    static int attr = 0; /* 1 set, -1 refused */
    if (!attr) attr = cudaFuncSetAttribute(k_rtr, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)rt_smem()) == cudaSuccess ? 1 : -1;
    if (attr < 0) { cudaGetLastError(); return 0; }
    static int env = INT_MIN; /* LILY_CU_RTR_SPLITS: the column slices, for measuring */
    const int gx = E / 64, gy = (T + 63) / 64, steps = C / RT_KS;
    int S = rt_force > 0 ? rt_force : cu_env_int(&env, "LILY_CU_RTR_SPLITS", 0);
    if (S < 1) S = RT_WANT / (gx * gy);
    S = S < 1 ? 1 : S > 16 ? 16 : S;
    while (S > 1 && (steps % S || (size_t)S * T * ldy > scr_floats)) S--; /* whole stages a slice; room for the partials */
    cu_go(k_rtr, dim3(gx, gy, S), 128, rt_smem(), s)(rf, C, X, ldx, T, S > 1 ? scr : Y, ldy, C / S, (size_t)T * ldy);
    return S;
}
