/* Gated attention's kernels: q/k norm and RoPE with the KV write, the SIMT attention over the cache,
 * decode's split attention (k_attn_gqa, its q/k prep folded in) and the merges of its partials. */
#include "cuda/cu_attn.h"
#include "cuda/cu_attn_dtc.h"
#include <limits.h>
#include <cuda_fp16.h>
#include <mma.h>
using namespace nvcuda;
#include <math.h>
#include <stdlib.h>

/* ---- gated attention ---- */
__global__ void k_qk_prep(const float *qg, float *q, const float *k, const float *v, const float *qn,
                          const float *kn, int nh, int nkv, int hd, int rot, const float *inv_freq, float eps,
                          const int *pos, uint16_t *kc, uint16_t *vc, cu_rows R) {
    CU_PDL();
    extern __shared__ float buf[];
    __shared__ float sh[32];
    int t = blockIdx.x, h = blockIdx.y, p = R.pos ? R.pos[t] : *pos + t;
    if (R.pos) { kc = R.kc[t] + R.kv_off; vc = R.vc[t] + R.kv_off; } /* decode batch: row t's own cache */
    const float *src;
    const float *nw;
    float *dst = NULL;   /* a query head's output */
    uint16_t *dk = NULL; /* or the key's cache row */
    if (h < nh) {
        src = qg + (size_t)t * nh * 2 * hd + (size_t)h * 2 * hd;
        nw = qn;
        dst = q + (size_t)t * nh * hd + (size_t)h * hd;
    } else {
        int kh = h - nh;
        src = k + (size_t)t * nkv * hd + (size_t)kh * hd;
        nw = kn;
        dk = kc + (size_t)p * nkv * hd + (size_t)kh * hd;
        const float *vs = v + (size_t)t * nkv * hd + (size_t)kh * hd;
        uint16_t *vd = vc + (size_t)p * nkv * hd + (size_t)kh * hd;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) vd[i] = cu_f2h(vs[i]);
    }
    float ss = 0;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += src[i] * src[i];
    ss = block_sum(ss, sh);
    float r = 1.0f / sqrtf(ss / hd + eps);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) buf[i] = src[i] * r * nw[i];
    __syncthreads();
    int half = rot / 2;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float val = buf[i];
        if (i < rot) {
            int fi = i < half ? i : i - half;
            float ang = (float)p * inv_freq[fi], cs = cosf(ang), sn = sinf(ang);
            float a = buf[fi], b = buf[fi + half];
            val = i < half ? a * cs - b * sn : b * cs + a * sn;
        }
        if (dst) dst[i] = val;
        else dk[i] = cu_f2h(val);
    }
}
void cu_qk_prep(cudaStream_t s, const float *qg, float *q, const float *k, const float *v, const float *qn,
                const float *kn, int T, int nh, int nkv, int hd, int rot, const float *inv_freq, float eps,
                const int *pos, uint16_t *kc, uint16_t *vc) {
    cu_rows none;
    memset(&none, 0, sizeof none);
    cu_go(k_qk_prep, dim3(T, nh + nkv), 128, (size_t)hd * sizeof(float), s)(qg, q, k, v, qn, kn, nh, nkv, hd, rot, inv_freq, eps, pos, kc, vc, none);
}
void cu_qk_prep_rows(cudaStream_t s, const cu_rows *R, int n, const float *qg, float *q, const float *k, const float *v,
                     const float *qn, const float *kn, int nh, int nkv, int hd, int rot, const float *inv_freq, float eps) {
    cu_go(k_qk_prep, dim3(n, nh + nkv), 128, (size_t)hd * sizeof(float), s)(qg, q, k, v, qn, kn, nh, nkv, hd, rot, inv_freq, eps,
                                                                         R->pos, NULL, NULL, *R);
}

/* Each warp runs an online softmax over its share of one split's keys and leaves
 * (max, sum, acc[hd]) in part; k_attn_merge combines them and applies the gate. */
