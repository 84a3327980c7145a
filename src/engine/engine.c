#include "engine/engine.h"
#include "cuda/cuda_backend.h"
#include <stdio.h>
#include <stdlib.h>

void lily_model_opts_default(lily_model_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_ctx = 4096;
    o->max_sessions = 1;
}

lily_code lily_model_open(const char *dir, const lily_model_opts *opts, lily_model **out, lily_status *st) {
    lily_model_opts def;
    if (!opts) { lily_model_opts_default(&def); opts = &def; }
    *out = NULL;
    lily_model *m = calloc(1, sizeof *m);
    if (!m) return lily_err(st, LILY_ENOMEM, "out of memory");
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    lily_code rc = lw_load(dir, &m->w, st);
    if (rc) { free(m); return rc; }
    m->max_ctx = opts->max_ctx > 0 ? opts->max_ctx : 4096;
    m->w.cfg.rope_bf16_freq = opts->rope_bf16_freq;
    char why[256];
    int want_cuda = opts->backend == LILY_BACKEND_CUDA;
#ifdef LILY_CUDA
    if (opts->backend == LILY_BACKEND_AUTO && lcuda_available(why, sizeof why)) want_cuda = 2;
#endif
    if (want_cuda) {
        if (want_cuda == 1 && !lcuda_available(why, sizeof why)) {
            lw_free(&m->w);
            free(m);
            return lily_err(st, LILY_EDEVICE, "CUDA backend unavailable: %s", why);
        }
        lcuda_model *cm = NULL;
        rc = lcuda_model_new(&m->w, m->max_ctx, opts->max_sessions > 0 ? opts->max_sessions : 1, opts->progress,
                             opts->progress_user, &cm, st);
        if (rc && !(want_cuda == 2 && rc == LILY_EUNSUPPORTED)) { lw_free(&m->w); free(m); return rc; }
        if (!rc) { m->use_cuda = 1; m->cuda = cm; }
    }
    m->pool = lily_pool_new(opts->n_threads);
    if (!m->pool) { lw_free(&m->w); free(m); return lily_err(st, LILY_ENOMEM, "cannot start threads"); }
    *out = m;
    return LILY_OK;
}

void lily_model_free(lily_model *m) {
    if (!m) return;
    if (m->use_cuda) lcuda_model_free(m->cuda);
    lily_pool_free(m->pool);
    lw_free(&m->w);
    free(m);
}

void lily_model_get_info(const lily_model *m, lily_model_info *info) {
    const lily_config *c = &m->w.cfg;
    memset(info, 0, sizeof *info);
    info->vocab_size = c->vocab;
    info->hidden_size = c->hidden;
    info->n_layers = c->n_layers;
    info->n_full_attn_layers = cfg_n_full(c);
    info->n_experts = c->n_experts;
    info->n_experts_per_tok = c->top_k;
    info->max_ctx = m->max_ctx;
    info->n_eos = c->n_eos;
    for (int i = 0; i < c->n_eos && i < 8; i++) info->eos_ids[i] = c->eos[i];
    info->n_params = m->w.n_params;
    info->weight_bytes = m->w.weight_bytes;
    info->backend = m->use_cuda ? "cuda" : "cpu";
    info->layout = m->w.layout;
    info->gen_temperature = c->gen_temperature;
    info->gen_top_p = c->gen_top_p;
    info->gen_min_p = c->gen_min_p;
    info->gen_top_k = c->gen_top_k;
}

int lily_model_is_eos(const lily_model *m, int32_t id) {
    for (int i = 0; i < m->w.cfg.n_eos; i++)
        if (m->w.cfg.eos[i] == id) return 1;
    return 0;
}

lily_code lily_session_new(lily_model *m, lily_session **out, lily_status *st) {
    *out = NULL;
    lily_session *s = calloc(1, sizeof *s);
    if (!s) return lily_err(st, LILY_ENOMEM, "out of memory");
    s->m = m;
    lily_code rc = m->use_cuda ? lcuda_session_new(m->cuda, (lcuda_session **)&s->cuda, st)
                               : cpu_cache_new(&m->w.cfg, m->max_ctx, &s->cache, st);
    if (rc) { free(s); return rc; }
    s->tokens = malloc((size_t)m->max_ctx * sizeof *s->tokens);
    /* the GPU copies logits here after every feed and decode batch: page-locked memory takes
     * them at full speed (pageable memory goes through a staging copy) */
    if (m->use_cuda) s->logits_pinned = (s->logits = lcuda_host_alloc((size_t)m->w.cfg.vocab * sizeof *s->logits)) != NULL;
    if (!s->logits) s->logits = malloc((size_t)m->w.cfg.vocab * sizeof *s->logits);
    if (!s->tokens || !s->logits) { lily_session_free(s); return lily_err(st, LILY_ENOMEM, "out of memory"); }
    lily_rng_seed(&s->rng, 0);
    *out = s;
    return LILY_OK;
}

