/* Sampling on the GPU: the CPU sampler's pipeline (src/engine/sampler.c: bias -> penalties
 * -> temperature -> top-k -> top-p -> min-p -> draw, logprobs of the unmodified row) in five
 * launches per step, none of which sorts the vocabulary:
 *
 *   z      (grid)  penalized, scaled logit z[i] in double exactly as the CPU computes it;
 *                  per block: max z (lowest id), max raw logit, the n best raw logits
 *   mass   (grid)  weights exp(z - zmax) as 2^-44 fixed point (integer sums are exact, so
 *                  no result depends on block order); per block: raw exp sum for log Z,
 *                  id-order mass; global: total mass and a histogram of zmax - z (1/8 bins)
 *   plan   (1 warp)  the histogram bin by which top-k's k tokens (or, without top-k,
 *                  top-p's mass) are reached: every kept token lies in bins up to it
 *   gather (grid)  those candidates (z, id, weight) into a list
 *   finish (1 block) the choice: greedy argmax; id-order walk (no top-k/top-p); or, for
 *                  top-k/top-p, radix selections over the candidates on the key (z desc,
 *                  id asc) by count (k-th token), by mass (top-p cut, then the draw);
 *                  top-n logprobs; the uniform from the device copy of the lily_rng. */
#include "cuda/cu_model.h"
#include "cuda/cu_sample.h"
#include "cuda/cu_sample_impl.h"
#include <math.h>
#include <stdlib.h>

/* ---------------- device helpers ---------------- */

/* The penalized, scaled logit of token i: pen_logit() * inv_t of sampler.c, operation for
 * operation in double (the products are kept out of FMA contraction). */
__device__ __forceinline__ double s_z(const samp_par *P, const float *logits, int i) {
    float x = logits[i];
    if (P->n_bias && (P->bias_bits[i >> 5] >> (i & 31) & 1u)) {
        int lo = 0, hi = P->n_bias - 1;
        while (lo < hi) {
            int mid = (lo + hi) >> 1;
            if (P->bias_ids[mid] < i) lo = mid + 1; else hi = mid;
        }
        for (int e = P->bias_off[lo]; e < P->bias_off[lo + 1]; e++) x += P->bias_val[e];
    }
    if (!isfinite(x)) return -INFINITY;
    double z = x;
    if (P->penal) {
        int n = P->counts[i];
        if ((n > 0 || P->prompt[i]) && P->rp != 1.0f) z = z > 0 ? z / (double)P->rp : __dmul_rn(z, (double)P->rp);
        if (n > 0) z -= __dadd_rn((double)P->pp, __dmul_rn((double)P->fp, (double)n));
    }
    return __dmul_rn(z, P->inv_t);
}

/* Weight exp(z - zmax) as the CPU's W() computes it, in 2^-44 fixed point. */
__device__ __forceinline__ ull s_q(double z, double zmax) {
    double w = (double)expf((float)(z - zmax));
    return (ull)(w * QONE + 0.5);
}

__device__ __forceinline__ int s_bin(double z, double zmax) {
    double d = zmax - z;
    return d < (NB - 1) / BPU ? (int)(d * BPU) : NB - 1;
}

/* Sort key: ascending (hi, lo) is the sampler's order, z descending then id ascending. */
__device__ __forceinline__ ull s_key(double z) {
    ull u = (ull)__double_as_longlong(z);
    u = (u >> 63) ? ~u : (u | 0x8000000000000000ull);
    return ~u;
}

/* a better than b: larger value, lower id on ties; id < 0 is nothing */
__device__ __forceinline__ bool s_better(double a, int ai, double b, int bi) {
    return ai >= 0 && (bi < 0 || a > b || (a == b && ai < bi));
}
__device__ __forceinline__ bool s_better(float a, int ai, float b, int bi) {
    return a > b || (a == b && ai < bi);
}

/* Block-wide argmax of (v, id) (double or float); every thread gets the result. */
template <typename T> __device__ void blk_argmax(T &v, int &id, T *sv, int *si) {
    for (int o = 16; o; o >>= 1) {
        T ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, id, o);
        if (s_better(ov, oi, v, id)) { v = ov; id = oi; }
    }
    int lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
    __syncthreads();
    if (lane == 0) { sv[w] = v; si[w] = id; }
    __syncthreads();
    v = sv[0]; id = si[0];
    for (int i = 1; i < nw; i++)
        if (s_better(sv[i], si[i], v, id)) { v = sv[i]; id = si[i]; }
}
/* Block-wide sum (unsigned 64-bit or double); every thread gets the result. */
template <typename T> __device__ T blk_sum(T v, T *sh) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    T r = 0;
    for (int i = 0; i < nw; i++) r += sh[i];
    return r;
}
__device__ float blk_max_f(float v, float *sh) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float r = sh[0];
    for (int i = 1; i < nw; i++) r = fmaxf(r, sh[i]);
    return r;
}

