/* The CUDA backend's model: whether a GPU is there, the weights' upload (straight from the mapped
 * files, with progress), the memory check. Sessions with their device caches and snapshots are in
 * cu_session.cu, the forward pass in cu_forward.cu. */
#include "cuda/cu_model.h"
#include "cuda/cu_sample.h"
#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
#include <math.h>

int lcuda_available(char *why, size_t n) {
    int cnt = 0;
    cudaError_t e = cudaGetDeviceCount(&cnt);
    if (e != cudaSuccess || cnt == 0) {
        snprintf(why, n, "no CUDA GPU found (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 0;
    }
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) { snprintf(why, n, "cannot read the GPU's properties"); return 0; }
    cudaFuncAttributes fa;
    e = cudaFuncGetAttributes(&fa, (const void *)cu_probe_kernel());
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(why, n, "GPU %s (compute capability %d.%d) cannot run this build's kernels (%s); rebuild with CUDA_ARCH matching it",
                 p.name, p.major, p.minor, cudaGetErrorString(e));
        return 0;
    }
    return 1;
}

lily_code cu_model_alloc(lcuda_model *m, void **p, size_t n, lily_status *st) {
    if (m->n_alloc == m->cap_alloc) {
        int nc = m->cap_alloc ? 2 * m->cap_alloc : 256;
        void **na = (void **)realloc(m->allocs, (size_t)nc * sizeof *na);
        if (!na) return lily_err(st, LILY_ENOMEM, "out of host memory");
        m->allocs = na;
        m->cap_alloc = nc;
    }
    cudaError_t e = cudaMalloc(p, n ? n : 16);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        return lily_err(st, LILY_ENOMEM, "GPU out of memory: %.2f GB more needed after %.2f GB of weights (%.2f GB free of %.2f GB)",
                        n / 1e9, m->bytes / 1e9, fr / 1e9, tot / 1e9);
    }
    m->allocs[m->n_alloc++] = *p;
    m->bytes += n;
    return LILY_OK;
}

void lcuda_model_free(lcuda_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_alloc; i++) cudaFree(m->allocs[i]);
    free(m->allocs);
    free(m->L);
    free(m);
}

uint64_t lcuda_model_bytes(const lcuda_model *m) { return m->bytes; }

/* ---- upload ---- */
typedef struct {
    lcuda_model *m;
    void (*progress)(void *, uint64_t, uint64_t);
    void *pu;
    uint64_t done, total;
    lily_status *st;
} up_ctx;

static size_t mat_w_bytes(const lw_mat *w) { return cu_mat_w_bytes(w->type, w->rows, w->cols, w->bits); }
static size_t mat_s_bytes(const lw_mat *w) { return cu_mat_s_bytes(w->type, w->rows, w->cols, w->group, w->sb_type); }

/* the largest |scale| of a quantized matrix (host copy), for dmat.sexp */
static float max_scale(const lw_mat *w) {
    const size_t n = (size_t)w->rows * (w->cols / w->group);
    float mx = 0;
    for (size_t i = 0; i < n; i++) {
        float v = w->sb_type == LW_F32 ? ((const float *)w->scales)[i]
                : w->sb_type == LW_BF16 ? lily_bf16_to_f32(((const uint16_t *)w->scales)[i])
                                        : lily_f16_to_f32(((const uint16_t *)w->scales)[i]);
        v = fabsf(v);
        if (!(v <= mx)) mx = v; /* NaN too: it makes the matrix not fit */
    }
    return mx;
}

static lily_code copy_up(up_ctx *u, void *dst, const void *src, size_t n) {
    lily_status *st = u->st;
    LCU_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
    u->done += n;
    if (u->progress) u->progress(u->pu, u->done, u->total);
    return LILY_OK;
}

