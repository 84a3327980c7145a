/* Parked conversations: a session's state copied out compactly so that its slot can serve
 * someone else and the conversation can come back later without recomputing its prefix.
 *
 * What is copied, and why it is enough: the tokens; the attention cache rows below the
 * position (rows past it are garbage by definition); the recurrent state (conv + DeltaNet)
 * at the position, which cannot be recomputed from anything smaller; and the snapshots
 * whose tokens are a prefix of the session's, since a follow-up turn usually diverges at
 * the start of the last turn (the Qwen3.6 template re-renders it) and resumes from there.
 * A session holds its caches sized for the whole context; a parked one only what is used.
 * On the GPU the same buffers are copied from and to the device (lcuda_state_copy), in the
 * CPU cache's layout (the device's fp16 KV rows widened to fp32 and back, exactly), or, with
 * the model's GPU tier on (lily_model_set_park_gpu), kept on the device in its own layout
 * (lcuda_park): the host pages are what a host park costs, not the copy. */
#include <stdlib.h>
#include <string.h>
#include "cuda/cuda_backend.h"
#include "engine/engine.h"

static int n_full(const lily_config *c) { return cfg_n_full(c); }
static size_t conv_n(const lily_config *c) { return (size_t)(c->n_layers - cfg_n_full(c)) * cfg_conv_dim(c) * (c->conv_k - 1); }
static size_t S_n(const lily_config *c) { return (size_t)(c->n_layers - cfg_n_full(c)) * c->lin_nv * c->lin_dk * c->lin_dv; }

/* Bytes a parked conversation holds in host memory (lily_parked_bytes of the host tier). */
static size_t host_bytes(const lily_config *c, int n, int n_snap) {
    const size_t row = (size_t)c->n_kv_heads * c->head_dim;
    return sizeof(lily_parked) + (size_t)n * sizeof(int32_t) + (size_t)n_full(c) * 2 * n * row * sizeof(float) +
           (size_t)(1 + n_snap) * (conv_n(c) + S_n(c)) * sizeof(float);
}

void lily_parked_free(lily_parked *p) {
    if (!p) return;
    lcuda_parked_free(p->dev);
    free(p->tokens); lily_big_free(p->kv); lily_big_free(p->conv); lily_big_free(p->S);
    for (int i = 0; i < p->n_snap; i++) { lily_big_free(p->snap_conv[i]); lily_big_free(p->snap_S[i]); }
    free(p);
}

const int32_t *lily_parked_tokens(const lily_parked *p, int *n) {
    *n = p->n;
    return p->tokens;
}

size_t lily_parked_bytes(const lily_parked *p) { return p->bytes; }

int lily_parked_snapshot(const lily_parked *p, int i) { return i >= 0 && i < p->n_snap ? p->snap_pos[i] : 0; }

int lily_parked_on_gpu(const lily_parked *p) { return p && p->dev; }

lily_code lily_model_set_park_gpu(lily_model *m, int64_t bytes, uint64_t *effective, lily_status *st) {
    if (effective) *effective = 0;
    if (!m->use_cuda) return lily_err(st, LILY_EUNSUPPORTED, "parking on the GPU needs the CUDA backend");
    uint64_t b = bytes < 0 ? lcuda_mem_free() / 2 : (uint64_t)bytes;
    lcuda_park_limit(m->cuda, b);
    if (effective) *effective = b;
    return LILY_OK;
}

/* The snapshots a parked conversation keeps: those strictly inside it whose tokens are its prefix. */
static int snap_on_path(const lily_session *s, int i) {
    const lily_snapshot *sp = &s->snap[i];
    return sp->pos > 0 && sp->pos < s->n && sp->tokens && (s->cuda || sp->conv) &&
           !memcmp(sp->tokens, s->tokens, (size_t)sp->pos * sizeof(int32_t));
}

/* The GPU tier: LILY_OK with *out set, or LILY_ENOMEM / LILY_EUNSUPPORTED when the caller is
 * to park on the host instead. */
static lily_code park_gpu(lily_session *s, lily_parked **out, lily_status *st) {
    int slots[LILY_SNAPSHOTS], k = 0;
    lily_parked *p = calloc(1, sizeof *p);
    if (!p || !(p->tokens = malloc((size_t)s->n * sizeof *p->tokens))) {
        free(p);
        return lily_err(st, LILY_ENOMEM, "out of memory");
    }
    for (int i = 0; i < LILY_SNAPSHOTS; i++)
        if (snap_on_path(s, i)) { p->snap_pos[k] = s->snap[i].pos; slots[k++] = i; }
    lily_code rc = lcuda_park(s->cuda, s->n, slots, k, &p->dev, st);
    if (rc) { lily_parked_free(p); return rc; }
    memcpy(p->tokens, s->tokens, (size_t)s->n * sizeof *p->tokens);
    p->n = s->n;
    p->n_snap = k;
    p->bytes = sizeof *p + (size_t)s->n * sizeof(int32_t) + lcuda_parked_bytes(p->dev);
    *out = p;
    return LILY_OK;
}