/* zmax (with its id) and rmax from the z pass's block partials; every thread gets them. */
__device__ void s_maxes(const samp_par *P, double *zmax, int *arg, float *rmax, double *sv, int *si, float *sf) {
    double v = -INFINITY;
    int id = -1;
    float r = -INFINITY;
    for (int b = threadIdx.x; b < P->G; b += blockDim.x) {
        if (s_better(P->p_zmax[b], P->p_arg[b], v, id)) { v = P->p_zmax[b]; id = P->p_arg[b]; }
        r = fmaxf(r, P->p_rmax[b]);
    }
    blk_argmax(v, id, sv, si);
    *zmax = v; *arg = id;
    *rmax = blk_max_f(r, sf);
}

/* One full warp: the first k in [0, n) whose inclusive prefix sum of a crosses t (>= t when
 * ge, else > t), -1 when none; *before = the prefix before it (the total when none). Lanes
 * sum contiguous ranges (independent loads), a shuffle scan finds the lane, the lane walks. */
template <class T>
__device__ int w_cross(const T *a, int n, ull t, int ge, ull *before) {
    int lane = threadIdx.x & 31, per = (n + 31) / 32, lo = lane * per, hi = min(lo + per, n);
    ull loc = 0;
    for (int k = lo; k < hi; k++) loc += (ull)a[k];
    ull inc = loc;
    for (int o = 1; o < 32; o <<= 1) {
        ull y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
    }
    unsigned cr = __ballot_sync(0xffffffffu, hi > lo && (ge ? inc >= t : inc > t));
    int res = -1;
    ull bef = __shfl_sync(0xffffffffu, inc, 31);
    if (cr) {
        int L = __ffs((int)cr) - 1;
        ull acc = inc - loc;
        if (lane == L)
            for (int k = lo; k < hi; k++) {
                ull v = acc + (ull)a[k];
                if (ge ? v >= t : v > t) { res = k; break; }
                acc = v;
            }
        res = __shfl_sync(0xffffffffu, res, L);
        bef = __shfl_sync(0xffffffffu, acc, L);
    }
    *before = bef;
    return res;
}

/* ---------------- the grid passes ---------------- */

__global__ void __launch_bounds__(SB) k_samp_z(const samp_par *P, const float *logits) {
    CU_PDL();
    __shared__ double sv[32];
    __shared__ int si[32];
    __shared__ float sf[32];
    __shared__ int sfi[32];
    int V = P->V, base = blockIdx.x * CH;
    if (blockIdx.x == 0) { /* the mass pass accumulates into these */
        for (int b = threadIdx.x; b < NB; b += SB) { P->hc[b] = 0; P->hm[b] = 0; }
        if (threadIdx.x == 0) { *P->tot_all = 0; *P->cn = 0; }
    }
    double bz = -INFINITY;
    int bid = -1;
    float rmax = -INFINITY, xv[SPT];
    for (int k = 0; k < SPT; k++) {
        int i = base + k * SB + threadIdx.x;
        xv[k] = -INFINITY;
        if (i >= V) continue;
        float x = logits[i];
        if (isfinite(x)) { rmax = fmaxf(rmax, x); xv[k] = x; }
        double z = s_z(P, logits, i);
        P->z[i] = z;
        if (s_better(z, i, bz, bid)) { bz = z; bid = i; }
    }
    blk_argmax(bz, bid, sv, si);
    rmax = blk_max_f(rmax, sf);
    if (threadIdx.x == 0) { P->p_zmax[blockIdx.x] = bz; P->p_arg[blockIdx.x] = bid; P->p_rmax[blockIdx.x] = rmax; }
    /* this block's n best raw logits (non-finite as -inf, lower id first on ties) */
    int n = P->n_logprobs;
    unsigned taken = 0;
    for (int j = 0; j < n; j++) {
        float v = -INFINITY;
        int id = NOID;
        for (int k = 0; k < SPT; k++) {
            int i = base + k * SB + threadIdx.x;
            if (i < V && !(taken >> k & 1u) && s_better(xv[k], i, v, id)) { v = xv[k]; id = i; }
        }
        blk_argmax(v, id, sf, sfi);
        if (id != NOID && id >= base && (id - base) % SB == (int)threadIdx.x) taken |= 1u << ((id - base) / SB);
        if (threadIdx.x == 0) { P->p_topv[blockIdx.x * n + j] = v; P->p_topi[blockIdx.x * n + j] = id; }
    }
}

