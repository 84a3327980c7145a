/* Sampler: greedy, logprobs, distributions under temperature/top-k/top-p/min-p,
 * penalties, determinism, and agreement with a brute-force full-sort reference. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "engine/sampler.h"
#include "cpu/fast.h"
#include "t.h"

static lily_rng trng; /* test data; seeded from the clock, printed for replay */

static void rand_logits(float *x, int n, float scale) {
    for (int i = 0; i < n; i++) x[i] = lily_rng_normal(&trng) * scale;
}

/* Empirical frequencies of `draws` samples. */
static void freqs(const float *lg, int v, const lily_sampling *p, const int32_t *counts, uint64_t seed,
                  int draws, double *f) {
    lily_rng r;
    lily_rng_seed(&r, seed);
    memset(f, 0, sizeof *f * (size_t)v);
    for (int i = 0; i < draws; i++) {
        lily_token t;
        lily_code rc = lily_sample_logits(lg, v, p, &r, counts, &t, NULL);
        if (rc || t.id < 0 || t.id >= v) { f[0] = NAN; return; }
        f[t.id] += 1.0 / draws;
    }
}

/* Max deviation from expected, measured in standard errors. */
static double worst_sigma(const double *f, const double *e, int v, int draws) {
    double w = 0;
    for (int i = 0; i < v; i++) {
        double sd = sqrt((e[i] * (1 - e[i]) + 1e-12) / draws);
        double d = fabs(f[i] - e[i]) / sd;
        if (e[i] == 0 && f[i] != 0) return INFINITY;
        if (d > w) w = d;
    }
    return w;
}

static void softmax_t(const double *z, int v, double t, double *p) {
    double m = -INFINITY, s = 0;
    for (int i = 0; i < v; i++) if (z[i] / t > m) m = z[i] / t;
    for (int i = 0; i < v; i++) s += (p[i] = exp(z[i] / t - m));
    for (int i = 0; i < v; i++) p[i] /= s;
}

static void test_greedy(void) {
    enum { V = 1000 };
    float lg[V];
    for (int rep = 0; rep < 20; rep++) {
        rand_logits(lg, V, 3);
        int best = 0;
        for (int i = 1; i < V; i++) if (lg[i] > lg[best]) best = i;
        lily_sampling p;
        lily_sampling_default(&p);
        p.temperature = 0;
        lily_token t;
        lily_rng r;
        lily_rng_seed(&r, 5);
        lily_rng before = r;
        CHECK(lily_sample_logits(lg, V, &p, &r, NULL, &t, NULL) == LILY_OK, "greedy ok");
        CHECK(t.id == best, "greedy picks argmax %d, got %d", best, t.id);
        CHECK(memcmp(&r, &before, sizeof r) == 0, "greedy consumes no randomness");
        CHECK(lily_sample_logits(lg, V, &p, NULL, NULL, &t, NULL) == LILY_OK && t.id == best,
              "greedy needs no rng");
    }
    /* ties: lowest id */
    float flat[10];
    for (int i = 0; i < 10; i++) flat[i] = i == 3 || i == 7 ? 2.0f : 1.0f;
    lily_sampling p;
    lily_sampling_default(&p);
    p.temperature = 0;
    lily_token t;
    lily_sample_logits(flat, 10, &p, NULL, NULL, &t, NULL);
    CHECK(t.id == 3, "tie goes to lowest id, got %d", t.id);
    /* top_k == 1 is greedy too */
    p.temperature = 1.5f;
    p.top_k = 1;
    lily_rng r;
    lily_rng_seed(&r, 1);
    lily_sample_logits(flat, 10, &p, &r, NULL, &t, NULL);
    CHECK(t.id == 3, "top_k=1 is argmax, got %d", t.id);
    /* non-finite values are never chosen */
    float odd[5] = { NAN, INFINITY, 0.5f, -INFINITY, 0.25f };
    p.temperature = 0;
    p.top_k = 0;
    lily_sample_logits(odd, 5, &p, NULL, NULL, &t, NULL);
    CHECK(t.id == 2, "NaN/inf ignored, got %d", t.id);
    float none[3] = { NAN, -INFINITY, NAN };
    lily_status st = { 0 };
    CHECK(lily_sample_logits(none, 3, &p, NULL, NULL, &t, &st) == LILY_EINVAL && st.msg[0], "all non-finite rejected");
}