#define ATT_WARPS 4
#define ATT_MAXR 16
__global__ void __launch_bounds__(ATT_WARPS * WARP) k_attn(const float *q, const uint16_t *kc, const uint16_t *vc, int nh, int nkv,
                                                           int hd, const int *pos, int splits, float *part, cu_rows rows) {
    CU_PDL();
    int th = blockIdx.x, t = th / nh, h = th % nh, kvh = h / (nh / nkv);
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, R = hd / WARP;
    int n = (rows.pos ? rows.pos[t] : *pos + t) + 1;
    if (rows.pos) { kc = rows.kc[t] + rows.kv_off; vc = rows.vc[t] + rows.kv_off; } /* decode batch: row t's own cache */
    int chunk = (n + splits - 1) / splits, j0 = blockIdx.y * chunk, j1 = min(n, j0 + chunk);
    const float *qh = q + (size_t)t * nh * hd + (size_t)h * hd;
    float qr[ATT_MAXR], acc[ATT_MAXR];
#pragma unroll
    for (int i = 0; i < ATT_MAXR; i++) { qr[i] = i < R ? qh[lane + WARP * i] : 0.f; acc[i] = 0.f; }
    float scale = rsqrtf((float)hd), mx = -INFINITY, l = 0;
    size_t ld = (size_t)nkv * hd;
    for (int j = j0 + warp; j < j1; j += ATT_WARPS) {
        const uint16_t *kj = kc + j * ld + (size_t)kvh * hd, *vj = vc + j * ld + (size_t)kvh * hd;
        float d = 0;
#pragma unroll
        for (int i = 0; i < ATT_MAXR; i++) if (i < R) d += qr[i] * h2f(kj[lane + WARP * i]);
        float sc = warp_sum(d) * scale;
        if (sc > mx) {
            float corr = expf(mx - sc);
            l = l * corr + 1.0f;
#pragma unroll
            for (int i = 0; i < ATT_MAXR; i++) if (i < R) acc[i] = acc[i] * corr + h2f(vj[lane + WARP * i]);
            mx = sc;
        } else {
            float p = expf(sc - mx);
            l += p;
#pragma unroll
            for (int i = 0; i < ATT_MAXR; i++) if (i < R) acc[i] += p * h2f(vj[lane + WARP * i]);
        }
    }
    float *pp = part + (((size_t)th * splits + blockIdx.y) * ATT_WARPS + warp) * (hd + 2);
    if (lane == 0) { pp[0] = mx; pp[1] = l; }
#pragma unroll
    for (int i = 0; i < ATT_MAXR; i++) if (i < R) pp[2 + lane + WARP * i] = acc[i];
}
__global__ void k_attn_merge(const float *part, const float *qg, int nh, int hd, int np, float *o, const int *pos, int amin) {
    CU_PDL();
    __shared__ float wsh[1024];
    __shared__ float Lsh;
    int th = blockIdx.x, t = th / nh, h = th % nh;
    const float *pp = part + (size_t)th * np * (hd + 2);
    if (amin > 0) np = attn_splits_used(np, amin, *pos + 1); /* (the stride stays the grid's) */
    /* the partials' maxima and sums by the first warp, a partial a lane (one thread walking decode's
     * 64 splits was a chain of dependent loads: 12 us a launch under Nsight) */
    if (threadIdx.x < WARP) {
        const int lane = threadIdx.x;
        float M = -INFINITY;
        for (int p = lane; p < np; p += WARP) M = fmaxf(M, pp[(size_t)p * (hd + 2)]);
        for (int o = 16; o; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        float L = 0;
        for (int p = lane; p < np; p += WARP) {
            float m = pp[(size_t)p * (hd + 2)], w = m == -INFINITY ? 0.f : expf(m - M);
            wsh[p] = w;
            L += w * pp[(size_t)p * (hd + 2) + 1];
        }
        for (int o = 16; o; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
        if (lane == 0) Lsh = L;
    }
    __syncthreads();
    const float *gate = qg + (size_t)t * nh * 2 * hd + (size_t)h * 2 * hd + hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float a = 0;
#pragma unroll 8
        for (int p = 0; p < np; p++) if (wsh[p] != 0.f) a += pp[(size_t)p * (hd + 2) + 2 + i] * wsh[p];
        o[(size_t)t * nh * hd + (size_t)h * hd + i] = a / Lsh * sigm_f(gate[i]);
    }
}
/* Decode's merge of many partials (the GQA form's 64 key splits a head), wide: a block per (token,
 * head, 32 output columns), its 8 warps each folding every 8th partial online (the loads of 8
 * partials issued before their sums), then one warp joining the 8 in shared memory. k_attn_merge
 * read a head's 64 partials with 128 threads, 2 columns each: 16 rounds of loads, 11 us on the
 * decode step's critical path (bench/RESULTS.md, session 18). */
#define AMW_WARPS 8
__global__ void __launch_bounds__(AMW_WARPS * WARP) k_attn_merge_w(const float *part, const float *qg, int nh, int hd, int np,
                                                                  float *o, const int *pos, int amin) {
    CU_PDL();
    __shared__ float sm[AMW_WARPS], sl[AMW_WARPS], sa[AMW_WARPS][WARP];
    const int th = blockIdx.x, t = th / nh, h = th % nh, warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int i = blockIdx.y * WARP + lane; /* hd is a multiple of 32 */
    const float *pp = part + (size_t)th * np * (hd + 2);
    if (amin > 0) np = attn_splits_used(np, amin, *pos + 1); /* (the stride stays the grid's) */
    float M = -INFINITY, L = 0.f, A = 0.f;
    for (int p0 = warp; p0 < np; p0 += AMW_WARPS * 8) {
        float m[8], l[8], a[8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int p = p0 + AMW_WARPS * k;
            const float *q = pp + (size_t)p * (hd + 2);
            m[k] = p < np ? q[0] : -INFINITY;
            l[k] = p < np ? q[1] : 0.f;
            a[k] = p < np ? q[2 + i] : 0.f;
        }
#pragma unroll
        for (int k = 0; k < 8; k++) {
            if (m[k] == -INFINITY) continue; /* an empty split */
            const float mn = fmaxf(M, m[k]), c = expf(M - mn), w = expf(m[k] - mn);
            L = L * c + l[k] * w;
            A = A * c + a[k] * w;
            M = mn;
        }
    }
    if (lane == 0) { sm[warp] = M; sl[warp] = L; }
    sa[warp][lane] = A;
    __syncthreads();
    if (warp) return;
    float Mx = -INFINITY, Ls = 0.f, As = 0.f;
#pragma unroll
    for (int w = 0; w < AMW_WARPS; w++) Mx = fmaxf(Mx, sm[w]);
#pragma unroll
    for (int w = 0; w < AMW_WARPS; w++) {
        const float f = sm[w] == -INFINITY ? 0.f : expf(sm[w] - Mx);
        Ls += f * sl[w];
        As += f * sa[w][lane];
    }
    const float *gate = qg + (size_t)t * nh * 2 * hd + (size_t)h * 2 * hd + hd;
    o[(size_t)t * nh * hd + (size_t)h * hd + i] = As / Ls * sigm_f(gate[i]);
}
/* LILY_CU_MERGE_W=0: decode's merge by k_attn_merge again, for measuring */
static int merge_w_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_MERGE_W", 1);
}

