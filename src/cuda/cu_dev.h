/* Device helpers and the matrix-vector kernels' launch sizing, shared by the CUDA sources
 * (cu_kernels.cu and its siblings, cu_mvtc.cu, cu_mvdp.cu, ...). */
#ifndef LILY_CU_DEV_H
#define LILY_CU_DEV_H
#include "cuda/cu_common.h"
#include <cuda_fp16.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define WARP 32

__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
/* word i of a 16-byte load (i a compile-time constant where it is unrolled: no local memory) */
__device__ __forceinline__ uint32_t cu_word(const uint4 &v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigm_f(float x) { return 1.0f / (1.0f + expf(-x)); }
/* silu with exp2 and the fast division (a few ulp: ~4e-7 relative), where a kernel's outputs
 * are hot: the IEEE division's slow-path call was a tenth of the experts' GEMM epilogue and a
 * third of the conv's instructions. 1 + e^-x past fp32's range gives 0, as silu's limit. */
__device__ __forceinline__ float silu_fast(float x) { return __fdividef(x, 1.0f + exp2f(-1.44269504f * x)); }
__device__ __forceinline__ float ld_sb(const char *p, int t, size_t i) {
    if (t == LW_BF16) return bf2f(((const uint16_t *)p)[i]);
    if (t == LW_F16) return h2f(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* a group's scale or bias, SBT its type when known at compile time (-1: read p.sbt) */
template <int SBT>
__device__ __forceinline__ float mvq_sb(const char *p, int sbt, int i) {
    if (SBT == LW_BF16) return bf2f(((const uint16_t *)p)[i]);
    if (SBT == LW_F16) return h2f(((const uint16_t *)p)[i]);
    if (SBT == LW_F32) return ((const float *)p)[i];
    return ld_sb(p, sbt, (size_t)i);
}

/* The emulator's mma (and cu_wg_mma64's off sm_90a): every lane's six operand registers, in one
 * exchange (emu::warp_all) or by shuffles */
__device__ __forceinline__ void cu_mma_lanes(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1,
                                             uint32_t (&all)[32][6]) {
#ifdef __CUDACC_EMU__
    const uint32_t mine[6] = { a0, a1, a2, a3, b0, b1 };
    emu::warp_all(mine, sizeof mine, all);
#else
    for (int l = 0; l < 32; l++) {
        all[l][0] = __shfl_sync(0xffffffffu, a0, l); all[l][1] = __shfl_sync(0xffffffffu, a1, l);
        all[l][2] = __shfl_sync(0xffffffffu, a2, l); all[l][3] = __shfl_sync(0xffffffffu, a3, l);
        all[l][4] = __shfl_sync(0xffffffffu, b0, l); all[l][5] = __shfl_sync(0xffffffffu, b1, l);
    }
#endif
}

/* C += A B for one m16n8k16 tile, fp16 inputs and fp32 accumulators, in the PTX fragment
 * layout: lane t (g = t / 4, q = t % 4) holds a0 = A[g][2q..2q+1], a1 = A[g+8][2q..2q+1],
 * a2 = A[g][2q+8..2q+9], a3 = A[g+8][2q+8..2q+9], b0 = B[2q..2q+1][g], b1 = B[2q+8..2q+9][g]
 * (the lower index in the low half) and c = C[g][2q], C[g][2q+1], C[g+8][2q], C[g+8][2q+1].
 * The emulator computes the same from the lanes' registers, exchanged by shuffles: products
 * exact in fp32, summed in k order. */
__device__ __forceinline__ void tc_mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    const int lane = threadIdx.x % WARP, g = lane / 4, q = lane % 4;
    uint32_t all[32][6];
    cu_mma_lanes(a0, a1, a2, a3, b0, b1, all);
    float A[2][16], B[2][16];
    for (int kq = 0; kq < 4; kq++) /* the k pairs 2kq, 2kq+1 and 2kq+8, 2kq+9 live in lanes 4r + kq */
        for (int h = 0; h < 2; h++) { /* low, high half */
            const int k = 2 * kq + h, sh = 16 * h;
            const uint32_t *ra = all[4 * g + kq];
            A[0][k] = h2f((uint16_t)(ra[0] >> sh)); A[1][k] = h2f((uint16_t)(ra[1] >> sh));
            A[0][k + 8] = h2f((uint16_t)(ra[2] >> sh)); A[1][k + 8] = h2f((uint16_t)(ra[3] >> sh));
            for (int j = 0; j < 2; j++) {
                const uint32_t *rb = all[4 * (2 * q + j) + kq];
                B[j][k] = h2f((uint16_t)(rb[4] >> sh));
                B[j][k + 8] = h2f((uint16_t)(rb[5] >> sh));
            }
        }
    for (int i = 0; i < 4; i++) {
        float v = c[i];
        for (int k = 0; k < 16; k++) v += A[i / 2][k] * B[i % 2][k];
        c[i] = v;
    }
#endif
}

/* wgmma (sm_90a): a warpgroup's D [64][64] (+)= A [64][16] B^T with fp32 accumulators. A comes
 * from registers, warp w of the group holding rows 16w..16w+15 in tc_mma's A layout (a0..a3); B is
 * 64 tokens x 16 fp16 in shared memory, K-major without swizzle: core matrices of 8 tokens x 8
 * halves (a token's 16-byte row), the k-halves 0-7 and 8-15 lbo bytes apart, groups of 8 tokens
 * sbo bytes apart (the descriptor's leading and stride offsets; probed on the H200 in session 14:
 * exact, including accumulation across k steps). d[4j + c] is tc_mma's c for tokens 8j..8j+7.
 * acc 0: D = A B^T. On the device it is asynchronous: cu_wg_fence before the first (once the
 * registers it reads are written), cu_wg_commit after a group, cu_wg_wait<N> before d or a0..a3
 * are touched again, and shared memory written by ordinary stores needs cu_wg_smem_fence in each
 * writing thread before the barrier. Elsewhere (the emulator, other targets) it computes at the
 * call, in k order. Not used by a kernel yet: the next step for the dense prefill GEMMs, whose
 * mma.sync tiles keep the tensor pipe at ~43% (bench/RESULTS.md, session 14). */
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CU_WGMMA 1
__device__ __forceinline__ void cu_wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cu_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cu_wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void cu_wg_smem_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
#else
#define CU_WGMMA 0
__device__ __forceinline__ void cu_wg_fence() {}
__device__ __forceinline__ void cu_wg_commit() {}
template <int N> __device__ __forceinline__ void cu_wg_wait() {}
__device__ __forceinline__ void cu_wg_smem_fence() {}
#endif
__device__ __forceinline__ void cu_wg_mma64(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, const void *b,
                                            uint32_t lbo, uint32_t sbo, int acc) {
#if CU_WGMMA
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(b);
    const uint64_t desc = (uint64_t)((sa & 0x3FFFF) >> 4) | (uint64_t)((lbo & 0x3FFFF) >> 4) << 16 |
                          (uint64_t)((sbo & 0x3FFFF) >> 4) << 32; /* base offset 0, no swizzle */
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(acc));
#else
    const int lane = threadIdx.x % WARP, g = lane / 4, q = lane % 4;
    uint32_t all[32][6];
    cu_mma_lanes(a0, a1, a2, a3, 0u, 0u, all);
    float A[2][16];
    for (int kq = 0; kq < 4; kq++)
        for (int h = 0; h < 2; h++) {
            const int k = 2 * kq + h, sh = 16 * h;
            const uint32_t *ra = all[4 * g + kq];
            A[0][k] = h2f((uint16_t)(ra[0] >> sh)); A[1][k] = h2f((uint16_t)(ra[1] >> sh));
            A[0][k + 8] = h2f((uint16_t)(ra[2] >> sh)); A[1][k + 8] = h2f((uint16_t)(ra[3] >> sh));
        }
    const unsigned char *bp = (const unsigned char *)b;
    for (int j = 0; j < 8; j++)
        for (int c = 0; c < 4; c++) {
            const int n = 8 * j + 2 * q + (c & 1);
            float v = acc ? d[4 * j + c] : 0.f;
            for (int k = 0; k < 16; k++)
                v += A[c >> 1][k] * h2f(*(const uint16_t *)(bp + (k >> 3) * lbo + (n >> 3) * sbo + (n & 7) * 16 + (k & 7) * 2));
            d[4 * j + c] = v;
        }
#endif
}

/* x = hi + lo for three TF32 products (lo hi, hi lo, hi hi) that give an fp32-accurate one: hi is x
 * cut to TF32's 19 bits, lo = x - hi exactly (13 bits), which the tensor core then cuts to its top
 * 11: ~22 bits in all, two instructions (a rounding cvt.rna is three with its own latency). The
 * emulator under LILY_EMU_TF32=fp32 keeps x whole in hi. */
__device__ __forceinline__ void cu_tf32_split(float x, uint32_t &hi, uint32_t &lo) {
#ifdef __CUDACC_EMU__
    if (emu::tf32_off) { hi = __float_as_uint(x); lo = 0; return; }
#endif
    hi = __float_as_uint(x) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi));
}

