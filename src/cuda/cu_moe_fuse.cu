/* Decode's MoE in one launch (k_moe_fuse, LILY_CU_MOE_FUSE=1; off until a device measures it):
 * the experts' gate|up, routed by each block from the router's logits, and their down with the
 * weighted combine into the residual, on k_mvdp's staged integer input and tiles (cu_mvdp.h).
 *
 * Why: a decode layer's MoE was two launches on the path after the router group: the gate|up
 * (~10 us, routing itself) and the down with the combine folded in (k_mvdp_comb, 6-7 us), the
 * second waiting for the whole first although each expert's down needs only that expert's
 * h = silu(g) u. Here the slot's blocks are one thread block cluster (CL blocks, 16 at the real
 * shapes, so 9 slots are 144 blocks, two an SM): block b computes the gate and up rows
 * b I / CL .. (b + 1) I / CL - 1, the cluster meets once (barrier.cluster), and each block reads
 * the slot's whole g and u from the others' shared memory (DSMEM), stages h as k_mvdp_comb does
 * and computes down rows b H / CL .. (b + 1) H / CL - 1 of its slot.
 *
 * The combine across slots has no cluster: each block writes its slot's raw down sums to D
 * [slots][H], and the last of the slots' blocks b to finish (a counter a b, cnt) sums rows
 * b H / CL .. of all slots into the residual in k_mvdp_comb's order (the routed slots by their
 * weights, then the gated shared one, added to x + add), so the result is that launch's to the
 * bit, and the next launch's staging normalizes x (the fold, s->fold_nw). No float atomics: the
 * sum's order is fixed, so a near-tie between two tokens cannot go either way from run to run.
 *
 * Numerics: the gate|up tiles are k_mvdp's at the launcher's LPR and R for H columns (dp_tile
 * sums a row's groups in one order whichever warp holds it), the down tiles k_mvdp_comb's for I,
 * h staged by dp_put from silu(g) * u as dp_stage_warp does: the kernel test asks for the two
 * launches' residual exactly. */
#include "cuda/cu_mvdp.h"
#include <stdio.h>

typedef struct {
    dmat g, u, d;           /* the routed experts' gate and up [E][I][H], down [E][H][I] */
    dmat sg, su, sd;        /* the shared expert's (slot K when ns > K), the same shapes */
    const float *rlog;      /* [E] the router's logits */
    const float *sr;        /* [1] the shared expert's gate logit (ns > K) */
    const float *t;         /* [H] the normed input */
    float *x;               /* [H] the residual, updated in place */
    const float *add;       /* [H] the mixer's output not yet added, or NULL */
    float *D;               /* [ns][H] the slots' down sums (scratch) */
    unsigned *cnt;          /* [CL] finish counters, 0 between launches */
    int *rsel;              /* [K] the choice, written by block (0, 0) */
    float *rwt;             /* [K] its weights */
    int E, K, ns;           /* experts, routed slots, all slots */
    int pf;                 /* L2 prefetches (LILY_CU_MOE_PF, a mask): 1 the block's down rows once routed, 2 its
                             * gate|up rows once routed, 4 the shared slot's gate|up rows before the wait */
    mvq_args st;            /* dp_stage's: no norm, no add (t is normed already) */
} mf_args;

/* [p, p + n) into L2 (the 16-byte units inside it: the emulator faults any other), a CU_L2PF_CHUNK a
 * thread from thread t0 on; returns the next free thread (chunks past the block's threads are left) */
static __device__ __forceinline__ int mf_pf(const char *p, size_t n, int t0) {
    const uintptr_t s = ((uintptr_t)p + 15) & ~(uintptr_t)15, e = ((uintptr_t)p + n) & ~(uintptr_t)15;
    const int nc = e > s ? (int)((e - s + CU_L2PF_CHUNK - 1) / CU_L2PF_CHUNK) : 0, c = (int)threadIdx.x - t0;
    if (c >= 0 && c < nc) {
        const uintptr_t o = s + (uintptr_t)c * CU_L2PF_CHUNK;
        cu_l2_pf((const char *)o, (unsigned)(e - o < CU_L2PF_CHUNK ? e - o : CU_L2PF_CHUNK));
    }
    return t0 + nc;
}
/* rows r0 .. r0 + n - 1 of expert e of m: codes, scales, biases */
static __device__ __forceinline__ int mf_pf_rows(const dmat &m, int e, int r0, int n, int t0) {
    const size_t rb = (size_t)m.cols * m.bits / 8, sb = (size_t)(m.cols / m.group) * (m.sbt == LW_F32 ? 4 : 2);
    t0 = mf_pf((const char *)m.w + (long long)e * m.ew + r0 * rb, n * rb, t0);
    t0 = mf_pf((const char *)m.s + (long long)e * m.es + r0 * sb, n * sb, t0);
    return mf_pf((const char *)m.b + (long long)e * m.es + r0 * sb, n * sb, t0);
}

