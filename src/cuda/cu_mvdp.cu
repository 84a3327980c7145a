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

/* The row (of the R) whose whole sum dp_halve leaves on lane sub: its sel, without the sums. */
template <int LPR, int N>
static __device__ __forceinline__ int dp_halve_sel(int sub) {
    int sel = 0;
#pragma unroll
    for (int o = LPR / 2, n = N; o; o >>= 1)
        if (n > 1) {
            if (sub & o) sel += n / 2;
            n /= 2;
        }
    return sel;
}
/* a row's router share p in fixed point (RLIN_ONE a unit); NaN or past RLIN_MAX sets *flag */
static __device__ __forceinline__ unsigned long long rlin_fx(float p, unsigned long long *flag) {
    if (!(fabsf(p) <= RLIN_MAX)) {
        atomicOr(flag, 1ull);
        return 0ull;
    }
    return (unsigned long long)(long long)rint((double)p * RLIN_ONE);
}
/* The experts' launch routing from the out-projection's sums (CL -3, mvq_fuse.rp): the staged input
 * is rmsnorm(x + add) * nw as the router group staged it, the sum of squares by warps 1.. (warp 0
 * meanwhile loads the sums), then warp 0 routes on the logits (sums times 1 / rms, as the router's
 * own would be on t) while the others stage; the closing barrier publishes rs and rw. Block (0, 0)
 * writes t to tout and the shared gate's logit to rp->sr. n0: nw of word threadIdx.x - WARP. */