static void test_logprobs(void) {
    enum { V = 5000 };
    static float lg[V];
    rand_logits(lg, V, 4);
    lg[17] = lg[18] = 30; /* a tie at the top */
    double m = -INFINITY, s = 0;
    for (int i = 0; i < V; i++) if (lg[i] > m) m = lg[i];
    for (int i = 0; i < V; i++) s += exp(lg[i] - m);
    double logz = m + log(s);
    lily_sampling p;
    lily_sampling_default(&p);
    p.temperature = 0.7f;
    p.top_k = 40;
    p.presence_penalty = 1.5f; /* must not affect reported logprobs */
    p.n_logprobs = 20;
    static int32_t counts[V];
    counts[17] = 3;
    lily_rng r;
    lily_rng_seed(&r, 9);
    lily_token t;
    CHECK(lily_sample_logits(lg, V, &p, &r, counts, &t, NULL) == LILY_OK, "sample ok");
    CHECK_NEAR(t.logprob, lg[t.id] - logz, 1e-4, "chosen logprob is unmodified log-softmax");
    CHECK(t.n_top == 20, "20 alternatives, got %d", t.n_top);
    CHECK(t.top_ids[0] == 17 && t.top_ids[1] == 18, "tie ordered by id: %d %d", t.top_ids[0], t.top_ids[1]);
    /* the top list is the true top 20 by raw logit */
    int ok = 1;
    for (int j = 0; j < t.n_top; j++) {
        CHECK_NEAR(t.top_logprobs[j], lg[t.top_ids[j]] - logz, 1e-4, "top logprob");
        if (j && t.top_logprobs[j] > t.top_logprobs[j - 1]) ok = 0;
        int above = 0;
        for (int i = 0; i < V; i++) if (lg[i] > lg[t.top_ids[j]]) above++;
        if (above > j) ok = 0;
    }
    CHECK(ok, "top_logprobs sorted and are the true top-n");
    p.n_logprobs = 3;
    lily_sample_logits(lg, 2, &p, &r, NULL, &t, NULL);
    CHECK(t.n_top == 2, "n_top capped by vocab, got %d", t.n_top);
}

static void test_distributions(void) {
    enum { V = 6, N = 200000 };
    double z[V] = { 2.0, 1.3, 1.0, 0.2, -0.5, -3.0 };
    float lg[V];
    for (int i = 0; i < V; i++) lg[i] = (float)z[i];
    double e[V], f[V];
    lily_sampling p;
    uint64_t seed = lily_rng_u64(&trng);

    for (int ti = 0; ti < 3; ti++) { /* plain temperature */
        double temps[3] = { 1.0, 0.5, 2.0 };
        lily_sampling_default(&p);
        p.temperature = (float)temps[ti];
        softmax_t(z, V, temps[ti], e);
        freqs(lg, V, &p, NULL, seed + ti, N, f);
        double w = worst_sigma(f, e, V, N);
        CHECK(w < 5, "T=%g matches softmax(z/T): worst %.2f sigma", temps[ti], w);
    }
    /* top-k = 3: exactly the three largest, renormalized */
    lily_sampling_default(&p);
    p.top_k = 3;
    softmax_t(z, 3, 1.0, e);
    for (int i = 3; i < V; i++) e[i] = 0;
    freqs(lg, V, &p, NULL, seed + 10, N, f);
    CHECK(worst_sigma(f, e, V, N) < 5, "top-k=3 set and weights (%.2f sigma)", worst_sigma(f, e, V, N));

    /* top-p: probabilities 0.5 0.25 0.15 0.1 */
    double q[4] = { 0.5, 0.25, 0.15, 0.1 };
    float lq[4];
    for (int i = 0; i < 4; i++) lq[i] = (float)log(q[i]);
    struct { float top_p, min_p; int top_k; int keep; } cases[] = {
        { 0.70f, 0, 0, 2 }, { 0.45f, 0, 0, 1 }, { 0.80f, 0, 0, 3 }, { 0.95f, 0, 0, 4 },
        { 1.0f, 0.35f, 0, 2 }, { 1.0f, 0.25f, 0, 3 }, { 1.0f, 0.1f, 0, 4 },
        { 0.95f, 0.35f, 0, 2 },  /* min-p tighter than top-p */
        { 0.60f, 0.1f, 0, 2 },   /* top-p tighter than min-p */
        { 0.80f, 0, 2, 2 },      /* top-k 2 then top-p over renormalized {2/3, 1/3}: needs both */
        { 0.60f, 0, 2, 1 },      /* 2/3 >= 0.6 */
        { 0.90f, 0, 3, 3 },      /* renormalized {.556,.278,.167}: .833 < .9 */
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        lily_sampling_default(&p);
        p.top_p = cases[ci].top_p;
        p.min_p = cases[ci].min_p;
        p.top_k = cases[ci].top_k;
        double s = 0, ee[4], ff[4];
        for (int i = 0; i < 4; i++) s += i < cases[ci].keep ? q[i] : 0;
        for (int i = 0; i < 4; i++) ee[i] = i < cases[ci].keep ? q[i] / s : 0;
        freqs(lq, 4, &p, NULL, seed + 20 + ci, N / 2, ff);
        double w = worst_sigma(ff, ee, 4, N / 2);
        CHECK(w < 5, "case %zu (top_p %.2f min_p %.2f top_k %d keeps %d): %.2f sigma", ci, cases[ci].top_p,
              cases[ci].min_p, cases[ci].top_k, cases[ci].keep, w);
    }
}

