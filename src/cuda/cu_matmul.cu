/* The float matrix products (prefill's fallbacks and the exact router): one warp a weight row for
 * a few inputs (k_mv), 64 x 64 tiles on TF32 wmma or SIMT, a few rows for many tokens, the split
 * TF32 exact form, and their launchers (declared in cu_common.h). */
#include "cuda/cu_common.h"
#include "cuda/cu_dev.h"
#include "cuda/cu_kern.h"
#include <limits.h>
#include <cuda_fp16.h>
#include <mma.h>
using namespace nvcuda;
#include <math.h>
#include <stdlib.h>

/* ---- matrix-vector: one warp per weight row, all T (<= NT) inputs at once ---- */
template <int NT>
__global__ void __launch_bounds__(256) k_mv(dmat m, const float *__restrict__ X, int ldx, int T, float *__restrict__ Y,
                                            int ldy, const int *eidx, int xdiv) {
    CU_PDL();
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int r = blockIdx.x * 8 + warp;
    if (r >= m.rows) return;
    int slot = blockIdx.y, e = 0;
    const float *x = X;
    float *y = Y;
    if (eidx) { /* slot mode: one input row per slot */
        e = eidx[slot];
        x = X + (size_t)(slot / xdiv) * ldx;
        y = Y + (size_t)slot * ldy;
        T = 1;
    }
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    int vec = (ldx % 4) == 0;
    for (int c = lane * 8; c < m.cols; c += WARP * 8) {
        float w8[8];
        load8(m, e, r, c, w8);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= T) break;
            const float *xp = x + (size_t)t * ldx + c;
            if (vec && c + 8 <= m.cols) {
                float4 a = *(const float4 *)xp, b = *(const float4 *)(xp + 4);
                acc[t] += w8[0] * a.x + w8[1] * a.y + w8[2] * a.z + w8[3] * a.w + w8[4] * b.x + w8[5] * b.y + w8[6] * b.z + w8[7] * b.w;
            } else {
                for (int j = 0; j < 8 && c + j < m.cols; j++) acc[t] += w8[j] * xp[j];
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= T) break;
        float v = warp_sum(acc[t]);
        if (lane == 0) y[(size_t)t * ldy + r] = v;
    }
}

/* ---- tiled: 64 inputs x 64 weight rows per block, 32 columns per step, on the tensor
 * cores in TF32 (fp32 accumulate): weights are dequantized into shared memory as fp32,
 * rounded to TF32 in the fragments. Eight warps, each 16 inputs x 32 rows. ---- */
