/* Prefill GEMMs for 4-bit weights on the tensor cores: Y[t][r] = sum_k X[t][k] W[r][k] with W
 * in the MLX affine layout (8 codes per little-endian uint32, a scale and a bias per group of
 * columns), FP16 operands and FP32 accumulation (the 10-bit mantissa of the TF32 tiles they
 * replace; inputs saturate at the FP16 range rather than overflow).
 *
 * Why this shape: at prefill the cost is reading and dequantizing weights, not the
 * multiply. A block owns 64 weight rows; each 64-column step is one quantization group per
 * row, 2 KB of codes for the block, one 16-byte load per thread, dequantized once into shared
 * memory and reused by every token of the block's tile. The next step's codes and inputs
 * are loaded into registers while the tensor cores work on this one.
 *
 * Grouped mode (the MoE experts after cu_moe_sort): an expert gets T*K/E tokens on average
 * (16 at 512 tokens), so the token tile is chosen small and blocks walk a tile map of
 * (expert, token tile) pairs built on the GPU (cu_moe_tiles): no block is launched for rows
 * an expert does not have, and no tile is mostly padding. */
#include "cuda/cu_dev.h"
#include <cuda_fp16.h>
#include <mma.h>
#include <stdlib.h>
using namespace nvcuda;

#define QR 64        /* weight rows per block */
#define QK 64        /* columns per step */
#define QLD (QK + 8) /* halves per shared row: 16-byte aligned rows, staggered banks */
#define QCL (QR + 4) /* floats per row of the output staging tile */
#define QTHREADS 128

__device__ __forceinline__ __half2 q_h2(float a, float b) {
    a = fminf(fmaxf(a, -65504.f), 65504.f);
    b = fminf(fmaxf(b, -65504.f), 65504.f);
    return __floats2half2_rn(a, b);
}

/* BT tokens x 64 rows per block, 4 warps: warp w computes rows 16w..16w+15 for all BT tokens.
 * BITS 4 or 8 (8-bit projections; the router and the shared-expert gate stay on fp32, see
 * cu_matmul_exact): a thread's 32 codes a step are one or two 16-byte loads. */
