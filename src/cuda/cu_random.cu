/* A random-weight model of any shape made directly in GPU memory (MLX layout: 4-bit
 * affine codes, group 64, bf16 scales and biases; 8-bit router and shared-expert gate),
 * so lily-bench can time the full-size model without a 20 GB file. */
#include "cuda/cu_model.h"
#include <stdlib.h>
#include <math.h>

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return (uint32_t)x;
}
__global__ void k_fill_u32(uint32_t *p, size_t n, uint64_t seed) {
    CU_PDL();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = hash32(seed * 0x9e3779b97f4a7c15ull + i);
}
/* bf16 values uniform in [lo, hi) */
__global__ void k_fill_bf16(uint16_t *p, size_t n, uint64_t seed, float lo, float hi) {
    CU_PDL();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float u = (hash32(seed * 0x9e3779b97f4a7c15ull + i) >> 8) * (1.0f / 16777216.0f);
        float v = lo + (hi - lo) * u;
        p[i] = (uint16_t)(__float_as_uint(v) >> 16);
    }
}
__global__ void k_fill_f32(float *p, size_t n, uint64_t seed, float lo, float hi) {
    CU_PDL();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float u = (hash32(seed * 0x9e3779b97f4a7c15ull + i) >> 8) * (1.0f / 16777216.0f);
        p[i] = lo + (hi - lo) * u;
    }
}

typedef struct { lcuda_model *m; uint64_t seed; lily_status *st; } rctx;

/* grid-stride fills: no more blocks than elements need (small models on the emulator) */
static unsigned fill_blocks(size_t n) { size_t b = (n + 255) / 256; return b < 1 ? 1 : b > 1024 ? 1024 : (unsigned)b; }

/* n stacked [rows][cols] matrices; weights spread +-amp (amp ~ 1/sqrt(cols)). */
static lily_code rmat(rctx *r, int n, int rows, int cols, int bits, dmat *d) {
    memset(d, 0, sizeof *d);
    d->type = LW_Q; d->rows = rows; d->cols = cols; d->bits = bits; d->group = 64; d->sbt = LW_BF16;
    size_t wb = (size_t)rows * cols * bits / 8, sb = (size_t)rows * (cols / 64) * 2;
    d->ew = (long long)wb; d->es = (long long)sb;
    void *w, *s, *b;
    lily_code rc = cu_model_alloc(r->m, &w, wb * n, r->st);
    if (!rc) rc = cu_model_alloc(r->m, &s, sb * n, r->st);
    if (!rc) rc = cu_model_alloc(r->m, &b, sb * n, r->st);
    if (rc) return rc;
    float amp = 1.7f / sqrtf((float)cols), qmax = (float)((1 << bits) - 1);
    float sc = 2 * amp / qmax;
    cu_go(k_fill_u32, fill_blocks(wb * n / 4), 256)((uint32_t *)w, wb * n / 4, ++r->seed);
    cu_go(k_fill_bf16, fill_blocks(sb * n / 2), 256)((uint16_t *)s, sb * n / 2, ++r->seed, 0.8f * sc, 1.2f * sc);
    cu_go(k_fill_bf16, fill_blocks(sb * n / 2), 256)((uint16_t *)b, sb * n / 2, ++r->seed, -1.1f * amp, -0.9f * amp);
    d->w = w; d->s = s; d->b = b;
    d->sexp = cu_q_sexp(1.2f * sc);
    return LILY_OK;
}

static lily_code rvec(rctx *r, size_t n, float lo, float hi, float **d) {
    lily_code rc = cu_model_alloc(r->m, (void **)d, n * sizeof(float), r->st);
    if (!rc) cu_go(k_fill_f32, fill_blocks(n), 256)(*d, n, ++r->seed, lo, hi);
    return rc;
}

