/* Decode's DeltaNet in-projection and step in one launch (k_gdn_in).
 *
 * Why: one token's DeltaNet layer ran the in-projection (k_mvdp over qkv | z | b | a), then the step
 * (k_gdn_dec_split, 128 blocks) as a launch of its own: ~4 us a layer on the step's path (the decode
 * timeline, bench/RESULTS.md session 24) for work that is a few hundred instructions a thread once
 * its S is loaded. Here the in-projection's blocks come in thread block clusters of GI_CL = 8, one
 * cluster a key head, and block `rank` computes exactly the rows its own part of the step needs:
 * its value head h = 2 kh + rank / 4 and its quarter of that head's columns c0 = 32 (rank % 4) (v
 * and z rows), the gates' rows of h (b, a), and a sixteenth of the key head's q and k rows. Its
 * conv channels (those q, k and v rows) it convolves itself; the cluster meets once (barrier.cluster)
 * so each block reads the key head's 128 q and 128 k from the eight blocks' shared memory, normalizes
 * them, and steps its 32 columns of S, which it copied into shared memory before the wait. o is
 * written before the gated norm, which the out-projection's staging applies (cu_matvec_gated), as
 * after k_gdn_dec_split; z goes out for it.
 *
 * Shapes: dk = dv = 128, nv = 2 nk (a key head's two value heads in one cluster), 4-bit in-projection
 * rows of at least 2,048 columns (a lane a 64-column group, LPR 32, R 4: a warp's tile is 4 rows).
 * A block's 26 tiles: q 4, k 4, v 8, z 8, b 1, a 1 (of b's and a's tiles only row h is used). */
#include "cuda/cu_dev.h"
#include "cuda/cu_mvdp.h"
#include "cuda/cu_gdn.h"
#include <limits.h>

#define GI_CL 8
#define GI_TILES 26
#define GI_R 4
/* shared memory past the staged input, in floats: the tiles' outputs [GI_TILES * 4], the block's
 * conv'd q | k [32] (read across the cluster), S's columns c0 .. c0 + 31 [128][32], the block's 64
 * conv channels' state [64][GDN_DEC_KMAX] and weights [64][GDN_DEC_KMAX], the head's A_log and dt_bias
 * (copies too: registers held across the tiles spilled) */
#define GI_OUT 0
#define GI_QK (GI_OUT + GI_TILES * 4)
#define GI_S (GI_QK + 32)
#define GI_CS (GI_S + 128 * 32)
#define GI_CW (GI_CS + 64 * GDN_DEC_KMAX)
#define GI_G (GI_CW + 64 * GDN_DEC_KMAX) /* A_log[h], dt_bias[h] */
#define GI_FLOATS (GI_G + 4)

typedef struct {
    int nk, nv, K;
    float *state;                  /* [cd][K - 1] conv state, in/out */
    const float *cw;               /* [cd][K] conv weights */
    const float *A_log, *dt_bias;  /* [nv] */
    float *S;                      /* [nv][128][128] */
    float *o;                      /* [nv * 128] the step's output, before the gated norm */
    float *z;                      /* [nv * 128] the in-projection's z rows, for that norm */
} gi_args;

/* local tile lt of block b of key head kh: its matrix (0 qkv, 1 z, 2 b, 3 a) and first row */
static __device__ __forceinline__ void gi_tile(int lt, int kh, int b, int nk, int &mi, int &r0) {
    const int kd = nk * 128, h = 2 * kh + b / 4, c0 = (b % 4) * 32;
    if (lt < 4) { mi = 0; r0 = kh * 128 + 16 * b + 4 * lt; }
    else if (lt < 8) { mi = 0; r0 = kd + kh * 128 + 16 * b + 4 * (lt - 4); }
    else if (lt < 16) { mi = 0; r0 = 2 * kd + h * 128 + c0 + 4 * (lt - 8); }
    else if (lt < 24) { mi = 1; r0 = h * 128 + c0 + 4 * (lt - 16); }
    else { mi = lt == 24 ? 2 : 3; r0 = h; }
}
/* conv channel c (0..63) of block b: its q, k and v rows (tiles 0-15, all of qkv), so the row's index */
static __device__ __forceinline__ int gi_chan(int c, int kh, int b, int nk) {
    int mi, r0;
    gi_tile(c / 4, kh, b, nk, mi, r0);
    return r0 + c % 4;
}