template <int BT, int BITS>
__global__ void __launch_bounds__(QTHREADS) k_gemm_q4(dmat m, const float *__restrict__ X, int ldx, int T,
                                                      float *__restrict__ Y, int ldy, dsort so, int xdiv) {
    CU_PDL();
    __shared__ __align__(32) __half Ws[QR * QLD];
    __shared__ __align__(32) __half Xs[BT * QLD];
    __shared__ __align__(32) float Cs[BT * QCL];
    const int tid = threadIdx.x, warp = tid >> 5;
    int e, n, base, t0;
    if (!cu_tile_of(so, blockIdx.y, BT, T, e, t0, n, base)) return;
    const int r0 = blockIdx.x * QR;

    /* weights: thread loads row wr, columns wc..wc+31 of each step */
    const int wr = tid >> 1, wc = (tid & 1) * 32;
    const bool wok = r0 + wr < m.rows;
    const char *wb = (const char *)m.w + (long long)e * m.ew;
    const char *sp = (const char *)m.s + (long long)e * m.es, *bp = (const char *)m.b + (long long)e * m.es;
    const int ng = m.cols / m.group;
    /* inputs: thread loads columns xc..xc+3 of tile rows xt0 + 8i */
    const int XL = BT / 8, xc = (tid & 15) * 4, xt0 = tid >> 4;
    const float *xrow[XL];
#pragma unroll
    for (int i = 0; i < XL; i++) {
        int t = t0 + xt0 + 8 * i;
        xrow[i] = NULL;
        if (t < n) {
            int srow = base + t;
            int xr = so.count ? (xdiv ? so.src[srow] / xdiv : srow) : srow;
            xrow[i] = X + (size_t)xr * ldx;
        }
    }

    uint4 wq[BITS / 4];
#pragma unroll
    for (int i = 0; i < BITS / 4; i++) wq[i] = make_uint4(0, 0, 0, 0);
    float wsc = 0.f, wbi = 0.f;
    float4 xv[XL];
#define Q_LOAD(k0)                                                                               \
    do {                                                                                         \
        if (wok) {                                                                               \
            size_t el_ = (size_t)(r0 + wr) * m.cols + (k0) + wc;                                 \
            _Pragma("unroll") for (int i_ = 0; i_ < BITS / 4; i_++)                              \
                wq[i_] = ((const uint4 *)(wb + el_ * BITS / 8))[i_];                             \
            size_t gi_ = (size_t)(r0 + wr) * ng + ((k0) + wc) / m.group;                         \
            wsc = ld_sb(sp, m.sbt, gi_);                                                       \
            wbi = ld_sb(bp, m.sbt, gi_);                                                       \
        }                                                                                        \
        _Pragma("unroll") for (int i_ = 0; i_ < XL; i_++)                                        \
            xv[i_] = xrow[i_] ? *(const float4 *)(xrow[i_] + (k0) + xc) : make_float4(0, 0, 0, 0); \
    } while (0)

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[BT / 16];
#pragma unroll
    for (int i = 0; i < BT / 16; i++) wmma::fill_fragment(acc[i], 0.0f);
    Q_LOAD(0);
    for (int k0 = 0; k0 < m.cols; k0 += QK) {
        { /* dequantize this step's codes and convert its inputs into shared memory */
            uint32_t qw[BITS], hb[16];
#pragma unroll
            for (int i = 0; i < BITS / 4; i++) {
                qw[4 * i] = wq[i].x; qw[4 * i + 1] = wq[i].y; qw[4 * i + 2] = wq[i].z; qw[4 * i + 3] = wq[i].w;
            }
            /* Codes become halves 1024 + q by or-ing them under the exponent of 1024 (exact),
             * then w = (h - 1024) sc + bi in one half2 FMA: the int-to-float and float-to-half
             * conversions this replaces run at a quarter of the FMA rate and bounded the
             * kernel (a block's 128 threads converted 6,144 values a 2 KB step). */
            const __half2 s2 = __float2half2_rn(wsc), b2 = __float2half2_rn(wbi), k2 = __float2half2_rn(1024.f);
            uint32_t pr[16];
            if (BITS == 4) {
#pragma unroll
                for (int w = 0; w < 4; w++) { /* lanes (j, j + 4), then reordered to (j, j + 1) */
                    uint32_t v = qw[w];
                    uint32_t t0 = (v & 0x000F000Fu) | 0x64006400u, t1 = ((v >> 4) & 0x000F000Fu) | 0x64006400u;
                    uint32_t t2 = ((v >> 8) & 0x000F000Fu) | 0x64006400u, t3 = ((v >> 12) & 0x000F000Fu) | 0x64006400u;
                    pr[4 * w] = __byte_perm(t0, t1, 0x5410);
                    pr[4 * w + 1] = __byte_perm(t2, t3, 0x5410);
                    pr[4 * w + 2] = __byte_perm(t0, t1, 0x7632);
                    pr[4 * w + 3] = __byte_perm(t2, t3, 0x7632);
                }
            } else {
#pragma unroll
                for (int w = 0; w < BITS; w++) {
                    pr[2 * w] = __byte_perm(qw[w], 0x64646464u, 0x4140);
                    pr[2 * w + 1] = __byte_perm(qw[w], 0x64646464u, 0x4342);
                }
            }
#pragma unroll
            for (int i = 0; i < 16; i++) {
                __half2 h = __hfma2(__hsub2(*(__half2 *)&pr[i], k2), s2, b2);
                hb[i] = wok ? *(uint32_t *)&h : 0u;
            }
            uint4 *dst = (uint4 *)(Ws + wr * QLD + wc);
#pragma unroll
            for (int j = 0; j < 4; j++) dst[j] = make_uint4(hb[4 * j], hb[4 * j + 1], hb[4 * j + 2], hb[4 * j + 3]);
#pragma unroll
            for (int i = 0; i < XL; i++) {
                __half2 a = q_h2(xv[i].x, xv[i].y), b = q_h2(xv[i].z, xv[i].w);
                uint2 v;
                v.x = *(uint32_t *)&a;
                v.y = *(uint32_t *)&b;
                *(uint2 *)(Xs + (xt0 + 8 * i) * QLD + xc) = v;
            }
        }
        __syncthreads();
        if (k0 + QK < m.cols) Q_LOAD(k0 + QK);
#pragma unroll
        for (int kk = 0; kk < QK; kk += 16) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
            wmma::load_matrix_sync(fb, Ws + (warp * 16) * QLD + kk, QLD);
#pragma unroll
            for (int i = 0; i < BT / 16; i++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
                wmma::load_matrix_sync(fa, Xs + (i * 16) * QLD + kk, QLD);
                wmma::mma_sync(acc[i], fa, fb, acc[i]);
            }
        }
        __syncthreads();
    }
#undef Q_LOAD
#pragma unroll
    for (int i = 0; i < BT / 16; i++) wmma::store_matrix_sync(Cs + (i * 16) * QCL + warp * 16, acc[i], QCL, wmma::mem_row_major);
    __syncthreads();
    for (int i = tid; i < BT * QR; i += QTHREADS) {
        int t = i / QR, r = i % QR;
        if (t0 + t < n && r0 + r < m.rows) Y[(size_t)(base + t0 + t) * ldy + r0 + r] = Cs[t * QCL + r];
    }
}