/* C += A B for one m16n8k32 tile of bytes, exact int32 sums: A unsigned (weight codes), B signed
 * (an input's bytes). Lane t (g = t / 4, q = t % 4) holds a0 = A[g][4q..4q+3], a1 = A[g+8][4q..],
 * a2 = A[g][16+4q..], a3 = A[g+8][16+4q..], b0 = B[4q..4q+3][g], b1 = B[16+4q..][g] (the lower k in
 * the lower byte) and c as in tc_mma. */
__device__ __forceinline__ void tc_mma_u8s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    const int lane = threadIdx.x % WARP, g = lane / 4, q = lane % 4;
    uint32_t all[32][6];
    cu_mma_lanes(a0, a1, a2, a3, b0, b1, all);
    int A[2][32], B[2][32];
    for (int kq = 0; kq < 4; kq++) /* k 4kq .. 4kq + 3 and 16 + 4kq .. live in lanes 4r + kq */
        for (int i = 0; i < 4; i++) {
            const int k = 4 * kq + i, sh = 8 * i;
            const uint32_t *ra = all[4 * g + kq];
            A[0][k] = (int)((ra[0] >> sh) & 255u); A[1][k] = (int)((ra[1] >> sh) & 255u);
            A[0][k + 16] = (int)((ra[2] >> sh) & 255u); A[1][k + 16] = (int)((ra[3] >> sh) & 255u);
            for (int j = 0; j < 2; j++) {
                const uint32_t *rb = all[4 * (2 * q + j) + kq];
                B[j][k] = (int)(int8_t)(uint8_t)(rb[4] >> sh);
                B[j][k + 16] = (int)(int8_t)(uint8_t)(rb[5] >> sh);
            }
        }
    for (int i = 0; i < 4; i++) {
        int v = c[i];
        for (int k = 0; k < 32; k++) v += A[i / 2][k] * B[i % 2][k];
        c[i] = v;
    }
