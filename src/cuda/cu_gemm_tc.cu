/* Prefill GEMMs for 4-bit weights on mma.sync with the codes turned into fp16 in registers
 * (k_gemm_tc): Y[t][r] = sum_k X[t][k] W[r][k], W in the MLX affine layout.
 *
 * Why: the wmma kernel (cu_gemm.cu) dequantizes a block's codes into shared memory, waits at
 * two barriers a 64-column step and keeps one 16-byte load of codes in flight a thread; the
 * experts' grouped GEMMs read their weights at a fifth of the H200's bandwidth (RESULTS.md).
 * Here codes, scales, biases and inputs stream into shared memory with cp.async, the next step
 * in flight while one computes (without holding registers); the inputs come packed as fp16 in the
 * mma's B order (XP: k_xp_pack or the producing launch wrote them so; one barrier a step) or as
 * fp32 that the block converts once a step (two barriers); a lane reads its own codes straight
 * into the mma's A fragment, so the dequantized weights never touch memory.
 *
 * The fragment trick (as k_mvtc): the mma's K index is a dot product's, so any pairing of
 * columns works if A and B use the same one. Lane (g, q) takes columns 32q..32q+31 of a
 * 128-column step, word w (8 codes, columns 32q + 8w + 0..7) feeding two k16 steps: the
 * pairs come out of a word as (c0,c4) (c1,c5) (c2,c6) (c3,c7), and the input is read in the
 * same pairs. The weights are rounded to fp16 as in the wmma kernel, (q s + b) 2^(e-24) in one
 * half FMA from the codes as subnormals (gt_deq); inputs saturate at fp16's range; fp32 accumulators.
 *
 * A block has 4 warps; a warp owns two 16-row tiles (A, the mma's M) and the block's BT
 * tokens (B, N = 8 a mma). DUAL (the experts' gate and up): tile 0 is gate's rows, tile 1 the
 * same rows of up, and the block writes silu(gate) * up, so neither is stored.
 * LILY_CU_GEMM_TC=0 leaves every GEMM to the wmma kernel.
 *
 * WG (dense, 64-token tiles, packed inputs; form 1 by default where the build and device have wgmma, LILY_CU_GEMM_WG=0 or 2
 * the mma.sync loop or form 2, for measuring; on the H200, session 17: pp512 +3.5% (the split out-projections too), pp2048 +5%, pp8192 +6% with form 1): the
 * same A fragments feed wgmma (cu_wg_mma64) instead of mma.sync. The mma's K order above is already
 * wgmma's: a k16 step's low half is pair 2s of the four lanes q's word w, its high half pair 2s + 1.
 * So the B operand's core-matrix row for a token (8 halves of one k half) is the four lanes' words
 * of that pair, the transpose of the packed layout's four chunks 4w + q (which hold a lane's four
 * pairs): each step the block rewrites its staged inputs so (a 4 x 4 transpose of words a token and
 * word, 16 KB), then a warpgroup issues 16 wgmma (8 k16 steps x the two 64-row tiles of its warps)
 * where the mma.sync form issued 128 mma and 32 B loads a warp. Why: the dense projections run at
 * ~270 TFLOP/s with the tensor pipe at 43% and the fixed-latency wait the top stall (RESULTS.md,
 * session 14); wgmma takes B from shared memory itself. */
#include "cuda/cu_dev.h"

#define GT_K 128      /* columns a step; a lane's 32 lie in one group (group % 32 == 0) */
#define GT_THREADS 128
#ifndef GT_HX /* the most n-tiles whose input rows a thread keeps in registers */
#define GT_HX 2
#endif

/* Stages (2-4): in flight while a step computes, ns - 1 of them. A stage is 8 KB of codes, the
 * scales, and BT rows of 512 bytes of fp32 inputs (256 of packed fp16 ones); after the stages, for
 * fp32 inputs, the step's inputs in fp16, BT x 256 bytes. Two: more blocks an SM (5 at 16 tokens) beat deeper stages on the H200
 * (pp512 13,234 against 12,743 with three where the tile is 16 or 32 tokens, bench/RESULTS.md);
 * LILY_CU_GT_NS=n sets them all, LILY_CU_GT_NS_MOE=n the experts' grouped launches alone, for measuring. */
__host__ __device__ static inline size_t gt_stage_bytes(int bt, int sbb, int xp) {
    return 8192 + 2 * 128 * (size_t)sbb + (size_t)bt * (xp ? 256 : 512);
}
static int gt_ns(int grouped) {
    static int env = INT_MIN, envm = INT_MIN;
    const int v = cu_env_int(&env, "LILY_CU_GT_NS", 2), vm = cu_env_int(&envm, "LILY_CU_GT_NS_MOE", v);
    const int n = grouped ? vm : v;
    return n >= 2 && n <= 4 ? n : 2;
}

/* The input's 16-byte chunk c (columns 4c..4c+3 of the step) of token t, swizzled so that the
 * 8 lanes of a quarter-warp, reading chunk 8q + 2w + h of tokens 2i, 2i+1 (q = 0..3), hit 8
 * distinct bank groups. */
__device__ __forceinline__ int gt_xsw(int t, int c) { return c ^ ((((c >> 3) & 3) << 1) | (t & 1)); }
/* Where token t's packed chunk c lies in a stage (XP): at c ^ 4 (t odd), so the quarter-warp of the
 * mma.sync loop, reading chunks 4w..4w+3 of tokens 2i and 2i + 1, hits all 32 banks; WG at c ^ (t & 7),
 * so the transpose's quarter-warp, one chunk of 8 consecutive tokens, does. */
template <int WG> __device__ __forceinline__ int gt_xpc(int t, int c) { return WG ? c ^ (t & 7) : c ^ ((t & 1) << 2); }
/* word w (unrolled: a constant) of a lane's 16 bytes of codes */
__device__ __forceinline__ uint32_t gt_word(const uint4 &v, int w) { return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w; }

