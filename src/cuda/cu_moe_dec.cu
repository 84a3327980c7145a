/* Decode's MoE tail in one launch (k_moe_down_comb): the chosen experts' down projections, the
 * shared expert's (riding as slot K), their weighted sum into the residual, and the next layer's
 * input norm.
 *
 * Why: the down launch (a block a row tile and slot) wrote each slot's [H] rows to memory, and a
 * one-block combine read them back, summed them and normalized: a launch a layer that ran at its
 * own latency (7.5 us under Nsight for 4.6 MB, against a 2 us launch floor; bench/RESULTS.md).
 * Here a warp owns whole output rows across every slot, so the weighted sum never leaves its
 * registers, and the last block to finish (a counter, as the fused top-k's) normalizes.
 *
 * A block stages every slot's input, h_k = silu(gate_k) * up_k, scaled as k_mvq4 stages its one
 * input (mvq_scale: the codes become floats without conversions) with each chunk's sum. A warp's
 * lanes split into 32 / LPR groups of LPR lanes (LPR >= the row's chunks); group g takes slots g,
 * g + 32 / LPR, ... and lane `sub` of a group chunk sub of the row, so one pass over a row issues
 * the loads of several slots before any product (DC_NL of them in flight a lane). Chunks and
 * groups are powers of two, so the kernel's index arithmetic is shifts: a first form that divided
 * by run-time counts spent more instructions on addresses than on products (Nsight's SASS).
 *
 * Measured on the H200 (bench/RESULTS.md, session 12): 16.4 us a layer under Nsight, as long as
 * the down (9.0) and the combine (7.5) together, and tg128 375 against 391 with the two launches,
 * whose second one's start the decode graph's programmatic launch hides. What it costs: every
 * block stages all K + 1 inputs (256 blocks x 36 KB of L2 reads, twice the weights' bytes), a
 * chain of dependent round trips (sel, then the weights; the fence and counter; the last block's
 * reads of x), and 16 warps an SM. So the forward pass leaves it off (LILY_CU_DOWNCOMB=1 turns it
 * on); the kernel test keeps it exact. A form that pays off would stage each input once (the
 * gate|up launch writing h, fp16) and leave the norm to the next launch's staging. */
#include "cuda/cu_dev.h"

#define DC_WARPS 8
#define DC_NL 8    /* slots a lane loads before it multiplies */
#define DC_SMAX 32 /* slots: top-k plus the shared expert */
#define DC_ST 4    /* float4s of gate and up a thread loads at once when staging */

typedef struct {
    dmat m;            /* the routed experts' down, [E][H][I] */
    dmat ms;           /* the shared expert's down, [H][I] (slot K when ns > K) */
    const int *sel;    /* [K] chosen experts */
    const float *wt;   /* [K] their weights */
    const float *hg;   /* [ns][I] gate outputs */
    const float *hu;   /* [ns][I] up outputs */
    const float *sr;   /* [1] the shared expert's gate logit (ns > K) */
    float *x;          /* [H] the residual, updated in place */
    const float *add;  /* [H] the mixer's output, not yet added (the fused router group's), or NULL */
    const float *nw;   /* [H] the next norm's weight */
    float *tout;       /* [H] rmsnorm(x) * nw */
    unsigned *count;   /* finished blocks; 0 between launches */
    float eps;
    int K, ns;         /* routed slots, all slots */
} dc_args;

/* A lane's items i0 .. i0 + DC_NL - 1 of a row (item i: slot grp + i * 32 / LPR, the lane's chunk
 * sub): their codes and group constants. lng: log2 of a row's groups, cg: the chunk's group. */
template <int LPR, int SBT>
__device__ __forceinline__ void dc_load(const dc_args &a, int row, int i0, int grp, int sub, int lng, int cg, uint4 (&q)[DC_NL],
                                        float (&sc)[DC_NL], float (&bi)[DC_NL]) {
    const int nch = a.m.cols / 32, gi = (row << lng) + cg;
#pragma unroll
    for (int u = 0; u < DC_NL; u++) {
        const int k = grp + (WARP / LPR) * (i0 + u);
        q[u] = make_uint4(0, 0, 0, 0);
        sc[u] = bi[u] = 0.f;
        if (k < a.ns && sub < nch) {
            const dmat &m = k < a.K ? a.m : a.ms;
            const long long e = k < a.K ? a.sel[k] : 0; /* (written by an earlier launch: not through the read-only path) */
            q[u] = __ldg((const uint4 *)((const char *)m.w + e * m.ew) + (size_t)row * nch + sub);
            sc[u] = mvq_sb<SBT>((const char *)m.s + e * m.es, m.sbt, gi);
            bi[u] = mvq_sb<SBT>((const char *)m.b + e * m.es, m.sbt, gi);
        }
    }
}

