/* The chunked gated delta rule for dk = 128 with its products on the tensor cores (TF32 mma,
 * each operand split in two for fp32 accuracy), two launches where cu_gdn_chunk.cu's tiled
 * form takes three. Same algebra (chunks of 64 tokens, cu_gdn_chunk.cu's comment):
 *   prep (chunks x heads, in parallel): A = strict_lower(beta_i k_i.k_j e^(G_i-G_j)) and
 *     P = lower(q_i.k_j e^(G_i-G_j)) on mma; (I + A)^-1 by 16 x 16 blocks; [U | W] =
 *     (I + A)^-1 [beta V | beta e^G K] on mma; U, W and P to scratch;
 *   state (heads x 32 columns, chunks in order): Vn = U - W S and O = e^G Q S on mma, then
 *     S = e^(G_last) S + (e^(G_last-G) K)^T Vn and O += P Vn on mma. The state lives in the
 *     warps' accumulators for the whole prompt and in shared memory, split, for the next chunk's
 *     products; the intra-chunk part of O (the tiled form's third launch) rides along here, as P
 *     Vn needs only this block's columns of Vn.
 * Why: the recurrence (cu_gdn_staged.cu) is 3 x 128 x 128 MACs a token and head on SIMT, bound by
 * issue (146 us a layer at 512 tokens on the H200), and the tiled chunked form has as many
 * products, also on SIMT (194 us). An m16n8k8 TF32 mma does 1,024 MACs in one instruction; the
 * split (hi = x's top 19 bits, lo = x - hi, three mma: lo hi, hi lo, hi hi) keeps ~22 bits, so
 * the result matches the fp32 kernels to rounding (1e-6 against the CPU's recurrence).
 * Shared-memory pitches (in 4-byte words) put a fragment's 32 loads in 32 banks: A fragments
 * read rows g and columns q (pitch = 4 mod 32), B fragments rows q and columns g (pitch = 8). */
#include "cuda/cu_dev.h"

#define TQ_P 132 /* q, k, W, v rows (fp32, 128 wide) read as A fragments, or k as B (rows g) */
#define TQ_S 40  /* the state's and Vn's 32 columns, split, read as B (rows q) */
#define TQ_K 136 /* k in the state kernel (read as A = K'^T) and v in the prep (read as B): rows q */
#define TQ_A 68  /* A and P (64 wide) read as A fragments */

/* inclusive prefix sums of g over a chunk into sG[64] (past C: the chunk's total), by one warp */
__device__ __forceinline__ void tq_g(const float *g, int nv, int h, int t0, int C, float *sG) {
    const int l = threadIdx.x & 31;
    const float a = 2 * l < C ? g[(size_t)(t0 + 2 * l) * nv + h] : 0.f, b = 2 * l + 1 < C ? g[(size_t)(t0 + 2 * l + 1) * nv + h] : 0.f;
    float s = a + b;
#pragma unroll
    for (int m = 1; m < 32; m <<= 1) {
        const float o = __shfl_up_sync(0xffffffffu, s, m);
        if (l >= m) s += o;
    }
    sG[2 * l] = s - b;
    sG[2 * l + 1] = s;
}

/* rows 0 .. C-1 of an NC-wide slice of a row-major source (row pitch ld) into X (pitch p) by
 * cp.async from NT threads, zeros in rows C .. 63: a thread's copies are one column of 16 bytes,
 * NT / (NC / 4) rows apart, so its addresses step by constants (a chunk's staging had been a third
 * of the state kernel's instructions, as a generic loop's divisions and 64-bit products) */