/* A word's 8 codes as 4 fp16 pairs (c0,c4) (c1,c5) (c2,c6) (c3,c7), each (q s + b) 2^(e - 24)
 * (e = dmat.sexp) in one half FMA: the masked nibbles are fp16 subnormals, q 2^-24 (even pairs)
 * or q 2^-20 (odd ones, whose inputs are stored / 16), times s 2^e (a finite fp16) plus
 * b 2^(e - 24) (b 2^(e - 20)). The FMA rounds once, so a weight is its fp16 rounding as q s + b
 * would be, but below 2^(10 - e) (subnormal results) where it is within 2^-e (e is 16 at scales
 * up to 1). The block scales its sums by 2^(24 - e) at the end. (The exponent-of-1024 trick
 * needs a subtraction a pair more.) */
__device__ __forceinline__ void gt_deq(uint32_t w, __half2 s, __half2 b, __half2 b16, uint32_t (&p)[4]) {
    const uint32_t w8 = w >> 8;
    const uint32_t v[4] = { w & 0x000F000Fu, w & 0x00F000F0u, w8 & 0x000F000Fu, w8 & 0x00F000F0u };
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __half2 h;
        memcpy(&h, &v[i], 4);
        h = __hfma2(h, s, i & 1 ? b16 : b);
        memcpy(&p[i], &h, 4);
    }
}

/* Row of the block (0..127 in copy order: warp, tile, half, g) in the matrix of its tile. */
template <int DUAL>
__device__ __forceinline__ int gt_row(int r0, int wp, int tile, int half, int g) {
    return DUAL ? r0 + 16 * wp + 8 * half + g : r0 + 32 * wp + 16 * tile + 8 * half + g;
}

/* bytes of a scale; bytes of a row's scales (or biases) in a 128-column step */
__host__ __device__ static inline int gt_sbytes(int sbt) { return sbt == LW_F32 ? 4 : 2; }
static int gt_sbb(const dmat *W) { return GT_K / W->group * gt_sbytes(W->sbt); }

/* The matrices of a launch, all reading X: matrix i takes row blocks blk0[i] .. blk0[i + 1] - 1
 * and writes y[i] (rows of ldy[i]). DUAL: one output, m[0] the gate and m[1] the up. */
#define GT_MAX 4
typedef struct {
    dmat m[GT_MAX];
    void *y[GT_MAX]; /* float, or (DUAL with XP 2) fp16 in the packed input order (gt_xp_pos) */
    float *y2[GT_MAX]; /* split in K (gridDim.z = 2, not DUAL): the second half's sums, y the first's */
    int ldy[GT_MAX];
    int blk0[GT_MAX + 1];
    int n;
    /* bytes of a row's scales (and of its biases) over the block's steps, which the block copies to
     * shared memory once at its start (0: a step's with each stage). Why: a step's are 4 bytes from each
     * of 128 rows, a scale row apart, so each warp's copy touched 32 sectors for 128 bytes (Nsight, session 20: 35% of
     * the experts' gate|up's L2 sectors and 34% of its shared-memory wavefronts were these copies'
     * excess); a row's are contiguous over the steps, so once a block they are 16-byte copies. */
    int sbup;
} gt_group;

/* The packed fp16 input (XP): a row of C columns is C halves in 128-column steps of 16 chunks
 * of 8; chunk 4w + q holds what lane (g, q) multiplies with word w of its codes, columns
 * 32q + 8w + (0 4 1 5 2 6 3 7), the odd pairs (1 5, 3 7) / 16: the mma's B fragments as they
 * are, so the block copies its inputs and converts nothing. Where column c lies, and its factor. */
__host__ __device__ static inline int gt_xp_pos(int c, float &f) {
    const int r = c & 127, q = r >> 5, w = (r >> 3) & 3, i = r & 7, pair = i & 3;
    f = pair & 1 ? 0.0625f : 1.f;
    return (c & ~127) + (4 * w + q) * 8 + 2 * pair + (i >> 2);
}

__device__ __forceinline__ __half gt_hsat(float v) { return __float2half_rn(fminf(fmaxf(v, -65504.f), 65504.f)); }

/* sbb: bytes of scales (and of biases) a row has in a step, (128 / group) * size: 4, 8 or 16
 * (the same for all the launch's matrices, as their columns).
 * XP: X is the packed fp16 input (ldx in halves); XP 2 (DUAL): silu(gate) * up is written packed
 * too (the experts' down reads it so). A step then has no conversion, one barrier. */
/* The block's work once its tile is known: NJ (<= BT / 8) bounds the n-tiles of 8 tokens it
 * computes, so a 32-token tile holding at most 16 tokens (half the experts' at 512 tokens) runs a
 * loop with half the mma, B loads and accumulators, not the same loop with half its mma predicated
 * off (those still take issue slots). (Loops of exactly the tile's n-tiles, nothing predicated,
 * ran 8-10% fewer instructions, no WARPSYNC before each mma, but were no faster: RESULTS.md,
 * session 13.) */