struct dp_rq { /* the descriptor's fields dp_stage_rq needs, read before the wait (set at load, never written
                * in a step), so the sums' loads after it depend on no other round trip */
    const unsigned long long *acc;
    float *sr;
    int ne, ldr, ast;
};
static __device__ __forceinline__ void dp_stage_rq(const mvq_args &a, const dp_rq &rp, const float *x, int cols, uint4 *xs,
                                                const float (&n0)[8], int *rs, float *rw) {
    __shared__ float red[32];
    const int nw = cols / 8, st = blockDim.x - WARP, tid = threadIdx.x, warp = tid / WARP, lane = tid % WARP;
    const float *add = a.f.add;
    const bool b00 = blockIdx.x == 0 && blockIdx.y == 0;
    long long q[8];
    unsigned long long flag = 0ull;
    long long qs = 0;
    float ss = 0.f, v0[8] = { 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f };
    if (warp == 0) {
#pragma unroll
        for (int i = 0; i < 8; i++) q[i] = lane + WARP * i < a.f.E ? (long long)__ldcg(rp.acc + (size_t)(lane + WARP * i) * rp.ast) : 0ll;
        flag = __ldcg(rp.acc + (size_t)rp.ldr * rp.ast);
        if (b00 && lane == 0 && rp.ne > a.f.E) qs = (long long)__ldcg(rp.acc + (size_t)a.f.E * rp.ast);
    } else
        for (int w = tid - WARP; w < nw; w += st)
            for (int j = 0; j < 8; j++) {
                const int c = 8 * w + j;
                const float v = x[c] + add[c];
                if (w == tid - WARP) v0[j] = v;
                ss += v * v;
            }
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    ss = 0.f;
    for (int i = 0; i < (int)(blockDim.x / WARP); i++) ss += red[i];
    const float r = 1.0f / sqrtf(ss / cols + a.f.eps);
    if (warp == 0) {
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = flag ? NAN : (float)((double)q[i] * (1.0 / RLIN_ONE)) * r;
        route_regs<8, LILY_DP_RDX>(v, a.f.E, a.f.K, rs, rw);
        if (b00 && lane == 0 && rp.ne > a.f.E) rp.sr[0] = flag ? NAN : (float)((double)qs * (1.0 / RLIN_ONE)) * r;
    } else
        for (int w0 = 0; w0 < nw; w0 += st) { /* (whole warps: nw a multiple of 8, st of 32) */
            const int w = w0 + tid - WARP;
            float v[8] = { 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f };
            if (w < nw)
                for (int j = 0; j < 8; j++) {
                    const int c = 8 * w + j;
                    v[j] = (w0 == 0 ? v0[j] : x[c] + add[c]) * r * (w0 == 0 ? n0[j] : a.f.nw[c]);
                    if (b00) a.f.tout[c] = v[j];
                }
            dp_put(v, w < nw, w, xs);
        }
    __syncthreads();
}

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
    __shared__ float ru[CL == -2 ? DP_WARPS : 1][R]; /* CL -2: a warp's rows (x + o) ln2 */
    const int cols = a.m[0].cols, ng = cols / 64, nrow16 = cols * BITS / 128, ntiles = a.blk0[a.n];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, sub = lane % LPR, rib = lane / LPR;
    const int rpt = (WARP / LPR) * R, slot = blockIdx.y;
    const bool xsl = a.f.xslot && slot == a.f.xslot;
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
    /* CL -2 (one token's out-projection, a tile a warp at most): the warp's slice of the router's
     * layout (its rows' code words, their group's scales and biases) by cp.async, the block's
     * fixed-point sums zeroed, and the residual and ln2 of the row this lane will hold, all before
     * the wait (weights, and x written four launches back) */
    unsigned long long *bacc = NULL; /* [ldr + 2]: the sums, [ldr] the flag (+ 1: 16-byte slices after it) */
    uint32_t *rq = NULL;             /* [ldr] code words, then [ldr] float2 (scale, bias): the warp's slice */
    float xv = 0.f, lv = 0.f;
    if constexpr (CL == -2) {
        const cu_rlin &rp = *a.f.rp;
        bacc = (unsigned long long *)(dxs + (size_t)ng * DP_G4);
        rq = (uint32_t *)(bacc + rp.ldr + 2) + (size_t)warp * 3 * rp.ldr;
        for (int i = threadIdx.x; i <= rp.ldr; i += blockDim.x) bacc[i] = 0ull;
        if (tile < ntiles) {
            const int r0 = tile * rpt; /* (one matrix, rows a multiple of rpt = 4) */
            const uint4 *gq = (const uint4 *)(rp.q + (size_t)(r0 / 4) * rp.ldr);
            const uint4 *gs = (const uint4 *)(rp.sb + (size_t)(r0 / 64) * rp.ldr);
            for (int i = lane; i < rp.ldr / 4; i += WARP) cu_cp<16>((uint4 *)rq + i, gq + i);
            for (int i = lane; i < rp.ldr / 2; i += WARP) cu_cp<16>((uint4 *)(rq + rp.ldr) + i, gs + i);
            cu_cp_commit();
            const int hr = r0 + rib * R + dp_halve_sel<LPR, R>(sub);
            if ((sub & (LPR / R - 1)) == 0 && hr < a.m[0].rows) {
                xv = rp.xr[hr];
                lv = rp.ln[hr];
            }
        }
    }
    float n0[8];
    dp_rq rq3 = { NULL, NULL, 0, 0, 1 };
    if constexpr (CL == -3) { /* nw of the thread's first staged word (dp_stage_rq: word threadIdx.x - WARP) */
        const int w = threadIdx.x - WARP;
        for (int j = 0; j < 8; j++) n0[j] = w >= 0 && w < cols / 8 ? a.f.nw[8 * w + j] : 0.f;
        rq3 = { a.f.rp->acc, a.f.rp->sr, a.f.rp->ne, a.f.rp->ldr, a.f.rp->ast };
    } else dp_nw0(a, cols, n0);
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
    if constexpr (CL == -3) { /* routing from the out-projection's sums (dp_stage_rq) */
        mvq_slot_input(a, X, X2, ldx, NULL, xdiv, xsl, slot, x, x2);
        dp_stage_rq(a, rq3, x, cols, dxs, n0, rs, rw);
        CU_MARK(0);
        if (blockIdx.x == 0 && slot == 0 && (int)threadIdx.x < a.f.K) {
            a.f.rsel[threadIdx.x] = rs[threadIdx.x];
            a.f.rwt[threadIdx.x] = rw[threadIdx.x];
        }
        e = xsl ? 0 : rs[slot];
    } else if (a.f.rlog) { /* the block routes itself (a launch fewer a layer): warp 0, into shared memory,
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
    if constexpr (CL != -3) dp_stage(a, x, X2 ? x2 : NULL, cols, dxs, t0, n0);
    CU_MARK(0);
    if (CL != -3 && a.f.rlog) { /* (a token's first slot's block 0 writes the token's choice) */
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
        if constexpr (CL == -2) { /* the tile's rows' router shares, summed in fixed point (any order) */
            const cu_rlin &rp = *a.f.rp;
            if ((sub & (LPR / R - 1)) == 0) ru[warp][rsel] = rsel < t.nr ? (acc + xv) * lv : 0.f;
            cu_cp_wait<0>();
            __syncwarp();
            const float2 *sbw = (const float2 *)(rq + rp.ldr);
            for (int r = lane; r < rp.ne; r += WARP) {
                const uint32_t w4 = rq[r];
                const float2 g = sbw[r];
                float p = 0.f;
#pragma unroll
                for (int k = 0; k < R; k++) p += fmaf(g.x, (float)((w4 >> (8 * k)) & 255u), g.y) * ru[warp][k];
                const unsigned long long v = rlin_fx(p, bacc + rp.ldr);
                if (v) atomicAdd(bacc + r, v);
            }
        }
    }
    if constexpr (CL == -2) { /* the block's sums into the launch's */
        const cu_rlin &rp = *a.f.rp;
        __syncthreads();
        for (int i = threadIdx.x; i <= rp.ldr; i += blockDim.x) {
            const unsigned long long v = bacc[i];
            if (v && i < rp.ldr) atomicAdd(rp.acc + (size_t)i * rp.ast, v);
            else if (v) atomicOr(rp.acc + (size_t)i * rp.ast, v);
        }
    }
}

