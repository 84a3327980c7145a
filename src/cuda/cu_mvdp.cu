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
__device__ __forceinline__ int cu_dp4a(uint32_t a, uint32_t b, int c) {
#ifdef __CUDA_ARCH__
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#else
    for (int i = 0; i < 4; i++) c += (int)((a >> (8 * i)) & 255u) * (int)(int8_t)(uint8_t)(b >> (8 * i));
    return c;
#endif
}

__device__ __forceinline__ float dp_in(const float *x, const float *x2, int i) { return x2 ? silu_f(x[i]) * x2[i] : x[i]; }

/* Word w of the input (columns 8w .. 8w + 7, values v) into xs as DP_G4 uint4 a 64-column group:
 * word i of the group sits in uint4 3 (i / 2) + level, components 2 (i % 2) (the even columns'
 * bytes, in the order the codes' low nibbles come out of a word: 0 2 4 6) and 2 (i % 2) + 1 (the
 * odd columns'); level 0 h, 1 m, 2 l. uint4 12: (unit, exact fp32 sum). A group's 8 words are 8
 * lanes of one warp, all valid or none (every lane of the warp comes here: the group's largest |x|
 * by shuffles, no block reduction). */
__device__ __forceinline__ void dp_put(const float (&v)[8], bool valid, int w, uint4 *xs) {
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
__device__ __forceinline__ void dp_gated(const mvq_fuse &f, float (&v)[8], const float (&zv)[8], const float (&gv)[8]) {
    float ss = 0.f;
    for (int j = 0; j < 8; j++) ss += v[j] * v[j];
    for (int o = 1; o < 16; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = 1.0f / sqrtf(ss / 128 + f.eps);
    for (int j = 0; j < 8; j++) v[j] = v[j] * r * gv[j] * silu_f(zv[j]);
}
/* 8 floats p[c0 .. c0 + 7] (c0 a multiple of 8): two 16-byte loads where p is aligned */
__device__ __forceinline__ void dp_ld8(const float *p, int c0, float (&v)[8]) {
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
__device__ __forceinline__ void dp_nw0(const mvq_args &a, int cols, float (&n0)[8]) {
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
__device__ __forceinline__ void dp_win_load(const mvq_fuse &f, const float *x, int w, int nw, dp_win &d) {
    for (int j = 0; j < 8; j++) d.v[j] = d.z[j] = 0.f;
    if (w >= nw) return;
    dp_ld8(x, 8 * w, d.v);
    if (f.gz) dp_ld8(f.gz, 8 * w, d.z);
}
/* ... then the values staged (dp_put; every lane of the warp comes here); g: the word's gw */
__device__ __forceinline__ void dp_win_put(const mvq_fuse &f, dp_win &d, const float (&g)[8], int w, int nw, uint4 *xs) {
    if (f.gz) dp_gated(f, d.v, d.z, g);
    dp_put(d.v, w < nw, w, xs);
}
__device__ __forceinline__ void dp_stage(const mvq_args &a, const float *x, const float *x2, int cols, uint4 *xs, int t0,
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

__device__ __forceinline__ uint32_t dp_word(const uint4 &v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

/* R rows of one matrix (or expert): codes, scales, biases of the lane's rows (the last row for
 * rows past the matrix) */
struct dp_rows {
    const uint4 *w;  /* row r0's codes; the others follow at cols * BITS / 128 uint4s */
    const char *s, *b;
    int lg, r0, nr; /* log2 of the units a group; first row; rows here */
};
/* rows r0 .. r0 + R - 1 of matrix (or expert e of) m */
template <int R, int BITS>
__device__ __forceinline__ dp_rows dp_rows_at(const dmat &m, int e, int r0) {
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
__device__ __forceinline__ dp_rows dp_locate(const mvq_args &a, bool xsl, int e, int tile, int &mi, int rpt, int rib) {
    while (mi + 1 < a.n && tile >= a.blk0[mi + 1]) mi++;
    return dp_rows_at<R, BITS>(xsl ? a.f.xm[mi] : a.m[mi], e, (tile - a.blk0[mi]) * rpt + rib * R);
}
/* A group's codes, and its scales' and biases' raw bits (a 16-bit type's in the low half), converted
 * by dp_sb_cvt: k_mvdp holds the raw bits across its wait, since a conversion right after the load
 * waits for it there; dp_fetch converts at once */
template <int R, int SBT, int BITS>
__device__ __forceinline__ void dp_fetch_raw(const dp_rows &t, int sbt, int g, int nrow16, int ngr, uint4 (&c)[R][BITS / 2],
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
        sr[k] = ty == LW_F32 ? ((const uint32_t *)ps)[gi] : ((const uint16_t *)ps)[gi];
        br[k] = ty == LW_F32 ? ((const uint32_t *)pb)[gi] : ((const uint16_t *)pb)[gi];
    }
}
template <int SBT>
__device__ __forceinline__ float dp_sb_cvt(uint32_t raw, int sbt) {
    const int ty = SBT >= 0 ? SBT : sbt;
    return ty == LW_BF16 ? bf2f((uint16_t)raw) : ty == LW_F16 ? h2f((uint16_t)raw) : __uint_as_float(raw);
}
/* group g of the R rows: codes (BITS / 2 uint4 a row), scales and biases; rows past the matrix
 * read its last row again (row r0 + k clamped: offsets k or fewer rows from r0) */
template <int R, int SBT, int BITS>
__device__ __forceinline__ void dp_fetch(const dp_rows &t, int sbt, int g, int nrow16, int ngr, uint4 (&c)[R][BITS / 2],
                                         float (&sc)[R], float (&bi)[R]) {
    uint32_t sr[R], br[R];
    dp_fetch_raw<R, SBT, BITS>(t, sbt, g, nrow16, ngr, c, sr, br);
#pragma unroll
    for (int k = 0; k < R; k++) {
        sc[k] = dp_sb_cvt<SBT>(sr[k], sbt);
        bi[k] = dp_sb_cvt<SBT>(br[k], sbt);
    }
}

/* One tile: the R rows of t over the input xg's groups (a lane the groups sub, sub + LPR, ...),
 * reduced across the LPR lanes; rsel: the row (of the R) whose whole sum the lane returns, valid
 * on lanes with (sub & (LPR / R - 1)) == 0. have: c, sc, bi hold group sub already (fetched early). */
template <int LPR, int R, int SBT, int BITS, int G>
__device__ __forceinline__ float dp_tile(const dp_rows &t, int sbt, int ngr, int ng, int nrow16, int sub, const uint4 *dxs, bool &have,
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
        const uint4 *xg = dxs + (size_t)g * DP_G4;
        int H[R], M[R], L[R];
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
                        xn[h][lev][0] = __byte_perm(dp_word(v, 2 * h), dp_word(v, 2 * h + 1), 0x5140);
                        xn[h][lev][1] = __byte_perm(dp_word(v, 2 * h), dp_word(v, 2 * h + 1), 0x7362);
                    }
#pragma unroll
                for (int k = 0; k < R; k++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
#pragma unroll
                        for (int q = 0; q < 2; q++) {
                            const int wi = 4 * p + 2 * h + q; /* the code word: columns 4 wi .. 4 wi + 3 */
                            const uint32_t wv = dp_word(c[k][wi / 4 % (BITS / 2)], wi % 4);
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
                    const uint32_t wv = dp_word(c[k][p / 2], 2 * (p % 2) + h);
                    const uint32_t ev = wv & 0x0F0F0F0Fu, od = (wv >> 4) & 0x0F0F0F0Fu;
                    H[k] = cu_dp4a(ev, dp_word(xh, 2 * h), H[k]);
                    H[k] = cu_dp4a(od, dp_word(xh, 2 * h + 1), H[k]);
                    M[k] = cu_dp4a(ev, dp_word(xm, 2 * h), M[k]);
                    M[k] = cu_dp4a(od, dp_word(xm, 2 * h + 1), M[k]);
                    L[k] = cu_dp4a(ev, dp_word(xl, 2 * h), L[k]);
                    L[k] = cu_dp4a(od, dp_word(xl, 2 * h + 1), L[k]);
                }
        }
        const uint4 meta = xg[12];
        const float unit = __uint_as_float(meta.x), gs = __uint_as_float(meta.y);
#pragma unroll
        for (int k = 0; k < R; k++) {
            const float d = fmaf(65536.f, (float)H[k], fmaf(256.f, (float)M[k], (float)L[k]));
            acc[k] += sc[k] * (unit * d) + bi[k] * gs;
        }
        if (next) {
#pragma unroll
            for (int k = 0; k < R; k++) {
#pragma unroll
                for (int i = 0; i < BITS / 2; i++) c[k][i] = c2[k][i];
                sc[k] = sc2[k];
                bi[k] = bi2[k];
            }
            have = true;
        }
    }
    /* the R rows over the LPR lanes: a stage trades half the rows still held, then whole sums */
    rsel = 0;
#pragma unroll
    for (int o = LPR / 2, n = R; o; o >>= 1) {
        if (n > 1) {
            const bool up = (sub & o) != 0;
#pragma unroll
            for (int i = 0; i < n / 2; i++) {
                const float keep = up ? acc[i + n / 2] : acc[i], send = up ? acc[i] : acc[i + n / 2];
                acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
            if (up) rsel += n / 2;
            n /= 2;
        } else acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], o);
    }
    /* (R <= LPR: the row stages end where the whole-sum ones begin, lane bits below are 0) */
    return acc[0];
}

/* G 2: a lane's next group of the tile is fetched before this one is computed (rows of more than
 * LPR groups, the 4,096-column out-projections: their two round trips a tile in flight together;
 * LILY_CU_MVDP_G2=1, measured slower, below) */
/* Y[i] [slots][ldy[i]] (one row without eidx) = W[i] x, x = X row slot / xdiv (a.f.xrow for the
 * extra slot), silu(x) * X2 when X2; a.blk0 in tiles of R x 32 / LPR rows. */
template <int LPR, int R, int SBT, int BITS, int G>
__global__ void __launch_bounds__(DP_WARPS * WARP, 2) k_mvdp(mvq_args a, const float *__restrict__ X, const float *__restrict__ X2,
                                                          int ldx, const int *eidx, int xdiv) {
    extern __shared__ uint4 dxs[]; /* [cols / 64][DP_G4] the staged input */
    __shared__ int rs[WARP];       /* with a.f.rlog: the block's routing (experts, weights) */
    __shared__ float rw[WARP];
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
                     * whichever expert); dp_stage's closing barrier publishes rs and rw */
        mvq_slot_input(a, X, X2, ldx, NULL, xdiv, xsl, slot, x, x2);
        if (warp == 0) {
            route_ld<8, LILY_DP_RDX>(a.f.rlog, a.f.E, a.f.K, rs, rw);
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
    if (a.f.rlog && !t0) e = xsl ? 0 : rs[slot];
    if (eidx && a.f.epf && !t0 && tile < ntiles && sub < ng) { /* (routing beside the staging: e not known yet) */
        t = dp_locate<R, BITS>(a, xsl, e, tile, mi, rpt, rib);
        const dmat &m = xsl ? a.f.xm[mi] : a.m[mi];
        dp_fetch<R, SBT, BITS>(t, m.sbt, sub, nrow16, m.cols / m.group, c, sc, bi);
        have = true;
    }
    dp_stage(a, x, X2 ? x2 : NULL, cols, dxs, t0, n0);
    CU_MARK(0);
    if (a.f.rlog) {
        if (blockIdx.x == 0 && slot == 0 && (int)threadIdx.x < a.f.K) {
            a.f.rsel[threadIdx.x] = rs[threadIdx.x];
            a.f.rwt[threadIdx.x] = rw[threadIdx.x];
        }
        e = xsl ? 0 : rs[slot];
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

/* LILY_CU_MVDP=0: k_mvtc / k_mvq4 instead, for measuring */
static int mvdp_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_MVDP", 1);
}

static int dp_fits(const dmat *m, int cols, int bits) {
    const int u = m->group / 64;
    return m->type == LW_Q && m->bits == bits && m->cols == cols && m->group % 64 == 0 && u > 0 && (u & (u - 1)) == 0;
}

static int dp_warps(void) {
    static int w = INT_MIN;
    cu_env_int(&w, "LILY_CU_MVDP_WARPS", DP_WARPS); /* 4 or 8 warps a block, for measuring */
    return w == 4 ? 4 : DP_WARPS;
}
static size_t dp_smem(int cols) { return (size_t)(cols / 64) * DP_G4 * 16; }

template <int LPR, int R, int SBT, int BITS, int G>
static void mvdp_go(cudaStream_t s, const mvq_args &a, int nslots, const float *X, const float *X2, int ldx, const int *eidx,
                    int xdiv) {
    /* as many blocks as the GPU holds at once over the slots, the walks made equal, as k_mvq4's
     * (mvq_grid; every block held with some warps a tile more measured slower, bench/RESULTS.md) */
    static mvq_kstate ks;
    const int warps = dp_warps(), blocks = (a.blk0[a.n] + warps - 1) / warps;
    const size_t sm = dp_smem(a.m[0].cols);
    const int gx = mvq_grid(k_mvdp<LPR, R, SBT, BITS, G>, ks, blocks, nslots, 0, warps * WARP, sm);
    cu_go(k_mvdp<LPR, R, SBT, BITS, G>, dim3(gx, nslots), warps * WARP, sm, s)(a, X, X2, ldx, eidx, xdiv);
}
template <int LPR, int R, int BITS, int G = 1>
static void mvdp_sbt(int sbt, cudaStream_t s, const mvq_args &a, int nslots, const float *X, const float *X2, int ldx,
                     const int *eidx, int xdiv) {
    if (sbt == LW_BF16) mvdp_go<LPR, R, LW_BF16, BITS, G>(s, a, nslots, X, X2, ldx, eidx, xdiv);
    else mvdp_go<LPR, R, -1, BITS, G>(s, a, nslots, X, X2, ldx, eidx, xdiv);
}
/* (8-bit codes: R <= 2, their two-times-larger rows in registers) */
template <int LPR>
static void mvdp_r(int R, int bits, int g2, int sbt, cudaStream_t s, const mvq_args &a, int nslots, const float *X, const float *X2,
                   int ldx, const int *eidx, int xdiv) {
    if (g2 && bits == 4 && LPR == 32) mvdp_sbt<LPR, 2, 4, 2>(sbt, s, a, nslots, X, X2, ldx, eidx, xdiv);
    else if (bits == 8) {
        if (R >= 2 && LPR >= 2) mvdp_sbt<LPR, (LPR >= 2 ? 2 : 1), 8>(sbt, s, a, nslots, X, X2, ldx, eidx, xdiv);
        else mvdp_sbt<LPR, 1, 8>(sbt, s, a, nslots, X, X2, ldx, eidx, xdiv);
    } else if (R >= 4 && LPR >= 4) mvdp_sbt<LPR, (LPR >= 4 ? 4 : 1), 4>(sbt, s, a, nslots, X, X2, ldx, eidx, xdiv);
    else if (R >= 2 && LPR >= 2) mvdp_sbt<LPR, (LPR >= 2 ? 2 : 1), 4>(sbt, s, a, nslots, X, X2, ldx, eidx, xdiv);
    else mvdp_sbt<LPR, 1, 4>(sbt, s, a, nslots, X, X2, ldx, eidx, xdiv);
}

static int test_r = 0;
void cu_mvdp_test_r(int r) { test_r = r; }

/* The staged input must fit the MVQ_SMEM mvq_grid opts the kernel in to (20,160 columns). */
#define DP_MAX_COLS (MVQ_SMEM / (DP_G4 * 16) * 64)

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
    if (!q8_on && (bits == 8 || in->f.add)) return 0;
    if (in->f.gz && (in->n != 1 || eidx || nslots != 1 || in->f.nw || in->f.rlog || in->f.xslot || X2 || cols % 128)) return 0;
    /* routing in the launch: one token's slots, route_ld's register form (E <= 256, K <= 32) */
    if (in->f.rlog && (!eidx || in->f.E > 8 * 32 || in->f.K > 32 || in->f.K < 1 || nslots != in->f.K + (in->f.xslot ? 1 : 0) ||
                       (in->f.xslot && in->f.xslot != in->f.K)))
        return 0;
    for (int i = 0; i < in->n; i++)
        if (!dp_fits(&in->m[i], cols, bits) ||
            (in->f.xslot && (!dp_fits(&in->f.xm[i], cols, bits) || in->f.xm[i].rows != in->m[i].rows)))
            return 0;
    const int lpr = ng >= 32 ? 32 : ng >= 16 ? 16 : ng >= 8 ? 8 : ng >= 4 ? 4 : ng >= 2 ? 2 : 1;
    /* R: rows a lane group, 4: more bytes in flight a warp measured faster than more warps on
     * every launch of a token (H200, bench/RESULTS.md session 15: R = 4 everywhere tg128 464 against
     * 447 for R as large as kept every warp slot busy; 455 against 442 for R as large as gave every
     * SM a block, which put the 2,048-row out-projections at R = 1, 256 blocks, not 64; Nsight alone
     * timed those two the same). LILY_CU_MVDP_R=1|2|4 fixes it, for measuring. */
    static int env_r = INT_MIN;
    cu_env_int(&env_r, "LILY_CU_MVDP_R", 4);
    int R = env_r == 1 || env_r == 2 ? env_r : 4;
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
    const int rpt = (32 / lpr) * R;
    int nt = 0;
    for (int i = 0; i < a.n; i++) {
        a.blk0[i] = nt;
        nt += (a.m[i].rows + rpt - 1) / rpt;
    }
    a.blk0[a.n] = nt;
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

typedef struct {
    dmat m;               /* the routed experts' down, [E][H][I] */
    dmat ms;              /* the shared expert's down, [H][I] (slot K when ns > K) */
    const int *sel;       /* [K] chosen experts */
    const float *wt;      /* [K] their weights */
    const float *sr;      /* [1] the shared expert's gate logit (ns > K) */
    const float *hg, *hu; /* [ns][I] gate and up outputs: the input is silu(hg) * hu */
    float *x;             /* [H] the residual, updated in place */
    const float *add;     /* [H] the mixer's output, not yet added (the fused router group's), or NULL */
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

/* A block: rows blockIdx.x * rpt .. + rpt - 1 (rpt = R x 32 / LPR, one tile), warp k slot k. */
template <int LPR, int R, int SBT>
__global__ void __launch_bounds__(DPC_MAXS * WARP, 1) k_mvdp_comb(const __grid_constant__ dpc_args a) {
    extern __shared__ uint4 dxs[];      /* [ns][I / 64][DP_G4] each slot's staged input */
    __shared__ float ys[DPC_MAXS][WARP]; /* [slot][row of the tile] the slots' sums */
    const int I = a.m.cols, ng = I / 64, nrow16 = I / 32, H = a.m.rows, rpt = (WARP / LPR) * R;
    const int slot = threadIdx.x / WARP, lane = threadIdx.x % WARP, sub = lane % LPR, rib = lane / LPR;
    const int row0 = blockIdx.x * rpt, tid = threadIdx.x;
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
        x0 = a.add ? a.x[row] + a.add[row] : a.x[row]; /* (x + add) first, as the combine */
        if (a.ns > a.K) gs = sigm_f(a.sr[0]);
    }
    CU_PDL(); /* sel, wt and the inputs come from the experts' gate|up launch */
    if (!shs) {
        t = dp_rows_at<R, 4>(a.m, a.sel[slot], row0 + rib * R);
        if (a.epf && sub < ng) { /* (LILY_CU_FOLD_EPF=1) the expert's first codes before the staging */
            dp_fetch<R, SBT, 4>(t, a.m.sbt, sub, nrow16, I / a.m.group, c, sc, bi);
            have = true;
        }
    }
    uint4 *xs = dxs + (size_t)slot * ng * DP_G4;
    dp_stage_warp(a.hg + (size_t)slot * I, a.hu + (size_t)slot * I, I, xs);
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
        for (int k = 0; k < a.K; k++) y += a.wt[k] * ys[k][tid];
        if (a.ns > a.K) y += gs * ys[a.K][tid];
        a.x[row] = x0 + y;
    }
}

template <int LPR, int R, int SBT>
static void dpc_go(cudaStream_t s, const dpc_args &a, size_t sm) {
    static int opted = 0; /* (I past 1,536 columns: more than the 48 KB a launch gets unasked) */
    if (!opted) opted = cudaFuncSetAttribute(k_mvdp_comb<LPR, R, SBT>, cudaFuncAttributeMaxDynamicSharedMemorySize, MVQ_SMEM) == cudaSuccess;
    const int rpt = (WARP / LPR) * R;
    cu_go(k_mvdp_comb<LPR, R, SBT>, (a.m.rows + rpt - 1) / rpt, a.ns * WARP, sm, s)(a);
}
template <int LPR>
static void dpc_sbt(cudaStream_t s, const dpc_args &a, size_t sm) {
    const int bf = a.m.sbt == LW_BF16 && (a.ns == a.K || a.ms.sbt == LW_BF16);
    if (bf) dpc_go<LPR, (LPR >= 4 ? 4 : LPR), LW_BF16>(s, a, sm);
    else dpc_go<LPR, (LPR >= 4 ? 4 : LPR), -1>(s, a, sm);
}

int cu_mvdp_comb_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_FOLD", 1);
}

int cu_mvdp_comb(cudaStream_t s, const dmat *D, const dmat *SDm, const int *sel, const float *wt, int K, const float *hg,
                 const float *hu, const float *sr, float *x, const float *add) {
    const int ns = K + (SDm != NULL), I = D->cols, ng = I / 64;
    const size_t sm = (size_t)ns * dp_smem(I);
    if (!mvdp_enabled() || K < 1 || ns > DPC_MAXS || I % 64 || !dp_fits(D, I, 4) || sm > MVQ_SMEM || ((uintptr_t)hg & 15) ||
        ((uintptr_t)hu & 15))
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
    case 32: dpc_sbt<32>(s, a, sm); break;
    case 16: dpc_sbt<16>(s, a, sm); break;
    case 8: dpc_sbt<8>(s, a, sm); break;
    case 4: dpc_sbt<4>(s, a, sm); break;
    case 2: dpc_sbt<2>(s, a, sm); break;
    default: dpc_sbt<1>(s, a, sm); break;
    }
    return 1;
}
