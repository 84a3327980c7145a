/* The gated delta rule for prefill, recurrent but staged: the state's columns are independent
 * given q, k, g and beta, so a block owns GS_J columns of one value head, the inputs of GS_T
 * steps are staged in shared memory with one barrier, and the steps then run with no barrier and no global load, while the next stage loads. The gated
 * norm runs after, as its own launch over all tokens.
 *
 * Why this arithmetic: a step is S <- decay S; d = S k; S <- S + k beta (v - d); out = S q, one
 * token after another, so its cost is the latency of a step. Written as above, a step is two
 * dependent dot products and two reductions. Both dots read the old state: with S' the state
 * before the step, d = decay (S' k) and out = decay (S' q) + (k q) beta (v - d), so the three dots
 * S'k and S'q run side by side and reduce together, and kq, the same for every column, is found
 * once a stage for the block; eight threads share a column (16 rows each, in four independent
 * partial sums), so a step is short chains and three shuffle rounds (149 us a layer at 512 tokens
 * on the H200; sixteen threads a column, with two blocks of eight warps an SM, measured 188 us:
 * 52% more instructions, the shuffles and shared loads). A different order of the same sums
 * than the decode kernel k_gdn_rec128: rounding differs. */
#include "cuda/cu_dev.h"

#define GS_T 16 /* steps a stage; two stages, the next one loading (cp.async) while this one runs */
#define GS_C 8  /* threads a state column (GS_R rows each) */
#define GS_R (128 / GS_C)
#define GS_J 32 /* state columns a block: GS_C x GS_J threads, 128 blocks for the 35B-A3B shape */
/* q's (or k's) 32 float4 of a step, slot s stored at s ^ ((s / 8) % (GS_R / 4)): the 8 lanes of a
 * quarter-warp read slots GS_R/4 p + i, p = 0..7, which then fall in 8 different bank groups */
#define GS_SW(s) ((s) ^ (((s) >> 3) & (GS_R / 4 - 1)))

