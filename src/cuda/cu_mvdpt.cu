/* Matrix-vector products for 2-16 input rows on the int8 tensor cores (k_mvdpt): k_mvdpb's exact
 * integer sums, with a group's three levels of every row done by mma.m16n8k32 instead of dp4a.
 *
 * Why: k_mvdpb spends six dp4a a word of codes a row, so at 8 rows a warp's chain per group is
 * 8 x 2 x 48 dp4a and the DeltaNet in-projection takes 32 us for 14 MB (bench/RESULTS.md session
 * 27: issue and latency, not bytes); past 8 rows it reads the weights again for each pass of 8.
 * One m16n8k32 does 16 weight rows x 32 columns against 8 rows of input bytes: a group's level
 * for 8 input rows and 16 weight rows is two mma, about a tenth of the dp4a issue, and 9-16
 * input rows are a second n tile on the same codes (one pass).
 *
 * Numerics are k_mvdpb's: the input staged by dp_put (three signed bytes a value, exact to 2^-24 of
 * its 64-column group's largest), a group's three sums H, M, L exact int32s (the mma's), joined in
 * fp32 as 2^16 H + 2^8 M + L, times the group's unit and the weights' scale, plus the bias times the
 * input's exact group sum, added over groups in fp32. Only the order of the fp32 additions
 * differs (a warp's groups in turn, then the warps' partials in warp order).
 *
 * Layout: A is 16 weight rows x 32 columns of codes (a 64-column group is two k steps), B the 32
 * columns' bytes of one level for 8 input rows (n = the row), C the int32 sums; a lane (g, q) of
 * the fragment holds the codes of rows g and g + 8 for the columns of words 2q (k step 0) and
 * 2q + 1 (k step 1) of the group, its 4-bit words' even nibbles as one A register and odd
 * nibbles as the other (8-bit codes: two byte permutes), which meet the staged input's even and
 * odd column bytes as dp_put lays them (uint4 3q + level, components 2s and 2s + 1): no
 * rearranging of the input. A tile is 16 weight rows; a block's warps split its groups (gb
 * consecutive groups a warp at a time, their codes, scales and biases loaded together, the
 * warp's next batch fetched before the current one is summed), then the warps' partial sums meet
 * in shared memory in a fixed order. The grid is what the GPU holds; blocks walk the tiles.
 * Shared memory: the staged rows [T][ts] uint4 (ts = cols / 64 * DP_G4 padded to 4 mod 8, so the
 * B loads of a quarter-warp, rows 2i and 2i + 1, hit 32 distinct banks), then [NW][16 x 8NB]
 * floats of partial sums.
 *
 * Batches of 6 rows or more take it (cu_mvdpt_on); the kernel test runs it alone too. */
#include "cuda/cu_dev.h"
#include "cuda/cu_mvdp.h"

#define DPT_SMEM (200 * 1024)
/* groups a warp loads at once: 4-bit codes (8 bytes a row a lane a group) 4, 8-bit (16 bytes) 2;
 * half that with two n tiles (more spilled there: 4-32 bytes at 128 registers) */
#define DPT_GB(bits, nb) (((bits) == 8 ? 2 : 4) / (nb))

/* the staged row stride in uint4: 4 mod 8 (bank spread of the B loads, above) */
static __host__ __device__ __forceinline__ int dpt_ts(int cols) {
    const int t = cols / 64 * DP_G4;
    return t + ((12 - t % 8) % 8);
}

/* A lane's batch: gb groups of the two weight rows g, g + 8 of a tile; CW words a row a group */
template <int BITS, int GB>
struct dpt_batch {
    uint32_t c[GB][2][BITS == 8 ? 4 : 2];
    uint32_t s[GB][2], b[GB][2];
};

