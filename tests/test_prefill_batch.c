/* lily_prefill_batch (the server's arrivals prefilled together) against lily_session_prefill_ex
 * one job at a time on twin sessions: every job must end with the same result code, reused count,
 * tokens and logits, bit for bit, and its state must be the same (the next fed token's logits equal)
 * with the same snapshots (a follow-up that diverges after a mark resumes there in both). Jobs: fresh
 * prompts of different lengths (one with a mark), a pure extension of what the session holds, the
 * same prompt again (restored whole, nothing fed), a token id outside the vocabulary (an error: the
 * session reset in both), a prompt longer than the context (refused: the session kept in both).
 * On the CUDA backend (LILY_TEST_BACKEND=cuda) the passes run side by side on the sessions' streams
 * (lcuda_forward_begin / _wait); on the CPU one after the other. Prompts are fresh random tokens. */
#include <stdlib.h>
#include <string.h>
#include "lily.h"
#include "t.h"
#include "t_model.h"
#include "util/util.h"

enum { NJ = 7, MAXP = 120 };

typedef struct {
    int32_t ids[MAXP + 300];
    int n, pre, mark; /* pre: tokens of ids the session holds before (0: fresh); mark: 0 or a mark */
} job_def;

static void fill(lily_rng *r, int32_t *ids, int n, int vocab) {
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(lily_rng_u64(r) % (uint64_t)vocab);
}

/* the session as job d wants it before the prefill: holding d's first `pre` tokens (with the end snapshot) */
static void setup(lily_session *s, const job_def *d, lily_status *st) {
    lily_session_reset(s);
    if (d->pre) CHECK(lily_session_prefill(s, d->ids, d->pre, NULL, st) == LILY_OK, "setup prefill: %s", st->msg);
}

