/* The prefill router's logits, Y[t][e] = sum_k X[t][k] W[e][k], on the tensor cores to ~fp32
 * accuracy, from a copy of the router made at load (cu_router_frag): its codes as floats in the mma's
 * A-fragment order, and each (row, group)'s scale and bias in fp32.
 *
 * Why: k_mm_tc3 (cu_matmul.cu), which reads the router in its stored form, took ~22 us a layer
 * at 512 tokens on the H200 (bench/RESULTS.md session 23) for ~0.27 G multiply-adds: each thread
 * loaded its own weight and input rows (an 8-bit row dequantized per thread, 32 rows a warp
 * instruction), stored them transposed into shared memory and split every fragment it read, so
 * the L1 ran at 71% with a quarter of the warps resident. Here a stage is two coalesced cp.async
 * copies and a weight fragment one 16-byte shared load, the first stages' weights requested
 * before the launch's wait on its predecessor.
 *
 * The products in the code domain: a code (an integer below 2^8) is exact in TF32, so q.x takes
 * two mma (q x_hi + q x_lo, x split as cu_tf32_split) where a dequantized weight takes three; a
 * group's sums then become s (sum q x) + b (sum x), the inputs' group sums (xs) added up by the
 * block from the staged inputs. A bf16 or fp16 router is exact in TF32 as it is: its values go in
 * as the codes, with s = 1, b = 0. The sums' order differs from the CPU's (w = q s + b, then the
 * dot product): fp32 rounding either way. Measured on the H200 (session 23): the dequantized
 * three-mma form 13.2 us, this one 14.0, codes as bytes 14.3: not bound by the mma pipe or the
 * copies' bytes but by latency at two blocks an SM; at four an SM (three stages, 128 registers)
 * and 16 slices, 14.0 against 15.7 at 8, pp512 +0.7%. The code form is kept: no weight split, and
 * a bf16 router goes in as it is.
 *
 * Block: 128 threads, 64 experts x 64 tokens, one column slice of kslice (blockIdx.z: partials
 * Y + z pstride as k_mm_tc3's, summed by k_router_topk in slice order). Warp w: experts
 * 32 (w % 2) .. + 31 (two m16 tiles), tokens 32 (w / 2) .. + 31 (four n8 tiles). */
#include "cuda/cu_common.h"
#include "cuda/cu_dev.h"
#include <limits.h>

#define RT_KS 32                      /* columns a stage: four k8 steps */
#define RT_NS 3                       /* stages in the ring, RT_NS - 1 in flight while one computes */
#define RT_XP 36                      /* an input row's pitch in floats: 4 mod 32 puts a B fragment's loads in 32 banks */
#define RT_WF (4 * 4 * 128)           /* a stage's weight fragments: [4 m16 tiles][4 k8][32 lanes][4] floats */
#define RT_STAGE (64 * RT_XP + RT_WF) /* floats a stage: the inputs [64 tokens][RT_XP], then the fragments */
#define RT_WANT 512                   /* blocks the column split aims at (four an SM on the H200's 132, one wave) */

static size_t rt_smem(void) { return sizeof(float) * (RT_NS * RT_STAGE + 2 * 64); }

/* the copy's group: the router's own where quantized (codes of 2, 4 or 8 bits), 64 (or 32) columns with
 * s = 1, b = 0 for bf16 and fp16 values; 0 where the copy does not take the matrix */
static int rt_group(int type, int bits, int group, int rows, int cols) {
    if (rows < 64 || rows % 64 || cols < RT_KS || cols % RT_KS) return 0;
    int G = 0;
    if (type == LW_Q && (bits == 2 || bits == 4 || bits == 8)) G = group;
    else if (type == LW_BF16 || type == LW_F16) G = cols % 64 ? 32 : 64;
    return G >= RT_KS && G % RT_KS == 0 && cols % G == 0 ? G : 0;
}

/* floats before the copy's (scale, bias) pairs: the rows x cols codes */
static size_t rt_sb_at(int rows, int cols) { return (size_t)rows * cols; }