/* n matrices of one shape (experts, or n = 1) into one stack. */
static lily_code up_mats(up_ctx *u, const lw_mat *src, int n, dmat *d) {
    const lw_mat *w = &src[0];
    memset(d, 0, sizeof *d);
    d->type = w->type; d->rows = w->rows; d->cols = w->cols; d->bits = w->bits; d->group = w->group; d->sbt = w->sb_type;
    if (w->type == LW_Q && ((w->group % 8) || (w->bits != 4 && w->bits != 8)))
        return lily_err(u->st, LILY_EUNSUPPORTED, "CUDA backend: quantized matrix with %d bits, group %d (needs 4 or 8 bits, group a multiple of 8)", w->bits, w->group);
    size_t wb = mat_w_bytes(w), sb = mat_s_bytes(w);
    d->ew = (long long)wb;
    d->es = (long long)sb;
    void *pw, *ps = NULL, *pb = NULL;
    lily_code rc = cu_model_alloc(u->m, &pw, wb * n, u->st);
    if (!rc && sb) rc = cu_model_alloc(u->m, &ps, sb * n, u->st);
    if (!rc && sb) rc = cu_model_alloc(u->m, &pb, sb * n, u->st);
    if (rc) return rc;
    for (int e = 0; e < n && !rc; e++) {
        if (src[e].type != w->type || src[e].rows != w->rows || src[e].cols != w->cols || src[e].sb_type != w->sb_type || src[e].bits != w->bits)
            return lily_err(u->st, LILY_EFORMAT, "CUDA backend: experts of one layer differ in type or shape");
        rc = copy_up(u, (char *)pw + wb * e, src[e].w, wb);
        if (!rc && sb) rc = copy_up(u, (char *)ps + sb * e, src[e].scales, sb);
        if (!rc && sb) rc = copy_up(u, (char *)pb + sb * e, src[e].biases, sb);
    }
    d->w = pw; d->s = ps; d->b = pb;
    if (w->type == LW_Q) {
        float mx = 0;
        for (int e = 0; e < n; e++) {
            const float v = max_scale(&src[e]);
            if (!(v <= mx)) mx = v;
        }
        d->sexp = cu_q_sexp(mx);
    }
    return rc;
}

static lily_code up_vec(up_ctx *u, const float *v, size_t n, float **d) {
    lily_code rc = cu_model_alloc(u->m, (void **)d, n * sizeof(float), u->st);
    return rc ? rc : copy_up(u, *d, v, n * sizeof(float));
}

lily_code cu_upload_mats(lcuda_model *m, const lw_mat *src, int n, dmat *d, lily_status *st) {
    up_ctx u = { m, NULL, NULL, 0, 0, st };
    return up_mats(&u, src, n, d);
}

static uint64_t mats_bytes(const lw_mat *m, int n) {
    uint64_t b = 0;
    for (int i = 0; i < n; i++) b += mat_w_bytes(&m[i]) + 2 * mat_s_bytes(&m[i]);
    return b;
}


lily_code cu_model_finish(lcuda_model *m, lily_status *st) {
    const lily_config *c = &m->cfg;
    m->chunk = m->max_ctx < 2048 ? m->max_ctx : 2048;
    int half = c->rot_dim / 2;
    float *inv = (float *)malloc((size_t)(half + 1) * sizeof(float));
    if (!inv) return lily_err(st, LILY_ENOMEM, "out of memory");
    for (int i = 0; i < half; i++) { /* exactly the CPU reference's table */
        float f = 1.0f / powf((float)c->rope_theta, (float)(2 * i) / (float)c->rot_dim);
        if (c->rope_bf16_freq) f = lily_bf16_to_f32(lily_f32_to_bf16(f));
        inv[i] = f;
    }
    lily_code rc = cu_model_alloc(m, (void **)&m->inv_freq, (size_t)(half + 1) * sizeof(float), st);
    if (!rc && half) {
        cudaError_t e = cudaMemcpy(m->inv_freq, inv, (size_t)half * sizeof(float), cudaMemcpyHostToDevice);
        if (e != cudaSuccess) rc = cu_fail(st, e, "rope table", __FILE__, __LINE__);
    }
    free(inv);
    for (int l = 0; l < c->n_layers && !rc; l++) { /* the prefill router's copy (cu_router.cu) */
        cu_layer *L = &m->L[l];
        const dmat *R = &L->router;
        const size_t n = cu_router_frag_floats(R->type, R->bits, R->group, R->rows, R->cols);
        if (!n) continue;
        rc = cu_model_alloc(m, (void **)&L->rtr, n * sizeof(float), st);
        if (!rc) cu_router_frag(0, &L->router, L->rtr);
    }
    if (!rc) { /* done before any session's stream (non-blocking: no order with stream 0) reads it */
        cudaError_t e = cudaDeviceSynchronize();
        if (e == cudaSuccess) e = cudaGetLastError();
        if (e != cudaSuccess) rc = cu_fail(st, e, "router copy", __FILE__, __LINE__);
    }
    return rc;
}