template <int BT, int DUAL, int SBT, int XP, int NJ, int WG>
__device__ __forceinline__ void gt_body(const gt_group &G, const void *__restrict__ Xv, int ldx, const dsort &so, int xdiv,
                                        int sbb, int ns, int e, int n, int base, int t0, int nj, unsigned char *gt_sm, int *xo) {
    const int NS = ns;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
    int mi = 0;
    while (mi + 1 < G.n && (int)blockIdx.x >= G.blk0[mi + 1]) mi++;
    const dmat &m = G.m[mi], &m2 = G.m[DUAL ? 1 : mi];
    const int ldy = G.ldy[mi], r0 = ((int)blockIdx.x - G.blk0[mi]) * (DUAL ? 64 : 128);
    for (int t = tid; t < BT; t += GT_THREADS) {
        const int srow = base + (t0 + t < n ? t0 + t : t0); /* tokens past the tile's end repeat its first */
        const int xr = so.count ? (xdiv ? so.src[srow] / xdiv : srow) : srow;
        xo[t] = xr * ldx;
    }
    __syncthreads();
    /* XP: the rows this thread copies, read once where registers allow (a read of xo a copy a
     * step cost an LDS and a short-scoreboard wait in front of each copy) */
    constexpr bool HX = XP && NJ <= GT_HX;
    int xoj[NJ];
#pragma unroll
    for (int j = 0; j < NJ; j++) xoj[j] = HX && j < nj ? xo[(tid >> 4) + 8 * j] : 0;

    /* this thread's copies a step: codes chunk (wp = j, tile, half, lane) for j = 0..3, the
     * scale and bias of row tid (the same order), inputs chunk `lane` of tokens warp + 4j
     * (XP: chunk tid % 16 of tokens tid / 16 + 8j) */
    const size_t rowb = (size_t)m.cols / 2, sbrow = (size_t)(m.cols / GT_K) * sbb;
    const int ct = (tid >> 6) & 1, ch = (tid >> 5) & 1, cg = lane >> 2, cq = lane & 3;
    const dmat &cm = DUAL && ct ? m2 : m;
    const char *wsrc[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int r = gt_row<DUAL>(r0, j, ct, ch, cg);
        r = r < m.rows ? r : m.rows - 1; /* rows past the end load the last (outputs discarded) */
        wsrc[j] = (const char *)cm.w + (long long)e * cm.ew + (size_t)r * rowb + 16 * cq;
    }
    /* where row ri of the block (copy order: warp, tile, half, g) has its scales and biases */
    auto sb_row = [&](int ri, const char *&sp, const char *&bp) {
        const int tl = (ri >> 4) & 1;
        const dmat &sm = DUAL && tl ? m2 : m;
        int r = gt_row<DUAL>(r0, ri >> 5, tl, (ri >> 3) & 1, ri & 7);
        r = r < m.rows ? r : m.rows - 1;
        sp = (const char *)sm.s + (long long)e * sm.es + (size_t)r * sbrow;
        bp = (const char *)sm.b + (long long)e * sm.es + (size_t)r * sbrow;
    };
    const char *ssrc, *bsrc;
    sb_row(tid, ssrc, bsrc);
    const int sbu = G.sbup, sbs = sbu ? 0 : sbb; /* (sbs: a stage's bytes of a row's scales) */
    const size_t SB = gt_stage_bytes(BT, sbs, XP);
    /* the next step to issue goes to slot wslot; the sources advance a step each issue */
    const float *xsrc = (const float *)Xv + 4 * lane;
    const __half *xsrc16 = (const __half *)Xv + 8 * (tid & 15);
    const int xc = tid & 15, xt = tid >> 4; /* XP: this thread's chunk, its first token */
    int wslot = 0;
    auto stage = [&]() {
        unsigned char *st = gt_sm + (size_t)wslot * SB;
#pragma unroll
        for (int j = 0; j < 4; j++) { cu_cp<16>(st + (j * 128 + tid) * 16, wsrc[j]); wsrc[j] += GT_K / 2; }
        unsigned char *ss = st + 8192, *bs = ss + 128 * sbs;
        if (!sbu) {
            if (sbb == 4) { cu_cp<4>(ss + tid * 4, ssrc); cu_cp<4>(bs + tid * 4, bsrc); }
            else if (sbb == 8) { cu_cp<8>(ss + tid * 8, ssrc); cu_cp<8>(bs + tid * 8, bsrc); }
            else { cu_cp<16>(ss + tid * 16, ssrc); cu_cp<16>(bs + tid * 16, bsrc); }
            ssrc += sbb;
            bsrc += sbb;
        }
        if (XP) {
            /* token t's chunk c at c ^ 4 (t odd): the quarter-warp reading chunks 4w..4w+3 of
             * tokens 2i and 2i + 1 then hits all 32 banks */
            uint4 *xs = (uint4 *)(bs + 128 * sbs);
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const int t = xt + 8 * j;
                if (j < nj) cu_cp<16>(xs + t * 16 + gt_xpc<WG>(t, xc), xsrc16 + (HX ? xoj[j] : xo[t]));
            }
            xsrc16 += GT_K;
        } else {
            float *xs = (float *)(bs + 128 * sbs);
#pragma unroll
            for (int j = 0; j < BT / 4; j++) {
                const int t = warp + 4 * j;
                cu_cp<16>(xs + (t * 32 + gt_xsw(t, lane)) * 4, xsrc + xo[t]);
            }
            xsrc += GT_K;
        }
        wslot = wslot + 1 == NS ? 0 : wslot + 1;
    };

    float acc[2][NJ][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.f;

    /* each tile's dequantization factors (gt_deq): s 2^e, b 2^(e - 24), and the sums' 2^(24 - e) */
    const int e0 = m.sexp, e1 = DUAL ? m2.sexp : m.sexp;
    const float se[2] = { ldexpf(1.f, e0), ldexpf(1.f, e1) }, be[2] = { ldexpf(1.f, e0 - 24), ldexpf(1.f, e1 - 24) };
    const float ye[2] = { ldexpf(1.f, 24 - e0), ldexpf(1.f, 24 - e1) };
    /* split in K: block z takes steps k0 .. k0 + nk - 1 of the row's nkt */
    const int nkt = m.cols / GT_K, k0 = (int)blockIdx.z * nkt / (int)gridDim.z;
    const int nk = ((int)blockIdx.z + 1) * nkt / (int)gridDim.z - k0;
#pragma unroll
    for (int j = 0; j < 4; j++) wsrc[j] += (size_t)k0 * (GT_K / 2);
    ssrc += (size_t)k0 * sbb;
    bsrc += (size_t)k0 * sbb;
    xsrc += (size_t)k0 * GT_K;
    xsrc16 += (size_t)k0 * GT_K;
    float *const yout = blockIdx.z ? G.y2[mi] : (float *)G.y[mi];
    const int sboff = (32 * q / m.group) * gt_sbytes(m.sbt); /* this lane's group among a row's sbb bytes */
    /* sbu: every row's scales and biases for the block's steps, 16-byte copies, in the first stage's group
     * (row ri of the block in the copy order above; scales [128][sbu], then biases) */
    unsigned char *sball = gt_sm + (size_t)NS * SB + (XP ? 0 : (size_t)BT * 256) + (WG ? (size_t)64 * 256 : 0);
    if (sbu) {
        const int pr = sbu / 16;
        for (int i = tid; i < 128 * pr; i += GT_THREADS) {
            const int ri = i / pr, pc = i - ri * pr;
            const char *sp, *bp;
            sb_row(ri, sp, bp);
            const size_t off = (size_t)k0 * sbb + 16 * pc;
            cu_cp<16>(sball + ri * sbu + 16 * pc, sp + off);
            cu_cp<16>(sball + (128 + ri) * sbu + 16 * pc, bp + off);
        }
    }
    for (int s = 0; s < NS - 1; s++) {
        if (s < nk) stage();
        cu_cp_commit();
    }
    /* !XP: the step's inputs in fp16, converted once for the block's 4 warps: chunk (4j + w) * 32 +
     * lane holds the 8 inputs lane (g, q) multiplies with word w of its codes for tokens 8j + g,
     * in the mma's B order: x0 x4 | x1 x5 (k step 2w) | x2 x6 | x3 x7 (2w + 1) */
    uint4 *xh = (uint4 *)(gt_sm + (size_t)NS * SB);
    int rslot = 0; /* the slot of step k */
    for (int k = 0; k < nk; k++) {
        if (NS == 2) cu_cp_wait<0>();
        else if (NS == 3) cu_cp_wait<1>();
        else cu_cp_wait<2>();
        __syncthreads(); /* step k is in for every thread; every warp is done with step k - 1 */
        if (k + NS - 1 < nk) stage();
        cu_cp_commit();
        const unsigned char *st = gt_sm + (size_t)rslot * SB;
        rslot = rslot + 1 == NS ? 0 : rslot + 1;
        const uint4 *ws = (const uint4 *)st;
        /* the step's inputs at bs + 128 sbs; its scales (rows sstr bytes apart) at ss, biases at bs */
        const unsigned char *ss = st + 8192, *bs = ss + 128 * sbs, *xin = bs + 128 * sbs;
        const int sstr = sbu ? sbu : sbb;
        if (sbu) {
            ss = sball + (size_t)k * sbb;
            bs = ss + 128 * sbu;
        }
        if (!XP) {
            const float4 *xs = (const float4 *)xin;
#pragma unroll
            for (int r = 0; r < BT / 8; r++) {
                const int i = tid + GT_THREADS * r, t = 8 * (i >> 7) + ((i >> 2) & 7), c = 8 * (i & 3) + 2 * ((i >> 5) & 3);
                const float4 p0 = xs[t * 32 + gt_xsw(t, c)], p1 = xs[t * 32 + gt_xsw(t, c + 1)];
                /* the odd pairs' inputs / 16 (exact but where that falls below fp16's normal range,
                 * |x| < 2^-10: there an absolute error of 2^-21 at most, twice fp16's own there) */
                xh[i] = make_uint4(cu_h2sat(p0.x, p1.x), cu_h2sat(p0.y * 0.0625f, p1.y * 0.0625f), cu_h2sat(p0.z, p1.z),
                                   cu_h2sat(p0.w * 0.0625f, p1.w * 0.0625f));
            }
        }
        uint4 wv[2][2];
        __half2 s2[2][2], b2[2][2], b16[2][2];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int rr = (warp * 2 + i) * 2 + h;
                wv[i][h] = ws[rr * 32 + lane];
                const int ri = rr * 8 + g;
                const float sc = mvq_sb<SBT>((const char *)ss + ri * sstr + sboff, m.sbt, 0);
                const float bi = mvq_sb<SBT>((const char *)bs + ri * sstr + sboff, m.sbt, 0);
                s2[i][h] = __float2half2_rn(sc * se[i]);
                b2[i][h] = __float2half2_rn(bi * be[i]);
                b16[i][h] = __float2half2_rn(bi * (16.f * be[i]));
            }
        if constexpr (WG != 0) {
            /* token n's words w: chunks 4w + q (q = 0..3, a lane's four pairs) in, the pairs' rows out:
             * k16 step 2w + p / 2, k half p % 2, at (4w + p) KB + 16 n (core matrices of 8 tokens, 128
             * bytes apart; the k halves 1 KB apart) */
            const uint4 *xs = (const uint4 *)xin;
            uint4 *wb = (uint4 *)(gt_sm + (size_t)NS * SB);
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int u = tid + GT_THREADS * r, n = u & 63, w = u >> 6;
                uint4 M[4];
#pragma unroll
                for (int qq = 0; qq < 4; qq++) M[qq] = xs[n * 16 + gt_xpc<WG>(n, 4 * w + qq)];
                wb[(4 * w + 0) * 64 + n] = make_uint4(M[0].x, M[1].x, M[2].x, M[3].x);
                wb[(4 * w + 1) * 64 + n] = make_uint4(M[0].y, M[1].y, M[2].y, M[3].y);
                wb[(4 * w + 2) * 64 + n] = make_uint4(M[0].z, M[1].z, M[2].z, M[3].z);
                wb[(4 * w + 3) * 64 + n] = make_uint4(M[0].w, M[1].w, M[2].w, M[3].w);
            }
            cu_wg_smem_fence(); /* (ordinary stores, read by wgmma's async proxy) */
            __syncthreads();
            /* WG 1: the step's A, all four words' (64 registers), dequantized before one fence and 16
             * wgmma; WG 2: a word's at a time (16), a fence before each word's four wgmma, so fewer
             * registers are held and the dequantization of a word overlaps the products of the one before
             * (ptxas, bf16 scales: WG 1 235 registers, two blocks an SM; WG 2 compiled for three, 168 and
             * 80 bytes spilled; 198 registers at two) */
            uint32_t pa[4][2][4], pb[4][2][4]; /* words w, tiles, rows g and g + 8 */
#pragma unroll
            for (int w = 0; w < 4; w++) {
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    gt_deq(gt_word(wv[i][0], w), s2[i][0], b2[i][0], b16[i][0], pa[w][i]);
                    gt_deq(gt_word(wv[i][1], w), s2[i][1], b2[i][1], b16[i][1], pb[w][i]);
                }
                if (WG == 2 || w == 3) {
                    cu_wg_fence();
#pragma unroll
                    for (int w2 = WG == 2 ? w : 0; w2 <= w; w2++)
#pragma unroll
                        for (int h = 0; h < 2; h++)
#pragma unroll
                            for (int i = 0; i < 2; i++)
                                cu_wg_mma64(*reinterpret_cast<float(*)[32]>(&acc[i][0][0]), pa[w2][i][2 * h], pb[w2][i][2 * h],
                                            pa[w2][i][2 * h + 1], pb[w2][i][2 * h + 1], wb + (2 * w2 + h) * 128, 1024, 128, 1);
                }
            }
            cu_wg_commit();
            cu_wg_wait<0>(); /* (the next step rewrites wb; its barrier then covers every warp) */
            continue;
        }
        if (!XP) __syncthreads(); /* the fp16 inputs are in */
        const uint4 *xb = XP ? (const uint4 *)xin : xh;