/* GQA form: one block per (token, KV head, split) runs the HG query heads that share the KV
 * head together, so each key and value is read once for all of them. R = hd / 32. */
/* A lane's R consecutive fp16 of a cache row as loaded (R 8: one 16-byte load, where the lane + 32 i
 * columns of fp32 took eight 4-byte ones), kept packed until used: the U keys' loads a warp has in
 * flight then hold R / 2 registers each, not 2 R */
template <int R>
struct kv_raw {
    uint32_t w[R / 2];
};
template <int R>
__device__ __forceinline__ kv_raw<R> kv_load(const uint16_t *p) {
    kv_raw<R> r;
    if constexpr (R % 8 == 0) {
#pragma unroll
        for (int i = 0; i < R / 8; i++) {
            const uint4 t = ((const uint4 *)p)[i];
            r.w[4 * i] = t.x; r.w[4 * i + 1] = t.y; r.w[4 * i + 2] = t.z; r.w[4 * i + 3] = t.w;
        }
    } else {
        static_assert(R == 4, "a lane's columns: 4 or a multiple of 8");
        const uint2 t = *(const uint2 *)p;
        r.w[0] = t.x; r.w[1] = t.y;
    }
    return r;
}
template <int R>
__device__ __forceinline__ void kv_unpack(const kv_raw<R> &r, float (&f)[R]) {
#pragma unroll
    for (int i = 0; i < R / 2; i++) { f[2 * i] = h2f((uint16_t)(r.w[i] & 0xffffu)); f[2 * i + 1] = h2f((uint16_t)(r.w[i] >> 16)); }
}

