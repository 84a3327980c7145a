/* The CUDA backend's sessions: device caches (KV, conv and delta-rule state, scratch sized for a
 * prefill chunk), their memory, reset, and the snapshots of the recurrent state (save, load, copies
 * to and from the host for parking). */
#include "cuda/cu_model.h"
#include "cuda/cu_sample.h"
#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
#include <math.h>

/* ---- sessions ---- */
typedef struct { void **p; size_t n; } sbuf;

/* the widest input a prefill projection packs into the session's xpx (proj, cu_moe_gate_up_xp) */
static uint64_t xp_cols(const lily_config *c) {
    uint64_t n = c->hidden;
    const uint64_t v[3] = { (uint64_t)cfg_val_dim(c), (uint64_t)c->n_heads * c->head_dim, (uint64_t)c->shared_inter };
    for (int i = 0; i < 3; i++) n = v[i] > n ? v[i] : n;
    return n;
}

static uint64_t scratch_bytes(const lily_config *c, int T) {
    uint64_t H = c->hidden, cd = cfg_conv_dim(c), vd = cfg_val_dim(c), nv = c->lin_nv, nh = c->n_heads, hd = c->head_dim;
    uint64_t nkv = c->n_kv_heads, E = c->n_experts, K = c->top_k, I = c->moe_inter, SI = c->shared_inter ? c->shared_inter : 1;
    size_t p1 = cu_attention_part_floats(T, (int)nh, (int)hd, 1), p2 = cu_attention_part_floats(1, (int)nh, (int)hd, DECODE_SPLITS);
    uint64_t f = 3 * T * H + 2 * T * cd + 2 * T * vd + 4 * T * nv + T * nh * 2 * hd + 2 * T * nh * hd + 2 * T * nkv * hd
                 + (p1 > p2 ? p1 : p2) + T * E + T * K + 2 * T * K * I + T * K * H + 2 * T * SI + T + T * H + c->vocab;
    uint64_t i = 3 * T * K + 2 * E + 16 + (uint64_t)cu_moe_max_tiles((int)(T * K), (int)E, 16);
    f += cu_gdn_chunk_scratch_floats((int)T, (int)nv, c->lin_dk, c->lin_dv);
    f += (T * xp_cols(c) + 7) / 2 + ((T * K + 16) * I + 7) / 2 + (T * (H > SI ? H : SI) + 7) / 2; /* xpx, xph, xps */
    return (f + i) * 4 + 64 * 43;
}

uint64_t cu_session_bytes(const lily_config *c, int max_ctx, int chunk) {
    int n_full = cfg_n_full(c), n_lin = c->n_layers - n_full;
    uint64_t rec = (uint64_t)n_lin * ((uint64_t)cfg_conv_dim(c) * (c->conv_k - 1) + (uint64_t)c->lin_nv * c->lin_dk * c->lin_dv) * 4;
    uint64_t kv = 2ull * n_full * max_ctx * c->n_kv_heads * c->head_dim * sizeof(*((lcuda_session *)0)->kc); /* (fp16) */
    return rec * (1 + LCU_SNAPSHOTS) + kv + scratch_bytes(c, chunk);
}

void cu_graphs_drop(lcuda_session *s) {
    for (int i = 0; i < 2; i++) {
        if (s->graph[i]) cudaGraphExecDestroy(s->graph[i]);
        if (s->fgraph[i]) cudaGraphExecDestroy(s->fgraph[i]);
        s->graph[i] = s->fgraph[i] = NULL;
    }
    cu_batch_graphs_drop(s);
    if (s->samp) cu_sampler_graphs_drop(s->samp);
}

