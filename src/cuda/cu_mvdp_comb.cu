/* Decode's MoE tail: the experts' down with the weighted combine and the gated shared expert folded
 * in (k_mvdp_comb), on k_mvdp's staged integer input and tiles (cu_mvdp.h). */
#include "cuda/cu_mvdp.h"

/* ---- Decode's MoE tail folded into the experts' down launch (k_mvdp_comb) ----
 *
 * Why: the down launch wrote each slot's [H] outputs and a one-block combine read them back,
 * summed them into the residual and normalized: a launch a layer that added 6-7 us to every
 * layer's critical path (bench/RESULTS.md session 18's timeline), for work that is a few
 * multiply-adds a row. Here a block owns a tile of rows across every slot, a warp a slot, so the
 * slots' sums for a row meet in shared memory and the block writes x += sum_k w_k D_k (+ the
 * gated shared expert) itself, summed in the combine's order. The next layer's norm is left to
 * the next launch's staging (dp_stage with mvq_fuse.nw), which reads the whole row anyway.
 *
 * What it costs: every block stages all the slots' inputs (a warp its own slot's, silu(g) * u
 * as k_mvdp stages it, so the products are the same), K + 1 times the staging of the unfused
 * launch, against the launch and the combine's single block saved. An earlier form (k_mvq4's
 * float staging, the norm by the last block after a counter) measured slower than the two
 * launches (session 12); this one stages integers a warp at a time and has no counter. */
#define DPC_MAXS 16 /* slots a block (a warp each): top-k plus the shared expert */
#define DPC_BUF 2   /* words a lane loads before staging them */

/* T tokens (a decode batch's or a short pass's rows, grid y the token; one token's step T = 1): token j's
 * routed slots are rows j K .. j K + K - 1 of hg, hu, sel and wt, its shared slot row T K + j of hg and hu
 * (as the experts' gate|up launch leaves them: mvq_fuse.xslot = T K), its residual row j of x. */
typedef struct {
    dmat m;               /* the routed experts' down, [E][H][I] */
    dmat ms;              /* the shared expert's down, [H][I] (slot K when ns > K) */
    const int *sel;       /* [T][K] chosen experts */
    const float *wt;      /* [T][K] their weights */
    const float *sr;      /* [T] the shared expert's gate logit (ns > K) */
    const float *hg, *hu; /* [T K + T][I] gate and up outputs: the input is silu(hg) * hu */
    float *x;             /* [T][H] the residual, updated in place */
    const float *add;     /* [T][H] the mixer's output, not yet added (the fused router group's), or NULL */
    int K, ns;            /* routed slots, all slots */
    int epf;              /* an expert's first codes fetched before the staging (LILY_CU_FOLD_EPF=1, for measuring) */
} dpc_args;

/* a warp's own input silu(g) * u [cols] into xs (dp_put), DPC_BUF words a lane loaded at once */
__device__ __forceinline__ void dp_stage_warp(const float *g, const float *u, int cols, uint4 *xs) {
    const int nw = cols / 8, lane = threadIdx.x % WARP;
    for (int w0 = 0; w0 < nw; w0 += WARP * DPC_BUF) { /* (uniform across the warp: dp_put shuffles) */
        float4 gv[DPC_BUF][2], uv[DPC_BUF][2];
#pragma unroll
        for (int b = 0; b < DPC_BUF; b++) {
            const int w = w0 + b * WARP + lane;
            if (w < nw)
                for (int h = 0; h < 2; h++) {
                    gv[b][h] = ((const float4 *)g)[2 * w + h];
                    uv[b][h] = ((const float4 *)u)[2 * w + h];
                }
        }
#pragma unroll
        for (int b = 0; b < DPC_BUF; b++) {
            const int w = w0 + b * WARP + lane;
            float v[8];
            if (w < nw)
                for (int h = 0; h < 2; h++) {
                    v[4 * h] = silu_f(gv[b][h].x) * uv[b][h].x;
                    v[4 * h + 1] = silu_f(gv[b][h].y) * uv[b][h].y;
                    v[4 * h + 2] = silu_f(gv[b][h].z) * uv[b][h].z;
                    v[4 * h + 3] = silu_f(gv[b][h].w) * uv[b][h].w;
                }
            dp_put(v, w < nw, w, xs);
        }
    }
}