/* A warp's keys j, j + 4, .., j + 4 (U - 1) of k_attn_gqa folded into its heads' online softmax
 * (qr, acc, mx, l): loaded together, the U x HG scores' warp sums level by level (U x HG independent
 * shuffle chains in flight, not one), then each head's rescale and values over the U keys at once */
template <int HG, int R, int U>
__device__ __forceinline__ void gqa_keys(const uint16_t *kb, const uint16_t *vb, size_t ld, int j, const float (&qr)[HG][R],
                                         float (&acc)[HG][R], float (&mx)[HG], float (&l)[HG]) {
    kv_raw<R> kw[U], vw[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        kw[u] = kv_load<R>(kb + (size_t)(j + ATT_WARPS * u) * ld);
        vw[u] = kv_load<R>(vb + (size_t)(j + ATT_WARPS * u) * ld);
    }
    float sc[U][HG];
#pragma unroll
    for (int u = 0; u < U; u++) {
        float kr[R];
        kv_unpack<R>(kw[u], kr);
#pragma unroll
        for (int g = 0; g < HG; g++) {
            float d = 0.f;
#pragma unroll
            for (int i = 0; i < R; i++) d += qr[g][i] * kr[i];
            sc[u][g] = d;
        }
    }
#pragma unroll
    for (int o = 16; o; o >>= 1)
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int g = 0; g < HG; g++) sc[u][g] += __shfl_xor_sync(0xffffffffu, sc[u][g], o);
    float vr[U][R];
#pragma unroll
    for (int u = 0; u < U; u++) kv_unpack<R>(vw[u], vr[u]);
#pragma unroll
    for (int g = 0; g < HG; g++) {
        float mnew = mx[g];
#pragma unroll
        for (int u = 0; u < U; u++) mnew = fmaxf(mnew, sc[u][g]);
        const float corr = expf(mx[g] - mnew);
        float p[U], ps = 0.f;
#pragma unroll
        for (int u = 0; u < U; u++) { p[u] = expf(sc[u][g] - mnew); ps += p[u]; }
        l[g] = l[g] * corr + ps;
#pragma unroll
        for (int i = 0; i < R; i++) {
            float a = acc[g][i] * corr;
#pragma unroll
            for (int u = 0; u < U; u++) a += p[u] * vr[u][i];
            acc[g][i] = a;
        }
        mx[g] = mnew;
    }
}

/* Columns: lane l holds R l .. R l + R - 1 of q, the keys, the values and acc (kv_load's
 * contiguous loads); the fold computes the new key and q in the lane + 32 i order qk_head's
 * RoPE pairs need, and both meet through the cache and shared memory.
 * U: a warp's keys j, j + 4, .., j + 4 (U - 1) loaded and folded together (gqa_keys). Why: at long
 * context the loop is bound by each key's chain of dependent shuffles and exponentials, not by bytes:
 * the fp16 cache (half the bytes, half those in flight) left tg128@32768 where it was (392 against 391
 * on an H100), U 4 alone took it to 435, and fewer heads a block (HS, more warps an SM) the same at
 * U 2 (bench/RESULTS.md session 34). */
/* k_attn_gqa's work after its wait: n keys (the new one last), qw, kw, fr the fold's weights (loaded
 * before the wait) */