#define TBM 64
#define TBN 64
#define TBK 32
#define TLD (TBK + 4)
__global__ void __launch_bounds__(256) k_mm_tiled(dmat m, const float *__restrict__ X, int ldx, int T,
                                                  float *__restrict__ Y, int ldy, dsort so, int xdiv) {
    CU_PDL();
    __shared__ __align__(32) float Ws[TBM * TLD];
    __shared__ __align__(32) float Xs[TBN * TLD];
    __shared__ __align__(32) float Cs[TBN * (TBM + 4)];
    int tid = threadIdx.x, warp = tid / WARP;
    int e = 0, n = T, base = 0;
    if (so.count) {
        e = blockIdx.z;
        n = so.count[e];
        base = so.off[e];
    }
    int r0 = blockIdx.x * TBM, t0 = blockIdx.y * TBN;
    if (t0 >= n) return;
    int lr = tid / 4, seg = (tid % 4) * 8, lt = tid / 4;
    const float *xrow = NULL;
    if (t0 + lt < n) {
        int srow = base + t0 + lt;
        int xr = so.count ? (xdiv ? so.src[srow] / xdiv : srow) : srow;
        xrow = X + (size_t)xr * ldx;
    }
    int wt = (warp / 2) * 16, wr = (warp % 2) * 32; /* this warp's inputs and rows within the tile */
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc[2];
    wmma::fill_fragment(acc[0], 0.0f);
    wmma::fill_fragment(acc[1], 0.0f);
    /* the next step's weights and inputs are loaded into registers while this step multiplies */
    float w8[8], x8[8];
    if (r0 + lr < m.rows && seg < m.cols) load8(m, e, r0 + lr, seg, w8);
    else for (int j = 0; j < 8; j++) w8[j] = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) x8[j] = (xrow && seg + j < m.cols) ? xrow[seg + j] : 0.f;
    for (int k0 = 0; k0 < m.cols; k0 += TBK) {
#pragma unroll
        for (int j = 0; j < 8; j++) Ws[lr * TLD + seg + j] = w8[j];
#pragma unroll
        for (int j = 0; j < 8; j++) Xs[lt * TLD + seg + j] = x8[j];
        __syncthreads();
        int k1 = k0 + TBK;
        if (k1 < m.cols) {
            if (r0 + lr < m.rows && k1 + seg < m.cols) load8(m, e, r0 + lr, k1 + seg, w8);
            else for (int j = 0; j < 8; j++) w8[j] = 0.f;
#pragma unroll
            for (int j = 0; j < 8; j++) x8[j] = (xrow && k1 + seg + j < m.cols) ? xrow[k1 + seg + j] : 0.f;
        }
#pragma unroll
        for (int kk = 0; kk < TBK; kk += 8) {
            wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
            wmma::load_matrix_sync(fa, Xs + wt * TLD + kk, TLD);
#pragma unroll
            for (int i = 0; i < fa.num_elements; i++) fa.x[i] = wmma::__float_to_tf32(fa.x[i]);
#pragma unroll
            for (int f = 0; f < 2; f++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> fb;
                wmma::load_matrix_sync(fb, Ws + (wr + 16 * f) * TLD + kk, TLD);
#pragma unroll
                for (int i = 0; i < fb.num_elements; i++) fb.x[i] = wmma::__float_to_tf32(fb.x[i]);
                wmma::mma_sync(acc[f], fa, fb, acc[f]);
            }
        }
        __syncthreads();
    }
    wmma::store_matrix_sync(Cs + wt * (TBM + 4) + wr, acc[0], TBM + 4, wmma::mem_row_major);
    wmma::store_matrix_sync(Cs + wt * (TBM + 4) + wr + 16, acc[1], TBM + 4, wmma::mem_row_major);
    __syncthreads();
    for (int i = tid; i < TBN * TBM; i += blockDim.x) {
        int t = i / TBM, r = i % TBM;
        if (t0 + t < n && r0 + r < m.rows) Y[(size_t)(base + t0 + t) * ldy + r0 + r] = Cs[t * (TBM + 4) + r];
    }
}

/* The same tile in plain fp32 FMA: exact to fp32, for small batches (the fixtures) and the
 * router. Split-K (kslice < cols, dense only): block z sums columns [z kslice, (z+1) kslice)
 * into its own partial, Y + z pstride, which k_sum_splits adds up in split order. */
__global__ void __launch_bounds__(256) k_mm_simt(dmat m, const float *__restrict__ X, int ldx, int T,
                                                  float *__restrict__ Y, int ldy, dsort so, int xdiv, int kslice,
                                                  size_t pstride) {
    CU_PDL();
    __shared__ float Ws[TBK][TBM + 4];
    __shared__ float Xs[TBK][TBN + 4];
    int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    int e = 0, n = T, base = 0;
    if (so.count) {
        e = blockIdx.z;
        n = so.count[e];
        base = so.off[e];
    }
    int r0 = blockIdx.x * TBM, t0 = blockIdx.y * TBN;
    if (t0 >= n) return;
    int kbeg = 0, kend = m.cols;
    if (!so.count && kslice < m.cols) {
        kbeg = blockIdx.z * kslice;
        kend = min(kbeg + kslice, m.cols);
        Y += (size_t)blockIdx.z * pstride;
    }
    /* this thread's loads: weight row lr, input row lt, columns seg..seg+7 */
    int lr = tid / 4, seg = (tid % 4) * 8;
    int lt = tid / 4;
    const float *xrow = NULL;
    if (t0 + lt < n) {
        int srow = base + t0 + lt;
        int xr = so.count ? (xdiv ? so.src[srow] / xdiv : srow) : srow;
        xrow = X + (size_t)xr * ldx;
    }
    float acc[4][4] = {};
    for (int k0 = kbeg; k0 < kend; k0 += TBK) {
        float w8[8];
        if (r0 + lr < m.rows && k0 + seg < kend) load8(m, e, r0 + lr, k0 + seg, w8);
        else for (int j = 0; j < 8; j++) w8[j] = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) Ws[seg + j][lr] = w8[j];
#pragma unroll
        for (int j = 0; j < 8; j++) Xs[seg + j][lt] = (xrow && k0 + seg + j < kend) ? xrow[k0 + seg + j] : 0.f;
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < TBK; k++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = Ws[k][tx + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; j++) b[j] = Xs[k][ty + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int t = t0 + ty + 16 * j;
        if (t >= n) continue;
        float *yr = Y + (size_t)(base + t) * ldy;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = r0 + tx + 16 * i;
            if (r < m.rows) yr[r] = acc[i][j];
        }
    }
}


