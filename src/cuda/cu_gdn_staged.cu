/* The gated delta rule for prefill, recurrent but staged: the state's columns are independent
 * given q, k, g and beta, so a block owns GS_J columns of one value head (128 blocks for the
 * 35B-A3B shape), the inputs of GS_T steps are staged in shared memory with one barrier, and
 * the steps then run with no barrier and no global load. The gated norm runs after, as its own
 * launch over all tokens.
 *
 * Why this arithmetic: a step is S <- decay S; d = S k; S <- S + k beta (v - d); out = S q, one
 * token after another, so its cost is the latency of a step. Written as above, a step is two
 * dependent dot products and two reductions. Both dots read the old state: with S' the state
 * before the step, d = decay (S' k) and out = decay (S' q) + (k q) beta (v - d), so the three dots
 * S'k, S'q, kq run side by side and reduce together; eight threads share a column (16 rows each,
 * in four independent partial sums), so a step is short chains and three shuffle rounds (a
 * different order of the same sums than the decode kernel k_gdn_rec128: rounding differs). */
#include "cuda/cu_common.h"

#define GS_T 32 /* steps staged at once */
#define GS_J 32 /* state columns a block: 8 x GS_J threads */
#define GS_P 5  /* float4 slots a thread's 16 rows of q or k take: 4, plus one so the eight
                 * pieces a quarter-warp reads at once fall in different banks */

__global__ void __launch_bounds__(8 * GS_J) k_gdn_staged(int T, int nk, int nv, int dv, const float *__restrict__ u, int cd,
                                                        const float *__restrict__ g, const float *__restrict__ beta,
                                                        float *__restrict__ S, float *__restrict__ o) {
    CU_PDL();
    __shared__ float4 qk[GS_T][2 * 8 * GS_P]; /* per step: q's eight 16-row pieces, then k's */
    __shared__ float vs[GS_T][GS_J], ds[GS_T], bs[GS_T];
    const int dk = 128;
    const int h = blockIdx.x, jl = threadIdx.x / 8, p = threadIdx.x % 8, j = blockIdx.y * GS_J + jl;
    const int kh = h / (nv / nk), kd = nk * dk;
    float *Sh = S + (size_t)h * dk * dv;
    float sr[16];
#pragma unroll
    for (int i = 0; i < 16; i++) sr[i] = Sh[(size_t)(p * 16 + i) * dv + j];
    for (int t0 = 0; t0 < T; t0 += GS_T) {
        const int n = T - t0 < GS_T ? T - t0 : GS_T;
        __syncthreads(); /* the previous stage's readers are done */
        for (int x = threadIdx.x; x < n * 64; x += blockDim.x) {
            int t = x / 64, c = x % 64, half = c / 32, q4 = c % 32;
            const float *src = u + (size_t)(t0 + t) * cd + half * kd + kh * dk + q4 * 4;
            qk[t][half * 8 * GS_P + (q4 / 4) * GS_P + q4 % 4] = *(const float4 *)src;
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
            const float4 *qs = &qk[t][p * GS_P], *ks = &qk[t][8 * GS_P + p * GS_P];
            float sk[4] = { 0, 0, 0, 0 }, sq[4] = { 0, 0, 0, 0 }, kq[4] = { 0, 0, 0, 0 };
            float4 kv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float4 k = ks[i], q = qs[i];
                kv[i] = k;
                sk[0] += sr[4 * i] * k.x; sk[1] += sr[4 * i + 1] * k.y; sk[2] += sr[4 * i + 2] * k.z; sk[3] += sr[4 * i + 3] * k.w;
                sq[0] += sr[4 * i] * q.x; sq[1] += sr[4 * i + 1] * q.y; sq[2] += sr[4 * i + 2] * q.z; sq[3] += sr[4 * i + 3] * q.w;
                kq[0] += k.x * q.x; kq[1] += k.y * q.y; kq[2] += k.z * q.z; kq[3] += k.w * q.w;
            }
            float a = (sk[0] + sk[1]) + (sk[2] + sk[3]), b = (sq[0] + sq[1]) + (sq[2] + sq[3]), c = (kq[0] + kq[1]) + (kq[2] + kq[3]);
#pragma unroll
            for (int m = 1; m < 8; m <<= 1) {
                a += __shfl_xor_sync(0xffffffffu, a, m);
                b += __shfl_xor_sync(0xffffffffu, b, m);
                c += __shfl_xor_sync(0xffffffffu, c, m);
            }
            const float decay = ds[t], dd = (vs[t][jl] - decay * a) * bs[t];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                sr[4 * i] = sr[4 * i] * decay + kv[i].x * dd;
                sr[4 * i + 1] = sr[4 * i + 1] * decay + kv[i].y * dd;
                sr[4 * i + 2] = sr[4 * i + 2] * decay + kv[i].z * dd;
                sr[4 * i + 3] = sr[4 * i + 3] * decay + kv[i].w * dd;
            }
            if (p == 0) o[(size_t)(t0 + t) * nv * dv + (size_t)h * dv + j] = decay * b + c * dd;
        }
    }
#pragma unroll
    for (int i = 0; i < 16; i++) Sh[(size_t)(p * 16 + i) * dv + j] = sr[i];
}

int cu_gdn_staged_ok(int dk, int dv, int cd) { return dk == 128 && dv % GS_J == 0 && cd % 4 == 0; }

int cu_gdn_staged(cudaStream_t s, int T, int nk, int nv, int dk, int dv, const float *u, int cd, const float *g,
                  const float *beta, float *S, float *o) {
    if (!cu_gdn_staged_ok(dk, dv, cd) || ((uintptr_t)u & 15)) return 0;
    k_gdn_staged<<<dim3(nv, dv / GS_J), 8 * GS_J, 0, s>>>(T, nk, nv, dv, u, cd, g, beta, S, o);
    return 1;
}
