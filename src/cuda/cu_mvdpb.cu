/* Matrix-vector products for 2-8 input rows (decode batches: a token of each session; short
 * prefills): k_mvdp's integer dot products, each group's codes, scales and biases loaded once and
 * met by every row's staged input (k_mvdpb).
 *
 * Why: k_mvqb, which ran these before, stages every row's fp32 input in each block of eight weight
 * rows, so at 8 rows the in-projection's 1,544 blocks read 64 KB of input each from L2 for a
 * 14 MB matrix: 80 us a launch, 0.18 TB/s, and a batch of 8 cost 7 times one token's step
 * (bench/RESULTS.md session 27). Here, as in k_mvdp, the grid is what the GPU holds at once, each
 * block stages the rows once (dp_put: three signed bytes a value, exact to 2^-24 of its group's
 * largest) and its warps walk the tiles, each lane with two weight rows' group of codes in flight (R 2;
 * or one row, the next group fetched before the current one is summed: LILY_CU_MVDPB_PF=1, 4-6%
 * slower). A word of codes costs its masks once and six dp4a a row. On the H200 (session 27) decode
 * batches of 2, 4 and 8 rows ran 38-52% faster than on k_mvqb; at 8 rows the DeltaNet in-projection
 * takes 32 us (0.44 TB/s), bound by each lane's chain of fetch, 8 x 2 x 48 dp4a and reduction, not
 * by bytes.
 *
 * Layout: as k_mvdp's (LPR lanes a row, R rows a lane group, tiles of R x 32 / LPR rows over all
 * matrices of the launch); the accumulators are [R][NT] (row-major), reduced across the LPR lanes by
 * halving over all R x NT of them, so a lane ends with whole sums of consecutive (row, input) pairs.
 * Shared memory: [NT][cols / 64][DP_G4] uint4, up to 110 KB (two blocks an SM). More than 8 rows go
 * in passes of 8 (decode batches to 16 rows stay on this kernel: cu_forward.cu's mv_pass).
 *
 * LILY_CU_MVDPB=0 leaves these launches to k_mvqb, for measuring; the kernel test runs both. */
#include "cuda/cu_dev.h"
#include "cuda/cu_mvdp.h"

#define DPB_SMEM (110 * 1024)

/* Y[i] [T][ldy[i]] = W[i] x_t for the T <= NT rows x_t = X row t (silu(X) * X2 when X2; NRM with a.f.nw:
 * rmsnorm(X row t) * nw, cu_mvdpb_norm) */
template <int LPR, int R, int BITS, int NT, bool PF, bool NRM>
__global__ void __launch_bounds__(DP_WARPS * WARP, 2) k_mvdpb(mvq_args a, const float *__restrict__ X, const float *__restrict__ X2,
                                                           int ldx, int T) {
    extern __shared__ uint4 dxs[]; /* [NT][cols / 64][DP_G4] the staged rows */
    const int cols = a.m[0].cols, ng = cols / 64, nrow16 = cols * BITS / 128, ntiles = a.blk0[a.n], nw = cols / 8;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, sub = lane % LPR, rib = lane / LPR;
    const int rpt = (WARP / LPR) * R, nwb = blockDim.x / WARP, step = gridDim.x * nwb;
    /* a lane's first group, before the wait (weights are never written) */
    int tile = blockIdx.x * nwb + warp, mi = 0;
    uint4 c[R][BITS / 2];
    float sc[R], bi[R];
    dp_rows t;
    t.w = NULL; t.s = t.b = NULL; t.lg = t.r0 = t.nr = 0;
    if (tile < ntiles) {
        t = dp_locate<R, BITS>(a, false, 0, tile, mi, rpt, rib);
        if (sub < ng) dp_fetch<R, -1, BITS>(t, a.m[mi].sbt, sub, nrow16, a.m[mi].cols / a.m[mi].group, c, sc, bi);
    }
    float n8[8] = { 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f }; /* (NRM: the norm's weights, a batch's in-projection after its folded combine) */
    if (NRM) dp_rows_nw0(a.f, nw, n8);
    CU_PDL();
    /* the rows staged (dp_stage_rows: a thread's two words' loads out before either is put) */
    dp_stage_rows<false, NRM>(a.f, X, X2, ldx, T, nw, dxs, (size_t)ng * DP_G4, NT, n8);
    __syncthreads();
    bool have = true; /* (without PF: c holds the lane's first group) */
    for (; tile < ntiles; tile += step) {
        if (!PF) t = dp_locate<R, BITS>(a, false, 0, tile, mi, rpt, rib); /* (PF: located with its first group's fetch) */
        const dmat &m = a.m[mi];
        const int ngr = m.cols / m.group, sbt = m.sbt;
        float acc[R * NT];
#pragma unroll
        for (int i = 0; i < R * NT; i++) acc[i] = 0.f;
        const dp_rows tc = t;
        const int mc = mi;
        for (int g = sub; g < ng; g += LPR) {
            /* the next group of this tile, else the first of the lane's next tile */
            uint4 c2[R][BITS / 2];
            float sc2[R], bi2[R];
            bool more = true;
            if (!PF) more = false;
            else if (g + LPR < ng) dp_fetch<R, -1, BITS>(tc, sbt, g + LPR, nrow16, ngr, c2, sc2, bi2);
            else if (tile + step < ntiles) {
                t = dp_locate<R, BITS>(a, false, 0, tile + step, mi, rpt, rib);
                const dmat &mn = a.m[mi];
                dp_fetch<R, -1, BITS>(t, mn.sbt, sub, nrow16, mn.cols / mn.group, c2, sc2, bi2);
            } else more = false;
            if (!PF && !have) dp_fetch<R, -1, BITS>(tc, sbt, g, nrow16, ngr, c, sc, bi);
            have = false;
#pragma unroll
            for (int r = 0; r < NT; r++) {
                if (r >= T) break;
                dp_group<R, BITS, NT>(c, sc, bi, dxs + ((size_t)r * ng + g) * DP_G4, acc + r);
            }
            if (more) dp_take<R, BITS>(c, sc, bi, c2, sc2, bi2);
        }
        /* the R x NT (row, input) pairs' sums over the LPR lanes: the lane keeps pairs sel .. */
        const int sel = dp_halve<LPR, R * NT>(acc, sub);
        constexpr int LOW = LPR > R * NT ? LPR / (R * NT) - 1 : 0;
        if ((sub & LOW) == 0)
#pragma unroll
            for (int i = 0; i < (R * NT > LPR ? R * NT / LPR : 1); i++) {
                const int p = sel + i, k = p / NT, r = p % NT;
                if (r < T && k < tc.nr) a.y[mc][(size_t)r * a.ldy[mc] + tc.r0 + k] = acc[i];
            }
    }
}