template <int NT, int NC>
__device__ __forceinline__ void tq_rows(float *X, int p, const float *src, size_t ld, int C) {
    constexpr int n4 = NC / 4, rs = NT / n4;
    static_assert(NT % n4 == 0 && 64 % rs == 0, "tq_rows: whole rows a pass");
    const int c4 = threadIdx.x % n4, i0 = threadIdx.x / n4;
    const float *sp = src + (size_t)i0 * ld + 4 * c4;
    float *dp = X + i0 * p + 4 * c4;
#pragma unroll
    for (int r = 0; r < 64 / rs; r++) {
        if (i0 + r * rs < C) cu_cp<16>(dp + r * rs * p, sp + (size_t)r * rs * ld);
        else *(float4 *)(dp + r * rs * p) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
}
/* the same for a width known at run time (v's dv columns in the prep, unless 128) */
template <int NT>
__device__ __forceinline__ void tq_rows_n(float *X, int p, const float *src, size_t ld, int C, int ncols) {
    const int n4 = ncols / 4;
    for (int x = threadIdx.x; x < 64 * n4; x += NT) {
        const int i = x / n4, c4 = x % n4;
        if (i < C) cu_cp<16>(&X[i * p + 4 * c4], src + (size_t)i * ld + 4 * c4);
        else *(float4 *)&X[i * p + 4 * c4] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

/* an A fragment (rows r0 + g, r0 + g + 8; columns k0 + q, k0 + q + 4) of row-major X, split */
__device__ __forceinline__ void tq_afrag(const float *X, int p, int r0, int k0, uint32_t (&h)[4], uint32_t (&l)[4]) {
    const int g = (threadIdx.x & 31) >> 2, q = threadIdx.x & 3;
    const float *x = X + (r0 + g) * p + k0 + q;
    cu_tf32_split(x[0], h[0], l[0]);
    cu_tf32_split(x[8 * p], h[1], l[1]);
    cu_tf32_split(x[4], h[2], l[2]);
    cu_tf32_split(x[8 * p + 4], h[3], l[3]);
}

/* the B fragments (rows k0 + q, k0 + q + 4; columns c0 + 8n + g) of N 8-column tiles of a split
 * matrix in shared memory (hi, lo; pitch TQ_S) */
template <int N>
__device__ __forceinline__ void tq_bfrag(const uint32_t *hi, const uint32_t *lo, int k0, int c0, uint32_t (&bh)[N][2],
                                         uint32_t (&bl)[N][2]) {
    const int g = (threadIdx.x & 31) >> 2, q = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < N; n++) {
        const int b0 = (k0 + q) * TQ_S + c0 + 8 * n + g, b1 = b0 + 4 * TQ_S;
        bh[n][0] = hi[b0]; bh[n][1] = hi[b1]; bl[n][0] = lo[b0]; bl[n][1] = lo[b1];
    }
}

/* 256 threads, a block a chunk and head, 104 KB of shared memory (two blocks an SM). Phases, a
 * barrier or more apart:
 *   A = beta_i k_i.k_j e^(G_i - G_j) (j < i) and P = q_i.k_j e^(G_i - G_j) (j <= i) on mma, one
 *   pass over k for both (they share the B fragments);
 *   M = (I + A)^-1 by 16 x 16 blocks: the diagonal blocks' inverses D_i by substitution (a column
 *   a thread, 16 rows: 64 threads), then M_ij = -D_i sum_{j<=k<i} A_ik M_kj a block diagonal at a
 *   time (three levels, SIMT; the partial sums sit in A's unused upper blocks), while v lands in
 *   q's place;
 *   [U | W] = M [beta V | beta e^G K] on mma (M is lower: a row tile's products stop at its
 *   diagonal). */
__global__ void __launch_bounds__(256, 2) k_tq_prep(int T, int nk, int nv, int dv, const float *__restrict__ u, int cd,
                                                    const float *__restrict__ g, const float *__restrict__ beta,
                                                    float *__restrict__ U, float *__restrict__ W, float *__restrict__ P) {
    CU_PDL();
    extern __shared__ __align__(16) float sm[];
    float *sK = sm;                  /* [64][TQ_P] k */
    float *sQ = sK + 64 * TQ_P;      /* [64][TQ_P] q, then [64][TQ_K] v (dv <= 128 columns, read as B: rows q) */
    float *sA = sQ + 64 * TQ_K;      /* [64][TQ_A] A, strictly lower; upper blocks: partial sums */
    float *sM = sA + 64 * TQ_A;      /* [64][TQ_A] M, lower with a unit diagonal (upper blocks unset) */
    float *sG = sM + 64 * TQ_A, *sB = sG + 64, *sE = sB + 64; /* G, beta, beta e^G */
    const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, w = tid >> 5, g8 = (tid & 31) >> 2, q = tid & 3;
    const int t0 = c * 64, C = T - t0 < 64 ? T - t0 : 64;
    const int kh = h / (nv / nk), kd = nk * 128;
    tq_rows<256, 128>(sK, TQ_P, u + (size_t)t0 * cd + kd + kh * 128, cd, C);
    tq_rows<256, 128>(sQ, TQ_P, u + (size_t)t0 * cd + kh * 128, cd, C);
    cu_cp_commit();
    if (w == 0) tq_g(g, nv, h, t0, C, sG);
    if (tid < 64) sB[tid] = tid < C ? beta[(size_t)(t0 + tid) * nv + h] : 0.f;
    cu_cp_wait<0>();
    __syncthreads();
    if (tid < 64) sE[tid] = sB[tid] * expf(sG[tid]);
    { /* warp w: rows 16 (w / 2).., columns 32 (w % 2).. of A (from k) and P (from q); B = k as rows g */
        const int r0 = 16 * (w >> 1), n0 = 32 * (w & 1);
        const bool pz = n0 > r0 + 15; /* P's tiles all above its diagonal */
        float acc[4][4] = {}, acp[4][4] = {};
        for (int k0 = 0; k0 < 128; k0 += 8) {
            uint32_t ah[4], al[4], bh[4][2], bl[4][2];
#pragma unroll
            for (int n = 0; n < 4; n++) {
                cu_tf32_split(sK[(n0 + 8 * n + g8) * TQ_P + k0 + q], bh[n][0], bl[n][0]);
                cu_tf32_split(sK[(n0 + 8 * n + g8) * TQ_P + k0 + q + 4], bh[n][1], bl[n][1]);
            }
            tq_afrag(sK, TQ_P, r0, k0, ah, al);
            tc_mma_3xtf32<4>(acc, acc, ah, al, bh, bl);
            if (!pz) {
                tq_afrag(sQ, TQ_P, r0, k0, ah, al);
                tc_mma_3xtf32<4>(acp, acp, ah, al, bh, bl);
            }
        }
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int e2 = 0; e2 < 2; e2++) {
                const int i = r0 + g8 + 8 * e2, j = n0 + 8 * n + 2 * q;
                const float d0 = __expf(sG[i] - sG[j]), d1 = __expf(sG[i] - sG[j + 1]);
                sA[i * TQ_A + j] = j < i && i < C ? acc[n][2 * e2] * sB[i] * d0 : 0.f;
                sA[i * TQ_A + j + 1] = j + 1 < i && i < C ? acc[n][2 * e2 + 1] * sB[i] * d1 : 0.f;
                if (i < C)
                    *(float2 *)(P + ((size_t)h * T + t0 + i) * 64 + j) =
                        make_float2(j <= i ? acp[n][2 * e2] * d0 : 0.f, j + 1 <= i ? acp[n][2 * e2 + 1] * d1 : 0.f);
            }
    }
    __syncthreads(); /* A in; q free */
    if (dv == 128) tq_rows<256, 128>(sQ, TQ_K, u + (size_t)t0 * cd + 2 * kd + (size_t)h * dv, cd, C);
    else tq_rows_n<256>(sQ, TQ_K, u + (size_t)t0 * cd + 2 * kd + (size_t)h * dv, cd, C, dv);
    cu_cp_commit();
    if (tid < 64) { /* D_b, column cc: x_r = [r == cc] - sum_{l<r} A[16b + r][16b + l] x_l */
        const int b16 = 16 * (tid >> 4), cc = tid & 15;
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; r++) {
            float a = r == cc ? 1.f : 0.f;
#pragma unroll
            for (int l = 0; l < r; l++) a -= sA[(b16 + r) * TQ_A + b16 + l] * x[l];
            x[r] = a;
        }
#pragma unroll
        for (int r = 0; r < 16; r++) sM[(b16 + r) * TQ_A + b16 + cc] = x[r];
    }
    __syncthreads();
    for (int L = 1; L < 4; L++) { /* blocks (i, j = i - L) */
        for (int e = tid; e < (4 - L) * 256; e += 256) { /* partial sums into A's upper block (j, i) */
            const int j = e >> 8, i = j + L, r = (e >> 4) & 15, cc = e & 15;
            float a = 0.f;
            for (int k = j; k < i; k++)
#pragma unroll
                for (int l = 0; l < 16; l++) a += sA[(16 * i + r) * TQ_A + 16 * k + l] * sM[(16 * k + l) * TQ_A + 16 * j + cc];
            sA[(16 * j + r) * TQ_A + 16 * i + cc] = a;
        }
        __syncthreads();
        for (int e = tid; e < (4 - L) * 256; e += 256) { /* M_ij = -D_i (the sums) */
            const int j = e >> 8, i = j + L, r = (e >> 4) & 15, cc = e & 15;
            float a = 0.f;
#pragma unroll
            for (int l = 0; l < 16; l++) a -= sM[(16 * i + r) * TQ_A + 16 * i + l] * sA[(16 * j + l) * TQ_A + 16 * i + cc];
            sM[(16 * i + r) * TQ_A + 16 * j + cc] = a;
        }
        __syncthreads();
    }
    cu_cp_wait<0>();
    __syncthreads(); /* v in */
    { /* [U | W] = M R: warp w, row tiles p = w % 2 and 3 - p (M is lower, so a row tile's products stop
       * at its diagonal: the pair is 10 k steps for every warp), 8-column tiles 8 (w / 2) .. + 7 */
        const float *sV = sQ;
        const int p = w & 1, rlo = 16 * p, rhi = 16 * (3 - p), nb = 8 * (w >> 1), ntiles = (dv + 128) / 8;
        float acc[2][8][4] = {}; /* [0]: rows rlo.., [1]: rows rhi.. */
        for (int k0 = 0; k0 < rhi + 16; k0 += 8) {
            uint32_t ah[4], al[4], bh[8][2], bl[8][2];
            const float b0 = sB[k0 + q], b1 = sB[k0 + q + 4], e0 = sE[k0 + q], e1 = sE[k0 + q + 4];
#pragma unroll
            for (int n = 0; n < 8; n++) {
                const int col = 8 * (nb + n) + g8;
                float r0v = 0.f, r1v = 0.f;
                if (nb + n < ntiles) {
                    if (col < dv) { r0v = sV[(k0 + q) * TQ_K + col] * b0; r1v = sV[(k0 + q + 4) * TQ_K + col] * b1; }
                    else { r0v = sK[(k0 + q) * TQ_P + col - dv] * e0; r1v = sK[(k0 + q + 4) * TQ_P + col - dv] * e1; }
                }
                cu_tf32_split(r0v, bh[n][0], bl[n][0]);
                cu_tf32_split(r1v, bh[n][1], bl[n][1]);
            }
            tq_afrag(sM, TQ_A, rhi, k0, ah, al);
            tc_mma_3xtf32<8>(acc[1], acc[1], ah, al, bh, bl);
            if (k0 < rlo + 16) {
                tq_afrag(sM, TQ_A, rlo, k0, ah, al);
                tc_mma_3xtf32<8>(acc[0], acc[0], ah, al, bh, bl);
            }
        }
#pragma unroll
        for (int rt = 0; rt < 2; rt++)
#pragma unroll
            for (int n = 0; n < 8; n++) {
                if (nb + n >= ntiles) continue;
                const int col = 8 * (nb + n) + 2 * q;
#pragma unroll
                for (int e2 = 0; e2 < 2; e2++) {
                    const int i = (rt ? rhi : rlo) + g8 + 8 * e2;
                    if (i >= C) continue;
                    float *dst = col < dv ? U + ((size_t)h * T + t0 + i) * dv + col : W + ((size_t)h * T + t0 + i) * 128 + col - dv;
                    *(float2 *)dst = make_float2(acc[rt][n][2 * e2], acc[rt][n][2 * e2 + 1]);
                }
            }
    }
}

