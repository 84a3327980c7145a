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
 * lanes split into 32 / LPR groups of LPR lanes; group g takes slots g, g + 32 / LPR, ... and lane
 * `sub` of a group the chunks sub, sub + LPR, ... of the row, so one pass over a row issues the
 * loads of several slots before any product (DC_NL of them in flight a lane). */
#include "cuda/cu_dev.h"

#define DC_WARPS 8
#define DC_NL 8    /* (slot, chunk) items a lane loads before it multiplies */
#define DC_SMAX 32 /* slots: top-k plus the shared expert */

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
    int K, ns, rpw;    /* routed slots, all slots, rows a warp */
} dc_args;

template <int LPR, int SBT>
__global__ void __launch_bounds__(DC_WARPS * WARP) k_moe_down_comb(const __grid_constant__ dc_args a) {
    extern __shared__ float4 dxs[]; /* [ns][I / 4] the staged inputs (mvq_sw order, mvq_scale), then [ns][I / 32] chunk sums */
    __shared__ float dw[DC_SMAX], red[DC_WARPS];
    __shared__ int de[DC_SMAX], last;
    CU_PDL(); /* sel, wt, the gate|up outputs and x come from earlier launches */
    const int I = a.m.cols, nch = I / 32, H = a.m.rows, ns = a.ns, tid = threadIdx.x;
    float *sxs = (float *)(dxs + (size_t)ns * nch * 8);
    if (tid < ns) {
        de[tid] = tid < a.K ? a.sel[tid] : 0;
        dw[tid] = tid < a.K ? a.wt[tid] : sigm_f(a.sr[0]);
    }
    for (int i = tid; i < ns * nch * 8; i += blockDim.x) {
        const int k = i / (nch * 8), c = (i / 8) % nch, j = i % 8;
        const float *g = a.hg + (size_t)k * I + c * 32 + j * 4, *u = a.hu + (size_t)k * I + c * 32 + j * 4;
        float4 *xk = dxs + (size_t)k * nch * 8;
        xk[mvq_sw(c, j)] = make_float4(silu_f(g[0]) * u[0], silu_f(g[1]) * u[1], silu_f(g[2]) * u[2], silu_f(g[3]) * u[3]);
        mvq_scale(xk, c, j);
    }
    __syncthreads();
    for (int i = tid; i < ns * nch; i += blockDim.x) sxs[i] = mvq_chunk_sum(dxs + (size_t)(i / nch) * nch * 8, i % nch);
    __syncthreads();

    const int lane = tid % WARP, warp = tid / WARP, sub = lane % LPR, grp = lane / LPR, G = WARP / LPR;
    const int cpl = (nch + LPR - 1) / LPR, items = cpl * ((ns + G - 1) / G);
    for (int rr = 0; rr < a.rpw; rr++) {
        const int row = ((int)blockIdx.x * DC_WARPS + warp) * a.rpw + rr;
        if (row >= H) break; /* (the warp's lanes agree) */
        float acc = 0.f;
        for (int i0 = 0; i0 < items; i0 += DC_NL) {
            uint4 q[DC_NL];
            float sc[DC_NL], bi[DC_NL];
#pragma unroll
            for (int u = 0; u < DC_NL; u++) {
                const int i = i0 + u, k = grp + G * (i / cpl), c = sub + LPR * (i % cpl);
                q[u] = make_uint4(0, 0, 0, 0);
                sc[u] = bi[u] = 0.f;
                if (i < items && k < ns && c < nch) {
                    const dmat &m = k < a.K ? a.m : a.ms;
                    const long long e = k < a.K ? de[k] : 0;
                    const int ng = I / m.group, gi = row * ng + c / (m.group / 32);
                    q[u] = __ldg((const uint4 *)((const char *)m.w + e * m.ew) + (size_t)row * nch + c);
                    sc[u] = mvq_sb<SBT>((const char *)m.s + e * m.es, m.sbt, gi);
                    bi[u] = mvq_sb<SBT>((const char *)m.b + e * m.es, m.sbt, gi);
                }
            }
#pragma unroll
            for (int u = 0; u < DC_NL; u++) {
                const int i = i0 + u, k = grp + G * (i / cpl), c = sub + LPR * (i % cpl);
                if (i < items && k < ns && c < nch)
                    acc += dw[k] * mvq_chunk4(q[u], sc[u], bi[u], dxs + (size_t)k * nch * 8, sxs + (size_t)k * nch, c, c & 7);
            }
        }
        for (int o = WARP / 2; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) a.x[row] = (a.add ? a.x[row] + a.add[row] : a.x[row]) + acc; /* (x + add) first, as the combine */
    }

    /* the next norm, by the block that finishes last (every row of x is in by then) */
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(a.count, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    float ss = 0.f;
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
    for (int i = tid; i < H; i += blockDim.x) a.tout[i] = __ldcg(a.x + i) * r * a.nw[i];
    if (tid == 0) *a.count = 0;
}

template <int LPR, int SBT>
static void dc_launch(cudaStream_t s, const dc_args &a, int gx, size_t sm) {
    static int opted = 0; /* the staged inputs may pass the 48 KB a launch gets without asking */
    if (!opted) opted = cudaFuncSetAttribute(k_moe_down_comb<LPR, SBT>, cudaFuncAttributeMaxDynamicSharedMemorySize, MVQ_SMEM) == cudaSuccess;
    cu_go(k_moe_down_comb<LPR, SBT>, gx, DC_WARPS * WARP, sm, s)(a);
}

static int dc_mat_ok(const dmat *m) { return cu_mvq_ok(m) && m->bits == 4 && m->group % 32 == 0; }

int cu_moe_down_combine(cudaStream_t s, const dmat *D, const dmat *SDm, const int *sel, const float *wt, int K, const float *hg,
                        const float *hu, const float *sr, float *x, const float *add, const float *nw, float eps, float *tout,
                        unsigned *count) {
    static int on = -1, rpw_env = INT_MIN;
    const int ns = K + (SDm != NULL), I = D->cols, nch = I / 32;
    const size_t sm = (size_t)ns * I * 4 + (size_t)ns * nch * 4;
    if (!cu_env_flag(&on, "LILY_CU_DOWNCOMB", 1) || !dc_mat_ok(D) || K < 1 || ns > DC_SMAX || !nw || sm > MVQ_SMEM) return 0;
    if (SDm && (!dc_mat_ok(SDm) || SDm->rows != D->rows || SDm->cols != I)) return 0;
    dc_args a;
    memset(&a, 0, sizeof a);
    a.m = *D;
    a.ms = SDm ? *SDm : *D;
    a.sel = sel; a.wt = wt; a.hg = hg; a.hu = hu; a.sr = sr; a.x = x; a.add = add; a.nw = nw; a.tout = tout; a.count = count;
    a.eps = eps; a.K = K; a.ns = ns;
    /* LILY_CU_DC_RPW: rows a warp (1 default: 256 blocks at 2,048 rows), for measuring */
    const int rv = cu_env_int(&rpw_env, "LILY_CU_DC_RPW", 1);
    a.rpw = rv >= 1 && rv <= 8 ? rv : 1;
    const int gx = (D->rows + DC_WARPS * a.rpw - 1) / (DC_WARPS * a.rpw);
    const int bf = D->sbt == LW_BF16 && a.ms.sbt == LW_BF16;
    if (nch >= 32) (bf ? dc_launch<32, LW_BF16> : dc_launch<32, -1>)(s, a, gx, sm);
    else if (nch >= 16) (bf ? dc_launch<16, LW_BF16> : dc_launch<16, -1>)(s, a, gx, sm);
    else (bf ? dc_launch<8, LW_BF16> : dc_launch<8, -1>)(s, a, gx, sm);
    return 1;
}