static int mv4_ok(const dmat *W) { return cu_mvq_ok(W); }
static void mv4_launch(cudaStream_t s, const dmat *W, const float *X, int ldx, float *Y, int ldy, const int *eidx, int xdiv, int nslots) {
    const dmat *w[1] = { W };
    float *y[1] = { Y };
    int l[1] = { ldy };
    cu_matvec_group(s, 1, w, X, NULL, ldx, y, l, eidx, xdiv, nslots, NULL);
}

static void mv_launch(cudaStream_t s, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy) {
    if (T == 1 && mv4_ok(W)) { mv4_launch(s, W, X, ldx, Y, ldy, NULL, 1, 1); return; }
    if (T >= 2 && mv4_ok(W) && cu_mvqb_enabled()) { cu_matvec_rows(s, 1, &W, X, NULL, ldx, T, &Y, &ldy); return; }
    dim3 g((W->rows + 7) / 8, 1);
    if (T <= 1) cu_go(k_mv<1>, g, 256, 0, s)(*W, X, ldx, T, Y, ldy, NULL, 1);
    else if (T <= 2) cu_go(k_mv<2>, g, 256, 0, s)(*W, X, ldx, T, Y, ldy, NULL, 1);
    else if (T <= 4) cu_go(k_mv<4>, g, 256, 0, s)(*W, X, ldx, T, Y, ldy, NULL, 1);
    else cu_go(k_mv<8>, g, 256, 0, s)(*W, X, ldx, T, Y, ldy, NULL, 1);
}

/* A matrix of a few rows (the shared expert's gate: one) for many tokens, in fp32: a warp a
 * token, the lanes over 8-column pieces. (The 64 x 64 tiles computed 63 rows of padding.) */
__global__ void k_mm_rows(dmat m, const float *__restrict__ X, int ldx, int T, float *__restrict__ Y, int ldy) {
    CU_PDL();
    int t = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (t >= T) return;
    const float *x = X + (size_t)t * ldx;
    for (int r = 0; r < m.rows; r++) {
        float acc = 0;
        for (int c = lane * 8; c < m.cols; c += WARP * 8) {
            float w[8];
            load8(m, 0, r, c, w);
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (c + j < m.cols) acc += w[j] * x[c + j];
        }
        acc = warp_sum(acc);
        if (lane == 0) Y[(size_t)t * ldy + r] = acc;
    }
}

void cu_matmul_variant(cudaStream_t s, int variant, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy) {
    if (variant == 7) {
        cu_go(k_mm_rows, (T + 7) / 8, 256, 0, s)(*W, X, ldx, T, Y, ldy);
        return;
    }
    if (variant == 0) {
        for (int t = 0; t < T; t += 8) mv_launch(s, W, X + (size_t)t * ldx, ldx, T - t < 8 ? T - t : 8, Y + (size_t)t * ldy, ldy);
        return;
    }
    dsort none = { NULL, NULL, NULL, NULL, NULL };
    dim3 g((W->rows + TBM - 1) / TBM, (T + TBN - 1) / TBN, 1);
    if (variant == 1) cu_go(k_mm_simt, g, 256, 0, s)(*W, X, ldx, T, Y, ldy, none, 0, W->cols, 0);
    else cu_go(k_mm_tiled, g, 256, 0, s)(*W, X, ldx, T, Y, ldy, none, 0);
}

/* Y[t][r] = sum over splits, in split order (deterministic, unlike atomics). */
__global__ void k_sum_splits(const float *P, int S, size_t pstride, int T, int rows, float *Y, int ldy) {
    CU_PDL();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * rows) return;
    size_t o = (i / rows) * ldy + i % rows;
    float v = P[o];
    for (int z = 1; z < S; z++) v += P[(size_t)z * pstride + o];
    Y[o] = v;
}

/* The exact fp32 tile for the router at prefill, 8x8 outputs a thread: k_mm_simt's 4x4 read two
 * scalars from shared memory for every two FMAs, and half its instructions were not FMAs; here a
 * k step is four 16-byte shared loads (rows 4tx..4tx+3 and 32+4tx.., tokens 4ty.. and 32+4ty..,
 * conflict-free: a warp reads 8 and 4 distinct float4) for 64 FMAs, and the next step's weights
 * and inputs load into registers meanwhile (without, its two warps a block waited on them: 40 us
 * against k_mm_simt's 34 under Nsight, RESULTS.md). 64 threads a 64x64 tile; X 16-byte aligned;
 * split-K as k_mm_simt (block z sums columns [z kslice, (z+1) kslice) into Y + z pstride), each
 * output a running fp32 sum over its slice in column order. */
