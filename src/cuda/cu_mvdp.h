/* k_mvdp's pieces that k_mvdp_comb (cu_mvdp_comb.cu) shares: the staged integer input, the code
 * fetches and a tile's sums (device), and the launch checks (host). Layout and numerics: cu_mvdp.cu's
 * comment. static: each unit its own copy, so an emulator mutant (cu2cpp.py) breaks only the unit it
 * names (one inline definition shared by the units would let the linker keep the intact one). */
#ifndef LILY_CU_MVDP_H
#define LILY_CU_MVDP_H
#include "cuda/cu_dev.h"

#define DP_WARPS 8
/* the staged input a group: 12 uint4 of bytes (word pairs x levels) and one of (unit, sum); 13,
 * not 12, so the lanes of a quarter-warp, one group each, read distinct banks */
#define DP_G4 13
#define DP_XMAX 8323072.0f /* 127 * 2^16 */
#ifndef LILY_DP_RAWSB
#define LILY_DP_RAWSB 1
#endif
#ifndef LILY_DP_RDX
#define LILY_DP_RDX true /* the routing warp's rounds by warp reductions (route_regs) */
#endif

/* four byte products of a (unsigned: the codes) and b (signed: the input's bytes) added to c */
static __device__ __forceinline__ int cu_dp4a(uint32_t a, uint32_t b, int c) {
#ifdef __CUDA_ARCH__
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#else
    for (int i = 0; i < 4; i++) c += (int)((a >> (8 * i)) & 255u) * (int)(int8_t)(uint8_t)(b >> (8 * i));
    return c;
#endif
}

static __device__ __forceinline__ float dp_in(const float *x, const float *x2, int i) { return x2 ? silu_f(x[i]) * x2[i] : x[i]; }

/* Word w of the input (columns 8w .. 8w + 7, values v) into xs as DP_G4 uint4 a 64-column group:
 * word i of the group sits in uint4 3 (i / 2) + level, components 2 (i % 2) (the even columns'
 * bytes, in the order the codes' low nibbles come out of a word: 0 2 4 6) and 2 (i % 2) + 1 (the
 * odd columns'); level 0 h, 1 m, 2 l. uint4 12: (unit, exact fp32 sum). A group's 8 words are 8
 * lanes of one warp, all valid or none (every lane of the warp comes here: the group's largest |x|
 * by shuffles, no block reduction). */
static __device__ __forceinline__ void dp_put(const float (&v)[8], bool valid, int w, uint4 *xs) {
    uint32_t *xw = (uint32_t *)xs;
    float s = 0.f, m = 0.f;
    bool bad = false;
    if (valid)
        for (int j = 0; j < 8; j++) {
            s += v[j];
            m = fmaxf(m, fabsf(v[j]));
            bad |= !(fabsf(v[j]) <= 3.0e38f);
        }
    for (int o = 1; o < 8; o <<= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        bad |= __shfl_xor_sync(0xffffffffu, (int)bad, o) != 0;
    }
    if (!valid) return;
    /* below 1e-30 the group is zero to within 1e-30: no infinite scale */
    const float inv = bad || !(m >= 1e-30f) ? 0.f : DP_XMAX / m, unit = bad ? NAN : m >= 1e-30f ? m / DP_XMAX : 0.f;
    uint32_t lv[3][2] = { { 0, 0 }, { 0, 0 }, { 0, 0 } };
    for (int j = 0; j < 8; j++) {
        const int X = __float2int_rn(v[j] * inv);
        const int l = (int)(int8_t)(uint8_t)(X & 255), X1 = (X - l) / 256;
        const int mm = (int)(int8_t)(uint8_t)(X1 & 255), h = (X1 - mm) / 256;
        const int sh = 8 * (j / 2), par = j & 1;
        lv[0][par] |= (uint32_t)(uint8_t)h << sh;
        lv[1][par] |= (uint32_t)(uint8_t)mm << sh;
        lv[2][par] |= (uint32_t)(uint8_t)l << sh;
    }
    const int g = w / 8, i = w % 8;
    uint32_t *p = xw + (size_t)g * DP_G4 * 4 + (i / 2) * 12 + 2 * (i % 2);
    for (int lev = 0; lev < 3; lev++) {
        p[4 * lev] = lv[lev][0];
        p[4 * lev + 1] = lv[lev][1];
    }
    if (i == 0) xs[(size_t)g * DP_G4 + 12] = make_uint4(__float_as_uint(unit), __float_as_uint(s), 0u, 0u);
}