template <int HG, int R, int U>
static __device__ __forceinline__ void gqa_run(const float *q, const uint16_t *kc, const uint16_t *vc, int nh, int nkv, int n, int splits,
                                               float *part, const cu_rows &rows, const qk_fold &P, int amin, const float (&qw)[R],
                                               const float (&kw)[R], const float (&fr)[R]) {
    const int hd = R * WARP;
    /* a block per (token, KV head, HG of its nh / nkv query heads): with fewer heads a block than the
     * group (LILY_CU_ATTN_HS), each KV row is read by the group's blocks, and the new one written by
     * each of them (the same bits) */
    const int hs = nh / nkv / HG, tk = blockIdx.x / hs, t = tk / nkv, kvh = tk % nkv, hq0 = kvh * HG * hs + (int)(blockIdx.x % hs) * HG;
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (rows.pos) { kc = rows.kc[t] + rows.kv_off; vc = rows.vc[t] + rows.kv_off; } /* decode batch: row t's own cache */
    const int se = attn_splits_used(splits, amin, n); /* (amin: one token, no rows) */
    if ((int)blockIdx.y >= se) return; /* a split past those used: the merge reads none of its partials */
    int chunk = (n + se - 1) / se, j0 = blockIdx.y * chunk, j1 = min(n, j0 + chunk);
    float qr[HG][R], acc[HG][R], mx[HG], l[HG];
    float scale = rsqrtf((float)hd);
    if (P.qg) { /* (T = 1) the q heads' prep shared by the warps (a warp a head, through shared
                 * memory: every warp reads them all; each warp doing all of them measured 1% slower
                 * than k_qk_prep's launch, this form 0.8% faster, bench/RESULTS.md session 19);
                 * the new key's by the block whose keys end with it, before its warps read the cache */
        __shared__ __align__(16) float qs[HG][R * WARP];
        qk_fold_prep<R, HG, ATT_WARPS>(P, qw, kw, fr, hq0, kvh, nkv, n, j0, j1, qs, scale);
#pragma unroll
        for (int g = 0; g < HG; g++) {
#pragma unroll
            for (int i = 0; i < R; i += 4) { /* (16-byte reads: lanes 8 words apart would be 8-way bank conflicts a word) */
                const float4 v = *(const float4 *)&qs[g][R * lane + i];
                qr[g][i] = v.x; qr[g][i + 1] = v.y; qr[g][i + 2] = v.z; qr[g][i + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < R; i++) acc[g][i] = 0.f;
            mx[g] = -INFINITY; l[g] = 0.f;
        }
    } else
#pragma unroll
    for (int g = 0; g < HG; g++) {
        const float *qh = q + (size_t)t * nh * hd + (size_t)(hq0 + g) * hd;
#pragma unroll
        for (int i = 0; i < R; i++) { qr[g][i] = qh[R * lane + i] * scale; acc[g][i] = 0.f; }
        mx[g] = -INFINITY; l[g] = 0.f;
    }
    const size_t ld = (size_t)nkv * hd;
    const uint16_t *kb = kc + (size_t)kvh * hd + R * lane, *vb = vc + (size_t)kvh * hd + R * lane;
    int j = j0 + warp;
    if constexpr (U > 1) /* whole groups of U, then one key at a time (short contexts: a key or two a warp) */
        for (; j + ATT_WARPS * (U - 1) < j1; j += ATT_WARPS * U) gqa_keys<HG, R, U>(kb, vb, ld, j, qr, acc, mx, l);
    for (; j < j1; j += ATT_WARPS) gqa_keys<HG, R, 1>(kb, vb, ld, j, qr, acc, mx, l);
    /* merge the warps in shared memory: one partial per block and head */
    __shared__ float sm_m[HG][ATT_WARPS], sm_l[HG][ATT_WARPS];
    __shared__ __align__(16) float sm_a[HG][ATT_WARPS][R * WARP];
#pragma unroll
    for (int g = 0; g < HG; g++) {
        if (lane == 0) { sm_m[g][warp] = mx[g]; sm_l[g][warp] = l[g]; }
#pragma unroll
        for (int i = 0; i < R; i += 4) *(float4 *)&sm_a[g][warp][R * lane + i] = make_float4(acc[g][i], acc[g][i + 1], acc[g][i + 2], acc[g][i + 3]);
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < HG * (hd + 2); idx += blockDim.x) {
        int g = idx / (hd + 2), i = idx % (hd + 2);
        float M = -INFINITY;
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm_m[g][w]);
        float v = 0;
        if (i == 0) v = M;
        else if (M != -INFINITY)
            for (int w = 0; w < ATT_WARPS; w++) {
                float f = sm_m[g][w] == -INFINITY ? 0.f : expf(sm_m[g][w] - M);
                v += f * (i == 1 ? sm_l[g][w] : sm_a[g][w][i - 2]);
            }
        int th = t * nh + hq0 + g;
        part[((size_t)th * splits + blockIdx.y) * (hd + 2) + i] = v;
    }
}
template <int HG, int R, int U>
__global__ void __launch_bounds__(ATT_WARPS * WARP) k_attn_gqa(const float *q, const uint16_t *kc, const uint16_t *vc, int nh,
                                                               int nkv, const int *pos, int splits, float *part, cu_rows rows,
                                                               qk_fold P, int amin) {
    float qw[R], kw[R], fr[R]; /* (the fold's weights, before the wait) */
    qk_fold_weights<R>(P, qw, kw, fr);
    CU_PDL();
    const int t = blockIdx.x / (nh / HG); /* (a block per token, KV head and HG heads) */
    gqa_run<HG, R, U>(q, kc, vc, nh, nkv, (rows.pos ? rows.pos[t] : *pos + t) + 1, splits, part, rows, P, amin, qw, kw, fr);
}
/* Decode attention on the tensor cores (cu_attn_dtc.h) for the 35B-A3B heads (head dim 256, 8 query
 * heads a KV head): a block of 4 warps a token, KV head and key split, two steps of 8 keys a warp
 * loaded together (on an H100, bench/RESULTS.md session 35, tg128@32768 437 -> 467 tok/s with 4 warps a
 * block and U 2, 449 with 8 warps; 464 with U 1) */