#define S8_K 32
/* a thread's share of a k step, columns c .. c + 31 (zeros past kend or where not ok): a weight row,
 * or an input row */
__device__ __forceinline__ void s8_load_w(const dmat &m, int row, bool wok, int c, int kend, float (&w)[S8_K]) {
#pragma unroll
    for (int sg = 0; sg < S8_K / 8; sg++) {
        const int cc = c + 8 * sg;
        float w8[8];
        if (wok && cc < kend) load8(m, 0, row, cc, w8);
        else for (int j = 0; j < 8; j++) w8[j] = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) w[8 * sg + j] = cc + j < kend ? w8[j] : 0.f;
    }
}
__device__ __forceinline__ void s8_load_x(const float *xrow, bool xok, int c, int kend, float (&x)[S8_K]) {
#pragma unroll
    for (int j = 0; j < S8_K / 4; j++) {
        const int cc = c + 4 * j;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (xok && cc + 4 <= kend) v = *(const float4 *)(xrow + cc);
        else if (xok && cc < kend) v.x = xrow[cc], v.y = cc + 1 < kend ? xrow[cc + 1] : 0.f, v.z = cc + 2 < kend ? xrow[cc + 2] : 0.f;
        x[4 * j] = v.x; x[4 * j + 1] = v.y; x[4 * j + 2] = v.z; x[4 * j + 3] = v.w;
    }
}

__global__ void __launch_bounds__(64) k_mm_simt8(dmat m, const float *__restrict__ X, int ldx, int T, float *__restrict__ Y,
                                                 int ldy, int kslice, size_t pstride) {
    CU_PDL();
    __shared__ __align__(16) float Ws[S8_K][68]; /* [k][row of the tile] */
    __shared__ __align__(16) float Xs[S8_K][68]; /* [k][token of the tile] */
    const int tid = threadIdx.x, tx = tid & 7, ty = tid >> 3;
    const int r0 = blockIdx.x * 64, t0 = blockIdx.y * 64;
    const int kbeg = blockIdx.z * kslice, kend = min(kbeg + kslice, m.cols);
    Y += (size_t)blockIdx.z * pstride;
    const bool wok = r0 + tid < m.rows, xok = t0 + tid < T;
    const float *xrow = X + (size_t)(xok ? t0 + tid : 0) * ldx;
    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] = 0.f;
    /* the next step's share is loaded into registers while this step multiplies */
    float wn[S8_K], xn[S8_K];
    s8_load_w(m, r0 + tid, wok, kbeg, kend, wn);
    s8_load_x(xrow, xok, kbeg, kend, xn);
    for (int k0 = kbeg; k0 < kend; k0 += S8_K) {
#pragma unroll
        for (int j = 0; j < S8_K; j++) { Ws[j][tid] = wn[j]; Xs[j][tid] = xn[j]; }
        __syncthreads();
        if (k0 + S8_K < kend) {
            s8_load_w(m, r0 + tid, wok, k0 + S8_K, kend, wn);
            s8_load_x(xrow, xok, k0 + S8_K, kend, xn);
        }
#pragma unroll 4
        for (int k = 0; k < S8_K; k++) {
            const float4 a0 = *(const float4 *)&Ws[k][4 * tx], a1 = *(const float4 *)&Ws[k][32 + 4 * tx];
            const float4 b0 = *(const float4 *)&Xs[k][4 * ty], b1 = *(const float4 *)&Xs[k][32 + 4 * ty];
            const float a[8] = { a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w };
            const float b[8] = { b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w };
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int t = t0 + (j < 4 ? 4 * ty + j : 32 + 4 * ty + j - 4);
        if (t >= T) continue;
        float *yr = Y + (size_t)t * ldy;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int r = r0 + (i < 4 ? 4 * tx + i : 32 + 4 * tx + i - 4);
            if (r < m.rows) yr[r] = acc[i][j];
        }
    }
}

