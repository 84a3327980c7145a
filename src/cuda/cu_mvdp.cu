/* Decode's matrix-vector products for 4-bit codes as integer dot products (k_mvdp).
 *
 * Why: k_mvq4 spends ~9 instructions a weight and k_mvtc ~5 (Nsight, bench/RESULTS.md sessions
 * 12-13), so both are bound by instruction issue at a quarter of the H200's bandwidth. Here the
 * input is turned into integers once a block, and a word of eight codes costs two and-masks,
 * a shift and six dp4a (four byte products summed into an int32 each): ~1.2 instructions a
 * weight. On the H200 (session 15) that took decode 419 -> 455 tok/s; its launches are now bound by
 * latency (a quarter of the issue slots busy at 2 blocks an SM), not by instructions.
 *
 * Exactness: each 64-column group of the input is scaled so that its largest |x| maps to
 * 127 * 2^16 and rounded to the integer X (|error| <= half a unit: 2^-24 of the group's largest
 * element, about fp32's own rounding), and X is split into three signed bytes,
 * X = 2^16 h + 2^8 m + l. The codes q (0..15) meet each byte in a dp4a, so the group's three sums
 * over q * h, q * m, q * l are exact int32s; they are joined in fp32 as 2^16 H + 2^8 M + L, then
 * times the group's unit, its scale, plus its bias times the input's exact fp32 group sum. NaN
 * or infinity in a group makes its unit NaN, so the outputs are NaN as the float kernels' are.
 *
 * Layout of the work: LPR lanes share a row, lane `sub` taking the row's groups sub, sub + LPR,
 * ...; a lane group takes R consecutive rows at once (their codes loaded together: R 32-byte
 * reads in flight a lane); a warp's R x 32 / LPR rows are one tile, and the block's eight warps
 * walk the launch's tiles (all matrices and slots, as k_mvq4). The R rows' partial sums are
 * reduced across the LPR lanes by halving: each shuffle stage trades half of the rows still
 * held, so R rows cost log2(LPR) + R - 1 shuffles, not R log2(LPR).
 *
 * 8-bit codes (the router and the shared expert's gate) take the same staged input, its bytes put
 * back in column order (two byte permutes a level an 8-column word, shared by the R rows), three
 * dp4a a word of four codes. With the router group's fused residual add and norm (mvq_fuse.add)
 * the staging normalizes first and block (0, 0) writes the normed input out. Both only with
 * LILY_CU_MVDP_Q8=1 (slower than k_mvq on that launch) or in the kernel test.
 *
 * LILY_CU_MVDP=0 turns the kernel off (k_mvtc / k_mvq4 / k_mvq instead); LILY_CU_MVDP_R=1|2|4 fixes R,
 * LILY_CU_MVDP_WARPS=4 gives 4 warps a block, for measuring. */
#include "cuda/cu_dev.h"
#include "cuda/cu_mvdp.h"

/* G 2: a lane's next group of the tile is fetched before this one is computed (rows of more than
 * LPR groups, the 4,096-column out-projections: their two round trips a tile in flight together;
 * LILY_CU_MVDP_G2=1, measured slower, below) */
/* Y[i] [slots][ldy[i]] (one row without eidx) = W[i] x, x = X row slot / xdiv (a.f.xrow for the
 * extra slot), silu(x) * X2 when X2; a.blk0 in tiles of R x 32 / LPR rows. CL -1: a decode
 * batch's slots routing themselves (a.f.rlog, slot s from token s / K's logits), 0 the rest. */