static lily_code check_shape(const lily_config *c, lily_status *st) {
    if (c->lin_dv > 1024 || c->lin_dv < 1 || c->lin_nk < 1 || c->lin_nv % c->lin_nk)
        return lily_err(st, LILY_EUNSUPPORTED, "CUDA backend: DeltaNet value dim %d / heads %d/%d unsupported", c->lin_dv, c->lin_nk, c->lin_nv);
    if (c->head_dim % 32 || c->head_dim > 512 || c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads)
        return lily_err(st, LILY_EUNSUPPORTED, "CUDA backend: attention head dim %d (needs a multiple of 32, at most 512) or heads %d/%d unsupported",
                        c->head_dim, c->n_heads, c->n_kv_heads);
    if (c->conv_k < 1 || c->conv_k > 8) return lily_err(st, LILY_EUNSUPPORTED, "CUDA backend: conv kernel %d > 8", c->conv_k);
    if (c->n_experts > 2048 || c->top_k > c->n_experts) return lily_err(st, LILY_EUNSUPPORTED, "CUDA backend: %d experts unsupported", c->n_experts);
    return LILY_OK;
}

static lily_code check_fits(const lily_config *c, uint64_t weights, int max_ctx, int max_sessions, lily_status *st) {
    size_t fr = 0, tot = 0;
    cudaError_t e = cudaMemGetInfo(&fr, &tot);
    if (e != cudaSuccess) return cu_fail(st, e, "cudaMemGetInfo", __FILE__, __LINE__);
    int chunk = max_ctx < 2048 ? max_ctx : 2048;
    uint64_t need = weights + (uint64_t)max_sessions * cu_session_bytes(c, max_ctx, chunk) + (256ull << 20);
    if (need > fr)
        return lily_err(st, LILY_ENOMEM, "the model does not fit on the GPU: %.2f GB needed (%.2f GB weights + %d session(s) of %d tokens at %.2f GB each), %.2f GB free of %.2f GB; lower --ctx-len or the session count",
                        need / 1e9, weights / 1e9, max_sessions, max_ctx, cu_session_bytes(c, max_ctx, chunk) / 1e9, fr / 1e9, tot / 1e9);
    return LILY_OK;
}

