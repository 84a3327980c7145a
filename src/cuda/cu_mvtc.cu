/* Decode's matrix-vector products for 4-bit codes on the tensor cores (k_mvtc).
 *
 * Why: the float kernel (k_mvq4) spends about three instructions a weight (unpack, convert,
 * multiply-add) and Nsight measured it bound by instruction issue at a third of the H200's
 * bandwidth. Here a lane turns a word of eight codes into four fp16 pairs with one shift, four
 * and-ors and four half subtractions, and one mma.sync multiplies 256 codes: about one
 * instruction a weight (Nsight: 2.9x fewer than k_mvq4 on the lm_head). It takes the launches
 * where it measured faster in the decode graph (LILY_CU_MVTC_MIN below); the rest stay on k_mvq4.
 *
 * Exactness: the codes are small integers, exact in fp16. The input is scaled by a power of two a
 * 64-column unit (so that the unit's largest element sits just under 2^15) and split into two fp16
 * terms, hi = rn(x')
 * and lo = rn(x' - hi), 22 of fp32's 24 bits; products are exact in the fp32 accumulators. The
 * group scale and bias are applied in fp32 per 64 columns, as the float kernel does.
 * LILY_CU_MVTC=0 turns the kernel off (k_mvq4 instead).
 *
 * Layout of the work: a warp owns a tile of 16 weight rows, the mma's M; its lane t (g = t / 4,
 * q = t % 4) loads rows g and g + 8 of 64-column units: in half h of a 512-column step, unit 4h + q
 * of the step's eight (so a quad reads 128 contiguous bytes a row). The mma's K runs over the
 * quad's lanes, so its sum would mix four lanes' units; instead each lane supplies its input only
 * in the B column n = 2q + h of its own unit, and zeros in the others, and C[row][n] comes out as
 * that unit's own dot product, in the lane that owns it. Warps of a block split a tile's steps
 * (KS of them) and add their partial rows in a fixed order. */
#include "cuda/cu_dev.h"
#include <string.h>

#define TC_WARPS 8
/* blocks an SM holds: 3, 80 registers a thread (4, 64 registers with spills, measured 2% slower) */
#ifndef TC_MINB
#define TC_MINB 3
#endif

/* Two codes as an fp16 pair: those under mask (bits 0-3 or 4-7 of each half) put under the
 * exponent of 1024 (0x6400) read 1024 + q 2^s, exactly; subtracting 1024 leaves q 2^s. */
__device__ __forceinline__ uint32_t tc_nib(uint32_t w, uint32_t mask) {
    const uint32_t k1024 = 0x64006400u; /* (1024, 1024) as bits: no conversion a call */
    uint32_t v = cu_and_or(w, mask, k1024);
    __half2 h, k;
    memcpy(&h, &v, 4);
    memcpy(&k, &k1024, 4);
    h = __hsub2(h, k);
    memcpy(&v, &h, 4);
    return v;
}

__device__ __forceinline__ float tc_in(const float *x, const float *x2, int i) { return x2 ? silu_f(x[i]) * x2[i] : x[i]; }

/* The block's input (silu(x) * x2 when x2) as two fp16 terms, into xw: word (u, i) (columns
 * 64u + 8i .. +7) at xw[u * 16 + i], its low term 8 words later, its halves in the order the
 * codes come out of a word, k0 k4 | k1 k5 | k2 k6 | k3 k7, the odd pairs times 1/16 (their codes
 * read 16 q). Each 64-column unit is scaled by its own power of two 2^sh, so that its largest
 * element lands in [2^14, 2^15): found by the unit's 8 lanes with shuffles, no block-wide
 * reduction, one read of the input and one barrier. us[u] = (the unit's input sum, unscaled,
 * fp32; 2^-sh). */
