/* __half for the CPU emulator (see cuda_runtime.h): storage and exact conversions
 * (float to half rounds to nearest even, as __float2half does). */
#ifndef LILY_EMU_CUDA_FP16_H
#define LILY_EMU_CUDA_FP16_H
#include "cuda_runtime.h"

struct __half { unsigned short __x; };
static inline __half __ushort_as_half(unsigned short u) { __half h; h.__x = u; return h; }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline float __half2float(__half h) {
    unsigned s = (h.__x >> 15) & 1u, e = (h.__x >> 10) & 31u, m = h.__x & 1023u, u;
    if (e == 31) u = (s << 31) | 0x7f800000u | (m << 13);
    else if (e) u = (s << 31) | ((e + 112u) << 23) | (m << 13);
    else if (!m) u = s << 31;
    else { /* subnormal: m * 2^-24 is exact in float */
        float f = (float)m * 5.9604644775390625e-8f;
        return s ? -f : f;
    }
    return __uint_as_float(u);
}
static inline __half __float2half(float f) {
    unsigned u = __float_as_uint(f), s = (u >> 16) & 0x8000u;
    unsigned a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return __ushort_as_half((unsigned short)(s | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u)));
    if (a >= 0x477ff000u) return __ushort_as_half((unsigned short)(s | 0x7c00u)); /* rounds past 65504 */
    if (a < 0x38800000u) { /* half subnormal or zero: round f * 2^24 to an integer, ties to even */
        float x = __uint_as_float(a) * 16777216.0f;
        return __ushort_as_half((unsigned short)(s | (unsigned)nearbyintf(x)));
    }
    unsigned r = a - 0x38000000u; /* rebias the exponent by 112 (in place << 23) */
    r = r + 0xfffu + ((r >> 13) & 1u);
    return __ushort_as_half((unsigned short)(s | (r >> 13)));
}
struct __attribute__((aligned(4))) __half2 { __half x, y; };
static inline __half __float2half_rn(float f) { return __float2half(f); }
static inline __half2 __halves2half2(__half a, __half b) { __half2 h; h.x = a; h.y = b; return h; }
static inline __half2 __floats2half2_rn(float a, float b) { return __halves2half2(__float2half(a), __float2half(b)); }
static inline __half2 __float2half2_rn(float a) { return __floats2half2_rn(a, a); }
static inline float __low2float(__half2 h) { return __half2float(h.x); }
static inline float __high2float(__half2 h) { return __half2float(h.y); }
static inline __half __low2half(__half2 h) { return h.x; }
static inline __half __high2half(__half2 h) { return h.y; }
/* half2 arithmetic: each lane computed exactly (in double) and rounded once, as the GPU does
 * (through float: a second rounding only where double's result is not a float already) */
static inline __half2 __hsub2(__half2 a, __half2 b) {
    return __floats2half2_rn((float)((double)__low2float(a) - __low2float(b)), (float)((double)__high2float(a) - __high2float(b)));
}
static inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
    return __floats2half2_rn((float)((double)__low2float(a) * __low2float(b) + __low2float(c)),
                             (float)((double)__high2float(a) * __high2float(b) + __high2float(c)));
}
#endif
