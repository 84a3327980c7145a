/* Device helpers and the matrix-vector kernels' launch sizing, shared by the CUDA sources
 * (cu_kernels.cu, cu_mvtc.cu). */
#ifndef LILY_CU_DEV_H
#define LILY_CU_DEV_H
#include "cuda/cu_common.h"
#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>

#define WARP 32

__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
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

/* Slot mode (eidx): this slot's expert (none for the extra slot xsl) and its input rows. */
__device__ __forceinline__ int mvq_slot_input(const mvq_args &a, const float *X, const float *X2, int ldx, const int *eidx,
                                              int xdiv, bool xsl, int slot, const float *&x, const float *&x2) {
    int xr = xsl ? a.f.xrow : slot / xdiv;
    x = X + (size_t)xr * ldx;
    if (X2) x2 = X2 + (size_t)xr * ldx;
    return xsl ? 0 : eidx[slot];
}

/* The staged input of 12,288 columns (49,152 bytes) plus the chunk sums and the kernel's static
 * shared arrays is above the 48 KB a launch gets without asking. */
#define MVQ_SMEM (64 * 1024)
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
    static int cap_env = -2;
    /* (ks: the caller's, one for each kernel; the kernels share K, their pointer type) */
    if (!ks.attr_set) ks.attr_set = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, MVQ_SMEM) == cudaSuccess;
    if (cap_env == -2) {
        const char *e = getenv("LILY_CU_MVQ_BLOCKS");
        cap_env = e && atoi(e) > 0 ? atoi(e) : -1;
    }
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
#endif