__global__ void __launch_bounds__(ATT_WARPS * WARP, 2) k_attn_dtc(const float *q, const uint16_t *kc, const uint16_t *vc, int nh, int nkv,
                                                                 const int *pos, int splits, float *part, cu_rows rows, qk_fold P,
                                                                 int amin, int pf, int pfl) {
    extern __shared__ __align__(16) unsigned char dt_sm[]; /* [DT_SMEM(ATT_WARPS)] */
    float qw[8], kw[8], fr[8]; /* (the fold's weights, before the wait) */
    qk_fold_weights<8>(P, qw, kw, fr);
    if (pf && !rows.pos) dtc_prefetch<2, ATT_WARPS>(kc, vc, nkv, *pos + blockIdx.x / nkv + 1, blockIdx.x, splits, amin, pf);
    CU_PDL();
    const int t = blockIdx.x / nkv;
    dtc_run<2, ATT_WARPS>(q, kc, vc, nh, nkv, (rows.pos ? rows.pos[t] : *pos + t) + 1, blockIdx.x, splits, part, rows, P, amin, qw, kw, fr,
                          dt_sm, pfl);
}

/* k_attn_gqa's form: the keys a warp loads together (U: LILY_CU_ATTN_U 1, 2 or 4, default 2) and the
 * blocks a group of 8 query heads is split over (LILY_CU_ATTN_HS 1, 2 or 4, default 2; head dim 256).
 * On an H100 (bench/RESULTS.md session 34), tg128 / @4096 / @32768: U 1 HS 1 536 / 501 / 399, U 4 HS 1
 * 536 / 506 / 435, U 2 HS 2 544 / 513 / 435, U 2 HS 4 547 / 505 / 408, U 4 HS 4 547 / 507 / 428 */
static int attn_u_test = 0, attn_hs_test = 0, attn_dtc_test = -1, attn_dtc_min_test = -1;
void cu_attn_form_test(int u, int hs) { attn_u_test = u; attn_hs_test = hs; }
void cu_attn_dtc_test(int on, int dmin) { attn_dtc_test = on; attn_dtc_min_test = dmin; }
static int attn_form(int test, int *cache, const char *name) {
    const int e = test ? test : cu_env_int(cache, name, 2);
    return e == 1 || e == 4 ? e : 2;
}
static int attn_u(void) {
    static int u = INT_MIN;
    return attn_form(attn_u_test, &u, "LILY_CU_ATTN_U");
}
static int attn_hs(void) {
    static int h = INT_MIN;
    return attn_form(attn_hs_test, &h, "LILY_CU_ATTN_HS");
}

/* Where decode attention for the 35B-A3B heads runs on the tensor cores (k_attn_dtc): from
 * LILY_CU_ATTN_DTC_MIN keys (default 2048; LILY_CU_ATTN_DTC=0: never). Why not everywhere: on an H100
 * (bench/RESULTS.md session 35) it took tg128@32768 434 -> 463 tok/s and tg128@2048 +0.4%, but everywhere
 * it cost tg128 1.5% (8 heads a block, its prep and join, for a few keys a split). The decode step's graph
 * is replayed for every position, so the host keeps one of each form and picks a step's by its position
 * (cu_decode.cu; one kernel choosing by the position inside measured slower both ways: its registers and
 * shared memory the larger form's). */
