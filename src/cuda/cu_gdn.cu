/* The Gated DeltaNet's kernels: the causal conv and gates, the recurrent delta rule (prefill's
 * staged form and decode's fused and split steps) and the gated norm, with their launchers. */
#include "cuda/cu_common.h"
#include "cuda/cu_dev.h"
#include "cuda/cu_kern.h"
#include "cuda/cu_gdn.h"
#include <limits.h>
#include <cuda_fp16.h>
#include <mma.h>
using namespace nvcuda;
#include <math.h>
#include <stdlib.h>

/* ---- Gated DeltaNet ---- */
/* Causal depthwise conv + SiLU: input n < 0 is the carried state's entry n + K - 1. (A thread a
 * channel walking all T tokens in order waited on one load a token: 5 ms of a 512-token prefill;
 * k_conv takes 8.) The state is rewritten by the first token group's blocks, the only ones that
 * read it, after their reads (k_conv_state's launch had done it after). */
__device__ __forceinline__ float conv_in(const float *mixed, const float *state, int cd, int K, int ch, int n) {
    return n >= 0 ? mixed[(size_t)n * cd + ch] : state[(size_t)ch * (K - 1) + n + K - 1];
}
/* A thread a channel and CONV_TT consecutive tokens: the CONV_TT + K - 1 inputs it needs are
 * independent loads issued together, each read once (a thread a token read each input K times,
 * 41 us a layer at 512 tokens on the H200). K <= 8. */
#define CONV_TT 8
/* nnorm > 0: the first nnorm blocks in x are the q and k heads (128 channels each, a block's),
 * which are then l2-normalized per token here (the q heads, the first nnorm / 2, also times
 * 1/sqrt(128)), as k_l2norm_heads would in its own launch. G.g not NULL: one block more in x,
 * which writes the token group's gates (k_gbeta's, a launch fewer). */
__device__ __forceinline__ void gbeta_one(const cu_gates &G, int i) {
    const int h = i % G.nv;
    G.beta[i] = sigm_f(G.bb[i]);
    G.g[i] = gdn_g(G.aa[i] + G.dt_bias[h], G.A_log[h]);
}
__global__ void k_conv(const float *mixed, float *state, const float *w, int cd, int K, int T, float *u, int nnorm, cu_gates G) {
    CU_PDL();
    int ch = blockIdx.x * blockDim.x + threadIdx.x, t0 = blockIdx.y * CONV_TT;
    const bool norm = (int)blockIdx.x < nnorm; /* (block-uniform, with cd % 128 == 0 then) */
    if (G.g && blockIdx.x == gridDim.x - 1) {
        const int n = (T - t0 < CONV_TT ? T - t0 : CONV_TT) * G.nv;
        for (int i = threadIdx.x; i < n; i += blockDim.x) gbeta_one(G, t0 * G.nv + i);
        return;
    }
    if (ch >= cd) return;
    float wr[8], x[CONV_TT + 7];
#pragma unroll
    for (int j = 0; j < 8; j++) wr[j] = j < K ? w[(size_t)ch * K + j] : 0.f;
#pragma unroll
    for (int i = 0; i < CONV_TT + 7; i++) {
        const int n = t0 - (K - 1) + i;
        x[i] = i < CONV_TT + K - 1 && n < T ? conv_in(mixed, state, cd, K, ch, n) : 0.f;
    }
    if (blockIdx.y == 0) { /* the last K - 1 inputs become the state (old entries too where T < K - 1) */
        float h[7];
#pragma unroll
        for (int j = 0; j < 7; j++) h[j] = j < K - 1 ? conv_in(mixed, state, cd, K, ch, T - (K - 1) + j) : 0.f;
#pragma unroll
        for (int j = 0; j < 7; j++)
            if (j < K - 1) state[(size_t)ch * (K - 1) + j] = h[j];
    }
    float y[CONV_TT];
#pragma unroll
    for (int tt = 0; tt < CONV_TT; tt++) {
        float s = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) if (j < K) s += wr[j] * x[tt + j];
        y[tt] = silu_fast(s); /* (the IEEE division's slow path was a third of this kernel's instructions) */
    }
    if (norm) {
        __shared__ float part[CONV_TT][4];
        const int lane = threadIdx.x % 32, wp = threadIdx.x / 32;
#pragma unroll
        for (int tt = 0; tt < CONV_TT; tt++) {
            const float v = warp_sum(y[tt] * y[tt]);
            if (lane == 0) part[tt][wp] = v;
        }
        __syncthreads();
        const float sc = (int)blockIdx.x < nnorm / 2 ? 1.0f / sqrtf(128.0f) : 1.0f;
#pragma unroll
        for (int tt = 0; tt < CONV_TT; tt++) y[tt] *= 1.0f / sqrtf(((part[tt][0] + part[tt][1]) + (part[tt][2] + part[tt][3])) + 1e-6f) * sc;
    }