template <int LPR, int R, int SBT, int BITS, int G, int CL = 0>
__global__ void __launch_bounds__(DP_WARPS * WARP, 2) k_mvdp(mvq_args a, const float *__restrict__ X, const float *__restrict__ X2,
                                                          int ldx, const int *eidx, int xdiv) {
    extern __shared__ uint4 dxs[]; /* [cols / 64][DP_G4] the staged input */
    __shared__ int rs[WARP];       /* with a.f.rlog: the block's routing (experts, weights) */
    __shared__ float rw[WARP];
    const int cols = a.m[0].cols, ng = cols / 64, nrow16 = cols * BITS / 128, ntiles = a.blk0[a.n];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, sub = lane % LPR, rib = lane / LPR;
    const int rpt = (WARP / LPR) * R, slot = blockIdx.y;
    const bool xsl = a.f.xslot && slot >= a.f.xslot;
    const int nwb = blockDim.x / WARP;
    int tile = blockIdx.x * nwb + warp, mi = 0, e = 0;
    uint4 c[R][BITS / 2];
    float sc[R], bi[R];
#pragma unroll
    for (int k = 0; k < R; k++) {
#pragma unroll
        for (int i = 0; i < BITS / 2; i++) c[k][i] = make_uint4(0, 0, 0, 0);
        sc[k] = bi[k] = 0.f;
    }
    dp_rows t;
    t.w = NULL; t.s = t.b = NULL; t.lg = t.r0 = t.nr = 0;
    /* a dense matrix's first group is fetched before the wait on the predecessor (weights are
     * never written); an expert's index comes from that kernel */
    /* (LILY_DP_RAWSB: the scales' and biases' raw bits held across the wait and converted after
     * it, so a block started after its predecessor ended does not stop at the conversion for
     * loads from DRAM before it even reaches its wait) */
    bool have = false;
    uint32_t sr[R], br[R];
#pragma unroll
    for (int k = 0; k < R; k++) sr[k] = br[k] = 0u;
    int psbt = 0;
    if (!eidx && !a.f.nopre && tile < ntiles && sub < ng) {
        t = dp_locate<R, BITS>(a, xsl, 0, tile, mi, rpt, rib);
        const dmat &m = xsl ? a.f.xm[mi] : a.m[mi];
        if (LILY_DP_RAWSB) {
            dp_fetch_raw<R, SBT, BITS>(t, m.sbt, sub, nrow16, m.cols / m.group, c, sr, br);
            psbt = m.sbt;
        } else dp_fetch<R, SBT, BITS>(t, m.sbt, sub, nrow16, m.cols / m.group, c, sc, bi);
        have = true;
    }
    float n0[8];
    dp_nw0(a, cols, n0);
    CU_PDL();
    if (LILY_DP_RAWSB && have) {
#pragma unroll
        for (int k = 0; k < R; k++) {
#ifdef __CUDA_ARCH__
            asm volatile("" : "+r"(sr[k]), "+r"(br[k])); /* (the conversions stay after the wait) */
#endif
            sc[k] = dp_sb_cvt<SBT>(sr[k], psbt);
            bi[k] = dp_sb_cvt<SBT>(br[k], psbt);
        }
    }
    const float *x = X, *x2 = X2;
    int t0 = 0;
    if (a.f.rlog) { /* the block routes itself (a launch fewer a layer): warp 0, into shared memory,
                     * while the other warps stage the input (the slot's input row is the token's,
                     * whichever expert); dp_stage's closing barrier publishes rs and rw. A decode
                     * batch's slot s is token s / K's (xdiv K), routed from that token's logits:
                     * instances of their own (CL < 0), so one token's code is as before them (their
                     * arithmetic in every instance cost one token's decode ~2%, bench/RESULTS.md
                     * session 31) */
        mvq_slot_input(a, X, X2, ldx, NULL, xdiv, xsl, slot, x, x2);
        if (warp == 0) {
            route_ld<8, LILY_DP_RDX>(CL < 0 ? a.f.rlog + (size_t)(xsl ? 0 : slot / a.f.K) * a.f.E : a.f.rlog, a.f.E, a.f.K, rs, rw);
            CU_MARK(2);
        }
        if (a.f.rovl) t0 = WARP;
        else __syncthreads(); /* (LILY_CU_ROUTE_OVL=0: then the staging by every warp) */
    } else if (eidx) e = mvq_slot_input(a, X, X2, ldx, eidx, xdiv, xsl, slot, x, x2);
    /* LILY_CU_MVDP_EPF=1 (a.f.epf, set by the launcher): an expert's first group fetched as soon
     * as its index is known, before the staging, as a dense matrix's is before the wait. Off: on
     * the H200 it made decode slower (tg128 469.0 against 481.7 after, bench/RESULTS.md session
     * 18). Not understood: unlike the dense fetch, which is hidden behind the predecessor, these
     * loads go out after the wait, ahead of the staging's own input loads; those may queue behind
     * the codes' misses (untested guess). */
    if (a.f.rlog && !t0) e = xsl ? 0 : rs[CL < 0 ? slot % a.f.K : slot];
    if (eidx && a.f.epf && !t0 && tile < ntiles && sub < ng) { /* (routing beside the staging: e not known yet) */
        t = dp_locate<R, BITS>(a, xsl, e, tile, mi, rpt, rib);
        const dmat &m = xsl ? a.f.xm[mi] : a.m[mi];
        dp_fetch<R, SBT, BITS>(t, m.sbt, sub, nrow16, m.cols / m.group, c, sc, bi);
        have = true;
    }
    dp_stage(a, x, X2 ? x2 : NULL, cols, dxs, t0, n0);
    CU_MARK(0);
    if (a.f.rlog) { /* (a token's first slot's block 0 writes the token's choice) */
        if constexpr (CL < 0) {
            if (blockIdx.x == 0 && !xsl && slot % a.f.K == 0 && (int)threadIdx.x < a.f.K) {
                a.f.rsel[slot + threadIdx.x] = rs[threadIdx.x];
                a.f.rwt[slot + threadIdx.x] = rw[threadIdx.x];
            }
            e = xsl ? 0 : rs[slot % a.f.K];
        } else {
            if (blockIdx.x == 0 && slot == 0 && (int)threadIdx.x < a.f.K) {
                a.f.rsel[threadIdx.x] = rs[threadIdx.x];
                a.f.rwt[threadIdx.x] = rw[threadIdx.x];
            }
            e = xsl ? 0 : rs[slot];
        }
    }
    for (; tile < ntiles; tile += gridDim.x * nwb) {
        mi = 0;
        t = dp_locate<R, BITS>(a, xsl, e, tile, mi, rpt, rib);
        const dmat &m = xsl ? a.f.xm[mi] : a.m[mi];
        int rsel;
        const float acc = dp_tile<LPR, R, SBT, BITS, G>(t, SBT >= 0 ? SBT : m.sbt, m.cols / m.group, ng, nrow16, sub, dxs, have, c, sc, bi, rsel);
        if ((sub & (LPR / R - 1)) == 0 && tile < ntiles && rsel < t.nr)
            a.y[mi][(eidx ? (size_t)slot * a.ldy[mi] : 0) + t.r0 + rsel] = acc;
        if (tile < (int)(blockIdx.x * nwb + warp + gridDim.x * nwb)) CU_MARK(1); /* the first tile */
    }
}