__device__ void tc_stage(const float *x, const float *x2, int cols, uint4 *xw, float2 *us) {
    const int nw = cols / 8;
    for (int w0 = 0; w0 < nw; w0 += blockDim.x) { /* (a unit's 8 words in 8 lanes of one warp) */
        const int w = w0 + threadIdx.x;
        float v[8], s = 0.f, m = 0.f;
        if (w < nw)
            for (int j = 0; j < 8; j++) {
                v[j] = tc_in(x, x2, 8 * w + j);
                s += v[j];
                m = fmaxf(m, fabsf(v[j]));
            }
        for (int o = 1; o < 8; o <<= 1) {
            s += __shfl_xor_sync(0xffffffffu, s, o);
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        }
        int ex = 0;
        if (m > 0.f && m <= 3.0e38f) frexpf(m, &ex); /* m < 2^ex */
        const int sh = min(max(15 - ex, -100), 100);
        const float sc = ldexpf(1.0f, sh);
        if (w < nw) {
            uint32_t hi[4], lo[4];
            for (int j = 0; j < 4; j++) {
                const float f = j & 1 ? 0.0625f * sc : sc;
                uint32_t hv[2], lv[2];
                for (int e = 0; e < 2; e++) {
                    const float t = v[j + 4 * e] * f; /* pair j: k_j and k_{j+4} */
                    const __half h = __float2half_rn(t);
                    hv[e] = __half_as_ushort(h);
                    lv[e] = __half_as_ushort(__float2half_rn(t - __half2float(h)));
                }
                hi[j] = hv[0] | hv[1] << 16;
                lo[j] = lv[0] | lv[1] << 16;
            }
            uint4 *p = xw + (size_t)(w / 8) * 16 + w % 8;
            p[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            p[8] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
            if (w % 8 == 0) us[w / 8] = make_float2(s, ldexpf(1.0f, -sh));
        }
    }
    __syncthreads();
}


/* A lane's rows of a tile (g and g + 8; the last row for rows past the matrix): codes, scales, biases. */
struct tc_rows {
    const uint4 *wa, *wb;
    const char *sa, *sb, *ba, *bb;
    int lg, rows, row;
};
template <int SBT>
__device__ __forceinline__ tc_rows tc_locate(const mvq_args &a, bool xsl, int e, int tile, int &mi, int g, int cols) {
    while (mi + 1 < a.n && tile >= a.blk0[mi + 1]) mi++;
    const dmat &m = xsl ? a.f.xm[mi] : a.m[mi];
    tc_rows t;
    t.rows = m.rows;
    t.row = (tile - a.blk0[mi]) * 16 + g;
    t.lg = __ffs(m.group / 64) - 1;
    const int ra = min(t.row, m.rows - 1), rb = min(t.row + 8, m.rows - 1), ngr = cols / m.group;
    const size_t sz = (SBT >= 0 ? SBT : m.sbt) == LW_F32 ? 4 : 2;
    const uint4 *w = (const uint4 *)((const char *)m.w + (long long)e * m.ew);
    t.wa = w + (size_t)ra * (cols / 32);
    t.wb = w + (size_t)rb * (cols / 32);
    const char *s = (const char *)m.s + (long long)e * m.es, *b = (const char *)m.b + (long long)e * m.es;
    t.sa = s + (size_t)ra * ngr * sz; t.sb = s + (size_t)rb * ngr * sz;
    t.ba = b + (size_t)ra * ngr * sz; t.bb = b + (size_t)rb * ngr * sz;
    return t;
}
/* What a lane reads for one unit: its codes in both rows, and their scales and biases (fetched
 * together, so one memory round trip a unit). A unit at a time keeps the kernel at 80 registers
 * (3 blocks an SM): a whole step's two units (114-120 registers, 2 blocks) left too few warps to
 * keep loads in flight (bench/RESULTS.md). */
struct tc_unit {
    uint4 ca[2], cb[2];
    float sa, sb, ba, bb;
};
template <int SBT>
__device__ __forceinline__ void tc_fetch(const tc_rows &t, int sbt, int u, int nun, tc_unit &d) {
    if (u < nun) {
        d.ca[0] = __ldg(t.wa + 2 * u); d.ca[1] = __ldg(t.wa + 2 * u + 1);
        d.cb[0] = __ldg(t.wb + 2 * u); d.cb[1] = __ldg(t.wb + 2 * u + 1);
        const int gi = u >> t.lg;
        d.sa = mvq_sb<SBT>(t.sa, sbt, gi); d.sb = mvq_sb<SBT>(t.sb, sbt, gi);
        d.ba = mvq_sb<SBT>(t.ba, sbt, gi); d.bb = mvq_sb<SBT>(t.bb, sbt, gi);
    } else {
        d.ca[0] = d.ca[1] = d.cb[0] = d.cb[1] = make_uint4(0, 0, 0, 0);
        d.sa = d.sb = d.ba = d.bb = 0.f;
    }
}

/* a.blk0: 16-row tiles; the matrices' groups are 64 2^k columns; ksl: log2 of the warps a tile */
template <int SBT>
__global__ void __launch_bounds__(TC_WARPS * WARP, TC_MINB) k_mvtc(mvq_args a, const float *__restrict__ X, const float *__restrict__ X2,
                                                            int ldx, const int *eidx, int xdiv, int ksl) {
    extern __shared__ uint4 tcs[]; /* [8] zeros, [cols / 8 * 2] the staged input, [cols / 64] float2: unit sums and scales */
    __shared__ float part[TC_WARPS][16];
    const int cols = a.m[0].cols, nun = cols / 64, nsteps = (nun + 7) / 8, ntiles = a.blk0[a.n];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, g = lane / 4, q = lane % 4;
    const int KS = 1 << ksl, tpi = TC_WARPS >> ksl, wt = warp >> ksl, wk = warp & (KS - 1), slot = blockIdx.y;
    const bool xsl = a.f.xslot && slot >= a.f.xslot;
    int mi = 0, e = 0;
    tc_unit cur;
    /* a dense matrix's first unit is fetched before the wait on the predecessor (weights are never
     * written), so its latency overlaps that kernel's end and the staging; an expert's index comes
     * from that kernel */
    bool have = false;
    if (!eidx && (int)blockIdx.x * tpi + wt < ntiles && wk < nsteps) {
        int m0 = 0;
        const tc_rows t = tc_locate<SBT>(a, xsl, 0, (int)blockIdx.x * tpi + wt, m0, g, cols);
        tc_fetch<SBT>(t, SBT >= 0 ? SBT : (xsl ? a.f.xm[m0] : a.m[m0]).sbt, 8 * wk + q, nun, cur);
        have = true;
    }
    CU_PDL();
    const float *x = X, *x2 = X2;
    if (eidx) e = mvq_slot_input(a, X, X2, ldx, eidx, xdiv, xsl, slot, x, x2);
    uint4 *xw = tcs + 8;
    float2 *us = (float2 *)(xw + (size_t)(cols / 8) * 2);
    if (threadIdx.x < 8) tcs[threadIdx.x] = make_uint4(0, 0, 0, 0);
    tc_stage(x, X2 ? x2 : NULL, cols, xw, us);
    for (int t0 = blockIdx.x * tpi; t0 < ntiles; t0 += gridDim.x * tpi) { /* (the same trips for the block's warps) */
        const int tile = t0 + wt;
        float oa = 0.f, ob = 0.f;
        tc_rows t;
        t.rows = t.row = 0;
        if (tile < ntiles) {
            t = tc_locate<SBT>(a, xsl, e, tile, mi, g, cols);
            const int sbt = SBT >= 0 ? SBT : (xsl ? a.f.xm[mi] : a.m[mi]).sbt;
            float fa = 0.f, fb = 0.f, ga = 0.f, gb = 0.f; /* rows g and g + 8: scale terms, bias terms */
            for (int s = wk; s < nsteps; s += KS)
#pragma unroll 1
                for (int h = 0; h < 2; h++) {
                    const int u = 8 * s + 4 * h + q; /* (the quad's four units side by side: whole 128-byte lines a row) */
                    if (!have) tc_fetch<SBT>(t, sbt, u, nun, cur);
                    have = false;
                    /* B: this lane's input in its own column n = g only where that column is this unit
                     * of its quad-lane (g = 2q + h), zeros in the other lanes, so column 2q + h of C is
                     * this unit's dot product; the hi and lo input terms accumulate apart (two chains) */
                    const bool mine = g == 2 * q + h && u < nun;
                    const uint4 *xb = mine ? xw + (size_t)u * 16 : tcs;
                    const int lo = mine ? 8 : 0;
                    float c[2][4] = { { 0.f, 0.f, 0.f, 0.f }, { 0.f, 0.f, 0.f, 0.f } };
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        const uint32_t pa = cu_word(cur.ca[i / 4], i % 4), pb = cu_word(cur.cb[i / 4], i % 4);
                        const uint32_t qa = pa >> 8, qb = pb >> 8;
                        const uint32_t a0 = tc_nib(pa, 0x000F000Fu), a1 = tc_nib(pb, 0x000F000Fu);
                        const uint32_t a2 = tc_nib(pa, 0x00F000F0u), a3 = tc_nib(pb, 0x00F000F0u);
                        const uint32_t a4 = tc_nib(qa, 0x000F000Fu), a5 = tc_nib(qb, 0x000F000Fu);
                        const uint32_t a6 = tc_nib(qa, 0x00F000F0u), a7 = tc_nib(qb, 0x00F000F0u);
                        const uint4 xv = xb[i];
                        tc_mma(c[0], a0, a1, a2, a3, xv.x, xv.y);
                        tc_mma(c[0], a4, a5, a6, a7, xv.z, xv.w);
                        const uint4 xl = xb[i + lo];
                        tc_mma(c[1], a0, a1, a2, a3, xl.x, xl.y);
                        tc_mma(c[1], a4, a5, a6, a7, xl.z, xl.w);
                    }
                    /* column 2q + h: c[.][h] row g, c[.][2 + h] row g + 8 */
                    const float da = c[0][h] + c[1][h], db = c[0][2 + h] + c[1][2 + h];
                    const float2 su = u < nun ? us[u] : make_float2(0.f, 0.f);
                    fa += cur.sa * (da * su.y);
                    fb += cur.sb * (db * su.y);
                    ga += cur.ba * su.x;
                    gb += cur.bb * su.x;
                }
            oa = fa + ga;
            ob = fb + gb;
        }
        /* the quad's lanes hold the row's sums over their own units */
        oa += __shfl_xor_sync(0xffffffffu, oa, 1);
        oa += __shfl_xor_sync(0xffffffffu, oa, 2);
        ob += __shfl_xor_sync(0xffffffffu, ob, 1);
        ob += __shfl_xor_sync(0xffffffffu, ob, 2);
        float *y = tile < ntiles ? a.y[mi] + (eidx ? (size_t)slot * a.ldy[mi] : 0) : NULL;
        if (KS > 1) {
            if (q == 0) { part[warp][g] = oa; part[warp][g + 8] = ob; }
            __syncthreads();
            if (wk == 0 && y && lane < 16) {
                float o = 0.f;
                for (int j = 0; j < KS; j++) o += part[warp + j][lane];
                const int r = t.row - g + lane;
                if (r < t.rows) y[r] = o;
            }
            __syncthreads();
        } else if (y && q == 0) {
            if (t.row < t.rows) y[t.row] = oa;
            if (t.row + 8 < t.rows) y[t.row + 8] = ob;
        }
    }
}