size_t cu_router_frag_floats(int type, int bits, int group, int rows, int cols) {
    const int G = rt_group(type, bits, group, rows, cols);
    return G ? (size_t)rows * cols + 2 * (size_t)rows * (cols / G) : 0;
}

/* Lane 4g + q of m16 tile mt at k8 step k holds rf[((mt (cols / 8) + k) 32 + lane) 4 + i] = code
 * [16 mt + g + 8 (i & 1)][8 k + q + 4 (i >> 1)] (a0..a3 of tc_mma_tf32), so a warp's tile is one 512-byte
 * read; then sb [rows][cols / G] (scale, bias). One thread a lane's four codes, then a (row, group). */
__global__ void k_router_frag(dmat m, int G, float *rf, float2 *sb) {
    const int c8 = m.cols / 8, ng = m.cols / G;
    const size_t n = (size_t)(m.rows / 16) * c8 * 32, ns = (size_t)m.rows * ng;
    auto code = [&](int r, int c) -> float {
        const size_t el = (size_t)r * m.cols + c;
        if (m.type == LW_Q) {
            const uint32_t w = ((const uint32_t *)m.w)[el * m.bits / 32];
            return (float)((w >> (el * m.bits % 32)) & ((1u << m.bits) - 1));
        }
        const uint16_t h = ((const uint16_t *)m.w)[el];
        return m.type == LW_BF16 ? bf2f(h) : h2f(h);
    };
    for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < n + ns; x += (size_t)gridDim.x * blockDim.x) {
        if (x < n) {
            const int lane = (int)(x & 31), g = lane >> 2, q = lane & 3, k = (int)((x >> 5) % c8), mt = (int)((x >> 5) / c8);
            const int r = 16 * mt + g, c = 8 * k + q;
            *(float4 *)(rf + 4 * x) = make_float4(code(r, c), code(r + 8, c), code(r, c + 4), code(r + 8, c + 4));
        } else {
            const size_t i = x - n;
            float2 v = make_float2(1.f, 0.f);
            if (m.type == LW_Q) v = make_float2(ld_sb((const char *)m.s, m.sbt, i), ld_sb((const char *)m.b, m.sbt, i));
            sb[i] = v;
        }
    }
}

void cu_router_frag(cudaStream_t s, const dmat *W, float *rf) {
    cu_go(k_router_frag, 512, 256, 0, s)(*W, rt_group(W->type, W->bits, W->group, W->rows, W->cols), rf,
                                         (float2 *)(rf + rt_sb_at(W->rows, W->cols)));
}