#endif
}

/* C += A B for one m16n8k8 tile, TF32 inputs and fp32 accumulators: lane t (g = t / 4, q = t % 4)
 * holds a0 = A[g][q], a1 = A[g+8][q], a2 = A[g][q+4], a3 = A[g+8][q+4], b0 = B[q][g], b1 = B[q+4][g],
 * and c as in tc_mma. The emulator truncates each input to TF32 (as the tensor core reads it) and
 * sums the products exactly in fp32, in k order. */
__device__ __forceinline__ void tc_mma_tf32(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                            uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    const int lane = threadIdx.x % WARP, g = lane / 4, q = lane % 4;
    uint32_t all[32][6];
    cu_mma_lanes(a0, a1, a2, a3, b0, b1, all);
#ifdef __CUDACC_EMU__
    const uint32_t keep = emu::tf32_off ? 0xffffffffu : 0xffffe000u;
#else
    const uint32_t keep = 0xffffe000u;
#endif
    float A[2][8], B[2][8];
    for (int k = 0; k < 4; k++) { /* column k of A and row k of B live in lanes 4r + k */
        const uint32_t *ra = all[4 * g + k];
        A[0][k] = __uint_as_float(ra[0] & keep); A[1][k] = __uint_as_float(ra[1] & keep);
        A[0][k + 4] = __uint_as_float(ra[2] & keep); A[1][k + 4] = __uint_as_float(ra[3] & keep);
        for (int j = 0; j < 2; j++) {
            const uint32_t *rb = all[4 * (2 * q + j) + k];
            B[j][k] = __uint_as_float(rb[4] & keep);
            B[j][k + 4] = __uint_as_float(rb[5] & keep);
        }
    }
    for (int i = 0; i < 4; i++) {
        float v = c[i];
        for (int k = 0; k < 8; k++) v += A[i / 2][k] * B[i % 2][k];
        c[i] = v;
    }
#endif
}
/* c[n] (+ d[n]) += A B[n] to ~fp32 accuracy from split operands (cu_tf32_split), N tiles sharing A:
 * the products term by term across the tiles, and the two small ones into d (which may be c), so
 * that consecutive mma are independent (an accumulator's three in a row would wait on each other). */