template <int BITS, int GB>
static __device__ __forceinline__ void dpt_fetch(const mvq_args &a, int tile, int mi, int k, int gb, int ng, dpt_batch<BITS, GB> &f) {
    constexpr int CW = BITS == 8 ? 4 : 2;
    const dmat &m = a.m[mi];
    const int lane = threadIdx.x % WARP, g = lane / 4, q = lane % 4;
    const int r0 = (tile - a.blk0[mi]) * 16, ngr = m.cols / m.group, lg = __ffs(m.group / 64) - 1;
    const size_t rb = (size_t)m.cols * BITS / 8, sz = m.sbt == LW_F32 ? 4 : 2;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = min(r0 + g + 8 * h, m.rows - 1);
        const char *w = (const char *)m.w + (size_t)r * rb;
        const char *ps = (const char *)m.s + (size_t)r * ngr * sz, *pb = (const char *)m.b + (size_t)r * ngr * sz;
#pragma unroll
        for (int j = 0; j < GB; j++) {
            const int grp = gb * k + j;
            const bool in = j < gb && grp < ng;
            if constexpr (CW == 2) { /* words 2q, 2q + 1 of the row's group */
                const uint2 v = in ? __ldg((const uint2 *)(w + (size_t)grp * 32) + q) : make_uint2(0u, 0u);
                f.c[j][h][0] = v.x; f.c[j][h][1] = v.y;
            } else { /* 8-bit: the same 16 columns, four words */
                const uint4 v = in ? __ldg((const uint4 *)(w + (size_t)grp * 64) + q) : make_uint4(0u, 0u, 0u, 0u);
                f.c[j][h][0] = v.x; f.c[j][h][1] = v.y; f.c[j][h][2] = v.z; f.c[j][h][3] = v.w;
            }
            f.s[j][h] = in ? dp_sb_raw(ps, m.sbt, grp >> lg) : 0u;
            f.b[j][h] = in ? dp_sb_raw(pb, m.sbt, grp >> lg) : 0u;
        }
    }
}

/* The batch's groups added to acc[nb][i] (c's fragment places: rows g, g + 8, input rows 8nb + 2q, + 1) */
template <int BITS, int GB, int NB>
static __device__ __forceinline__ void dpt_sum(const dpt_batch<BITS, GB> &f, int k, int gb, int ng, int sbt, int T, int ts,
                                               const uint4 *dxs, float (&acc)[NB][4]) {
    const int lane = threadIdx.x % WARP, g = lane / 4, q = lane % 4;
#pragma unroll
    for (int j = 0; j < GB; j++) {
        const int grp = gb * k + j;
        if (j >= gb || grp >= ng) break;
        uint32_t A[2][4]; /* [k step][a0..a3] */
#pragma unroll
        for (int s = 0; s < 2; s++) {
            uint32_t lo[2], hi[2]; /* rows g, g + 8: even columns, odd columns */
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if constexpr (BITS == 8) {
                    const uint32_t x0 = f.c[j][h][2 * s], x1 = f.c[j][h][2 * s + 1];
                    lo[h] = __byte_perm(x0, x1, 0x6420);
                    hi[h] = __byte_perm(x0, x1, 0x7531);
                } else {
                    const uint32_t w = f.c[j][h][s];
                    lo[h] = w & 0x0F0F0F0Fu;
                    hi[h] = (w >> 4) & 0x0F0F0F0Fu;
                }
            }
            A[s][0] = lo[0]; A[s][1] = lo[1]; A[s][2] = hi[0]; A[s][3] = hi[1];
        }
        int C[NB][3][4];
#pragma unroll
        for (int nb = 0; nb < NB; nb++) {
            const int n = 8 * nb + g;
            const uint4 *xg = dxs + (size_t)n * ts + (size_t)grp * DP_G4 + 3 * q;
#pragma unroll
            for (int lev = 0; lev < 3; lev++) {
                const uint4 xv = n < T ? xg[lev] : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
                for (int i = 0; i < 4; i++) C[nb][lev][i] = 0;
                tc_mma_u8s8(C[nb][lev], A[0][0], A[0][1], A[0][2], A[0][3], xv.x, xv.y);
                tc_mma_u8s8(C[nb][lev], A[1][0], A[1][1], A[1][2], A[1][3], xv.z, xv.w);
            }
        }
        float sc[2], bi[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            sc[h] = dp_sb_cvt<-1>(f.s[j][h], sbt);
            bi[h] = dp_sb_cvt<-1>(f.b[j][h], sbt);
        }
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int n = 8 * nb + 2 * q + e;
                const uint4 meta = n < T ? dxs[(size_t)n * ts + (size_t)grp * DP_G4 + 12] : make_uint4(0u, 0u, 0u, 0u);
                const float unit = __uint_as_float(meta.x), gs = __uint_as_float(meta.y);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int i = 2 * h + e;
                    const float d = fmaf(65536.f, (float)C[nb][0][i], fmaf(256.f, (float)C[nb][1][i], (float)C[nb][2][i]));
                    acc[nb][i] += sc[h] * (unit * d) + bi[h] * gs;
                }
            }
    }
}