static void test_penalties(void) {
    enum { V = 4, N = 100000 };
    float lg[V] = { 2.0f, 1.0f, -1.0f, 0.5f };
    int32_t counts[V] = { 2, 0, 1, 0 };
    lily_sampling p;
    lily_sampling_default(&p);
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.3f;
    double z[V] = { 2.0 - 0.5 - 0.6, 1.0, -1.0 - 0.5 - 0.3, 0.5 }, e[V], f[V];
    softmax_t(z, V, 1.0, e);
    freqs(lg, V, &p, counts, lily_rng_u64(&trng), N, f);
    CHECK(worst_sigma(f, e, V, N) < 5, "presence+frequency (%.2f sigma)", worst_sigma(f, e, V, N));

    /* greedy flips when the leader is penalized */
    p.temperature = 0;
    lily_token t;
    lily_sample_logits(lg, V, &p, NULL, counts, &t, NULL);
    CHECK(t.id == 1, "penalized leader loses under greedy, got %d", t.id);
    lily_sample_logits(lg, V, &p, NULL, NULL, &t, NULL);
    CHECK(t.id == 0, "no counts, no penalty, got %d", t.id);
    /* negative presence penalty encourages */
    p.presence_penalty = -5;
    p.frequency_penalty = 0;
    lily_sample_logits(lg, V, &p, NULL, counts, &t, NULL);
    CHECK(t.id == 2 || t.id == 0, "negative penalty favors seen tokens, got %d", t.id);
    CHECK(t.id == 0, "2+5 > -1+5, got %d", t.id);

    /* repetition penalty: positive logits divided, negative multiplied */
    lily_sampling_default(&p);
    p.repetition_penalty = 2.0f;
    int32_t c2[V] = { 1, 0, 1, 0 };
    double z2[V] = { 1.0, 1.0, -2.0, 0.5 };
    softmax_t(z2, V, 1.0, e);
    freqs(lg, V, &p, c2, lily_rng_u64(&trng), N, f);
    CHECK(worst_sigma(f, e, V, N) < 5, "repetition penalty (%.2f sigma)", worst_sigma(f, e, V, N));
    /* prompt mask widens it */
    uint8_t mask[V] = { 0, 1, 0, 0 };
    p.temperature = 0;
    lily_sample_logits_ex(lg, V, &p, NULL, c2, mask, &t, NULL);
    CHECK(t.id == 0, "1.0 vs 0.5 (masked 1.0/2), got %d", t.id);
    p.repetition_penalty = 5.0f;
    lily_sample_logits_ex(lg, V, &p, NULL, c2, mask, &t, NULL);
    CHECK(t.id == 3, "0.4, 0.2, 0.5 -> id 3, got %d", t.id);
}

