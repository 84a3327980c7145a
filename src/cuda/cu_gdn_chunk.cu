/* The gated delta rule for prefill in its chunked (WY) form, the CPU's cpu_gdn_chunked
 * (src/cpu/ops.c) on the GPU: same chunk of 64 tokens, same algebra, three kernels.
 *
 * Why three: the recurrent kernel walks the T tokens one after another on nv blocks (32 of
 * 132 SMs), so a 512-token prompt is 512 dependent steps per layer. In the chunked form only
 * the state's hand-over from chunk to chunk is sequential; everything inside a chunk is
 * independent across chunks:
 *   1. prep (chunks x heads, in parallel): A = strict_lower(beta_i k_i.k_j e^(G_i-G_j)),
 *      M = (I + A)^-1 by forward substitution, U = M (beta V), W = M (beta e^G K);
 *   2. state (heads, chunks in order): Vn = U - W S, O = e^G Q S (written to o),
 *      S = e^(G_last) S + (e^(G_last-G) K)^T Vn, with S in shared memory throughout;
 *   3. out (chunks x heads, in parallel): O += (Q K^T . e^(G_i-G_m), m <= i) Vn.
 * Scratch: U then Vn [nv][T][dv] and W [nv][T][dk], from the session.
 * u rows hold q (already normalized and scaled), k, v as the recurrent kernel reads them. */
#include "cuda/cu_common.h"
#include <math.h>

#define GC 64 /* chunk */
#define GLD (GC + 1)

/* Inclusive prefix sums of g over the chunk, by one thread (64 adds). */
__device__ static void chunk_g(const float *g, int nv, int h, int t0, int C, float *sG) {
    if (threadIdx.x == 0) {
        float acc = 0;
        for (int i = 0; i < GC; i++) {
            if (i < C) acc += g[(size_t)(t0 + i) * nv + h];
            sG[i] = acc;
        }
    }
}

__global__ void k_gdn_chunk_prep(int T, int nk, int nv, int dk, int dv, const float *__restrict__ u, int cd,
                                 const float *__restrict__ g, const float *__restrict__ beta, float *__restrict__ U,
                                 float *__restrict__ W) {
    CU_PDL();
    extern __shared__ float sm[];
    float *sK = sm;                 /* [GC][dk] */
    float *sV = sK + GC * dk;       /* [GC][dv], beta_j v_j */
    float *sM = sV + GC * dv;       /* [GC][GLD]: A, then M in place */
    float *sG = sM + GC * GLD, *sB = sG + GC;
    const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, nt = blockDim.x;
    const int t0 = c * GC, C = T - t0 < GC ? T - t0 : GC;
    const int kh = h / (nv / nk), kd = nk * dk;
    chunk_g(g, nv, h, t0, C, sG);
    for (int i = tid; i < GC; i += nt) sB[i] = i < C ? beta[(size_t)(t0 + i) * nv + h] : 0.f;
    __syncthreads();
    for (int x = tid; x < GC * dk; x += nt) {
        int i = x / dk, e = x % dk;
        sK[x] = i < C ? u[(size_t)(t0 + i) * cd + kd + kh * dk + e] : 0.f;
    }
    for (int x = tid; x < GC * dv; x += nt) {
        int i = x / dv, e = x % dv;
        sV[x] = i < C ? sB[i] * u[(size_t)(t0 + i) * cd + 2 * kd + h * dv + e] : 0.f;
    }
    __syncthreads();
    for (int x = tid; x < GC * GC; x += nt) {
        int i = x / GC, j = x % GC;
        float a = 0;
        if (j < i && i < C) {
            float s = 0;
            for (int e = 0; e < dk; e++) s += sK[i * dk + e] * sK[j * dk + e];
            a = s * sB[i] * expf(sG[i] - sG[j]);
        }
        sM[i * GLD + j] = a;
    }
    __syncthreads();
    /* M = (I + A)^-1, row by row: M[i][j] = -sum_{l=j}^{i-1} A[i][l] M[l][j] (rows l < i are M already) */
    for (int i = 1; i < C; i++) {
        float v = 0;
        if (tid < i) {
            for (int l = tid; l < i; l++) v -= sM[i * GLD + l] * (l == tid ? 1.f : sM[l * GLD + tid]);
        }
        __syncthreads();
        if (tid < i) sM[i * GLD + tid] = v;
        __syncthreads();
    }
    /* U = M (beta V), W = M (beta e^G K); M has an implicit unit diagonal and zeros above */
    for (int x = tid; x < C * dv; x += nt) {
        int i = x / dv, e = x % dv;
        float s = sV[i * dv + e];
        for (int j = 0; j < i; j++) s += sM[i * GLD + j] * sV[j * dv + e];
        U[((size_t)h * T + t0 + i) * dv + e] = s;
    }
    for (int x = tid; x < C * dk; x += nt) {
        int i = x / dk, e = x % dk;
        float s = sB[i] * expf(sG[i]) * sK[i * dk + e];
        for (int j = 0; j < i; j++) s += sM[i * GLD + j] * sB[j] * expf(sG[j]) * sK[j * dk + e];
        W[((size_t)h * T + t0 + i) * dk + e] = s;
    }
}