/* A block: rows blockIdx.x * rpt .. + rpt - 1 (rpt = R x 32 / LPR, one tile) of token blockIdx.y, warp k
 * slot k. ROWS: an instance of its own for T > 1, so one token's step keeps its code (session 42 found
 * several rows' offsets in a shared instance cost one token's decode ~0.5%, bench/RESULTS.md). */
template <int LPR, int R, int SBT, bool ROWS>
__global__ void __launch_bounds__(DPC_MAXS * WARP, 1) k_mvdp_comb(const __grid_constant__ dpc_args a) {
    extern __shared__ uint4 dxs[];      /* [ns][I / 64][DP_G4] each slot's staged input */
    __shared__ float ys[DPC_MAXS][WARP]; /* [slot][row of the tile] the slots' sums */
    const int I = a.m.cols, ng = I / 64, nrow16 = I / 32, H = a.m.rows, rpt = (WARP / LPR) * R;
    const int slot = threadIdx.x / WARP, lane = threadIdx.x % WARP, sub = lane % LPR, rib = lane / LPR;
    const int row0 = blockIdx.x * rpt, tid = threadIdx.x;
    /* (ROWS) token blockIdx.y's offsets into sel and wt, x and add, evaluated where they are used, so
     * one token's instance (offsets 0) compiles to the PTX it had before them */
#define DPC_TK (ROWS ? (size_t)blockIdx.y * a.K : (size_t)0)
#define DPC_XO (ROWS ? (size_t)blockIdx.y * H : (size_t)0)
    uint4 c[R][2];
    float sc[R], bi[R];
#pragma unroll
    for (int k = 0; k < R; k++) {
        c[k][0] = c[k][1] = make_uint4(0, 0, 0, 0);
        sc[k] = bi[k] = 0.f;
    }
    /* before the wait: the shared expert's first codes (weights), and the rows' residual, the
     * mixer's output and the shared gate's logit, written by launches that finished before the
     * predecessor (the experts' gate|up, which routes) could start */
    const bool shs = slot >= a.K;
    dp_rows t;
    bool have = false;
    if (shs) {
        t = dp_rows_at<R, 4>(a.ms, 0, row0 + rib * R);
        if (sub < ng) {
            dp_fetch<R, SBT, 4>(t, a.ms.sbt, sub, nrow16, I / a.ms.group, c, sc, bi);
            have = true;
        }
    }
    float x0 = 0.f, gs = 0.f;
    const int row = row0 + tid;
    if (tid < rpt && row < H) {
        x0 = a.add ? a.x[DPC_XO + row] + a.add[DPC_XO + row] : a.x[DPC_XO + row]; /* (x + add) first, as the combine */
        if (a.ns > a.K) gs = sigm_f(a.sr[ROWS ? blockIdx.y : 0]);
    }
    CU_PDL(); /* sel, wt and the inputs come from the experts' gate|up launch */
    if (!shs) {
        t = dp_rows_at<R, 4>(a.m, a.sel[DPC_TK + slot], row0 + rib * R);
        if (a.epf && sub < ng) { /* (LILY_CU_FOLD_EPF=1) the expert's first codes before the staging */
            dp_fetch<R, SBT, 4>(t, a.m.sbt, sub, nrow16, I / a.m.group, c, sc, bi);
            have = true;
        }
    }
    uint4 *xs = dxs + (size_t)slot * ng * DP_G4;
    /* (ROWS: the token's routed slots at rows j K + k, its shared one at T K + j) */
    const size_t hrow = !ROWS ? (size_t)slot : slot < a.K ? DPC_TK + slot : (size_t)gridDim.y * a.K + blockIdx.y;
    dp_stage_warp(a.hg + hrow * I, a.hu + hrow * I, I, xs);
    __syncwarp();
    CU_MARK(0);
    const dmat &m = shs ? a.ms : a.m;
    int rsel;
    const float acc = dp_tile<LPR, R, SBT, 4, 1>(t, SBT >= 0 ? SBT : m.sbt, I / m.group, ng, nrow16, sub, xs, have, c, sc, bi, rsel);
    CU_MARK(1);
    if ((sub & (LPR / R - 1)) == 0 && rsel < t.nr) ys[slot][rib * R + rsel] = acc;
    __syncthreads();
    CU_MARK(2);
    if (tid < rpt && row < H) { /* the combine's order: the routed slots, the shared one, then the residual */
        float y = 0.f;
        for (int k = 0; k < a.K; k++) y += a.wt[DPC_TK + k] * ys[k][tid];
        if (a.ns > a.K) y += gs * ys[a.K][tid];
        a.x[DPC_XO + row] = x0 + y;
    }
}