lily_code lcuda_model_new(const lily_weights *w, int max_ctx, int max_sessions,
                          void (*progress)(void *, uint64_t, uint64_t), void *progress_user,
                          lcuda_model **out, lily_status *st) {
    *out = NULL;
    char why[256];
    if (!lcuda_available(why, sizeof why)) return lily_err(st, LILY_EDEVICE, "%s", why);
    const lily_config *c = &w->cfg;
    lily_code rc = check_shape(c, st);
    if (rc) return rc;
    int H = c->hidden, E = c->n_experts, cd = cfg_conv_dim(c);
    uint64_t total = mats_bytes(&w->embed, 1) + mats_bytes(&w->lm_head, 1) + (uint64_t)H * 4;
    for (int l = 0; l < c->n_layers; l++) {
        const lily_layer *L = &w->layers[l];
        total += 2ull * H * 4;
        if (L->full_attn) total += mats_bytes(&L->q, 1) + mats_bytes(&L->k, 1) + mats_bytes(&L->v, 1) + mats_bytes(&L->o, 1) + 2ull * c->head_dim * 4;
        else total += mats_bytes(&L->qkv, 1) + mats_bytes(&L->z, 1) + mats_bytes(&L->b, 1) + mats_bytes(&L->a, 1) + mats_bytes(&L->out, 1)
                      + ((uint64_t)cd * c->conv_k + 2ull * c->lin_nv + c->lin_dv) * 4;
        total += cu_router_frag_floats(L->router.type, L->router.bits, L->router.group, L->router.rows, L->router.cols) * 4;
        total += mats_bytes(&L->router, 1) + mats_bytes(L->gate, E) + mats_bytes(L->up, E) + mats_bytes(L->down, E);
        if (c->shared_inter) total += mats_bytes(&L->sh_gate, 1) + mats_bytes(&L->sh_up, 1) + mats_bytes(&L->sh_down, 1) + mats_bytes(&L->sh_router, 1);
    }
    if (max_sessions < 1) max_sessions = 1;
    if ((rc = check_fits(c, total, max_ctx, max_sessions, st))) return rc;
    lcuda_model *m = (lcuda_model *)calloc(1, sizeof *m);
    if (!m) return lily_err(st, LILY_ENOMEM, "out of memory");
    m->cfg = *c;
    m->max_ctx = max_ctx;
    m->max_sessions = max_sessions;
    m->L = (cu_layer *)calloc((size_t)c->n_layers, sizeof *m->L);
    if (!m->L) { free(m); return lily_err(st, LILY_ENOMEM, "out of memory"); }
    up_ctx u = { m, progress, progress_user, 0, total, st };
    rc = up_mats(&u, &w->embed, 1, &m->embed);
    if (!rc) rc = up_mats(&u, &w->lm_head, 1, &m->lm_head);
    if (!rc) rc = up_vec(&u, w->norm, H, &m->norm);
    for (int l = 0; l < c->n_layers && !rc; l++) {
        const lily_layer *L = &w->layers[l];
        cu_layer *D = &m->L[l];
        D->full = L->full_attn;
        rc = up_vec(&u, L->ln1, H, &D->ln1);
        if (!rc) rc = up_vec(&u, L->ln2, H, &D->ln2);
        if (L->full_attn) {
            if (!rc) rc = up_mats(&u, &L->q, 1, &D->q);
            if (!rc) rc = up_mats(&u, &L->k, 1, &D->k);
            if (!rc) rc = up_mats(&u, &L->v, 1, &D->v);
            if (!rc) rc = up_mats(&u, &L->o, 1, &D->o);
            if (!rc) rc = up_vec(&u, L->q_norm, c->head_dim, &D->q_norm);
            if (!rc) rc = up_vec(&u, L->k_norm, c->head_dim, &D->k_norm);
        } else {
            if (!rc) rc = up_mats(&u, &L->qkv, 1, &D->qkv);
            if (!rc) rc = up_mats(&u, &L->z, 1, &D->z);
            if (!rc) rc = up_mats(&u, &L->b, 1, &D->b);
            if (!rc) rc = up_mats(&u, &L->a, 1, &D->a);
            if (!rc) rc = up_mats(&u, &L->out, 1, &D->out);
            if (!rc) rc = up_vec(&u, L->conv_w, (size_t)cd * c->conv_k, &D->conv_w);
            if (!rc) rc = up_vec(&u, L->A_log, c->lin_nv, &D->A_log);
            if (!rc) rc = up_vec(&u, L->dt_bias, c->lin_nv, &D->dt_bias);
            if (!rc) rc = up_vec(&u, L->gnorm, c->lin_dv, &D->gnorm);
        }
        if (!rc) rc = up_mats(&u, &L->router, 1, &D->router);
        if (!rc) rc = up_mats(&u, L->gate, E, &D->gate);
        if (!rc) rc = up_mats(&u, L->up, E, &D->up);
        if (!rc) rc = up_mats(&u, L->down, E, &D->down);
        if (c->shared_inter) {
            if (!rc) rc = up_mats(&u, &L->sh_gate, 1, &D->sh_gate);
            if (!rc) rc = up_mats(&u, &L->sh_up, 1, &D->sh_up);
            if (!rc) rc = up_mats(&u, &L->sh_down, 1, &D->sh_down);
            if (!rc) rc = up_mats(&u, &L->sh_router, 1, &D->sh_router);
        }
    }
    if (!rc) rc = cu_model_finish(m, st);
    if (rc) { lcuda_model_free(m); return rc; }
    *out = m;
    return LILY_OK;
}
