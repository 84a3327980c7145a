/* The scheduler: the only thread that touches the model. Jobs wait in a FIFO queue
 * until a session slot is free; the slot chosen is the free one whose cached tokens
 * share the longest prefix with the prompt (so a follow-up turn reuses its cache).
 * Each round gives every active job one step, round-robin: a prefill chunk, or one
 * sampled token (sample -> detokenize -> stop filter -> publish -> feed). Publishing
 * appends to the job under its own mutex and never waits for the reader, so a slow
 * client cannot stall anyone else. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "engine/sampler.h"
#include "server/server.h"
#include "text/grammar.h"
#include "util/util.h"

typedef struct {
    lily_session *sess;
    srv_job *job;
    int32_t *counts;
    double last_used;
    int has_pending;   /* a sampled token waits to be fed with the round's batch */
    int32_t pending;
    uint8_t *allowed;  /* [vocab] token mask for constrained jobs, allocated on first use */
    uint8_t *pmask;    /* [vocab] the job's prompt tokens, for repetition_penalty (lily.h: over prompt
                        * and output, as transformers and vLLM apply it); allocated on first use */
    int pmask_on;
    int prefilled;     /* this round's prefill step ran in prefill_round */
    /* this round's draw, made beside the other slots' before the steps (draw_round) */
    int drawn;
    const float *draw_logits;
    lily_token draw_tok;
    int draw_rc;
    lily_status draw_st;
} slot;

struct srv_sched {
    srv_sched_opts o;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int quit, started;
    srv_job *q_head, *q_tail;
    int n_queued, n_active;
    slot *slots;
    int vocab;
    lily_model_info info;
    int32_t extra_stop[4];
    int n_extra;
    int32_t end_ids[16];      /* every token is_stop_token accepts (the model's EOS and extra_stop) */
    int n_end;
    /* parked conversations (host memory, least recently used first out) */
    struct parked { lily_parked *p; double used; } *parked;
    int n_parked, cap_parked;
    size_t parked_bytes;      /* host memory the parked ones hold (the GPU tier's not counted) */
    size_t gpu_bytes;         /* GPU memory the parked ones hold */
    int n_gpu;                /* parked ones on the GPU */
    int gpu_park;             /* parking's GPU tier is on (lily_model_set_park_gpu) */
    int park_off;             /* the backend cannot park: stop trying */
    int dirty;                /* conversations changed since the folder (--cache-dir) was synced */
    double changed;           /* when, lily_now() */
    lily_pool *pool;          /* draws the slots' tokens in parallel (NULL with one slot) */
    int device_loop;          /* a lone stream decodes in the engine's device loop (burst) */
    int batch_loop;           /* concurrent streams decode in the engine's batched device loop (batch_burst) */
    int prefill_batch;        /* prefilling jobs' steps run together (prefill_round) */
};

srv_job *srv_job_new(void) {
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->max_tokens = 16;
    lily_sampling_default(&j->samp);
    return j;
}