template <int N>
__device__ __forceinline__ void tc_mma_3xtf32(float (&c)[N][4], float (&d)[N][4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                              const uint32_t (&bh)[N][2], const uint32_t (&bl)[N][2]) {
#pragma unroll
    for (int n = 0; n < N; n++) tc_mma_tf32(d[n], al[0], al[1], al[2], al[3], bh[n][0], bh[n][1]);
#pragma unroll
    for (int n = 0; n < N; n++) tc_mma_tf32(c[n], ah[0], ah[1], ah[2], ah[3], bh[n][0], bh[n][1]);
#pragma unroll
    for (int n = 0; n < N; n++) tc_mma_tf32(d[n], ah[0], ah[1], ah[2], ah[3], bl[n][0], bl[n][1]);
}
/* A warp's 32 x 32 accumulator tile (two m16 tiles i x four n8 tiles j in tc_mma's c layout) to
 * Y [token][row]: row r0 + 16 i + g + 8 (e >> 1), token t0 + 8 j + 2 q + (e & 1), those past rows or
 * T left out (k_mm_tc3, k_rtr). */
__device__ __forceinline__ void tc_store_32x32(const float (&acc)[2][4][4], float *Y, int ldy, int r0, int t0, int rows, int T) {
    const int g = (threadIdx.x & 31) >> 2, q = threadIdx.x & 3;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = r0 + 16 * i + g + 8 * (e >> 1), t = t0 + 8 * j + 2 * q + (e & 1);
                if (r < rows && t < T) Y[(size_t)t * ldy + r] = acc[i][j][e];
            }
}

/* (a, b) as an fp16 pair, a in the low half, saturated at fp16's largest finite value (the
 * tensor-core kernels' inputs) */
__device__ __forceinline__ uint32_t cu_h2sat(float a, float b) {
    uint32_t v;
#if defined(__CUDA_ARCH__)
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(v) : "f"(b), "f"(a));
#else
    a = a > 65504.f ? 65504.f : a < -65504.f ? -65504.f : a;
    b = b > 65504.f ? 65504.f : b < -65504.f ? -65504.f : b;
    __half2 h = __floats2half2_rn(a, b);
    memcpy(&v, &h, 4);
#endif
    return v;
}
/* One KV cache element: fp16, rounded and saturated as cu_h2sat (so prefill's tensor cores see the
 * keys they saw when the cache was fp32) */
__device__ __forceinline__ uint16_t cu_f2h(float a) { return (uint16_t)(cu_h2sat(a, 0.f) & 0xffffu); }

/* The packed fp16 GEMM input (k_gemm_tc's XP, gt_xp_pos in cu_gemm_tc.cu): a row's chunk cc (8
 * halves) holds the 8 consecutive columns from xp_chunk_col(cc), a = the first four, b = the
 * last four, paired (a.x b.x) (a.y b.y)/16 (a.z b.z) (a.w b.w)/16. A launch that produces a GEMM's
 * fp32 input writes this form beside it, so the GEMM packs nothing (k_xp_pack's launch gone). */