/* One tile of m's rows t over the staged input xs (m.cols columns), nothing fetched ahead: dp_tile's
 * sums, so the gate|up and down match k_mvdp's and k_mvdp_comb's at the same LPR and R */
template <int LPR, int R, int SBT>
static __device__ __forceinline__ float mf_tile(const dp_rows &t, const dmat &m, int sub, const uint4 *xs, int &rsel) {
    uint4 c[R][2];
    float sc[R], bi[R];
#pragma unroll
    for (int k = 0; k < R; k++) { /* (zeroed: g++ cannot see that dp_tile fetches them first) */
        c[k][0] = c[k][1] = make_uint4(0, 0, 0, 0);
        sc[k] = bi[k] = 0.f;
    }
    bool have = false;
    return dp_tile<LPR, R, SBT, 4, 1>(t, SBT >= 0 ? SBT : m.sbt, m.cols / m.group, m.cols / 64, m.cols * 4 / 128, sub, xs, have, c, sc, bi,
                                      rsel);
}

/* Block (b, slot) of a cluster of CL along x. LPRA, RA: the gate|up tiles' lanes a row and rows a
 * lane group (H columns); LPRD, RD: the down's (I columns). */
template <int LPRA, int RA, int LPRD, int RD, int SBT, int CL>
__global__ void __launch_bounds__(DP_WARPS * WARP, 2) k_moe_fuse(const __grid_constant__ mf_args a) {
    extern __shared__ uint4 dxs[]; /* [H / 64][DP_G4] the staged input, later h's [I / 64][DP_G4];
                                    * then gu [2][I / CL] (this block's gate and up values, which the
                                    * cluster reads), then hl [2][I] (the slot's, gathered) */
    __shared__ int rs[WARP];       /* the token's routing (every block: any may finish a row tile) */
    __shared__ float rw[WARP];
    __shared__ int fin;
    const int H = a.g.cols, I = a.g.rows, ngA = H / 64;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, nwb = blockDim.x / WARP;
    const int b = blockIdx.x, slot = blockIdx.y, ipb = I / CL, hpb = H / CL;
    const bool shs = slot >= a.K;
    float *gu = (float *)(dxs + (size_t)ngA * DP_G4), *hl = gu + 2 * ipb;
    const float z8[8] = { 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f };
    if (shs && (a.pf & 4)) mf_pf_rows(a.su, 0, b * ipb, ipb, mf_pf_rows(a.sg, 0, b * ipb, ipb, 0)); /* (weights: never written) */
    CU_PDL(); /* the logits and t come from the router group's launch */
    if (warp == 0) route_ld<8, LILY_DP_RDX>(a.rlog, a.E, a.K, rs, rw);
    dp_stage(a.st, a.t, NULL, H, dxs, WARP, z8); /* (warps 1 ..; its closing barrier publishes rs, rw) */
    CU_MARK(0);
    if (b == 0 && slot == 0 && (int)threadIdx.x < a.K) {
        a.rsel[threadIdx.x] = rs[threadIdx.x];
        a.rwt[threadIdx.x] = rw[threadIdx.x];
    }
    const int e = shs ? 0 : rs[slot];
    if (a.pf & 3) { /* after the staging, whose L2 reads would queue behind the prefetches' misses (session 25) */
        int t0 = WARP; /* (warp 0 is first at the tiles: it routed) */
        if (a.pf & 1) t0 = mf_pf_rows(shs ? a.sd : a.d, e, b * hpb, hpb, t0);
        if ((a.pf & 2) && !shs) mf_pf_rows(a.u, e, b * ipb, ipb, mf_pf_rows(a.g, e, b * ipb, ipb, t0));
    }
    {
        /* gate tiles, then up tiles, of the block's I / CL rows each */
        const dmat &G = shs ? a.sg : a.g, &U = shs ? a.su : a.u;
        const int sub = lane % LPRA, rib = lane / LPRA, rpt = (WARP / LPRA) * RA, nt = ipb / rpt;
        for (int tl = warp; tl < 2 * nt; tl += nwb) {
            const int mi = tl >= nt;
            const dmat &m = mi ? U : G;
            const int r0 = b * ipb + (tl - mi * nt) * rpt + rib * RA;
            const dp_rows t = dp_rows_at<RA, 4>(m, e, r0);
            int rsel;
            const float acc = mf_tile<LPRA, RA, SBT>(t, m, sub, dxs, rsel);
            if ((sub & (LPRA / RA - 1)) == 0 && rsel < t.nr) gu[mi * ipb + (t.r0 - b * ipb) + rsel] = acc;
        }
    }
    CU_MARK(1);
    cu_cluster_arrive(); /* (releases gu to the cluster; the wait acquires the others') */
    cu_cluster_wait();
    for (int i = threadIdx.x; i < 2 * I; i += blockDim.x) { /* [gate I][up I] from their blocks */
        const int mi = i / I, j = i % I;
        hl[i] = cu_cluster_ldf(gu + mi * ipb + j % ipb, j / ipb);
    }
    cu_cluster_arrive(); /* done reading the others' gu; the closing wait keeps each block's alive till then */
    __syncthreads();
    /* h = silu(g) u staged over the input's (every warp past its tiles, at the cluster barrier) */
    const int nwD = I / 8;
    for (int w0 = 0; w0 < nwD; w0 += blockDim.x) { /* (uniform: dp_put shuffles; a group is 8 lanes of a warp) */
        const int w = w0 + threadIdx.x;
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = w < nwD ? silu_f(hl[8 * w + j]) * hl[I + 8 * w + j] : 0.f;
        dp_put(v, w < nwD, w, dxs);
    }
    __syncthreads();
    {
        const dmat &m = shs ? a.sd : a.d;
        const int sub = lane % LPRD, rib = lane / LPRD, rpt = (WARP / LPRD) * RD, nt = hpb / rpt;
        for (int tl = warp; tl < nt; tl += nwb) {
            const dp_rows t = dp_rows_at<RD, 4>(m, e, b * hpb + tl * rpt + rib * RD);
            int rsel;
            const float acc = mf_tile<LPRD, RD, SBT>(t, m, sub, dxs, rsel);
            if ((sub & (LPRD / RD - 1)) == 0 && rsel < t.nr) a.D[(size_t)slot * H + t.r0 + rsel] = acc;
        }
    }
    CU_MARK(2);
    /* the last of the slots' blocks b sums the row tile (each thread's stores fenced before the
     * count, as a release; the finisher fences after it, as an acquire, and reads past L1) */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) fin = atomicAdd(&a.cnt[b], 1u) == (unsigned)a.ns - 1;
    __syncthreads();
    if (fin) {
        __threadfence();
        const float gs = a.ns > a.K ? sigm_f(a.sr[0]) : 0.f;
        for (int r = threadIdx.x; r < hpb; r += blockDim.x) { /* k_mvdp_comb's order */
            const int row = b * hpb + r;
            const float x0 = a.add ? a.x[row] + a.add[row] : a.x[row];
            float y = 0.f;
            for (int k = 0; k < a.K; k++) y += rw[k] * __ldcg(a.D + (size_t)k * H + row);
            if (a.ns > a.K) y += gs * __ldcg(a.D + (size_t)a.K * H + row);
            a.x[row] = x0 + y;
        }
        if (threadIdx.x == 0) a.cnt[b] = 0;
    }
    cu_cluster_wait();
}