static void test_determinism(void) {
    enum { V = 3000, K = 200 };
    static float lg[V];
    /* a flat distribution (two draws collide with probability ~1/V), so the check on a
     * different seed below cannot fail by chance whatever the test seed */
    rand_logits(lg, V, 0.5f);
    lily_sampling p;
    lily_sampling_default(&p);
    p.top_p = 0.9f;
    p.temperature = 0.8f;
    int a[K], b[K], c[K];
    lily_rng r1, r2, r3;
    lily_rng_seed(&r1, 1234);
    lily_rng_seed(&r2, 1234);
    lily_rng_seed(&r3, 1235);
    int same = 1, diff = 0;
    for (int i = 0; i < K; i++) {
        lily_token t;
        lily_sample_logits(lg, V, &p, &r1, NULL, &t, NULL); a[i] = t.id;
        lily_sample_logits(lg, V, &p, &r2, NULL, &t, NULL); b[i] = t.id;
        lily_sample_logits(lg, V, &p, &r3, NULL, &t, NULL); c[i] = t.id;
        same &= a[i] == b[i];
        diff += a[i] != c[i];
    }
    CHECK(same, "same seed, same tokens");
    CHECK(diff > K / 4, "another seed differs (%d of %d)", diff, K);
}

typedef struct { double z; int id; } c_t;
static int ref_cmp(const void *a, const void *b) {
    const c_t *x = a, *y = b;
    return x->z > y->z ? -1 : x->z < y->z ? 1 : (x->id > y->id) - (x->id < y->id);
}

/* Brute force: full sort, top-k, top-p, min-p, then the same draw rule. */
/* The sampler's weight function (single-precision exp), so draws compare exactly. */
#define RW(d) ((double)expf((float)(d)))

static int ref_sample(const float *lg, int v, const lily_sampling *p, double u) {
    c_t *c = malloc(sizeof *c * (size_t)v);
    double inv = 1.0 / p->temperature, zmax = -INFINITY;
    for (int i = 0; i < v; i++) { c[i].z = lg[i] * inv; c[i].id = i; if (c[i].z > zmax) zmax = c[i].z; }
    int top_k = p->top_k > 0 && p->top_k < v ? p->top_k : 0, top_p = p->top_p < 1;
    double minthr = p->min_p > 0 ? zmax + log(p->min_p) : -INFINITY;
    if (!top_k && !top_p) { /* id order */
        double tot = 0, acc = 0;
        for (int i = 0; i < v; i++) if (c[i].z >= minthr) tot += RW(c[i].z - zmax);
        int last = 0;
        for (int i = 0; i < v; i++) {
            if (!(c[i].z >= minthr)) continue;
            last = i;
            acc += RW(c[i].z - zmax);
            if (u * tot < acc) { free(c); return i; }
        }
        free(c);
        return last;
    }
    double total = 0;
    if (top_p && !top_k) for (int i = 0; i < v; i++) total += RW(c[i].z - zmax);
    qsort(c, (size_t)v, sizeof *c, ref_cmp);
    int n = v;
    if (top_k) n = top_k;
    if (top_p) {
        if (top_k) { total = 0; for (int i = 0; i < n; i++) total += RW(c[i].z - zmax); }
        double acc = 0;
        for (int i = 0; i < n; i++) { acc += RW(c[i].z - zmax); if (acc >= p->top_p * total) { n = i + 1; break; } }
    }
    int keep = 1;
    while (keep < n && c[keep].z >= minthr) keep++;
    n = keep;
    double tot = 0, acc = 0;
    for (int i = 0; i < n; i++) tot += RW(c[i].z - zmax);
    int id = c[n - 1].id;
    for (int i = 0; i < n; i++) { acc += RW(c[i].z - zmax); if (u * tot < acc) { id = c[i].id; break; } }
    free(c);
    return id;
}