template <int LPR, int R, int BITS, int NT, bool PF, bool NRM>
static void mvdpb_go(cudaStream_t s, const mvq_args &a, const float *X, const float *X2, int ldx, int T) {
    static mvq_kstate ks;
    if (!ks.attr_set) /* (above mvq_grid's MVQ_SMEM: set here first, mvq_grid then leaves it) */
        ks.attr_set = cudaFuncSetAttribute(k_mvdpb<LPR, R, BITS, NT, PF, NRM>, cudaFuncAttributeMaxDynamicSharedMemorySize, DPB_SMEM) == cudaSuccess;
    const size_t sm = (size_t)NT * dp_smem(a.m[0].cols);
    const int blocks = (a.blk0[a.n] + DP_WARPS - 1) / DP_WARPS;
    const int gx = mvq_grid(k_mvdpb<LPR, R, BITS, NT, PF, NRM>, ks, blocks, 1, 0, DP_WARPS * WARP, sm);
    cu_go(k_mvdpb<LPR, R, BITS, NT, PF, NRM>, dim3(gx), DP_WARPS * WARP, sm, s)(a, X, X2, ldx, T);
}
/* Two forms of the same bytes in flight a lane (128 registers, no spills; R 4, or 2 with the next
 * group held too, spilled hundreds of bytes): PF 0, R 2 rows a lane group, each group fetched
 * when it is summed (as k_mvdp); PF 1 (LILY_CU_MVDPB_PF=1), R 1, the lane's next group (or next
 * tile's first) fetched before the current one is summed. 8-bit codes: R 1 either way (twice the
 * registers a row). */
#define DPB_R(pf, bits) ((pf) || (bits) == 8 ? 1 : 2)
template <int LPR, int BITS, bool PF, bool NRM = false>
static void mvdpb_nt(int nt, cudaStream_t s, const mvq_args &a, const float *X, const float *X2, int ldx, int T) {
    if (nt == 2) mvdpb_go<LPR, DPB_R(PF, BITS), BITS, 2, PF, NRM>(s, a, X, X2, ldx, T);
    else if (nt == 4) mvdpb_go<LPR, DPB_R(PF, BITS), BITS, 4, PF, NRM>(s, a, X, X2, ldx, T);
    else mvdpb_go<LPR, DPB_R(PF, BITS), BITS, 8, PF, NRM>(s, a, X, X2, ldx, T);
}
/* (the norm's instances: 4-bit codes, PF 0 only; the launcher declines the others) */
template <int LPR>
static void mvdpb_bits(int bits, int pf, int nt, cudaStream_t s, const mvq_args &a, const float *X, const float *X2, int ldx, int T) {
    if (a.f.nw) mvdpb_nt<LPR, 4, false, true>(nt, s, a, X, X2, ldx, T);
    else if (bits == 8 && pf) mvdpb_nt<LPR, 8, true>(nt, s, a, X, X2, ldx, T);
    else if (bits == 8) mvdpb_nt<LPR, 8, false>(nt, s, a, X, X2, ldx, T);
    else if (pf) mvdpb_nt<LPR, 4, true>(nt, s, a, X, X2, ldx, T);
    else mvdpb_nt<LPR, 4, false>(nt, s, a, X, X2, ldx, T);
}

