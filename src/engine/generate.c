/* Sampling and the generation loop over a session. The sampler itself is a pure function
 * (sampler.c); this file owns the per-session state it needs: the RNG and the counts of
 * generated tokens for the penalties. */
#include "engine/engine.h"
#include "engine/sampler.h"
#include "cuda/cuda_backend.h"
#include <stdlib.h>
#include <string.h>

/* LILY_CU_HOST_SAMPLING=1 keeps a CUDA session's sampling on the host (one sync per token):
 * the reference the device path is tested against. */
static int host_sampling_forced(void) {
    const char *e = getenv("LILY_CU_HOST_SAMPLING");
    return e && *e && strcmp(e, "0");
}

/* The device loop continuing a caller's sampling state (engine/sampler.h). The wrapper keeps
 * the host's state in step with the device's: counts and the rng advance for each reported token
 * as a host loop would have advanced them (the draws of tokens the device made one step ahead and
 * nobody saw are not counted), so the caller can go on sampling on the host and choose the tokens
 * an uninterrupted stream would. */
typedef struct {
    lily_token_cb cb;
    void *user;
    int32_t *counts;
    lily_rng *rng;
    int draws, n;
    int32_t *ids;
} cont_gen;

static int cont_cb(void *user, const lily_token *tok) {
    cont_gen *g = user;
    g->ids[g->n++] = tok->id;
    if (g->counts) g->counts[tok->id]++;
    if (g->draws) lily_rng_uniform(g->rng);
    return g->cb ? g->cb(g->user, tok) : 0;
}

lily_code lily_session_generate_cont(lily_session *s, const lily_sampling *p, lily_rng *rng, int32_t *counts,
                                     const uint8_t *pmask, int max_tokens, lily_token_cb cb, void *user, int *n_out,
                                     int *n_fed, lily_status *st) {
    *n_out = *n_fed = 0;
    if (!s->cuda || host_sampling_forced()) return lily_err(st, LILY_EUNSUPPORTED, "the session does not decode on a GPU");
    if (!s->has_logits) return lily_err(st, LILY_EINVAL, "nothing to generate from: feed a prompt first");
    if (max_tokens < 1) return lily_err(st, LILY_EINVAL, "max_tokens %d < 1", max_tokens);
    lily_code rc = lily_sampling_check(p, st);
    if (rc) return rc;
    lily_token tok;
    if ((rc = lily_sample_logits_ex(s->logits, s->m->w.cfg.vocab, p, rng, counts, pmask, &tok, st))) return rc;
    if (counts) counts[tok.id]++;
    *n_out = 1;
    if ((cb && cb(user, &tok)) || lily_model_is_eos(s->m, tok.id) || max_tokens == 1) return LILY_OK;
    int room = s->m->max_ctx - s->n, steps = max_tokens - 1;
    if (room < 1) return LILY_OK; /* the caller's own feed reports the full context */
    if (steps > room) steps = room;
    cont_gen g = { cb, user, counts, rng, !lily_sampling_greedy(p), 0, malloc((size_t)steps * sizeof(int32_t)) };
    if (!g.ids) return lily_err(st, LILY_ENOMEM, "out of memory");
    int made = 0, start = s->n;
    lcuda_sample_state ss = { counts, pmask, { rng->s[0], rng->s[1] } };
    rc = lcuda_generate(s->cuda, start, tok.id, p, &ss, steps, cont_cb, &g, &made, st);
    int fed = lcuda_session_pos(s->cuda) - start; /* `first`, then every token made but possibly the last */
    if (!rc && fed > 0) {
        s->tokens[s->n++] = tok.id;
        for (int i = 0; i + 1 < fed; i++) s->tokens[s->n++] = g.ids[i];
        rc = lcuda_last_logits(s->cuda, s->logits, st);
        *n_fed = fed;
    }
    free(g.ids);
    *n_out += made;
    return rc;
}

/* The batch's decode loop (engine/sampler.h): lcuda_generate_batch with each row's host state kept
 * in step as cont_cb keeps one stream's. */
typedef struct {
    lily_batch_row *rows;
    lily_row_cb cb;
    void *user;
    int32_t *ids; /* [n][cap] each row's reported tokens */
    int cap;
} batch_gen;

static int batch_cb(void *user, int row, const lily_token *tok) {
    batch_gen *g = user;
    lily_batch_row *r = &g->rows[row];
    if (tok) {
        if (r->n_out < g->cap) g->ids[(size_t)row * g->cap + r->n_out] = tok->id;
        r->n_out++;
        if (r->counts) r->counts[tok->id]++;
        if (!lily_sampling_greedy(r->p)) lily_rng_uniform(r->rng);
    }
    return g->cb ? g->cb(g->user, row, tok) : 0;
}

