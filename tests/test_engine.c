/* The engine on random-weight checkpoints written by synth: feeding in one chunk, in
 * pieces or token by token gives the same logits; prefix reuse (extension, rollback to a
 * snapshot, unrelated prompt) gives exactly what a fresh session computes; bad requests
 * are refused cleanly. */
#include "t.h"
#include "lily.h"
#include "loader/synth.h"
#include "util/util.h"
#include <string.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double rel(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) { double d = (double)a[i] - b[i]; num += d * d; den += (double)b[i] * b[i]; }
    return sqrt(num / (den + 1e-30));
}

static void test_model(const char *dir, lily_rng *r) {
    lily_status st = { 0 };
    lily_model_opts o;
    lily_model_opts_default(&o);
    o.max_ctx = 400;
    o.n_threads = 2;
    lily_model *m = NULL;
    CHECK(lily_model_open(dir, &o, &m, &st) == LILY_OK, "open %s: %s", dir, st.msg);
    if (!m) return;
    lily_model_info info;
    lily_model_get_info(m, &info);
    int V = info.vocab_size, N = 150;
    int32_t *ids = malloc((size_t)N * sizeof *ids);
    for (int i = 0; i < N; i++) ids[i] = (int32_t)(lily_rng_u64(r) % (uint64_t)V);
    float *a = malloc((size_t)N * V * 4), *b = malloc((size_t)N * V * 4);
    lily_session *s1, *s2;
    CHECK(lily_session_new(m, &s1, &st) == LILY_OK, "session: %s", st.msg);
    CHECK(lily_session_new(m, &s2, &st) == LILY_OK, "session: %s", st.msg);
    /* one chunk vs pieces (70 + 1 + 79) vs token by token */
    CHECK(lily_session_feed(s1, ids, N, a, &st) == LILY_OK, "feed: %s", st.msg);
    CHECK(lily_session_feed(s2, ids, 70, b, &st) == LILY_OK, "feed: %s", st.msg);
    CHECK(lily_session_feed(s2, ids + 70, 1, b + (size_t)70 * V, &st) == LILY_OK, "feed: %s", st.msg);
    CHECK(lily_session_feed(s2, ids + 71, N - 71, b + (size_t)71 * V, &st) == LILY_OK, "feed: %s", st.msg);
    double e = rel(b, a, (size_t)N * V);
    CHECK(e < 1e-4, "%s: chunked pieces vs one chunk rel err %.3e", dir, e);
    lily_session_reset(s2);
    for (int i = 0; i < N; i++) lily_session_feed(s2, ids + i, 1, b + (size_t)i * V, &st);
    e = rel(b, a, (size_t)N * V);
    CHECK(e < 1e-4, "%s: token by token vs one chunk rel err %.3e", dir, e);
    CHECK(lily_session_len(s2) == N, "len %d", lily_session_len(s2));
    /* prefix reuse: A, then A+B (extension), then A+C (rollback to the snapshot at A) */
    int A = 60, reused = -1;
    float *ref = malloc((size_t)V * 4);
    int32_t *ac = malloc((size_t)N * sizeof *ac);
    memcpy(ac, ids, (size_t)N * sizeof *ac);
    for (int i = A; i < 100; i++) ac[i] = (ids[i] + 1 + (int32_t)(lily_rng_u64(r) % 7)) % V;
    lily_session_reset(s2);
    CHECK(lily_session_prefill(s2, ids, A, &reused, &st) == LILY_OK && reused == 0, "prefill A: reused %d %s", reused, st.msg);
    CHECK(lily_session_prefill(s2, ids, 100, &reused, &st) == LILY_OK && reused == A, "prefill A+B: reused %d", reused);
    e = rel(lily_session_logits(s2), a + (size_t)99 * V, (size_t)V);
    CHECK(e < 1e-4, "extension logits rel err %.3e", e);
    CHECK(lily_session_prefill(s2, ac, 100, &reused, &st) == LILY_OK && reused == A, "prefill A+C: reused %d (want %d)", reused, A);
    lily_session_reset(s1);
    lily_session_feed(s1, ac, 100, NULL, &st);
    memcpy(ref, lily_session_logits(s1), (size_t)V * 4);
    e = rel(lily_session_logits(s2), ref, (size_t)V);
    CHECK(e < 1e-4, "rollback logits rel err %.3e", e);
    /* the same prompt again: nothing new, still the right logits */
    CHECK(lily_session_prefill(s2, ac, 100, &reused, &st) == LILY_OK && reused == 100, "same prompt: reused %d (want all 100)", reused);
    e = rel(lily_session_logits(s2), ref, (size_t)V);
    CHECK(e < 1e-4, "same-prompt logits rel err %.3e", e);
    /* and again after generating from it (a regenerated answer): the end snapshot kept the
     * logits and state, so nothing is recomputed and the greedy answer repeats */
    {
        lily_sampling g; lily_sampling_default(&g);
        int32_t first[8]; int n1 = 0, n2 = 0;
        CHECK(lily_session_generate(s2, &g, 8, NULL, NULL, &n1, &st) == LILY_OK, "generate: %s", st.msg);
        memcpy(first, lily_session_tokens(s2) + 100, sizeof first);
        CHECK(lily_session_prefill(s2, ac, 100, &reused, &st) == LILY_OK && reused == 100, "regenerate: reused %d (want 100)", reused);
        e = rel(lily_session_logits(s2), ref, (size_t)V);
        CHECK(e < 1e-4, "regenerate: logits rel err %.3e", e);
        CHECK(lily_session_generate(s2, &g, 8, NULL, NULL, &n2, &st) == LILY_OK && n1 == n2 &&
              !memcmp(first, lily_session_tokens(s2) + 100, (size_t)(n1 > 1 ? n1 - 1 : 0) * sizeof *first),
              "regenerated greedy answer differs");
    }
    /* a snapshot of other tokens at a shorter position must not be used: A+C's snapshot
     * at 100 exists; ids[0..99] shares only A with it */
    CHECK(lily_session_prefill(s2, ids, 100, &reused, &st) == LILY_OK && reused == A, "back to A+B: reused %d", reused);
    e = rel(lily_session_logits(s2), a + (size_t)99 * V, (size_t)V);
    CHECK(e < 1e-4, "A+B after A+C logits rel err %.3e", e);
    /* a mark inside the prompt: a later prompt diverging just after it resumes there */
    int mk = 80;
    CHECK(lily_session_prefill_ex(s2, ids, 100, &mk, 1, 1, &reused, &st) == LILY_OK, "prefill_ex: %s", st.msg);
    int32_t *am = malloc((size_t)N * sizeof *am);
    memcpy(am, ids, (size_t)N * sizeof *am);
    for (int i = mk; i < 110; i++) am[i] = (ids[i] + 3) % V;
    CHECK(lily_session_prefill(s2, am, 110, &reused, &st) == LILY_OK && reused == mk, "resume at mark: reused %d (want %d)", reused, mk);
    lily_session_reset(s1);
    lily_session_feed(s1, am, 110, NULL, &st);
    e = rel(lily_session_logits(s2), lily_session_logits(s1), (size_t)V);
    CHECK(e < 1e-4, "resume-at-mark logits rel err %.3e", e);
    free(am);
    /* unrelated prompt: from scratch */
    int32_t other[5] = { 1, 2, 3, 4, 5 };
    if (ac[0] == 1) other[0] = 2;
    CHECK(lily_session_prefill(s2, other, 5, &reused, &st) == LILY_OK && reused == 0, "unrelated: reused %d", reused);
    /* errors */
    int32_t bad = V;
    CHECK(lily_session_feed(s2, &bad, 1, NULL, &st) == LILY_EINVAL, "token id outside vocab accepted");
    lily_session_reset(s1);
    CHECK(lily_session_feed(s1, ids, N, NULL, &st) == LILY_OK, "feed");
    CHECK(lily_session_feed(s1, ids, N, NULL, &st) == LILY_OK, "feed");
    CHECK(lily_session_feed(s1, ids, N, NULL, &st) == LILY_ERANGE, "context overflow not refused (%s)", st.msg);
    CHECK(lily_session_prefill(s1, ids, 0, NULL, &st) == LILY_EINVAL, "empty prompt accepted");
    /* greedy generation is deterministic; sampling with a seed is reproducible */
    lily_sampling p;
    lily_sampling_default(&p);
    for (int rep = 0; rep < 2; rep++) {
        p.temperature = rep ? 0.9f : 0.0f;
        p.seed = 1234;
        int n1 = 0, n2 = 0;
        CHECK(lily_session_prefill(s1, ids, 40, NULL, &st) == LILY_OK, "prefill");
        CHECK(lily_session_generate(s1, &p, 12, NULL, NULL, &n1, &st) == LILY_OK, "generate: %s", st.msg);
        int32_t toks1[12]; memcpy(toks1, lily_session_tokens(s1) + 40, (size_t)(n1 > 1 ? n1 - 1 : 0) * 4);
        CHECK(lily_session_prefill(s2, ids, 40, NULL, &st) == LILY_OK, "prefill");
        CHECK(lily_session_generate(s2, &p, 12, NULL, NULL, &n2, &st) == LILY_OK, "generate: %s", st.msg);
        CHECK(n1 == n2 && !memcmp(toks1, lily_session_tokens(s2) + 40, (size_t)(n1 > 1 ? n1 - 1 : 0) * 4),
              "generation not reproducible (temperature %g): n %d %d", p.temperature, n1, n2);
    }
    /* batched decode: three sessions at different positions, one pass, equal to separate feeds */
    {
        lily_session *bs[3], *solo;
        int lens[3] = { 5, 37, 90 };
        CHECK(lily_session_new(m, &solo, &st) == LILY_OK, "session");
        for (int i = 0; i < 3; i++) {
            CHECK(lily_session_new(m, &bs[i], &st) == LILY_OK, "session");
            lily_session_feed(bs[i], ids + i, lens[i], NULL, &st);
        }
        for (int step = 0; step < 4; step++) {
            int32_t nx[3];
            for (int i = 0; i < 3; i++) nx[i] = (ids[i * 7 + step] + step) % V;
            CHECK(lily_decode_batch(bs, nx, 3, &st) == LILY_OK, "decode batch: %s", st.msg);
            for (int i = 0; i < 3; i++) {
                lily_session_reset(solo);
                lily_session_feed(solo, lily_session_tokens(bs[i]), lily_session_len(bs[i]), NULL, &st);
                double eb = rel(lily_session_logits(bs[i]), lily_session_logits(solo), (size_t)V);
                CHECK(eb < 1e-4, "%s: batch row %d step %d rel err %.3e", dir, i, step, eb);
            }
        }
        lily_session *dup[2] = { bs[0], bs[0] };
        int32_t two[2] = { 1, 2 };
        CHECK(lily_decode_batch(dup, two, 2, &st) == LILY_EINVAL, "a session twice in a batch accepted");
        for (int i = 0; i < 3; i++) lily_session_free(bs[i]);
        lily_session_free(solo);
    }
    free(ids); free(a); free(b); free(ref); free(ac);
    lily_session_free(s1);
    lily_session_free(s2);
    lily_model_free(m);
}