/* The block's input (silu(x) * x2 when x2) into xs (dp_put), a word a thread. */
/* With the norm (a.f.nw): the input is rmsnorm(x (+ a.f.add)) * nw, the sum of squares over the
 * whole row first (a block reduction), and block (0, 0) writes it to tout. With add, the router
 * group's launch (as k_mvq's mvq_stage; LILY_CU_MVDP_Q8=1); without, the next layer's
 * in-projection after the experts' down folded the combine in (k_mvdp_comb). The sum of squares
 * goes a word a thread as the staging does, so a thread's first word stays in registers. */
/* With a.f.gz (no norm): the gated norm of heads of 128 columns (dp_gated), the DeltaNet
 * out-projection's input as k_gdn_dec_split leaves it. */
/* t0 (a multiple of 32, no norm): threads below it skip the staging (the routing warp, busy
 * meanwhile) and meet the others at its closing barrier. n0: with the norm, nw of the thread's first
 * word, with the gated norm its words' gw, loaded before the wait (dp_nw0), so the norm's weights
 * are not a round trip after the sum. */
/* The gated norm (mvq_fuse.gz) of word w's 8 columns: a head of 128 columns is 16 words on 16
 * consecutive lanes (t0 0, cols a multiple of 128: cu_mvdp_group's conditions), summed by shuffles;
 * every lane comes here (v zero past the row). zv, gv: the word's gz and gw, loaded with v. */
