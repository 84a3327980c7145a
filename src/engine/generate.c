/* Sampling and the generation loop over a session. The sampler itself is a pure function
 * (sampler.c); this file owns the per-session state it needs: the RNG and the counts of
 * generated tokens for the penalties. */
#include "engine/engine.h"
#include "engine/sampler.h"
#include <stdlib.h>

lily_code lily_session_sample(lily_session *s, const lily_sampling *p, lily_token *out, lily_status *st) {
    if (!s->has_logits) return lily_err(st, LILY_EINVAL, "nothing to sample from: feed a prompt first");
    return lily_sample_logits(s->logits, s->m->w.cfg.vocab, p, &s->rng, NULL, out, st);
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
    if (!counts) return lily_err(st, LILY_ENOMEM, "out of memory");
    lily_rng_seed(&s->rng, p->seed);
    int n = 0;
    while (n < max_tokens) {
        lily_token tok;
        if ((rc = lily_sample_logits(s->logits, V, p, &s->rng, counts, &tok, st))) break;
        counts[tok.id]++;
        n++;
        int stop = cb ? cb(user, &tok) : 0;
        if (stop || lily_model_is_eos(s->m, tok.id) || n == max_tokens) break;
        /* The last token is left unfed: a follow-up turn re-renders it anyway, and not
         * computing it saves one step. */
        if ((rc = engine_forward(s, &tok.id, 1, NULL, st))) break;
    }
    free(counts);
    if (n_out) *n_out = n;
    return rc;
}
