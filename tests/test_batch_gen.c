/* lily_session_generate_batch (the server's concurrent streams in one decode loop on the GPU)
 * against the host's rounds on the same CUDA model: each round draws every row's token on the host
 * (lily_sample_logits_ex with the row's rng, counts and prompt mask) and feeds them together with
 * lily_decode_batch. Both run the same batched pass on the same inputs, and the device's choice is the
 * host sampler's (docs/cuda.md, "Sampling on the GPU"), so every row must get the same tokens and top
 * lists, and end with the same rng, counts, session tokens and logits. Rows: plain greedy (the
 * argmax), every sampling option with logprobs, temperature alone, greedy with logprobs (the
 * sampler's greedy mode), a temperature with top-k 1 (greedy: the rng must not move); prompts of
 * different lengths. The loop runs in pieces as the server runs
 * it: ended by max_steps (the last token left unfed: the next piece feeds it first), then after host
 * rounds, ended by a callback (every row's token of that step reported, all fed), then the rest. A
 * row near the end of the context bounds the loop. On the CPU backend (no LILY_TEST_BACKEND=cuda):
 * LILY_EUNSUPPORTED, nothing run. */
#include <stdlib.h>
#include <string.h>
#include "engine/sampler.h"
#include "lily.h"
#include "t.h"
#include "t_model.h"
#include "util/util.h"

enum { NR = 5, STEPS = 14 };

typedef struct {
    lily_session *s;
    lily_sampling p;
    lily_rng rng;
    int32_t *counts;
    uint8_t *pm;
    lily_token t[STEPS + 8];
    int n;
} row;

/* The rows' sessions at their prompts, sampling state fresh. */
static void rows_start(lily_model *m, row *r, int n, int32_t *const *prompts, const int *plen, int V) {
    lily_status st = { 0 };
    for (int i = 0; i < n; i++) {
        r[i].n = 0;
        CHECK(lily_session_new(m, &r[i].s, &st) == LILY_OK, "session: %s", st.msg);
        CHECK(lily_session_prefill(r[i].s, prompts[i], plen[i], NULL, &st) == LILY_OK, "prefill: %s", st.msg);
        lily_rng_seed(&r[i].rng, r[i].p.seed);
        memset(r[i].counts, 0, (size_t)V * sizeof *r[i].counts);
        memset(r[i].pm, 0, (size_t)V);
        for (int k = 0; k < plen[i]; k++) r[i].pm[prompts[i][k]] = 1;
    }
}

static void rows_end(row *r, int n) {
    for (int i = 0; i < n; i++) { lily_session_free(r[i].s); r[i].s = NULL; }
}

/* Every row's next token drawn on the host from its session's logits (as the server's rounds). */
static void host_draw(row *r, int n, int V, int32_t *ids) {
    lily_status st = { 0 };
    for (int i = 0; i < n; i++) {
        lily_token t;
        CHECK(lily_sample_logits_ex(lily_session_logits(r[i].s), V, &r[i].p, &r[i].rng, r[i].counts, r[i].pm, &t, &st) == LILY_OK,
              "host draw: %s", st.msg);
        r[i].counts[t.id]++;
        r[i].t[r[i].n++] = t;
        ids[i] = t.id;
    }
}

static void feed_all(row *r, int n, const int32_t *ids) {
    lily_session *ss[NR];
    for (int i = 0; i < n; i++) ss[i] = r[i].s;
    lily_status st = { 0 };
    CHECK(lily_decode_batch(ss, ids, n, &st) == LILY_OK, "decode batch: %s", st.msg);
}

/* The reference: `steps` host rounds, the last token drawn left unfed when leave_last. */
static void rounds(row *r, int n, int V, int steps, int leave_last) {
    int32_t ids[NR];
    for (int k = 0; k < steps; k++) {
        host_draw(r, n, V, ids);
        if (k + 1 < steps || !leave_last) feed_all(r, n, ids);
    }
}

typedef struct { row *r; int stop_row, stop_at, calls; } cb_ctx;
static int collect(void *user, int i, const lily_token *t) {
    cb_ctx *c = user;
    c->calls++;
    if (!t) return 1;
    c->r[i].t[c->r[i].n++] = *t;
    return i == c->stop_row && --c->stop_at == 0;
}