__global__ void __launch_bounds__(SB) k_samp_mass(const samp_par *P, const float *logits) {
    CU_PDL();
    __shared__ double sv[32];
    __shared__ int si[32];
    __shared__ float sf[32];
    __shared__ ull su[32];
    __shared__ unsigned hc[NB];
    __shared__ ull hm[NB];
    double zmax;
    int arg;
    float rmax;
    s_maxes(P, &zmax, &arg, &rmax, sv, si, sf);
    int V = P->V, base = blockIdx.x * CH;
    /* log Z of the unmodified row: the CPU's sum of W(x - rmax) */
    double e = 0;
    for (int k = 0; k < SPT; k++) {
        int i = base + k * SB + threadIdx.x;
        if (i < V && isfinite(logits[i])) e += (double)expf((float)((double)logits[i] - (double)rmax));
    }
    e = blk_sum(e, sv);
    if (threadIdx.x == 0) P->p_lse[blockIdx.x] = e;
    if (P->mode == M_GREEDY || zmax == -INFINITY) return;
    double thr = P->lmp == -INFINITY ? -INFINITY : zmax + P->lmp;
    if (P->mode == M_IDORDER) {
        ull m = 0;
        for (int k = 0; k < SPT; k++) {
            int i = base + k * SB + threadIdx.x;
            if (i >= V) continue;
            double z = P->z[i];
            if (z > -INFINITY && z >= thr) m += s_q(z, zmax);
        }
        m = blk_sum(m, su);
        if (threadIdx.x == 0) P->p_mass[blockIdx.x] = m;
        return;
    }
    for (int b = threadIdx.x; b < NB; b += SB) { hc[b] = 0; hm[b] = 0; }
    __syncthreads();
    ull m = 0;
    for (int k = 0; k < SPT; k++) {
        int i = base + k * SB + threadIdx.x;
        if (i >= V) continue;
        double z = P->z[i];
        if (!(z > -INFINITY)) continue;
        ull q = s_q(z, zmax);
        int b = s_bin(z, zmax);
        atomicAdd(&hc[b], 1u);
        atomicAdd(&hm[b], q);
        m += q;
    }
    m = blk_sum(m, su);
    for (int b = threadIdx.x; b < NB; b += SB)
        if (hc[b]) { atomicAdd(&P->hc[b], hc[b]); atomicAdd(&P->hm[b], hm[b]); }
    if (threadIdx.x == 0) atomicAdd(P->tot_all, m);
}

/* The last histogram bin the candidates need: with top-k, where k tokens are reached (all of
 * the top-k set, whose mass top-p is relative to); otherwise where top-p's mass is. */
__global__ void k_samp_plan(const samp_par *P) {
    CU_PDL(); /* one warp */
    if (P->mode != M_SORTED) return;
    ull before, need = P->top_p < 1 ? (ull)ceil(P->top_p * (double)*P->tot_all) : 0;
    int b = P->top_k ? w_cross(P->hc, NB, (ull)P->top_k, 1, &before) : w_cross(P->hm, NB, need, 1, &before);
    if (threadIdx.x == 0) *P->bstar = b < 0 || b > NB - 1 ? NB - 1 : b;
}