void lily_session_free(lily_session *s) {
    if (!s) return;
    if (s->cuda) lcuda_session_free(s->cuda);
    else cpu_cache_free(&s->cache);
    for (int i = 0; i < LILY_SNAPSHOTS; i++) {
        free(s->snap[i].conv); free(s->snap[i].S); free(s->snap[i].tokens); free(s->snap[i].logits);
    }
    free(s->tokens);
    if (s->logits_pinned) lcuda_host_free(s->logits);
    else free(s->logits);
    free(s);
}

void lily_session_reset(lily_session *s) {
    s->n = 0;
    s->has_logits = 0;
    if (s->cuda) lcuda_session_reset(s->cuda);
    else cpu_cache_reset(&s->cache, &s->m->w.cfg);
}

int lily_session_len(const lily_session *s) { return s->n; }
const int32_t *lily_session_tokens(const lily_session *s) { return s->tokens; }
const float *lily_session_logits(lily_session *s) { return s->has_logits ? s->logits : NULL; }

/* what every feed checks first: tokens to feed, room in the context, ids in the vocabulary */
static lily_code feed_check(const lily_session *s, const int32_t *ids, int n, lily_status *st) {
    const lily_config *c = &s->m->w.cfg;
    if (n <= 0) return lily_err(st, LILY_EINVAL, "no tokens to feed");
    if (s->n + n > s->m->max_ctx)
        return lily_err(st, LILY_ERANGE, "context length exceeded: %d + %d tokens > %d", s->n, n, s->m->max_ctx);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return lily_err(st, LILY_EINVAL, "token id %d outside the vocabulary [0, %d)", ids[i], c->vocab);
    return LILY_OK;
}

lily_code engine_forward(lily_session *s, const int32_t *ids, int n, float *all_logits, lily_status *st) {
    const lily_config *c = &s->m->w.cfg;
    lily_code rc0 = feed_check(s, ids, n, st);
    if (rc0) return rc0;
    if (s->cuda) { /* the backend chunks prefill itself */
        lily_code rc = lcuda_forward(s->cuda, ids, n, s->n, all_logits ? all_logits : s->logits, all_logits != NULL, st);
        if (rc) return rc;
        memcpy(s->tokens + s->n, ids, (size_t)n * sizeof *ids);
        s->n += n;
        if (all_logits) memcpy(s->logits, all_logits + (size_t)(n - 1) * c->vocab, (size_t)c->vocab * sizeof(float));
        s->has_logits = 1;
        return LILY_OK;
    }
    /* Prefill in chunks bounds the activation memory; the chunked DeltaNet rule and the
     * attention cache make chunk boundaries invisible in the result. */
    const int CH = 512;
    for (int i = 0; i < n; i += CH) {
        int k = n - i < CH ? n - i : CH;
        float *lg = all_logits ? all_logits + (size_t)i * c->vocab : s->logits;
        cpu_forward(&s->m->w, &s->cache, s->m->pool, ids + i, k, s->n, lg, all_logits != NULL, NULL);
        memcpy(s->tokens + s->n, ids + i, (size_t)k * sizeof *ids);
        s->n += k;
    }
    if (all_logits) memcpy(s->logits, all_logits + (size_t)(n - 1) * c->vocab, (size_t)c->vocab * sizeof(float));
    s->has_logits = 1;
    return LILY_OK;
}

lily_code lily_session_feed(lily_session *s, const int32_t *ids, int n, float *logits, lily_status *st) {
    return engine_forward(s, ids, n, logits, st);
}

