/* Prefill attention on mma.sync (k_attn_tc): causal, grouped-query (8 query heads a KV head,
 * head dim 256, the 35B-A3B shape), online softmax, the output gated by sigmoid(gate).
 *
 * Why: the SIMT kernels (k_attn_gqa) run a block a token and re-read every earlier key and value
 * for it, with a warp reduction a key and head: 263 us a layer at 512 tokens for ~2 GFLOP, and
 * quadratic in the prompt. Here a block takes 8 tokens of one KV head's 8 query heads (64 rows),
 * stages 32 keys and values at a time in shared memory as fp16 (read once for all 64 rows), and
 * runs the products on the tensor cores; the next 32 keys land (cp.async, from the fp16 cache) while a stage
 * computes.
 *
 * Layout: warp w (and w + 4, below) owns query heads 2w and 2w + 1 of the group; its mma rows are g (head 2w, token
 * g) and g + 8 (head 2w + 1, token g), so both rows of a lane end at the same key (causal). Q is
 * scaled by 1/sqrt(256) = 1/16 (exact) into fp16; a lane takes head dims 16s + 4q .. +3 of k step
 * s for Q and K alike (the mma's K index only has to pair the two). S's accumulators become P's
 * fp16 A fragments in place; V is staged transposed ([dim][key]) so a B fragment is one 32-bit
 * load. Scores, softmax and the output accumulate in fp32; Q, K, P and V are fp16 (saturated). */
#include "cuda/cu_dev.h"

#define AT_HD 256
#define AT_TOK 8    /* query tokens a block */
#define AT_KEYS 32  /* keys a stage */
/* Eight warps: warp w and w + 4 own the same rows (query heads 2 (w % 4), + 1) and find the same
 * scores, each for half of the output's 256 dims: twice the warps an SM to hide the stage's
 * latencies (one warp a scheduler had waited on every load), half the output registers, and the
 * staging's conversions shared by twice the threads, for a duplicated QK^T (a quarter of the mma). */
#define AT_THREADS 256
#define AT_QLD (AT_HD + 16)  /* halves a Q or K row in shared memory: 8 banks apart, so the 8-byte
                              * loads of rows g = 0..3 (a half-warp) cover all 32 banks */
#define AT_VLD (AT_KEYS + 8) /* halves a transposed V row */
#define AH_VP (AT_HD + 8)    /* words a row of key pairs (H16): the fragment's rows qd = 0..3 8 banks apart */
/* the keys the fp16 scratch holds for `keys` (H16): rounded up to a stage */
__host__ __device__ static inline int ah_keys(int keys) { return (keys + AT_KEYS - 1) / AT_KEYS * AT_KEYS; }

/* q [T][nh][256] (normed, rotated), qg [T][nh][512] (the gate in its second half), kc/vc
 * [ctx][nkv][256] fp16 with this chunk's keys already written; token t sees keys 0 .. *pos + t.
 * np > 1: the keys in np splits of ks keys (a multiple of a stage, from *pos + T), a block a split
 * (blockIdx.z); a block leaves its rows' (max, sum, unnormalized output) in part [T][nh][np][258]
 * for k_attn_merge, which normalizes and gates. Why: a block's stages run one after another, and
 * the last token tiles of a 512-token prompt had 16 of them while the first had one. */
/* H16: the keys and values come converted (k_kv_h16): kh [nkv][nkp][256] fp16 rows, vp [nkv][nkp / 2][256]
 * words of two keys' fp16 values (a B fragment's pair of keys), nkp = the keys rounded up to a
 * stage; the first position is p0h (the host's), not *pos. */