__device__ __forceinline__ int xp_chunk_col(int cc) { return 128 * (cc >> 4) + 32 * (cc & 3) + 8 * ((cc >> 2) & 3); }
__device__ __forceinline__ uint4 xp_chunk(float4 a, float4 b) {
    return make_uint4(cu_h2sat(a.x, b.x), cu_h2sat(a.y * 0.0625f, b.y * 0.0625f), cu_h2sat(a.z, b.z),
                      cu_h2sat(a.w * 0.0625f, b.w * 0.0625f));
}

/* a[0..n) in shared memory <- its exclusive prefix sums, by warp 0 (32 at a time, a shuffle scan
 * each); the total goes to a[n] where total_out. The caller syncs before and after. */
__device__ __forceinline__ void cu_warp0_exclusive_scan(int *a, int n, bool total_out) {
    if (threadIdx.x >= WARP) return;
    int carry = 0;
    for (int e0 = 0; e0 < n; e0 += WARP) {
        const int e = e0 + threadIdx.x, v = e < n ? a[e] : 0;
        int incl = v;
        for (int o = 1; o < WARP; o <<= 1) {
            const int u = __shfl_up_sync(0xffffffffu, incl, o);
            if ((int)threadIdx.x >= o) incl += u;
        }
        if (e < n) a[e] = carry + incl - v;
        carry += __shfl_sync(0xffffffffu, incl, WARP - 1);
    }
    if (total_out && threadIdx.x == 0) a[n] = carry;
}

/* The grouped GEMM's (expert, tile) map from start [E + 1], each expert's first tile (start[E]
 * the total): tiles[j] = expert << 16 | tile index within the expert, in expert order; -1 past
 * the end (k_moe_tiles, and k_moe_sort where it writes the map too). The caller syncs before. */
__device__ __forceinline__ void cu_moe_tile_map(const int *start, int E, int *tiles, int max_tiles) {
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        for (int j = start[e]; j < start[e + 1] && j < max_tiles; j++) tiles[j] = (e << 16) | (j - start[e]);
    for (int i = start[E] + threadIdx.x; i < max_tiles; i += blockDim.x) tiles[i] = -1;
}

/* The token tile of block y of a GEMM: with so.tiles, the (expert, tile) pair of cu_moe_tiles'
 * map (rows base + t0 .. of expert e's n), else tile y of T rows. False: the block has none. */
__device__ __forceinline__ bool cu_tile_of(const dsort &so, int y, int bt, int T, int &e, int &t0, int &n, int &base) {
    e = 0; n = T; base = 0;
    if (so.tiles) {
        const int tile = so.tiles[y];
        if (tile < 0) return false;
        e = tile >> 16;
        t0 = (tile & 0xffff) * bt;
        n = so.count[e];
        base = so.off[e];
    } else {
        t0 = y * bt;
    }
    return t0 < n;
}

/* cp.async: a 4-, 8- or 16-byte copy from global to shared memory that completes in the
 * background (no register holds it), in groups: cu_cp_commit closes the thread's open group and
 * cu_cp_wait<N> waits until at most N of its closed groups are still in flight. The emulator
 * queues the copies per thread and does them only at the wait that covers them, so a kernel that
 * reads a stage before waiting for it reads the emulator's poison. */
template <int N>
__device__ __forceinline__ void cu_cp(void *smem, const void *gmem) {
    static_assert(N == 4 || N == 8 || N == 16, "cp.async copies 4, 8 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    if (N == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem) : "memory");
    else asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(sa), "l"(gmem), "n"(N) : "memory");
#elif defined(__CUDACC_EMU__)
    emu::cp_async(smem, gmem, N);
#else
    memcpy(smem, gmem, N);
#endif
}
__device__ __forceinline__ void cu_cp_commit(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#elif defined(__CUDACC_EMU__)
    emu::cp_commit();
#endif
}
template <int N>
__device__ __forceinline__ void cu_cp_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#elif defined(__CUDACC_EMU__)
    emu::cp_wait(N);
#endif
}

/* Slot mode (eidx): this slot's expert (none for an extra slot xsl) and its input rows (extra slot
 * xslot + j reads row xrow + j: a batch's tokens' shared expert, one slot a token). */