__global__ void k_gdn_chunk_state(int T, int nk, int nv, int dk, int dv, const float *__restrict__ u, int cd,
                                  const float *__restrict__ g, float *__restrict__ S, float *__restrict__ U,
                                  const float *__restrict__ W, float *__restrict__ o) {
    CU_PDL();
    extern __shared__ float sm[];
    float *sS = sm;                 /* [dk][dv] */
    float *sW = sS + dk * dv;       /* [GC][dk]: W, later e^(G_last-G_m) k_m */
    float *sQ = sW + GC * dk;       /* [GC][dk]: q */
    float *sN = sQ + GC * dk;       /* [GC][dv]: Vn */
    float *sG = sN + GC * dv;
    const int h = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
    const int kh = h / (nv / nk), kd = nk * dk;
    float *Sh = S + (size_t)h * dk * dv;
    for (int x = tid; x < dk * dv; x += nt) sS[x] = Sh[x];
    for (int t0 = 0; t0 < T; t0 += GC) {
        const int C = T - t0 < GC ? T - t0 : GC;
        __syncthreads();
        chunk_g(g, nv, h, t0, C, sG);
        for (int x = tid; x < C * dk; x += nt) {
            int i = x / dk, e = x % dk;
            sW[x] = W[((size_t)h * T + t0 + i) * dk + e];
            sQ[x] = u[(size_t)(t0 + i) * cd + kh * dk + e];
        }
        __syncthreads();
        /* Vn = U - W S, and O = e^G Q S */
        for (int x = tid; x < C * dv; x += nt) {
            int i = x / dv, j = x % dv;
            float ws = 0, qs = 0;
            for (int e = 0; e < dk; e++) {
                float sv = sS[e * dv + j];
                ws += sW[i * dk + e] * sv;
                qs += sQ[i * dk + e] * sv;
            }
            float vn = U[((size_t)h * T + t0 + i) * dv + j] - ws;
            sN[i * dv + j] = vn;
            U[((size_t)h * T + t0 + i) * dv + j] = vn;
            o[(size_t)(t0 + i) * nv * dv + (size_t)h * dv + j] = expf(sG[i]) * qs;
        }
        __syncthreads();
        const float gl = sG[C - 1];
        for (int x = tid; x < C * dk; x += nt) {
            int m = x / dk, e = x % dk;
            sW[x] = u[(size_t)(t0 + m) * cd + kd + kh * dk + e] * expf(gl - sG[m]);
        }
        __syncthreads();
        /* S = e^(G_last) S + K'^T Vn */
        const float el = expf(gl);
        for (int x = tid; x < dk * dv; x += nt) {
            int e = x / dv, j = x % dv;
            float s = sS[x] * el;
            for (int m = 0; m < C; m++) s += sW[m * dk + e] * sN[m * dv + j];
            sS[x] = s;
        }
    }
    __syncthreads();
    for (int x = tid; x < dk * dv; x += nt) Sh[x] = sS[x];
}