static void test_against_reference(void) {
    int V = 248320; /* the real vocabulary size: exercises the windowed gather */
    float *lg = malloc(sizeof *lg * (size_t)V);
    int mism = 0, total = 0;
    for (int rep = 0; rep < 26; rep++) {
        float scale = rep % 3 == 0 ? 0.05f : rep % 3 == 1 ? 1.0f : 6.0f; /* flat, medium, peaked */
        rand_logits(lg, V, scale);
        if (rep >= 20) /* ties everywhere (a handful of values, +0 and -0 among them): the window's
                        * radix sort must order them by id as the full sort does */
            for (int i = 0; i < V; i++) lg[i] = i % 7 == 0 ? (i % 2 ? -0.0f : 0.0f) : roundf(lg[i] * 40) / 40;
        lily_sampling p;
        lily_sampling_default(&p);
        p.temperature = 0.3f + (float)lily_rng_uniform(&trng) * 1.5f;
        int mode = rep % 5;
        if (mode == 0 || mode == 3) p.top_k = 1 + (int)(lily_rng_u64(&trng) % 100);
        if (mode == 1 || mode == 3) p.top_p = 0.5f + 0.49f * (float)lily_rng_uniform(&trng);
        if (mode == 2 || mode == 4) p.min_p = (float)lily_rng_uniform(&trng) * 0.3f;
        if (mode == 4) p.top_p = 0.95f;
        for (int k = 0; k < 3; k++) {
            lily_rng r;
            lily_rng_seed(&r, lily_rng_u64(&trng));
            lily_rng r2 = r;
            double u = lily_rng_uniform(&r2);
            lily_token t;
            lily_code rc = lily_sample_logits(lg, V, &p, &r, NULL, &t, NULL);
            int want = p.top_k == 1 ? -1 : ref_sample(lg, V, &p, u);
            total++;
            if (rc || (want >= 0 && t.id != want)) {
                mism++;
                fprintf(stderr, "mismatch rep %d: T %.3f k %d p %.3f minp %.3f: got %d want %d\n", rep, p.temperature,
                        p.top_k, p.top_p, p.min_p, t.id, want);
            }
        }
    }
    CHECK(mism == 0, "%d of %d draws differ from the full-sort reference", mism, total);
    free(lg);
}

static void test_bad_params(void) {
    float lg[4] = { 0, 1, 2, 3 };
    lily_token t;
    lily_rng r;
    lily_rng_seed(&r, 1);
    struct { const char *what; void (*set)(lily_sampling *); } bad[] = {
        { "temperature NaN", NULL }, { "negative temperature", NULL }, { "top_k < 0", NULL },
        { "top_p 0", NULL }, { "top_p > 1", NULL }, { "min_p > 1", NULL }, { "n_logprobs 21", NULL },
        { "repetition 0", NULL },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        lily_sampling p;
        lily_sampling_default(&p);
        switch (i) {
        case 0: p.temperature = NAN; break;
        case 1: p.temperature = -1; break;
        case 2: p.top_k = -1; break;
        case 3: p.top_p = 0; break;
        case 4: p.top_p = 1.5f; break;
        case 5: p.min_p = 1.5f; break;
        case 6: p.n_logprobs = 21; break;
        case 7: p.repetition_penalty = 0; break;
        }
        lily_status st = { 0 };
        CHECK(lily_sample_logits(lg, 4, &p, &r, NULL, &t, &st) == LILY_EINVAL && st.msg[0], "%s rejected", bad[i].what);
    }
    lily_sampling p;
    lily_sampling_default(&p);
    CHECK(lily_sample_logits(lg, 0, &p, &r, NULL, &t, NULL) == LILY_EINVAL, "vocab 0 rejected");
    CHECK(lily_sample_logits(lg, 4, &p, NULL, NULL, &t, NULL) == LILY_EINVAL, "sampling without rng rejected");
    CHECK(p.temperature == 1 && p.top_p == 1 && p.top_k == 0 && p.min_p == 0 && p.repetition_penalty == 1,
          "defaults are neutral");
}

/* The allowed mask must act exactly like -inf logits for the excluded tokens (same draw
 * for the same rng state, every truncation mode), while logprobs keep the model's row. */