/* X [cols]: the layer's input (normed while staged when a.f.nw). a.m: qkv, z, b, a. */
template <int SBT, int NW>
__global__ void __launch_bounds__(NW * WARP, NW > 8 ? 1 : 2) k_gdn_in(mvq_args a, const float *__restrict__ X, gi_args g) {
    extern __shared__ uint4 dxs[]; /* [cols / 64][DP_G4] the staged input, then GI_FLOATS floats */
    __shared__ float qs[4 * 36], ks[4 * 36], vsh[32], red[8];
    __shared__ int tmap[GI_TILES]; /* a tile's matrix << 24 | first row: the loop holds no head indices */
    const int cols = a.m[0].cols, ng = cols / 64, nrow16 = cols * 4 / 128;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, nwb = blockDim.x / WARP, tid = threadIdx.x;
    const int b = cu_cluster_rank(), kh = blockIdx.x / GI_CL, h = 2 * kh + b / 4, c0 = (b % 4) * 32, K = g.K;
    float *sm = (float *)(dxs + (size_t)ng * DP_G4);
    /* before the wait: S's columns, the conv channels' state and weights (copies), the first
     * tile's codes (weights are never written; S and the conv state only by this kernel of the
     * layer, a token back) */
    if (tid < GI_TILES) { /* (published by the staging's closing barrier) */
        int m_, r_;
        gi_tile(tid, kh, b, g.nk, m_, r_);
        tmap[tid] = m_ << 24 | r_;
    }
    const float *Sh = g.S + (size_t)h * 128 * 128;
    for (int k = tid; k < 128 * 8; k += blockDim.x) cu_cp<16>(sm + GI_S + (k / 8) * 32 + 4 * (k % 8), Sh + (size_t)(k / 8) * 128 + c0 + 4 * (k % 8));
    if (tid < 64) {
        const int ch = gi_chan(tid, kh, b, g.nk);
        for (int i = 0; i + 1 < K; i++) cu_cp<4>(sm + GI_CS + tid * GDN_DEC_KMAX + i, g.state + (size_t)ch * (K - 1) + i);
        for (int i = 0; i < K; i++) cu_cp<4>(sm + GI_CW + tid * GDN_DEC_KMAX + i, g.cw + (size_t)ch * K + i);
    }
    if (tid == 64) cu_cp<4>(sm + GI_G, g.A_log + h);
    if (tid == 65) cu_cp<4>(sm + GI_G + 1, g.dt_bias + h);
    cu_cp_commit();
    uint4 c[GI_R][2];
    float sc[GI_R], bi[GI_R];
    uint32_t sr[GI_R], br[GI_R];
#pragma unroll
    for (int k = 0; k < GI_R; k++) {
        c[k][0] = c[k][1] = make_uint4(0, 0, 0, 0);
        sc[k] = bi[k] = 0.f;
        sr[k] = br[k] = 0u;
    }
    bool have = false;
    int mi, r0;
    gi_tile(warp, kh, b, g.nk, mi, r0);
    if (warp < GI_TILES && lane < ng) {
        const dp_rows t = dp_rows_at<GI_R, 4>(a.m[mi], 0, r0);
        dp_fetch_raw<GI_R, SBT, 4>(t, a.m[mi].sbt, lane, nrow16, cols / a.m[mi].group, c, sr, br);
        have = true;
    }
    const int psbt = a.m[mi].sbt;
    float n0[8];
    dp_nw0(a, cols, n0);
    CU_PDL();
    if (have) {
#pragma unroll
        for (int k = 0; k < GI_R; k++) {
#ifdef __CUDA_ARCH__
            asm volatile("" : "+r"(sr[k]), "+r"(br[k])); /* (the conversions stay after the wait: k_mvdp's reason) */
#endif
            sc[k] = dp_sb_cvt<SBT>(sr[k], psbt);
            bi[k] = dp_sb_cvt<SBT>(br[k], psbt);
        }
    }
    cu_cp_wait<0>(); /* (the staging's closing barrier publishes every thread's copies) */
    dp_stage(a, X, NULL, cols, dxs, 0, n0);
    CU_MARK(0); /* (the timeline's marks: staged, tiles done, the cluster met) */
    for (int lt = warp; lt < GI_TILES; lt += nwb) {
        mi = tmap[lt] >> 24;
        r0 = tmap[lt] & 0xffffff;
        const dp_rows t = dp_rows_at<GI_R, 4>(a.m[mi], 0, r0);
        int rsel;
        const float acc = dp_tile<32, GI_R, SBT, 4, 1>(t, SBT >= 0 ? SBT : a.m[mi].sbt, cols / a.m[mi].group, ng, nrow16, lane, dxs, have,
                                                       c, sc, bi, rsel);
        if ((lane & (32 / GI_R - 1)) == 0 && rsel < t.nr) {
            sm[GI_OUT + 4 * lt + rsel] = acc;
            if (mi == 1) g.z[r0 + rsel] = acc;
        }
    }
    __syncthreads();
    CU_MARK(1);
    /* (the block's head and columns again, not held across the tiles: at 128 registers they spilled) */
    const int b2 = cu_cluster_rank(), kh2 = blockIdx.x / GI_CL, h2 = 2 * kh2 + b2 / 4, c02 = (b2 % 4) * 32;
    if (tid < 64) { /* the block's conv channels: conv, SiLU, the state shifted */
        const float *cs = sm + GI_CS + tid * GDN_DEC_KMAX, *w = sm + GI_CW + tid * GDN_DEC_KMAX;
        const float in = sm[GI_OUT + tid];
        float acc = w[K - 1] * in;
        for (int i = 0; i + 1 < K; i++) acc += w[i] * cs[i];
        const float v = silu_f(acc);
        if (tid < 32) sm[GI_QK + tid] = v;
        else vsh[tid - 32] = v;
        float *st = g.state + (size_t)gi_chan(tid, kh2, b2, g.nk) * (K - 1);
        for (int i = 0; i + 2 < K; i++) st[i] = cs[i + 1];
        if (K > 1) st[K - 2] = in;
    }
    cu_cluster_arrive(); /* (release: q | k in shared memory) */
    cu_cluster_wait();
    CU_MARK(2);
    { /* the key head's q (threads 0-127) and k (128-255) from the cluster's blocks, L2-normed */
        const int i = tid % 128, isk = (tid / 128) & 1;
        const float v = tid < 256 ? cu_cluster_ldf(sm + GI_QK + 16 * isk + i % 16, i / 16) : 0.f;
        const float ss = warp_sum(v * v);
        if (lane == 0 && warp < 8) red[warp] = ss;
        __syncthreads();
        if (tid < 256) {
            const float tq = (red[0] + red[1]) + (red[2] + red[3]), tk = (red[4] + red[5]) + (red[6] + red[7]);
            const int pi = (i / 32) * 36 + i % 32;
            if (isk) ks[pi] = v * (1.0f / sqrtf(tk + 1e-6f));
            else qs[pi] = v * (1.0f / sqrtf(tq + 1e-6f) * (1.0f / sqrtf(128.f)));
        }
    }
    cu_cluster_arrive(); /* (this block's reads of the others' q | k are done) */
    __syncthreads();
    if (tid < 128) { /* column c0 + j of head h, its rows over the four threads p */
        const int j = tid / 4, p = tid % 4;
        float srow[32];
#pragma unroll
        for (int i = 0; i < 32; i++) srow[i] = sm[GI_S + (p * 32 + i) * 32 + j];
        const float beta = sigm_f(sm[GI_OUT + 96]), decay = expf(gdn_g(sm[GI_OUT + 100] + sm[GI_G + 1], sm[GI_G]));
        const float out = gdn_col_step<36>(srow, qs, ks, p, decay, vsh[j], beta);
        if (p == 0) g.o[(size_t)h2 * 128 + c02 + j] = out;
        float *Sc = g.S + (size_t)h2 * 128 * 128 + c02 + j;
#pragma unroll
        for (int i = 0; i < 32; i++) Sc[(size_t)(p * 32 + i) * 128] = srow[i];
    }
    cu_cluster_wait(); /* (no block's q | k goes while another may read them) */
}