lily_code lily_decode_batch(lily_session **ss, const int32_t *ids, int n, lily_status *st) {
    if (n < 1) return lily_err(st, LILY_EINVAL, "empty batch");
    lily_model *m = ss[0]->m;
    for (int i = 0; i < n; i++) {
        if (ss[i]->m != m) return lily_err(st, LILY_EINVAL, "batch mixes sessions of different models");
        for (int j = 0; j < i; j++)
            if (ss[j] == ss[i]) return lily_err(st, LILY_EINVAL, "a session appears twice in one batch");
        if (ss[i]->n + 1 > m->max_ctx)
            return lily_err(st, LILY_ERANGE, "context length exceeded: %d + 1 tokens > %d", ss[i]->n, m->max_ctx);
        if (ids[i] < 0 || ids[i] >= m->w.cfg.vocab)
            return lily_err(st, LILY_EINVAL, "token id %d outside the vocabulary [0, %d)", ids[i], m->w.cfg.vocab);
    }
    if (n == 1) return engine_forward(ss[0], &ids[0], 1, NULL, st);
    int V = m->w.cfg.vocab;
    int *pos = malloc((size_t)n * sizeof *pos);
    if (!pos) return lily_err(st, LILY_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) pos[i] = ss[i]->n;
    if (m->use_cuda) { /* one pass on the GPU (cu_batch.cu), each row's logits into its session */
        lcuda_session **cs = malloc((size_t)n * sizeof *cs);
        float **rows = malloc((size_t)n * sizeof *rows);
        lily_code rc = cs && rows ? LILY_OK : lily_err(st, LILY_ENOMEM, "out of memory");
        for (int i = 0; i < n && !rc; i++) { cs[i] = ss[i]->cuda; rows[i] = ss[i]->logits; }
        if (!rc) rc = lcuda_forward_batch(cs, ids, pos, n, rows, st);
        free(cs); free(rows); free(pos);
        if (rc) { /* rows may be half copied: no session keeps logits it cannot vouch for */
            for (int i = 0; i < n; i++) ss[i]->has_logits = 0;
            return rc;
        }
    } else {
        cpu_cache **k = malloc((size_t)n * sizeof *k);
        float *lg = malloc((size_t)n * V * sizeof *lg);
        if (!k || !lg) { free(k); free(pos); free(lg); return lily_err(st, LILY_ENOMEM, "out of memory"); }
        for (int i = 0; i < n; i++) k[i] = &ss[i]->cache;
        cpu_forward_batch(&m->w, k, pos, m->pool, ids, n, lg);
        for (int i = 0; i < n; i++) memcpy(ss[i]->logits, lg + (size_t)i * V, (size_t)V * sizeof *lg);
        free(k); free(pos); free(lg);
    }
    for (int i = 0; i < n; i++) {
        lily_session *s = ss[i];
        s->tokens[s->n++] = ids[i];
        s->has_logits = 1;
    }
    return LILY_OK;
}

/* ---- prefix reuse ---- */
static size_t conv_floats(const lily_config *c, const cpu_cache *k) { return (size_t)k->n_lin * cfg_conv_dim(c) * (c->conv_k - 1); }
static size_t S_floats(const lily_config *c, const cpu_cache *k) { return (size_t)k->n_lin * c->lin_nv * c->lin_dk * c->lin_dv; }

/* the session's logits (after s->n tokens) into snapshot sp, when it has them */
static void snapshot_logits(lily_session *s, lily_snapshot *sp) {
    size_t V = (size_t)s->m->w.cfg.vocab;
    sp->has_logits = 0;
    if (!s->has_logits || (!sp->logits && !(sp->logits = malloc(V * sizeof(float))))) return;
    memcpy(sp->logits, s->logits, V * sizeof(float));
    sp->has_logits = 1;
}

static void snapshot_take(lily_session *s) {
    const lily_config *c = &s->m->w.cfg;
    lily_snapshot *best = NULL;
    for (int i = 0; i < LILY_SNAPSHOTS; i++) {
        lily_snapshot *sp = &s->snap[i];
        if (sp->pos == s->n && !memcmp(sp->tokens, s->tokens, (size_t)s->n * sizeof *s->tokens)) {
            sp->stamp = ++s->clock;
            if (!sp->has_logits) snapshot_logits(s, sp);
            return;
        }
        if (!best || sp->stamp < best->stamp) best = sp;
    }
    if (!best->tokens && !(best->tokens = malloc((size_t)s->m->max_ctx * sizeof *best->tokens))) return;
    best->pos = 0; /* unusable until filled */
    best->has_logits = 0;
    if (s->cuda) { /* the state is copied into a device-side slot */
        if (lcuda_snapshot_save(s->cuda, (int)(best - s->snap), NULL)) return;
    } else {
        if (!best->conv) {
            best->conv = malloc(conv_floats(c, &s->cache) * sizeof(float) + 1);
            best->S = malloc(S_floats(c, &s->cache) * sizeof(float) + 1);
            if (!best->conv || !best->S) {
                free(best->conv); free(best->S);
                best->conv = best->S = NULL;
                return;
            }
        }
        memcpy(best->conv, s->cache.conv, conv_floats(c, &s->cache) * sizeof(float));
        memcpy(best->S, s->cache.S, S_floats(c, &s->cache) * sizeof(float));
    }
    memcpy(best->tokens, s->tokens, (size_t)s->n * sizeof *s->tokens);
    best->pos = s->n;
    best->stamp = ++s->clock;
    snapshot_logits(s, best);
}