void lcuda_session_free(lcuda_session *s) {
    if (!s) return;
    if (s->st) cudaStreamSynchronize(s->st);
    cu_graphs_drop(s);
    cu_sampler_free(s->samp);
    float **fl[] = { &s->conv, &s->S, (float **)&s->kc, (float **)&s->vc, &s->x, &s->t, &s->y, &s->mixed, &s->u, &s->zb, &s->bb, &s->aa, &s->g, &s->beta,
                     &s->o, &s->qg, &s->q, &s->kb, &s->vb, &s->ao, &s->part, &s->rl, &s->wt, &s->hg, &s->hu, &s->D, &s->sg,
                     &s->su, &s->sr, &s->SD, &s->lg, &s->gdn_scr, (float **)&s->xpx, (float **)&s->xph, (float **)&s->xps };
    for (size_t i = 0; i < sizeof fl / sizeof *fl; i++) cudaFree(*fl[i]);
    int **il[] = { &s->d_ids, &s->d_pos, &s->d_tok, &s->d_step, &s->sel, &s->cnt, &s->off, &s->src, &s->spos, &s->tiles,
                   (int **)&s->fcount };
    for (size_t i = 0; i < sizeof il / sizeof *il; i++) cudaFree(*il[i]);
    for (int i = 0; i < LCU_SNAPSHOTS; i++) { cudaFree(s->snap_conv[i]); cudaFree(s->snap_S[i]); }
    if (s->ring_h) cudaFreeHost(s->ring_h);
    if (s->ids_h) cudaFreeHost(s->ids_h);
    cudaFree(s->bmeta_d);
    if (s->bmeta_h) cudaFreeHost(s->bmeta_h);
    for (int i = 0; i < 4; i++) if (s->ev[i]) cudaEventDestroy(s->ev[i]);
    if (s->evf) cudaEventDestroy(s->evf);
    if (s->evj) cudaEventDestroy(s->evj);
    if (s->evp) cudaEventDestroy(s->evp);
    if (s->st2) { cudaStreamSynchronize(s->st2); cudaStreamDestroy(s->st2); }
    if (s->st) cudaStreamDestroy(s->st);
    free(s);
}