static void synth(const char *dir, const char *preset, int mlx4, int hidden, int experts, int topk, int kv) {
    synth_opts o;
    memset(&o, 0, sizeof o);
    lily_status st;
    synth_preset(preset, &o.cfg, &st);
    if (hidden) o.cfg.hidden = hidden;
    if (experts) { o.cfg.n_experts = experts; o.cfg.top_k = topk; }
    if (kv) o.cfg.n_kv_heads = kv;
    o.mlx4 = mlx4;
    o.seed = 42;
    o.eos[0] = 300; o.eos[1] = 301;
    CHECK(synth_write(dir, &o, &st) == LILY_OK, "synth %s: %s", dir, st.msg);
}

int main(void) {
    char tmp[] = "/tmp/lily-test-engine-XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    lily_rng r;
    lily_rng_seed(&r, t_seed("test_engine"));
    char d[4][512];
    snprintf(d[0], 512, "%s/hf", tmp); synth(d[0], "tiny", 0, 0, 0, 0, 0);
    snprintf(d[1], 512, "%s/mlx", tmp); synth(d[1], "tiny", 1, 0, 0, 0, 0);
    snprintf(d[2], 512, "%s/odd", tmp); synth(d[2], "tiny", 1, 192, 6, 3, 4); /* other hidden, experts, top-k, GQA */
    snprintf(d[3], 512, "%s/odd-hf", tmp); synth(d[3], "tiny", 0, 64, 5, 5, 1);
    for (int i = 0; i < 4; i++) {
        /* Chunking changes float rounding by ~1e-7; a router whose k-th and (k+1)-th experts are
         * closer than that (seen once in ~100 runs, gap 1.2e-6) picks differently, and that
         * token's logits differ by ~1e-2. Such inputs get one fresh draw, which decides. */
        int pass0 = t_pass;
        t_soft = 1; t_soft_fail = 0;
        test_model(d[i], &r);
        t_soft = 0;
        if (t_soft_fail) {
            fprintf(stderr, "%s: %d checks missed on the first inputs; running again on fresh ones\n", d[i], t_soft_fail);
            t_pass = pass0;
            test_model(d[i], &r);
        }
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    CHECK(system(cmd) == 0, "cleanup");
    return T_DONE();
}