void park_host_form_free(lily_parked *h) {
    lily_big_free(h->kv); lily_big_free(h->conv); lily_big_free(h->S);
    for (int j = 0; j < h->n_snap; j++) { lily_big_free(h->snap_conv[j]); lily_big_free(h->snap_S[j]); }
}

lily_code park_host_form(const lily_parked *p, lily_parked *h, lily_status *st) {
    const lily_config *c = lcuda_parked_config(p->dev);
    size_t row = (size_t)c->n_kv_heads * c->head_dim, nc = conv_n(c), ns = S_n(c), nf = (size_t)n_full(c);
    *h = *p;
    h->dev = NULL;
    h->kv = lily_big_alloc(nf * 2 * p->n * row * sizeof(float) + 1);
    h->conv = lily_big_alloc(nc * sizeof(float) + 1);
    h->S = lily_big_alloc(ns * sizeof(float) + 1);
    int ok = h->kv && h->conv && h->S;
    for (int j = 0; j < p->n_snap; j++) {
        h->snap_conv[j] = ok ? lily_big_alloc(nc * sizeof(float) + 1) : NULL;
        h->snap_S[j] = ok ? lily_big_alloc(ns * sizeof(float) + 1) : NULL;
        ok = ok && h->snap_conv[j] && h->snap_S[j];
    }
    lily_code rc = ok ? lcuda_parked_read(p->dev, h->kv, h->conv, h->S, h->snap_conv, h->snap_S, st)
                      : lily_err(st, LILY_ENOMEM, "out of memory copying a parked conversation to the host");
    if (rc) { park_host_form_free(h); return rc; }
    h->bytes = host_bytes(c, p->n, p->n_snap);
    return LILY_OK;
}

lily_code lily_parked_to_host(lily_parked *p, lily_status *st) {
    if (!p->dev) return LILY_OK;
    lily_parked h;
    lily_code rc = park_host_form(p, &h, st);
    if (rc) return rc;
    lcuda_parked_free(p->dev);
    *p = h;
    return LILY_OK;
}

lily_code lily_session_park(lily_session *s, lily_parked **out, lily_status *st) {
    return lily_session_park_to(s, LILY_PARK_ANY, out, st);
}

lily_code lily_session_park_to(lily_session *s, int where, lily_parked **out, lily_status *st) {
    *out = NULL;
    if (where < LILY_PARK_ANY || where > LILY_PARK_HOST) return lily_err(st, LILY_EINVAL, "no parking tier %d", where);
    if (s->n < 1) return lily_err(st, LILY_EINVAL, "nothing to park: the session is empty");
    const lily_config *c = &s->m->w.cfg;
    const cpu_cache *k = &s->cache;
    if (where == LILY_PARK_GPU && !s->cuda) return lily_err(st, LILY_EUNSUPPORTED, "parking on the GPU needs the CUDA backend");
    if (s->cuda && where != LILY_PARK_HOST) {
        lily_code rc = park_gpu(s, out, st);
        if (where == LILY_PARK_GPU || (rc != LILY_ENOMEM && rc != LILY_EUNSUPPORTED)) return rc; /* else the host's */
    }
    lily_parked *p = calloc(1, sizeof *p);
    if (!p) return lily_err(st, LILY_ENOMEM, "out of memory");
    size_t row = (size_t)c->n_kv_heads * c->head_dim, nc = conv_n(c), ns = S_n(c), nf = (size_t)n_full(c);
    lily_code rc = LILY_OK;
    p->n = s->n;
    p->tokens = malloc((size_t)s->n * sizeof *p->tokens);
    p->kv = lily_big_alloc(nf * 2 * s->n * row * sizeof(float) + 1);
    p->conv = lily_big_alloc(nc * sizeof(float) + 1);
    p->S = lily_big_alloc(ns * sizeof(float) + 1);
    if (!p->tokens || !p->kv || !p->conv || !p->S) goto oom;
    memcpy(p->tokens, s->tokens, (size_t)s->n * sizeof *p->tokens);
    if (s->cuda) {
        if ((rc = lcuda_state_copy(s->cuda, 1, s->n, p->kv, p->conv, p->S, st))) goto fail;
    } else {
        for (size_t l = 0; l < nf; l++) {
            const size_t src = l * k->max_ctx * row, dst = l * 2 * s->n * row;
            memcpy(p->kv + dst, k->kc + src, (size_t)s->n * row * sizeof(float));
            memcpy(p->kv + dst + (size_t)s->n * row, k->vc + src, (size_t)s->n * row * sizeof(float));
        }
        memcpy(p->conv, k->conv, nc * sizeof(float));
        memcpy(p->S, k->S, ns * sizeof(float));
    }
    for (int i = 0; i < LILY_SNAPSHOTS; i++) {
        const lily_snapshot *sp = &s->snap[i];
        if (!snap_on_path(s, i)) continue;
        int j = p->n_snap;
        p->snap_conv[j] = lily_big_alloc(nc * sizeof(float) + 1);
        p->snap_S[j] = lily_big_alloc(ns * sizeof(float) + 1);
        p->n_snap++;
        if (!p->snap_conv[j] || !p->snap_S[j]) goto oom;
        if (s->cuda) {
            if ((rc = lcuda_snapshot_copy(s->cuda, i, 1, p->snap_conv[j], p->snap_S[j], st))) goto fail;
        } else {
            memcpy(p->snap_conv[j], sp->conv, nc * sizeof(float));
            memcpy(p->snap_S[j], sp->S, ns * sizeof(float));
        }
        p->snap_pos[j] = sp->pos;
    }
    p->bytes = host_bytes(c, s->n, p->n_snap);
    *out = p;
    return LILY_OK;
oom:
    rc = lily_err(st, LILY_ENOMEM, "out of memory parking a session of %d tokens", s->n);
fail:
    lily_parked_free(p);
    return rc;
}