/* Y[i] [T][ldy[i]] = W[i] x_t for the T <= 8 NB rows x_t = X row t (silu(X) * X2 when X2; NRM with a.f.nw:
 * rmsnorm(X row t) * nw, cu_mvdpt_norm, instances of their own: in the others the norm's code cost 8-row
 * batches ~0.7%, bench/RESULTS.md session 43) */
template <int BITS, int NB, int NW, bool NRM>
__global__ void __launch_bounds__(NW * WARP, 16 / NW) k_mvdpt(mvq_args a, const float *__restrict__ X, const float *__restrict__ X2,
                                                           int ldx, int T, int gb) {
    constexpr int GB = DPT_GB(BITS, NB);
    extern __shared__ uint4 dxs[]; /* [T][ts] the staged rows, then red */
    const int cols = a.m[0].cols, ng = cols / 64, nw = cols / 8, ts = dpt_ts(cols), ntiles = a.blk0[a.n];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, g = lane / 4, q = lane % 4;
    const int nbt = (ng + gb - 1) / gb; /* batches a tile */
    float *red = (float *)(dxs + (size_t)T * ts); /* [NW][16][8 NB] the warps' partial sums */
    dpt_batch<BITS, GB> cur = {}, nxt = {};
    int mi = 0, tile = blockIdx.x;
    /* the warp's first batch before the wait (weights are never written) */
    if (tile < ntiles && warp < nbt) {
        while (mi + 1 < a.n && tile >= a.blk0[mi + 1]) mi++;
        dpt_fetch<BITS, GB>(a, tile, mi, warp, gb, ng, cur);
    }
    /* the gated norm (a.f.gz): every word of this thread sits at column 8 (threadIdx.x % 16) of its head of
     * 128 (blockDim a multiple of 16, rows of whole heads), so its 8 gw are the same, loaded before the wait */
    float gw8[8] = { 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f };
    if (a.f.gz) dp_ld8(a.f.gw, 8 * (threadIdx.x % 16), gw8);
    else if (NRM) dp_rows_nw0(a.f, nw, gw8); /* (the norm's weights, a.f.nw, in the same registers) */
    CU_PDL();
    /* the rows staged as k_mvdpb stages them; with a.f.gz each head's gated norm first */
    dp_stage_rows<true, NRM>(a.f, X, X2, ldx, T, nw, dxs, (size_t)ts, T, gw8);
    __syncthreads();
    for (; tile < ntiles; tile += gridDim.x) {
        while (mi + 1 < a.n && tile >= a.blk0[mi + 1]) mi++;
        const int sbt = a.m[mi].sbt;
        float acc[NB][4];
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[nb][i] = 0.f;
        for (int k = warp; k < nbt; k += NW) {
            /* the warp's next batch: in this tile, else the first of the block's next tile */
            const int kn = k + NW < nbt ? k + NW : warp, tn = k + NW < nbt ? tile : tile + gridDim.x;
            const bool more = tn < ntiles;
            if (more) {
                int mn = mi;
                while (mn + 1 < a.n && tn >= a.blk0[mn + 1]) mn++;
                dpt_fetch<BITS, GB>(a, tn, mn, kn, gb, ng, nxt);
            }
            dpt_sum<BITS, GB, NB>(cur, k, gb, ng, sbt, T, ts, dxs, acc);
            if (more) cur = nxt;
        }
        /* the warps' partial sums, added in warp order (the same result whatever the timing) */
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
            for (int i = 0; i < 4; i++) red[((size_t)warp * 16 + g + 8 * (i / 2)) * (8 * NB) + 8 * nb + 2 * q + (i & 1)] = acc[nb][i];
        __syncthreads();
        const dmat &m = a.m[mi];
        const int r0 = (tile - a.blk0[mi]) * 16;
        for (int o = threadIdx.x; o < 16 * 8 * NB; o += blockDim.x) {
            const int row = o / (8 * NB), n = o % (8 * NB);
            float y = 0.f;
            for (int w = 0; w < NW; w++) y += red[(size_t)w * 16 * 8 * NB + o];
            if (n < T && r0 + row < m.rows) a.y[mi][(size_t)n * a.ldy[mi] + r0 + row] = y;
        }
        __syncthreads();
    }
}