/* k_attn_dtc's early prefetch (dtc_prefetch): the loop steps a warp prefetches, LILY_CU_ATTN_PF 0-4
 * (default 1: one step, 16 keys a warp, 64 KB a block, 16 MB a layer at 32K, a third of an H100's L2).
 * On an H100 (bench/RESULTS.md session 46) tg128@32768 469.9 -> 473.3, tg128@4096 521.2 -> 523.4 (two
 * rounds each); 2 steps no better. Under Nsight, whose serialized launches leave no predecessor to
 * overlap, the kernel alone gained 1% (35.4 -> 35.1 us at 32K). */
static int dtc_steps(int *cache, const char *name, int def) {
    const int e = cu_env_int(cache, name, def);
    return e < 0 ? 0 : e > 4 ? 4 : e;
}
static int dtc_pf(void) {
    static int v = INT_MIN;
    return dtc_steps(&v, "LILY_CU_ATTN_PF", 1);
}
/* k_attn_dtc's in-loop prefetch: how many loop steps ahead each warp bulk-prefetches its K and V rows into L2,
 * LILY_CU_ATTN_PFL 0-4 (default 0: none; built after session 46's device time ran out, not measured).
 * Why: Nsight put the kernel at 67 MB in 35.4 us at 32K on an H100, 1.9 TB/s of 3.35: each warp's step
 * issues its loads, then waits for them with nothing else to do, and 8 warps an SM do not cover that. */
static int dtc_pfl(void) {
    static int v = INT_MIN;
    return dtc_steps(&v, "LILY_CU_ATTN_PFL", 0);
}
static int dtc_smem_ok(void) {
    static int ok = -1;
    if (ok < 0) ok = cudaFuncSetAttribute(k_attn_dtc, cudaFuncAttributeMaxDynamicSharedMemorySize, DT_SMEM(ATT_WARPS)) == cudaSuccess;
    return ok;
}
int cu_attn_tc_at(int keys) {
    static int on = -1, v = INT_MIN;
    const int want = attn_dtc_test >= 0 ? attn_dtc_test && keys >= (attn_dtc_min_test >= 0 ? attn_dtc_min_test : 0)
                                        : cu_env_flag(&on, "LILY_CU_ATTN_DTC", 1) && keys >= cu_env_int(&v, "LILY_CU_ATTN_DTC_MIN", 2048);
    return want && dtc_smem_ok(); /* (its shared memory asked for here, before any graph capture) */
}

