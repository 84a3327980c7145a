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
#include "cuda/cu_dev.h"
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

/* ---- the same three phases for dk = 128 and dv a multiple of 32 (the 35B-A3B shape), tiled ----
 * Why: the kernels above keep one output a thread with a shared-memory read per FMA (32-way
 * conflicts where lanes walk rows) and walk the state on nv blocks. Here:
 *   prep: A's dot products in 4x4 register tiles from 16-byte reads of rows r, r + 16, r + 32,
 *     r + 48 (a row pitch of 132 floats puts 8 consecutive rows in 8 bank groups); then the
 *     forward substitution (I + A) [U | W] = [beta V | beta e^G K] a column a thread, 256 columns
 *     for 256 threads, each column's 64 rows in registers: no barrier, no inverse;
 *   state: a block per (head, 32 columns of S): the columns are independent, so nv * dv / 32
 *     blocks walk the chunks, with 2x4 (Vn, O) and 4x4 (S) register tiles;
 *   out: P = Q K^T . D in the prep's tiles, then O += P Vn in 4x8 tiles.
 * Same algebra and scratch as above; sums in other orders (fp32 throughout). */
#define GP 132 /* row pitch of 128-wide rows in shared memory: 16-byte aligned, 33 bank groups */

/* 4x4 tile (rows ti + 16 r, tj + 16 c) of X Y^T over 128 columns, X and Y [64][GP] in shared memory */
__device__ __forceinline__ void c128_xyt(const float *X, const float *Y, int ti, int tj, float (&acc)[4][4]) {
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[r][c] = 0.f;
#pragma unroll 2
    for (int e = 0; e < 128; e += 4) {
        float4 a[4], b[4];
#pragma unroll
        for (int r = 0; r < 4; r++) a[r] = *(const float4 *)&X[(ti + 16 * r) * GP + e];
#pragma unroll
        for (int c = 0; c < 4; c++) b[c] = *(const float4 *)&Y[(tj + 16 * c) * GP + e];
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[r][c] += a[r].x * b[c].x + a[r].y * b[c].y + a[r].z * b[c].z + a[r].w * b[c].w;
    }
}

/* out [64][68] = X Y^T (256 threads, a 4x4 tile each) times beta_i (beta NULL: 1) times e^(G_i - G_j)
 * where j < i (strict) or j <= i, and i < C; 0 elsewhere */
__device__ __forceinline__ void c128_tri(const float *X, const float *Y, int C, const float *sG, const float *beta, bool strict,
                                         float *out) {
    const int ti = threadIdx.x >> 4, tj = threadIdx.x & 15;
    float acc[4][4];
    c128_xyt(X, Y, ti, tj, acc);
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int i = ti + 16 * r, j = tj + 16 * q;
            const bool in = (strict ? j < i : j <= i) && i < C;
            out[i * 68 + j] = in ? acc[r][q] * (beta ? beta[i] : 1.f) * expf(sG[i] - sG[j]) : 0.f;
        }
}

/* rows t0 .. t0 + C - 1 of a 128-wide slice of u (row pitch cd) into X [64][GP], zeros past C */
__device__ __forceinline__ void c128_rows(float *X, const float *src, int cd, int C) {
    for (int x = threadIdx.x; x < 64 * 32; x += blockDim.x) {
        const int i = x >> 5, c4 = x & 31;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < C) v = *(const float4 *)(src + (size_t)i * cd + 4 * c4);
        *(float4 *)&X[i * GP + 4 * c4] = v;
    }
}