static void test_mask(void) {
    enum { V = 3000 };
    static float lg[V], lm[V];
    static uint8_t allowed[V];
    int same = 0, total = 0, inside = 1, lp_model = 1;
    for (int rep = 0; rep < 60; rep++) {
        rand_logits(lg, V, 1.0f + (float)(rep % 5));
        int density = 1 + rep % 4; /* 1/2 .. 1/16 of the tokens allowed */
        for (int i = 0; i < V; i++) {
            allowed[i] = (lily_rng_u64(&trng) % (1u << density)) == 0;
            lm[i] = allowed[i] ? lg[i] : -INFINITY;
        }
        allowed[rep] = 1, lm[rep] = lg[rep];
        lily_sampling p;
        lily_sampling_default(&p);
        int mode = rep % 6;
        if (mode == 0) p.temperature = 0;
        if (mode == 2) p.top_k = 7;
        if (mode == 3) p.top_p = 0.8f;
        if (mode == 4) p.min_p = 0.05f;
        if (mode == 5) p.top_k = 40, p.top_p = 0.9f, p.min_p = 0.01f;
        p.n_logprobs = 3;
        uint64_t seed = lily_rng_u64(&trng);
        lily_rng r1, r2;
        lily_rng_seed(&r1, seed);
        lily_rng_seed(&r2, seed);
        lily_token a, b;
        lily_status st = { 0 };
        CHECK(lily_sample_logits_mask(lg, V, &p, &r1, NULL, NULL, allowed, &a, &st) == LILY_OK, "masked: %s", st.msg);
        CHECK(lily_sample_logits(lm, V, &p, &r2, NULL, &b, &st) == LILY_OK, "-inf row: %s", st.msg);
        total++;
        same += a.id == b.id;
        inside &= allowed[a.id];
        float mx = lg[0];
        for (int i = 1; i < V; i++) mx = lg[i] > mx ? lg[i] : mx;
        lp_model &= a.top_logprobs[0] <= 0 && lg[a.top_ids[0]] == mx;
    }
    CHECK(same == total, "masked draw equals the -inf row's draw (%d/%d)", same, total);
    CHECK(inside, "every masked draw is an allowed token");
    CHECK(lp_model, "masked logprobs describe the unmodified row");
    memset(allowed, 0, sizeof allowed);
    lily_sampling p;
    lily_sampling_default(&p);
    lily_rng r;
    lily_rng_seed(&r, 3);
    lily_token t;
    lily_status st = { 0 };
    CHECK(lily_sample_logits_mask(lg, V, &p, &r, NULL, NULL, allowed, &t, &st) == LILY_EINVAL && st.msg[0],
          "nothing allowed: an error (%s)", st.msg);
}

/* logit_bias must equal sampling the row with the bias added (same rng state), while the
 * logprobs stay those of the unbiased row; ids outside the vocabulary are refused. */
static void test_bias(void) {
    enum { V = 2000 };
    static float lg[V], lb[V];
    int same = 0, total = 0, lp_model = 1;
    for (int rep = 0; rep < 48; rep++) {
        rand_logits(lg, V, 2.0f);
        memcpy(lb, lg, sizeof lg);
        int32_t ids[8];
        float vals[8];
        for (int i = 0; i < 8; i++) {
            ids[i] = (int32_t)(lily_rng_u64(&trng) % V);
            vals[i] = (float)((int)(lily_rng_u64(&trng) % 201) - 100) / 4.0f;
            lb[ids[i]] += vals[i];
        }
        lily_sampling p;
        lily_sampling_default(&p);
        int mode = rep % 4;
        if (mode == 0) p.temperature = 0;
        if (mode == 2) p.top_k = 20, p.top_p = 0.9f;
        if (mode == 3) p.min_p = 0.02f, p.presence_penalty = 0.5f;
        p.n_logprobs = 2;
        p.n_bias = 8, p.bias_ids = ids, p.bias_values = vals;
        lily_sampling q = p;
        q.n_bias = 0;
        int32_t counts[V] = { 0 };
        counts[ids[0]] = 2;
        uint64_t seed = lily_rng_u64(&trng);
        lily_rng r1, r2;
        lily_rng_seed(&r1, seed);
        lily_rng_seed(&r2, seed);
        lily_token a, b;
        lily_status st = { 0 };
        CHECK(lily_sample_logits(lg, V, &p, &r1, counts, &a, &st) == LILY_OK, "biased: %s", st.msg);
        CHECK(lily_sample_logits(lb, V, &q, &r2, counts, &b, &st) == LILY_OK, "pre-biased row: %s", st.msg);
        total++;
        same += a.id == b.id;
        float mx = lg[0];
        for (int i = 1; i < V; i++) mx = lg[i] > mx ? lg[i] : mx;
        lp_model &= lg[a.top_ids[0]] == mx;
    }
    CHECK(same == total, "logit_bias equals the biased row (%d/%d)", same, total);
    CHECK(lp_model, "logprobs ignore the bias");
    lily_sampling p;
    lily_sampling_default(&p);
    int32_t id = V;
    float v = 1;
    p.n_bias = 1, p.bias_ids = &id, p.bias_values = &v;
    lily_rng r;
    lily_rng_seed(&r, 1);
    lily_token t;
    lily_status st = { 0 };
    CHECK(lily_sample_logits(lg, V, &p, &r, NULL, &t, &st) == LILY_EINVAL && st.msg[0], "bias id past the vocabulary: %s",
          st.msg);
    v = NAN, id = 0;
    CHECK(lily_sample_logits(lg, V, &p, &r, NULL, &t, &st) == LILY_EINVAL, "NaN bias refused");
}