static __device__ __forceinline__ void dp_gated(const mvq_fuse &f, float (&v)[8], const float (&zv)[8], const float (&gv)[8]) {
    float ss = 0.f;
    for (int j = 0; j < 8; j++) ss += v[j] * v[j];
    for (int o = 1; o < 16; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = 1.0f / sqrtf(ss / 128 + f.eps);
    for (int j = 0; j < 8; j++) v[j] = v[j] * r * gv[j] * silu_f(zv[j]);
}
/* 8 floats p[c0 .. c0 + 7] (c0 a multiple of 8): two 16-byte loads where p is aligned */
static __device__ __forceinline__ void dp_ld8(const float *p, int c0, float (&v)[8]) {
    if (((uintptr_t)p & 15) == 0) {
        const float4 a = *(const float4 *)(p + c0), b = *(const float4 *)(p + c0 + 4);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else
        for (int j = 0; j < 8; j++) v[j] = p[c0 + j];
}
/* With the gated norm (a.f.gz, no norm: t0 0), n0 is gw of the thread's words instead (the same 8
 * for every word of the thread: its words are a multiple of 16 apart). Loaded after the wait it
 * was a miss to DRAM in every out-projection's staging: tg128 +1% before the wait
 * (bench/RESULTS.md session 25). */
static __device__ __forceinline__ void dp_nw0(const mvq_args &a, int cols, float (&n0)[8]) {
    const int w = threadIdx.x;
    if (!a.f.nw && a.f.gz) {
        dp_ld8(a.f.gw, 8 * w % 128, n0);
        return;
    }
    for (int j = 0; j < 8; j++) n0[j] = a.f.nw && w < cols / 8 ? a.f.nw[8 * w + j] : 0.f;
}
/* Word w of the input (no norm, no x2), its loads only: x, and for the gated norm its gz (zeros
 * past the row) */
struct dp_win {
    float v[8], z[8];
};
static __device__ __forceinline__ void dp_win_load(const mvq_fuse &f, const float *x, int w, int nw, dp_win &d) {
    for (int j = 0; j < 8; j++) d.v[j] = d.z[j] = 0.f;
    if (w >= nw) return;
    dp_ld8(x, 8 * w, d.v);
    if (f.gz) dp_ld8(f.gz, 8 * w, d.z);
}
/* ... then the values staged (dp_put; every lane of the warp comes here); g: the word's gw */
static __device__ __forceinline__ void dp_win_put(const mvq_fuse &f, dp_win &d, const float (&g)[8], int w, int nw, uint4 *xs) {
    if (f.gz) dp_gated(f, d.v, d.z, g);
    dp_put(d.v, w < nw, w, xs);
}
static __device__ __forceinline__ void dp_stage(const mvq_args &a, const float *x, const float *x2, int cols, uint4 *xs, int t0,
                                         const float (&n0)[8]) {
    const int nw = cols / 8;
    const float *add = a.f.add;
    const bool nrm = a.f.nw != NULL;
    float r = 1.f, v0[8] = { 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f };
    if (nrm) {
        __shared__ float red[32];
        float ss = 0.f;
        for (int w = threadIdx.x; w < nw; w += blockDim.x)
            for (int j = 0; j < 8; j++) {
                const int c = 8 * w + j;
                const float v = add ? x[c] + add[c] : x[c];
                if (w == (int)threadIdx.x) v0[j] = v;
                ss += v * v;
            }
        for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (threadIdx.x % WARP == 0) red[threadIdx.x / WARP] = ss;
        __syncthreads();
        ss = 0.f;
        for (int i = 0; i < (int)(blockDim.x / WARP); i++) ss += red[i];
        r = 1.0f / sqrtf(ss / cols + a.f.eps);
    }
    const bool wr = nrm && blockIdx.x == 0 && blockIdx.y == 0;
    int wstart = 0;
    const int st = blockDim.x - t0;
    if (!nrm && !x2 && st % 16 == 0 && (int)threadIdx.x >= t0) {
        /* Without the norm, a thread's first two words' loads all go out before either is staged:
         * a loop of load-then-stage made a round trip to L2 a pass, and the out-projections
         * (512 words, 256 threads) and the experts' gate|up (256 words, 224 threads beside the
         * routing warp) take two passes (bench/RESULTS.md session 24). The two words' gw are the
         * same 8 (st a multiple of 16 words: 128 columns). */
        const int wa = threadIdx.x - t0, wb = wa + st;
        dp_win da, db;
        dp_win_load(a.f, x, wa, nw, da);
        if (st < nw) dp_win_load(a.f, x, wb, nw, db);
        dp_win_put(a.f, da, n0, wa, nw, xs); /* (n0: gw of words wa and wb, loaded before the wait) */
        if (st < nw) dp_win_put(a.f, db, n0, wb, nw, xs);
        wstart = 2 * st;
    }
    for (int w0 = wstart; w0 < nw; w0 += st) { /* (nw a multiple of 8: a group's lanes all in or all out) */
        if ((int)threadIdx.x < t0) break;
        const int w = w0 + threadIdx.x - t0;
        float v[8] = { 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f };
        if (w < nw)
            for (int j = 0; j < 8; j++) {
                const int c = 8 * w + j;
                v[j] = nrm ? w0 == 0 ? v0[j] * r * n0[j] : (add ? x[c] + add[c] : x[c]) * r * a.f.nw[c] : dp_in(x, x2, c);
                if (wr) a.f.tout[c] = v[j];
            }
        if (a.f.gz) { /* (v loaded above: only the word's z here; its gw is n0, w0 a multiple of 16 words) */
            float z[8] = { 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f };
            if (w < nw) dp_ld8(a.f.gz, 8 * w, z);
            dp_gated(a.f, v, z, n0);
        }
        dp_put(v, w < nw, w, xs);
    }
    __syncthreads();
}

/* With the norm (f.nw, no X2, no gz: a decode batch's in-projection after its folded combine,
 * cu_mvdp_comb with T rows): row r's input is rmsnorm(X_r) * nw, its sum of squares summed as one
 * token's k_mvdp sums it (DP_WARPS x 32 threads, a thread's words w, w + 256, ..., each warp's by the
 * butterfly read at lane 0, the warps' in order), so a row's scale is the one its token alone gets;
 * here a warp a (row, k_mvdp warp) pair, in a pass before the staging (its loads then hit L1). Block 0 writes the normed
 * rows to f.tout (row stride ldx); dp_stage_rows' gw8 holds nw of the thread's word threadIdx.x % nw
 * (loaded before the wait, dp_rows_nw0) where every word of the thread is that one (blockDim a
 * multiple of nw). */
static __device__ __forceinline__ void dp_rows_norm(const mvq_fuse &f, const float *X, int ldx, int T, int nw, float *rr) {
    constexpr int VW = DP_WARPS; /* the warps of one token's k_mvdp */
    __shared__ float part[16 * VW]; /* [T][VW] each (row, k_mvdp warp) partial */
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, cols = 8 * nw;
    /* (row, warp of k_mvdp) pairs spread over this block's warps: 2 rows keep all 8 busy */
    for (int p = warp; p < T * VW; p += blockDim.x / WARP) {
        const int r = p / VW, i = p % VW;
        const float *x = X + (size_t)r * ldx;
        float sv = 0.f;
        for (int w = WARP * i + lane; w < nw; w += VW * WARP) {
            float v[8];
            dp_ld8(x, 8 * w, v);
            for (int j = 0; j < 8; j++) sv += v[j] * v[j];
        }
        for (int o = 16; o; o >>= 1) sv += __shfl_xor_sync(0xffffffffu, sv, o);
        if (lane == 0) part[p] = sv;
    }
    __syncthreads();
    if ((int)threadIdx.x < T) {
        float ss = 0.f;
        for (int i = 0; i < VW; i++) ss += part[threadIdx.x * VW + i];
        rr[threadIdx.x] = 1.0f / sqrtf(ss / cols + f.eps);
    }
    __syncthreads();
}
/* nw of word threadIdx.x % nw (dp_stage_rows' gw8 for the norm), before the wait */
static __device__ __forceinline__ void dp_rows_nw0(const mvq_fuse &f, int nw, float (&n8)[8]) {
    for (int j = 0; j < 8; j++) n8[j] = 0.f;
    if (f.nw && blockDim.x % nw == 0) dp_ld8(f.nw, 8 * (threadIdx.x % nw), n8);
}
/* T rows of input (row r at X + r ldx; silu(X) * X2 when X2) staged by the block into xs + r ts (dp_put),
 * word W of the T x nw words being word W % nw of row W / nw. A thread's two words' loads all go out
 * before either is staged (one round trip to L2 a pass, not one a word); a group's 8 words are 8 lanes
 * of one warp and of one row (nw a multiple of 8). GZ (k_mvdpt's batch out-projection), with f.gz: each
 * head of 128 columns gated-normed first (dp_gated: a head's 16 words on 16 lanes, so blockDim and nw
 * multiples of 16), gw8 the thread's 8 gw. NRM: the norm (dp_rows_norm) may be asked (f.nw), in
 * instances of their own, so the kernels' other instances compile as before it. The closing barrier
 * is the caller's. */
template <bool GZ, bool NRM>
static __device__ __forceinline__ void dp_stage_rows(const mvq_fuse &f, const float *X, const float *X2, int ldx, int T, int nw, uint4 *xs,
                                                     size_t ts, int rmax, const float (&gw8)[8]) {
    __shared__ float rr[16]; /* [T] each row's norm scale (f.nw) */
    const bool nrm = NRM && f.nw != NULL, n8 = blockDim.x % nw == 0, wr = nrm && f.tout && blockIdx.x == 0;
    if (nrm) dp_rows_norm(f, X, ldx, T, nw, rr);
    for (int w0 = 0; w0 < T * nw; w0 += 2 * (int)blockDim.x) {
        float v[2][8], z[2][8];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int W = w0 + u * blockDim.x + threadIdx.x, r = W / nw, w = W % nw;
#pragma unroll
            for (int j = 0; j < 8; j++) v[u][j] = z[u][j] = 0.f;
            if (W < T * nw) {
                const float *x = X + (size_t)r * ldx;
                if (X2) {
                    const float *x2 = X2 + (size_t)r * ldx;
#pragma unroll
                    for (int j = 0; j < 8; j++) v[u][j] = dp_in(x, x2, 8 * w + j);
                } else dp_ld8(x, 8 * w, v[u]);
                if (GZ && f.gz) dp_ld8(f.gz + (size_t)r * ldx, 8 * w, z[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int W = w0 + u * blockDim.x + threadIdx.x, r = W / nw;
            if (GZ && f.gz) dp_gated(f, v[u], z[u], gw8);
            if (nrm && W < T * nw) { /* (x r) nw, as k_mvdp's staging */
                const int w = W % nw;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    v[u][j] = v[u][j] * rr[r] * (n8 ? gw8[j] : f.nw[8 * w + j]);
                    if (wr) f.tout[(size_t)r * ldx + 8 * w + j] = v[u][j];
                }
            }
            dp_put(v[u], W < T * nw, W % nw, xs + (size_t)(r < rmax ? r : 0) * ts); /* (rmax >= T: no store past the rows) */
        }
    }
}

/* R rows of one matrix (or expert): codes, scales, biases of the lane's rows (the last row for
 * rows past the matrix) */
struct dp_rows {
    const uint4 *w;  /* row r0's codes; the others follow at cols * BITS / 128 uint4s */
    const char *s, *b;
    int lg, r0, nr; /* log2 of the units a group; first row; rows here */
};
/* rows r0 .. r0 + R - 1 of matrix (or expert e of) m */
template <int R, int BITS>
static __device__ __forceinline__ dp_rows dp_rows_at(const dmat &m, int e, int r0) {
    dp_rows t;
    t.r0 = r0;
    t.lg = __ffs(m.group / 64) - 1;
    t.nr = min(R, max(m.rows - t.r0, 0));
    const int r = min(t.r0, m.rows - 1), ngr = m.cols / m.group;
    const size_t sz = m.sbt == LW_F32 ? 4 : 2;
    t.w = (const uint4 *)((const char *)m.w + (long long)e * m.ew) + (size_t)r * (m.cols * BITS / 128);
    t.s = (const char *)m.s + (long long)e * m.es + (size_t)r * ngr * sz;
    t.b = (const char *)m.b + (long long)e * m.es + (size_t)r * ngr * sz;
    return t;
}
template <int R, int BITS>
static __device__ __forceinline__ dp_rows dp_locate(const mvq_args &a, bool xsl, int e, int tile, int &mi, int rpt, int rib) {
    while (mi + 1 < a.n && tile >= a.blk0[mi + 1]) mi++;
    return dp_rows_at<R, BITS>(xsl ? a.f.xm[mi] : a.m[mi], e, (tile - a.blk0[mi]) * rpt + rib * R);
}
/* entry i of a scale or bias array p of type ty, as raw bits (a 16-bit type's in the low half) */
static __device__ __forceinline__ uint32_t dp_sb_raw(const char *p, int ty, int i) {
    return ty == LW_F32 ? ((const uint32_t *)p)[i] : ((const uint16_t *)p)[i];
}
/* A group's codes, and its scales' and biases' raw bits (a 16-bit type's in the low half), converted
 * by dp_sb_cvt: k_mvdp holds the raw bits across its wait, since a conversion right after the load
 * waits for it there; dp_fetch converts at once */
template <int R, int SBT, int BITS>
static __device__ __forceinline__ void dp_fetch_raw(const dp_rows &t, int sbt, int g, int nrow16, int ngr, uint4 (&c)[R][BITS / 2],
                                             uint32_t (&sr)[R], uint32_t (&br)[R]) {
    const int ty = SBT >= 0 ? SBT : sbt;
    const size_t sz = ty == LW_F32 ? 4 : 2;
#pragma unroll
    for (int k = 0; k < R; k++) {
        const int kk = k < t.nr ? k : (t.nr > 0 ? t.nr - 1 : 0);
        const uint4 *w = t.w + (size_t)kk * nrow16 + (BITS / 2) * g;
#pragma unroll
        for (int i = 0; i < BITS / 2; i++) c[k][i] = __ldg(w + i);
        const int gi = g >> t.lg;
        const char *ps = t.s + (size_t)kk * ngr * sz, *pb = t.b + (size_t)kk * ngr * sz;
        sr[k] = dp_sb_raw(ps, ty, gi);
        br[k] = dp_sb_raw(pb, ty, gi);
    }
}
template <int SBT>
static __device__ __forceinline__ float dp_sb_cvt(uint32_t raw, int sbt) {
    const int ty = SBT >= 0 ? SBT : sbt;
    return ty == LW_BF16 ? bf2f((uint16_t)raw) : ty == LW_F16 ? h2f((uint16_t)raw) : __uint_as_float(raw);
}
/* group g of the R rows: codes (BITS / 2 uint4 a row), scales and biases; rows past the matrix
 * read its last row again (row r0 + k clamped: offsets k or fewer rows from r0) */
template <int R, int SBT, int BITS>
static __device__ __forceinline__ void dp_fetch(const dp_rows &t, int sbt, int g, int nrow16, int ngr, uint4 (&c)[R][BITS / 2],
                                         float (&sc)[R], float (&bi)[R]) {
    uint32_t sr[R], br[R];
    dp_fetch_raw<R, SBT, BITS>(t, sbt, g, nrow16, ngr, c, sr, br);
#pragma unroll
    for (int k = 0; k < R; k++) {
        sc[k] = dp_sb_cvt<SBT>(sr[k], sbt);
        bi[k] = dp_sb_cvt<SBT>(br[k], sbt);
    }
}

/* A group's three exact integer sums for R rows: the codes c (BITS / 2 uint4 a row) against the
 * staged input's bytes xg (dp_put's layout), H the high bytes' sum, M the middle's, L the low's */
template <int R, int BITS>
static __device__ __forceinline__ void dp_gsum(const uint4 (&c)[R][BITS / 2], const uint4 *xg, int (&H)[R], int (&M)[R], int (&L)[R]) {
#pragma unroll
    for (int k = 0; k < R; k++) H[k] = M[k] = L[k] = 0;
    if (BITS == 8) /* a word of codes is 4 columns in order: the staged bytes put back in order */
#pragma unroll
        for (int p = 0; p < 4; p++) { /* 8-column words 2p, 2p + 1 */
            uint32_t xn[2][3][2]; /* [word][level][columns 0-3, 4-7] */
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int lev = 0; lev < 3; lev++) {
                    const uint4 v = xg[3 * p + lev];
                    xn[h][lev][0] = __byte_perm(cu_word(v, 2 * h), cu_word(v, 2 * h + 1), 0x5140);
                    xn[h][lev][1] = __byte_perm(cu_word(v, 2 * h), cu_word(v, 2 * h + 1), 0x7362);
                }
#pragma unroll
            for (int k = 0; k < R; k++)
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int q = 0; q < 2; q++) {
                        const int wi = 4 * p + 2 * h + q; /* the code word: columns 4 wi .. 4 wi + 3 */
                        const uint32_t wv = cu_word(c[k][wi / 4 % (BITS / 2)], wi % 4);
                        H[k] = cu_dp4a(wv, xn[h][0][q], H[k]);
                        M[k] = cu_dp4a(wv, xn[h][1][q], M[k]);
                        L[k] = cu_dp4a(wv, xn[h][2][q], L[k]);
                    }
        }
    else
#pragma unroll
    for (int p = 0; p < 4; p++) { /* word pairs 2p, 2p + 1 */
        const uint4 xh = xg[3 * p], xm = xg[3 * p + 1], xl = xg[3 * p + 2];
#pragma unroll
        for (int k = 0; k < R; k++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t wv = cu_word(c[k][p / 2], 2 * (p % 2) + h);
                const uint32_t ev = wv & 0x0F0F0F0Fu, od = (wv >> 4) & 0x0F0F0F0Fu;
                H[k] = cu_dp4a(ev, cu_word(xh, 2 * h), H[k]);
                H[k] = cu_dp4a(od, cu_word(xh, 2 * h + 1), H[k]);
                M[k] = cu_dp4a(ev, cu_word(xm, 2 * h), M[k]);
                M[k] = cu_dp4a(od, cu_word(xm, 2 * h + 1), M[k]);
                L[k] = cu_dp4a(ev, cu_word(xl, 2 * h), L[k]);
                L[k] = cu_dp4a(od, cu_word(xl, 2 * h + 1), L[k]);
            }
    }
}

/* The group's sums for R rows added to acc[k * S] (S: the accumulators' stride, k_mvdpb's rows of
 * input): its scale times the group's unit times 2^16 H + 2^8 M + L, plus its bias times the exact
 * group sum. xg: the staged group (dp_put). */
template <int R, int BITS, int S>
static __device__ __forceinline__ void dp_group(const uint4 (&c)[R][BITS / 2], const float (&sc)[R], const float (&bi)[R], const uint4 *xg,
                                                float *acc) {
    int H[R], M[R], L[R];
    dp_gsum<R, BITS>(c, xg, H, M, L);
    const uint4 meta = xg[12];
    const float unit = __uint_as_float(meta.x), gs = __uint_as_float(meta.y);
#pragma unroll
    for (int k = 0; k < R; k++) {
        const float d = fmaf(65536.f, (float)H[k], fmaf(256.f, (float)M[k], (float)L[k]));
        acc[k * S] += sc[k] * (unit * d) + bi[k] * gs;
    }
}
/* the next group's codes, scales and biases (fetched ahead) become the current ones */
template <int R, int BITS>
static __device__ __forceinline__ void dp_take(uint4 (&c)[R][BITS / 2], float (&sc)[R], float (&bi)[R], const uint4 (&c2)[R][BITS / 2],
                                               const float (&sc2)[R], const float (&bi2)[R]) {
#pragma unroll
    for (int k = 0; k < R; k++) {
#pragma unroll
        for (int i = 0; i < BITS / 2; i++) c[k][i] = c2[k][i];
        sc[k] = sc2[k];
        bi[k] = bi2[k];
    }
}
/* N partial sums over the LPR lanes of a row (lane sub): each shuffle stage trades half of those
 * still held, then whole sums, so N sums cost log2(LPR) + N - 1 shuffles, not N log2(LPR). The lane
 * ends with whole sums of entries sel .. sel + max(N / LPR, 1) - 1 in acc[0 ..]; with N < LPR the
 * whole-sum stages are the low lane bits, so lanes with (sub & (LPR / N - 1)) == 0 hold them. */
template <int LPR, int N>
static __device__ __forceinline__ int dp_halve(float (&acc)[N], int sub) {
    int sel = 0;
#pragma unroll
    for (int o = LPR / 2, n = N; o; o >>= 1) {
        if (n > 1) {
            const bool up = (sub & o) != 0;
#pragma unroll
            for (int i = 0; i < n / 2; i++) {
                const float keep = up ? acc[i + n / 2] : acc[i], send = up ? acc[i] : acc[i + n / 2];
                acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
            if (up) sel += n / 2;
            n /= 2;
        } else acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], o);
    }
    return sel;
}