__global__ void __launch_bounds__(256) k_c128_prep(int T, int nk, int nv, int dv, const float *__restrict__ u, int cd,
                                                   const float *__restrict__ g, const float *__restrict__ beta,
                                                   float *__restrict__ U, float *__restrict__ W) {
    CU_PDL();
    extern __shared__ __align__(16) float sm[];
    float *sK = sm;                /* [64][GP] k */
    float *sV = sK + 64 * GP;      /* [64][GP] v (dv <= 128 columns) */
    float *sA = sV + 64 * GP;      /* [64][68]: A, strictly lower */
    float *sG = sA + 64 * 68, *sB = sG + 64;
    const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    const int t0 = c * GC, C = T - t0 < GC ? T - t0 : GC;
    const int kh = h / (nv / nk), kd = nk * 128;
    chunk_g(g, nv, h, t0, C, sG);
    if (tid < GC) sB[tid] = tid < C ? beta[(size_t)(t0 + tid) * nv + h] : 0.f;
    c128_rows(sK, u + (size_t)t0 * cd + kd + kh * 128, cd, C);
    for (int x = tid; x < 64 * (dv / 4); x += blockDim.x) {
        const int i = x / (dv / 4), c4 = x % (dv / 4);
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < C) v = *(const float4 *)(u + (size_t)(t0 + i) * cd + 2 * kd + (size_t)h * dv + 4 * c4);
        *(float4 *)&sV[i * GP + 4 * c4] = v;
    }
    __syncthreads();
    c128_tri(sK, sK, C, sG, sB, true, sA); /* A[i][j] = beta_i k_i.k_j e^(G_i - G_j), j < i < C */
    __syncthreads();
    /* column tid of [U | W]: x_i = rhs_i - sum_{j<i} A[i][j] x_j, rhs = beta v (tid < dv) or
     * beta e^G k (the rest) */
    const bool isw = tid >= dv;
    const int col = isw ? tid - dv : tid;
    if (col < (isw ? 128 : dv) && tid < dv + 128) {
        float x[GC];
#pragma unroll
        for (int i = 0; i < GC; i++) {
            float acc = isw ? sB[i] * expf(sG[i]) * sK[i * GP + col] : sB[i] * sV[i * GP + col];
#pragma unroll
            for (int j = 0; j < i; j++) acc -= sA[i * 68 + j] * x[j];
            x[i] = acc;
        }
        float *dst = isw ? W + ((size_t)h * T + t0) * 128 + col : U + ((size_t)h * T + t0) * dv + col;
        const int ld = isw ? 128 : dv;
#pragma unroll
        for (int i = 0; i < GC; i++)
            if (i < C) dst[(size_t)i * ld] = x[i];
    }
}

/* A block owns columns j0 .. j0 + 31 of head h's state; chunks in order. The next chunk's W, q
 * and U columns land by cp.async (two buffers) while this one computes, and this chunk's k is
 * loaded into registers before the Vn/O products and stored (times e^(G_last - G_m)) after. */