/* The vectorized log-partition sum against exp in double: rows of every scale, with
 * non-finite entries and lengths that leave a tail. */
static void test_sum_exp(void) {
#ifdef MM_HAVE_AVX2
    if (!cpu_mm_avx2_available()) { CHECK(1, "no AVX2: the scalar sum is the only path"); return; }
    float *x = malloc(sizeof *x * 5000);
    double worst = 0;
    for (int rep = 0; rep < 200; rep++) {
        int n = 1 + (int)(lily_rng_u64(&trng) % 5000);
        double scale = pow(10, (double)(lily_rng_u64(&trng) % 5) - 2); /* 0.01 .. 100 */
        float m = -INFINITY;
        for (int i = 0; i < n; i++) {
            x[i] = (float)((lily_rng_uniform(&trng) * 2 - 1) * scale * 30);
            int k = (int)(lily_rng_u64(&trng) % 97);
            if (k == 0) x[i] = -INFINITY; else if (k == 1) x[i] = INFINITY; else if (k == 2) x[i] = NAN;
            if (isfinite(x[i]) && x[i] > m) m = x[i];
        }
        if (m == -INFINITY) { x[0] = 0; m = 0; }
        double ref = 0;
        for (int i = 0; i < n; i++) if (isfinite(x[i])) ref += exp((double)x[i] - m);
        double got = sum_exp_avx2(x, n, m), e = fabs(got - ref) / ref;
        if (e > worst) worst = e;
    }
    CHECK(worst < 1e-6, "sum_exp_avx2: worst relative error %.3g (tolerance 1e-6)", worst);
    printf("sum_exp_avx2: worst relative error %.2g over 200 rows\n", worst);
    free(x);
#endif
}

/* The skipping scans against the plain ones (lily_sampler_scan_all): every mode, with
 * penalties over sparse counts and prompt tokens, logit bias, allowed masks, logprobs,
 * non-finite logits and ties; the same token, logprob and alternatives bit for bit. */