__device__ __forceinline__ int mvq_slot_input(const mvq_args &a, const float *X, const float *X2, int ldx, const int *eidx,
                                              int xdiv, bool xsl, int slot, const float *&x, const float *&x2) {
    int xr = xsl ? a.f.xrow + (slot - a.f.xslot) : slot / xdiv;
    x = X + (size_t)xr * ldx;
    if (X2) x2 = X2 + (size_t)xr * ldx;
    return xsl || !eidx ? 0 : eidx[slot];
}

/* ---- the 4-bit matrix-vector kernels' input staging and chunk product (k_mvq, k_mvq4) ---- */
/* The 4-bit codes become floats without int-to-float conversions, which run at a quarter of
 * the FMA rate and bound this kernel near 2 TB/s of weights on the H200: a nibble masked in
 * place and put under the exponent of 2^23 (0x4B000000) is the float 2^23 + q 2^s, exact, and
 * subtracting 2^23 leaves q 2^s. Nibble k of a word sits at bit 4k; those at bits 20-31 are
 * first shifted down by 12 so that every q 2^s stays under 2^20. The staged input element that
 * meets nibble k is stored times 2^-s instead, so each product is the same float as q * x
 * (scaling by a power of two is exact), and the sums are bit-identical to converting q.
 * s by nibble: 0 4 8 12 16 8 12 16. */
/* (v & mask) | k as one LOP3, k in a register: written in C with both constants literal, it
 * compiled to an and and an or (one LOP3 takes one immediate), 64 of a 4-bit chunk's ~200
 * instructions in k_mvq4 (Nsight's SASS, bench/RESULTS.md session 12). For the codes put under a
 * float exponent (q4m here, tc_nib in cu_mvtc.cu). */
__device__ __forceinline__ uint32_t cu_and_or(uint32_t v, uint32_t mask, uint32_t k) {
#ifdef __CUDA_ARCH__
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(v), "r"(mask), "r"(k));
    return r;
#else
    return (v & mask) | k;
#endif
}
__device__ __forceinline__ float q4m(uint32_t v, uint32_t mask) {
    return __uint_as_float(cu_and_or(v, mask, 0x4B000000u)) - 8388608.0f;
}
/* Where the staged input's float4 j of chunk c (columns c*32 + 4j .. +3) lies: rotated by the
 * chunk (j XOR c mod 8), so the lanes of a warp, each on its own chunk, read distinct banks; as an
 * XOR, a lane finds every float4 of its chunk from one base, (c*8 + (c & 7)) ^ j. */
__device__ __forceinline__ int mvq_sw(int c, int j) { return c * 8 + (j ^ (c & 7)); }
/* the input's float4 j of chunk c times 2^-s, in place */
__device__ __forceinline__ void mvq_scale(float4 *xs, int c, int j) {
    float4 &v = xs[mvq_sw(c, j)];
    if (j & 1) { v.x *= 0x1p-16f; v.y *= 0x1p-8f; v.z *= 0x1p-12f; v.w *= 0x1p-16f; }
    else { v.y *= 0x1p-4f; v.z *= 0x1p-8f; v.w *= 0x1p-12f; }
}
/* undoes mvq_scale for the 8-bit codes, which are converted as before */
__device__ __forceinline__ float4 mvq_unscale(float4 v, int j) {
    if (j & 1) { v.x *= 0x1p16f; v.y *= 0x1p8f; v.z *= 0x1p12f; v.w *= 0x1p16f; }
    else { v.y *= 0x1p4f; v.z *= 0x1p8f; v.w *= 0x1p12f; }
    return v;
}
/* chunk c's input sum (for the group biases), unscaled, in the order the kernel always used */
__device__ __forceinline__ float mvq_chunk_sum(const float4 *xs, int c) {
    float sx = 0;
    for (int j = 0; j < 8; j++) {
        float4 v = mvq_unscale(xs[mvq_sw(c, j)], j);
        sx += (v.x + v.y) + (v.z + v.w);
    }
    return sx;
}
/* float4s of staged input before the chunk sums: all matrices of a launch share cols */
__device__ __forceinline__ int m_cols_f4(const mvq_args &a) { return a.m[0].cols / 4; }