static size_t mf_smem(int H, int I, int CL) { return (size_t)(H / 64) * DP_G4 * 16 + (size_t)(2 * (I / CL) + 2 * I) * sizeof(float); }

/* How many clusters of CL blocks of kernel k the GPU holds at once (the emulator: all); 0 where it
 * cannot place one (a cluster is one GPC's), which would fail the launch. LILY_CU_MOE_FUSE_INFO=1
 * prints it, for reading a measurement. */
template <class K>
static int mf_clusters(K k, int CL, size_t sm) {
    int n = 1 << 20;
#ifdef __CUDACC_EMU__
    (void)k; (void)sm;
#else
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(CL, 1, 1);
    c.blockDim = dim3(DP_WARPS * WARP, 1, 1);
    c.dynamicSmemBytes = sm;
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = CL;
    at.val.clusterDim.y = at.val.clusterDim.z = 1;
    c.attrs = &at;
    c.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&n, k, &c) != cudaSuccess) {
        (void)cudaGetLastError();
        n = 0;
    }
#endif
    static int info = -1;
    if (cu_env_flag(&info, "LILY_CU_MOE_FUSE_INFO", 0)) fprintf(stderr, "lily: k_moe_fuse clusters of %d blocks, %d at once\n", CL, n);
    return n;
}