lily_code lily_session_unpark(lily_session *s, const lily_parked *p, lily_status *st) {
    const lily_config *c = &s->m->w.cfg;
    cpu_cache *k = &s->cache;
    if (p->dev && !s->cuda)
        return lily_err(st, LILY_EINVAL, "the conversation was parked on the GPU: unpark it into a CUDA session");
    if (p->n > s->m->max_ctx)
        return lily_err(st, LILY_ERANGE, "the parked conversation has %d tokens, more than the context length %d", p->n,
                        s->m->max_ctx);
    size_t row = (size_t)c->n_kv_heads * c->head_dim, nc = conv_n(c), ns = S_n(c), nf = (size_t)n_full(c);
    /* host buffers first: the only allocations on the CPU, so a failure leaves the session as it was */
    for (int j = 0; j < p->n_snap; j++) {
        lily_snapshot *sp = &s->snap[j];
        if (!sp->tokens && !(sp->tokens = malloc((size_t)s->m->max_ctx * sizeof *sp->tokens))) goto oom;
        if (s->cuda) continue;
        if (!sp->conv && !(sp->conv = malloc(nc * sizeof(float) + 1))) goto oom;
        if (!sp->S && !(sp->S = malloc(ns * sizeof(float) + 1))) goto oom;
    }
    lily_session_reset(s);
    for (int i = 0; i < LILY_SNAPSHOTS; i++) s->snap[i].pos = 0;
    if (p->dev) {
        lily_code rc = lcuda_unpark(s->cuda, p->dev, st);
        if (rc) { lily_session_reset(s); return rc; }
    } else if (s->cuda) {
        /* the device copies take non-const pointers; they only read the host side here */
        lily_code rc = lcuda_state_copy(s->cuda, 0, p->n, p->kv, p->conv, p->S, st);
        for (int j = 0; j < p->n_snap && !rc; j++) rc = lcuda_snapshot_copy(s->cuda, j, 0, p->snap_conv[j], p->snap_S[j], st);
        if (rc) { lily_session_reset(s); return rc; }
    } else {
        for (size_t l = 0; l < nf; l++) {
            const size_t dst = l * k->max_ctx * row, src = l * 2 * p->n * row;
            memcpy(k->kc + dst, p->kv + src, (size_t)p->n * row * sizeof(float));
            memcpy(k->vc + dst, p->kv + src + (size_t)p->n * row, (size_t)p->n * row * sizeof(float));
        }
        memcpy(k->conv, p->conv, nc * sizeof(float));
        memcpy(k->S, p->S, ns * sizeof(float));
    }
    memcpy(s->tokens, p->tokens, (size_t)p->n * sizeof *p->tokens);
    for (int j = 0; j < p->n_snap; j++) {
        lily_snapshot *sp = &s->snap[j];
        memcpy(sp->tokens, p->tokens, (size_t)p->snap_pos[j] * sizeof(int32_t));
        if (!s->cuda) { /* (a GPU-tier conversation never reaches here on the CPU) */
            memcpy(sp->conv, p->snap_conv[j], nc * sizeof(float));
            memcpy(sp->S, p->snap_S[j], ns * sizeof(float));
        }
        sp->pos = p->snap_pos[j];
        sp->has_logits = 0; /* parking keeps no logits */
        sp->stamp = ++s->clock;
    }
    s->n = p->n;
    s->has_logits = 0; /* the next prefill recomputes at least one token */
    return LILY_OK;
oom:
    return lily_err(st, LILY_ENOMEM, "out of memory restoring a parked session");
}