template <int H16>
__global__ void __launch_bounds__(AT_THREADS) k_attn_tc(const float *__restrict__ q, const float *__restrict__ qg,
                                                 const uint16_t *__restrict__ kc, const uint16_t *__restrict__ vc, int T, int nh,
                                                 int nkv, const int *__restrict__ pos, float *__restrict__ o, int np,
                                                 float *__restrict__ part, int p0h, const __half *__restrict__ kh,
                                                 const uint32_t *__restrict__ vp) {
    CU_PDL();
    extern __shared__ __align__(16) unsigned char at_sm[];
    uint16_t *Kf = (uint16_t *)at_sm;               /* [32 keys][256] fp16: the next stage, landing (cp.async) */
    uint16_t *Vf = Kf + AT_KEYS * AT_HD;            /* [32 keys][256] */
    __half *Qs = H16 ? (__half *)at_sm : (__half *)(Vf + AT_KEYS * AT_HD); /* [8 heads][8 tokens][AT_QLD] */
    __half *Ks = Qs + 8 * AT_TOK * AT_QLD;          /* [32 keys][AT_QLD] (H16: [2 stages][..]) */
    __half *Vt = Ks + AT_KEYS * AT_QLD;             /* [256 dims][AT_VLD] */
    uint32_t *Vs = (uint32_t *)(Ks + 2 * AT_KEYS * AT_QLD); /* H16: [2 stages][16 key pairs][AH_VP] */
    const int tid = threadIdx.x, lane = tid & 31, warp = (tid >> 5) & 3, dh = tid >> 7, g = lane >> 2, qd = lane & 3;
    const int t0 = blockIdx.x * AT_TOK, kvh = blockIdx.y, p0 = H16 ? p0h : *pos;
    const size_t kld = (size_t)nkv * AT_HD;
    const int tl = min(t0 + AT_TOK, T) - 1;          /* the block's last token */
    const int nkeys = p0 + tl + 1, mylim = p0 + min(t0 + g, T - 1); /* this lane's rows see keys <= mylim */
    const int ks = np > 1 ? (p0 + T + np * AT_KEYS - 1) / (np * AT_KEYS) * AT_KEYS : nkeys;
    const int jb = blockIdx.z * ks, je = min(jb + ks, nkeys); /* this block's keys */
    if (jb >= nkeys) { /* an empty split: no keys for this tile */
        if (tid < 8 * AT_TOK && t0 + (tid & 7) < T) {
            float *pp = part + (((size_t)(t0 + (tid & 7)) * nh + kvh * 8 + (tid >> 3)) * np + blockIdx.z) * (AT_HD + 2);
            pp[0] = -INFINITY;
            pp[1] = 0.f;
        }
        return;
    }
    const int nkp = ah_keys(p0 + T);
    /* H16: keys j0 .. j0 + 31 (k_kv_h16 wrote them all, past nkeys key nkeys - 1 again) into stage b */
    auto fetch16 = [&](int j0, int b) {
        const __half *ks = kh + ((size_t)kvh * nkp + j0) * AT_HD;
        const uint32_t *vs = vp + ((size_t)kvh * (nkp / 2) + j0 / 2) * AT_HD;
        __half *kd = Ks + b * AT_KEYS * AT_QLD;
        uint32_t *vd = Vs + b * (AT_KEYS / 2) * AH_VP;
#pragma unroll
        for (int r = 0; r < AT_KEYS * (AT_HD / 8) / AT_THREADS; r++) { /* 16-byte chunks: 32 a key's row, 64 a pair's */
            const int i = tid + AT_THREADS * r;
            cu_cp<16>(kd + (i >> 5) * AT_QLD + 8 * (i & 31), ks + (size_t)i * 8);
            cu_cp<16>(vd + (i >> 6) * AH_VP + 4 * (i & 63), vs + (size_t)i * 4);
        }
        cu_cp_commit();
    };
    /* keys j0 .. j0 + 31 (past nkeys: key nkeys - 1 again, masked) into Kf, Vf */
    auto fetch = [&](int j0) {
        for (int i = tid; i < AT_KEYS * (AT_HD / 8); i += AT_THREADS) {
            const int kk = i / 32, c = i % 32, j = j0 + kk < nkeys ? j0 + kk : nkeys - 1;
            cu_cp<16>(Kf + kk * AT_HD + 8 * c, kc + (size_t)j * kld + (size_t)kvh * AT_HD + 8 * c);
            cu_cp<16>(Vf + kk * AT_HD + 8 * c, vc + (size_t)j * kld + (size_t)kvh * AT_HD + 8 * c);
        }
        cu_cp_commit();
    };
    if (H16) fetch16(jb, 0);
    else fetch(jb);
    /* Q: 8 heads x 8 tokens x 256, scaled, to fp16 (tokens past T read token T - 1: not written) */
    for (int i = tid; i < 8 * AT_TOK * (AT_HD / 4); i += AT_THREADS) {
        const int hh = i / (AT_TOK * 64), tt = (i / 64) % AT_TOK, c = i % 64;
        const int t = t0 + tt < T ? t0 + tt : T - 1;
        const float4 v = *(const float4 *)(q + ((size_t)t * nh + kvh * 8 + hh) * AT_HD + 4 * c);
        uint2 h;
        h.x = cu_h2sat(v.x * 0.0625f, v.y * 0.0625f);
        h.y = cu_h2sat(v.z * 0.0625f, v.w * 0.0625f);
        *(uint2 *)(Qs + (hh * AT_TOK + tt) * AT_QLD + 4 * c) = h;
    }
    float O[16][4], m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.f, 0.f }; /* dims 128 dh + 8i + 2qd (+ 1) */