__global__ void __launch_bounds__(SB) k_samp_gather(const samp_par *P) {
    CU_PDL();
    __shared__ double sv[32];
    __shared__ int si[32];
    __shared__ float sf[32];
    __shared__ int cnt, off;
    if (P->mode != M_SORTED) return;
    double zmax;
    int arg;
    float rmax;
    s_maxes(P, &zmax, &arg, &rmax, sv, si, sf);
    if (zmax == -INFINITY) return;
    int V = P->V, base = blockIdx.x * CH, bs = *P->bstar, slot[SPT];
    if (threadIdx.x == 0) cnt = 0;
    __syncthreads();
    for (int k = 0; k < SPT; k++) {
        int i = base + k * SB + threadIdx.x;
        slot[k] = -1;
        if (i < V && P->z[i] > -INFINITY && s_bin(P->z[i], zmax) <= bs) slot[k] = atomicAdd(&cnt, 1);
    }
    __syncthreads();
    if (threadIdx.x == 0 && cnt) off = atomicAdd(P->cn, cnt);
    __syncthreads();
    for (int k = 0; k < SPT; k++) {
        if (slot[k] < 0) continue;
        int i = base + k * SB + threadIdx.x, j = off + slot[k];
        P->cz[j] = P->z[i];
        P->cid[j] = i;
        P->cq[j] = s_q(P->z[i], zmax);
    }
}

/* ---------------- the finishing block ---------------- */

/* The candidates counted: key (z desc, id asc) at or before (Lhi, Llo) and z >= thr. */
typedef struct { ull Lhi; unsigned Llo; double thr; } rset;

__device__ __forceinline__ bool r_in(const rset &S, ull hi, unsigned lo, double z) {
    return (hi < S.Lhi || (hi == S.Lhi && lo <= S.Llo)) && z >= S.thr;
}
/* digit d (0..10) of the 88-bit key: 8 bytes of hi, then 3 of the 24-bit id */
__device__ __forceinline__ int r_digit(int d, ull hi, unsigned lo) {
    return d < 8 ? (int)((hi >> (56 - 8 * d)) & 255u) : (int)((lo >> (16 - 8 * (d - 8))) & 255u);
}
__device__ __forceinline__ bool r_match(int d, ull hi, unsigned lo, ull ph, unsigned pl) {
    if (d == 0) return true;
    if (d <= 8) return (hi >> (64 - 8 * d)) == (ph >> (64 - 8 * d));
    return hi == ph && (lo >> (24 - 8 * (d - 8))) == (pl >> (24 - 8 * (d - 8)));
}

/* Sum over the set of the weights (what = 1) or the count (what = 0). */
__device__ ull r_total(const samp_par *P, int N, const rset &S, int what, ull *su) {
    ull m = 0;
    for (int j = threadIdx.x; j < N; j += blockDim.x) {
        double z = P->cz[j];
        if (r_in(S, s_key(z), (unsigned)P->cid[j], z)) m += what ? P->cq[j] : 1;
    }
    return blk_sum(m, su);
}

/* MSB radix selection over the set in key order. mode 0: the token of rank `target`; 1: the
 * first whose inclusive cumulative weight is >= target; 2: ... > target. Returns 1 and its key,
 * or 0 when no token qualifies. */