/* One piece of the loop: firsts[i] (drawn, counted and reported already) fed first. */
static int piece(row *r, int n, const int32_t *firsts, int max_steps, int stop_row, int stop_at, int *fed,
                 lily_code *rc) {
    lily_batch_row b[NR];
    for (int i = 0; i < n; i++) b[i] = (lily_batch_row){ r[i].s, firsts[i], &r[i].p, &r[i].rng, r[i].counts, r[i].pm, -1, -1 };
    cb_ctx c = { r, stop_row, stop_at, 0 };
    lily_status st = { 0 };
    *rc = lily_session_generate_batch(b, n, max_steps, collect, &c, &st);
    if (*rc && *rc != LILY_EUNSUPPORTED) fprintf(stderr, "  generate_batch: %s\n", st.msg);
    int same = 1;
    for (int i = 1; i < n; i++) same &= b[i].n_out == b[0].n_out && b[i].n_fed == b[0].n_fed;
    CHECK(same, "every row reports and feeds the same steps");
    CHECK(c.calls == n * b[0].n_out, "the callback saw %d tokens for %d steps of %d rows", c.calls, b[0].n_out, n);
    *fed = b[0].n_fed;
    return b[0].n_out;
}

static int tok_same(const lily_token *x, const lily_token *y) {
    if (x->id != y->id || x->n_top != y->n_top || !(fabs(x->logprob - y->logprob) <= 1e-5)) return 0;
    for (int j = 0; j < x->n_top; j++)
        if (x->top_ids[j] != y->top_ids[j] || !(fabs(x->top_logprobs[j] - y->top_logprobs[j]) <= 1e-5)) return 0;
    return 1;
}

/* Loop rows a against reference rows b: tokens, rng, counts, session tokens and logits. */
static void compare(const char *what, row *a, row *b, int n, int V) {
    for (int i = 0; i < n; i++) {
        int ok = a[i].n == b[i].n;
        for (int k = 0; ok && k < a[i].n; k++) ok = tok_same(&a[i].t[k], &b[i].t[k]);
        if (!ok) {
            fprintf(stderr, "  row %d loop:", i);
            for (int k = 0; k < a[i].n; k++) fprintf(stderr, " %d", a[i].t[k].id);
            fprintf(stderr, "\n  row %d rounds:", i);
            for (int k = 0; k < b[i].n; k++) fprintf(stderr, " %d", b[i].t[k].id);
            fputc('\n', stderr);
        }
        CHECK(ok, "%s: row %d's %d tokens (and top lists) = the host rounds' %d", what, i, a[i].n, b[i].n);
        CHECK(a[i].rng.s[0] == b[i].rng.s[0] && a[i].rng.s[1] == b[i].rng.s[1], "%s: row %d's rng as the rounds'", what, i);
        CHECK(!memcmp(a[i].counts, b[i].counts, (size_t)V * sizeof *a[i].counts), "%s: row %d's counts as the rounds'", what, i);
        int la = lily_session_len(a[i].s), lb = lily_session_len(b[i].s);
        CHECK(la == lb && !memcmp(lily_session_tokens(a[i].s), lily_session_tokens(b[i].s), (size_t)la * sizeof(int32_t)),
              "%s: row %d's session holds the rounds' %d tokens (%d)", what, i, lb, la);
        const float *ga = lily_session_logits(a[i].s), *gb = lily_session_logits(b[i].s);
        CHECK(ga && gb && !memcmp(ga, gb, (size_t)V * sizeof *ga), "%s: row %d's logits bit for bit the rounds'", what, i);
    }
}