lily_code lcuda_session_new(lcuda_model *m, lcuda_session **out, lily_status *st) {
    *out = NULL;
    const lily_config *c = &m->cfg;
    lcuda_session *s = (lcuda_session *)calloc(1, sizeof *s);
    if (!s) return lily_err(st, LILY_ENOMEM, "out of memory");
    s->m = m;
    s->n_full = cfg_n_full(c);
    s->n_lin = c->n_layers - s->n_full;
    s->conv_n = (size_t)cfg_conv_dim(c) * (c->conv_k - 1);
    s->S_n = (size_t)c->lin_nv * c->lin_dk * c->lin_dv;
    s->kv_n = (size_t)m->max_ctx * c->n_kv_heads * c->head_dim;
    size_t T = (size_t)m->chunk, H = c->hidden, cd = cfg_conv_dim(c), vd = cfg_val_dim(c), nv = c->lin_nv;
    size_t nh = c->n_heads, hd = c->head_dim, nkv = c->n_kv_heads, E = c->n_experts, K = c->top_k, I = c->moe_inter;
    size_t SI = c->shared_inter ? c->shared_inter : 1;
    size_t p1 = cu_attention_part_floats((int)T, (int)nh, (int)hd, 1), p2 = cu_attention_part_floats(1, (int)nh, (int)hd, DECODE_SPLITS);
    s->lg_rows = 1;
    size_t xpc = xp_cols(c);
    struct { float **p; size_t n; } f[] = {
        { &s->conv, s->n_lin * s->conv_n }, { &s->S, s->n_lin * s->S_n }, { (float **)&s->kc, (s->n_full * s->kv_n + 1) / 2 },
        { (float **)&s->vc, (s->n_full * s->kv_n + 1) / 2 },
        { &s->x, T * H }, { &s->t, T * H }, { &s->y, T * H }, { &s->mixed, T * cd }, { &s->u, T * cd }, { &s->zb, T * vd },
        { &s->bb, T * nv }, { &s->aa, T * nv }, { &s->g, T * nv }, { &s->beta, T * nv }, { &s->o, T * vd },
        { &s->qg, T * nh * 2 * hd }, { &s->q, T * nh * hd }, { &s->kb, T * nkv * hd }, { &s->vb, T * nkv * hd }, { &s->ao, T * nh * hd },
        { &s->part, p1 > p2 ? p1 : p2 }, { &s->rl, T * E }, { &s->wt, T * K }, { &s->hg, (T * K + 1) * I }, { &s->hu, (T * K + 1) * I },
        { &s->D, moe_d_floats(m) }, { &s->sg, T * SI }, { &s->su, T * SI }, { &s->sr, T }, { &s->SD, T * H }, { &s->lg, (size_t)c->vocab },
        { &s->gdn_scr, cu_gdn_chunk_scratch_floats((int)T, (int)nv, c->lin_dk, c->lin_dv) },
        { (float **)&s->xpx, (T * xpc + 7) / 2 }, { (float **)&s->xph, ((T * K + 16) * I + 7) / 2 },
        { (float **)&s->xps, (T * (H > SI ? H : SI) + 7) / 2 } };
    lily_code rc = LILY_OK;
    cudaError_t e = cudaStreamCreateWithFlags(&s->st, cudaStreamNonBlocking);
    if (e != cudaSuccess) { rc = cu_fail(st, e, "cudaStreamCreate", __FILE__, __LINE__); goto fail; }
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        e = cudaMalloc((void **)f[i].p, (f[i].n ? f[i].n : 1) * sizeof(float));
        if (e != cudaSuccess) goto oom;
    }
    {
        struct { int **p; size_t n; } ii[] = { { &s->d_ids, T }, { &s->d_pos, 1 }, { &s->d_tok, 2 }, { &s->d_step, 1 }, { &s->sel, T * K },
                                                { &s->cnt, E }, { &s->off, E }, { &s->src, T * K }, { &s->spos, T * K },
                                                { &s->tiles, (size_t)cu_moe_max_tiles((int)(T * K), (int)E, 16) },
                                                { (int **)&s->fcount, FCOUNT_N } };
        for (size_t i = 0; i < sizeof ii / sizeof *ii; i++) {
            e = cudaMalloc((void **)ii[i].p, ii[i].n * sizeof(int));
            if (e != cudaSuccess) goto oom;
        }
        e = cudaMemset(s->fcount, 0, (FCOUNT_N) * sizeof(unsigned));
        if (e != cudaSuccess) { rc = cu_fail(st, e, "cudaMemset", __FILE__, __LINE__); goto fail; }
    }
    e = cudaHostAlloc((void **)&s->ring_h, LCU_RING * 2 * sizeof(int), cudaHostAllocMapped);
    if (e != cudaSuccess) { rc = cu_fail(st, e, "cudaHostAlloc", __FILE__, __LINE__); goto fail; }
    e = cudaHostGetDevicePointer((void **)&s->ring_d, s->ring_h, 0);
    if (e != cudaSuccess) { rc = cu_fail(st, e, "cudaHostGetDevicePointer", __FILE__, __LINE__); goto fail; }
    /* (here, not on first use: an allocation of page-locked memory in the middle of other sessions'
     * passes may wait for them) */
    e = cudaHostAlloc((void **)&s->ids_h, (size_t)m->chunk * sizeof(int32_t), cudaHostAllocDefault);
    if (e != cudaSuccess) { s->ids_h = NULL; rc = cu_fail(st, e, "cudaHostAlloc", __FILE__, __LINE__); goto fail; }
    for (int i = 0; i < 4; i++) {
        e = cudaEventCreateWithFlags(&s->ev[i], cudaEventDisableTiming);
        if (e != cudaSuccess) { rc = cu_fail(st, e, "cudaEventCreate", __FILE__, __LINE__); goto fail; }
    }
    /* the second stream for the shared expert at prefill (moe_shared_side); LILY_CU_SIDE=0: none */
    static int side_env = -1;
    if (cu_env_flag(&side_env, "LILY_CU_SIDE", 1)) {
        e = cudaStreamCreateWithFlags(&s->st2, cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->evf, cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->evj, cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->evp, cudaEventDisableTiming);
        if (e != cudaSuccess) { rc = cu_fail(st, e, "second stream", __FILE__, __LINE__); goto fail; }
    }
    lcuda_session_reset(s);
    e = cudaStreamSynchronize(s->st);
    if (e != cudaSuccess) { rc = cu_fail(st, e, "session init", __FILE__, __LINE__); goto fail; }
    *out = s;
    return LILY_OK;