/* A block of 16 warps owns columns j0 .. j0 + 31 of head h's state; warp w holds rows
 * 16 (w / 2) .. + 15 and columns 16 (w % 2) .. + 15 of them in its accumulators. A chunk:
 * [W, q, U of this chunk landed] Vn (warps 0-7) and Q S (warps 8-15), rows 16 ((w / 2) % 4) ..,
 * the same columns, while k and P land; [barrier] the S update (every warp) and O += P Vn
 * (warps 8-15) while the next chunk's W, q and U land. */
__global__ void __launch_bounds__(512) k_tq_state(int T, int nk, int nv, int dv, const float *__restrict__ u, int cd,
                                                  const float *__restrict__ g, float *__restrict__ S, float *__restrict__ U,
                                                  const float *__restrict__ W, const float *__restrict__ P,
                                                  float *__restrict__ o) {
    CU_PDL();
    extern __shared__ __align__(16) float sm[];
    uint32_t *sSh = (uint32_t *)sm;  /* [128][TQ_S] the state's columns, split */
    uint32_t *sSl = sSh + 128 * TQ_S;
    float *sW = (float *)(sSl + 128 * TQ_S); /* [64][TQ_P] W */
    float *sQ = sW + 64 * TQ_P;      /* [64][TQ_P] q */
    float *sU = sQ + 64 * TQ_P;      /* [64][36] U's columns */
    float *sK = sU + 64 * 36;        /* [64][TQ_K] k */
    float *sP = sK + 64 * TQ_K;      /* [64][TQ_A] P */
    uint32_t *sNh = (uint32_t *)(sP + 64 * TQ_A); /* [64][TQ_S] Vn, split */
    uint32_t *sNl = sNh + 64 * TQ_S;
    float *sG = (float *)(sNl + 64 * TQ_S); /* [2][64] */
    float *sF = sG + 128;            /* [64] e^(G_last - G_m), 0 past C */
    float *sX = sF + 64;             /* [64] e^G */
    const int h = blockIdx.x, j0 = blockIdx.y * 32, tid = threadIdx.x, w = tid >> 5, g8 = (tid & 31) >> 2, q = tid & 3;
    const int kh = h / (nv / nk), kd = nk * 128;
    const int rs = 16 * (w >> 1), c0 = 16 * (w & 1), ro = 16 * ((w >> 1) & 3); /* S rows, columns; Vn/O rows */
    const bool iso = w >= 8;
    float *Sh = S + (size_t)h * 128 * dv + j0;
    float acc[2][4]; /* S rows rs + g8 (+ 8), columns c0 + 8nt + 2q (+ 1) */
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = rs + g8 + 8 * (e >> 1), cc = c0 + 8 * nt + 2 * q + (e & 1);
            acc[nt][e] = Sh[(size_t)r * dv + cc];
            cu_tf32_split(acc[nt][e], sSh[r * TQ_S + cc], sSl[r * TQ_S + cc]);
        }
    auto issue_wqu = [&](int t0) {
        const int C = T - t0 < 64 ? T - t0 : 64;
        tq_rows<512, 128>(sW, TQ_P, W + ((size_t)h * T + t0) * 128, 128, C);
        tq_rows<512, 128>(sQ, TQ_P, u + (size_t)t0 * cd + kh * 128, cd, C);
        tq_rows<512, 32>(sU, 36, U + ((size_t)h * T + t0) * dv + j0, dv, C);
        cu_cp_commit();
    };
    issue_wqu(0);
    if (w == 15) tq_g(g, nv, h, 0, T < 64 ? T : 64, sG);
    for (int t0 = 0, b = 0; t0 < T; t0 += 64, b ^= 1) {
        const int C = T - t0 < 64 ? T - t0 : 64;
        const float *G = sG + 64 * b;
        cu_cp_wait<0>();
        __syncthreads(); /* W, q, U and G in; the last chunk's S update and O are done */
        tq_rows<512, 128>(sK, TQ_K, u + (size_t)t0 * cd + kd + kh * 128, cd, C);
        tq_rows<512, 64>(sP, TQ_A, P + ((size_t)h * T + t0) * 64, 64, C);
        cu_cp_commit();
        const float gl = G[C - 1];
        if (tid < 64) { sF[tid] = tid < C ? __expf(gl - G[tid]) : 0.f; sX[tid] = __expf(G[tid]); }
        if (w == 15 && t0 + 64 < T) tq_g(g, nv, h, t0 + 64, T - t0 - 64 < 64 ? T - t0 - 64 : 64, sG + 64 * (b ^ 1));
        /* Vn = U - W S (warps 0-7) or Q S (8-15) */
        float ao[2][4] = {}, aod[2][4] = {}; /* the products, their small terms */
        for (int k0 = 0; k0 < 128; k0 += 8) {
            uint32_t ah[4], al[4];
            tq_afrag(iso ? sQ : sW, TQ_P, ro, k0, ah, al);
            uint32_t bh[2][2], bl[2][2];
            tq_bfrag<2>(sSh, sSl, k0, c0, bh, bl);
            tc_mma_3xtf32<2>(ao, aod, ah, al, bh, bl);
        }
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) { ao[nt][e] += aod[nt][e]; aod[nt][e] = 0.f; }
        if (!iso) {
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e2 = 0; e2 < 2; e2++) {
                    const int i = ro + g8 + 8 * e2, cc = c0 + 8 * nt + 2 * q;
                    const float2 uv = *(const float2 *)&sU[i * 36 + cc];
                    const float v0 = uv.x - ao[nt][2 * e2], v1 = uv.y - ao[nt][2 * e2 + 1]; /* 0 past C */
                    cu_tf32_split(v0, sNh[i * TQ_S + cc], sNl[i * TQ_S + cc]);
                    cu_tf32_split(v1, sNh[i * TQ_S + cc + 1], sNl[i * TQ_S + cc + 1]);
                }
        }
        cu_cp_wait<0>();
        __syncthreads(); /* Vn, k, P, sF and sX in; W, q and U free */
        if (t0 + 64 < T) issue_wqu(t0 + 64);
        if (iso) /* O = e^G Q S so far */
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float eg = sX[ro + g8 + 8 * (e >> 1)];
#pragma unroll
                for (int nt = 0; nt < 2; nt++) ao[nt][e] *= eg;
            }
        const float el = expf(gl);
        float acd[2][4] = {};
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[nt][e] *= el;
        for (int k0 = 0; k0 < 64; k0 += 8) {
            /* A = (e^(G_last - G_m) k_m)^T: A[e][m] = k[m][e] f[m], rows rs + g8 (+ 8), columns k0 + q (+ 4) */
            uint32_t ah[4], al[4];
            const float f0 = sF[k0 + q], f1 = sF[k0 + q + 4];
            const float *kp = sK + (k0 + q) * TQ_K + rs + g8;
            cu_tf32_split(kp[0] * f0, ah[0], al[0]);
            cu_tf32_split(kp[8] * f0, ah[1], al[1]);
            cu_tf32_split(kp[4 * TQ_K] * f1, ah[2], al[2]);
            cu_tf32_split(kp[4 * TQ_K + 8] * f1, ah[3], al[3]);
            uint32_t ph[4] = {}, pl[4] = {};
            if (iso) tq_afrag(sP, TQ_A, ro, k0, ph, pl);
            uint32_t bh[2][2], bl[2][2];
            tq_bfrag<2>(sNh, sNl, k0, c0, bh, bl);
            tc_mma_3xtf32<2>(acc, acd, ah, al, bh, bl);
            if (iso) tc_mma_3xtf32<2>(ao, aod, ph, pl, bh, bl);
        }
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) { acc[nt][e] += acd[nt][e]; ao[nt][e] += aod[nt][e]; }
        if (iso) {
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e2 = 0; e2 < 2; e2++) {
                    const int i = ro + g8 + 8 * e2;
                    if (i < C)
                        *(float2 *)(o + (size_t)(t0 + i) * nv * dv + (size_t)h * dv + j0 + c0 + 8 * nt + 2 * q) =
                            make_float2(ao[nt][2 * e2], ao[nt][2 * e2 + 1]);
                }
        }
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = rs + g8 + 8 * (e >> 1), cc = c0 + 8 * nt + 2 * q + (e & 1);
                cu_tf32_split(acc[nt][e], sSh[r * TQ_S + cc], sSl[r * TQ_S + cc]);
            }
    }
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) Sh[(size_t)(rs + g8 + 8 * (e >> 1)) * dv + c0 + 8 * nt + 2 * q + (e & 1)] = acc[nt][e];
}