/* k_mm_simt8's 64 x 64 tiles with the products on the tensor cores, each operand split in two TF32
 * parts (three mma: ~22 bits, cu_tf32_split), so the router's choice does not turn on the tensor
 * cores' 10-bit mantissas. Four warps: warp w owns rows 32 (w % 2) .. + 31 and tokens 32 (w / 2)
 * .. + 31 of the tile; threads 0-63 load the weight rows, 64-127 the input rows (k_mm_simt8's 64
 * threads load both), the next step into registers while this one multiplies. A row pitch of 72 floats (8 mod 32) puts a fragment's loads (rows q, columns
 * g) in 32 banks. */
__global__ void __launch_bounds__(128) k_mm_tc3(dmat m, const float *__restrict__ X, int ldx, int T, float *__restrict__ Y,
                                                int ldy, int kslice, size_t pstride) {
    CU_PDL();
    __shared__ __align__(16) float Ws[S8_K][72]; /* [k][row of the tile] */
    __shared__ __align__(16) float Xs[S8_K][72]; /* [k][token of the tile] */
    const int tid = threadIdx.x, w = tid >> 5, g8 = (tid & 31) >> 2, q = tid & 3, lr = tid & 63;
    const int r0 = blockIdx.x * 64, t0 = blockIdx.y * 64, wr = 32 * (w & 1), wt = 32 * (w >> 1);
    const int kbeg = blockIdx.z * kslice, kend = min(kbeg + kslice, m.cols);
    Y += (size_t)blockIdx.z * pstride;
    const bool isw = tid < 64, wok = isw && r0 + lr < m.rows, xok = !isw && t0 + lr < T;
    const float *xrow = X + (size_t)(xok ? t0 + lr : 0) * ldx;
    float acc[2][4][4] = {}; /* rows wr + 16i + g8 (+ 8), tokens wt + 8j + 2q (+ 1) */
    float rn[S8_K];             /* the next step's weight row (threads 0-63) or input row (64-127) */
    auto load = [&](int c) {
        if (isw) s8_load_w(m, r0 + lr, wok, c, kend, rn);
        else s8_load_x(xrow, xok, c, kend, rn);
    };
    load(kbeg);
    for (int k0 = kbeg; k0 < kend; k0 += S8_K) {
        float (*dst)[72] = isw ? Ws : Xs;
#pragma unroll
        for (int j = 0; j < S8_K; j++) dst[j][lr] = rn[j];
        __syncthreads();
        if (k0 + S8_K < kend) load(k0 + S8_K);
#pragma unroll
        for (int k = 0; k < S8_K; k += 8) {
            uint32_t bh[4][2], bl[4][2];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                cu_tf32_split(Xs[k + q][wt + 8 * j + g8], bh[j][0], bl[j][0]);
                cu_tf32_split(Xs[k + q + 4][wt + 8 * j + g8], bh[j][1], bl[j][1]);
            }
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int r = wr + 16 * i + g8;
                uint32_t ah[4], al[4];
                cu_tf32_split(Ws[k + q][r], ah[0], al[0]);
                cu_tf32_split(Ws[k + q][r + 8], ah[1], al[1]);
                cu_tf32_split(Ws[k + q + 4][r], ah[2], al[2]);
                cu_tf32_split(Ws[k + q + 4][r + 8], ah[3], al[3]);
                tc_mma_3xtf32<4>(acc[i], acc[i], ah, al, bh, bl);
            }
        }
        __syncthreads();
    }
    tc_store_32x32(acc, Y, ldy, r0 + wr, t0 + wt, m.rows, T);
}

static int exact_tc_force = -1; /* cu_matmul_exact_tc: -1 the environment's choice */
void cu_matmul_exact_tc(int on) { exact_tc_force = on; }

/* The router at prefill is 256 rows: 64x64 fp32 tiles give 32 blocks at 512 tokens on 132
 * SMs (~6 ms of pp512 over 40 layers, bench/RESULTS.md). Splitting the columns into slices
 * (up to 16, ~512 blocks of k_mm_simt8's two warps) fills the GPU; the slices' partials go to
 * `scr` and are added in a second launch. Still fp32 throughout (each output is a sum of slice
 * sums instead of one running sum: a different rounding, as the CPU's 8-lane order is).
 * LILY_CU_SIMT8=0: k_mm_simt's 4x4 tiles, up to 8 slices, for measuring. */