#pragma unroll
    for (int tt = 0; tt < CONV_TT; tt++)
        if (t0 + tt < T) u[(size_t)(t0 + tt) * cd + ch] = y[tt];
}
int cu_conv(cudaStream_t s, const float *mixed, float *state, const float *w, int cd, int K, int T, float *u, int nk, int dk,
            const cu_gates *G) {
    LILY_ASSERT(K >= 1 && K <= 8);
    const int nnorm = dk == 128 && cd % 128 == 0 && 2 * nk * dk <= cd ? 2 * nk : 0;
    cu_gates none;
    memset(&none, 0, sizeof none);
    cu_go(k_conv, dim3((cd + 127) / 128 + (G ? 1 : 0), (T + CONV_TT - 1) / CONV_TT), 128, 0, s)(mixed, state, w, cd, K, T, u, nnorm,
                                                                                                G ? *G : none);
    return nnorm > 0;
}

__global__ void k_l2norm_heads(float *u, int cd, int nk, int dk) {
    CU_PDL();
    __shared__ float sh[32];
    int t = blockIdx.x, hh = blockIdx.y;
    float *v = u + (size_t)t * cd + (size_t)hh * dk;
    float ss = 0;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) ss += v[i] * v[i];
    ss = block_sum(ss, sh);
    float r = 1.0f / sqrtf(ss + 1e-6f) * (hh < nk ? 1.0f / sqrtf((float)dk) : 1.0f);
    for (int i = threadIdx.x; i < dk; i += blockDim.x) v[i] *= r;
}
__global__ void k_gbeta(const float *bb, const float *aa, const float *A_log, const float *dt_bias, int n, int nv,
                        float *g, float *beta) {
    CU_PDL();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const cu_gates G = { bb, aa, A_log, dt_bias, nv, g, beta };
    gbeta_one(G, i);
}
void cu_l2norm_heads(cudaStream_t s, float *u, int T, int cd, int nk, int dk) {
    cu_go(k_l2norm_heads, dim3(T, 2 * nk), 128, 0, s)(u, cd, nk, dk);
}

void cu_gdn_prep(cudaStream_t s, float *u, int T, int cd, int nk, int dk, const float *bb, const float *aa,
                 const float *A_log, const float *dt_bias, int nv, float *g, float *beta, int normed) {
    if (!normed) cu_l2norm_heads(s, u, T, cd, nk, dk);
    if (!bb) return; /* (the gates written by cu_conv) */
    int n = T * nv;
    cu_go(k_gbeta, (n + 255) / 256, 256, 0, s)(bb, aa, A_log, dt_bias, n, nv, g, beta);
}

/* Decode (T = 1) in one launch: blocks [0, 2nk) do conv + SiLU + L2 norm of one q/k head,
 * the next ones conv + SiLU of 128 value channels, the last one g and beta. */
__global__ void k_gdn_prep1(const float *mixed, float *state, const float *w, int K, int nk, int dk, int vd,
                            const float *bb, const float *aa, const float *A_log, const float *dt_bias, int nv,
                            float *u, float *g, float *beta, cu_rows R) {
    CU_PDL();
    __shared__ float sh[32];
    int b = blockIdx.x, kd = nk * dk, nvb = (vd + 127) / 128;
    if (R.pos) { /* decode batch: row blockIdx.y, its session's conv state */
        int row = blockIdx.y;
        size_t cdt = (size_t)2 * kd + vd;
        state = R.conv[row] + R.conv_off;
        mixed += row * cdt; u += row * cdt;
        bb += (size_t)row * nv; aa += (size_t)row * nv; g += (size_t)row * nv; beta += (size_t)row * nv;
    }
    if (b == 2 * nk + nvb) {
        for (int h = threadIdx.x; h < nv; h += blockDim.x) {
            beta[h] = sigm_f(bb[h]);
            g[h] = gdn_g(aa[h] + dt_bias[h], A_log[h]);
        }
        return;
    }
    int c0, n;
    if (b < 2 * nk) { c0 = b * dk; n = dk; }
    else { c0 = 2 * kd + (b - 2 * nk) * 128; n = min(128, 2 * kd + vd - c0); }
    float ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        int ch = c0 + i;
        float *cs = state + (size_t)ch * (K - 1);
        const float *wr = w + (size_t)ch * K;
        float in = mixed[ch], acc = 0;
        for (int j = 0; j < K - 1; j++) acc += wr[j] * cs[j];
        acc += wr[K - 1] * in;
        for (int j = 0; j + 1 < K - 1; j++) cs[j] = cs[j + 1];
        if (K > 1) cs[K - 2] = in;
        float v = silu_f(acc);
        u[ch] = v;
        ss += v * v;
    }
    if (b >= 2 * nk) return;
    ss = block_sum(ss, sh);
    float r = 1.0f / sqrtf(ss + 1e-6f) * (b < nk ? 1.0f / sqrtf((float)dk) : 1.0f);
    for (int i = threadIdx.x; i < n; i += blockDim.x) u[c0 + i] *= r;
}
void cu_gdn_prep1(cudaStream_t s, const float *mixed, float *state, const float *w, int K, int nk, int dk, int vd,
                  const float *bb, const float *aa, const float *A_log, const float *dt_bias, int nv,
                  float *u, float *g, float *beta) {
    int nb = 2 * nk + (vd + 127) / 128 + 1;
    cu_rows none;
    memset(&none, 0, sizeof none);
    cu_go(k_gdn_prep1, nb, 128, 0, s)(mixed, state, w, K, nk, dk, vd, bb, aa, A_log, dt_bias, nv, u, g, beta, none);
}
void cu_gdn_prep1_rows(cudaStream_t s, const cu_rows *R, int n, const float *mixed, const float *w, int K, int nk, int dk,
                       int vd, const float *bb, const float *aa, const float *A_log, const float *dt_bias, int nv,
                       float *u, float *g, float *beta) {
    dim3 nb(2 * nk + (vd + 127) / 128 + 1, n);
    cu_go(k_gdn_prep1, nb, 128, 0, s)(mixed, NULL, w, K, nk, dk, vd, bb, aa, A_log, dt_bias, nv, u, g, beta, *R);
}