template <int LPRA, int RA, int LPRD, int RD, int SBT, int CL>
static int mf_go(cudaStream_t s, const mf_args &a) {
    const size_t sm = mf_smem(a.g.cols, a.g.rows, CL);
    static int opted = 0; /* 1 ready, -1 declined for good */
    if (!opted) {
        auto k = k_moe_fuse<LPRA, RA, LPRD, RD, SBT, CL>;
        opted = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, MVQ_SMEM) == cudaSuccess &&
                        (CL <= 8 || cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) &&
                        mf_clusters(k, CL, sm) > 0
                    ? 1
                    : -1;
        if (opted < 0) (void)cudaGetLastError(); /* (declined: the caller takes the two launches) */
    }
    if (opted < 0) return 0;
    cu_go(k_moe_fuse<LPRA, RA, LPRD, RD, SBT, CL>, dim3(CL, a.ns), DP_WARPS * WARP, sm, s).cluster(CL)(a);
    return 1;
}
/* the launcher's tile shapes for H and I columns: k_mvdp's lanes a row for H (R 4), k_mvdp_comb's for I */
template <int CL, int SBT>
static int mf_shape(cudaStream_t s, const mf_args &a, int lpa, int lpd) {
#define MF_D(LA)                                                                                                                   \
    switch (lpd) {                                                                                                                 \
    case 32: return mf_go<LA, 4, 32, 4, SBT, CL>(s, a);                                                                            \
    case 16: return mf_go<LA, 4, 16, 4, SBT, CL>(s, a);                                                                            \
    case 8: return mf_go<LA, 4, 8, 4, SBT, CL>(s, a);                                                                              \
    default: return 0;                                                                                                             \
    }
    switch (lpa) {
    case 32: MF_D(32)
    case 16: MF_D(16)
    default: return 0;
    }
#undef MF_D
}

int cu_moe_fuse_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_MOE_FUSE", 0);
}

static int test_cl = 0, test_pf = -1;
void cu_moe_fuse_test_cl(int cl) { test_cl = cl == 8 || cl == 16 ? cl : 0; }
void cu_moe_fuse_test_pf(int pf) { test_pf = pf >= 0 && pf <= 7 ? pf : -1; }

static int mf_lpr(int ng) { return ng >= 32 ? 32 : ng >= 16 ? 16 : ng >= 8 ? 8 : ng >= 4 ? 4 : ng >= 2 ? 2 : 1; }

int cu_moe_fuse(cudaStream_t s, const dmat *gate, const dmat *up, const dmat *down, const dmat *sg, const dmat *su, const dmat *sd,
                const float *rlog, int E, int K, const float *sr, const float *t, float *x, const float *add, float *D, unsigned *cnt,
                int *rsel, float *rwt) {
    const int H = gate->cols, I = gate->rows, lpa = mf_lpr(H / 64), lpd = mf_lpr(I / 64);
    static int clv = INT_MIN; /* LILY_CU_MOE_CL=8: clusters of 8 (the portable most), for measuring */
    cu_env_int(&clv, "LILY_CU_MOE_CL", 16);
    const int CL = test_cl ? test_cl : clv == 8 ? 8 : 16;
    /* the blocks' rows: whole tiles of the gate|up (4 rows a tile at 32 lanes a row, 8 at 16) and of the down */
    if (!cu_cluster_on() || !mvdp_enabled() || dp_warps() != DP_WARPS || K < 1 || K > 32 || E > 8 * 32 || H % 64 || I % 64 ||
        H > DP_MAX_COLS || I % CL || H % CL || (I / CL) % ((32 / lpa) * 4) || (H / CL) % ((32 / lpd) * 4) || lpa < 16 || lpd < 8 ||
        mf_smem(H, I, CL) > MVQ_SMEM || !dp_fits(gate, H, 4) || !dp_fits(up, H, 4) || up->rows != I || !dp_fits(down, I, 4) ||
        down->rows != H || ((uintptr_t)t & 15))
        return 0;
    const int shared = sg != NULL;
    if (shared && (!su || !sd || !dp_fits(sg, H, 4) || !dp_fits(su, H, 4) || !dp_fits(sd, I, 4) || sg->rows != I || su->rows != I ||
                   sd->rows != H))
        return 0;
    mf_args a;
    memset(&a, 0, sizeof a);
    a.g = *gate; a.u = *up; a.d = *down;
    a.sg = shared ? *sg : *gate; a.su = shared ? *su : *up; a.sd = shared ? *sd : *down;
    a.rlog = rlog; a.sr = sr; a.t = t; a.x = x; a.add = add; a.D = D; a.cnt = cnt; a.rsel = rsel; a.rwt = rwt;
    a.E = E; a.K = K; a.ns = K + shared;
    static int pf = INT_MIN;
    cu_env_int(&pf, "LILY_CU_MOE_PF", 1);
    a.pf = test_pf >= 0 ? test_pf : pf & 7;
    int bf = gate->sbt == LW_BF16 && up->sbt == LW_BF16 && down->sbt == LW_BF16;
    if (shared) bf = bf && sg->sbt == LW_BF16 && su->sbt == LW_BF16 && sd->sbt == LW_BF16;
    if (CL == 16) return bf ? mf_shape<16, LW_BF16>(s, a, lpa, lpd) : mf_shape<16, -1>(s, a, lpa, lpd);
    return bf ? mf_shape<8, LW_BF16>(s, a, lpa, lpd) : mf_shape<8, -1>(s, a, lpa, lpd);
}