__device__ __forceinline__ void c128_state_issue(int T, int t0, int h, int kh, int dv, int j0, const float *u, int cd,
                                                 const float *W, const float *U, float *sW, float *sQ, float *sU) {
    const int C = T - t0 < GC ? T - t0 : GC;
    for (int x = threadIdx.x; x < 64 * 32; x += blockDim.x) {
        const int i = x >> 5, c4 = x & 31;
        if (i < C) {
            cu_cp<16>(&sW[i * GP + 4 * c4], W + ((size_t)h * T + t0 + i) * 128 + 4 * c4);
            cu_cp<16>(&sQ[i * GP + 4 * c4], u + (size_t)(t0 + i) * cd + kh * 128 + 4 * c4);
        } else {
            *(float4 *)&sW[i * GP + 4 * c4] = make_float4(0.f, 0.f, 0.f, 0.f);
            *(float4 *)&sQ[i * GP + 4 * c4] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
    for (int x = threadIdx.x; x < 64 * 8; x += blockDim.x) {
        const int i = x >> 3, c4 = x & 7;
        if (i < C) cu_cp<16>(&sU[i * 36 + 4 * c4], U + ((size_t)h * T + t0 + i) * dv + j0 + 4 * c4);
        else *(float4 *)&sU[i * 36 + 4 * c4] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    cu_cp_commit();
}

__global__ void __launch_bounds__(256) k_c128_state(int T, int nk, int nv, int dv, const float *__restrict__ u, int cd,
                                                    const float *__restrict__ g, float *__restrict__ S, float *__restrict__ U,
                                                    const float *__restrict__ W, float *__restrict__ o) {
    CU_PDL();
    extern __shared__ __align__(16) float sm[];
    float *sS = sm;                /* [128][36] the state's columns */
    float *sWb = sS + 128 * 36;    /* [2][64][GP] W */
    float *sQb = sWb + 2 * 64 * GP;/* [2][64][GP] q */
    float *sUb = sQb + 2 * 64 * GP;/* [2][64][36] U's columns */
    float *sK = sUb + 2 * 64 * 36; /* [64][GP] e^(G_last - G_m) k_m */
    float *sN = sK + 64 * GP;      /* [64][36] Vn's columns */
    float *sG = sN + 64 * 36;
    const int h = blockIdx.x, j0 = blockIdx.y * 32, tid = threadIdx.x;
    const int kh = h / (nv / nk), kd = nk * 128;
    float *Sh = S + (size_t)h * 128 * dv + j0;
    for (int x = tid; x < 128 * 8; x += blockDim.x) {
        const int e = x >> 3, c4 = x & 7;
        *(float4 *)&sS[e * 36 + 4 * c4] = *(const float4 *)(Sh + (size_t)e * dv + 4 * c4);
    }
    c128_state_issue(T, 0, h, kh, dv, j0, u, cd, W, U, sWb, sQb, sUb);
    chunk_g(g, nv, h, 0, T < GC ? T : GC, sG); /* (each chunk's G is written after the last one's reads: see below) */
    const int ti = tid >> 3, tj = tid & 7; /* Vn, O: rows ti, ti + 32, columns 4tj..; S: rows ti + 32r */
    for (int t0 = 0, b = 0; t0 < T; t0 += GC, b ^= 1) {
        const int C = T - t0 < GC ? T - t0 : GC;
        float *sW = sWb + b * 64 * GP, *sQ = sQb + b * 64 * GP, *sU = sUb + b * 64 * 36;
        cu_cp_wait<0>();
        __syncthreads(); /* this chunk is in, and its G; the last chunk's update is done */
        if (t0 + GC < T) c128_state_issue(T, t0 + GC, h, kh, dv, j0, u, cd, W, U, sWb + (b ^ 1) * 64 * GP, sQb + (b ^ 1) * 64 * GP,
                                          sUb + (b ^ 1) * 64 * 36);
        float4 kr[8]; /* this chunk's k, rows (tid + 256 x) / 32 */
#pragma unroll
        for (int x = 0; x < 8; x++) {
            const int y = tid + 256 * x, m = y >> 5, c4 = y & 31;
            kr[x] = m < C ? *(const float4 *)(u + (size_t)(t0 + m) * cd + kd + kh * 128 + 4 * c4) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        { /* Vn = U - W S, O = e^G Q S */
            float aw[2][4] = {}, aq[2][4] = {};
#pragma unroll 2
            for (int e = 0; e < 128; e += 4) {
                const float4 w0 = *(const float4 *)&sW[ti * GP + e], w1 = *(const float4 *)&sW[(ti + 32) * GP + e];
                const float4 q0 = *(const float4 *)&sQ[ti * GP + e], q1 = *(const float4 *)&sQ[(ti + 32) * GP + e];
                const float wv[2][4] = { { w0.x, w0.y, w0.z, w0.w }, { w1.x, w1.y, w1.z, w1.w } };
                const float qv[2][4] = { { q0.x, q0.y, q0.z, q0.w }, { q1.x, q1.y, q1.z, q1.w } };
#pragma unroll
                for (int d = 0; d < 4; d++) {
                    const float4 sv = *(const float4 *)&sS[(e + d) * 36 + 4 * tj];
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        aw[r][0] += wv[r][d] * sv.x; aw[r][1] += wv[r][d] * sv.y; aw[r][2] += wv[r][d] * sv.z; aw[r][3] += wv[r][d] * sv.w;
                        aq[r][0] += qv[r][d] * sv.x; aq[r][1] += qv[r][d] * sv.y; aq[r][2] += qv[r][d] * sv.z; aq[r][3] += qv[r][d] * sv.w;
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int i = ti + 32 * r;
                const float4 uv = *(const float4 *)&sU[i * 36 + 4 * tj];
                const float4 vn = make_float4(uv.x - aw[r][0], uv.y - aw[r][1], uv.z - aw[r][2], uv.w - aw[r][3]);
                *(float4 *)&sN[i * 36 + 4 * tj] = vn; /* (zero past C: U and W are) */
                if (i >= C) continue;
                *(float4 *)(U + ((size_t)h * T + t0 + i) * dv + j0 + 4 * tj) = vn;
                const float eg = expf(sG[i]);
                *(float4 *)(o + (size_t)(t0 + i) * nv * dv + (size_t)h * dv + j0 + 4 * tj) =
                    make_float4(eg * aq[r][0], eg * aq[r][1], eg * aq[r][2], eg * aq[r][3]);
            }
        }
        const float gl = sG[C - 1];
#pragma unroll
        for (int x = 0; x < 8; x++) {
            const int y = tid + 256 * x, m = y >> 5, c4 = y & 31;
            const float f = m < C ? expf(gl - sG[m]) : 0.f;
            *(float4 *)&sK[m * GP + 4 * c4] = make_float4(kr[x].x * f, kr[x].y * f, kr[x].z * f, kr[x].w * f);
        }
        __syncthreads(); /* sN and sK are in; nothing reads sG past here */
        if (t0 + GC < T) chunk_g(g, nv, h, t0 + GC, T - t0 - GC < GC ? T - t0 - GC : GC, sG);
        { /* S = e^(G_last) S + K'^T Vn: rows ti + 32 r, columns 4tj.. */
            const float el = expf(gl);
            float acc[4][4];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const float4 sv = *(const float4 *)&sS[(ti + 32 * r) * 36 + 4 * tj];
                acc[r][0] = sv.x * el; acc[r][1] = sv.y * el; acc[r][2] = sv.z * el; acc[r][3] = sv.w * el;
            }
#pragma unroll 4
            for (int m = 0; m < C; m++) {
                const float4 nv4 = *(const float4 *)&sN[m * 36 + 4 * tj];
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const float kv = sK[m * GP + ti + 32 * r];
                    acc[r][0] += kv * nv4.x; acc[r][1] += kv * nv4.y; acc[r][2] += kv * nv4.z; acc[r][3] += kv * nv4.w;
                }
            }
#pragma unroll
            for (int r = 0; r < 4; r++) *(float4 *)&sS[(ti + 32 * r) * 36 + 4 * tj] = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
        }
    }
    __syncthreads();
    for (int x = tid; x < 128 * 8; x += blockDim.x) {
        const int e = x >> 3, c4 = x & 7;
        *(float4 *)(Sh + (size_t)e * dv + 4 * c4) = *(const float4 *)&sS[e * 36 + 4 * c4];
    }
}

__global__ void __launch_bounds__(256) k_c128_out(int T, int nk, int nv, int dv, const float *__restrict__ u, int cd,
                                                  const float *__restrict__ g, const float *__restrict__ Vn, float *__restrict__ o) {
    CU_PDL();
    extern __shared__ __align__(16) float sm[];
    float *sQ = sm;                /* [64][GP] q, then Vn */
    float *sK = sQ + 64 * GP;      /* [64][GP] k */
    float *sP = sK + 64 * GP;      /* [64][68] */
    float *sG = sP + 64 * 68;
    const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    const int t0 = c * GC, C = T - t0 < GC ? T - t0 : GC;
    const int kh = h / (nv / nk), kd = nk * 128;
    chunk_g(g, nv, h, t0, C, sG);
    c128_rows(sQ, u + (size_t)t0 * cd + kh * 128, cd, C);
    c128_rows(sK, u + (size_t)t0 * cd + kd + kh * 128, cd, C);
    __syncthreads();
    c128_tri(sQ, sK, C, sG, NULL, false, sP); /* P[i][m] = q_i.k_m e^(G_i - G_m), m <= i < C */
    __syncthreads();
    for (int x = tid; x < 64 * (dv / 4); x += blockDim.x) { /* Vn over q */
        const int i = x / (dv / 4), c4 = x % (dv / 4);
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < C) v = *(const float4 *)(Vn + ((size_t)h * T + t0 + i) * dv + 4 * c4);
        *(float4 *)&sQ[i * GP + 4 * c4] = v;
    }
    __syncthreads();
    /* O += P Vn: thread rows ti + 16 r, columns 4 tj .. and 64 + 4 tj .. (those below dv) */
    const int ti = tid >> 4, tj = tid & 15;
    float acc[4][8] = {};
    const int iend = min(C, 64);
    for (int m = 0; m < iend; m++) {
        const float4 v0 = *(const float4 *)&sQ[m * GP + 4 * tj], v1 = *(const float4 *)&sQ[m * GP + 64 + 4 * tj];
        const float vv[8] = { v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w };
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const float p = sP[(ti + 16 * r) * 68 + m];
#pragma unroll
            for (int q = 0; q < 8; q++) acc[r][q] += p * vv[q];
        }
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const int i = ti + 16 * r;
        if (i >= C) continue;
        float *op = o + (size_t)(t0 + i) * nv * dv + (size_t)h * dv;
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int col = 64 * hf + 4 * tj;
            if (col >= dv) continue;
            float4 ov = *(float4 *)(op + col);
            ov.x += acc[r][4 * hf]; ov.y += acc[r][4 * hf + 1]; ov.z += acc[r][4 * hf + 2]; ov.w += acc[r][4 * hf + 3];
            *(float4 *)(op + col) = ov;
        }
    }
}

