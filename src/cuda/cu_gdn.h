/* The delta rule's decode pieces that k_gdn_dec128 and k_gdn_dec_split (cu_gdn.cu) share. static:
 * each unit including it its own copy (cu_mvdp.h's reason: the emulator's mutants). */
#ifndef LILY_CU_GDN_H
#define LILY_CU_GDN_H
#include "cuda/cu_dev.h"

#define GDN_DEC_KMAX 8 /* the decode steps' conv width, at most */

/* a head's log decay g = -exp(A_log) softplus(a + dt_bias), x = a + dt_bias */
static __device__ __forceinline__ float gdn_g(float x, float alog) { return -expf(alog) * (x > 20.0f ? x : log1pf(expf(x))); }

/* One delta rule step of state column j, its 128 rows over the four threads p of a quad (32 in
 * each one's sr): decay, d = (v_j - S_j . k) beta, S_j += k d, and the column's output S_j . q,
 * which every thread of the quad returns. */
/* STR: the stride of the four threads' 32-row parts of q and k in shared memory (36 puts the four
 * parts' 16-byte loads in distinct banks; 32 is four-way conflicted) */
template <int STR = 32>
static __device__ __forceinline__ float gdn_col_step(float (&sr)[32], const float *qs, const float *ks, int p, float decay, float vj,
                                              float beta) {
    float d = 0.f, out = 0.f;
#pragma unroll
    for (int i = 0; i < 32; i++) { sr[i] *= decay; d += sr[i] * ks[p * STR + i]; }
    d += __shfl_xor_sync(0xffffffffu, d, 1);
    d += __shfl_xor_sync(0xffffffffu, d, 2);
    d = (vj - d) * beta;
#pragma unroll
    for (int i = 0; i < 32; i++) { sr[i] += ks[p * STR + i] * d; out += sr[i] * qs[p * STR + i]; }
    out += __shfl_xor_sync(0xffffffffu, out, 1);
    out += __shfl_xor_sync(0xffffffffu, out, 2);
    return out;
}

#endif