#undef DPC_TK
#undef DPC_XO

template <int LPR, int R, int SBT, bool ROWS>
static void dpc_go(cudaStream_t s, const dpc_args &a, size_t sm, int T) {
    static int opted = 0; /* (I past 1,536 columns: more than the 48 KB a launch gets unasked) */
    if (!opted) opted = cudaFuncSetAttribute(k_mvdp_comb<LPR, R, SBT, ROWS>, cudaFuncAttributeMaxDynamicSharedMemorySize, MVQ_SMEM) == cudaSuccess;
    const int rpt = (WARP / LPR) * R;
    cu_go(k_mvdp_comb<LPR, R, SBT, ROWS>, dim3((a.m.rows + rpt - 1) / rpt, T), a.ns * WARP, sm, s)(a);
}
template <int LPR, bool ROWS>
static void dpc_sbt(cudaStream_t s, const dpc_args &a, size_t sm, int T) {
    const int bf = a.m.sbt == LW_BF16 && (a.ns == a.K || a.ms.sbt == LW_BF16);
    if (bf) dpc_go<LPR, (LPR >= 4 ? 4 : LPR), LW_BF16, ROWS>(s, a, sm, T);
    else dpc_go<LPR, (LPR >= 4 ? 4 : LPR), -1, ROWS>(s, a, sm, T);
}
template <int LPR>
static void dpc_rows(cudaStream_t s, const dpc_args &a, size_t sm, int T) {
    if (T > 1) dpc_sbt<LPR, true>(s, a, sm, T);
    else dpc_sbt<LPR, false>(s, a, sm, 1);
}

int cu_mvdp_comb_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_FOLD", 1);
}

int cu_mvdp_comb(cudaStream_t s, const dmat *D, const dmat *SDm, const int *sel, const float *wt, int K, int T, const float *hg,
                 const float *hu, const float *sr, float *x, const float *add) {
    const int ns = K + (SDm != NULL), I = D->cols, ng = I / 64;
    const size_t sm = (size_t)ns * dp_smem(I);
    if (!mvdp_enabled() || K < 1 || T < 1 || T > 65535 || ns > DPC_MAXS || I % 64 || !dp_fits(D, I, 4) || sm > MVQ_SMEM ||
        ((uintptr_t)hg & 15) || ((uintptr_t)hu & 15))
        return 0;
    if (SDm && (!dp_fits(SDm, I, 4) || SDm->rows != D->rows)) return 0;
    dpc_args a;
    memset(&a, 0, sizeof a);
    a.m = *D;
    a.ms = SDm ? *SDm : *D;
    a.sel = sel; a.wt = wt; a.sr = sr; a.hg = hg; a.hu = hu; a.x = x; a.add = add;
    a.K = K; a.ns = ns;
    static int epf = -1;
    a.epf = cu_env_flag(&epf, "LILY_CU_FOLD_EPF", 0);
    const int lpr = ng >= 32 ? 32 : ng >= 16 ? 16 : ng >= 8 ? 8 : ng >= 4 ? 4 : ng >= 2 ? 2 : 1;
    switch (lpr) {
    case 32: dpc_rows<32>(s, a, sm, T); break;
    case 16: dpc_rows<16>(s, a, sm, T); break;
    case 8: dpc_rows<8>(s, a, sm, T); break;
    case 4: dpc_rows<4>(s, a, sm, T); break;
    case 2: dpc_rows<2>(s, a, sm, T); break;
    default: dpc_rows<1>(s, a, sm, T); break;
    }
    return 1;
}