static size_t smem_tq_prep(void) { return sizeof(float) * (64 * TQ_P + 64 * TQ_K + 2 * 64 * TQ_A + 3 * 64); }
static size_t smem_tq_state(void) {
    return sizeof(float) * (2 * 128 * TQ_S + 2 * 64 * TQ_P + 64 * 36 + 64 * TQ_K + 64 * TQ_A + 2 * 64 * TQ_S + 4 * 64);
}

size_t cu_gdn_tc_scratch_floats(int T, int nv) { return (size_t)nv * T * (128 + 128 + 64); }

int cu_gdn_tc(cudaStream_t s, int T, int nk, int nv, int dk, int dv, const float *u, int cd, const float *g, const float *beta,
              float *S, float *o, float *scratch) {
    if (dk != 128 || dv % 32 || dv > 128 || nv % nk || cd % 4 || ((uintptr_t)u & 15) || T < 1) return 0;
    static int attrs = 0; /* 1 set, -1 refused */
    if (!attrs)
        attrs = cudaFuncSetAttribute(k_tq_prep, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_tq_prep()) ||
                        cudaFuncSetAttribute(k_tq_state, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_tq_state())
                    ? -1 : 1;
    if (attrs < 0) { cudaGetLastError(); return 0; }
    float *U = scratch, *W = U + (size_t)nv * T * dv, *P = W + (size_t)nv * T * 128;
    cu_go(k_tq_prep, dim3((T + 63) / 64, nv), 256, smem_tq_prep(), s)(T, nk, nv, dv, u, cd, g, beta, U, W, P);
    cu_go(k_tq_state, dim3(nv, dv / 32), 512, smem_tq_state(), s)(T, nk, nv, dv, u, cd, g, S, U, W, P, o);
    return 1;
}