oom:
    cudaGetLastError();
    {
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        rc = lily_err(st, LILY_ENOMEM, "GPU out of memory for a session of %d tokens: %.2f GB needed, %.2f GB free",
                      m->max_ctx, cu_session_bytes(c, m->max_ctx, m->chunk) / 1e9, fr / 1e9);
    }
fail:
    lcuda_session_free(s);
    return rc;
}

void lcuda_session_reset(lcuda_session *s) {
    cudaMemsetAsync(s->conv, 0, s->n_lin * s->conv_n * sizeof(float), s->st);
    cudaMemsetAsync(s->S, 0, s->n_lin * s->S_n * sizeof(float), s->st);
    s->pos = 0;
    s->hpos = -1;
}

int lcuda_session_pos(const lcuda_session *s) { return s->pos; }
int lcuda_chunk(const lcuda_session *s) { return s->m->chunk; }

/* ---- snapshots of the recurrent state ---- */
lily_code cu_snap_alloc(lcuda_session *s, int slot, lily_status *st) {
    size_t cb = s->n_lin * s->conv_n * sizeof(float), sb = s->n_lin * s->S_n * sizeof(float);
    if (!s->snap_conv[slot]) {
        cudaError_t e1 = cudaMalloc((void **)&s->snap_conv[slot], cb ? cb : 4);
        cudaError_t e2 = cudaMalloc((void **)&s->snap_S[slot], sb ? sb : 4);
        if (e1 != cudaSuccess || e2 != cudaSuccess) {
            cudaGetLastError();
            cudaFree(s->snap_conv[slot]); cudaFree(s->snap_S[slot]);
            s->snap_conv[slot] = s->snap_S[slot] = NULL;
            return lily_err(st, LILY_ENOMEM, "GPU out of memory for a state snapshot (%.1f MB)", (cb + sb) / 1e6);
        }
    }
    return LILY_OK;
}

lily_code lcuda_snapshot_save(lcuda_session *s, int slot, lily_status *st) {
    if (slot < 0 || slot >= LCU_SNAPSHOTS) return lily_err(st, LILY_EINVAL, "snapshot slot %d outside 0..%d", slot, LCU_SNAPSHOTS - 1);
    size_t cb = s->n_lin * s->conv_n * sizeof(float), sb = s->n_lin * s->S_n * sizeof(float);
    lily_code rc = cu_snap_alloc(s, slot, st);
    if (rc) return rc;
    LCU_CHECK(cudaMemcpyAsync(s->snap_conv[slot], s->conv, cb, cudaMemcpyDeviceToDevice, s->st));
    LCU_CHECK(cudaMemcpyAsync(s->snap_S[slot], s->S, sb, cudaMemcpyDeviceToDevice, s->st));
    LCU_CHECK(cudaStreamSynchronize(s->st));
    return LILY_OK;
}

/* Parking: one direction of cudaMemcpy per buffer, ordered after the session's work. */
static lily_code copy_one(lcuda_session *s, int to_host, float *host, float *dev, size_t bytes, lily_status *st) {
    if (!bytes) return LILY_OK;
    LCU_CHECK(cudaMemcpyAsync(to_host ? (void *)host : (void *)dev, to_host ? (const void *)dev : (const void *)host, bytes,
                              to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, s->st));
    return LILY_OK;
}

/* A layer's n cache rows (fp16 on the device) and kh, their fp32 form in the CPU cache's layout
 * (parking's, engine/park.c), through hb [2][nb] halves. */