#pragma unroll
        for (int w = 0; w < 4; w++) {
            uint4 bf[NJ];
#pragma unroll
            for (int j = 0; j < NJ; j++)
                if (j < nj) bf[j] = XP ? xb[(8 * j + g) * 16 + gt_xpc<0>(8 * j + g, 4 * w + q)] : xb[(4 * j + w) * 32 + lane];
            uint32_t pa[2][4], pb[2][4]; /* rows g and g + 8 of both tiles */
#pragma unroll
            for (int i = 0; i < 2; i++) {
                gt_deq(gt_word(wv[i][0], w), s2[i][0], b2[i][0], b16[i][0], pa[i]);
                gt_deq(gt_word(wv[i][1], w), s2[i][1], b2[i][1], b16[i][1], pb[i]);
            }
            /* the two k steps' products apart, so no mma waits on the one before it */
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < NJ; j++)
                    if (j < nj) tc_mma(acc[i][j], pa[i][0], pb[i][0], pa[i][1], pb[i][1], bf[j].x, bf[j].y);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < NJ; j++)
                    if (j < nj) tc_mma(acc[i][j], pa[i][2], pb[i][2], pa[i][3], pb[i][3], bf[j].z, bf[j].w);
        }
    }
    /* c[0..3] = C[g][2q], C[g][2q + 1], C[g + 8][2q], C[g + 8][2q + 1]: rows by tile, tokens by j */