size_t cu_attention_part_floats(int T, int nh, int hd, int splits) {
    return (size_t)T * nh * splits * ATT_WARPS * (hd + 2);
}
static const qk_fold qk_none = { NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0.f };
static void attention(cudaStream_t s, const float *q, const float *qg, const uint16_t *kc, const uint16_t *vc, int T,
                      int nh, int nkv, int hd, const int *pos, int splits, float *part, float *o, const cu_rows &rw,
                      int p0h = -1, void *h16 = NULL, size_t h16_bytes = 0, const qk_fold &P = qk_none, int amin = 0, int tc = 0) {
    if (!rw.pos && splits == 1 && cu_attn_tc_ok(T, nh, nkv, hd)) {
        const int np = cu_attn_tc(s, q, qg, kc, vc, T, nh, nkv, pos, o, part, cu_attention_part_floats(T, nh, hd, 1), p0h, h16,
                                  h16_bytes);
        if (np > 1) cu_go(k_attn_merge, T * nh, 128, 0, s)(part, qg, nh, hd, np, o, pos, 0);
        return;
    }
    int hg = nh / nkv, np = splits;
    /* 8 query heads a KV head as hs blocks of 8 / hs: fewer registers a thread (HG 8: ~245 at U 2, two
     * blocks of 4 warps an SM; HG 4: ~127, four), so more warps an SM to overlap the per-key chains of
     * shuffles and exponentials, which bound the loop rather than the bytes (the fp16 cache alone changed
     * nothing at 32K); each KV row is then read by hs blocks, from L2 after the first */
    const int hs = hd == 256 && hg == 8 ? attn_hs() : 1;
    dim3 gq(T * nkv * hs, splits);
    if (T != 1 || rw.pos) amin = 0;
    const int U = attn_u();
#define GQA(HG_, R_)                                                                                                                 \
    do {                                                                                                                             \
        if (U == 4) cu_go(k_attn_gqa<HG_, R_, 4>, gq, ATT_WARPS * WARP, 0, s)(q, kc, vc, nh, nkv, pos, splits, part, rw, P, amin);   \
        else if (U == 2) cu_go(k_attn_gqa<HG_, R_, 2>, gq, ATT_WARPS * WARP, 0, s)(q, kc, vc, nh, nkv, pos, splits, part, rw, P, amin); \
        else cu_go(k_attn_gqa<HG_, R_, 1>, gq, ATT_WARPS * WARP, 0, s)(q, kc, vc, nh, nkv, pos, splits, part, rw, P, amin);         \
    } while (0)
    if (tc && hd == 256 && hg == 8)
        cu_go(k_attn_dtc, dim3(T * nkv, splits), ATT_WARPS * WARP, DT_SMEM(ATT_WARPS), s)(q, kc, vc, nh, nkv, pos, splits, part, rw, P, amin,
                                                                                               dtc_pf(), dtc_pfl());
    else if (hd == 256 && hg == 8 && hs == 4) GQA(2, 8);
    else if (hd == 256 && hg == 8 && hs == 2) GQA(4, 8);
    else if (hd == 256 && hg == 8) GQA(8, 8);
    else if (hd == 256 && hg == 4) GQA(4, 8);
    else if (hd == 256 && hg == 2) GQA(2, 8);
    else if (hd == 128 && hg == 8) GQA(8, 4);
#undef GQA
    else {
        cu_go(k_attn, dim3(T * nh, splits), ATT_WARPS * WARP, 0, s)(q, kc, vc, nh, nkv, hd, pos, splits, part, rw);
        np = splits * ATT_WARPS;
        amin = 0;
    }
    if (np >= 16 && hd % WARP == 0 && merge_w_enabled())
        cu_go(k_attn_merge_w, dim3(T * nh, hd / WARP), AMW_WARPS * WARP, 0, s)(part, qg, nh, hd, np, o, pos, amin);
    else cu_go(k_attn_merge, T * nh, 128, 0, s)(part, qg, nh, hd, np, o, pos, amin);
}
void cu_attention(cudaStream_t s, const float *q, const float *qg, const uint16_t *kc, const uint16_t *vc, int T,
                  int nh, int nkv, int hd, const int *pos, int splits, float *part, float *o, int amin, int tc) {
    cu_rows none;
    memset(&none, 0, sizeof none);
    attention(s, q, qg, kc, vc, T, nh, nkv, hd, pos, splits, part, o, none, -1, NULL, 0, qk_none, amin, tc);
}
int cu_attention_dec(cudaStream_t s, const float *qg, const float *k, const float *v, const float *qn, const float *kn, int nh,
                     int nkv, int hd, int rot, const float *inv_freq, float eps, const int *pos, uint16_t *kc, uint16_t *vc,
                     int splits, float *part, float *o, int amin, int tc) {
    const int hg = nkv > 0 ? nh / nkv : 0;
    if (nkv < 1 || nh % nkv || rot < 64 || rot % 64 || rot > hd || rot > 256 ||
        !((hd == 256 && (hg == 8 || hg == 4 || hg == 2)) || (hd == 128 && hg == 8)))
        return 0;
    const qk_fold P = { qg, k, v, qn, kn, inv_freq, kc, vc, rot, eps };
    cu_rows none;
    memset(&none, 0, sizeof none);
    attention(s, NULL, qg, kc, vc, 1, nh, nkv, hd, pos, splits, part, o, none, -1, NULL, 0, P, amin, tc);
    return 1;
}
int cu_qk_fold_enabled(void) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_QK_FOLD", 1);
}
void cu_attention_h16(cudaStream_t s, const float *q, const float *qg, const uint16_t *kc, const uint16_t *vc, int T, int nh, int nkv,
                      int hd, const int *pos, int p0h, void *h16, size_t h16_bytes, float *part, float *o) {
    cu_rows none;
    memset(&none, 0, sizeof none);
    attention(s, q, qg, kc, vc, T, nh, nkv, hd, pos, 1, part, o, none, p0h, h16, h16_bytes);
}
void cu_attention_rows(cudaStream_t s, const cu_rows *R, int n, const float *q, const float *qg, int nh, int nkv, int hd,
                       int splits, float *part, float *o, int tc) {
    attention(s, q, qg, NULL, NULL, n, nh, nkv, hd, R->pos, splits, part, o, *R, -1, NULL, 0, qk_none, 0, tc);
}