static lily_code kv_copy_layer(lcuda_session *s, int to_host, int l, size_t nb, float *kh, uint16_t *hb, lily_status *st) {
    uint16_t *dk = s->kc + (size_t)l * s->kv_n, *dv = s->vc + (size_t)l * s->kv_n;
    if (to_host) {
        LCU_CHECK(cudaMemcpyAsync(hb, dk, nb * sizeof(uint16_t), cudaMemcpyDeviceToHost, s->st));
        LCU_CHECK(cudaMemcpyAsync(hb + nb, dv, nb * sizeof(uint16_t), cudaMemcpyDeviceToHost, s->st));
        LCU_CHECK(cudaStreamSynchronize(s->st));
        for (size_t i = 0; i < 2 * nb; i++) kh[i] = cu_kv_h2f(hb[i]);
    } else {
        for (size_t i = 0; i < 2 * nb; i++) hb[i] = cu_kv_f2h(kh[i]);
        LCU_CHECK(cudaMemcpyAsync(dk, hb, nb * sizeof(uint16_t), cudaMemcpyHostToDevice, s->st));
        LCU_CHECK(cudaMemcpyAsync(dv, hb + nb, nb * sizeof(uint16_t), cudaMemcpyHostToDevice, s->st));
        LCU_CHECK(cudaStreamSynchronize(s->st)); /* (hb is the next layer's) */
    }
    return LILY_OK;
}

lily_code lcuda_state_copy(lcuda_session *s, int to_host, int n, float *kv, float *conv, float *S, lily_status *st) {
    if (n < 0 || n > s->m->max_ctx) return lily_err(st, LILY_ERANGE, "state copy of %d tokens past the context %d", n, s->m->max_ctx);
    size_t row = s->kv_n / (size_t)s->m->max_ctx, nb = (size_t)n * row;
    lily_code rc = LILY_OK;
    uint16_t *hb = nb && s->n_full ? (uint16_t *)lily_big_alloc(2 * nb * sizeof(uint16_t)) : NULL; /* (util/bigmem.c) */
    if (nb && s->n_full && !hb) return lily_err(st, LILY_ENOMEM, "out of memory for a state copy's %zu cache rows", (size_t)n);
    for (int l = 0; l < s->n_full && !rc; l++) rc = kv_copy_layer(s, to_host, l, nb, kv + (size_t)l * 2 * nb, hb, st);
    lily_big_free(hb);
    if (!rc) rc = copy_one(s, to_host, conv, s->conv, s->n_lin * s->conv_n * sizeof(float), st);
    if (!rc) rc = copy_one(s, to_host, S, s->S, s->n_lin * s->S_n * sizeof(float), st);
    if (rc) return rc;
    LCU_CHECK(cudaStreamSynchronize(s->st));
    return LILY_OK;
}

lily_code lcuda_snapshot_copy(lcuda_session *s, int slot, int to_host, float *conv, float *S, lily_status *st) {
    if (slot < 0 || slot >= LCU_SNAPSHOTS || (to_host && !s->snap_conv[slot]))
        return lily_err(st, LILY_EINVAL, "no snapshot in slot %d", slot);
    lily_code rc = to_host ? LILY_OK : cu_snap_alloc(s, slot, st);
    if (!rc) rc = copy_one(s, to_host, conv, s->snap_conv[slot], s->n_lin * s->conv_n * sizeof(float), st);
    if (!rc) rc = copy_one(s, to_host, S, s->snap_S[slot], s->n_lin * s->S_n * sizeof(float), st);
    if (rc) return rc;
    LCU_CHECK(cudaStreamSynchronize(s->st));
    return LILY_OK;
}

lily_code lcuda_snapshot_load(lcuda_session *s, int slot, lily_status *st) {
    if (slot < 0 || slot >= LCU_SNAPSHOTS || !s->snap_conv[slot]) return lily_err(st, LILY_EINVAL, "no snapshot in slot %d", slot);
    size_t cb = s->n_lin * s->conv_n * sizeof(float), sb = s->n_lin * s->S_n * sizeof(float);
    LCU_CHECK(cudaMemcpyAsync(s->conv, s->snap_conv[slot], cb, cudaMemcpyDeviceToDevice, s->st));
    LCU_CHECK(cudaMemcpyAsync(s->S, s->snap_S[slot], sb, cudaMemcpyDeviceToDevice, s->st));
    LCU_CHECK(cudaStreamSynchronize(s->st));
    return LILY_OK;
}
