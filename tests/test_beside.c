/* The same prompt decoded alone, and again while other sessions of the same model prefill
 * and decode in between its steps, must give the same tokens, run after run: sessions share
 * the model's weights and the backend's code, never each other's state or scratch. Greedy
 * through lily_session_generate (on the GPU: the CUDA-graph decode loop) and step by step
 * (feed + sample). LILY_TEST_BACKEND=cuda runs it on the CUDA backend (it_cuda_emu.sh on the
 * emulator; tests/cuda/run_device.sh on a GPU). */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "lily.h"
#include "t.h"
#include "t_model.h"
#include "util/util.h"

enum { PROMPT = 70, STEPS = 10 };

typedef struct { int32_t ids[STEPS]; int n; } run_toks;

static int collect(void *user, const lily_token *t) {
    run_toks *r = user;
    if (r->n < STEPS) r->ids[r->n++] = t->id;
    return 0;
}

/* other work on session o: a prefill of fresh tokens, then a few single-token feeds */
static void disturb(lily_session *o, lily_rng *rng, int vocab, lily_status *st) {
    int32_t ids[90];
    int n = 8 + (int)(lily_rng_u64(rng) % 40);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(lily_rng_u64(rng) % (uint64_t)vocab);
    CHECK(lily_session_prefill(o, ids, n, NULL, st) == LILY_OK, "other prefill: %s", st->msg);
    for (int i = 0; i < 3; i++) CHECK(lily_session_feed(o, ids + i, 1, NULL, st) == LILY_OK, "other feed: %s", st->msg);
}

int main(void) {
    uint64_t seed = t_seed("test_beside");
    lily_rng rng;
    lily_rng_seed(&rng, seed);
    lily_model_info info;
    lily_model *m = t_open_tiny("test_beside", 3, &info);
    if (!m) { printf("0 passed, 1 failed\n"); return 1; }
    lily_status st = { 0 };
    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++) prompt[i] = (int32_t)(lily_rng_u64(&rng) % (uint64_t)info.vocab_size);
    lily_sampling p;
    lily_sampling_default(&p);
    p.temperature = 0;

    lily_session *a, *b, *c;
    CHECK(lily_session_new(m, &a, &st) == LILY_OK && lily_session_new(m, &b, &st) == LILY_OK &&
              lily_session_new(m, &c, &st) == LILY_OK, "sessions: %s", st.msg);
    /* alone: the generation loop */
    run_toks alone = { { 0 }, 0 };
    CHECK(lily_session_prefill(a, prompt, PROMPT, NULL, &st) == LILY_OK, "prefill: %s", st.msg);
    CHECK(lily_session_generate(a, &p, STEPS, collect, &alone, NULL, &st) == LILY_OK, "generate: %s", st.msg);
    int reps = strcmp(info.backend, "cuda") ? 3 : 1; /* emulated CUDA is slow */
    for (int rep = 0; rep < reps; rep++) {
        /* beside other work: b and c prefill and decode between every step of a */
        lily_session_reset(a);
        disturb(b, &rng, info.vocab_size, &st);
        CHECK(lily_session_prefill(a, prompt, PROMPT, NULL, &st) == LILY_OK, "prefill beside: %s", st.msg);
        run_toks beside = { { 0 }, 0 };
        for (int i = 0; i < STEPS; i++) {
            disturb(i % 2 ? b : c, &rng, info.vocab_size, &st);
            lily_token t;
            CHECK(lily_session_sample(a, &p, &t, &st) == LILY_OK, "sample: %s", st.msg);
            beside.ids[beside.n++] = t.id;
            if (lily_model_is_eos(m, t.id)) break;
            CHECK(lily_session_feed(a, &t.id, 1, NULL, &st) == LILY_OK, "feed: %s", st.msg);
        }
        int n = alone.n < beside.n ? alone.n : beside.n;
        CHECK(n > 0 && !memcmp(alone.ids, beside.ids, sizeof(int32_t) * (size_t)n), "rep %d: the same %d tokens beside other work",
              rep, n);
        /* and the generation loop again, with the other sessions' state in between */
        lily_session_reset(a);
        disturb(c, &rng, info.vocab_size, &st);
        run_toks again = { { 0 }, 0 };
        CHECK(lily_session_prefill(a, prompt, PROMPT, NULL, &st) == LILY_OK, "prefill again: %s", st.msg);
        CHECK(lily_session_generate(a, &p, STEPS, collect, &again, NULL, &st) == LILY_OK, "generate again: %s", st.msg);
        CHECK(again.n == alone.n && !memcmp(alone.ids, again.ids, sizeof(int32_t) * (size_t)alone.n),
              "rep %d: the generation loop repeats its %d tokens", rep, alone.n);
    }
    lily_session_free(a);
    lily_session_free(b);
    lily_session_free(c);
    lily_model_free(m);
    return T_DONE();
}