#pragma unroll
    for (int i = 0; i < (DUAL ? 1 : 2); i++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int row = gt_row<DUAL>(r0, warp, i, c >> 1, g), t = t0 + 8 * j + 2 * q + (c & 1);
                if (row >= m.rows || t >= n) continue;
                const float v = DUAL ? silu_fast(ye[0] * acc[0][j][c]) * (ye[1] * acc[1][j][c]) : ye[i] * acc[i][j][c];
                if (DUAL && XP == 2) {
                    float f;
                    const int p = gt_xp_pos(row, f);
                    ((__half *)G.y[mi])[(size_t)(base + t) * ldy + p] = gt_hsat(v * f);
                } else {
                    yout[(size_t)(base + t) * ldy + row] = v;
                }
            }
}

#ifndef GT_OCC32 /* blocks an SM the packed-input 32-token tiles are compiled for (measuring: 5) */
#define GT_OCC32 4
#endif
template <int BT, int DUAL, int SBT, int XP, int WG = 0>
__global__ void __launch_bounds__(GT_THREADS, WG == 2 ? 3 : WG ? 2 : BT == 16 ? 5 : XP && BT == 32 ? GT_OCC32 : XP && BT == 64 ? 3 : 1) k_gemm_tc(const __grid_constant__ gt_group G, const void *__restrict__ Xv, int ldx,
                                                        int T, dsort so, int xdiv, int sbb, int ns, int njv) {
    CU_PDL();
    extern __shared__ __align__(16) unsigned char gt_sm[];
    __shared__ int xo[BT]; /* each token's input row, in elements of X (the launcher checks it fits) */
    int e, n, base, t0;
    if (!cu_tile_of(so, blockIdx.y, BT, T, e, t0, n, base)) return;
    /* the tile's n-tiles of 8 tokens that hold any: the rest skip their loads and mma (an expert
     * with 17-32 tokens is one 32-token tile, one pass over its weights, not two) */
    const int nj = min(BT / 8, (n - t0 + 7) >> 3);
    /* (WG: all 64 tokens' products, those past the tile's nj n-tiles from whatever the stage holds,
     * never written) */
    if (WG) gt_body<BT, DUAL, SBT, XP, BT / 8, WG>(G, Xv, ldx, so, xdiv, sbb, ns, e, n, base, t0, nj, gt_sm, xo);
    else if (XP && BT == 32 && nj <= 2 && njv) gt_body<BT, DUAL, SBT, XP, 2, 0>(G, Xv, ldx, so, xdiv, sbb, ns, e, n, base, t0, nj, gt_sm, xo);
    else if (XP && BT == 32 && nj == 3 && njv > 1) gt_body<BT, DUAL, SBT, XP, 3, 0>(G, Xv, ldx, so, xdiv, sbb, ns, e, n, base, t0, nj, gt_sm, xo);
    else if (XP && BT == 64 && nj <= 4 && njv > 1) gt_body<BT, DUAL, SBT, XP, 4, 0>(G, Xv, ldx, so, xdiv, sbb, ns, e, n, base, t0, nj, gt_sm, xo);
    else gt_body<BT, DUAL, SBT, XP, BT / 8, 0>(G, Xv, ldx, so, xdiv, sbb, ns, e, n, base, t0, nj, gt_sm, xo);
}