static int test_nw = 0;
void cu_gdn_in_test_warps(int nw) { test_nw = nw; }

template <int SBT, int NW>
static void gi_go(cudaStream_t s, size_t sm, int nk, const mvq_args &a, const float *X, const gi_args &g) {
    static size_t opted = 0;
    if (sm > opted && cudaFuncSetAttribute(k_gdn_in<SBT, NW>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) == cudaSuccess) opted = sm;
    cu_go(k_gdn_in<SBT, NW>, nk * GI_CL, NW * WARP, sm, s).cluster(GI_CL)(a, X, g);
}

int cu_gdn_in(cudaStream_t s, const dmat *const *W, const float *X, const mvq_fuse *fu, int nk, int nv, int dk, int dv, int K,
              float *state, const float *cw, const float *A_log, const float *dt_bias, float *S, float *o, float *z) {
    if (!cu_cluster_on() || !mvdp_enabled() || !cu_gdn_dec_ok(nk, nv, dk, dv, K) ||
        nv != 2 * nk || dk != 128 || dv != 128)
        return 0;
    const int cols = W[0]->cols;
    if (cols % 64 || cols / 64 < 32 || cols > DP_MAX_COLS) return 0;
    const int rows[4] = { 2 * nk * dk + nv * dv, nv * dv, nv, nv };
    for (int i = 0; i < 4; i++)
        if (!dp_fits(W[i], cols, 4) || W[i]->rows != rows[i]) return 0;
    mvq_args a;
    memset(&a, 0, sizeof a);
    if (fu) a.f = *fu;
    a.n = 4;
    for (int i = 0; i < 4; i++) a.m[i] = *W[i];
    gi_args g = { nk, nv, K, state, cw, A_log, dt_bias, S, o, z };
    const size_t sm = dp_smem(cols) + GI_FLOATS * sizeof(float);
    int sbt = W[0]->sbt;
    for (int i = 1; i < 4; i++)
        if (W[i]->sbt != sbt) sbt = -1;
    /* 16 warps a block (one block an SM, 128 registers a thread): a warp's 26 / 16 tiles, at most two
     * rounds of code loads, where 8 warps took four; LILY_CU_GDN_IN_WARPS=8 for measuring */
    static int env = INT_MIN;
    cu_env_int(&env, "LILY_CU_GDN_IN_WARPS", 16);
    const int nw = test_nw ? test_nw : env;
    if (sbt == LW_BF16 && nw == 8) gi_go<LW_BF16, 8>(s, sm, nk, a, X, g);
    else if (sbt == LW_BF16) gi_go<LW_BF16, 16>(s, sm, nk, a, X, g);
    else if (nw == 8) gi_go<-1, 8>(s, sm, nk, a, X, g);
    else gi_go<-1, 16>(s, sm, nk, a, X, g);
    return 1;
}