/* cu_exact_parts (cu_kern.h) */
int cu_exact_parts(cudaStream_t s, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy, float *scr,
                       size_t scr_floats) {
    if (T <= 8 || W->rows <= 8) { cu_matmul_variant(s, T <= 8 ? 0 : 7, W, X, ldx, T, Y, ldy); return 1; }
    static int s8 = -1, smx = INT_MIN;
    const int wide = cu_env_flag(&s8, "LILY_CU_SIMT8", 1) && ldx % 4 == 0 && !((uintptr_t)X & 15), want = wide ? 512 : 256;
    int smax = wide ? cu_env_int(&smx, "LILY_CU_EXACT_SPLITS", 16) : 8; /* (for measuring: 2..16) */
    smax = smax < 2 ? 2 : smax > 16 ? 16 : smax;
    int gx = (W->rows + TBM - 1) / TBM, gy = (T + TBN - 1) / TBN, tiles = gx * gy;
    int S = tiles >= want / 2 || !cu_splitk_enabled() ? 1 : want / tiles;
    size_t pstride = (size_t)T * ldy;
    if (S > smax) S = smax;
    if (S > W->cols / TBK) S = W->cols / TBK;
    while (S > 1 && (size_t)S * pstride > scr_floats) S--;
    if (S <= 1) { cu_matmul_variant(s, 1, W, X, ldx, T, Y, ldy); return 1; }
    int kslice = ((W->cols + S - 1) / S + TBK - 1) / TBK * TBK;
    S = (W->cols + kslice - 1) / kslice;
    dsort none = { NULL, NULL, NULL, NULL, NULL };
    static int tc3 = -1; /* LILY_CU_ROUTER_TC=0: the fp32 SIMT tiles */
    if (wide && (exact_tc_force >= 0 ? exact_tc_force : cu_env_flag(&tc3, "LILY_CU_ROUTER_TC", 1)))
        cu_go(k_mm_tc3, dim3(gx, gy, S), 128, 0, s)(*W, X, ldx, T, scr, ldy, kslice, pstride);
    else if (wide) cu_go(k_mm_simt8, dim3(gx, gy, S), 64, 0, s)(*W, X, ldx, T, scr, ldy, kslice, pstride);
    else cu_go(k_mm_simt, dim3(gx, gy, S), 256, 0, s)(*W, X, ldx, T, scr, ldy, none, 0, kslice, pstride);
    return S;
}

void cu_matmul_exact(cudaStream_t s, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy, float *scr,
                     size_t scr_floats) {
    const int S = cu_exact_parts(s, W, X, ldx, T, Y, ldy, scr, scr_floats);
    if (S > 1) {
        size_t n = (size_t)T * W->rows;
        cu_go(k_sum_splits, (unsigned)((n + 255) / 256), 256, 0, s)(scr, S, T * (size_t)ldy, T, W->rows, Y, ldy);
    }
}

/* On by default; LILY_CU_SPLITK=0 runs the router's tiles unsplit, for measuring. */
int cu_splitk_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_SPLITK", 1);
}

void cu_matmul(cudaStream_t s, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy) {
    /* past the matrix-vector's 8 rows the tensor-core GEMM: at 16 rows it already reads each
     * weight once where the TF32/SIMT tiles re-read it per 64-token tile with 4-byte loads */
    if (T > 8 && cu_gemm_q4_enabled() && cu_gemm_q4_ok(W, X, ldx)) cu_gemm_q4(s, W, X, ldx, T, Y, ldy);
    else cu_matmul_variant(s, T <= 8 ? 0 : T < CU_TC_MIN_T ? 1 : 2, W, X, ldx, T, Y, ldy);
}

void cu_matmul_slots(cudaStream_t s, const dmat *W, const int *eidx, const float *X, int xdiv,
                     int ldx, int nslots, float *Y, int ldy) {
    if (mv4_ok(W)) { mv4_launch(s, W, X, ldx, Y, ldy, eidx, xdiv, nslots); return; }
    dim3 g((W->rows + 7) / 8, nslots);
    cu_go(k_mv<1>, g, 256, 0, s)(*W, X, ldx, 1, Y, ldy, eidx, xdiv);
}

void cu_matmul_grouped(cudaStream_t s, const dmat *W, int E, const dsort *so, int xdiv, const float *X,
                       int ldx, int maxcount, float *Y, int ldy) {
    dim3 g((W->rows + TBM - 1) / TBM, (maxcount + TBN - 1) / TBN, E);
    if (maxcount < CU_TC_MIN_T) cu_go(k_mm_simt, g, 256, 0, s)(*W, X, ldx, maxcount, Y, ldy, *so, xdiv, W->cols, 0);
    else cu_go(k_mm_tiled, g, 256, 0, s)(*W, X, ldx, maxcount, Y, ldy, *so, xdiv);
}