__device__ int r_select(const samp_par *P, int N, const rset &S, int mode, ull target, ull *ohi, unsigned *olo) {
    __shared__ unsigned hc[256];
    __shared__ ull hm[256];
    __shared__ int hr[256];
    __shared__ ull ph, tg;
    __shared__ unsigned pl;
    __shared__ int state;
    if (threadIdx.x == 0) { ph = 0; pl = 0; tg = target; state = 0; }
    for (int d = 0; d < 11; d++) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) { hc[b] = 0; hm[b] = 0; hr[b] = -1; }
        __syncthreads();
        ull h0 = ph;
        unsigned l0 = pl;
        /* warp-uniform trip count; where every counted lane of a warp falls in one bin (the
         * first passes, flat rows) its leader adds for all: 32x fewer colliding atomics */
        int lane = threadIdx.x & 31;
        for (int j0 = threadIdx.x - lane; j0 < N; j0 += blockDim.x) {
            int j = j0 + lane, g = 0;
            ull q = 0;
            bool v = false;
            if (j < N) {
                double z = P->cz[j];
                ull hi = s_key(z);
                unsigned lo = (unsigned)P->cid[j];
                v = r_in(S, hi, lo, z) && r_match(d, hi, lo, h0, l0);
                if (v) { g = r_digit(d, hi, lo); q = P->cq[j]; }
            }
            unsigned vm = __ballot_sync(0xffffffffu, v);
            if (!vm) continue;
            int leader = __ffs((int)vm) - 1;
            int g0 = __shfl_sync(0xffffffffu, g, leader);
            if (__ballot_sync(0xffffffffu, v && g == g0) == vm) {
                for (int o = 16; o; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
                if (lane == leader) {
                    atomicAdd(&hc[g0], (unsigned)__popc(vm));
                    atomicAdd(&hm[g0], q);
                    hr[g0] = j; /* meaningful only where the bin holds one token */
                }
            } else if (v) {
                atomicAdd(&hc[g], 1u);
                atomicAdd(&hm[g], q);
                hr[g] = j;
            }
        }
        __syncthreads();
        if (threadIdx.x < 32) { /* warp 0 finds the bin: 8 bins a lane, a prefix sum over the lanes */
            int lane = threadIdx.x, any = 0;
            ull t = tg, loc = 0;
            for (int k = 0; k < 8; k++) {
                int b = lane * 8 + k;
                any |= hc[b] != 0;
                loc += mode == 0 ? (ull)hc[b] : hm[b];
            }
            ull inc = loc;
            for (int o = 1; o < 32; o <<= 1) {
                ull y = __shfl_up_sync(0xffffffffu, inc, o);
                if (lane >= o) inc += y;
            }
            /* the first lane whose bins hold tokens and whose running total crosses the target;
             * it walks its 8 bins as a sequential scan would */
            unsigned cross = __ballot_sync(0xffffffffu, any && (mode == 1 ? inc >= t : inc > t));
            int first = cross ? __ffs((int)cross) - 1 : 0, pick = -1;
            ull acc = inc - loc;
            if (lane == first) {
                for (int k = 0; k < 8 && cross; k++) {
                    int b = lane * 8 + k;
                    if (!hc[b]) continue;
                    ull add = mode == 0 ? (ull)hc[b] : hm[b];
                    if (mode == 1 ? acc + add >= t : acc + add > t) { pick = b; break; }
                    acc += add;
                }
                if (pick < 0) state = 2;
                else {
                    tg = t - acc;
                    if (d < 8) ph |= (ull)pick << (56 - 8 * d);
                    else pl |= (unsigned)pick << (16 - 8 * (d - 8));
                    if (hc[pick] == 1) {
                        int jj = hr[pick];
                        ph = s_key(P->cz[jj]);
                        pl = (unsigned)P->cid[jj];
                        state = 1;
                    }
                }
            }
        }
        __syncthreads();
        if (state) break;
    }
    int r = state;
    *ohi = ph; *olo = pl;
    __syncthreads();
    return r == 1;
}