/* LILY_CU_MVTC=0: k_mvq4 for every launch, for measuring */
static int mvtc_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_MVTC", 1);
}

static int tc_fits(const dmat *m, int cols) {
    const int u = m->group / 64;
    return m->type == LW_Q && m->bits == 4 && m->cols == cols && cols % 64 == 0 && m->group % 64 == 0 && (u & (u - 1)) == 0;
}

template <int SBT>
static void mvtc_launch(cudaStream_t s, const mvq_args &a, int groups, int nslots, int ksl, const float *X, const float *X2,
                        int ldx, const int *eidx, int xdiv) {
    static mvq_kstate ks;
    const int cols = a.m[0].cols;
    const size_t sm = (size_t)(8 + cols / 8 * 2) * 16 + (size_t)(cols / 64) * 8;
    const int gx = mvq_grid(k_mvtc<SBT>, ks, groups, nslots, 0, TC_WARPS * WARP, sm);
    cu_go(k_mvtc<SBT>, dim3(gx, nslots), TC_WARPS * WARP, sm, s)(a, X, X2, ldx, eidx, xdiv, ksl);
}

int cu_mvtc_group(cudaStream_t s, const mvq_args *in, int sbt, const float *X, const float *X2, int ldx, const int *eidx,
                  int xdiv, int nslots) {
    const int cols = in->m[0].cols;
    if (!mvtc_enabled() || in->f.nw || in->f.sel || (!eidx && nslots > 1)) return 0; /* (a dense launch: one row) */
    /* The fewest weights (a slot's matrices together) a launch needs to be taken: on the H200,
     * under Nsight, this kernel is as fast as k_mvq4 or faster on every decode launch, but in the
     * decode graph tg128 was best with it on the lm_head and the two in-projections only (16M:
     * 380.4 tok/s; all: 371.0; lm_head alone: 377.3; k_mvq4 alone: 370.4; bench/RESULTS.md).
     * LILY_CU_MVTC_MIN overrides (0: every launch it can take, as the kernel tests run it). */
    static long long min_w = -1;
    if (min_w < 0) {
        const char *e = getenv("LILY_CU_MVTC_MIN");
        min_w = e && *e ? atoll(e) : 16ll << 20;
        if (min_w < 0) min_w = 0;
    }
    long long nw = 0;
    for (int i = 0; i < in->n; i++) nw += (long long)in->m[i].rows * cols;
    if (nw < min_w) return 0;
    mvq_args a = *in;
    for (int i = 0; i < a.n; i++) /* (the extra slot's matrices walk the routed ones' tiles) */
        if (!tc_fits(&a.m[i], cols) || (a.f.xslot && (!tc_fits(&a.f.xm[i], cols) || a.f.xm[i].rows != a.m[i].rows))) return 0;
    const int nt = mvq_tiles(&a, 16);
    /* warps a tile: its 512-column steps, up to the block's 8 warps */
    const int nsteps = (cols / 64 + 7) / 8;
    int ksl = 0;
    while (ksl < 3 && (2 << ksl) <= nsteps) ksl++;
    const int groups = (nt + (TC_WARPS >> ksl) - 1) / (TC_WARPS >> ksl);
    /* (one fp16 term of input instead of two measured 2-4% faster over a token, 1e-4-1e-3 less exact) */
    if (sbt == LW_BF16) mvtc_launch<LW_BF16>(s, a, groups, nslots, ksl, X, X2, ldx, eidx, xdiv);
    else mvtc_launch<-1>(s, a, groups, nslots, ksl, X, X2, ldx, eidx, xdiv);
    return 1;
}