int main(void) {
    uint64_t seed = t_seed("test_prefill_batch");
    lily_rng rng;
    lily_rng_seed(&rng, seed);
    lily_model_info info;
    lily_model *m = t_open_tiny("test_prefill_batch", 2 * NJ, &info);
    if (!m) { printf("0 passed, 1 failed\n"); return 1; }
    const int V = info.vocab_size;
    lily_status st = { 0 };
    job_def d[NJ];
    memset(d, 0, sizeof d);
    d[0].n = 9 + (int)(lily_rng_u64(&rng) % 60);       /* fresh */
    d[1].n = 20 + (int)(lily_rng_u64(&rng) % 40);      /* fresh, a mark inside */
    d[1].mark = 5 + (int)(lily_rng_u64(&rng) % 10);
    d[2].pre = 10 + (int)(lily_rng_u64(&rng) % 30);    /* extends what the session holds */
    d[2].n = d[2].pre + 1 + (int)(lily_rng_u64(&rng) % 20);
    d[3].pre = d[3].n = 15;                            /* the same prompt again: restored, nothing fed */
    d[4].n = 1 + (int)(lily_rng_u64(&rng) % 8);        /* a few tokens */
    d[5].n = 12;                                       /* an id outside the vocabulary: an error */
    d[6].n = 300;                                      /* past the fixture's context of 256: refused */
    d[6].pre = 7;
    for (int i = 0; i < NJ; i++) fill(&rng, d[i].ids, d[i].n, V);
    d[5].ids[7] = V + 3;

    lily_session *a[NJ], *b[NJ]; /* a: the batch, b: one by one */
    for (int i = 0; i < NJ; i++)
        CHECK(lily_session_new(m, &a[i], &st) == LILY_OK && lily_session_new(m, &b[i], &st) == LILY_OK, "sessions: %s", st.msg);
    lily_prefill_job jobs[NJ];
    for (int i = 0; i < NJ; i++) {
        setup(a[i], &d[i], &st);
        setup(b[i], &d[i], &st);
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i] = (lily_prefill_job){ .s = a[i], .ids = d[i].ids, .n = d[i].n, .marks = &d[i].mark, .n_marks = d[i].mark ? 1 : 0,
                                      .snapshot_end = 1 };
    }
    CHECK(lily_prefill_batch(jobs, NJ, &st) == LILY_OK, "batch: %s", st.msg);
    float *lb = malloc((size_t)V * sizeof *lb);
    for (int i = 0; i < NJ; i++) {
        int reused = -1;
        lily_status sb = { 0 };
        lily_code rc = lily_session_prefill_ex(b[i], d[i].ids, d[i].n, &d[i].mark, d[i].mark ? 1 : 0, 1, &reused, &sb);
        CHECK(jobs[i].rc == rc, "job %d: rc %d in the batch, %d alone (%s / %s)", i, jobs[i].rc, rc, jobs[i].st.msg, sb.msg);
        if (rc) {
            CHECK(!strcmp(jobs[i].st.msg, sb.msg), "job %d: the same error: '%s' vs '%s'", i, jobs[i].st.msg, sb.msg);
            CHECK(lily_session_len(a[i]) == lily_session_len(b[i]), "job %d: after its error the session holds %d tokens, %d alone", i,
                  lily_session_len(a[i]), lily_session_len(b[i]));
            continue;
        }
        CHECK(jobs[i].reused == reused, "job %d: reused %d in the batch, %d alone", i, jobs[i].reused, reused);
        CHECK(lily_session_len(a[i]) == d[i].n && lily_session_len(b[i]) == d[i].n, "job %d: %d and %d tokens, want %d", i,
              lily_session_len(a[i]), lily_session_len(b[i]), d[i].n);
        CHECK(!memcmp(lily_session_tokens(a[i]), d[i].ids, (size_t)d[i].n * sizeof(int32_t)), "job %d: tokens", i);
        const float *la = lily_session_logits(a[i]), *lo = lily_session_logits(b[i]);
        CHECK(la && lo && !memcmp(la, lo, (size_t)V * sizeof *la), "job %d: logits differ from the prefill alone", i);
        /* the states: one more token's logits */
        int32_t nx = (int32_t)(lily_rng_u64(&rng) % (uint64_t)V);
        CHECK(lily_session_feed(a[i], &nx, 1, NULL, &st) == LILY_OK, "job %d: feed: %s", i, st.msg);
        CHECK(lily_session_feed(b[i], &nx, 1, lb, &st) == LILY_OK, "job %d: feed: %s", i, st.msg);
        CHECK(!memcmp(lily_session_logits(a[i]), lb, (size_t)V * sizeof *lb), "job %d: the next token's logits differ", i);
        if (d[i].mark) { /* the snapshot at the mark: a prompt diverging after it resumes there in both */
            int32_t f[MAXP];
            memcpy(f, d[i].ids, (size_t)d[i].mark * sizeof *f);
            fill(&rng, f + d[i].mark, 6, V);
            int ra = -1, rb = -1;
            CHECK(lily_session_prefill(a[i], f, d[i].mark + 6, &ra, &st) == LILY_OK &&
                      lily_session_prefill(b[i], f, d[i].mark + 6, &rb, &st) == LILY_OK, "job %d: follow-up: %s", i, st.msg);
            CHECK(ra == d[i].mark && rb == d[i].mark, "job %d: the follow-up resumed at %d and %d, want the mark %d", i, ra, rb, d[i].mark);
            CHECK(!memcmp(lily_session_logits(a[i]), lily_session_logits(b[i]), (size_t)V * sizeof *lb), "job %d: follow-up logits", i);
        }
    }
    CHECK(jobs[3].reused == d[3].n, "the same prompt again: reused %d of %d", jobs[3].reused, d[3].n);
    CHECK(jobs[5].rc == LILY_EINVAL && jobs[6].rc == LILY_ERANGE, "the bad jobs: %d %d", jobs[5].rc, jobs[6].rc);
    CHECK(lily_session_len(a[6]) == d[6].pre, "a refused prompt leaves its session as it was (%d tokens)", lily_session_len(a[6]));
    /* a bad batch runs nothing */
    lily_prefill_job two[2] = { jobs[0], jobs[0] };
    CHECK(lily_prefill_batch(two, 2, &st) == LILY_EINVAL, "a session twice in one batch is refused");
    CHECK(lily_prefill_batch(two, 0, &st) == LILY_EINVAL, "an empty batch is refused");
    free(lb);
    for (int i = 0; i < NJ; i++) { lily_session_free(a[i]); lily_session_free(b[i]); }
    lily_model_free(m);
    return T_DONE();
}