/* LPR: lanes a (row, slot), the chunks of a row (nch <= LPR: a chunk a lane) */
template <int LPR, int SBT>
__global__ void __launch_bounds__(DC_WARPS * WARP, 2) k_moe_down_comb(const __grid_constant__ dc_args a) {
    extern __shared__ float4 dxs[]; /* [ns][I / 4] the staged inputs (mvq_sw order, mvq_scale), then [ns][I / 32] chunk sums */
    __shared__ float dw[DC_SMAX], red[DC_WARPS];
    __shared__ int last;
    CU_PDL(); /* sel, wt, the gate|up outputs and x come from earlier launches */
    const int I = a.m.cols, nch = I / 32, lnch = __ffs(nch) - 1, H = a.m.rows, ns = a.ns, tid = threadIdx.x;
    const int lane = tid % WARP, warp = tid / WARP, sub = lane % LPR, grp = lane / LPR, G = WARP / LPR;
    const int items = (ns + G - 1) / G, lcpg = __ffs(a.m.group / 32) - 1, lng = lnch - lcpg, cg = sub >> lcpg;
    /* a warp a row: its first items, its residual and the mixer's output are loaded before the
     * staging, so their round trips overlap it (the experts are known once the top-k's launch is
     * done). (Two rows a warp, half the blocks, measured slower on the H200.) */
    const int row = (int)blockIdx.x * DC_WARPS + warp;
    uint4 q[DC_NL];
    float sc[DC_NL], bi[DC_NL], x0 = 0.f, a0 = 0.f;
    if (row < H) {
        dc_load<LPR, SBT>(a, row, 0, grp, sub, lng, cg, q, sc, bi);
        if (lane == 0) {
            x0 = a.x[row];
            if (a.add) a0 = a.add[row];
        }
    }
    if (tid < ns) dw[tid] = tid < a.K ? a.wt[tid] : sigm_f(a.sr[0]);
    /* the inputs, DC_ST float4s of gate and up a thread in flight at once; float4 i of the
     * staged inputs is j = i % 8 of chunk (i / 8) % nch of slot i / (8 nch) */
    float *sxs = (float *)(dxs + (size_t)ns * nch * 8);
    const int nst = ns * nch * 8;
    for (int i0 = tid; i0 < nst; i0 += DC_ST * (int)blockDim.x) {
        float4 g[DC_ST], u[DC_ST];
#pragma unroll
        for (int s = 0; s < DC_ST; s++) {
            const int i = i0 + s * (int)blockDim.x;
            if (i < nst) {
                g[s] = *(const float4 *)(a.hg + 4 * (size_t)i);
                u[s] = *(const float4 *)(a.hu + 4 * (size_t)i);
            }
        }
#pragma unroll
        for (int s = 0; s < DC_ST; s++) {
            const int i = i0 + s * (int)blockDim.x, c = (i >> 3) & (nch - 1), j = i & 7;
            if (i < nst) {
                float4 *xk = dxs + ((size_t)(i >> (lnch + 3)) << (lnch + 3));
                xk[mvq_sw(c, j)] = make_float4(silu_fast(g[s].x) * u[s].x, silu_fast(g[s].y) * u[s].y, silu_fast(g[s].z) * u[s].z,
                                               silu_fast(g[s].w) * u[s].w);
                mvq_scale(xk, c, j);
            }
        }
    }
    __syncthreads();
    for (int i = tid; i < ns * nch; i += blockDim.x) sxs[i] = mvq_chunk_sum(dxs + ((size_t)(i >> lnch) << (lnch + 3)), i & (nch - 1));
    __syncthreads();

    if (row < H) { /* (the warp's lanes agree) */
        float acc = 0.f;
        for (int i0 = 0; i0 < items; i0 += DC_NL) {
            if (i0) dc_load<LPR, SBT>(a, row, i0, grp, sub, lng, cg, q, sc, bi);
#pragma unroll
            for (int u = 0; u < DC_NL; u++) {
                const int k = grp + G * (i0 + u);
                if (k < ns && sub < nch)
                    acc += dw[k] * mvq_chunk4(q[u], sc[u], bi[u], dxs + ((size_t)k << (lnch + 3)), sxs + ((size_t)k << lnch), sub, sub & 7);
            }
        }
        for (int o = WARP / 2; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) a.x[row] = (a.add ? x0 + a0 : x0) + acc; /* (x + add) first, as the combine */
    }

    /* the next norm, by the block that finishes last (every row of x is in by then) */
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(a.count, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    float ss = 0.f;
#pragma unroll 4
    for (int i = tid; i < H; i += blockDim.x) {
        const float v = __ldcg(a.x + i);
        ss += v * v;
    }
    for (int o = WARP / 2; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    float tot = 0.f;
    for (int w = 0; w < DC_WARPS; w++) tot += red[w];
    const float r = 1.0f / sqrtf(tot / H + a.eps);
#pragma unroll 4
    for (int i = tid; i < H; i += blockDim.x) a.tout[i] = __ldcg(a.x + i) * r * a.nw[i];
    if (tid == 0) *a.count = 0;
}

template <int LPR, int SBT>
static void dc_launch(cudaStream_t s, const dc_args &a, int gx, size_t sm) {
    static int opted = 0; /* the staged inputs may pass the 48 KB a launch gets without asking */
    if (!opted) opted = cudaFuncSetAttribute(k_moe_down_comb<LPR, SBT>, cudaFuncAttributeMaxDynamicSharedMemorySize, MVQ_SMEM) == cudaSuccess;
    cu_go(k_moe_down_comb<LPR, SBT>, gx, DC_WARPS * WARP, sm, s)(a);
}

/* 4-bit, a row of at most 32 chunks of 32 columns (a chunk a lane), chunks and groups powers of two */
static int dc_mat_ok(const dmat *m) {
    return cu_mvq_ok(m) && m->bits == 4 && m->cols <= 1024 && cu_pow2(m->cols / 32) && m->group >= 32 && cu_pow2(m->group / 32) &&
           m->group <= m->cols;
}

int cu_moe_down_combine_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_DOWNCOMB", 0);
}

int cu_moe_down_combine(cudaStream_t s, const dmat *D, const dmat *SDm, const int *sel, const float *wt, int K, const float *hg,
                        const float *hu, const float *sr, float *x, const float *add, const float *nw, float eps, float *tout,
                        unsigned *count) {
    const int ns = K + (SDm != NULL), I = D->cols, nch = I / 32;
    const size_t sm = (size_t)ns * I * 4 + (size_t)ns * nch * 4;
    if (!dc_mat_ok(D) || K < 1 || ns > DC_SMAX || !nw || sm > MVQ_SMEM ||
        ((uintptr_t)hg & 15) || ((uintptr_t)hu & 15))
        return 0;
    if (SDm && (!dc_mat_ok(SDm) || SDm->rows != D->rows || SDm->cols != I || SDm->group != D->group)) return 0;
    dc_args a;
    memset(&a, 0, sizeof a);
    a.m = *D;
    a.ms = SDm ? *SDm : *D;
    a.sel = sel; a.wt = wt; a.hg = hg; a.hu = hu; a.sr = sr; a.x = x; a.add = add; a.nw = nw; a.tout = tout; a.count = count;
    a.eps = eps; a.K = K; a.ns = ns;
    const int gx = (D->rows + DC_WARPS - 1) / DC_WARPS;
    const int bf = D->sbt == LW_BF16 && a.ms.sbt == LW_BF16;
    if (nch >= 32) (bf ? dc_launch<32, LW_BF16> : dc_launch<32, -1>)(s, a, gx, sm);
    else if (nch >= 16) (bf ? dc_launch<16, LW_BF16> : dc_launch<16, -1>)(s, a, gx, sm);
    else (bf ? dc_launch<8, LW_BF16> : dc_launch<8, -1>)(s, a, gx, sm);
    return 1;
}