template <int LPR, int R, int SBT, int BITS, int G, int CL = 0>
static void mvdp_go(cudaStream_t s, const mvq_args &a, int nslots, const float *X, const float *X2, int ldx, const int *eidx,
                    int xdiv) {
    /* as many blocks as the GPU holds at once over the slots, the walks made equal, as k_mvq4's
     * (mvq_grid; every block held with some warps a tile more measured slower, bench/RESULTS.md) */
    static mvq_kstate ks;
    const int warps = dp_warps(), blocks = (a.blk0[a.n] + warps - 1) / warps;
    const size_t sm = dp_smem(a.m[0].cols);
    const int gx = mvq_grid(k_mvdp<LPR, R, SBT, BITS, G, CL>, ks, blocks, nslots, 0, warps * WARP, sm);
    cu_go(k_mvdp<LPR, R, SBT, BITS, G, CL>, dim3(gx, nslots), warps * WARP, sm, s)(a, X, X2, ldx, eidx, xdiv);
}
template <int LPR, int R, int BITS, int G = 1, int CL = 0>
static void mvdp_sbt(int sbt, cudaStream_t s, const mvq_args &a, int nslots, const float *X, const float *X2, int ldx,
                     const int *eidx, int xdiv) {
    if (sbt == LW_BF16) mvdp_go<LPR, R, LW_BF16, BITS, G, CL>(s, a, nslots, X, X2, ldx, eidx, xdiv);
    else mvdp_go<LPR, R, -1, BITS, G, CL>(s, a, nslots, X, X2, ldx, eidx, xdiv);
}
/* (8-bit codes: R <= 2, their two-times-larger rows in registers). CL: 0 plain, -1 a decode batch's
 * slots routing themselves (token slot / K's logits) */