static void test_skip_scans(void) {
    enum { V = 4099 }; /* not a multiple of 8: the vector scans' tails */
    static float lg[V];
    static int32_t counts[V];
    static uint8_t pm[V], allowed[V];
    int bad = 0, cases = 0;
    for (int rep = 0; rep < 400; rep++) {
        float scale = rep % 3 == 0 ? 0.05f : rep % 3 == 1 ? 1.0f : 6.0f;
        rand_logits(lg, V, scale);
        if (rep % 4 == 1)
            for (int i = 0; i < V; i++) lg[i] = roundf(lg[i] * 4) / 4 + (i % 9 == 0 ? -0.0f : 0.0f);
        if (rep % 5 == 2)
            for (int k = 0; k < 6; k++) {
                static const float odd[] = { NAN, INFINITY, -INFINITY };
                lg[lily_rng_u64(&trng) % V] = odd[k % 3];
            }
        memset(counts, 0, sizeof counts);
        memset(pm, 0, sizeof pm);
        int nseen = (int)(lily_rng_u64(&trng) % 40);
        for (int k = 0; k < nseen; k++) {
            int id = (int)(lily_rng_u64(&trng) % V);
            if (k % 2) counts[id] += 1 + (int)(lily_rng_u64(&trng) % 3);
            else pm[id] = 1;
        }
        if (rep % 7 == 3) counts[V - 1] = 2; /* in the scalar tail */
        int use_mask = rep % 6 == 5;
        for (int i = 0; i < V; i++) allowed[i] = lily_rng_u64(&trng) % 3 != 0;
        int32_t bid[3];
        float bval[3];
        for (int k = 0; k < 3; k++) { bid[k] = (int32_t)(lily_rng_u64(&trng) % V); bval[k] = (float)(lily_rng_normal(&trng) * 5); }
        lily_sampling p;
        lily_sampling_default(&p);
        int mode = rep % 8;
        p.temperature = mode == 0 ? 0.0f : 0.2f + (float)lily_rng_uniform(&trng) * 1.5f;
        if (mode == 1 || mode == 3 || mode == 6) p.top_k = 1 + (int)(lily_rng_u64(&trng) % 60);
        if (mode == 2 || mode == 3) p.top_p = 0.5f + 0.49f * (float)lily_rng_uniform(&trng);
        if (mode == 4) p.min_p = (float)lily_rng_uniform(&trng) * 0.3f;
        if (rep % 3 == 0) p.presence_penalty = (float)(lily_rng_uniform(&trng) * 4 - 2);
        if (rep % 3 == 1) p.frequency_penalty = (float)(lily_rng_uniform(&trng) * 4 - 2);
        if (rep % 4 == 2) p.repetition_penalty = 0.5f + (float)lily_rng_uniform(&trng) * 1.5f;
        if (rep % 5 == 4) { p.n_bias = 3; p.bias_ids = bid; p.bias_values = bval; }
        p.n_logprobs = (int)(lily_rng_u64(&trng) % 21);
        uint64_t seed = lily_rng_u64(&trng);
        lily_token t[2];
        lily_code rc[2];
        for (int all = 0; all < 2; all++) {
            lily_sampler_scan_all = all;
            lily_rng r;
            lily_rng_seed(&r, seed);
            lily_status st;
            rc[all] = lily_sample_logits_mask(lg, V, &p, &r, counts, pm, use_mask ? allowed : NULL, &t[all], &st);
        }
        lily_sampler_scan_all = 0;
        cases++;
        int same = rc[0] == rc[1] && (rc[0] || (t[0].id == t[1].id && !memcmp(&t[0].logprob, &t[1].logprob, sizeof(float)) &&
                                               t[0].n_top == t[1].n_top &&
                                               !memcmp(t[0].top_ids, t[1].top_ids, sizeof(int32_t) * (size_t)t[0].n_top) &&
                                               !memcmp(t[0].top_logprobs, t[1].top_logprobs, sizeof(float) * (size_t)t[0].n_top)));
        if (!same && bad++ < 5)
            fprintf(stderr, "skip scans differ, rep %d (mode %d): rc %d/%d id %d/%d\n", rep, mode, rc[0], rc[1], t[0].id, t[1].id);
    }
    CHECK(bad == 0, "%d of %d draws differ between the skipping and the plain scans", bad, cases);
#ifdef MM_HAVE_AVX2
    if (!cpu_mm_avx2_available()) return;
    int hbad = 0; /* the vector helpers alone, against their scalar definitions */
    for (int rep = 0; rep < 2000; rep++) {
        int n = 1 + (int)(lily_rng_u64(&trng) % 70), i0 = (int)(lily_rng_u64(&trng) % (unsigned)n);
        for (int i = 0; i < n; i++) {
            uint64_t k = lily_rng_u64(&trng) % 16;
            lg[i] = k == 0 ? NAN : k == 1 ? INFINITY : k == 2 ? -INFINITY : k == 3 ? -0.0f : roundf((float)lily_rng_normal(&trng) * 4) / 4;
            counts[i] = lily_rng_u64(&trng) % 23 == 0;
            pm[i] = lily_rng_u64(&trng) % 29 == 0;
        }
        float thr = rep % 3 ? lg[lily_rng_u64(&trng) % (unsigned)n] : (float)lily_rng_normal(&trng);
        if (thr != thr) thr = 0;
        const int32_t *cc = rep % 2 ? counts : NULL;
        const uint8_t *pp = rep % 4 >= 2 ? pm : NULL;
        int want = n;
        for (int i = i0; i < n && want == n; i++)
            if (lg[i] > thr || (cc && cc[i]) || (pp && pp[i])) want = i;
        float mx = -INFINITY;
        for (int i = 0; i < n; i++)
            if (isfinite(lg[i]) && lg[i] > mx) mx = lg[i];
        hbad += next_above_avx2(lg, cc, pp, i0, n, thr) != want || max_finite_avx2(lg, n) != mx;
    }
    CHECK(hbad == 0, "next_above_avx2 / max_finite_avx2 disagree with their scalar loops %d times", hbad);
#endif
}

int main(void) {
    uint64_t seed = t_seed("test_sampler");
    lily_rng_seed(&trng, seed);
    test_greedy();
    test_logprobs();
    test_distributions();
    test_penalties();
    test_determinism();
    test_against_reference();
    test_bad_params();
    test_mask();
    test_bias();
    test_sum_exp();
    test_skip_scans();
    return T_DONE();
}