__global__ void k_gdn_chunk_out(int T, int nk, int nv, int dk, int dv, const float *__restrict__ u, int cd,
                                const float *__restrict__ g, const float *__restrict__ Vn, float *__restrict__ o) {
    CU_PDL();
    extern __shared__ float sm[];
    float *sQ = sm;                 /* [GC][dk] */
    float *sK = sQ + GC * dk;       /* [GC][dk] */
    float *sN = sK + GC * dk;       /* [GC][dv] */
    float *sP = sN + GC * dv;       /* [GC][GLD] */
    float *sG = sP + GC * GLD;
    const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, nt = blockDim.x;
    const int t0 = c * GC, C = T - t0 < GC ? T - t0 : GC;
    const int kh = h / (nv / nk), kd = nk * dk;
    chunk_g(g, nv, h, t0, C, sG);
    for (int x = tid; x < C * dk; x += nt) {
        int i = x / dk, e = x % dk;
        sQ[x] = u[(size_t)(t0 + i) * cd + kh * dk + e];
        sK[x] = u[(size_t)(t0 + i) * cd + kd + kh * dk + e];
    }
    for (int x = tid; x < C * dv; x += nt) {
        int i = x / dv, j = x % dv;
        sN[x] = Vn[((size_t)h * T + t0 + i) * dv + j];
    }
    __syncthreads();
    for (int x = tid; x < C * C; x += nt) {
        int i = x / C, m = x % C;
        float p = 0;
        if (m <= i) {
            for (int e = 0; e < dk; e++) p += sQ[i * dk + e] * sK[m * dk + e];
            p *= expf(sG[i] - sG[m]);
        }
        sP[i * GLD + m] = p;
    }
    __syncthreads();
    for (int x = tid; x < C * dv; x += nt) {
        int i = x / dv, j = x % dv;
        float s = 0;
        for (int m = 0; m <= i; m++) s += sP[i * GLD + m] * sN[m * dv + j];
        o[(size_t)(t0 + i) * nv * dv + (size_t)h * dv + j] += s;
    }
}

size_t cu_gdn_chunk_scratch_floats(int T, int nv, int dk, int dv) { return (size_t)nv * T * (dk + dv); }

static size_t smem_prep(int dk, int dv) { return sizeof(float) * ((size_t)GC * dk + (size_t)GC * dv + GC * GLD + 2 * GC); }
static size_t smem_state(int dk, int dv) { return sizeof(float) * ((size_t)dk * dv + 2 * (size_t)GC * dk + (size_t)GC * dv + GC); }
static size_t smem_out(int dk, int dv) { return sizeof(float) * (2 * (size_t)GC * dk + (size_t)GC * dv + GC * GLD + GC); }

int cu_gdn_chunked(cudaStream_t s, int T, int nk, int nv, int dk, int dv, const float *u, int cd, const float *g,
                   const float *beta, float *S, float *o, float *scratch) {
    if (T < 1 || dk > 128 || dv > 128 || nv % nk) return 0;
    size_t a = smem_prep(dk, dv), b = smem_state(dk, dv), c = smem_out(dk, dv);
    static int attrs_set;
    if (!attrs_set) { /* above the default 48 KB of dynamic shared memory */
        if (cudaFuncSetAttribute(k_gdn_chunk_prep, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_prep(128, 128)) ||
            cudaFuncSetAttribute(k_gdn_chunk_state, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_state(128, 128)) ||
            cudaFuncSetAttribute(k_gdn_chunk_out, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_out(128, 128)))
            return 0;
        attrs_set = 1;
    }
    float *U = scratch, *W = scratch + (size_t)nv * T * dv;
    dim3 gc((T + GC - 1) / GC, nv);
    k_gdn_chunk_prep<<<gc, 256, a, s>>>(T, nk, nv, dk, dv, u, cd, g, beta, U, W);
    k_gdn_chunk_state<<<nv, 512, b, s>>>(T, nk, nv, dk, dv, u, cd, g, S, U, W, o);
    k_gdn_chunk_out<<<gc, 256, c, s>>>(T, nk, nv, dk, dv, u, cd, g, U, o);
    return 1;
}

/* Opt-in (LILY_CU_GDN_CHUNK=1). It passed the kernel test and lily check on the H200
 * (2026-11-30) but was no faster there than the recurrent kernel (pp512's delta rule 47.9 ms
 * either way: its SIMT products read shared memory with 32-way bank conflicts); the staged
 * recurrence (cu_gdn_staged.cu) replaced both at prefill. (On the emulator, with the FP16
 * GEMM's inputs, it once drifted on tests/fixtures/tinyq's continuation, rel err 3e-2; with
 * the router and shared-expert gate in fp32 it gives 1.1e-3.) */
int cu_gdn_chunk_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_GDN_CHUNK", 0);
}