/* One block per value head. Fast form (dk = 128): four threads per state column j, each
 * holding 32 rows of column j of S in registers; the generic form keeps S in global memory
 * with one thread per column. */
__global__ void __launch_bounds__(512) k_gdn_rec128(int T, int nk, int nv, int dv, const float *u, int cd, const float *g,
                                                     const float *beta, float *S, float *o, const float *z,
                                                     const float *gw, float eps, cu_rows R) {
    __shared__ float qkb[2][256], red[16]; /* q | k of a step, double-buffered */
    const int dk = 128;
    int h = blockIdx.x, j = threadIdx.x / 4, p = threadIdx.x % 4, kh = h / (nv / nk), kd = nk * dk;
    /* One session's S is loaded before the wait on the predecessor: only this kernel of its layer
     * writes it, and its last write was a launch at least two back (the previous token's graph,
     * or an earlier chunk's kernel, which finished before the predecessor passed its own wait:
     * CU_PDL waits before it lets a successor start). Its 64 KB a block then arrive while the
     * predecessor finishes. (A batch's S pointers are read after the wait, as before.) */
    float *Sh = S ? S + (size_t)h * dk * dv : NULL;
    float sr[32];
    if (!R.pos) {
#pragma unroll
        for (int i = 0; i < 32; i++) sr[i] = Sh[(size_t)(p * 32 + i) * dv + j];
    }
    const float gwj = z ? gw[j] : 0.f;
    CU_PDL();
    if (R.pos) { /* decode batch (T = 1): row blockIdx.y, its session's S */
        int row = blockIdx.y;
        S = R.S[row] + R.S_off;
        u += (size_t)row * cd; g += (size_t)row * nv; beta += (size_t)row * nv; o += (size_t)row * nv * dv;
        if (z) z += (size_t)row * nv * dv;
        Sh = S + (size_t)h * dk * dv;
#pragma unroll
        for (int i = 0; i < 32; i++) sr[i] = Sh[(size_t)(p * 32 + i) * dv + j];
    }
    /* thread i < 256 carries element i of the next step's q | k; every thread its v, g, beta */
    int qk_off = threadIdx.x < 128 ? kh * dk + threadIdx.x : kd + kh * dk + (threadIdx.x - 128);
    float nqk = threadIdx.x < 256 ? u[qk_off] : 0.f, nv_j = u[2 * kd + h * dv + j], ng = g[h], nb = beta[h];
    /* the gated norm's z (and, above, its weight) are fetched with the step's other inputs, not
     * after its sums (a dependent L2 round trip at the end of every decode step) */
    float nz = z ? z[(size_t)h * dv + j] : 0.f;
    for (int t = 0; t < T; t++) {
        float *qs = qkb[t & 1], *ks = qkb[t & 1] + 128;
        if (threadIdx.x < 256) qkb[t & 1][threadIdx.x] = nqk;
        float decay = expf(ng), b = nb, vj = nv_j, zj = nz;
        __syncthreads();
        if (t + 1 < T) { /* the next step's loads fly while this one computes */
            const float *nrow = u + (size_t)(t + 1) * cd;
            if (threadIdx.x < 256) nqk = nrow[qk_off];
            nv_j = nrow[2 * kd + h * dv + j];
            ng = g[(size_t)(t + 1) * nv + h];
            nb = beta[(size_t)(t + 1) * nv + h];
            if (z) nz = z[(size_t)(t + 1) * nv * dv + (size_t)h * dv + j];
        }
        const float out = gdn_col_step(sr, qs, ks, p, decay, vj, b);
        size_t oi = (size_t)t * nv * dv + (size_t)h * dv + j;
        if (z) { /* fused gated RMSNorm of the head's dv outputs (each column counted once) */
            float sq = p == 0 ? out * out : 0.f;
            sq = warp_sum(sq);
            if (threadIdx.x % WARP == 0) red[threadIdx.x / WARP] = sq;
            __syncthreads();
            float tot = 0;
            for (int i = 0; i < (int)(blockDim.x / WARP); i++) tot += red[i];
            float r = 1.0f / sqrtf(tot / dv + eps);
            if (p == 0) o[oi] = out * r * gwj * silu_f(zj);
        } else if (p == 0) o[oi] = out;
    }
#pragma unroll
    for (int i = 0; i < 32; i++) Sh[(size_t)(p * 32 + i) * dv + j] = sr[i];
}
__global__ void k_gdn_rec_gen(int T, int nk, int nv, int dk, int dv, const float *u, int cd, const float *g,
                              const float *beta, float *S, float *o, cu_rows R) {
    CU_PDL();
    extern __shared__ float qk[]; /* q[dk], k[dk] */
    if (R.pos) { /* decode batch (T = 1): row blockIdx.y, its session's S */
        int row = blockIdx.y;
        S = R.S[row] + R.S_off;
        u += (size_t)row * cd; g += (size_t)row * nv; beta += (size_t)row * nv; o += (size_t)row * nv * dv;
    }
    int h = blockIdx.x, j = threadIdx.x, kh = h / (nv / nk), kd = nk * dk;
    float *Sh = S + (size_t)h * dk * dv;
    for (int t = 0; t < T; t++) {
        const float *row = u + (size_t)t * cd;
        __syncthreads();
        for (int i = j; i < dk; i += blockDim.x) { qk[i] = row[kh * dk + i]; qk[dk + i] = row[kd + kh * dk + i]; }
        __syncthreads();
        float decay = expf(g[(size_t)t * nv + h]), b = beta[(size_t)t * nv + h];
        float vj = row[2 * kd + h * dv + j];
        float d = 0, out = 0;
        for (int i = 0; i < dk; i++) { float v = Sh[(size_t)i * dv + j] * decay; Sh[(size_t)i * dv + j] = v; d += v * qk[dk + i]; }
        d = (vj - d) * b;
        for (int i = 0; i < dk; i++) { float v = Sh[(size_t)i * dv + j] + qk[dk + i] * d; Sh[(size_t)i * dv + j] = v; out += v * qk[i]; }
        o[(size_t)t * nv * dv + (size_t)h * dv + j] = out;
    }
}
void cu_gdn_rec(cudaStream_t s, int T, int nk, int nv, int dk, int dv, const float *u, int cd,
                const float *g, const float *beta, float *S, float *o) {
    cu_rows none;
    memset(&none, 0, sizeof none);
    if (dk == 128 && dv * 4 <= 512 && dv >= 64) cu_go(k_gdn_rec128, nv, dv * 4, 0, s)(T, nk, nv, dv, u, cd, g, beta, S, o, NULL, NULL, 0.f, none);
    else cu_go(k_gdn_rec_gen, nv, dv, 2 * (size_t)dk * sizeof(float), s)(T, nk, nv, dk, dv, u, cd, g, beta, S, o, none);
}