#pragma unroll
    for (int i = 0; i < 16; i++) O[i][0] = O[i][1] = O[i][2] = O[i][3] = 0.f;
    const __half *qa = Qs + ((2 * warp) * AT_TOK + g) * AT_QLD, *qb = Qs + ((2 * warp + 1) * AT_TOK + g) * AT_QLD;
    for (int j0 = jb, b = 0; j0 < je; j0 += AT_KEYS, b ^= 1) {
        cu_cp_wait<0>();
        __syncthreads(); /* this stage's keys are in, Q too; the last stage's readers are done */
        const __half *Kb = H16 ? Ks + b * AT_KEYS * AT_QLD : Ks;
        const uint32_t *Vb = Vs + b * (AT_KEYS / 2) * AH_VP;
        if (H16 && j0 + AT_KEYS < je) fetch16(j0 + AT_KEYS, b ^ 1); /* (stage b ^ 1's readers passed the barrier) */
        for (int i = tid; !H16 && i < AT_KEYS * (AT_HD / 4); i += AT_THREADS) {
            const int kk = i / 64, c = i % 64;
            const uint2 vv = *(const uint2 *)(Vf + kk * AT_HD + 4 * c);
            *(uint2 *)(Ks + kk * AT_QLD + 4 * c) = *(const uint2 *)(Kf + kk * AT_HD + 4 * c);
            const uint32_t v01 = vv.x, v23 = vv.y;
            Vt[(4 * c) * AT_VLD + kk] = __ushort_as_half((unsigned short)(v01 & 0xffff));
            Vt[(4 * c + 1) * AT_VLD + kk] = __ushort_as_half((unsigned short)(v01 >> 16));
            Vt[(4 * c + 2) * AT_VLD + kk] = __ushort_as_half((unsigned short)(v23 & 0xffff));
            Vt[(4 * c + 3) * AT_VLD + kk] = __ushort_as_half((unsigned short)(v23 >> 16));
        }
        if (!H16) {
            __syncthreads(); /* the fp16 stage is in; Kf, Vf are free for the next keys */
            if (j0 + AT_KEYS < je) fetch(j0 + AT_KEYS);
        }
        /* S = Q K^T for the stage's keys: n-tiles of 8 */
        constexpr int NT = AT_KEYS / 8;
        float S[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) S[n][0] = S[n][1] = S[n][2] = S[n][3] = 0.f;
#pragma unroll 4
        for (int s = 0; s < AT_HD / 16; s++) {
            const uint2 a = *(const uint2 *)(qa + 16 * s + 4 * qd), b = *(const uint2 *)(qb + 16 * s + 4 * qd);
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const uint2 k = *(const uint2 *)(Kb + (8 * n + g) * AT_QLD + 16 * s + 4 * qd);
                tc_mma(S[n], a.x, b.x, a.y, b.y, k.x, k.y);
            }
        }
        /* causal mask and the online softmax of rows g (c 0, 1) and g + 8 (c 2, 3) */
        float mx[2] = { m[0], m[1] };
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int j = j0 + 8 * n + 2 * qd + (c & 1);
                if (j > mylim) S[n][c] = -INFINITY;
                mx[c >> 1] = fmaxf(mx[c >> 1], S[n][c]);
            }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            corr[r] = mx[r] == -INFINITY ? 1.f : expf(m[r] - mx[r]);
            m[r] = mx[r];
            l[r] *= corr[r];
        }
#pragma unroll
        for (int i = 0; i < 16; i++) { O[i][0] *= corr[0]; O[i][1] *= corr[0]; O[i][2] *= corr[1]; O[i][3] *= corr[1]; }
        uint32_t P[NT][2]; /* rows g and g + 8 of each 8-key tile, fp16 pairs */