lily_code lily_session_generate_batch(lily_batch_row *rows, int n, int max_steps, lily_row_cb cb, void *user,
                                      lily_status *st) {
    for (int i = 0; i < n; i++) rows[i].n_out = rows[i].n_fed = 0;
    if (n < 2 || n > 32) return lily_err(st, LILY_EUNSUPPORTED, "a decode loop of %d rows (2 to 32)", n);
    lily_model *m = rows[0].s->m;
    if (!m->use_cuda || host_sampling_forced()) return lily_err(st, LILY_EUNSUPPORTED, "the sessions do not decode on a GPU");
    if (max_steps < 1) return lily_err(st, LILY_EINVAL, "max_steps %d < 1", max_steps);
    lcuda_session *cs[32];
    lcuda_batch_row br[32];
    lcuda_sample_state ss[32];
    float *lg[32];
    for (int i = 0; i < n; i++) {
        lily_session *s = rows[i].s;
        if (s->m != m) return lily_err(st, LILY_EINVAL, "batch mixes sessions of different models");
        for (int j = 0; j < i; j++)
            if (rows[j].s == s) return lily_err(st, LILY_EINVAL, "a session appears twice in one batch");
        lily_code rc = lily_sampling_check(rows[i].p, st);
        if (rc) return rc;
        if (s->n + 1 > m->max_ctx) return lily_err(st, LILY_ERANGE, "context length exceeded: %d + 1 tokens > %d", s->n, m->max_ctx);
        if (m->max_ctx - s->n < max_steps) max_steps = m->max_ctx - s->n;
        ss[i] = (lcuda_sample_state){ rows[i].counts, rows[i].pmask, { rows[i].rng->s[0], rows[i].rng->s[1] } };
        br[i] = (lcuda_batch_row){ s->n, rows[i].first, rows[i].p, &ss[i] };
        cs[i] = s->cuda;
        lg[i] = s->logits;
    }
    batch_gen g = { rows, cb, user, malloc((size_t)n * max_steps * sizeof(int32_t)), max_steps };
    if (!g.ids) return lily_err(st, LILY_ENOMEM, "out of memory");
    int steps = 0, fed = 0;
    lily_code rc = lcuda_generate_batch(cs, br, n, max_steps, batch_cb, &g, lg, &steps, &fed, st);
    for (int i = 0; i < n; i++) { /* the session holds `first`, then every reported token but possibly the last */
        lily_session *s = rows[i].s;
        if (fed > 0) s->tokens[s->n++] = rows[i].first;
        for (int k = 0; k + 1 < fed; k++) s->tokens[s->n++] = g.ids[(size_t)i * g.cap + k];
        rows[i].n_fed = fed;
        s->has_logits = !rc && fed > 0; /* (after an error its logits are not vouched for) */
    }
    free(g.ids);
    return rc;
}

lily_code lily_session_sample(lily_session *s, const lily_sampling *p, lily_token *out, lily_status *st) {
    if (!s->has_logits) return lily_err(st, LILY_EINVAL, "nothing to sample from: feed a prompt first");
    return lily_sample_logits(s->logits, s->m->w.cfg.vocab, p, &s->rng, NULL, out, st);
}

/* What lily_session_generate needs to tell a full context from a stop: the caller's answer
 * and the last token. */
typedef struct {
    lily_token_cb cb;
    void *user;
    int stopped;
    int32_t last;
} gen_end;

static int end_cb(void *user, const lily_token *tok) {
    gen_end *e = user;
    e->last = tok->id;
    e->stopped = e->cb ? e->cb(e->user, tok) : 0;
    return e->stopped;
}

lily_code lily_session_generate(lily_session *s, const lily_sampling *p, int max_tokens,
                                lily_token_cb cb, void *user, int *n_out, lily_status *st) {
    if (n_out) *n_out = 0;
    if (!s->has_logits) return lily_err(st, LILY_EINVAL, "nothing to generate from: feed a prompt first");
    if (max_tokens < 0) return lily_err(st, LILY_EINVAL, "max_tokens %d < 0", max_tokens);
    lily_code rc = lily_sampling_check(p, st);
    if (rc) return rc;
    int V = s->m->w.cfg.vocab;
    int32_t *counts = calloc((size_t)V, sizeof *counts);
    /* repetition_penalty covers the prompt (every token the session holds) as well */
    uint8_t *pmask = p->repetition_penalty != 1.0f ? calloc((size_t)V, 1) : NULL;
    if (!counts || (p->repetition_penalty != 1.0f && !pmask)) {
        free(counts); free(pmask);
        return lily_err(st, LILY_ENOMEM, "out of memory");
    }
    for (int i = 0; pmask && i < s->n; i++)
        if (s->tokens[i] >= 0 && s->tokens[i] < V) pmask[s->tokens[i]] = 1;
    lily_rng_seed(&s->rng, p->seed);
    int n = 0;
    if (s->cuda && max_tokens > 0 && !host_sampling_forced()) {
        /* the device loop continuing the session's own rng, from fresh counts */
        gen_end e = { cb, user, 0, -1 };
        int fed = 0;
        rc = lily_session_generate_cont(s, p, &s->rng, counts, pmask, max_tokens, end_cb, &e, &n, &fed, st);
        free(counts); free(pmask);
        if (n_out) *n_out = n;
        /* ended short of max_tokens, neither stopped nor at EOS: the context is full (the host
         * loop's feed reports the same) */
        if (!rc && n < max_tokens && !e.stopped && !lily_model_is_eos(s->m, e.last))
            rc = lily_err(st, LILY_ERANGE, "context length exceeded: %d + 1 tokens > %d", s->n, s->m->max_ctx);
        return rc;
    }
    while (n < max_tokens) {
        lily_token tok;
        if ((rc = lily_sample_logits_ex(s->logits, V, p, &s->rng, counts, pmask, &tok, st))) break;
        counts[tok.id]++;
        n++;
        int stop = cb ? cb(user, &tok) : 0;
        if (stop || lily_model_is_eos(s->m, tok.id) || n == max_tokens) break;
        /* The last token is left unfed: a follow-up turn re-renders it anyway, and not
         * computing it saves one step. */
        if ((rc = engine_forward(s, &tok.id, 1, NULL, st))) break;
    }
    free(counts); free(pmask);
    if (n_out) *n_out = n;
    return rc;
}