static int rec_norm_ok(int dk, int dv) { return dk == 128 && dv * 4 <= 512 && dv >= 64 && dv % 8 == 0; }
int cu_gdn_rec_norm(cudaStream_t s, int T, int nk, int nv, int dk, int dv, const float *u, int cd, const float *g,
                    const float *beta, float *S, float *o, const float *z, const float *gw, float eps) {
    if (!rec_norm_ok(dk, dv)) return 0;
    cu_rows none;
    memset(&none, 0, sizeof none);
    cu_go(k_gdn_rec128, nv, dv * 4, 0, s)(T, nk, nv, dv, u, cd, g, beta, S, o, z, gw, eps, none);
    return 1;
}
int cu_gdn_rec_rows(cudaStream_t s, const cu_rows *R, int n, int nk, int nv, int dk, int dv, const float *u, int cd,
                    const float *g, const float *beta, float *o, const float *z, const float *gw, float eps) {
    if (rec_norm_ok(dk, dv)) {
        cu_go(k_gdn_rec128, dim3(nv, n), dv * 4, 0, s)(1, nk, nv, dv, u, cd, g, beta, NULL, o, z, gw, eps, *R);
        return 1;
    }
    if (dk == 128 && dv * 4 <= 512 && dv >= 64)
        cu_go(k_gdn_rec128, dim3(nv, n), dv * 4, 0, s)(1, nk, nv, dv, u, cd, g, beta, NULL, o, NULL, NULL, 0.f, *R);
    else cu_go(k_gdn_rec_gen, dim3(nv, n), dv, 2 * (size_t)dk * sizeof(float), s)(1, nk, nv, dk, dv, u, cd, g, beta, NULL, o, *R);
    return 0;
}