#pragma unroll
        for (int n = 0; n < NT; n++) {
            float e[4];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                e[c] = m[c >> 1] == -INFINITY ? 0.f : expf(S[n][c] - m[c >> 1]);
                l[c >> 1] += e[c];
            }
            P[n][0] = cu_h2sat(e[0], e[1]);
            P[n][1] = cu_h2sat(e[2], e[3]);
        }
        /* O += P V: k steps of 16 keys (tiles 2ks, 2ks + 1), this warp's 16 n-tiles of 8 dims */
#pragma unroll
        for (int ks = 0; ks < NT / 2; ks++) {
#pragma unroll
            for (int d = 0; d < 16; d++) {
                uint32_t b0, b1;
                if (H16) { /* key pairs 8 ks + qd and 8 ks + 4 + qd, dim 128 dh + 8 d + g */
                    const uint32_t *vr = Vb + (8 * ks + qd) * AH_VP + 128 * dh + 8 * d + g;
                    b0 = vr[0];
                    b1 = vr[4 * AH_VP];
                } else {
                    const __half *vr = Vt + (128 * dh + 8 * d + g) * AT_VLD + 16 * ks + 2 * qd;
                    b0 = *(const uint32_t *)vr;
                    b1 = *(const uint32_t *)(vr + 8);
                }
                tc_mma(O[d], P[2 * ks][0], P[2 * ks][1], P[2 * ks + 1][0], P[2 * ks + 1][1], b0, b1);
            }
        }
    }
    /* the rows' sums over the quad, normalize, gate, write */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    const int t = t0 + g;
    if (t >= T) return;
    if (np > 1) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float *pp = part + (((size_t)t * nh + kvh * 8 + 2 * warp + r) * np + blockIdx.z) * (AT_HD + 2);
            if (qd == 0 && dh == 0) { pp[0] = m[r]; pp[1] = l[r]; }
#pragma unroll
            for (int d = 0; d < 16; d++) *(float2 *)(pp + 2 + 128 * dh + 8 * d + 2 * qd) = make_float2(O[d][2 * r], O[d][2 * r + 1]);
        }
        return;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int h = kvh * 8 + 2 * warp + r;
        const float inv = 1.f / l[r];
        const float *gate = qg + ((size_t)t * nh + h) * 2 * AT_HD + AT_HD;
        float *out = o + ((size_t)t * nh + h) * AT_HD;
#pragma unroll
        for (int d = 0; d < 16; d++) {
            const int dim = 128 * dh + 8 * d + 2 * qd;
            const float2 gg = *(const float2 *)(gate + dim);
            float2 v;
            v.x = O[d][2 * r] * inv * (1.f / (1.f + expf(-gg.x)));
            v.y = O[d][2 * r + 1] * inv * (1.f / (1.f + expf(-gg.y)));
            *(float2 *)(out + dim) = v;
        }
    }
}

int cu_attn_tc_ok(int T, int nh, int nkv, int hd) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_ATTN_TC", 1) && T > 1 && hd == AT_HD && nkv > 0 && nh == 8 * nkv;
}

/* K and V rows 0 .. nkp - 1 of the cache (past nk: row nk - 1 again) as k_attn_tc<1> reads them: a
 * thread a key pair and 4 dims. */
__global__ void k_kv_h16(const uint16_t *__restrict__ kc, const uint16_t *__restrict__ vc, int nkv, int nk, int nkp, uint2 *__restrict__ kh,
                         uint4 *__restrict__ vp) {
    CU_PDL();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)nkv * (nkp / 2) * (AT_HD / 4)) return;
    const int c = (int)(i % (AT_HD / 4)), jp = (int)(i / (AT_HD / 4) % (nkp / 2)), h = (int)(i / (AT_HD / 4) / (nkp / 2));
    const int j0 = min(2 * jp, nk - 1), j1 = min(2 * jp + 1, nk - 1);
    const size_t r0 = ((size_t)j0 * nkv + h) * AT_HD + 4 * c, r1 = ((size_t)j1 * nkv + h) * AT_HD + 4 * c;
    const uint2 v0 = *(const uint2 *)(vc + r0), v1 = *(const uint2 *)(vc + r1); /* (each word: two columns, the first low) */
    const size_t kr = ((size_t)h * nkp + 2 * jp) * (AT_HD / 4) + c;
    kh[kr] = *(const uint2 *)(kc + r0);
    kh[kr + AT_HD / 4] = *(const uint2 *)(kc + r1);
    vp[i] = make_uint4((v0.x & 0xffffu) | (v1.x << 16), (v0.x >> 16) | (v1.x & 0xffff0000u), (v0.y & 0xffffu) | (v1.y << 16),
                       (v0.y >> 16) | (v1.y & 0xffff0000u));
}