template <int BITS, int NB, bool NRM>
static void mvdpt_go(cudaStream_t s, const mvq_args &a, const float *X, const float *X2, int ldx, int T, int gb) {
    constexpr int NW = NB == 2 ? 16 : 8;
    static mvq_kstate ks;
    if (!ks.attr_set)
        ks.attr_set = cudaFuncSetAttribute(k_mvdpt<BITS, NB, NW, NRM>, cudaFuncAttributeMaxDynamicSharedMemorySize, DPT_SMEM) == cudaSuccess;
    const size_t sm = (size_t)T * dpt_ts(a.m[0].cols) * 16 + (size_t)NW * 16 * 8 * NB * 4;
    const int gx = mvq_grid(k_mvdpt<BITS, NB, NW, NRM>, ks, a.blk0[a.n], 1, 0, NW * WARP, sm);
    cu_go(k_mvdpt<BITS, NB, NW, NRM>, dim3(gx), NW * WARP, sm, s)(a, X, X2, ldx, T, gb);
}

/* Whether a decode batch of T rows takes k_mvdpt (cu_mvdpb first, the gated out-projection):
 * LILY_CU_MVDPT=N from N rows on (0 never), 6 by default. Measured on an H100 (bench/RESULTS.md
 * session 31): 6 rows +8%, 8 +12%, 12 +17%, 16 +23% tok/s; 4 rows -3%; 2 rows -9% (likely the mma's
 * 8-row B tile, mostly zeros at 2-4 rows, against k_mvdpb's dp4a a row). */
int cu_mvdpt_on(int T) {
    static int from = INT_MIN;
    const int n = cu_env_int(&from, "LILY_CU_MVDPT", 6);
    return n > 0 && T >= n;
}

static int mvdpt_rows(cudaStream_t s, int n, const dmat *const *W, const float *X, const float *X2, int ldx, int T, float *const *Y,
                      const int *ldy, const float *gz, const float *gw, float eps, const float *nrm, float *tout);
/* 1 when it took the launch (4- or 8-bit codes of equal width and columns, a multiple of 64, at
 * least 512), 0 when it declines */
int cu_mvdpt(cudaStream_t s, int n, const dmat *const *W, const float *X, const float *X2, int ldx, int T, float *const *Y, const int *ldy) {
    return mvdpt_rows(s, n, W, X, X2, ldx, T, Y, ldy, NULL, NULL, 0.f, NULL, NULL);
}
/* the same with each row's norm in the staging (cu_mvdpb_norm) */
int cu_mvdpt_norm(cudaStream_t s, int n, const dmat *const *W, const float *X, int ldx, int T, float *const *Y, const int *ldy,
                  const float *nw, float eps, float *tout) {
    return mvdpt_rows(s, n, W, X, NULL, ldx, T, Y, ldy, NULL, NULL, eps, nw, tout);
}
/* y [T][W->rows] = W g(o_t), g the gated norm of heads of 128 (o, z [T][W->cols], gw [128]), staged by
 * k_mvdpt: a decode batch's DeltaNet out-projection after the split step (cu_gdn_dec_split_rows) */