/* Decode's whole DeltaNet step in one launch (k_gdn_prep1's conv + SiLU + q/k norm + gates, then
 * k_gdn_rec128's step and gated norm, for dk = dv = 128): a block a value head h, 512 threads; threads
 * 0-255 take the conv of its key head's q | k channels, 256-383 its own value channels. The value
 * channels' conv state is the block's own; a key head's q | k state is shared by the nv / nk blocks
 * of its value heads, so the last of them to have read it writes it (cnt [nk], 0 between launches:
 * the last one to count resets it). The conv state and S are read before the wait on the
 * predecessor, as k_gdn_rec128 reads S: only this kernel of its layer writes them in decode.
 * One launch a DeltaNet layer fewer: k_gdn_prep1 added ~3.3 us a layer to the decode step's
 * critical path (the decode timeline, bench/RESULTS.md session 18). */
/* A conv channel's state after the step: its K - 1 taps c shifted down one, the new input last
 * (decode's k_gdn_dec128 and k_gdn_dec_split, c read before the wait) */
static __device__ __forceinline__ void gdn_conv_shift(float *state, int ch, int K, const float (&c)[GDN_DEC_KMAX], float in) {
    float *st = state + (size_t)ch * (K - 1);
#pragma unroll
    for (int i = 0; i + 1 < GDN_DEC_KMAX; i++)
        if (i + 1 < K - 1) st[i] = c[i + 1];
    st[K - 2] = in;
}
__global__ void __launch_bounds__(512) k_gdn_dec128(int nk, int nv, int K, const float *__restrict__ mixed, float *state,
                                                     const float *__restrict__ cw, const float *__restrict__ bb, const float *__restrict__ aa,
                                                     const float *__restrict__ A_log, const float *__restrict__ dt_bias, float *S,
                                                     float *__restrict__ o, const float *__restrict__ z, const float *__restrict__ gw,
                                                     float eps, unsigned *cnt) {
    __shared__ float qkb[256], vsh[128], red[16], red2[16];
    __shared__ int last;
    const int dk = 128, dv = 128, tid = threadIdx.x, warp = tid / WARP;
    const int h = blockIdx.x, j = tid / 4, p = tid % 4, ratio = nv / nk, kh = h / ratio, kd = nk * dk;
    const int ch = tid < 128 ? kh * dk + tid : tid < 256 ? kd + kh * dk + (tid - 128) : tid < 384 ? 2 * kd + h * dv + (tid - 256) : -1;
    float *Sh = S + (size_t)h * dk * dv;
    float sr[32], wk[GDN_DEC_KMAX], cs[GDN_DEC_KMAX]; /* (indexed by constants only: registers, not a stack frame) */
#pragma unroll
    for (int i = 0; i < 32; i++) sr[i] = Sh[(size_t)(p * 32 + i) * dv + j];
#pragma unroll
    for (int i = 0; i < GDN_DEC_KMAX; i++) {
        wk[i] = ch >= 0 && i < K - 1 ? cw[(size_t)ch * K + i] : 0.f;
        cs[i] = ch >= 0 && i < K - 1 ? state[(size_t)ch * (K - 1) + i] : 0.f;
    }
    const float wl = ch >= 0 ? cw[(size_t)ch * K + K - 1] : 0.f, gwj = gw[j], alog = A_log[h], dtb = dt_bias[h];
    CU_PDL();
    const float in = ch >= 0 ? mixed[ch] : 0.f, zj = z[(size_t)h * dv + j], bh = bb[h], ah = aa[h];
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < GDN_DEC_KMAX; i++)
        if (i < K - 1) acc += wk[i] * cs[i];
    acc += wl * in;
    const float v = ch >= 0 ? silu_f(acc) : 0.f;
    /* the q and k heads' L2 norms: warps 0-3 hold q, 4-7 k */
    const float ss = warp_sum(v * v);
    if (tid % WARP == 0) red[warp] = ss;
    __syncthreads();
    CU_MARK(0);
    if (tid < 256) {
        const float tot = tid < 128 ? red[0] + red[1] + red[2] + red[3] : red[4] + red[5] + red[6] + red[7];
        qkb[tid] = v * (1.0f / sqrtf(tot + 1e-6f) * (tid < 128 ? 1.0f / sqrtf((float)dk) : 1.0f));
    } else if (tid < 384) vsh[tid - 256] = v;
    if (tid == 0) { /* every thread of the block has read its state (its values are in acc) */
        __threadfence();
        last = atomicAdd(&cnt[kh], 1u) == (unsigned)ratio - 1;
        if (last) cnt[kh] = 0;
    }
    __syncthreads();
    CU_MARK(1);
    if (ch >= 0 && K > 1 && (tid >= 256 || last)) gdn_conv_shift(state, ch, K, cs, in);
    const float beta = sigm_f(bh), decay = expf(gdn_g(ah + dtb, alog)), vj = vsh[j];
    const float out = gdn_col_step(sr, qkb, qkb + 128, p, decay, vj, beta);
    CU_MARK(2);
    float sq = warp_sum(p == 0 ? out * out : 0.f);
    if (tid % WARP == 0) red2[warp] = sq;
    __syncthreads();
    float tot = 0.f;
