/* Parked conversations: a conversation parked, its session used for other work, then
 * unparked (into the same or another session) must continue exactly as if it had never
 * left: the same logits, bit for bit, as a session that computed everything itself, and
 * its snapshots must still let a diverging follow-up turn resume mid-way.
 * LILY_TEST_BACKEND=cuda runs it on the CUDA backend (tests/it_cuda_emu.sh, on the emulator):
 * the state then goes to the host and back through the device copies, and, with the GPU tier
 * on (lily_model_set_park_gpu), stays on the device; there a conversation parked on the GPU is
 * unparked once from there and once after lily_parked_to_host, and once after a round trip
 * through a file, each exact; the tier's budget sends a conversation to the host when full. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "lily.h"
#include "t.h"
#include "t_model.h"
#include "util/util.h"

static lily_rng rng;

static void rand_ids(int32_t *x, int n, int vocab) {
    for (int i = 0; i < n; i++) x[i] = (int32_t)(lily_rng_u64(&rng) % (uint64_t)vocab);
}

int main(void) {
    uint64_t seed = t_seed("test_park");
    lily_rng_seed(&rng, seed);
    lily_model_info info;
    lily_model *m = t_open_tiny("test_park", 3, &info);
    if (!m) { printf("0 passed, 1 failed\n"); return 1; }
    lily_status st = { 0 };
    const int cuda = !strcmp(info.backend, "cuda");
    const int V = info.vocab_size, reps = 4; /* on CUDA: two with each tier */
    uint64_t budget = 1;
    CHECK(lily_model_set_park_gpu(m, cuda ? -1 : 1, &budget, &st) == (cuda ? LILY_OK : LILY_EUNSUPPORTED) &&
              (cuda ? budget > 0 : budget == 0),
          "the GPU tier: on for CUDA (%llu bytes), refused on the CPU", (unsigned long long)budget);
    if (cuda) lily_model_set_park_gpu(m, 0, NULL, &st);
    size_t row = sizeof(float) * (size_t)V;
    float *want = malloc(row);
    lily_session *a, *b, *ref;
    CHECK(lily_session_new(m, &a, &st) == LILY_OK && lily_session_new(m, &b, &st) == LILY_OK &&
              lily_session_new(m, &ref, &st) == LILY_OK, "sessions");

    for (int rep = 0; rep < reps; rep++) {
        const int gpu = cuda && rep >= 2;
        if (gpu) lily_model_set_park_gpu(m, -1, NULL, &st);
        /* conversation: turn 1 = [0, mark) + [mark, n1), answer fed after it; turn 2 extends it */
        int n1 = 20 + (int)(lily_rng_u64(&rng) % 60), mark = 5 + (int)(lily_rng_u64(&rng) % 10), gen = 7, n2 = 30;
        int32_t conv[256], other[120];
        rand_ids(conv, n1 + gen + n2, V);
        rand_ids(other, 120, V);
        int reused = -1;
        CHECK(lily_session_prefill_ex(a, conv, n1, &mark, 1, 1, &reused, &st) == LILY_OK, "turn 1: %s", st.msg);
        CHECK(lily_session_feed(a, conv + n1, gen, NULL, &st) == LILY_OK, "answer");
        lily_parked *p = NULL;
        CHECK(lily_session_park(a, &p, &st) == LILY_OK && p, "park: %s", st.msg);
        if (!p) break;
        CHECK(lily_parked_on_gpu(p) == gpu, "parked on the %s", gpu ? "GPU" : "host");
        int pn = 0;
        const int32_t *pt = lily_parked_tokens(p, &pn);
        CHECK(pn == n1 + gen && !memcmp(pt, conv, sizeof(int32_t) * (size_t)pn), "parked tokens");
        CHECK(lily_parked_snapshot(p, 0) > 0, "a snapshot on the path was kept (%d)", lily_parked_snapshot(p, 0));
        CHECK(lily_parked_bytes(p) > (size_t)pn * 4, "size reported (%zu)", lily_parked_bytes(p));
        /* the session serves someone else, then the conversation comes back somewhere */
        CHECK(lily_session_prefill(a, other, 100, &reused, &st) == LILY_OK, "other work");
        lily_session *into = rep % 2 ? b : a;
        CHECK(lily_session_unpark(into, p, &st) == LILY_OK, "unpark: %s", st.msg);
        CHECK(lily_session_len(into) == pn && lily_session_logits(into) == NULL, "unparked: length, no stale logits");
        /* turn 2 extends the parked tokens: only the new part is computed */
        CHECK(lily_session_prefill(into, conv, pn + n2, &reused, &st) == LILY_OK && reused == pn,
              "turn 2 reuses all %d parked tokens (got %d)", pn, reused);
        /* the reference makes the same calls without parking (chunking changes the last bits) */
        lily_session_reset(ref);
        CHECK(lily_session_prefill_ex(ref, conv, n1, &mark, 1, 1, NULL, &st) == LILY_OK &&
                  lily_session_feed(ref, conv + n1, gen, NULL, &st) == LILY_OK &&
                  lily_session_prefill(ref, conv, pn + n2, &reused, &st) == LILY_OK && reused == pn, "reference");
        memcpy(want, lily_session_logits(ref), row);
        CHECK(!memcmp(lily_session_logits(into), want, row), "turn 2 logits equal a session that never parked");
        if (gpu && rep == 2) { /* the GPU tier's copy to the host (the server's move when the tier is full) */
            CHECK(lily_parked_to_host(p, &st) == LILY_OK && !lily_parked_on_gpu(p), "to the host: %s", st.msg);
        } else if (gpu) { /* saved from the GPU (through a host copy), loaded back on the host */
            char path[] = "/tmp/lily-test-park-XXXXXX";
            int fd = mkstemp(path);
            lily_parked *q = NULL;
            CHECK(fd >= 0 && lily_parked_save(p, m, path, &st) == LILY_OK && lily_parked_on_gpu(p) &&
                      lily_parked_load(m, path, &q, &st) == LILY_OK && q && !lily_parked_on_gpu(q),
                  "a GPU-tier conversation saved and loaded: %s", st.msg);
            if (fd >= 0) { close(fd); unlink(path); }
            if (q) { lily_parked_free(p); p = q; }
        }
        /* a follow-up that diverges after the mark resumes from the parked snapshot */
        lily_session *again = into == a ? b : a;
        CHECK(lily_session_unpark(again, p, &st) == LILY_OK, "unpark again");
        int32_t div[256];
        memcpy(div, conv, sizeof(int32_t) * (size_t)mark);
        rand_ids(div + mark, 12, V);
        CHECK(lily_session_prefill(again, div, mark + 12, &reused, &st) == LILY_OK && reused == mark,
              "diverging turn resumes at the snapshot %d (got %d)", mark, reused);
        lily_session_reset(ref);
        CHECK(lily_session_prefill_ex(ref, conv, n1, &mark, 1, 1, NULL, &st) == LILY_OK &&
                  lily_session_feed(ref, conv + n1, gen, NULL, &st) == LILY_OK &&
                  lily_session_prefill(ref, div, mark + 12, &reused, &st) == LILY_OK && reused == mark,
              "reference for the divergence");
        CHECK(!memcmp(lily_session_logits(again), lily_session_logits(ref), row), "diverging turn logits exact");
        lily_parked_free(p);
        lily_session_reset(a);
        lily_session_reset(b);
    }
    if (cuda) { /* the tier's budget: a conversation that does not fit goes to the host */
        int32_t ids[40];
        rand_ids(ids, 40, V);
        lily_parked *g = NULL, *h = NULL, *x = NULL;
        lily_session_reset(a);
        CHECK(lily_session_prefill(a, ids, 40, NULL, &st) == LILY_OK, "prefill");
        lily_model_set_park_gpu(m, -1, NULL, &st);
        CHECK(lily_session_park_to(a, LILY_PARK_GPU, &g, &st) == LILY_OK && lily_parked_on_gpu(g), "GPU park");
        lily_model_set_park_gpu(m, (int64_t)lily_parked_bytes(g), NULL, &st); /* room for g's device bytes and no more */
        CHECK(lily_session_park_to(a, LILY_PARK_GPU, &x, &st) == LILY_ENOMEM && !x, "a full GPU tier: LILY_ENOMEM (%s)", st.msg);
        CHECK(lily_session_park(a, &h, &st) == LILY_OK && h && !lily_parked_on_gpu(h), "a full GPU tier: parked on the host");
        lily_parked_free(g);
        g = NULL;
        CHECK(lily_session_park_to(a, LILY_PARK_GPU, &g, &st) == LILY_OK && lily_parked_on_gpu(g), "room again once freed");
        lily_model_set_park_gpu(m, 0, NULL, &st);
        lily_parked_free(x);
        CHECK(lily_session_park_to(a, LILY_PARK_GPU, &x, &st) == LILY_EUNSUPPORTED && !x, "the tier off: LILY_EUNSUPPORTED");
        lily_parked *hh = NULL;
        CHECK(lily_session_park_to(a, LILY_PARK_HOST, &hh, &st) == LILY_OK && hh && !lily_parked_on_gpu(hh), "host park");
        lily_parked_free(hh);
        lily_parked_free(g);
        lily_parked_free(h);
    } else {
        lily_parked *x = NULL;
        lily_session_reset(a);
        int32_t ids[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
        CHECK(lily_session_prefill(a, ids, 8, NULL, &st) == LILY_OK &&
                  lily_session_park_to(a, LILY_PARK_GPU, &x, &st) == LILY_EUNSUPPORTED && !x,
              "a CPU session: no GPU tier");
    }
    lily_session *empty;
    lily_parked *p = NULL;
    CHECK(lily_session_new(m, &empty, &st) == LILY_OK && lily_session_park(empty, &p, &st) == LILY_EINVAL && !p,
          "an empty session cannot be parked");
    lily_session_free(empty);
    free(want);
    lily_session_free(a);
    lily_session_free(b);
    lily_session_free(ref);
    lily_model_free(m);
    return T_DONE();
}