template <int LPR, int R, int SBT, int BITS, int G, int CL = 0>
static void mvdp_go(cudaStream_t s, const mvq_args &a, int nslots, const float *X, const float *X2, int ldx, const int *eidx,
                    int xdiv) {
    /* as many blocks as the GPU holds at once over the slots, the walks made equal, as k_mvq4's
     * (mvq_grid; every block held with some warps a tile more measured slower, bench/RESULTS.md) */
    static mvq_kstate ks;
    const int warps = dp_warps(), blocks = (a.blk0[a.n] + warps - 1) / warps;
    /* CL -2: the block's sums and its warps' slices of the router's layout past the staged input,
     * and a tile a warp (the slices are fetched before the wait for that tile alone) */
    const size_t sm = dp_smem(a.m[0].cols) + (CL == -2 ? (RLIN_LDR_MAX + 2) * 8 + (size_t)warps * 3 * RLIN_LDR_MAX * 4 : 0);
    const int gx = mvq_grid(k_mvdp<LPR, R, SBT, BITS, G, CL>, ks, blocks, nslots, CL == -2, warps * WARP, sm);
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
/* a decode batch's slots routing themselves (K a token, xdiv K; CL -1), not one token's K (+ the shared) */
static bool mvdp_batch_routes(const mvq_args &a, int nslots) { return a.f.rlog && nslots != a.f.K + (a.f.xslot ? 1 : 0); }
template <int LPR>
static void mvdp_r(int R, int bits, int g2, int sbt, cudaStream_t s, const mvq_args &a, int nslots, const float *X, const float *X2,
                   int ldx, const int *eidx, int xdiv) {
    if constexpr (LPR == 32) /* the router by linearity (cu_rlin_ok: 4-bit codes, R 4, G 1) */
        if (a.f.rp) {
            if (eidx) mvdp_sbt<32, 4, 4, 1, -3>(sbt, s, a, nslots, X, X2, ldx, eidx, xdiv);
            else mvdp_sbt<32, 4, 4, 1, -2>(sbt, s, a, nslots, X, X2, ldx, eidx, xdiv);
            return;
        }
    if (mvdp_batch_routes(a, nslots)) mvdp_rr<LPR, -1>(R, bits, g2, sbt, s, a, nslots, X, X2, ldx, eidx, xdiv);
    else mvdp_rr<LPR, 0>(R, bits, g2, sbt, s, a, nslots, X, X2, ldx, eidx, xdiv);
}

static int test_r = 0, g2_env = -1;
void cu_mvdp_test_r(int r) { test_r = r; }
static int lpr_of(int ng) { return ng >= 32 ? 32 : ng >= 16 ? 16 : ng >= 8 ? 8 : ng >= 4 ? 4 : ng >= 2 ? 2 : 1; }
/* LILY_CU_MVDP_R, read once for cu_mvdp_group and rlin_r */
static int env_r(void) {
    static int r = INT_MIN;
    cu_env_int(&r, "LILY_CU_MVDP_R", 4);
    return r;
}
/* R where nothing asks for another (LILY_CU_MVDP_R, the kernel test's forms) */
static int rlin_r(void) {
    return test_r != 0 || env_r() == 1 || env_r() == 2 || cu_env_flag(&g2_env, "LILY_CU_MVDP_G2", 0) ? 0 : 4;
}


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
    if (in->f.rp) { /* the router by linearity: only the two forms cu_rlin_ok promised (no fallback computes it) */
        const int ok = bits == 4 && !X2 && !in->f.rlog && !in->f.sel && dp_warps() == DP_WARPS && lpr_of(ng) == 32 && rlin_r() == 4 &&
                       (eidx ? in->f.add && in->f.nw && in->f.tout && !in->f.gz && in->f.E >= 1 && in->f.E <= 256 && in->f.K >= 1 &&
                                   in->f.K <= 32 && (in->f.xslot ? in->f.xslot == in->f.K && nslots == in->f.K + 1 : nslots == in->f.K)
                             : in->n == 1 && nslots == 1 && cu_rlin_ok(&in->m[0], NULL, NULL, 1, 1) && !in->f.nw && !in->f.add && !in->f.xslot);
        LILY_ASSERT(ok);
    } else if (!q8_on && (bits == 8 || in->f.add)) return 0;
    if (in->f.gz && (in->n != 1 || eidx || nslots != 1 || in->f.nw || in->f.rlog || in->f.xslot || X2 || cols % 128)) {
        LILY_ASSERT(!in->f.rp);
        return 0;
    }
    /* routing in the launch: one token's slots (and the shared expert's), or a decode batch's, K a
     * token (rlog without the shared slot, xdiv K); route_ld's register form (E <= 256, K <= 32) */
    if (in->f.rlog && (!eidx || in->f.E > 8 * 32 || in->f.K > 32 || in->f.K < 1 || (in->f.xslot && in->f.xslot != in->f.K)))
        return 0;
    if (mvdp_batch_routes(*in, nslots) && (in->f.xslot || xdiv != in->f.K || nslots % in->f.K)) return 0;
    for (int i = 0; i < in->n; i++)
        if (!dp_fits(&in->m[i], cols, bits) ||
            (in->f.xslot && (!dp_fits(&in->f.xm[i], cols, bits) || in->f.xm[i].rows != in->m[i].rows))) {
            LILY_ASSERT(!in->f.rp);
            return 0;
        }
    const int lpr = lpr_of(ng);
    /* R: rows a lane group, 4: more bytes in flight a warp measured faster than more warps on
     * every launch of a token (H200, bench/RESULTS.md session 15: R = 4 everywhere tg128 464 against
     * 447 for R as large as kept every warp slot busy; 455 against 442 for R as large as gave every
     * SM a block, which put the 2,048-row out-projections at R = 1, 256 blocks, not 64; Nsight alone
     * timed those two the same). LILY_CU_MVDP_R=1|2|4 fixes it, for measuring. */
    int R = env_r() == 1 || env_r() == 2 ? env_r() : 4;
    if (test_r == 1 || test_r == 2 || test_r == 4) R = test_r;
    if (bits == 8 && R > 2) R = 2;
    if (R > lpr) R = lpr;
    /* LILY_CU_MVDP_G2=1 (or the kernel test's form 3): rows of more than 32 groups (4,096 columns:
     * the out-projections) fetch a lane's two groups of a tile together at R = 2 (as many bytes in
     * flight a warp as R = 4, twice the blocks). Off: measured slower on the H200 (tg128 451.5 / 451.4
     * against 455.8 / 455.9 one group at a time at R = 4, bench/RESULTS.md session 15). */
    const int g2 = !in->f.rp && lpr == 32 && ng > 32 && bits == 4 && (test_r == 3 || (test_r == 0 && cu_env_flag(&g2_env, "LILY_CU_MVDP_G2", 0)));
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

/* The router by linearity's launches need: both kernels at 32 lanes a row (at least 2,048
 * columns: H for the gate|up, the out-projection's own for W) and R 4 (LILY_CU_MVDP_R and the
 * kernel test's forms change R), the router's rows in route_regs' registers. */
int cu_rlin_ok(const dmat *W, const dmat *gate, const dmat *up, int E, int K) {
    const int H = W->rows;
    if (gate && (!dp_fits(gate, H, 4) || !dp_fits(up, H, 4))) return 0;
    return mvdp_enabled() && rlin_r() == 4 && dp_warps() == DP_WARPS && dp_fits(W, W->cols, 4) &&
           W->cols >= 2048 && W->cols <= DP_MAX_COLS && H >= 2048 && H <= DP_MAX_COLS && H % 64 == 0 && E >= 1 && E <= 256 &&
           cu_rlin_ldr(E, 1) <= RLIN_LDR_MAX && K >= 1 && K <= 32 && K <= E;
}

/* One token's out-projection y = W o on k_mvdp: o gated-normed while staged where z and gw, the
 * router's shares added where rp (cu_matvec_gated's and cu_matvec_rp's one body) */
static int mvdp_out(cudaStream_t s, const dmat *W, const float *o, const float *z, const float *gw, float eps, float *y, const cu_rlin *rp) {
    mvq_args a;
    memset(&a, 0, sizeof a);
    a.n = 1;
    a.m[0] = *W;
    a.y[0] = y;
    a.f.gz = z;
    a.f.gw = gw;
    a.f.eps = eps;
    a.f.rp = rp;
    return cu_mvdp_group(s, &a, W->sbt, o, NULL, W->cols, NULL, 1, 1);
}

int cu_matvec_rp(cudaStream_t s, const dmat *W, const float *o, const float *z, const float *gw, float eps, float *y, const cu_rlin *rp) {
    return mvdp_out(s, W, o, z, gw, eps, y, rp);
}

int cu_matvec_gated(cudaStream_t s, const dmat *W, const float *o, const float *z, const float *gw, float eps, float *y) {
    if (!z || !gw) return 0;
    return mvdp_out(s, W, o, z, gw, eps, y, NULL);
}