#pragma unroll
    for (int i = 0; i < 16; i++) tot += red2[i];
    if (p == 0) o[(size_t)h * dv + j] = out * (1.0f / sqrtf(tot / dv + eps)) * gwj * silu_f(zj);
#pragma unroll
    for (int i = 0; i < 32; i++) Sh[(size_t)(p * 32 + i) * dv + j] = sr[i];
}
int cu_gdn_dec_ok(int nk, int nv, int dk, int dv, int K) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_GDN_DEC", 1) && dk == 128 && dv == 128 && K >= 1 && K <= GDN_DEC_KMAX && nk >= 1 &&
           nk <= GDN_DEC_CNT && nv % nk == 0;
}
int cu_gdn_dec(cudaStream_t s, int nk, int nv, int dk, int dv, int K, const float *mixed, float *state, const float *cw,
               const float *bb, const float *aa, const float *A_log, const float *dt_bias, float *S, float *o, const float *z,
               const float *gw, float eps, unsigned *cnt) {
    if (!cu_gdn_dec_ok(nk, nv, dk, dv, K) || !z || !gw || !cnt) return 0;
    cu_go(k_gdn_dec128, nv, 512, 0, s)(nk, nv, K, mixed, state, cw, bb, aa, A_log, dt_bias, S, o, z, gw, eps, cnt);
    return 1;
}

/* The same step split four ways a value head (k_gdn_dec_split): block (h, sp) takes columns
 * 32 sp .. 32 sp + 31 of head h's S, 128 threads. Why: k_gdn_dec128's 32 blocks each wait on 64 KB of S
 * from one SM; the decode timeline (bench/RESULTS.md session 21) put ~4.5 us of a layer's path on
 * that wait, in the column step that first uses S. Here 128 SMs take 16 KB each. What a quarter
 * block cannot do alone is the gated norm (the head's sum of squares spans four blocks): o is
 * written before it, and the out-projection's staging applies it (mvq_fuse.gz, cu_matvec_gated),
 * or k_gated_norm128 does where that launch declines. Every block computes its key head's q and
 * k conv (a channel a thread) and its own 32 value channels; the shared q | k conv state is
 * written by the last of the key head's nv / nk x 4 blocks to count (cnt [nk], 0 between
 * launches), whose count goes out before the column step and is read after it. q and k sit in
 * shared memory at a 36-float stride a thread's part (gdn_col_step<36>: no bank conflicts).
 * On the H200 (session 21): 4.6 us on a layer's path and the gated norm's launch 1.9, against
 * k_gdn_dec128's 7.3: tg128 526.8 -> 534.3 against LILY_CU_GDN_SPLIT=0 (k_gdn_dec128) in one call, 538 with
 * the norm in the out-projection's staging and the shared-memory pad below. */