/* X [T][ldx] fp32 -> Y [T][C] packed (gt_xp_pos), a thread a chunk of 8 */
__global__ void k_xp_pack(const float *__restrict__ X, int ldx, int T, int C, uint4 *__restrict__ Y) {
    CU_PDL();
    const int cpr = C / 8;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)T * cpr) return;
    const int t = (int)(i / cpr), cc = (int)(i % cpr);
    const float *x = X + (size_t)t * ldx + xp_chunk_col(cc);
    Y[i] = xp_chunk(*(const float4 *)x, *(const float4 *)(x + 4));
}

void cu_xp_pack(cudaStream_t s, const float *X, int ldx, int T, int C, uint16_t *xp) {
    LILY_ASSERT(C % 128 == 0 && ldx % 4 == 0 && !((uintptr_t)X & 15) && !((uintptr_t)xp & 15)); /* (16-byte loads and stores) */
    const long long nc = (long long)T * (C / 8);
    cu_go(k_xp_pack, (unsigned)((nc + 255) / 256), 256, 0, s)(X, ldx, T, C, (uint4 *)xp);
}

int cu_gemm_tc_ok(const dmat *W, const float *X, int ldx, long long xrows) {
    static int on = -1;
    if (!cu_env_flag(&on, "LILY_CU_GEMM_TC", 1)) return 0;
    if (W->type != LW_Q || W->bits != 4 || !W->sexp || W->cols % GT_K || !(W->group == 32 || W->group == 64 || W->group == 128)) return 0;
    const int sbb = gt_sbb(W);
    /* a row's scales for a step are one copy of sbb bytes: aligned to sbb */
    return (sbb == 4 || sbb == 8 || sbb == 16) && xrows * ldx < (1ll << 31) && ldx % 4 == 0 && ((uintptr_t)X & 15) == 0 &&
           ((uintptr_t)W->w & 15) == 0 && W->ew % 16 == 0 && (uintptr_t)W->s % sbb == 0 && (uintptr_t)W->b % sbb == 0 &&
           W->es % sbb == 0;
}

static int wg_force = -1, wg_launches = 0;
void cu_gemm_wg_test(int on) { wg_force = on; }
int cu_gemm_wg_launches(void) { return wg_launches; }

/* May the dense packed-input 64-token launches take wgmma? Only where the device code has it (the
 * build's CUDA_ARCH is sm_90a, LILY_CU_ARCH_A; or the emulator) on a 9.x device. */
int cu_gemm_wg_available(void) {
#if defined(__CUDACC_EMU__)
    const int can = 1;
#elif defined(LILY_CU_ARCH_A)
    static int can = -1;
    if (can < 0) {
        int dev = 0, major = 0;
        can = cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
              major == 9;
        cudaGetLastError();
    }
#else
    const int can = 0;
#endif
    return can;
}
/* 0 off, 1 or 2 the form (LILY_CU_GEMM_WG=0/1/2, default 1; the kernel test's cu_gemm_wg_test) */
static int gt_wg_on(void) {
    static int env = INT_MIN;
    const int v = wg_force >= 0 ? wg_force : cu_env_int(&env, "LILY_CU_GEMM_WG", 1);
    return cu_gemm_wg_available() && (v == 1 || v == 2) ? v : 0;
}