__global__ void __launch_bounds__(128, 4) k_rtr(const float *__restrict__ rf, const float2 *__restrict__ sb, int C, int G,
                                             const float *__restrict__ X, int ldx, int T, float *__restrict__ Y, int ldy,
                                             int kslice, size_t pstride) {
    extern __shared__ __align__(16) float sm[];
    float *xs = sm + RT_NS * RT_STAGE; /* [2][64] the tokens' input sums over a group, by group parity */
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g8 = lane >> 2, q = lane & 3;
    const int e0 = blockIdx.x * 64, t0 = blockIdx.y * 64, mt0 = 2 * (w & 1), wt = 32 * (w >> 1);
    const int kbeg = blockIdx.z * kslice, nst = kslice / RT_KS, c8 = C / 8, sg = G / RT_KS, ng = C / G;
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
    float acc[2][4][4] = {};                  /* experts e0 + 16 (mt0 + i) + g8 (+ 8), tokens t0 + wt + 8j + 2q (+ 1) */
    float ph[2][4][4] = {}, pl[2][4][4] = {}; /* this group's q x_hi and q x_lo (apart: independent mma) */
    float2 sr[2][2];                          /* this group's (scale, bias) of rows i, + 8 h */
    /* a group's sums into acc: s (q.x) + b (sum x), after the barrier that made the group's xs visible */
    auto fold = [&](int buf) {
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float2 v = sr[i][e >> 1];
                    acc[i][j][e] += v.x * (ph[i][j][e] + pl[i][j][e]) + v.y * xs[64 * buf + wt + 8 * j + 2 * q + (e & 1)];
                    ph[i][j][e] = pl[i][j][e] = 0.f;
                }
    };
    for (int s = 0; s < nst; s++) {
        cu_cp_wait<RT_NS - 2>();
        __syncthreads(); /* stage s in; stage s - 1, whose buffer the next issue refills, is done; its xs in */
        const int sn = s + RT_NS - 1, gi = s / sg;
        if (sn < nst) {
            issue_w(sn % RT_NS, kbeg + sn * RT_KS);
            issue_x(sn % RT_NS, kbeg + sn * RT_KS);
        }
        cu_cp_commit();
        if (s % sg == 0) {
            if (s) fold((gi - 1) & 1);
            const int grp = (kbeg + s * RT_KS) / G;
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int h = 0; h < 2; h++) sr[i][h] = sb[(size_t)(e0 + 16 * (mt0 + i) + g8 + 8 * h) * ng + grp];
        }
        const float *Xs = sm + (s % RT_NS) * RT_STAGE, *Ws = Xs + 64 * RT_XP;
        { /* the stage's share of each token's group sum: two threads a token, 16 columns each */
            const float4 *xr = (const float4 *)(Xs + (tid >> 1) * RT_XP + 16 * (tid & 1));
            float v = 0.f;
#pragma unroll
            for (int m = 0; m < 4; m++) {
                const float4 a = xr[m];
                v += (a.x + a.y) + (a.z + a.w);
            }
            v += __shfl_xor_sync(0xffffffffu, v, 1);
            float *xb = xs + 64 * (gi & 1) + (tid >> 1);
            if (!(tid & 1)) *xb = s % sg ? *xb + v : v;
        }
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
                const uint4 a = *(const uint4 *)(Ws + ((mt0 + i) * 4 + kk) * 128 + lane * 4); /* codes: exact in TF32 */
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    tc_mma_tf32(ph[i][j], a.x, a.y, a.z, a.w, bh[j][0], bh[j][1]);
                    tc_mma_tf32(pl[i][j], a.x, a.y, a.z, a.w, bl[j][0], bl[j][1]);
                }
            }
        }
    }
    __syncthreads(); /* the last group's xs */
    fold(((nst - 1) / sg) & 1);
    tc_store_32x32(acc, Y, ldy, e0 + 16 * mt0, t0 + wt, INT_MAX, T); /* (the rows: whole 64-row blocks) */
}

int cu_router_tc_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_RTR", 1);
}

static int rt_force = 0; /* cu_router_tc_splits: 0 the default choice */
void cu_router_tc_splits(int s) { rt_force = s; }

int cu_router_tc(cudaStream_t s, const dmat *W, const float *rf, const float *X, int ldx, int T, float *Y, int ldy, float *scr,
                 size_t scr_floats) {
    const int E = W->rows, C = W->cols, G = rt_group(W->type, W->bits, W->group, E, C);
    if (!rf || !G || T <= 8 || !cu_router_tc_enabled() || ldx % 4 || ((uintptr_t)X & 15)) return 0;
    static int attr = 0; /* 1 set, -1 refused */
    if (!attr) attr = cudaFuncSetAttribute(k_rtr, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)rt_smem()) == cudaSuccess ? 1 : -1;
    if (attr < 0) { cudaGetLastError(); return 0; }
    static int env = INT_MIN; /* LILY_CU_RTR_SPLITS: the column slices, for measuring */
    const int gx = E / 64, gy = (T + 63) / 64, groups = C / G;
    int S = rt_force > 0 ? rt_force : cu_env_int(&env, "LILY_CU_RTR_SPLITS", 0);
    if (S < 1) S = RT_WANT / (gx * gy);
    S = S < 1 ? 1 : S > 16 ? 16 : S;
    while (S > 1 && (groups % S || (size_t)S * T * ldy > scr_floats)) S--; /* whole groups a slice; room for the partials */
    const float2 *sb = (const float2 *)(rf + rt_sb_at(E, C));
    cu_go(k_rtr, dim3(gx, gy, S), 128, rt_smem(), s)(rf, sb, C, G, X, ldx, T, S > 1 ? scr : Y, ldy, C / S, (size_t)T * ldy);
    return S;
}