#define GDN_SPLIT 4
/* ROWS: a decode batch's instance (R), apart so that one token's code is as it was before batches took it */
template <bool ROWS>
__global__ void __launch_bounds__(128) k_gdn_dec_split(int nk, int nv, int K, const float *__restrict__ mixed, float *state,
                                                       const float *__restrict__ cw, const float *__restrict__ bb,
                                                       const float *__restrict__ aa, const float *__restrict__ A_log,
                                                       const float *__restrict__ dt_bias, float *S, float *__restrict__ o, unsigned *cnt, cu_rows R) {
    __shared__ float qs[4 * 36], ks[4 * 36], vsh[32], red[8];
    __shared__ int last;
    const int dk = 128, dv = 128, tid = threadIdx.x, warp = tid / WARP;
    const int h = blockIdx.x, sp = blockIdx.y, j = tid / 4, p = tid % 4, jj = sp * 32 + j;
    const int ratio = nv / nk, kh = h / ratio, kd = nk * dk;
    if (ROWS) { /* a decode batch: row blockIdx.z on its session's conv state and S, read before the wait
                  * as one session's are (the table was copied before the pass's first launch; the state's
                  * last writer is this layer's step of the previous round) */
        const int row = blockIdx.z;
        state = R.conv[row] + R.conv_off;
        S = R.S[row] + R.S_off;
        mixed += (size_t)row * (2 * kd + nv * dv);
        bb += (size_t)row * nv; aa += (size_t)row * nv;
        o += (size_t)row * nv * dv;
        cnt += (size_t)row * GDN_DEC_CNT;
    }
    const int cq = kh * dk + tid, ck = kd + kh * dk + tid, cv = tid < 32 ? 2 * kd + h * dv + sp * 32 + tid : -1;
    float *Sh = S + (size_t)h * dk * dv;
    /* (indexed by constants only: registers, not a stack frame) */
    float sr[32], wq[GDN_DEC_KMAX], wk[GDN_DEC_KMAX], wv[GDN_DEC_KMAX], sq[GDN_DEC_KMAX], sk[GDN_DEC_KMAX], sv[GDN_DEC_KMAX];
#pragma unroll
    for (int i = 0; i < 32; i++) sr[i] = Sh[(size_t)(p * 32 + i) * dv + jj];
#pragma unroll
    for (int i = 0; i < GDN_DEC_KMAX; i++) {
        const bool in = i < K - 1;
        wq[i] = in ? cw[(size_t)cq * K + i] : 0.f;
        sq[i] = in ? state[(size_t)cq * (K - 1) + i] : 0.f;
        wk[i] = in ? cw[(size_t)ck * K + i] : 0.f;
        sk[i] = in ? state[(size_t)ck * (K - 1) + i] : 0.f;
        wv[i] = in && cv >= 0 ? cw[(size_t)cv * K + i] : 0.f;
        sv[i] = in && cv >= 0 ? state[(size_t)cv * (K - 1) + i] : 0.f;
    }
    const float wlq = cw[(size_t)cq * K + K - 1], wlk = cw[(size_t)ck * K + K - 1], wlv = cv >= 0 ? cw[(size_t)cv * K + K - 1] : 0.f;
    const float alog = A_log[h], dtb = dt_bias[h];
    CU_PDL();
    const float iq = mixed[cq], ik = mixed[ck], iv = cv >= 0 ? mixed[cv] : 0.f, bh = bb[h], ah = aa[h];
    float aq = 0.f, ak = 0.f, av = 0.f;
#pragma unroll
    for (int i = 0; i < GDN_DEC_KMAX; i++)
        if (i < K - 1) {
            aq += wq[i] * sq[i];
            ak += wk[i] * sk[i];
            av += wv[i] * sv[i];
        }
    aq += wlq * iq;
    ak += wlk * ik;
    av += wlv * iv;
    const float vq = silu_f(aq), vk = silu_f(ak), vv = cv >= 0 ? silu_f(av) : 0.f;
    const float ssq = warp_sum(vq * vq), ssk = warp_sum(vk * vk);
    if (tid % WARP == 0) {
        red[warp] = ssq;
        red[4 + warp] = ssk;
    }
    __syncthreads();
    unsigned ticket = 0;
    if (tid == 0) { /* every thread of the block has read its conv state (its values are in aq, ak) */
        __threadfence();
        ticket = atomicAdd(&cnt[kh], 1u);
    }
    const float tq = (red[0] + red[1]) + (red[2] + red[3]), tk = (red[4] + red[5]) + (red[6] + red[7]);
    const int pi = (tid / 32) * 36 + tid % 32;
    qs[pi] = vq * (1.0f / sqrtf(tq + 1e-6f) * (1.0f / sqrtf((float)dk)));
    ks[pi] = vk * (1.0f / sqrtf(tk + 1e-6f));
    if (cv >= 0) vsh[tid] = vv;
    __syncthreads();
    const float beta = sigm_f(bh), decay = expf(gdn_g(ah + dtb, alog));
    const float out = gdn_col_step<36>(sr, qs, ks, p, decay, vsh[j], beta);
    if (p == 0) o[(size_t)h * dv + jj] = out;
#pragma unroll
    for (int i = 0; i < 32; i++) Sh[(size_t)(p * 32 + i) * dv + jj] = sr[i];
    if (cv >= 0 && K > 1) gdn_conv_shift(state, cv, K, sv, iv); /* the block's own value channels */
    if (tid == 0) {
        last = ticket == (unsigned)(ratio * GDN_SPLIT) - 1;
        if (last) cnt[kh] = 0;
    }
    __syncthreads();
    if (last && K > 1) {
        gdn_conv_shift(state, cq, K, sq, iq);
        gdn_conv_shift(state, ck, K, sk, ik);
    }
}
int cu_gdn_dec_split(cudaStream_t s, int nk, int nv, int dk, int dv, int K, const float *mixed, float *state, const float *cw,
                     const float *bb, const float *aa, const float *A_log, const float *dt_bias, float *S, float *o, unsigned *cnt) {
    static int on = -1, pad = INT_MIN;
    if (!cu_env_flag(&on, "LILY_CU_GDN_SPLIT", 1) || !cu_gdn_dec_ok(nk, nv, dk, dv, K) || !cnt) return 0;
    /* 60,000 bytes of shared memory a block that it does not use: at most three blocks an SM, where the
     * scheduler otherwise packed the 128 onto the ~40 SMs the in-projection had left free (tg128 +0.3-0.5%
     * on the H200, 30,000 -0.4%, bench/RESULTS.md session 21); LILY_CU_GDN_SPLIT_SMEM=BYTES, for measuring */
    cu_env_int(&pad, "LILY_CU_GDN_SPLIT_SMEM", 60000);
    static int opted = 0;
    const size_t sm = pad > 0 && pad <= 160 * 1024 ? (size_t)pad : 0;
    if (sm > 48 * 1024 && !opted)
        opted = cudaFuncSetAttribute(k_gdn_dec_split<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024) == cudaSuccess;
    cu_rows nr;
    memset(&nr, 0, sizeof nr);
    cu_go(k_gdn_dec_split<false>, dim3(nv, GDN_SPLIT), 128, sm, s)(nk, nv, K, mixed, state, cw, bb, aa, A_log, dt_bias, S, o, cnt, nr);
    return 1;
}
/* A decode batch's rows in one launch (grid z the row), where k_gdn_rec128 ran 32 blocks a row with 64
 * KB of S each and k_gdn_prep1 a launch before it (0.60 ms of an 8-row round, session 27's profile):
 * here 128 blocks a row of 16 KB, the conv in the same launch. */