void srv_job_unref(srv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    free(j->prompt);
    for (int i = 0; i < j->n_stop; i++) free(j->stops[i]);
    free(j->text);
    free(j->toks);
    tok_stream_free(j->detok);
    srv_stop_free(&j->stop);
    gram_matcher_free(j->gm);
    free(j->gram_prefeed);
    free(j->bias_ids);
    free(j->bias_vals);
    gram_free(j->gram);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* Appends released text and (optionally) the token; finish != NONE ends the job.
 * Called by the scheduler thread only. */
static void publish(srv_job *j, const char *text, size_t len, const lily_token *tok, srv_finish finish,
                    const char *error) {
    pthread_mutex_lock(&j->mu);
    if (len) {
        if (j->text_len + len + 1 > j->text_cap) {
            size_t c = j->text_cap ? j->text_cap : 256;
            while (c < j->text_len + len + 1) c *= 2;
            char *b = realloc(j->text, c);
            if (b) { j->text = b; j->text_cap = c; }
        }
        if (j->text_len + len + 1 <= j->text_cap) {
            memcpy(j->text + j->text_len, text, len);
            j->text_len += len;
            j->text[j->text_len] = 0;
        }
    }
    if (tok && j->want_logprobs) {
        if (j->n_toks == j->toks_cap) {
            int c = j->toks_cap ? j->toks_cap * 2 : 16;
            lily_token *t = realloc(j->toks, sizeof *t * (size_t)c);
            if (t) { j->toks = t; j->toks_cap = c; }
        }
        if (j->n_toks < j->toks_cap) j->toks[j->n_toks++] = *tok;
    }
    if (finish != SRV_FINISH_NONE && j->finish == SRV_FINISH_NONE) {
        j->finish = finish;
        if (error) snprintf(j->error, sizeof j->error, "%s", error);
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* The operator's view of a finished request (--log-requests): prompt tokens and how many came
 * from a cache, tokens made, why it ended, time to the first token and the decode rate. */
static void log_job(srv_sched *s, int slot_i, const srv_job *j, srv_finish f, const char *error) {
    if (!s->o.log_requests) return;
    const char *why = f == SRV_FINISH_LENGTH ? "length" : f == SRV_FINISH_STOP ? "stop" : f == SRV_FINISH_CANCELLED ? "cancelled"
                    : f == SRV_FINISH_SHUTDOWN ? "shutdown" : "error";
    double now = lily_now(), ttft = j->n_gen ? (j->t_first - j->t_submit) * 1e3 : -1;
    double rate = j->n_gen > 1 && j->t_last > j->t_first ? (j->n_gen - 1) / (j->t_last - j->t_first) : 0;
    fprintf(stderr, "lily-server: request done: slot %d, prompt %d tokens (%d cached), %d generated, %s%s%s, "
            "first token %.1f ms, %.1f tok/s, %.3f s in all\n", slot_i, j->n_prompt, j->n_reused, j->n_gen,
            why, error ? ": " : "", error ? error : "", ttft, rate, now - j->t_submit);
}

static void release_slot(srv_sched *s, slot *sl, srv_finish f, const char *error) {
    srv_job *j = sl->job;
    log_job(s, (int)(sl - s->slots), j, f, error);
    publish(j, NULL, 0, NULL, f, error);
    if (f == SRV_FINISH_CANCELLED) srv_metrics_event(s->o.metrics, "cancelled");
    if (f == SRV_FINISH_ERROR) srv_metrics_event(s->o.metrics, "error");
    pthread_mutex_lock(&s->mu);
    sl->job = NULL;
    sl->has_pending = 0; /* (a token a device loop left unfed dies with its job, as feed_round drops it) */
    sl->last_used = lily_now();
    s->n_active--;
    s->dirty = 1;
    s->changed = sl->last_used;
    pthread_mutex_unlock(&s->mu);
    srv_job_unref(j);
}

static int penalized(const lily_sampling *p) {
    return p->presence_penalty != 0 || p->frequency_penalty != 0 || p->repetition_penalty != 1.0f;
}

static int is_stop_token(srv_sched *s, int32_t id) {
    if (lily_model_is_eos(s->o.model, id)) return 1;
    for (int i = 0; i < s->n_extra; i++)
        if (s->extra_stop[i] == id) return 1;
    return 0;
}

/* Ends generation normally: releases what the detokenizer and the stop filter held. */
static void finish_text(srv_job *j, srv_finish f, const lily_token *tok) {
    char *out = NULL;
    size_t n = 0, cap = 0;
    const char *t;
    size_t tl;
    if (tok_stream_flush(j->detok, &t, &tl) == LILY_OK && tl) {
        if (srv_stop_feed(&j->stop, t, tl, &out, &n, &cap) == 1) f = SRV_FINISH_STOP;
    }
    srv_stop_flush(&j->stop, &out, &n, &cap);
    publish(j, out, n, tok, f, NULL);
    free(out);
}

/* Samples the next token. A constrained job (response_format) first tries the plain
 * draw, which the grammar almost always accepts inside strings, and only when it is
 * rejected builds the full mask over the vocabulary and draws again among the allowed
 * tokens: greedy gives exactly the argmax of the allowed tokens either way. An end token is
 * allowed exactly when the grammar can end. 0 ok, -1 with st set. */
static int sample_next(srv_sched *s, slot *sl, srv_job *j, const float *logits, int32_t *counts, lily_token *tok,
                       lily_status *st) {
    const uint8_t *pm = sl->pmask_on ? sl->pmask : NULL;
    if (lily_sample_logits_ex(logits, s->vocab, &j->samp, &j->rng, counts, pm, tok, st)) return -1;
    if (!j->gram_on) return 0;
    if (is_stop_token(s, tok->id) ? gram_matcher_can_end(j->gm) : gram_matcher_accept_token(j->gm, s->o.gram_vocab, tok->id))
        return 0;
    if (!sl->allowed && !(sl->allowed = malloc((size_t)s->vocab))) {
        lily_err(st, LILY_ENOMEM, "out of memory");
        return -1;
    }
    gram_matcher_mask(j->gm, s->o.gram_vocab, sl->allowed);
    if (gram_matcher_can_end(j->gm))
        for (int i = 0; i < s->n_end; i++) sl->allowed[s->end_ids[i]] = 1;
    if (lily_sample_logits_mask(logits, s->vocab, &j->samp, &j->rng, counts, pm, sl->allowed, tok, st)) return -1;
    if (!is_stop_token(s, tok->id) && !gram_matcher_accept_token(j->gm, s->o.gram_vocab, tok->id)) {
        lily_err(st, LILY_EINVAL, "response_format: token %d is in the grammar's mask but not accepted", tok->id);
        return -1;
    }
    return 0;
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb);

/* The slot's next token from sl->draw_logits into draw_tok / draw_rc / draw_st. */
static void draw(srv_sched *s, slot *sl) {
    srv_job *j = sl->job;
    memset(&sl->draw_st, 0, sizeof sl->draw_st);
    sl->draw_rc = sample_next(s, sl, j, sl->draw_logits, penalized(&j->samp) ? sl->counts : NULL, &sl->draw_tok,
                              &sl->draw_st);
}

static int emit(srv_sched *s, slot *sl, const lily_token *tp);

/* The slot's next prefill step (state 1) as a job for the engine: the prompt up to the next chunk's
 * end, and the snapshot marks there (mark: their storage). */
static void prefill_plan(srv_sched *s, slot *sl, lily_prefill_job *pj, int *mark) {
    srv_job *j = sl->job;
    int upto = s->o.prefill_chunk > 0 && j->n_prompt - j->n_fed > s->o.prefill_chunk ? j->n_fed + s->o.prefill_chunk
                                                                                       : j->n_prompt;
    /* The first step reaches one token past what this slot already shares with the
     * prompt: a step that ended inside the shared prefix would hide it from the engine,
     * which then could only start over (no reuse for prompts longer than a chunk). */
    if (j->n_fed == 0 && upto < j->n_prompt) {
        int cp = common_prefix(lily_session_tokens(sl->sess), lily_session_len(sl->sess), j->prompt, j->n_prompt);
        if (cp >= upto) upto = cp + 1 < j->n_prompt ? cp + 1 : j->n_prompt;
    }
    /* A snapshot where the last turn begins lets the next turn of this conversation
     * resume there (its prompt re-renders that turn differently); the end of the
     * prompt gets one for regenerations; intermediate chunk ends get none. */
    memset(pj, 0, sizeof *pj);
    pj->s = sl->sess;
    pj->ids = j->prompt;
    pj->n = upto;
    pj->snapshot_end = upto == j->n_prompt || upto == j->boundary;
    pj->marks = mark;
    if (j->boundary > j->n_fed && j->boundary < upto) { *mark = j->boundary; pj->n_marks = 1; }
}

/* The job's prefill step ended (pj's result): 1 when that ended the job (an error), else its
 * progress recorded (state 2 once the whole prompt is in). */
static int prefill_done(srv_sched *s, slot *sl, const lily_prefill_job *pj) {
    srv_job *j = sl->job;
    if (pj->rc) {
        lily_session_reset(sl->sess);
        release_slot(s, sl, SRV_FINISH_ERROR, pj->st.msg);
        return 1;
    }
    if (j->n_fed == 0) {
        pthread_mutex_lock(&j->mu);
        j->n_reused = pj->reused;
        pthread_mutex_unlock(&j->mu);
    }
    j->n_fed = pj->n;
    if (pj->n == j->n_prompt) j->state = 2;
    return 0;
}

/* Every prefilling job's step at once (lily_prefill_batch: on the GPU their passes side by side),
 * before the round's draws: a burst of N arrivals, each a short latency-bound pass, took N passes
 * one after the other. step() then goes on from each as from its own prefill. */
static void prefill_round(srv_sched *s) {
    lily_prefill_job pj[SRV_MAX_SLOTS];
    slot *sl[SRV_MAX_SLOTS];
    int mark[SRV_MAX_SLOTS], n = 0;
    if (!s->prefill_batch) return;
    for (int i = 0; i < s->o.n_slots; i++) {
        slot *x = &s->slots[i];
        if (!x->job || x->job->state != 1 || atomic_load((_Atomic int *)&x->job->cancel)) continue;
        prefill_plan(s, x, &pj[n], &mark[n]);
        sl[n++] = x;
    }
    if (n < 2) return;
    lily_status st = { 0 };
    if (lily_prefill_batch(pj, n, &st)) return; /* (nothing ran: step() prefills each) */
    for (int i = 0; i < n; i++)
        if (!prefill_done(s, sl[i], &pj[i])) sl[i]->prefilled = 1;
}

static void step(srv_sched *s, slot *sl) {
    srv_job *j = sl->job;
    int drawn = sl->drawn, prefilled = sl->prefilled;
    sl->drawn = sl->prefilled = 0;
    if (atomic_load((_Atomic int *)&j->cancel)) { release_slot(s, sl, SRV_FINISH_CANCELLED, NULL); return; }
    if (sl->has_pending) return; /* drawn and emitted by a device loop that ended: this round feeds it */
    if (j->state == 1 || prefilled) {
        if (!prefilled) { /* (not in this round's prefill_round) */
            lily_prefill_job pj;
            int mark;
            prefill_plan(s, sl, &pj, &mark);
            pj.rc = lily_session_prefill_ex(sl->sess, pj.ids, pj.n, pj.marks, pj.n_marks, pj.snapshot_end, &pj.reused, &pj.st);
            if (prefill_done(s, sl, &pj)) return;
        }
        /* Prefilled beside other jobs: its first token now, fed with theirs this round, not a round later
         * after every other job's step (a burst of N arrivals, each prefill ~9 ms for the 35B-A3B, gave all
         * N their first token after all N prefills). Alone, the device loop (burst) draws it instead. */
        if (j->state != 2 || (s->n_active < 2 && s->device_loop)) return;
    }
    if (!drawn && (sl->draw_logits = lily_session_logits(sl->sess))) draw(s, sl); /* not drawn in draw_round */
    if (!sl->draw_logits || sl->draw_rc) {
        release_slot(s, sl, SRV_FINISH_ERROR, sl->draw_logits ? sl->draw_st.msg : "no logits after prefill");
        return;
    }
    lily_token tok = sl->draw_tok;
    int32_t *counts = penalized(&j->samp) ? sl->counts : NULL;
    if (counts) counts[tok.id]++;
    if (emit(s, sl, &tok)) return;
    sl->pending = tok.id; /* fed by feed_round together with every other slot's token */
    sl->has_pending = 1;
}

/* A drawn (and counted) token's way out: the job's counters and metrics, its end by a stop
 * token, a stop string, the length or the grammar, else the text it releases published.
 * 1 when the job ended (the slot released), 0 when it goes on. */
static int emit(srv_sched *s, slot *sl, const lily_token *tp) {
    srv_job *j = sl->job;
    const lily_token tok = *tp;
    double now = lily_now();
    pthread_mutex_lock(&j->mu);
    int n_gen = ++j->n_gen;
    pthread_mutex_unlock(&j->mu);
    if (n_gen == 1) { srv_metrics_ttft(s->o.metrics, now - j->t_submit); j->t_first = now; }
    else srv_metrics_itl(s->o.metrics, now - j->t_last);
    j->t_last = now;

    /* under a grammar an end token was only drawn where the value is complete: it ends
     * the answer even with ignore_eos */
    if ((!j->ignore_eos || j->gram_on) && is_stop_token(s, tok.id)) {
        finish_text(j, SRV_FINISH_STOP, NULL);
        release_slot(s, sl, SRV_FINISH_STOP, NULL);
        return 1;
    }
    const char *piece;
    size_t plen = 0;
    char *out = NULL;
    size_t n = 0, cap = 0;
    int stopped = 0;
    if (tok_stream_push(j->detok, tok.id, &piece, &plen) == LILY_OK && plen)
        stopped = srv_stop_feed(&j->stop, piece, plen, &out, &n, &cap) == 1;
    if (stopped) {
        publish(j, out, n, &tok, SRV_FINISH_STOP, NULL);
        free(out);
        release_slot(s, sl, SRV_FINISH_STOP, NULL);
        return 1;
    }
    if (n_gen >= j->max_tokens || (j->gram_on && gram_matcher_must_end(j->gm))) {
        srv_finish f = n_gen >= j->max_tokens && !(j->gram_on && gram_matcher_must_end(j->gm)) ? SRV_FINISH_LENGTH
                                                                                              : SRV_FINISH_STOP;
        publish(j, out, n, NULL, SRV_FINISH_NONE, NULL);
        free(out);
        finish_text(j, f, &tok);
        release_slot(s, sl, f, NULL);
        return 1;
    }
    if (j->gram && !j->gram_on && tok.id == j->gram_after) j->gram_on = 1; /* reasoning ended */
    publish(j, out, n, &tok, SRV_FINISH_NONE, NULL);
    free(out);
    return 0;
}

/* Draws the next token of every slot that is generating, on the pool's threads: with
 * many streams, sampling on the host is a share of each round (~0.2 ms a row in Qwen's
 * default mode, 248K logits). Each draw touches only its own job (rng, grammar matcher)
 * and slot (counts, masks), and the vocabulary tables are read-only, so the tokens are
 * those of one-by-one draws. The logits are fetched first, here, one session at a time;
 * step() then uses the draw, or draws itself where none was made. */
typedef struct { srv_sched *s; slot **sl; } draw_ctx;

static void draw_task(void *p, int i) {
    draw_ctx *c = p;
    draw(c->s, c->sl[i]);
}

static void draw_round(srv_sched *s) {
    slot *ready[SRV_MAX_SLOTS];
    int n = 0;
    for (int i = 0; s->pool && i < s->o.n_slots; i++) {
        slot *sl = &s->slots[i];
        srv_job *j = sl->job;
        if (!j || j->state != 2 || sl->has_pending || atomic_load((_Atomic int *)&j->cancel)) continue;
        if (!(sl->draw_logits = lily_session_logits(sl->sess))) continue; /* step() reports it */
        ready[n++] = sl;
    }
    if (n < 2) return;
    draw_ctx c = { s, ready };
    lily_pool_run(s->pool, n, draw_task, &c);
    for (int i = 0; i < n; i++) ready[i]->drawn = 1;
}

/* Feeds every slot's sampled token in one batched pass (the weights are read once per
 * round, whatever the number of streams); if the batch fails, each slot is fed alone so
 * only the one at fault is ended. */
static void feed_round(srv_sched *s) {
    lily_session *ss[SRV_MAX_SLOTS];
    int32_t ids[SRV_MAX_SLOTS];
    int n = 0;
    for (int i = 0; i < s->o.n_slots; i++)
        if (s->slots[i].has_pending && s->slots[i].job) { ss[n] = s->slots[i].sess; ids[n++] = s->slots[i].pending; }
    lily_status st = { 0 };
    int batch_ok = n > 0 && lily_decode_batch(ss, ids, n, &st) == LILY_OK;
    for (int i = 0; i < s->o.n_slots; i++) {
        slot *sl = &s->slots[i];
        if (!sl->has_pending) continue;
        sl->has_pending = 0;
        if (batch_ok || !sl->job) continue;
        if (lily_session_feed(sl->sess, &sl->pending, 1, NULL, &st)) {
            lily_session_reset(sl->sess);
            release_slot(s, sl, SRV_FINISH_ERROR, st.msg);
        }
    }
}

/* ---- the lone stream's device loop ----
 * With one job generating and none waiting, a round of the loop above costs a host sync a
 * token: the logits copied back, drawn here, the token fed (one step the GPU waits on the
 * host). A burst hands the job to the engine's device loop instead
 * (lily_session_generate_cont): each token is chosen on the GPU and fed there while the host
 * publishes the one before, with the job's own rng and counts, so its tokens are those the
 * rounds would have drawn. The burst ends where the job does, or when another job arrives
 * (which the rounds then batch with it) or this one is cancelled. A constraint's tokens keep the
 * rounds (their masks come from the host's grammar): a job whose grammar starts after a token
 * (</think>, <tool_call>) runs here until that token, then in rounds. So does a session not on
 * a GPU. */
typedef struct { srv_sched *s; slot *sl; int32_t last; } burst_ctx;

/* A device loop's token for slot sl (the lone stream's or a batch row's): 1 when the loop should end
 * after it: the job was cancelled (the token dropped, as a round would) or ended (the slot released
 * either way), its grammar starts (the rounds take over: its masks), or a request waits that a free
 * slot could take, or the server quits. */
static int loop_token(srv_sched *s, slot *sl, const lily_token *tok) {
    srv_job *j = sl->job;
    if (atomic_load((_Atomic int *)&j->cancel)) { release_slot(s, sl, SRV_FINISH_CANCELLED, NULL); return 1; }
    if (emit(s, sl, tok)) return 1;
    if (j->gram_on) return 1;
    pthread_mutex_lock(&s->mu);
    int yield = (s->q_head != NULL && s->n_active < s->o.n_slots) || s->quit;
    pthread_mutex_unlock(&s->mu);
    return yield;
}

static int burst_cb(void *user, const lily_token *tok) {
    burst_ctx *c = user;
    c->last = tok->id;
    return loop_token(c->s, c->sl, tok);
}

/* 1 when it ran the lone generating job's burst, 0 when the rounds should run instead. */
static int burst(srv_sched *s, int n_active) {
    if (!s->device_loop || n_active != 1) return 0;
    slot *sl = NULL;
    for (int i = 0; i < s->o.n_slots && !sl; i++)
        if (s->slots[i].job) sl = &s->slots[i];
    srv_job *j = sl ? sl->job : NULL;
    if (!j || j->state != 2 || j->gram_on || sl->has_pending || atomic_load((_Atomic int *)&j->cancel)) return 0;
    if (!lily_session_logits(sl->sess)) return 0; /* step() reports it */
    burst_ctx c = { s, sl, 0 };
    srv_metrics_device_loop(s->o.metrics, -1); /* (counted as it starts; one refused, LILY_CU_HOST_SAMPLING, too) */
    lily_status st = { 0 };
    int n = 0, fed = 0, left = j->max_tokens - j->n_gen;
    lily_code rc = lily_session_generate_cont(sl->sess, &j->samp, &j->rng, penalized(&j->samp) ? sl->counts : NULL,
                                              sl->pmask_on ? sl->pmask : NULL, left > 0 ? left : 1, burst_cb, &c, &n,
                                              &fed, &st);
    if (rc == LILY_EUNSUPPORTED && n == 0) { s->device_loop = 0; return 0; }
    srv_metrics_device_loop(s->o.metrics, n - 1);
    if (!sl->job) return 1; /* ended in the loop (an error after that leaves the session as it fed) */
    if (rc) {
        lily_session_reset(sl->sess);
        release_slot(s, sl, SRV_FINISH_ERROR, st.msg);
        return 1;
    }
    if (fed < n) { /* the last token drawn is not in the session yet: the next round feeds it (in a batched
                    * loop with a job that arrived, or feed_round), and its step draws nothing for it */
        sl->pending = c.last;
        sl->has_pending = 1;
    }
    return 1;
}

/* ---- the streams' device loop ----
 * With two or more jobs generating and nothing else to do (none prefilling, none under a grammar,
 * no request waiting for a free slot), the round's tokens, drawn and published above, go to the
 * engine's batched device loop (lily_session_generate_batch) instead of feed_round: every later
 * step's tokens are chosen on the GPU with each job's own rng, counts and prompt mask, and the host
 * publishes a step while the GPU runs the next, so the tokens are those the rounds would draw. The
 * loop ends, for all its jobs, after the step in which one of them ends, is cancelled or reaches
 * its grammar, or a request arrives that a free slot could take. The jobs that go on keep their last
 * token pending (drawn and published, not fed): the next round draws nothing for them (step, draw_round),
 * prefills any job admitted meanwhile and hands every pending token to the next loop, so an end costs
 * no host pass of its own (feed_round feeds them where no loop can start: one job left, a grammar). */
typedef struct { srv_sched *s; slot *sl[SRV_MAX_SLOTS]; int32_t last[SRV_MAX_SLOTS]; int n_tok; } bburst_ctx;

static int bburst_cb(void *user, int row, const lily_token *tok) {
    bburst_ctx *c = user;
    slot *sl = c->sl[row];
    srv_job *j = sl->job;
    if (!j) return 1;
    if (!tok) { release_slot(c->s, sl, SRV_FINISH_ERROR, "sampler: every token is penalized to -inf"); return 1; }
    c->last[row] = tok->id;
    c->n_tok++;
    return loop_token(c->s, sl, tok);
}

/* 1 when the round's pending tokens went into a batched device loop (fed, and more made), 0 when
 * feed_round should feed them. */
static int batch_burst(srv_sched *s) {
    if (!s->batch_loop) return 0;
    bburst_ctx c = { .s = s };
    lily_batch_row rows[SRV_MAX_SLOTS];
    int n = 0, max_steps = 1 << 30;
    for (int i = 0; i < s->o.n_slots; i++) {
        slot *sl = &s->slots[i];
        srv_job *j = sl->job;
        if (!j) continue;
        if (!sl->has_pending || j->state != 2 || j->gram_on || atomic_load((_Atomic int *)&j->cancel)) return 0;
        if (j->max_tokens - j->n_gen < max_steps) max_steps = j->max_tokens - j->n_gen;
        rows[n] = (lily_batch_row){ sl->sess, sl->pending, &j->samp, &j->rng, penalized(&j->samp) ? sl->counts : NULL,
                                    sl->pmask_on ? sl->pmask : NULL, 0, 0 };
        c.sl[n++] = sl;
    }
    if (n < 2 || n > 32 || max_steps < 1) return 0;
    pthread_mutex_lock(&s->mu);
    int waiting = s->q_head != NULL && s->n_active < s->o.n_slots;
    pthread_mutex_unlock(&s->mu);
    if (waiting) return 0;
    lily_status st = { 0 };
    lily_code rc = lily_session_generate_batch(rows, n, max_steps, bburst_cb, &c, &st);
    /* nothing ran (LILY_CU_HOST_SAMPLING, a small chunk, a session at the context's end): feed_round feeds
     * the tokens, each session alone if the batch fails, so only a job at fault ends */
    if (rc && rows[0].n_fed == 0) return 0;
    srv_metrics_device_loop(s->o.metrics, -1);
    srv_metrics_device_loop(s->o.metrics, c.n_tok);
    for (int i = 0; i < n; i++) {
        slot *sl = c.sl[i];
        sl->has_pending = 0;
        if (!sl->job) continue; /* (ended in the loop; its session holds what it fed) */
        if (rc) {
            lily_session_reset(sl->sess);
            release_slot(s, sl, SRV_FINISH_ERROR, st.msg);
        } else if (rows[i].n_fed == rows[i].n_out) { /* the last token reported is not in the session yet */
            sl->pending = rows[i].n_out ? c.last[i] : sl->pending;
            sl->has_pending = 1;
        }
    }
    return 1;
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = 0;
    while (n < na && n < nb && a[n] == b[n]) n++;
    return n;
}

/* ---- parked conversations ----
 * A slot's session is its conversation's cache; when the slot is given to a request that
 * shares less than its whole state, that state would be lost, so it is parked first: in GPU
 * memory when the backend has that tier (--gpu-cache-mb; the least recently used one there moves
 * to the host when it is full), else in host memory (budget --cache-mb, least recently used
 * evicted). A request admitted later whose
 * prompt a parked conversation covers further than any free slot gets it unparked into its
 * slot: the conversation resumes without recomputing its prefix. */

/* Prompt tokens a parked conversation lets a request skip: all of it when the prompt
 * extends it, else up to its latest snapshot inside the common prefix; 0 = useless. */
static int parked_usable(const lily_parked *p, const int32_t *ids, int n) {
    int pn;
    const int32_t *pt = lily_parked_tokens(p, &pn);
    int cp = common_prefix(pt, pn, ids, n);
    if (cp == pn && pn < n) return pn;
    int best = 0;
    for (int i = 0, pos; (pos = lily_parked_snapshot(p, i)) > 0; i++)
        if (pos <= cp && pos < n && pos > best) best = pos;
    return best;
}

/* Takes entry i out of the store (not freed). */
static lily_parked *parked_take(srv_sched *s, int i) {
    lily_parked *p = s->parked[i].p;
    if (lily_parked_on_gpu(p)) { s->gpu_bytes -= lily_parked_bytes(p); s->n_gpu--; }
    else s->parked_bytes -= lily_parked_bytes(p);
    s->parked[i] = s->parked[--s->n_parked];
    return p;
}

static void parked_drop(srv_sched *s, int i) { lily_parked_free(parked_take(s, i)); }

static void parked_publish(srv_sched *s) {
    if (s->o.metrics) srv_metrics_parked(s->o.metrics, s->n_parked, s->parked_bytes, s->gpu_bytes);
}

/* Keeps p (taken over) in the parked store, evicting the least recently used ones to stay
 * within the budget; a conversation larger than the whole budget is dropped. */
static void parked_add(srv_sched *s, lily_parked *p, double used) {
    size_t b = lily_parked_bytes(p);
    const int gpu = lily_parked_on_gpu(p); /* (the backend keeps that tier within its budget) */
    if (!gpu && b > s->o.park_bytes) { lily_parked_free(p); return; }
    while (!gpu && s->n_parked - s->n_gpu > 0 && s->parked_bytes + b > s->o.park_bytes) {
        int old = -1;
        for (int i = 0; i < s->n_parked; i++)
            if (!lily_parked_on_gpu(s->parked[i].p) && (old < 0 || s->parked[i].used < s->parked[old].used)) old = i;
        if (s->parked[old].used > used) { lily_parked_free(p); return; } /* p is the oldest */
        parked_drop(s, old);
    }
    if (s->n_parked == s->cap_parked) {
        int c = s->cap_parked ? 2 * s->cap_parked : 16;
        struct parked *q = realloc(s->parked, sizeof *q * (size_t)c);
        if (!q) { lily_parked_free(p); return; }
        s->parked = q;
        s->cap_parked = c;
    }
    s->parked[s->n_parked].p = p;
    s->parked[s->n_parked++].used = used;
    if (gpu) { s->gpu_bytes += b; s->n_gpu++; }
    else s->parked_bytes += b;
}

/* Moves the GPU tier's least recently used conversation to the host store; 0 when there is none. */
static int parked_demote(srv_sched *s) {
    int old = -1;
    for (int i = 0; i < s->n_parked; i++)
        if (lily_parked_on_gpu(s->parked[i].p) && (old < 0 || s->parked[i].used < s->parked[old].used)) old = i;
    if (old < 0) return 0;
    double used = s->parked[old].used;
    lily_parked *p = parked_take(s, old);
    lily_status st = { 0 };
    if (s->o.park_bytes && lily_parked_to_host(p, &st) == LILY_OK) parked_add(s, p, used);
    else lily_parked_free(p);
    return 1;
}

/* Parks the slot's conversation before its state is overwritten. */
static void park_slot(srv_sched *s, slot *sl, double used) {
    if ((!s->o.park_bytes && !s->gpu_park) || s->park_off || lily_session_len(sl->sess) < 1) return;
    lily_parked *p = NULL;
    lily_status st = { 0 };
    lily_code rc = LILY_ENOMEM;
    if (s->gpu_park) /* the GPU tier, making room there by moving its oldest to the host */
        while ((rc = lily_session_park_to(sl->sess, LILY_PARK_GPU, &p, &st)) == LILY_ENOMEM && parked_demote(s)) {}
    if (rc && s->o.park_bytes) rc = lily_session_park_to(sl->sess, LILY_PARK_HOST, &p, &st);
    if (rc == LILY_EUNSUPPORTED) s->park_off = 1;
    if (rc) return;
    parked_add(s, p, used);
    srv_metrics_event(s->o.metrics, "parked");
    parked_publish(s);
}

/* The parked conversation that covers j's prompt furthest beyond `have` tokens, or -1. */
static int best_parked(srv_sched *s, const srv_job *j, int have) {
    int best = -1;
    for (int i = 0; i < s->n_parked; i++) {
        int u = parked_usable(s->parked[i].p, j->prompt, j->n_prompt);
        if (u > have) { best = i; have = u; }
    }
    return best;
}

/* Gives slot sl to job j, whose prompt the slot's own state covers for `have` tokens:
 * unparks a conversation that covers more, parking the slot's state first whenever it
 * would otherwise be lost. */
static void prepare_slot(srv_sched *s, slot *sl, srv_job *j, int have) {
    if (have < lily_session_len(sl->sess)) park_slot(s, sl, lily_now());
    /* searched after parking, which may evict or move entries; the slot's own parked state
     * never beats `have` (its snapshots lie within the common prefix) */
    int best = best_parked(s, j, have);
    if (best < 0) return;
    lily_status st = { 0 };
    if (lily_session_unpark(sl->sess, s->parked[best].p, &st) == LILY_OK) {
        srv_metrics_event(s->o.metrics, "unparked");
        parked_drop(s, best); /* the slot holds it now; it is parked again when the slot is reused */
    } else {
        lily_session_reset(sl->sess);
    }
    parked_publish(s);
}

/* Under s->mu: move queued jobs into free slots in FIFO order, dropping cancelled ones
 * wherever they are in the queue. */
static void admit(srv_sched *s) {
    srv_job **pp = &s->q_head, *prev = NULL;
    while (*pp) {
        srv_job *j = *pp;
        int cancelled = atomic_load((_Atomic int *)&j->cancel);
        int best = -1, best_len = -1;
        if (!cancelled) {
            for (int i = 0; i < s->o.n_slots; i++) {
                slot *sl = &s->slots[i];
                if (sl->job) continue;
                int l = common_prefix(lily_session_tokens(sl->sess), lily_session_len(sl->sess), j->prompt, j->n_prompt);
                if (l > best_len || (l == best_len && sl->last_used < s->slots[best].last_used)) { best = i; best_len = l; }
            }
            if (best < 0) { prev = j; pp = &j->next; continue; } /* wait; keep looking for cancelled ones */
        }
        *pp = j->next;
        if (s->q_tail == j) s->q_tail = prev;
        s->n_queued--;
        j->next = NULL;
        lily_status st = { 0 };
        if (!cancelled && tok_stream_new(s->o.tok, 1, &j->detok, &st)) {
            publish(j, NULL, 0, NULL, SRV_FINISH_ERROR, st.msg);
            srv_job_unref(j);
            continue;
        }
        if (cancelled) {
            publish(j, NULL, 0, NULL, SRV_FINISH_CANCELLED, NULL);
            srv_metrics_event(s->o.metrics, "cancelled");
            srv_job_unref(j);
            continue;
        }
        slot *sl = &s->slots[best];
        prepare_slot(s, sl, j, best_len);
        sl->job = j;
        s->n_active++;
        j->state = 1;
        j->n_fed = 0;
        lily_rng_seed(&j->rng, j->samp.seed);
        if (j->gram && (!s->o.gram_vocab || gram_matcher_new(j->gram, &j->gm, &st) ||
                        (j->gram_prefeed && !gram_matcher_accept_bytes(j->gm, j->gram_prefeed, strlen(j->gram_prefeed)) &&
                         lily_err(&st, LILY_EINVAL, "the forced tool call's opening does not fit its grammar")))) {
            publish(j, NULL, 0, NULL, SRV_FINISH_ERROR, s->o.gram_vocab ? st.msg : "response_format: no tokenizer");
            sl->job = NULL;
            s->n_active--;
            srv_job_unref(j);
            continue;
        }
        j->gram_on = j->gram && j->gram_after < 0;
        srv_stop_init(&j->stop, j->stops, j->n_stop);
        if (penalized(&j->samp)) memset(sl->counts, 0, sizeof *sl->counts * (size_t)s->vocab);
        sl->pmask_on = 0;
        if (j->samp.repetition_penalty != 1.0f && j->samp.repetition_penalty != 0.0f &&
            (sl->pmask || (sl->pmask = malloc((size_t)s->vocab)))) {
            memset(sl->pmask, 0, (size_t)s->vocab);
            for (int i = 0; i < j->n_prompt; i++)
                if (j->prompt[i] >= 0 && j->prompt[i] < s->vocab) sl->pmask[j->prompt[i]] = 1;
            sl->pmask_on = 1;
        }
    }
}

static void checkpoint(srv_sched *s);

/* The first request after start paid for the GPU's first launches, the kernels' modules loaded on
 * first use and the decode graphs captured: 62-108 ms to its first token against 6-10 ms for later
 * fresh prompts (H100, bench/RESULTS.md session 37). A short prefill, two greedy and two sampled
 * tokens on the first slot's session and a decode batch with the second's, all reset afterwards,
 * pay that before the server listens. Best effort: a failure here is a request's to report later.
 * LILY_SRV_WARMUP=0 skips it. */
static void warm_up(srv_sched *s) {
    const char *e = getenv("LILY_SRV_WARMUP");
    if ((e && !strcmp(e, "0")) || !s->info.backend || strcmp(s->info.backend, "cuda")) return;
    lily_status st = { 0 };
    int32_t ids[16];
    for (int i = 0; i < 16; i++) ids[i] = i % s->vocab;
    lily_session *a = s->slots[0].sess, *b = s->o.n_slots > 1 ? s->slots[1].sess : NULL;
    lily_sampling p;
    lily_sampling_default(&p);
    p.temperature = 0;
    if (lily_session_prefill(a, ids, 16, NULL, &st) == LILY_OK && lily_session_generate(a, &p, 2, NULL, NULL, NULL, &st) == LILY_OK) {
        p.temperature = 0.7f;
        lily_session_generate(a, &p, 2, NULL, NULL, NULL, &st);
        if (b && lily_session_prefill(b, ids, 8, NULL, &st) == LILY_OK) {
            lily_session *ss[2] = { a, b };
            int32_t t[2] = { ids[1], ids[2] };
            lily_decode_batch(ss, t, 2, &st);
        }
    }
    lily_session_reset(a);
    if (b) lily_session_reset(b);
}

static void *sched_main(void *arg) {
    srv_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        admit(s);
        if (s->quit) break;
        if (s->n_active == 0) {
            if (s->dirty && s->o.cache_dir && s->o.park_bytes && s->o.cache_save_s > 0) {
                double due = s->changed + s->o.cache_save_s, now = lily_now();
                if (now >= due) { /* idle long enough: the folder catches up (requests wait meanwhile) */
                    s->dirty = 0;
                    pthread_mutex_unlock(&s->mu);
                    checkpoint(s);
                    pthread_mutex_lock(&s->mu);
                    continue;
                }
                struct timespec ts;
                srv_abstime(due - now, &ts);
                pthread_cond_timedwait(&s->cv, &s->mu, &ts);
                continue;
            }
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        /* (a job left waiting where a slot is free was admitted above; one waiting for the only slot
         * cannot start before this one ends, so it takes no burst's place) */
        int n_active = s->q_head && s->o.n_slots > 1 ? 0 : s->n_active;
        pthread_mutex_unlock(&s->mu);
        if (!burst(s, n_active)) {
            prefill_round(s);
            draw_round(s);
            for (int i = 0; i < s->o.n_slots; i++)
                if (s->slots[i].job) step(s, &s->slots[i]);
            if (!batch_burst(s)) feed_round(s);
        }
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->o.n_slots; i++)
        if (s->slots[i].job) release_slot(s, &s->slots[i], SRV_FINISH_SHUTDOWN, "the server is shutting down");
    pthread_mutex_lock(&s->mu);
    while (s->q_head) {
        srv_job *j = s->q_head;
        s->q_head = j->next;
        publish(j, NULL, 0, NULL, SRV_FINISH_SHUTDOWN, "the server is shutting down");
        srv_job_unref(j);
    }
    s->q_tail = NULL;
    s->n_queued = 0;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- --cache-dir: the parked store across restarts (park_dir.c) ---- */

static void load_one(void *u, lily_parked *p, double age) {
    srv_sched *s = u;
    parked_add(s, p, lily_now() - age);
}

/* The folder's set: every slot's conversation (parked only if the folder lacks it) and every
 * parked one, most recently used first. */
static int by_recent_entry(const void *a, const void *b) {
    double x = ((const srv_park_entry *)a)->used, y = ((const srv_park_entry *)b)->used;
    return (x < y) - (x > y);
}
static int job_waiting(void *u) {
    srv_sched *s = u;
    pthread_mutex_lock(&s->mu);
    int w = s->q_head != NULL || s->quit;
    pthread_mutex_unlock(&s->mu);
    return w;
}
static int sync_dir(srv_sched *s, int (*stop)(void *)) {
    int n = 0, cap = s->n_parked + s->o.n_slots;
    srv_park_entry *es = calloc((size_t)cap + 1, sizeof *es);
    if (!es) return 0;
    for (int i = 0; i < s->o.n_slots; i++) {
        slot *sl = &s->slots[i];
        int len = lily_session_len(sl->sess);
        if (len < 1 || s->park_off) continue;
        es[n].used = sl->last_used;
        es[n].sess = sl->sess;
        srv_park_name(lily_session_tokens(sl->sess), len, es[n].name);
        n++;
    }
    for (int i = 0; i < s->n_parked; i++) {
        int tn;
        const int32_t *t = lily_parked_tokens(s->parked[i].p, &tn);
        es[n].used = s->parked[i].used;
        es[n].p = s->parked[i].p;
        srv_park_name(t, tn, es[n].name);
        n++;
    }
    qsort(es, (size_t)n, sizeof *es, by_recent_entry);
    int saved = srv_park_dir_sync(s->o.cache_dir, s->o.model, es, n, stop, s);
    free(es);
    return saved;
}

/* On the scheduler thread, idle: a crash or SIGKILL from now on loses nothing finished. */
static void checkpoint(srv_sched *s) {
    double t0 = lily_now();
    int n = sync_dir(s, job_waiting);
    if (s->o.log_requests)
        fprintf(stderr, "lily-server: --cache-dir: synced %d conversations to '%s' in %.0f ms\n", n, s->o.cache_dir,
                (lily_now() - t0) * 1e3);
}

void srv_sched_save(srv_sched *s) {
    if (!s->o.cache_dir || !s->o.park_bytes || s->started) return;
    for (int i = 0; i < s->o.n_slots; i++) park_slot(s, &s->slots[i], s->slots[i].last_used);
    for (int i = 0; i < s->o.n_slots; i++) lily_session_reset(s->slots[i].sess); /* parked: kept once */
    int n = sync_dir(s, NULL);
    fprintf(stderr, "lily-server: --cache-dir: saved %d conversations (%.1f MB) to '%s'\n", n,
            s->parked_bytes / 1048576.0, s->o.cache_dir);
}

lily_code srv_sched_start(const srv_sched_opts *o, srv_sched **out, lily_status *st) {
    srv_sched *s = calloc(1, sizeof *s);
    if (!s) return lily_err(st, LILY_ENOMEM, "out of memory");
    s->o = *o;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    lily_model_get_info(o->model, &s->info);
    s->vocab = s->info.vocab_size;
    if (o->tok) {
        const char *extra[] = { "<|im_end|>", "<|endoftext|>" };
        for (int i = 0; i < 2; i++) {
            int32_t id = tok_id(o->tok, extra[i]);
            if (id >= 0 && id < s->vocab) s->extra_stop[s->n_extra++] = id;
        }
    }
    for (int32_t id = 0; id < s->vocab && s->n_end < 16; id++)
        if (is_stop_token(s, id)) s->end_ids[s->n_end++] = id;
    s->slots = calloc((size_t)o->n_slots, sizeof *s->slots);
    if (!s->slots) { srv_sched_stop(s); return lily_err(st, LILY_ENOMEM, "out of memory"); }
    for (int i = 0; i < o->n_slots; i++) {
        lily_code rc = lily_session_new(o->model, &s->slots[i].sess, st);
        if (rc) { srv_sched_stop(s); return rc; }
        s->slots[i].counts = calloc((size_t)s->vocab, sizeof(int32_t));
        if (!s->slots[i].counts) { srv_sched_stop(s); return lily_err(st, LILY_ENOMEM, "out of memory"); }
    }
    { /* LILY_SRV_DEVICE_LOOP=0: the lone stream in rounds too (the reference the bursts are tested against) */
        const char *e = getenv("LILY_SRV_DEVICE_LOOP");
        s->device_loop = !(e && !strcmp(e, "0")) && s->info.backend && !strcmp(s->info.backend, "cuda");
        /* LILY_SRV_BATCH_LOOP=0: concurrent streams in rounds (the reference the batched loop is tested against) */
        e = getenv("LILY_SRV_BATCH_LOOP");
        s->batch_loop = !(e && !strcmp(e, "0")) && s->info.backend && !strcmp(s->info.backend, "cuda");
        /* LILY_SRV_PREFILL_BATCH=0: arrivals prefilled a job at a time (the reference for prefill_round) */
        e = getenv("LILY_SRV_PREFILL_BATCH");
        s->prefill_batch = !(e && !strcmp(e, "0"));
    }
    warm_up(s);
    if (o->gpu_park_bytes && s->info.backend && !strcmp(s->info.backend, "cuda")) {
        /* after the slots' sessions, so that "half the free memory" leaves theirs out */
        uint64_t b = 0;
        lily_status ps = { 0 };
        if (lily_model_set_park_gpu(o->model, o->gpu_park_bytes, &b, &ps) == LILY_OK && b) {
            s->gpu_park = 1;
            fprintf(stderr, "lily-server: parking conversations in GPU memory, up to %.0f MB (--gpu-cache-mb)\n",
                    b / 1048576.0);
        }
    }
    if (o->n_slots > 1) { /* at most a thread a slot; without it the draws are made one by one */
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        s->pool = lily_pool_new(nc > 0 && nc < o->n_slots ? (int)nc : o->n_slots);
    }
    if (o->cache_dir && o->park_bytes) {
        int n = srv_park_dir_load(o->cache_dir, o->model, load_one, s);
        fprintf(stderr, "lily-server: --cache-dir: restored %d conversations (%.1f MB) from '%s'", s->n_parked,
                s->parked_bytes / 1048576.0, o->cache_dir);
        if (n > s->n_parked) fprintf(stderr, "; %d more did not fit in --cache-mb", n - s->n_parked);
        fputc('\n', stderr);
        parked_publish(s);
    }
    if (pthread_create(&s->th, NULL, sched_main, s)) {
        srv_sched_stop(s);
        return lily_err(st, LILY_ENOMEM, "cannot start the scheduler thread");
    }
    s->started = 1;
    *out = s;
    return LILY_OK;
}

void srv_sched_shutdown(srv_sched *s) {
    if (!s || !s->started) return;
    pthread_mutex_lock(&s->mu);
    s->quit = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    s->started = 0;
}

void srv_sched_stop(srv_sched *s) {
    if (!s) return;
    srv_sched_shutdown(s);
    for (int i = 0; s->slots && i < s->o.n_slots; i++) {
        lily_session_free(s->slots[i].sess);
        free(s->slots[i].counts);
        free(s->slots[i].pmask);
        free(s->slots[i].allowed);
    }
    free(s->slots);
    lily_pool_free(s->pool);
    while (s->n_parked) parked_drop(s, s->n_parked - 1);
    free(s->parked);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

int srv_sched_submit(srv_sched *s, srv_job *j) {
    pthread_mutex_lock(&s->mu);
    if (s->quit || s->n_queued >= s->o.max_queue) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    j->t_submit = lily_now();
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
    j->next = NULL;
    if (s->q_tail) s->q_tail->next = j;
    else s->q_head = j;
    s->q_tail = j;
    s->n_queued++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void srv_sched_cancel(srv_sched *s, srv_job *j) {
    atomic_store((_Atomic int *)&j->cancel, 1);
    pthread_mutex_lock(&s->mu);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void srv_sched_counts(srv_sched *s, int *queued, int *active) {
    pthread_mutex_lock(&s->mu);
    *queued = s->n_queued;
    *active = s->n_active;
    pthread_mutex_unlock(&s->mu);
}

int srv_model_vocab(srv_sched *s) { return s->vocab; }

void srv_sched_info(srv_sched *s, lily_model_info *info) { *info = s->info; }