template <int LPR, int CL>
static void mvdp_rr(int R, int bits, int g2, int sbt, cudaStream_t s, const mvq_args &a, int nslots, const float *X, const float *X2,
                    int ldx, const int *eidx, int xdiv) {
    if (g2 && bits == 4 && LPR == 32) mvdp_sbt<LPR, 2, 4, 2, CL>(sbt, s, a, nslots, X, X2, ldx, eidx, xdiv);
    else if (bits == 8) {
        if (R >= 2 && LPR >= 2) mvdp_sbt<LPR, (LPR >= 2 ? 2 : 1), 8, 1, CL>(sbt, s, a, nslots, X, X2, ldx, eidx, xdiv);
        else mvdp_sbt<LPR, 1, 8, 1, CL>(sbt, s, a, nslots, X, X2, ldx, eidx, xdiv);
    } else if (R >= 4 && LPR >= 4) mvdp_sbt<LPR, (LPR >= 4 ? 4 : 1), 4, 1, CL>(sbt, s, a, nslots, X, X2, ldx, eidx, xdiv);
    else if (R >= 2 && LPR >= 2) mvdp_sbt<LPR, (LPR >= 2 ? 2 : 1), 4, 1, CL>(sbt, s, a, nslots, X, X2, ldx, eidx, xdiv);
    else mvdp_sbt<LPR, 1, 4, 1, CL>(sbt, s, a, nslots, X, X2, ldx, eidx, xdiv);
}
/* a decode batch's slots routing themselves (K a token, xdiv K; CL -1), not one token's K (+ the
 * shared): more routed slots (those before xslot) than K */
static bool mvdp_batch_routes(const mvq_args &a, int nslots) { return a.f.rlog && (a.f.xslot ? a.f.xslot : nslots) != a.f.K; }
template <int LPR>
static void mvdp_r(int R, int bits, int g2, int sbt, cudaStream_t s, const mvq_args &a, int nslots, const float *X, const float *X2,
                   int ldx, const int *eidx, int xdiv) {
    if (mvdp_batch_routes(a, nslots)) mvdp_rr<LPR, -1>(R, bits, g2, sbt, s, a, nslots, X, X2, ldx, eidx, xdiv);
    else mvdp_rr<LPR, 0>(R, bits, g2, sbt, s, a, nslots, X, X2, ldx, eidx, xdiv);
}

static int test_r = 0;
void cu_mvdp_test_r(int r) { test_r = r; }