int cu_gdn_dec_split_rows(cudaStream_t s, const cu_rows *R, int n, int nk, int nv, int dk, int dv, int K, const float *mixed,
                          const float *cw, const float *bb, const float *aa, const float *A_log, const float *dt_bias, float *o,
                          unsigned *cnt) {
    static int on = -1, sp = -1;
    if (!cu_env_flag(&on, "LILY_CU_GDN_SPLIT_ROWS", 1) || !cu_env_flag(&sp, "LILY_CU_GDN_SPLIT", 1) || !cu_gdn_dec_ok(nk, nv, dk, dv, K) ||
        !cnt || !R || !R->pos || n < 1 || n > GDN_DEC_ROWS)
        return 0;
    cu_go(k_gdn_dec_split<true>, dim3(nv, GDN_SPLIT, n), 128, 0, s)(nk, nv, K, mixed, NULL, cw, bb, aa, A_log, dt_bias, NULL, o, cnt, *R);
    return 1;
}

__global__ void k_gated_norm(float *o, const float *z, const float *gw, int nv, int dv, float eps) {
    CU_PDL();
    __shared__ float sh[32];
    int t = blockIdx.x / nv, h = blockIdx.x % nv;
    float *oh = o + (size_t)t * nv * dv + (size_t)h * dv;
    const float *zh = z + (size_t)t * nv * dv + (size_t)h * dv;
    float ss = 0;
    for (int i = threadIdx.x; i < dv; i += blockDim.x) ss += oh[i] * oh[i];
    ss = block_sum(ss, sh);
    float r = 1.0f / sqrtf(ss / dv + eps);
    for (int i = threadIdx.x; i < dv; i += blockDim.x) oh[i] = oh[i] * r * gw[i] * silu_f(zh[i]);
}
/* The same with a warp a (token, head) for dv = 128, four elements a lane (a block of 128 threads
 * a head and token with a block-wide sum ran at latency: 22 us a layer at 512 tokens). */
/* op not NULL: o also packed (xp_chunk): (token, head) i is the row's 128-column step i % nv,
 * lane l holds its columns 4l..4l+3, so lanes 2m and 2m + 1 hold chunk 4 (m & 3) + (m >> 2) */
__global__ void k_gated_norm128(float *o, const float *z, const float *gw, int n, float eps, uint4 *op) {
    CU_PDL();
    const int i = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (i >= n) return;
    float4 *oh = (float4 *)(o + (size_t)i * 128);
    const float4 v = oh[lane], zz = ((const float4 *)(z + (size_t)i * 128))[lane], w = ((const float4 *)gw)[lane];
    const float ss = warp_sum((v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w));
    const float r = 1.0f / sqrtf(ss / 128 + eps);
    const float4 y = make_float4(v.x * r * w.x * silu_f(zz.x), v.y * r * w.y * silu_f(zz.y), v.z * r * w.z * silu_f(zz.z),
                                 v.w * r * w.w * silu_f(zz.w));
    oh[lane] = y;
    if (op) {
        const float4 b = make_float4(__shfl_xor_sync(0xffffffffu, y.x, 1), __shfl_xor_sync(0xffffffffu, y.y, 1),
                                     __shfl_xor_sync(0xffffffffu, y.z, 1), __shfl_xor_sync(0xffffffffu, y.w, 1));
        const int m = lane >> 1;
        if (!(lane & 1)) op[(size_t)i * 16 + 4 * (m & 3) + (m >> 2)] = xp_chunk(y, b);
    }
}
void cu_gated_norm(cudaStream_t s, float *o, const float *z, const float *gw, int T, int nv, int dv, float eps) {
    cu_gated_norm_p(s, o, z, gw, T, nv, dv, eps, NULL);
}
int cu_gated_norm_p(cudaStream_t s, float *o, const float *z, const float *gw, int T, int nv, int dv, float eps, uint16_t *op) {
    if (dv == 128 && ((uintptr_t)o & 15) == 0 && ((uintptr_t)z & 15) == 0 && ((uintptr_t)gw & 15) == 0) {
        if (op && !xp_out_ok(op, nv * dv, T, o, z, gw)) op = NULL;
        cu_go(k_gated_norm128, (T * nv + 7) / 8, 256, 0, s)(o, z, gw, T * nv, eps, (uint4 *)op);
        return op != NULL;
    }
    cu_go(k_gated_norm, T * nv, 128, 0, s)(o, z, gw, nv, dv, eps);
    return 0;
}