int cu_mvdpt_gated(cudaStream_t s, const dmat *W, const float *o, const float *z, const float *gw, float eps, int T, float *y) {
    if (!z || !gw || ((uintptr_t)z & 15) || ((uintptr_t)gw & 15) || W->cols % 128) return 0;
    const int ld = W->rows;
    return mvdpt_rows(s, 1, &W, o, NULL, W->cols, T, &y, &ld, z, gw, eps, NULL, NULL);
}
static int mvdpt_rows(cudaStream_t s, int n, const dmat *const *W, const float *X, const float *X2, int ldx, int T, float *const *Y,
                      const int *ldy, const float *gz, const float *gw, float eps, const float *nrm, float *tout) {
    if (n < 1 || n > MVQ_MAX || T < 1 || (nrm && (X2 || gz || W[0]->bits != 4))) return 0;
    const int cols = W[0]->cols, bits = W[0]->bits, ng = cols / 64;
    if (cols % 64 || (bits != 4 && bits != 8) || ng < 8 || ldx % 4 || ((uintptr_t)X & 15) || ((uintptr_t)X2 & 15)) return 0;
    for (int i = 0; i < n; i++)
        if (!dp_fits(W[i], cols, bits)) return 0;
    const size_t row = (size_t)dpt_ts(cols) * 16;
    /* input rows a pass: 16 (two n tiles) where they fit, else the most of 8, 4, 2, 1 that do */
    int nt = 16;
    while (nt > 1 && (size_t)nt * row + (size_t)(nt > 8 ? 16 * 16 * 16 : 8 * 16 * 8) * 4 > DPT_SMEM) nt /= 2;
    for (int t0 = 0; t0 < T; t0 += nt) {
        const int tn = T - t0 < nt ? T - t0 : nt, NB = tn > 8 ? 2 : 1, nw = NB == 2 ? 16 : 8;
        const int gbmax = DPT_GB(bits, NB), gb = ng / nw < 1 ? 1 : ng / nw > gbmax ? gbmax : ng / nw;
        float *y[MVQ_MAX];
        for (int i = 0; i < n; i++) y[i] = Y[i] + (size_t)t0 * ldy[i];
        mvq_args a;
        memset(&a, 0, sizeof a);
        mvq_args_set(&a, n, W, y, ldy);
        mvq_tiles(&a, 16);
        if (gz) { a.f.gz = gz + (size_t)t0 * ldx; a.f.gw = gw; a.f.eps = eps; }
        if (nrm) { a.f.nw = nrm; a.f.eps = eps; a.f.tout = tout ? tout + (size_t)t0 * ldx : NULL; }
        const float *x = X + (size_t)t0 * ldx, *x2 = X2 ? X2 + (size_t)t0 * ldx : NULL;
        if (nrm && NB == 2) mvdpt_go<4, 2, true>(s, a, x, x2, ldx, tn, gb); /* (the norm's: 4-bit codes, above) */
        else if (nrm) mvdpt_go<4, 1, true>(s, a, x, x2, ldx, tn, gb);
        else if (bits == 8 && NB == 2) mvdpt_go<8, 2, false>(s, a, x, x2, ldx, tn, gb);
        else if (bits == 8) mvdpt_go<8, 1, false>(s, a, x, x2, ldx, tn, gb);
        else if (NB == 2) mvdpt_go<4, 2, false>(s, a, x, x2, ldx, tn, gb);
        else mvdpt_go<4, 1, false>(s, a, x, x2, ldx, tn, gb);
    }
    return 1;
}