/* One 16-byte chunk of 4-bit codes (one row, columns c*32 .. c*32+31) against the staged,
 * scaled input: the group's scale times the codes' dot product plus its bias times the chunk's
 * input sum. The input is read word by word as it is used, which keeps registers low. */
/* (rot = c & 7: constant for a lane, whose chunks are LPR apart, LPR a multiple of 8) */
__device__ __forceinline__ float mvq_chunk4(uint4 q, float sc, float bi, const float4 *xs, const float *sxs, int c, int rot) {
    uint32_t wv[4] = { q.x, q.y, q.z, q.w };
    const int b = c * 8 + rot; /* mvq_sw(c, j) == b ^ j */
    float sq = 0;
#pragma unroll
    for (int w = 0; w < 4; w++) {
        float4 u = xs[b ^ (2 * w)], t = xs[b ^ (2 * w + 1)];
        uint32_t v = wv[w], h = v >> 12;
        sq += q4m(v, 0xFu) * u.x + q4m(v, 0xF0u) * u.y + q4m(v, 0xF00u) * u.z + q4m(v, 0xF000u) * u.w
            + q4m(v, 0xF0000u) * t.x + q4m(h, 0xF00u) * t.y + q4m(h, 0xF000u) * t.z + q4m(h, 0xF0000u) * t.w;
    }
    return sc * sq + bi * sxs[c];
}

/* One bulk L2 prefetch of n bytes at p (both multiples of 16) */
__device__ __forceinline__ void cu_l2_pf(const char *p, unsigned n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n) : "memory");
#elif defined(__CUDACC_EMU__)
    emu::l2_prefetch(p, n);
#else
    (void)p; (void)n;
#endif
}
#define CU_L2PF_CHUNK 4096 /* bytes a bulk prefetch (cu_l2_prefetch's) */

/* The staged input of 12,288 columns (49,152 bytes) plus the chunk sums and the kernel's static
 * shared arrays is above the 48 KB a launch gets without asking. */
#define MVQ_SMEM (64 * 1024)
static inline int cu_pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }
static inline int cu_sm_count(void) {
    static const int n = [] {
        cudaDeviceProp p;
        return cudaGetDeviceProperties(&p, 0) == cudaSuccess && p.multiProcessorCount > 0 ? p.multiProcessorCount : 1;
    }();
    return n;
}

/* Blocks in x: as many as the GPU holds at once for the nslots rows of blocks (each walks tiles,
 * the walks made equal), or one a tile where the fused top-k counts finished tiles.
 * LILY_CU_MVQ_BLOCKS caps them lower, so the emulator's small matrices walk several tiles a
 * block too. The kernel may take MVQ_SMEM of dynamic shared memory (a refusal leaves the
 * launch to fail, which the forward's launch check reports). */
/* One kernel's launch state: whether it opted in to MVQ_SMEM, and the blocks an SM holds for
 * the few shared-memory sizes it is launched with (the matrices' widths), asked once each:
 * the stepwise decode launches it a hundred times a token. */
typedef struct {
    int attr_set, nocc;
    size_t occ_sm[8];
    int occ[8];
} mvq_kstate;

template <class K>
static int mvq_grid(K kern, mvq_kstate &ks, int tiles, int nslots, int one_a_tile, int bt, size_t sm) {
    static int cap_env = INT_MIN;
    /* (ks: the caller's, one for each kernel; the kernels share K, their pointer type) */
    if (!ks.attr_set) ks.attr_set = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, MVQ_SMEM) == cudaSuccess;
    cu_env_int(&cap_env, "LILY_CU_MVQ_BLOCKS", -1); /* used where > 0 */
    if (one_a_tile) return tiles;
    int per_sm = 0, k = 0;
    while (k < ks.nocc && ks.occ_sm[k] != sm) k++;
    if (k < ks.nocc) per_sm = ks.occ[k];
    else {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, bt, sm) != cudaSuccess || per_sm < 1) per_sm = 1;
        if (ks.nocc < 8) { ks.occ_sm[ks.nocc] = sm; ks.occ[ks.nocc++] = per_sm; }
    }
    int cap = cap_env > 0 ? cap_env : per_sm * cu_sm_count() / nslots;
    if (cap < 1) cap = 1;
    if (tiles <= cap) return tiles;
    int walk = (tiles + cap - 1) / cap;
    return (tiles + walk - 1) / walk;
}
/* ---- warp reductions and the router's top-k (k_router_topk, and k_mvdp routing itself) ----
 * static: each unit its own copy, so the emulator's mutants (cu2cpp.py) can break one unit's alone */