__global__ void __launch_bounds__(GS_C * GS_J) k_gdn_staged(int T, int nk, int nv, int dv, const float *__restrict__ u, int cd,
                                                        const float *__restrict__ g, const float *__restrict__ beta,
                                                        float *__restrict__ S, float *__restrict__ o) {
    CU_PDL();
    __shared__ __align__(16) float4 qk[2][GS_T][64]; /* per step: q's 32 float4 (swizzled), then k's */
    __shared__ __align__(16) float vs[2][GS_T][GS_J];
    __shared__ float gr[2][GS_T], br[2][GS_T], ds[GS_T], kqs[GS_T];
    const int dk = 128, tid = threadIdx.x;
    const int h = blockIdx.x, jl = tid / GS_C, p = tid % GS_C, j = blockIdx.y * GS_J + jl;
    const int kh = h / (nv / nk), kd = nk * dk;
    float *Sh = S + (size_t)h * dk * dv;
    /* steps t0.. of q, k, this block's columns of v, g and beta into stage buffer b */
    auto issue = [&](int t0, int b) {
        const int n = T - t0 < GS_T ? T - t0 : GS_T;
        for (int x = tid; x < n * 64; x += blockDim.x) {
            const int t = x / 64, c = x % 64, half = c / 32, q4 = c % 32;
            cu_cp<16>(&qk[b][t][half * 32 + GS_SW(q4)], u + (size_t)(t0 + t) * cd + half * kd + kh * dk + q4 * 4);
        }
        for (int x = tid; x < n * (GS_J / 4); x += blockDim.x) {
            const int t = x / (GS_J / 4), c = x % (GS_J / 4);
            cu_cp<16>(&vs[b][t][4 * c], u + (size_t)(t0 + t) * cd + 2 * kd + (size_t)h * dv + blockIdx.y * GS_J + 4 * c);
        }
        if (tid < n) {
            cu_cp<4>(&gr[b][tid], g + (size_t)(t0 + tid) * nv + h);
            cu_cp<4>(&br[b][tid], beta + (size_t)(t0 + tid) * nv + h);
        }
        cu_cp_commit();
    };
    issue(0, 0);
    float sr[GS_R];
#pragma unroll
    for (int i = 0; i < GS_R; i++) sr[i] = Sh[(size_t)(p * GS_R + i) * dv + j];
    for (int t0 = 0, b = 0; t0 < T; t0 += GS_T, b ^= 1) {
        const int n = T - t0 < GS_T ? T - t0 : GS_T;
        cu_cp_wait<0>();
        __syncthreads(); /* this stage is in for every thread, and every thread is done with the last */
        if (t0 + GS_T < T) issue(t0 + GS_T, b ^ 1);
        { /* k q and the decay of each step, shared by the block's columns: 16 threads a step */
            const int t = tid / 16, r = tid % 16;
            float a = 0;
            if (t < n) {
                const float4 *qs = qk[b][t], *ks = qk[b][t] + 32; /* rows 8r .. 8r + 7: slots 2r, 2r + 1 */
                const float4 q0 = qs[GS_SW(2 * r)], q1 = qs[GS_SW(2 * r + 1)], k0 = ks[GS_SW(2 * r)], k1 = ks[GS_SW(2 * r + 1)];
                a = ((q0.x * k0.x + q0.y * k0.y) + (q0.z * k0.z + q0.w * k0.w)) + ((q1.x * k1.x + q1.y * k1.y) + (q1.z * k1.z + q1.w * k1.w));
            }
#pragma unroll
            for (int m = 1; m < 16; m <<= 1) a += __shfl_xor_sync(0xffffffffu, a, m);
            if (t < n && r == 0) { kqs[t] = a; ds[t] = expf(gr[b][t]); }
        }
        __syncthreads();
        for (int t = 0; t < n; t++) {
            const float4 *qs = qk[b][t], *ks = qk[b][t] + 32;
            float sk[4] = { 0, 0, 0, 0 }, sq[4] = { 0, 0, 0, 0 };
            float4 kv[GS_R / 4];
#pragma unroll
            for (int i = 0; i < GS_R / 4; i++) {
                const float4 k = ks[GS_SW(p * (GS_R / 4) + i)], q = qs[GS_SW(p * (GS_R / 4) + i)];
                kv[i] = k;
                sk[0] += sr[4 * i] * k.x; sk[1] += sr[4 * i + 1] * k.y; sk[2] += sr[4 * i + 2] * k.z; sk[3] += sr[4 * i + 3] * k.w;
                sq[0] += sr[4 * i] * q.x; sq[1] += sr[4 * i + 1] * q.y; sq[2] += sr[4 * i + 2] * q.z; sq[3] += sr[4 * i + 3] * q.w;
            }
            float a = (sk[0] + sk[1]) + (sk[2] + sk[3]), c = (sq[0] + sq[1]) + (sq[2] + sq[3]);
#pragma unroll
            for (int m = 1; m < GS_C; m <<= 1) {
                a += __shfl_xor_sync(0xffffffffu, a, m);
                c += __shfl_xor_sync(0xffffffffu, c, m);
            }
            const float decay = ds[t], dd = (vs[b][t][jl] - decay * a) * br[b][t];
#pragma unroll
            for (int i = 0; i < GS_R / 4; i++) {
                sr[4 * i] = sr[4 * i] * decay + kv[i].x * dd;
                sr[4 * i + 1] = sr[4 * i + 1] * decay + kv[i].y * dd;
                sr[4 * i + 2] = sr[4 * i + 2] * decay + kv[i].z * dd;
                sr[4 * i + 3] = sr[4 * i + 3] * decay + kv[i].w * dd;
            }
            if (p == 0) o[(size_t)(t0 + t) * nv * dv + (size_t)h * dv + j] = decay * c + kqs[t] * dd;
        }
    }
#pragma unroll
    for (int i = 0; i < GS_R; i++) Sh[(size_t)(p * GS_R + i) * dv + j] = sr[i];
}

int cu_gdn_staged_ok(int dk, int dv, int cd) { return dk == 128 && dv % GS_J == 0 && cd % 4 == 0; }

int cu_gdn_staged(cudaStream_t s, int T, int nk, int nv, int dk, int dv, const float *u, int cd, const float *g,
                  const float *beta, float *S, float *o) {
    if (!cu_gdn_staged_ok(dk, dv, cd) || ((uintptr_t)u & 15)) return 0;
    cu_go(k_gdn_staged, dim3(nv, dv / GS_J), GS_C * GS_J, 0, s)(T, nk, nv, dv, u, cd, g, beta, S, o);
    return 1;
}