static int test_off = 0; /* 1: decline every launch; -1: k_mvdpb itself, the PF 1 form; -2: k_mvdpb itself (not k_mvdpt) */
void cu_mvdpb_test_off(int off) { test_off = off; }

static int mvdpb_rows(cudaStream_t s, int n, const dmat *const *W, const float *X, const float *X2, int ldx, int T, float *const *Y,
                      const int *ldy, const float *nw, float eps, float *tout);
int cu_mvdpb(cudaStream_t s, int n, const dmat *const *W, const float *X, const float *X2, int ldx, int T, float *const *Y,
             const int *ldy) {
    return mvdpb_rows(s, n, W, X, X2, ldx, T, Y, ldy, NULL, 0.f, NULL);
}
int cu_mvdpb_norm(cudaStream_t s, int n, const dmat *const *W, const float *X, int ldx, int T, float *const *Y, const int *ldy,
                  const float *nw, float eps, float *tout) {
    return nw && mvdpb_rows(s, n, W, X, NULL, ldx, T, Y, ldy, nw, eps, tout);
}
static int mvdpb_rows(cudaStream_t s, int n, const dmat *const *W, const float *X, const float *X2, int ldx, int T, float *const *Y,
                      const int *ldy, const float *nw, float eps, float *tout) {
    static int on = -1, pfe = -1;
    const int pf = cu_env_flag(&pfe, "LILY_CU_MVDPB_PF", 0) || test_off == -1;
    if (!cu_env_flag(&on, "LILY_CU_MVDPB", 1) || test_off > 0 || !mvdp_enabled() || n < 1 || n > MVQ_MAX || T < 2 || (nw && X2))
        return 0;
    /* the tensor-core form first (cu_mvdpt.cu) for the batches it takes (6 rows or more by default) */
    if (test_off == 0 && cu_mvdpt_on(T) &&
        (nw ? cu_mvdpt_norm(s, n, W, X, ldx, T, Y, ldy, nw, eps, tout) : cu_mvdpt(s, n, W, X, X2, ldx, T, Y, ldy)))
        return 1;
    const int cols = W[0]->cols, bits = W[0]->bits, ng = cols / 64;
    if (cols % 64 || (bits != 4 && bits != 8) || ng < 8 || ldx % 4 || ((uintptr_t)X & 15) || ((uintptr_t)X2 & 15)) return 0;
    if (nw && (bits != 4 || pf)) return 0; /* (the norm's instances: mvdpb_bits) */
    for (int i = 0; i < n; i++)
        if (!dp_fits(W[i], cols, bits)) return 0;
    /* rows a launch: as many as fit DPB_SMEM (12,288 columns: 2) */
    int nt = 8;
    while (nt > 1 && (size_t)nt * dp_smem(cols) > DPB_SMEM) nt /= 2;
    if (nt < 2) return 0;
    const int lpr = ng >= 32 ? 32 : ng >= 16 ? 16 : 8;
    for (int t0 = 0; t0 < T; t0 += nt) {
        const int tn = T - t0 < nt ? T - t0 : nt, ntl = tn <= 2 ? 2 : tn <= 4 ? 4 : 8;
        const int rpt = (32 / lpr) * DPB_R(pf, bits);
        float *y[MVQ_MAX];
        for (int i = 0; i < n; i++) y[i] = Y[i] + (size_t)t0 * ldy[i];
        mvq_args a;
        memset(&a, 0, sizeof a);
        mvq_args_set(&a, n, W, y, ldy);
        mvq_tiles(&a, rpt);
        if (nw) { a.f.nw = nw; a.f.eps = eps; a.f.tout = tout ? tout + (size_t)t0 * ldx : NULL; }
        const float *x = X + (size_t)t0 * ldx, *x2 = X2 ? X2 + (size_t)t0 * ldx : NULL;
        if (lpr == 32) mvdpb_bits<32>(bits, pf, ntl, s, a, x, x2, ldx, tn);
        else if (lpr == 16) mvdpb_bits<16>(bits, pf, ntl, s, a, x, x2, ldx, tn);
        else mvdpb_bits<8>(bits, pf, ntl, s, a, x, x2, ldx, tn);
    }
    return 1;
}