static int h16_force = -1;
void cu_attn_h16_test(int on) { h16_force = on; }

size_t cu_attn_h16_bytes(int keys, int nkv) {
    return 2 * (size_t)ah_keys(keys) * nkv * AT_HD * sizeof(__half);
}

int cu_attn_tc(cudaStream_t s, const float *q, const float *qg, const uint16_t *kc, const uint16_t *vc, int T, int nh, int nkv,
               const int *pos, float *o, float *part, size_t part_floats, int p0h, void *h16, size_t h16_bytes) {
    /* the fp16 copy where the chunk reads enough keys to pay for converting them (LILY_CU_ATTN_H16_MIN, default
     * 1,024 keys: on the H200, session 17, pp8192 +20% and pp2048 +4% with it, pp512 -3%); LILY_CU_ATTN_H16=0/1:
     * never / always, for measuring */
    static int on16 = INT_MIN, min16 = INT_MIN;
    const int e16 = cu_env_int(&on16, "LILY_CU_ATTN_H16", -1);
    const int want = h16_force >= 0 ? h16_force : e16 >= 0 ? e16 != 0 : p0h + T >= cu_env_int(&min16, "LILY_CU_ATTN_H16_MIN", 1024);
    const int H16 = p0h >= 0 && h16 && !((uintptr_t)h16 & 15) && cu_attn_h16_bytes(p0h + T, nkv) <= h16_bytes && want;
    const size_t smem = H16 ? ((size_t)8 * AT_TOK * AT_QLD + 2 * (size_t)AT_KEYS * AT_QLD) * sizeof(__half) +
                                  2 * (size_t)(AT_KEYS / 2) * AH_VP * sizeof(uint32_t)
                            : (size_t)2 * AT_KEYS * AT_HD * sizeof(uint16_t) +
                                  ((size_t)8 * AT_TOK * AT_QLD + (size_t)AT_KEYS * AT_QLD + (size_t)AT_HD * AT_VLD) * sizeof(__half);
    static int attr[2];
    if (!attr[H16])
        attr[H16] = cudaFuncSetAttribute(H16 ? k_attn_tc<1> : k_attn_tc<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess;
    /* splits from 128 tokens, four unless LILY_CU_ATTN_NP says (1, 2, 4, 8; LILY_CU_ATTN_SPLIT=0: none; both
     * for measuring), where part holds them */
    static int split = -1, npe = INT_MIN;
    int nps = cu_env_int(&npe, "LILY_CU_ATTN_NP", 4);
    nps = nps == 1 || nps == 2 || nps == 8 ? nps : 4;
    const int np = T >= 128 && cu_env_flag(&split, "LILY_CU_ATTN_SPLIT", 1) && (size_t)T * nh * nps * (AT_HD + 2) <= part_floats ? nps : 1;
    __half *kh = NULL;
    uint32_t *vp = NULL;
    if (H16) {
        const int nk = p0h + T, nkp = ah_keys(nk);
        kh = (__half *)h16;
        vp = (uint32_t *)(kh + (size_t)nkv * nkp * AT_HD);
        const long long n = (long long)nkv * (nkp / 2) * (AT_HD / 4);
        cu_go(k_kv_h16, (unsigned)((n + 255) / 256), 256, 0, s)(kc, vc, nkv, nk, nkp, (uint2 *)kh, (uint4 *)vp);
    }
    const dim3 grid((T + AT_TOK - 1) / AT_TOK, nkv, np);
    if (H16) cu_go(k_attn_tc<1>, grid, AT_THREADS, smem, s)(q, qg, kc, vc, T, nh, nkv, pos, o, np, part, p0h, kh, vp);
    else cu_go(k_attn_tc<0>, grid, AT_THREADS, smem, s)(q, qg, kc, vc, T, nh, nkv, pos, o, np, part, p0h, kh, vp);
    return np;
}