int cu_gemm_q4_ok(const dmat *W, const float *X, int ldx) {
    return W->type == LW_Q && (W->bits == 4 || W->bits == 8) && W->cols % QK == 0 && W->group % 32 == 0 && W->group > 0 &&
           ldx % 4 == 0 && ((uintptr_t)X & 15) == 0;
}

/* On by default since it passed the kernel test and lily check on the H200 (bench/RESULTS.md,
 * 2026-11-30); LILY_CU_GEMM=0 falls back to the TF32/SIMT tiles, for measuring. */
int cu_gemm_q4_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_GEMM", 1);
}

void cu_gemm_q4(cudaStream_t s, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy) {
    if (cu_gemm_tc_ok(W, X, ldx, T)) { cu_gemm_tc(s, W, X, ldx, T, Y, ldy); return; }
    dsort none = { NULL, NULL, NULL, NULL, NULL };
    dim3 g((W->rows + QR - 1) / QR, (T + 63) / 64, 1);
    if (W->bits == 8) cu_go(k_gemm_q4<64, 8>, g, QTHREADS, 0, s)(*W, X, ldx, T, Y, ldy, none, 0);
    else cu_go(k_gemm_q4<64, 4>, g, QTHREADS, 0, s)(*W, X, ldx, T, Y, ldy, none, 0);
}

/* LILY_CU_MOE_BT=16/32/64 fixes the tile, for measuring. */
int cu_moe_tile_rows(int rows_total, int E) {
    static int env = INT_MIN;
    const int v = cu_env_int(&env, "LILY_CU_MOE_BT", 0);
    if (v == 16 || v == 32 || v == 64) return v;
    /* 32 up to 96 tokens an expert: with the packed inputs (cu_moe_gate_up_xp) a 32-token tile
     * fits 5 blocks an SM, and one pass over an expert's weights for up to 32 tokens beat two
     * 16-token passes (pp512 17,151 -> 17,569, pp2048 21,111 -> 21,695 on the H200, RESULTS.md) */
    int avg = E > 0 ? rows_total / E : rows_total;
    return avg <= 96 ? 32 : 64;
}

int cu_moe_max_tiles(int rows_total, int E, int bt) { return (rows_total + bt - 1) / bt + E; }

/* The (expert, tile) map from the experts' counts (cu_moe_tile_map). */
__global__ void k_moe_tiles(const int *count, int E, int bt, int *tiles, int max_tiles) {
    CU_PDL();
    __shared__ int start[1025];
    for (int e = threadIdx.x; e < E; e += blockDim.x) start[e] = (count[e] + bt - 1) / bt;
    __syncthreads();
    cu_warp0_exclusive_scan(start, E, true); /* (one thread walking 256 experts took ~4 us) */
    __syncthreads();
    cu_moe_tile_map(start, E, tiles, max_tiles);
}

void cu_moe_tiles(cudaStream_t s, const int *count, int E, int bt, int *tiles, int max_tiles) {
    cu_go(k_moe_tiles, 1, 256, 0, s)(count, E, bt, tiles, max_tiles);
}

void cu_gemm_q4_grouped(cudaStream_t s, const dmat *W, const dsort *so, int bt, int max_tiles, int xdiv,
                        const float *X, int ldx, float *Y, int ldy) {
    if (cu_gemm_tc_ok(W, X, ldx, (long long)max_tiles * bt)) { cu_gemm_tc_grouped(s, W, NULL, so, bt, max_tiles, xdiv, X, ldx, Y, ldy); return; }
    dim3 g((W->rows + QR - 1) / QR, max_tiles, 1);
    if (W->bits == 8) { /* (experts are 4-bit in the checkpoints; kept for completeness) */
        if (bt == 16) cu_go(k_gemm_q4<16, 8>, g, QTHREADS, 0, s)(*W, X, ldx, 0, Y, ldy, *so, xdiv);
        else if (bt == 32) cu_go(k_gemm_q4<32, 8>, g, QTHREADS, 0, s)(*W, X, ldx, 0, Y, ldy, *so, xdiv);
        else cu_go(k_gemm_q4<64, 8>, g, QTHREADS, 0, s)(*W, X, ldx, 0, Y, ldy, *so, xdiv);
    } else if (bt == 16) cu_go(k_gemm_q4<16, 4>, g, QTHREADS, 0, s)(*W, X, ldx, 0, Y, ldy, *so, xdiv);
    else if (bt == 32) cu_go(k_gemm_q4<32, 4>, g, QTHREADS, 0, s)(*W, X, ldx, 0, Y, ldy, *so, xdiv);
    else cu_go(k_gemm_q4<64, 4>, g, QTHREADS, 0, s)(*W, X, ldx, 0, Y, ldy, *so, xdiv);
}