static size_t smem_c128_prep(void) { return sizeof(float) * (2 * 64 * GP + 64 * 68 + 2 * 64); }
static size_t smem_c128_state(void) { return sizeof(float) * (128 * 36 + 5 * 64 * GP + 3 * 64 * 36 + 64); }
static size_t smem_c128_out(void) { return sizeof(float) * (2 * 64 * GP + 64 * 68 + 64); }

static int c128_run(cudaStream_t s, int T, int nk, int nv, int dv, const float *u, int cd, const float *g, const float *beta,
                    float *S, float *o, float *scratch) {
    static int attrs = 0; /* 1 set, -1 refused */
    if (!attrs)
        attrs = cudaFuncSetAttribute(k_c128_prep, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_c128_prep()) ||
                        cudaFuncSetAttribute(k_c128_state, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_c128_state()) ||
                        cudaFuncSetAttribute(k_c128_out, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_c128_out())
                    ? -1 : 1;
    if (attrs < 0) { cudaGetLastError(); return 0; }
    float *U = scratch, *W = scratch + (size_t)nv * T * dv;
    dim3 gc((T + GC - 1) / GC, nv);
    cu_go(k_c128_prep, gc, 256, smem_c128_prep(), s)(T, nk, nv, dv, u, cd, g, beta, U, W);
    cu_go(k_c128_state, dim3(nv, dv / 32), 256, smem_c128_state(), s)(T, nk, nv, dv, u, cd, g, S, U, W, o);
    cu_go(k_c128_out, gc, 256, smem_c128_out(), s)(T, nk, nv, dv, u, cd, g, U, o);
    return 1;
}