/* the snapshot covering exactly ids[0..pos), or NULL */
static lily_snapshot *snapshot_find(lily_session *s, const int32_t *ids, int pos) {
    for (int i = 0; i < LILY_SNAPSHOTS; i++)
        if (s->snap[i].pos == pos && !memcmp(s->snap[i].tokens, ids, (size_t)pos * sizeof *ids)) return &s->snap[i];
    return NULL;
}

/* The session's recurrent state back to snapshot sp (the attention rows below sp->pos must
 * already match): 0, or -1 when the device copy failed and nothing changed. */
static int snapshot_restore(lily_session *s, lily_snapshot *sp) {
    const lily_config *c = &s->m->w.cfg;
    if (s->cuda) {
        if (lcuda_snapshot_load(s->cuda, (int)(sp - s->snap), NULL)) return -1;
    } else {
        memcpy(s->cache.conv, sp->conv, conv_floats(c, &s->cache) * sizeof(float));
        memcpy(s->cache.S, sp->S, S_floats(c, &s->cache) * sizeof(float));
    }
    sp->stamp = ++s->clock;
    s->n = sp->pos;
    return 0;
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

lily_code lily_session_prefill(lily_session *s, const int32_t *ids, int n, int *reused, lily_status *st) {
    return lily_session_prefill_ex(s, ids, n, NULL, 0, 1, reused, st);
}

/* A prefill in pieces, which lily_session_prefill_ex runs one after the other and lily_prefill_batch
 * beside other sessions' (same pieces, same snapshots). prefill_start: the checks, and whatever of
 * the prompt the session can restore; *done when that was all of it (logits included), else feeds
 * follow from s->n, each up to prefill_stop, each followed by prefill_reached. */
static lily_code prefill_start(lily_session *s, const int32_t *ids, int n, const int *marks, int n_marks, int *reused,
                               int *done, lily_status *st) {
    const lily_config *c = &s->m->w.cfg;
    *done = 0;
    if (n < 1) return lily_err(st, LILY_EINVAL, "empty prompt");
    if (n > s->m->max_ctx) return lily_err(st, LILY_ERANGE, "prompt of %d tokens exceeds the context length %d", n, s->m->max_ctx);
    /* the marks inside the prompt, where the feeds stop, must increase */
    for (int i = 1, last = 0; i <= n_marks; i++) {
        const int m = marks[i - 1];
        if (m <= 0 || m >= n) continue;
        if (m <= last) return lily_err(st, LILY_EINVAL, "snapshot marks must increase");
        last = m;
    }
    int cp = common_prefix(s->tokens, s->n, ids, n);
    /* The same prompt again: a snapshot at its end that kept the logits restores everything
     * (the attention rows below n match because the session still holds these n tokens),
     * unless a requested mark has no snapshot yet. */
    int marks_kept = 1;
    for (int k = 0; k < n_marks && cp >= n; k++)
        marks_kept &= marks[k] <= 0 || marks[k] >= n || snapshot_find(s, ids, marks[k]) != NULL;
    lily_snapshot *end = cp >= n && marks_kept ? snapshot_find(s, ids, n) : NULL;
    if (end && end->has_logits && !snapshot_restore(s, end)) {
        memcpy(s->logits, end->logits, (size_t)c->vocab * sizeof(float));
        s->has_logits = 1;
        if (reused) *reused = n;
        *done = 1;
        return LILY_OK;
    }
    /* Otherwise keep at least the last prompt token to recompute, so its logits exist. */
    int start;
    if (cp == s->n && cp < n) {
        start = s->n; /* pure extension */
    } else {
        /* Roll back to the latest snapshot within the common prefix (strictly before n). A
         * snapshot is usable only if it covers exactly these tokens: then the attention
         * cache below its position, which is never copied, also matches. */
        lily_snapshot *best = NULL;
        for (int i = 0; i < LILY_SNAPSHOTS; i++) {
            lily_snapshot *sp = &s->snap[i];
            if (sp->pos > 0 && sp->pos <= cp && sp->pos < n && (!best || sp->pos > best->pos) &&
                !memcmp(sp->tokens, ids, (size_t)sp->pos * sizeof *ids))
                best = sp;
        }
        if (!best || snapshot_restore(s, best)) lily_session_reset(s);
        start = s->n;
    }
    if (reused) *reused = start;
    return LILY_OK;
}
/* where the next feed ends: the first mark past s->n (a snapshot is kept there), else the prompt's end */
static int prefill_stop(const lily_session *s, int n, const int *marks, int n_marks) {
    for (int i = 0; i < n_marks; i++)
        if (marks[i] > s->n && marks[i] < n) return marks[i];
    return n;
}
/* after a feed ended at s->n: the snapshot at a mark, and at the end unless asked not to (an
 * intermediate chunk of a long prompt); a snapshot at a prompt's end lets a regenerated answer
 * start from there */
static void prefill_reached(lily_session *s, int n, int snapshot_end) {
    if (s->n < n || snapshot_end) snapshot_take(s);
}

lily_code lily_session_prefill_ex(lily_session *s, const int32_t *ids, int n, const int *marks, int n_marks,
                                  int snapshot_end, int *reused, lily_status *st) {
    int done;
    lily_code rc = prefill_start(s, ids, n, marks, n_marks, reused, &done, st);
    if (rc) return rc; /* (a refused prompt leaves the session as it was) */
    while (!rc && !done && s->n < n) {
        int stop = prefill_stop(s, n, marks, n_marks);
        if (!(rc = engine_forward(s, ids + s->n, stop - s->n, NULL, st))) prefill_reached(s, n, snapshot_end);
    }
    if (rc) lily_session_reset(s);
    return rc;
}

/* Several prompts at once. Each job runs the pieces lily_session_prefill_ex runs; on the GPU a round
 * begins every job's next piece that fits one pass (lcuda_forward_begin: each on its own session's
 * stream) before it waits for any, so short prompts, each a latency-bound pass that leaves most of
 * the GPU idle, run side by side. The launches are those of one session alone, so every session
 * ends bit for bit as lily_session_prefill_ex leaves it. Longer pieces are fed alone. */
lily_code lily_prefill_batch(lily_prefill_job *jobs, int n, lily_status *st) {
    if (n < 1) return lily_err(st, LILY_EINVAL, "empty batch");
    for (int i = 0; i < n; i++) {
        if (!jobs[i].s || jobs[i].s->m != jobs[0].s->m) return lily_err(st, LILY_EINVAL, "batch mixes sessions of different models");
        for (int k = 0; k < i; k++)
            if (jobs[k].s == jobs[i].s) return lily_err(st, LILY_EINVAL, "a session appears twice in one batch");
    }
    int left = 0;
    char *done = calloc((size_t)n, 2), *begun = done + n; /* [n] each */
    if (!done) return lily_err(st, LILY_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        lily_prefill_job *j = &jobs[i];
        memset(&j->st, 0, sizeof j->st);
        j->reused = 0;
        int d = 0;
        j->rc = prefill_start(j->s, j->ids, j->n, j->marks, j->n_marks, &j->reused, &d, &j->st);
        done[i] = d || j->rc || j->s->n >= j->n;
        left += !done[i];
    }
    while (left) {
        /* a round: every job's next piece begun where one pass takes it, then waited for; the rest fed alone */
        for (int i = 0; i < n; i++) {
            lily_prefill_job *j = &jobs[i];
            begun[i] = 0;
            if (done[i] || !j->s->cuda) continue;
            int len = prefill_stop(j->s, j->n, j->marks, j->n_marks) - j->s->n;
            if (len > lcuda_chunk(j->s->cuda)) continue;
            if (!(j->rc = feed_check(j->s, j->ids + j->s->n, len, &j->st)) &&
                !(j->rc = lcuda_forward_begin(j->s->cuda, j->ids + j->s->n, len, j->s->n, &j->st)))
                begun[i] = 1;
        }
        for (int i = 0; i < n; i++) {
            lily_prefill_job *j = &jobs[i];
            lily_session *s = j->s;
            if (done[i]) continue;
            if (begun[i]) {
                int len = prefill_stop(s, j->n, j->marks, j->n_marks) - s->n;
                if (!(j->rc = lcuda_forward_wait(s->cuda, s->logits, &j->st))) {
                    memcpy(s->tokens + s->n, j->ids + s->n, (size_t)len * sizeof *j->ids);
                    s->n += len;
                    s->has_logits = 1;
                }
            } else if (!j->rc) { /* (on the CPU, or a piece longer than a pass) */
                int stop = prefill_stop(s, j->n, j->marks, j->n_marks);
                j->rc = engine_forward(s, j->ids + s->n, stop - s->n, NULL, &j->st);
            }
            if (!j->rc) prefill_reached(s, j->n, j->snapshot_end);
            else lily_session_reset(s);
            if (j->rc || s->n >= j->n) { done[i] = 1; left--; }
        }
    }
    free(done);
    return LILY_OK;
}