__device__ __forceinline__ double s_uniform(ull *rng) { /* lily_rng_uniform: xoroshiro128+ */
    ull s0 = rng[0], s1 = rng[1], r = s0 + s1;
    s1 ^= s0;
    rng[0] = ((s0 << 24) | (s0 >> 40)) ^ s1 ^ (s1 << 16);
    rng[1] = (s1 << 37) | (s1 >> 27);
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

__global__ void __launch_bounds__(FB) k_samp_finish(const samp_par *P, const float *logits, int *tok, const int *step) {
    CU_PDL();
    __shared__ double sv[32];
    __shared__ int si[32];
    __shared__ float sf[32];
    __shared__ int sfi[32];
    __shared__ ull su[32];
    __shared__ double u_sh, lz_sh;
    __shared__ int id_sh, blk_sh;
    __shared__ ull t_sh;
    __shared__ int top_i[LILY_MAX_LOGPROBS];
    __shared__ float top_v[LILY_MAX_LOGPROBS];
    double zmax;
    int arg;
    float rmax;
    s_maxes(P, &zmax, &arg, &rmax, sv, si, sf);
    double rs = 0;
    for (int b = threadIdx.x; b < P->G; b += blockDim.x) rs += P->p_lse[b];
    rs = blk_sum(rs, sv); /* a fixed order: the same every run */
    if (threadIdx.x == 0) {
        lz_sh = rmax + log(rs);
        u_sh = P->mode != M_GREEDY ? s_uniform(P->rng) : 0;
        id_sh = -1;
    }
    __syncthreads();
    int err = zmax == -INFINITY || rmax == -INFINITY;
    if (!err && P->mode == M_GREEDY) {
        if (threadIdx.x == 0) id_sh = arg;
    } else if (!err && P->mode == M_IDORDER) {
        double thr = P->lmp == -INFINITY ? -INFINITY : zmax + P->lmp;
        if (threadIdx.x < 32) { /* warp 0: the block whose id range holds the draw */
            ull tot = 0, before;
            for (int b = threadIdx.x; b < P->G; b += 32) tot += P->p_mass[b];
            for (int o = 16; o; o >>= 1) tot += __shfl_xor_sync(0xffffffffu, tot, o);
            ull t = (ull)(u_sh * (double)tot);
            if (t >= tot) t = tot - 1;
            int b = w_cross(P->p_mass, P->G, t, 0, &before);
            if (threadIdx.x == 0) {
                blk_sh = b < 0 ? P->G - 1 : b;
                t_sh = b < 0 ? 0 : t - before;
            }
        }
        __syncthreads();
        int i = blk_sh * CH + threadIdx.x;
        double z = i < P->V ? P->z[i] : -INFINITY;
        ull q = z > -INFINITY && z >= thr ? s_q(z, zmax) : 0, inc = q;
        int lane = threadIdx.x % 32, w = threadIdx.x / 32;
        for (int o = 1; o < 32; o <<= 1) {
            ull y = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= o) inc += y;
        }
        if (lane == 31) su[w] = inc;
        __syncthreads();
        ull before = 0;
        for (int k = 0; k < w; k++) before += su[k];
        inc += before;
        if (inc - q <= t_sh && t_sh < inc) id_sh = i; /* exactly one thread: q > 0 there */
    } else if (!err) {
        int N = *P->cn;
        rset S = { ~0ull, ~0u, -INFINITY };
        ull hi;
        unsigned lo;
        if (P->top_k && N > P->top_k && r_select(P, N, S, 0, (ull)(P->top_k - 1), &hi, &lo)) { S.Lhi = hi; S.Llo = lo; }
        if (P->top_p < 1) {
            ull total = P->top_k ? r_total(P, N, S, 1, su) : *P->tot_all;
            ull need = (ull)ceil(P->top_p * (double)total);
            if (r_select(P, N, S, 1, need, &hi, &lo)) { S.Lhi = hi; S.Llo = lo; }
        }
        if (P->lmp != -INFINITY) S.thr = zmax + P->lmp;
        ull tot = r_total(P, N, S, 1, su);
        ull t = (ull)(u_sh * (double)tot);
        if (t >= tot) t = tot - 1;
        if (r_select(P, N, S, 2, t, &hi, &lo)) { if (threadIdx.x == 0) id_sh = (int)lo; }
        else if (threadIdx.x == 0) id_sh = -1;
    }
    __syncthreads();
    /* top-n of the raw row from the blocks' lists */
    int n = P->n_logprobs < P->V ? P->n_logprobs : P->V, nc = P->G * P->n_logprobs;
    for (int j = 0; j < n; j++) {
        float v = -INFINITY;
        int id = NOID, at = -1;
        for (int c = threadIdx.x; c < nc; c += blockDim.x)
            if (P->p_topi[c] != NOID && s_better(P->p_topv[c], P->p_topi[c], v, id)) { v = P->p_topv[c]; id = P->p_topi[c]; at = c; }
        int mine = id;
        blk_argmax(v, id, sf, sfi);
        if (at >= 0 && mine == id) P->p_topi[at] = NOID;
        if (threadIdx.x == 0) { top_v[j] = v; top_i[j] = id; }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        int id = id_sh;
        err = err || id < 0;
        double lz = lz_sh;
        float x = err ? 0 : logits[id];
        float lp = isfinite(x) ? (float)(x - lz) : -INFINITY;
        int *r = P->ring + (*step % LCU_RING) * RS;
        r[0] = err ? -1 : id;
        r[1] = __float_as_int(lp);
        r[2] = n;
        r[3] = err;
        for (int j = 0; j < n; j++) {
            r[4 + j] = top_i[j];
            r[4 + LILY_MAX_LOGPROBS + j] = __float_as_int((float)(top_v[j] - lz));
        }
        tok[0] = err ? 0 : id;
        tok[1] = __float_as_int(lp);
        if (!err) P->counts[id]++;
        __threadfence_system();
    }
}

void cu_sampler_enqueue(cu_sampler *c, cudaStream_t s, const float *logits, int *tok, const int *step) {
    cu_go(k_samp_z, c->G, SB, 0, s)(c->d, logits);
    cu_go(k_samp_mass, c->G, SB, 0, s)(c->d, logits);
    cu_go(k_samp_plan, 1, 32, 0, s)(c->d);
    cu_go(k_samp_gather, c->G, SB, 0, s)(c->d);
    cu_go(k_samp_finish, 1, FB, 0, s)(c->d, logits, tok, step);
}
