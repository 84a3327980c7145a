/* The gated delta rule for prefill, recurrent but staged: the arithmetic of k_gdn_rec128
 * (four threads a state column, 32 rows of it each in registers, the same order of
 * operations, so the same floats), reorganized for T > 1.
 *
 * Why: k_gdn_rec128 runs one block a value head (32 of 132 SMs) and, each step, waits for
 * that step's q/k/v loads (prefetched only one step ahead) and for two barriers (the fused
 * gated norm needs the whole head): about 3 us a token, 48 ms of a 512-token prefill. The
 * columns of S are independent given q, k, g and beta, so here a block owns GS_J columns
 * of one head (128 blocks for the 35B-A3B shape), the inputs of GS_T steps are staged in
 * shared memory with one barrier, and the steps then run with no barrier and no global
 * load. The gated norm runs after, as its own launch over all tokens. */
#include "cuda/cu_common.h"

#define GS_T 32 /* steps staged at once */
#define GS_J 32 /* state columns a block: 4 x GS_J threads */
#define GS_P 9  /* float4 slots a quarter of q or k takes: 8, plus one so the four quarters a
                 * quarter-warp reads at once fall in different banks */

__global__ void __launch_bounds__(4 * GS_J) k_gdn_staged(int T, int nk, int nv, int dv, const float *__restrict__ u, int cd,
                                                        const float *__restrict__ g, const float *__restrict__ beta,
                                                        float *__restrict__ S, float *__restrict__ o) {
    CU_PDL();
    __shared__ float4 qk[GS_T][2 * 4 * GS_P]; /* per step: q quarters, then k quarters */
    __shared__ float vs[GS_T][GS_J], ds[GS_T], bs[GS_T];
    const int dk = 128;
    const int h = blockIdx.x, jl = threadIdx.x / 4, p = threadIdx.x % 4, j = blockIdx.y * GS_J + jl;
    const int kh = h / (nv / nk), kd = nk * dk;
    float *Sh = S + (size_t)h * dk * dv;
    float sr[32];
#pragma unroll
    for (int i = 0; i < 32; i++) sr[i] = Sh[(size_t)(p * 32 + i) * dv + j];
    for (int t0 = 0; t0 < T; t0 += GS_T) {
        const int n = T - t0 < GS_T ? T - t0 : GS_T;
        __syncthreads(); /* the previous stage's readers are done */
        for (int x = threadIdx.x; x < n * 64; x += blockDim.x) {
            int t = x / 64, c = x % 64, half = c / 32, q4 = c % 32;
            const float *src = u + (size_t)(t0 + t) * cd + half * kd + kh * dk + q4 * 4;
            qk[t][half * 4 * GS_P + (q4 / 8) * GS_P + q4 % 8] = make_float4(src[0], src[1], src[2], src[3]);
        }
        for (int x = threadIdx.x; x < n * GS_J; x += blockDim.x) {
            int t = x / GS_J, c = x % GS_J;
            vs[t][c] = u[(size_t)(t0 + t) * cd + 2 * kd + (size_t)h * dv + blockIdx.y * GS_J + c];
        }
        for (int t = threadIdx.x; t < n; t += blockDim.x) {
            ds[t] = expf(g[(size_t)(t0 + t) * nv + h]);
            bs[t] = beta[(size_t)(t0 + t) * nv + h];
        }
        __syncthreads();
        for (int t = 0; t < n; t++) {
            const float4 *qs = &qk[t][p * GS_P], *ks = &qk[t][4 * GS_P + p * GS_P];
            const float decay = ds[t];
            float d = 0, out = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 k = ks[i];
                sr[4 * i] *= decay; d += sr[4 * i] * k.x;
                sr[4 * i + 1] *= decay; d += sr[4 * i + 1] * k.y;
                sr[4 * i + 2] *= decay; d += sr[4 * i + 2] * k.z;
                sr[4 * i + 3] *= decay; d += sr[4 * i + 3] * k.w;
            }
            d += __shfl_xor_sync(0xffffffffu, d, 1);
            d += __shfl_xor_sync(0xffffffffu, d, 2);
            d = (vs[t][jl] - d) * bs[t];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 k = ks[i], q = qs[i];
                sr[4 * i] += k.x * d; out += sr[4 * i] * q.x;
                sr[4 * i + 1] += k.y * d; out += sr[4 * i + 1] * q.y;
                sr[4 * i + 2] += k.z * d; out += sr[4 * i + 2] * q.z;
                sr[4 * i + 3] += k.w * d; out += sr[4 * i + 3] * q.w;
            }
            out += __shfl_xor_sync(0xffffffffu, out, 1);
            out += __shfl_xor_sync(0xffffffffu, out, 2);
            if (p == 0) o[(size_t)(t0 + t) * nv * dv + (size_t)h * dv + j] = out;
        }
    }
#pragma unroll
    for (int i = 0; i < 32; i++) Sh[(size_t)(p * 32 + i) * dv + j] = sr[i];
}

int cu_gdn_staged_ok(int dk, int dv, int cd) { return dk == 128 && dv % GS_J == 0 && cd % 4 == 0; }

int cu_gdn_staged(cudaStream_t s, int T, int nk, int nv, int dk, int dv, const float *u, int cd, const float *g,
                  const float *beta, float *S, float *o) {
    if (!cu_gdn_staged_ok(dk, dv, cd) || ((uintptr_t)u & 15)) return 0;
    k_gdn_staged<<<dim3(nv, dv / GS_J), 4 * GS_J, 0, s>>>(T, nk, nv, dv, u, cd, g, beta, S, o);
    return 1;
}