static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* One warp: softmax of a token's E router logits, then K rounds of argmax (lowest id on ties)
 * into sel/wt, the weights renormalized over the K. route_regs holds the lane's logits in
 * registers (lane l: experts l, l + 32, ..), so a round is NV compares and the warp's shuffles;
 * route_warp's shared-memory form (E > 512 or K > 32) re-reads all E probabilities from p each
 * round, a chain of dependent loads (the top-k launch 7.0 -> 5.2 us a decode layer under Nsight,
 * 18.6 -> 12.9 us at 512 tokens, bench/RESULTS.md session 13). Both give the same choices and weights bit for bit.
 * Logits are read past L1 (__ldcg): in k_mvq's fused form other blocks wrote them in this launch. */
/* RDX: each round's warp-wide choice by two redux.sync reductions (the largest probability, then
 * the lowest id among lanes holding it) in place of five shuffle pairs: the same choice. For
 * decode's one routing warp, where the round's latency is on the step's path; prefill's top-k
 * launch (a warp a token, many warps an SM) measured 0.7% slower with it (bench/RESULTS.md
 * session 24). */
template <int NV, bool RDX = false>
static __device__ __forceinline__ void route_regs(float (&v)[NV], int E, int K, int *sel, float *wt) {
    const int lane = threadIdx.x % WARP;
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < NV; i++)
        if (lane + WARP * i < E) mx = fmaxf(mx, v[i]);
    mx = warp_max(mx);
    float sum = 0;
#pragma unroll
    for (int i = 0; i < NV; i++)
        if (lane + WARP * i < E) { v[i] = expf(v[i] - mx); sum += v[i]; }
    sum = warp_sum(sum);
#pragma unroll
    for (int i = 0; i < NV; i++) v[i] = lane + WARP * i < E ? v[i] / sum : -3.0f; /* below any round's -1 */
    float tot = 0, mw = 0;
    int ms = 0;
    for (int j = 0; j < K; j++) {
        float bv = -1.0f;
        int bi = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < NV; i++)
            if (v[i] > bv) { bv = v[i]; bi = lane + WARP * i; }
        if (RDX) { /* (bv a probability in [0, 1], or -1 where the lane has none left: key 0) */
            const unsigned key = bv >= 0.f ? __float_as_uint(bv) + 1u : 0u;
            const unsigned km = __reduce_max_sync(0xffffffffu, key);
            const unsigned gi = __reduce_min_sync(0xffffffffu, key == km ? (unsigned)bi : 0xffffffffu);
            bv = km ? __uint_as_float(km - 1u) : -1.0f;
            bi = km ? (int)gi : 0x7fffffff;
        } else
            for (int o = 16; o; o >>= 1) {
                float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
            }
        if (bi >= E) bi = 0; /* only NaN logits (a defect upstream) leave no choice: stay in range */
        if (lane == j) { ms = bi; mw = bv; }
        tot += bv;
#pragma unroll
        for (int i = 0; i < NV; i++)
            if (lane + WARP * i == bi) v[i] = -2.0f; /* taken */
    }
    if (lane < K) { sel[lane] = ms; wt[lane] = mw / tot; }
}

template <int NV, bool RDX = false>
static __device__ __forceinline__ void route_ld(const float *lg, int E, int K, int *sel, float *wt) {
    const int lane = threadIdx.x % WARP;
    float v[NV];
#pragma unroll
    for (int i = 0; i < NV; i++) v[i] = lane + WARP * i < E ? __ldcg(lg + lane + WARP * i) : 0.f;
    route_regs<NV, RDX>(v, E, K, sel, wt);
}

#endif