lily_code lcuda_model_random(const lily_config *c, int max_ctx, uint64_t seed, lcuda_model **out, lily_status *st) {
    *out = NULL;
    char why[256];
    if (!lcuda_available(why, sizeof why)) return lily_err(st, LILY_EDEVICE, "%s", why);
    if (c->hidden % 64 || c->moe_inter % 64 || cfg_val_dim(c) % 64 || (c->n_heads * c->head_dim) % 64 || (c->shared_inter % 64))
        return lily_err(st, LILY_EUNSUPPORTED, "random GPU model: every input dim must be a multiple of 64");
    lcuda_model *m = (lcuda_model *)calloc(1, sizeof *m);
    if (!m) return lily_err(st, LILY_ENOMEM, "out of memory");
    m->cfg = *c;
    m->max_ctx = max_ctx;
    m->max_sessions = 1;
    m->L = (cu_layer *)calloc((size_t)c->n_layers, sizeof *m->L);
    if (!m->L) { free(m); return lily_err(st, LILY_ENOMEM, "out of memory"); }
    rctx r = { m, seed, st };
    int H = c->hidden, E = c->n_experts, I = c->moe_inter, cd = cfg_conv_dim(c), vd = cfg_val_dim(c);
    int nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim, nv = c->lin_nv;
    lily_code rc = rmat(&r, 1, c->vocab, H, 4, &m->embed);
    if (!rc) rc = rmat(&r, 1, c->vocab, H, 4, &m->lm_head);
    if (!rc) rc = rvec(&r, H, 0.9f, 1.1f, &m->norm);
    for (int l = 0; l < c->n_layers && !rc; l++) {
        cu_layer *L = &m->L[l];
        L->full = c->full_attn[l];
        rc = rvec(&r, H, 0.9f, 1.1f, &L->ln1);
        if (!rc) rc = rvec(&r, H, 0.9f, 1.1f, &L->ln2);
        if (L->full) {
            if (!rc) rc = rmat(&r, 1, nh * 2 * hd, H, 4, &L->q);
            if (!rc) rc = rmat(&r, 1, nkv * hd, H, 4, &L->k);
            if (!rc) rc = rmat(&r, 1, nkv * hd, H, 4, &L->v);
            if (!rc) rc = rmat(&r, 1, H, nh * hd, 4, &L->o);
            if (!rc) rc = rvec(&r, hd, 0.9f, 1.1f, &L->q_norm);
            if (!rc) rc = rvec(&r, hd, 0.9f, 1.1f, &L->k_norm);
        } else {
            if (!rc) rc = rmat(&r, 1, cd, H, 4, &L->qkv);
            if (!rc) rc = rmat(&r, 1, vd, H, 4, &L->z);
            if (!rc) rc = rmat(&r, 1, nv, H, 4, &L->b);
            if (!rc) rc = rmat(&r, 1, nv, H, 4, &L->a);
            if (!rc) rc = rmat(&r, 1, H, vd, 4, &L->out);
            if (!rc) rc = rvec(&r, (size_t)cd * c->conv_k, -0.5f, 0.5f, &L->conv_w);
            if (!rc) rc = rvec(&r, nv, 0.0f, 2.7f, &L->A_log);
            if (!rc) rc = rvec(&r, nv, -1.0f, 1.0f, &L->dt_bias);
            if (!rc) rc = rvec(&r, c->lin_dv, 0.9f, 1.1f, &L->gnorm);
        }
        if (!rc) rc = rmat(&r, 1, E, H, 8, &L->router);
        if (!rc) rc = rmat(&r, E, I, H, 4, &L->gate);
        if (!rc) rc = rmat(&r, E, I, H, 4, &L->up);
        if (!rc) rc = rmat(&r, E, H, I, 4, &L->down);
        if (c->shared_inter) {
            if (!rc) rc = rmat(&r, 1, c->shared_inter, H, 4, &L->sh_gate);
            if (!rc) rc = rmat(&r, 1, c->shared_inter, H, 4, &L->sh_up);
            if (!rc) rc = rmat(&r, 1, H, c->shared_inter, 4, &L->sh_down);
            if (!rc) rc = rmat(&r, 1, 1, H, 8, &L->sh_router);
        }
    }
    if (!rc) rc = cu_model_finish(m, st);
    if (!rc) {
        cudaError_t e = cudaDeviceSynchronize();
        if (e == cudaSuccess) e = cudaGetLastError();
        if (e != cudaSuccess) rc = cu_fail(st, e, "random weights", __FILE__, __LINE__);
    }
    if (rc) { lcuda_model_free(m); return rc; }
    *out = m;
    return LILY_OK;
}