size_t cu_gdn_chunk_scratch_floats(int T, int nv, int dk, int dv) {
    const size_t a = (size_t)nv * T * (dk + dv), b = cu_gdn_tc_scratch_floats(T, nv);
    return a > b ? a : b;
}

static int chunk_variant; /* cu_gdn_chunk_variant: 0 = the environment's choice */
void cu_gdn_chunk_variant(int v) { chunk_variant = v; }

static size_t smem_prep(int dk, int dv) { return sizeof(float) * ((size_t)GC * dk + (size_t)GC * dv + GC * GLD + 2 * GC); }
static size_t smem_state(int dk, int dv) { return sizeof(float) * ((size_t)dk * dv + 2 * (size_t)GC * dk + (size_t)GC * dv + GC); }
static size_t smem_out(int dk, int dv) { return sizeof(float) * (2 * (size_t)GC * dk + (size_t)GC * dv + GC * GLD + GC); }

int cu_gdn_chunked(cudaStream_t s, int T, int nk, int nv, int dk, int dv, const float *u, int cd, const float *g,
                   const float *beta, float *S, float *o, float *scratch) {
    if (T < 1 || dk > 128 || dv > 128 || nv % nk) return 0;
    /* LILY_CU_GDN_TC=0: not on the tensor cores (cu_gdn_tc.cu); LILY_CU_GDN_C128=0: not tiled either,
     * the kernels above at every shape; for measuring */
    static int tcs = -1, tiled = -1;
    const int v = chunk_variant;
    if ((v ? v == 1 : cu_env_flag(&tcs, "LILY_CU_GDN_TC", 1)) && cu_gdn_tc(s, T, nk, nv, dk, dv, u, cd, g, beta, S, o, scratch))
        return 1;
    /* the SIMT chunks only where asked (a variant, or LILY_CU_GDN_CHUNK=1 set): at other shapes the
     * forward pass keeps the staged or recurrent kernels, no slower (RESULTS.md) */
    static int asked = -1;
    if (!v && !cu_env_flag(&asked, "LILY_CU_GDN_CHUNK", 0)) return 0;
    if (dk == 128 && dv % 32 == 0 && cd % 4 == 0 && !((uintptr_t)u & 15) && (v ? v <= 2 : cu_env_flag(&tiled, "LILY_CU_GDN_C128", 1)) &&
        c128_run(s, T, nk, nv, dv, u, cd, g, beta, S, o, scratch))
        return 1;
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
    cu_go(k_gdn_chunk_prep, gc, 256, a, s)(T, nk, nv, dk, dv, u, cd, g, beta, U, W);
    cu_go(k_gdn_chunk_state, nv, 512, b, s)(T, nk, nv, dk, dv, u, cd, g, S, U, W, o);
    cu_go(k_gdn_chunk_out, gc, 256, c, s)(T, nk, nv, dk, dv, u, cd, g, U, o);
    return 1;
}

/* On by default at prefill (LILY_CU_GDN_CHUNK=0 gives the staged recurrence), where the tensor-core
 * kernels (cu_gdn_tc.cu) take the shape; the SIMT ones run only when LILY_CU_GDN_CHUNK=1 is set
 * (or LILY_CU_GDN_TC=0 with it). History: the generic kernels passed the kernel test and
 * lily check on the H200 (2026-11-30) but were no faster than the recurrence (SIMT products with
 * 32-way bank conflicts); the tiled ones took 194 us a layer at 512 tokens against the staged
 * recurrence's 146. (On the emulator, with the FP16 GEMM's inputs, the generic ones once drifted
 * on tests/fixtures/tinyq's continuation, rel err 3e-2; with the router and shared-expert gate in
 * fp32 they give 1.1e-3.) */
int cu_gdn_chunk_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_GDN_CHUNK", 1);
}