/* One tile: the R rows of t over the input xg's groups (a lane the groups sub, sub + LPR, ...),
 * reduced across the LPR lanes; rsel: the row (of the R) whose whole sum the lane returns, valid
 * on lanes with (sub & (LPR / R - 1)) == 0. have: c, sc, bi hold group sub already (fetched early). */
template <int LPR, int R, int SBT, int BITS, int G>
static __device__ __forceinline__ float dp_tile(const dp_rows &t, int sbt, int ngr, int ng, int nrow16, int sub, const uint4 *dxs, bool &have,
                                         uint4 (&c)[R][BITS / 2], float (&sc)[R], float (&bi)[R], int &rsel) {
    uint4 c2[R][BITS / 2];
    float sc2[R], bi2[R]; /* (zeroed: g++ cannot see that G 2 fetches them before their first read) */
    float acc[R];
#pragma unroll
    for (int k = 0; k < R; k++) sc2[k] = bi2[k] = 0.f;
#pragma unroll
    for (int k = 0; k < R; k++) acc[k] = 0.f;
    for (int g = sub; g < ng; g += LPR) {
        if (!have) dp_fetch<R, SBT, BITS>(t, sbt, g, nrow16, ngr, c, sc, bi);
        have = false;
        const bool next = G == 2 && g + LPR < ng;
        if (next) dp_fetch<R, SBT, BITS>(t, sbt, g + LPR, nrow16, ngr, c2, sc2, bi2);
        dp_group<R, BITS, 1>(c, sc, bi, dxs + (size_t)g * DP_G4, acc);
        if (next) {
            dp_take<R, BITS>(c, sc, bi, c2, sc2, bi2);
            have = true;
        }
    }
    /* the R rows over the LPR lanes (R <= LPR: a lane ends with one row's whole sum) */
    rsel = dp_halve<LPR, R>(acc, sub);
    return acc[0];
}

/* LILY_CU_MVDP=0: k_mvtc / k_mvq4 instead, for measuring */
static inline int mvdp_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_MVDP", 1);
}

static inline int dp_fits(const dmat *m, int cols, int bits) {
    const int u = m->group / 64;
    return m->type == LW_Q && m->bits == bits && m->cols == cols && m->group % 64 == 0 && u > 0 && (u & (u - 1)) == 0;
}

static inline int dp_warps(void) {
    static int w = INT_MIN;
    cu_env_int(&w, "LILY_CU_MVDP_WARPS", DP_WARPS); /* 4 or 8 warps a block, for measuring */
    return w == 4 ? 4 : DP_WARPS;
}
static inline size_t dp_smem(int cols) { return (size_t)(cols / 64) * DP_G4 * 16; }
/* The staged input must fit the MVQ_SMEM mvq_grid opts the kernel in to (20,160 columns). */
#define DP_MAX_COLS (MVQ_SMEM / (DP_G4 * 16) * 64)

#endif
