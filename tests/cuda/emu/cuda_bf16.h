/* __nv_bfloat16 for the CPU emulator (see cuda_runtime.h): storage and exact conversions
 * (float to bf16 rounds to nearest even; NaN stays NaN). */
#ifndef LILY_EMU_CUDA_BF16_H
#define LILY_EMU_CUDA_BF16_H
#include "cuda_runtime.h"

struct __nv_bfloat16 { unsigned short __x; };
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { __nv_bfloat16 h; h.__x = u; return h; }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
static inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float((unsigned)h.__x << 16); }
static inline __nv_bfloat16 __float2bfloat16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __ushort_as_bfloat16((unsigned short)((u >> 16) | 0x40u));
    u += 0x7fffu + ((u >> 16) & 1u);
    return __ushort_as_bfloat16((unsigned short)(u >> 16));
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
#endif