int cu_mvdp_group(cudaStream_t s, const mvq_args *in, int sbt, const float *X, const float *X2, int ldx, const int *eidx,
                  int xdiv, int nslots) {
    const int cols = in->m[0].cols, ng = cols / 64;
    const int bits = in->m[0].bits;
    /* 8-bit codes and the fused norm (the router group) only where asked (LILY_CU_MVDP_Q8=1) or
     * tested: on the H200 that launch took 9.3 us against k_mvq's 7.1 (17 blocks, each staging the
     * norm; tg128 446 against 464, bench/RESULTS.md) */
    static int q8 = -1;
    const int q8_on = cu_env_flag(&q8, "LILY_CU_MVDP_Q8", 0) || test_r > 0;
    if (!mvdp_enabled() || test_r < 0 || in->f.sel || cols % 64 != 0 || cols > DP_MAX_COLS || (bits != 4 && bits != 8)) return 0;
    if (!eidx && nslots > 1) return 0; /* (a dense launch here is one row: k_mvq's ROWS takes several) */
    if (!q8_on && (bits == 8 || in->f.add)) return 0;
    if (in->f.gz && (in->n != 1 || eidx || nslots != 1 || in->f.nw || in->f.rlog || in->f.xslot || X2 || cols % 128)) return 0;
    /* routing in the launch: one token's slots (and the shared expert's), or a decode batch's, K a
     * token (xdiv K), each token's shared slot after all the routed ones (xslot = T K, T of them);
     * route_ld's register form (E <= 256, K <= 32) */
    if (in->f.rlog && (!eidx || in->f.E > 8 * 32 || in->f.K > 32 || in->f.K < 1)) return 0;
    const int routed = in->f.xslot ? in->f.xslot : nslots;
    if (in->f.rlog && (routed % in->f.K || (in->f.xslot && nslots - in->f.xslot != routed / in->f.K))) return 0;
    if (mvdp_batch_routes(*in, nslots) && xdiv != in->f.K) return 0;
    for (int i = 0; i < in->n; i++)
        if (!dp_fits(&in->m[i], cols, bits) ||
            (in->f.xslot && (!dp_fits(&in->f.xm[i], cols, bits) || in->f.xm[i].rows != in->m[i].rows)))
            return 0;
    const int lpr = ng >= 32 ? 32 : ng >= 16 ? 16 : ng >= 8 ? 8 : ng >= 4 ? 4 : ng >= 2 ? 2 : 1;
    /* R: rows a lane group, 2 for every launch kind. Session 15 (H200) chose 4 over forms that set R per
     * launch (R = 4 everywhere tg128 464 against 447 for R as large as kept every warp slot busy, 455
     * against 442 for R as large as gave every SM a block); on an H100 with session 43's code, 2 everywhere
     * gave tg128 544 -> 552 (+1.5%), tg128@4096 +1.4%, two rows +1.5%, eight -0.3%, while 2 for one or
     * two launch kinds only was -2% to +0.4% (the kinds' instances taking turns in the SMs' instruction
     * caches, a guess; bench/RESULTS.md session 44). Not yet measured on the H200. LILY_CU_MVDP_R=1|2|4
     * fixes it for every kind, LILY_CU_MVDP_R2=MASK sets 2 for the kinds in MASK and 4 for the rest (1
     * the gated out-projections, 2 the in-projections with the norm, 4 the experts' gate|up, 8 the
     * rest), for measuring. */
    static int env_r = INT_MIN, env_rk = INT_MIN;
    cu_env_int(&env_r, "LILY_CU_MVDP_R", 2);
    int R = env_r == 1 || env_r == 4 ? env_r : 2;
    const int kind = in->f.gz ? 1 : in->f.nw ? 2 : eidx ? 4 : 8, rk = cu_env_int(&env_rk, "LILY_CU_MVDP_R2", -1);
    if (rk >= 0) R = rk & kind ? 2 : 4;
    if (test_r == 1 || test_r == 2 || test_r == 4) R = test_r;
    if (bits == 8 && R > 2) R = 2;
    if (R > lpr) R = lpr;
    /* LILY_CU_MVDP_G2=1 (or the kernel test's form 3): rows of more than 32 groups (4,096 columns:
     * the out-projections) fetch a lane's two groups of a tile together at R = 2 (as many bytes in
     * flight a warp as R = 4, twice the blocks). Off: measured slower on the H200 (tg128 451.5 / 451.4
     * against 455.8 / 455.9 one group at a time at R = 4, bench/RESULTS.md session 15). */
    static int g2e = -1;
    const int g2 = lpr == 32 && ng > 32 && bits == 4 && (test_r == 3 || (test_r == 0 && cu_env_flag(&g2e, "LILY_CU_MVDP_G2", 0)));
    if (g2) R = 2;
    mvq_args a = *in;
    static int epf = -1;
    a.f.epf = cu_env_flag(&epf, "LILY_CU_MVDP_EPF", 0);
    static int pre = -1;
    a.f.nopre = !cu_env_flag(&pre, "LILY_CU_MVDP_PRE", 1);
    static int rovl = -1; /* LILY_CU_ROUTE_OVL=0: the routing warp, then the staging, for measuring */
    a.f.rovl = in->f.rlog && !in->f.add && cu_env_flag(&rovl, "LILY_CU_ROUTE_OVL", 1);
    mvq_tiles(&a, (32 / lpr) * R);
    switch (lpr) {
    case 32: mvdp_r<32>(R, bits, g2, sbt, s, a, nslots, X, X2, ldx, eidx, xdiv); break;
    case 16: mvdp_r<16>(R, bits, g2, sbt, s, a, nslots, X, X2, ldx, eidx, xdiv); break;
    case 8: mvdp_r<8>(R, bits, g2, sbt, s, a, nslots, X, X2, ldx, eidx, xdiv); break;
    case 4: mvdp_r<4>(R, bits, g2, sbt, s, a, nslots, X, X2, ldx, eidx, xdiv); break;
    case 2: mvdp_r<2>(R, bits, g2, sbt, s, a, nslots, X, X2, ldx, eidx, xdiv); break;
    default: mvdp_r<1>(R, bits, g2, sbt, s, a, nslots, X, X2, ldx, eidx, xdiv); break;
    }
    return 1;
}

int cu_matvec_gated(cudaStream_t s, const dmat *W, const float *o, const float *z, const float *gw, float eps, float *y) {
    if (!z || !gw) return 0;
    mvq_args a;
    memset(&a, 0, sizeof a);
    a.n = 1;
    a.m[0] = *W;
    a.y[0] = y;
    a.f.gz = z;
    a.f.gw = gw;
    a.f.eps = eps;
    return cu_mvdp_group(s, &a, W->sbt, o, NULL, W->cols, NULL, 1, 1);
}