template <int BT, int DUAL, int SBT, int XP, int WG = 0>
static void gt_launch(cudaStream_t s, const gt_group *G, const void *X, int ldx, int T, const dsort *so, int xdiv, dim3 grid) {
    LILY_ASSERT(grid.z == 1 || !DUAL);
    const int wg = !WG && BT == 64 && !DUAL && XP == 1 ? gt_wg_on() : 0;
    if (wg) {
        if (wg == 2) gt_launch<64, 0, SBT, 1, 2>(s, G, X, ldx, T, so, xdiv, grid);
        else gt_launch<64, 0, SBT, 1, 1>(s, G, X, ldx, T, so, xdiv, grid);
        wg_launches++;
        return;
    }
    const int sbb = gt_sbb(&G->m[0]), ns = gt_ns(so->count != NULL);
    /* the scales once a block (gt_group.sbup) where a block's steps are whole 16-byte copies of every
     * row's and they take at most 32 KB; LILY_CU_GT_SBUP=0: a step's with each stage, for measuring */
    gt_group g = *G;
    static int sbup_on = -1;
    const int nkt = G->m[0].cols / GT_K, z = (int)grid.z;
    g.sbup = cu_env_flag(&sbup_on, "LILY_CU_GT_SBUP", 1) && nkt % z == 0 ? nkt / z * sbb : 0;
    if (g.sbup % 16 || (nkt * sbb) % 16 || 2 * 128 * g.sbup > 32768) g.sbup = 0;
    for (int i = 0; i < (DUAL ? 2 : G->n); i++)
        if (((uintptr_t)G->m[i].s & 15) || ((uintptr_t)G->m[i].b & 15) || G->m[i].es % 16) g.sbup = 0;
    /* WG: the step's inputs rewritten for wgmma, 64 tokens x 256 bytes, after the stages */
    const size_t smem = ns * gt_stage_bytes(BT, g.sbup ? 0 : sbb, XP) + (XP ? 0 : (size_t)BT * 256) + (WG ? (size_t)64 * 256 : 0) +
                        (size_t)2 * 128 * g.sbup;
    static size_t opted = 0; /* the most shared memory this kernel has asked for (a refusal fails the launch) */
    if (smem > opted &&
        cudaFuncSetAttribute(k_gemm_tc<BT, DUAL, SBT, XP, WG>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess)
        opted = smem;
    /* LILY_CU_GT_NJ (measuring): 0 one loop for every tile (n-tiles predicated), 1 the two-n-tile
     * loop for 32-token tiles of up to 16 tokens, 2 also three n-tiles and 64-token tiles' four */
    static int env = INT_MIN;
    const int njv = cu_env_int(&env, "LILY_CU_GT_NJ", 2);
    cu_go(k_gemm_tc<BT, DUAL, SBT, XP, WG>, grid, GT_THREADS, smem, s)(g, X, ldx, T, *so, xdiv, sbb, ns, njv);
}

template <int DUAL, int XP>
static void gt_launch_bt(cudaStream_t s, int bt, const gt_group *G, const void *X, int ldx, int T, const dsort *so, int xdiv,
                         dim3 grid) {
    const int bf = G->m[0].sbt == LW_BF16;
    if (bt == 16) (bf ? gt_launch<16, DUAL, LW_BF16, XP> : gt_launch<16, DUAL, -1, XP>)(s, G, X, ldx, T, so, xdiv, grid);
    else if (bt == 32) (bf ? gt_launch<32, DUAL, LW_BF16, XP> : gt_launch<32, DUAL, -1, XP>)(s, G, X, ldx, T, so, xdiv, grid);
    else (bf ? gt_launch<64, DUAL, LW_BF16, XP> : gt_launch<64, DUAL, -1, XP>)(s, G, X, ldx, T, so, xdiv, grid);
}

/* n matrices (or, DUAL, one gate/up pair) over T rows of X: the widest token tile that still
 * gives every SM a block (wider tiles read each input for fewer row blocks, but few rows need
 * narrow ones to fill the GPU). xp (fp16, T x cols) not NULL: X packed there first (XP), so a
 * 64-token tile's block holds half the shared memory and three fit an SM, not two. */
/* Y2 not NULL: where a launch would leave SMs with fewer than three blocks, it splits each row's
 * columns in two (grid z), the first half's sums into Y, the second's into Y2 (their sum is the
 * product; the caller adds them, as k_rmsnorm's add2 does): the out-projections at 512 tokens
 * (2,048 rows: 16 row blocks of 16 token tiles, ~2 blocks an SM) were latency-bound at 40% issue.
 * Returns the parts written (1 or 2). LILY_CU_GT_SPLIT=0: never split, for measuring. */
static int gt_dense(cudaStream_t s, int n, const dmat *const *W, int dual, const float *X, int ldx, int T, float *const *Y,
                    float *const *Y2, const int *ldy, uint16_t *xp, int xp_in) {
    gt_group G;
    memset(&G, 0, sizeof G);
    const int rb = dual ? 64 : 128;
    G.n = dual ? 1 : n;
    for (int i = 0; i < n; i++) G.m[i] = *W[i];
    for (int i = 0; i < G.n; i++) {
        G.y[i] = Y[i];
        G.ldy[i] = ldy[i];
        G.blk0[i + 1] = G.blk0[i] + (W[i]->rows + rb - 1) / rb;
    }
    const int gx = G.blk0[G.n], sms = cu_sm_count();
    static int env = INT_MIN; /* LILY_CU_GT_BT=16/32/64 fixes the token tile, for measuring */
    const int v = cu_env_int(&env, "LILY_CU_GT_BT", 0);
    static int spl = -1;
    const int can_split = Y2 && !dual && W[0]->cols / GT_K >= 2 && cu_env_flag(&spl, "LILY_CU_GT_SPLIT", 1);
    /* On wgmma (64-token tiles only) a launch that splits in K counts both halves' blocks: the
     * out-projections at 512 tokens (16 row blocks x 8 tiles x 2) then take it, pp512 +2-7% on the H200
     * (session 17, as LILY_CU_GT_BT=64) against 32-token mma.sync tiles. */
    const int wg64 = xp && !dual && gt_wg_on() ? (can_split ? 2 : 1) : 1;
    const int bt = v == 16 || v == 32 || v == 64 ? v : wg_force > 0 && xp ? 64 /* (the kernel test's wgmma runs) */
                   : (long long)gx * ((T + 63) / 64) * wg64 >= sms ? 64 : (long long)gx * ((T + 31) / 32) >= sms ? 32 : 16;
    dsort none = { NULL, NULL, NULL, NULL, NULL };
    const int ty = (T + bt - 1) / bt, parts = can_split && (long long)gx * ty < 3ll * sms ? 2 : 1;
    if (parts == 2)
        for (int i = 0; i < G.n; i++) G.y2[i] = Y2[i];
    const dim3 grid(gx, ty, parts);
    if (xp) {
        const int C = W[0]->cols;
        if (!xp_in) cu_xp_pack(s, X, ldx, T, C, xp);
        if (dual) gt_launch_bt<1, 1>(s, bt, &G, xp, C, T, &none, 0, grid);
        else gt_launch_bt<0, 1>(s, bt, &G, xp, C, T, &none, 0, grid);
    } else if (dual) gt_launch_bt<1, 0>(s, bt, &G, X, ldx, T, &none, 0, grid);
    else gt_launch_bt<0, 0>(s, bt, &G, X, ldx, T, &none, 0, grid);
    return parts;
}

/* the packed input for a dense launch of these columns: xp itself, or NULL (then fp32 inputs)
 * where none is given, it is not 16-byte aligned, or LILY_CU_DENSE_XP=0 (for measuring) */
static uint16_t *gt_xp(uint16_t *xp, int T, int cols) {
    static int on = -1;
    return xp && !((uintptr_t)xp & 15) && (long long)T * cols < (1ll << 31) && cu_env_flag(&on, "LILY_CU_DENSE_XP", 1) ? xp : NULL;
}

void cu_gemm_tc(cudaStream_t s, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy) {
    gt_dense(s, 1, &W, 0, X, ldx, T, &Y, NULL, &ldy, NULL, 0);
}

int cu_gemm_tc_xp(cudaStream_t s, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy, uint16_t *xp) {
    return cu_gemm_tc_xp2(s, W, X, ldx, T, Y, NULL, ldy, xp, 0);
}

int cu_gemm_tc_xp2(cudaStream_t s, const dmat *W, const float *X, int ldx, int T, float *Y, float *Y2, int ldy, uint16_t *xp, int xp_in) {
    if (T <= 8 || !cu_gemm_q4_enabled() || !cu_gemm_tc_ok(W, X, ldx, T)) return 0;
    return gt_dense(s, 1, &W, 0, X, ldx, T, &Y, Y2 ? &Y2 : NULL, &ldy, gt_xp(xp, T, W->cols), xp_in);
}

int cu_gemm_tc_group(cudaStream_t s, int n, const dmat *const *W, const float *X, int ldx, int T, float *const *Y, uint16_t *xp,
                     int xp_in) {
    if (n < 1 || n > GT_MAX || T <= 8 || !cu_gemm_q4_enabled()) return 0;
    int ld[GT_MAX];
    for (int i = 0; i < n; i++) {
        if (!cu_gemm_tc_ok(W[i], X, ldx, T) || W[i]->cols != W[0]->cols || W[i]->group != W[0]->group || W[i]->sbt != W[0]->sbt)
            return 0;
        ld[i] = W[i]->rows;
    }
    gt_dense(s, n, W, 0, X, ldx, T, Y, NULL, ld, gt_xp(xp, T, W[0]->cols), xp_in);
    return 1;
}

void cu_gemm_tc_grouped(cudaStream_t s, const dmat *W, const dmat *W2, const dsort *so, int bt, int max_tiles, int xdiv,
                        const float *X, int ldx, float *Y, int ldy) {
    gt_group G;
    memset(&G, 0, sizeof G);
    G.n = 1;
    G.m[0] = *W;
    G.m[1] = W2 ? *W2 : *W;
    G.y[0] = Y;
    G.ldy[0] = ldy;
    G.blk0[1] = (W->rows + (W2 ? 63 : 127)) / (W2 ? 64 : 128);
    const dim3 grid(G.blk0[1], max_tiles);
    if (W2) gt_launch_bt<1, 0>(s, bt, &G, X, ldx, 0, so, xdiv, grid);
    else gt_launch_bt<0, 0>(s, bt, &G, X, ldx, 0, so, xdiv, grid);
}

static int gt_pair_ok(const dmat *G, const dmat *U, const float *X, int ldx, long long xrows) {
    return cu_gemm_tc_ok(G, X, ldx, xrows) && cu_gemm_tc_ok(U, X, ldx, xrows) && G->rows == U->rows && G->cols == U->cols &&
           G->group == U->group && G->sbt == U->sbt && G->ew == U->ew && G->es == U->es;
}

int cu_gemm_swiglu(cudaStream_t s, const dmat *G, const dmat *U, const float *X, int ldx, int T, float *Y, int ldy, uint16_t *xp,
                   int xp_in) {
    if (T <= 8 || !cu_gemm_q4_enabled() || !gt_pair_ok(G, U, X, ldx, T)) return 0;
    const dmat *W[2] = { G, U };
    gt_dense(s, 2, W, 1, X, ldx, T, &Y, NULL, &ldy, gt_xp(xp, T, G->cols), xp_in);
    return 1;
}

int cu_gemm_swiglu_grouped(cudaStream_t s, const dmat *G, const dmat *U, const dsort *so, int bt, int max_tiles, int xdiv,
                           const float *X, int ldx, float *Y, int ldy) {
    if (!gt_pair_ok(G, U, X, ldx, (long long)max_tiles * bt)) return 0;
    cu_gemm_tc_grouped(s, G, U, so, bt, max_tiles, xdiv, X, ldx, Y, ldy);
    return 1;
}

/* The experts' FFN at prefill over the (expert, tile) map in two launches (cu_common.h):
 * cu_moe_gate_up_xp packs X into xpx and writes silu(gate) * up packed into xph; 0 when the
 * kernel does not take the three matrices, and then neither launch is made. */
int cu_moe_gate_up_xp(cudaStream_t s, const dmat *G, const dmat *U, const dmat *D, const dsort *so, int bt, int max_tiles,
                      int xdiv, const float *X, int ldx, int xrows, uint16_t *xpx, uint16_t *xph, int xp_in) {
    static int on = -1; /* LILY_CU_MOE_XP=0: the fp32-input launches (cu_gemm_swiglu_grouped), for measuring */
    const long long slots = (long long)max_tiles * bt;
    if (!cu_env_flag(&on, "LILY_CU_MOE_XP", 1) || !gt_pair_ok(G, U, X, ldx, xrows) || !cu_gemm_tc_ok(D, X, ldx, xrows) || D->cols != G->rows ||
        (long long)xrows * G->cols >= (1ll << 31) || slots * D->cols >= (1ll << 31) || ((uintptr_t)xpx & 15) || ((uintptr_t)xph & 15))
        return 0;
    const int C = G->cols;
    if (!xp_in) cu_xp_pack(s, X, ldx, xrows, C, xpx);
    gt_group g;
    memset(&g, 0, sizeof g);
    g.n = 1;
    g.m[0] = *G;
    g.m[1] = *U;
    g.y[0] = xph;
    g.ldy[0] = G->rows;
    g.blk0[1] = (G->rows + 63) / 64;
    gt_launch_bt<1, 2>(s, bt, &g, xpx, C, 0, so, xdiv, dim3(g.blk0[1], max_tiles));
    return 1;
}

void cu_moe_down_xp(cudaStream_t s, const dmat *D, const dsort *so, int bt, int max_tiles, const uint16_t *xph, float *Y, int ldy) {
    gt_group g;
    memset(&g, 0, sizeof g);
    g.n = 1;
    g.m[0] = g.m[1] = *D;
    g.y[0] = Y;
    g.ldy[0] = ldy;
    g.blk0[1] = (D->rows + 127) / 128;
    gt_launch_bt<0, 1>(s, bt, &g, xph, D->cols, 0, so, 0, dim3(g.blk0[1], max_tiles));
}