int main(void) {
    uint64_t seed = t_seed("test_batch_gen");
    lily_rng rng;
    lily_rng_seed(&rng, seed);
    lily_model_info info;
    lily_model *m = t_open_tiny("test_batch_gen", 2 * NR, &info);
    if (!m) { printf("0 passed, 1 failed\n"); return 1; }
    const int cuda = !strcmp(info.backend, "cuda");
    const int V = info.vocab_size;

    row a[NR], b[NR];
    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    int32_t bias_ids[2] = { (int32_t)(lily_rng_u64(&rng) % (uint64_t)V), (int32_t)(lily_rng_u64(&rng) % (uint64_t)V) };
    float bias_vals[2] = { 3.0f, -1e30f };
    for (int i = 0; i < NR; i++) {
        lily_sampling *p = &a[i].p;
        lily_sampling_default(p);
        p->temperature = 0;
        if (i == 1) {
            p->temperature = 1.3f; p->top_k = 60; p->top_p = 0.97f; p->min_p = 0.01f;
            p->presence_penalty = 0.4f; p->frequency_penalty = 0.2f; p->repetition_penalty = 1.15f;
            p->n_logprobs = 5; p->n_bias = 2; p->bias_ids = bias_ids; p->bias_values = bias_vals;
        }
        if (i == 2) p->temperature = 0.8f;
        if (i == 3) p->n_logprobs = 3;
        if (i == 4) { p->temperature = 0.9f; p->top_k = 1; } /* greedy by top-k: no uniform drawn, host or device */
        p->seed = lily_rng_u64(&rng);
        b[i].p = *p;
        a[i].counts = calloc((size_t)V, sizeof(int32_t)); b[i].counts = calloc((size_t)V, sizeof(int32_t));
        a[i].pm = calloc((size_t)V, 1); b[i].pm = calloc((size_t)V, 1);
        if (!a[i].counts || !b[i].counts || !a[i].pm || !b[i].pm) { printf("0 passed, 1 failed\n"); return 1; }
    }
    const int plen[NR] = { 40, 23, 57, 31, 12 };
    int32_t *prompts[NR];
    for (int i = 0; i < NR; i++) {
        prompts[i] = malloc((size_t)plen[i] * sizeof(int32_t));
        for (int k = 0; k < plen[i]; k++) prompts[i][k] = (int32_t)(lily_rng_u64(&rng) % (uint64_t)V);
    }

    rows_start(m, a, NR, prompts, plen, V);
    int32_t first[NR];
    host_draw(a, NR, V, first);
    int fed = 0;
    lily_code rc;
    int got = piece(a, NR, first, 4, -1, 0, &fed, &rc);
    if (!cuda) {
        CHECK(rc == LILY_EUNSUPPORTED && got == 0 && fed == 0, "a CPU session: LILY_EUNSUPPORTED (%d), nothing run", (int)rc);
        int untouched = 1;
        for (int i = 0; i < NR; i++) untouched &= lily_session_len(a[i].s) == plen[i] && a[i].n == 1;
        CHECK(untouched, "a CPU session: no token fed or reported");
    } else {
        /* piece 1: ended by max_steps, the last token unfed */
        CHECK(rc == LILY_OK && got == 4 && fed == 4, "max_steps 4: 4 steps reported, 4 fed (got %d, %d, rc %d)", got, fed, (int)rc);
        for (int i = 0; i < NR; i++) first[i] = a[i].t[a[i].n - 1].id;
        /* piece 2: those fed first, stopped by row 2's callback at its third token of the piece */
        got = piece(a, NR, first, 100, 2, 3, &fed, &rc);
        CHECK(rc == LILY_OK && got == 3 && fed == 4, "a callback stop: 3 steps reported, 4 fed (got %d, %d, rc %d)", got, fed, (int)rc);
        /* two host rounds from the logits the loop left, then the rest in a loop */
        rounds(a, NR, V, 2, 0);
        host_draw(a, NR, V, first);
        int left = STEPS - a[0].n;
        got = piece(a, NR, first, left, -1, 0, &fed, &rc);
        CHECK(rc == LILY_OK && got == left && fed == left, "the rest: %d steps (got %d, fed %d)", left, got, fed);

        rows_start(m, b, NR, prompts, plen, V);
        rounds(b, NR, V, STEPS, 1);
        compare("in pieces", a, b, NR, V);
        rows_end(b, NR);

        /* a row 6 tokens short of the context bounds the loop: 6 steps, the session full */
        rows_end(a, NR);
        int32_t *lp = malloc(250 * sizeof(int32_t));
        for (int k = 0; k < 250; k++) lp[k] = (int32_t)(lily_rng_u64(&rng) % (uint64_t)V);
        int32_t *fp[2] = { prompts[1], lp };
        const int fl[2] = { plen[1], 250 };
        a[1].p = a[0].p; b[1].p = b[0].p;
        rows_start(m, a, 2, fp, fl, V);
        host_draw(a, 2, V, first);
        got = piece(a, 2, first, 100, -1, 0, &fed, &rc);
        CHECK(rc == LILY_OK && got == 6 && fed == 6 && lily_session_len(a[1].s) == 256,
              "the context's end: 6 steps, the session full (got %d, fed %d, %d tokens)", got, fed, lily_session_len(a[1].s));
        rows_start(m, b, 2, fp, fl, V);
        rounds(b, 2, V, 7, 1);
        compare("to the context's end", a, b, 2, V);
        rows_end(b, 2);
        free(lp);
    }
    rows_end(a, NR);
    for (int i = 0; i < NR; i++) { free(a[i].counts); free(b[i].counts); free(a[i].pm); free(b[i].pm); free(prompts[i]); }
    lily_model_free(m);
    return T_DONE();
}
