/* The GPU sampler (src/cuda/cu_sample.cu) against the CPU sampler (src/engine/sampler.c);
 * included by kernel_test.c, which owns rng, report() and the counters.
 *
 * Equivalence rule. Both draw the same uniform u (the CPU's lily_rng and the device copy are
 * given one state; a state whose next output is u is made directly). On the same logits,
 * parameters, counts and u the chosen ids must be identical, except where a perturbation of
 * the input mass by 1e-6 (u +- 1e-6, top_p x (1 +- 1e-6)) changes the CPU's own choice to the
 * GPU's: a boundary case, counted and bounded (the GPU sums weights in another order and in
 * fixed point, and a GPU's expf may differ from glibc's in the last bit). Logprobs agree to
 * 1e-4 absolute, the top-n lists are identical up to ties of the raw logit, errors (every
 * token at -inf) coincide, and so does the rng state afterwards. */
#include "engine/sampler.h"

#define KS_DELTA 1e-6

/* A lily_rng whose next lily_rng_uniform() is u53 * 2^-53 (xoroshiro128+ returns s0 + s1). */
static lily_rng ks_rng_for(uint64_t u53, uint64_t s0) {
    lily_rng r;
    r.s[0] = s0;
    r.s[1] = (u53 << 11) - s0;
    return r;
}

typedef struct { int cases, boundary, bad; double worst_lp; } ks_stats;

static float *ks_logits(int V, int kind) {
    float *x = malloc((size_t)V * sizeof *x);
    for (int i = 0; i < V; i++) {
        switch (kind) {
        case 0: x[i] = lily_rng_normal(&rng) * 3.0f; break;                       /* peaked */
        case 1: x[i] = 0.5f + lily_rng_normal(&rng) * 1e-3f; break;               /* flat, near ties */
        case 2: x[i] = (float)(lily_rng_u64(&rng) % 3); break;                    /* exact ties */
        case 3: x[i] = lily_rng_normal(&rng) * 2.0f; break;                       /* with non-finite */
        default: x[i] = lily_rng_normal(&rng) * 10.0f; break;                     /* wide */
        }
    }
    if (kind == 0) for (int k = 0; k < 3; k++) x[lily_rng_u64(&rng) % (uint64_t)V] += 12.0f;
    if (kind == 3) for (int i = 0; i < V; i++) {
        uint64_t r = lily_rng_u64(&rng) % 100;
        if (r < 5) x[i] = -INFINITY;
        else if (r == 5) x[i] = NAN;
        else if (r == 6 && V > 50) x[i] = INFINITY;
    }
    return x;
}

static int ks_pick(int n, const int *v) { return v[lily_rng_u64(&rng) % (uint64_t)n]; }

static void ks_params(int V, lily_sampling *p, int32_t *bias_ids, float *bias_vals) {
    static const float temps[] = { 0, 0.05f, 0.5f, 1, 1, 1.7f }, tps[] = { 1, 1, 1e-6f, 0.3f, 0.9f, 0.995f };
    static const float mps[] = { 0, 0, 0, 0.01f, 0.2f, 0.9f };
    int ks[] = { 0, 0, 0, 1, 2, 7, 50, V - 1, V, V + 3 };
    lily_sampling_default(p);
    p->temperature = temps[lily_rng_u64(&rng) % 6];
    p->top_k = ks_pick(10, ks);
    if (p->top_k < 0) p->top_k = 0;
    p->top_p = tps[lily_rng_u64(&rng) % 6];
    p->min_p = mps[lily_rng_u64(&rng) % 6];
    if (lily_rng_u64(&rng) % 2) {
        static const float pps[] = { 0, 0.4f, -0.6f }, fps[] = { 0, 0.25f }, rps[] = { 1, 1.3f, 0.7f };
        p->presence_penalty = pps[lily_rng_u64(&rng) % 3];
        p->frequency_penalty = fps[lily_rng_u64(&rng) % 2];
        p->repetition_penalty = rps[lily_rng_u64(&rng) % 3];
    }
    p->n_logprobs = (int)(lily_rng_u64(&rng) % (LILY_MAX_LOGPROBS + 1));
    if (lily_rng_u64(&rng) % 3 == 0) {
        static const float bv[] = { -1e30f, 30.0f, -5.0f, 2.5f };
        p->n_bias = 1 + (int)(lily_rng_u64(&rng) % 6);
        for (int i = 0; i < p->n_bias; i++) {
            bias_ids[i] = i > 0 && lily_rng_u64(&rng) % 4 == 0 ? bias_ids[i - 1] : (int32_t)(lily_rng_u64(&rng) % (uint64_t)V);
            bias_vals[i] = bv[lily_rng_u64(&rng) % 4];
        }
        p->bias_ids = bias_ids;
        p->bias_values = bias_vals;
    }
}

static lily_code ks_cpu(const float *x, int V, const lily_sampling *p, const int32_t *cnt, const uint8_t *pm,
                        uint64_t u53, lily_token *t, lily_rng *after) {
    lily_rng r = ks_rng_for(u53, 0x243f6a8885a308d3ull);
    lily_code rc = lily_sample_logits_ex(x, V, p, &r, cnt, pm, t, NULL);
    if (after) *after = r;
    return rc;
}

/* Whether a 1e-6 nudge of the input mass (u +- 1e-6, top_p x (1 +- 1e-6)) moves the CPU's choice
 * at u53 to gid: a boundary case (the equivalence rule above). */
static int ks_near(const float *x, int V, const lily_sampling *p, const int32_t *cnt, const uint8_t *pm, uint64_t u53,
                   int gid) {
    const uint64_t d = (uint64_t)(KS_DELTA * 9007199254740992.0);
    for (int k = 0; k < 4; k++) {
        lily_sampling q = *p;
        uint64_t u = u53;
        if (k == 0) u = u53 + d < (1ull << 53) ? u53 + d : (1ull << 53) - 1;
        if (k == 1) u = u53 > d ? u53 - d : 0;
        if (k == 2) q.top_p = fminf(1.0f, (float)(p->top_p * (1 + KS_DELTA)));
        if (k == 3) q.top_p = (float)(p->top_p * (1 - KS_DELTA));
        lily_token t;
        if (!ks_cpu(x, V, &q, cnt, pm, u, &t, NULL) && t.id == gid) return 1;
    }
    return 0;
}
/* One case: fresh logits of the kind, random parameters, counts, prompt mask and u. */
static void ks_case(int V, int kind, ks_stats *S) {
    float *x = ks_logits(V, kind);
    int32_t bias_ids[8], *cnt = calloc((size_t)V, 4);
    float bias_vals[8];
    uint8_t *pm = calloc((size_t)V, 1);
    lily_sampling p;
    ks_params(V, &p, bias_ids, bias_vals);
    for (int i = 0; i < V; i++) {
        uint64_t r = lily_rng_u64(&rng) % 100;
        if (r < 5) cnt[i] = 1 + (int)(r % 3);
        if (r >= 90) pm[i] = 1;
    }
    uint64_t u53 = lily_rng_u64(&rng) >> 11;
    lily_token c, g;
    lily_rng after;
    lily_code crc = ks_cpu(x, V, &p, cnt, pm, u53, &c, &after);
    lily_rng dr = ks_rng_for(u53, 0x243f6a8885a308d3ull);
    int gerr = 0;
    lily_status st = { 0 };
    S->cases++;
    char what[200];
    snprintf(what, sizeof what, "V=%d kind %d T=%g k=%d p=%g minp=%g pen %g/%g/%g bias %d lp %d", V, kind, p.temperature,
             p.top_k, p.top_p, p.min_p, p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.n_bias, p.n_logprobs);
    if (lct_sample(x, V, &p, cnt, pm, dr.s, 1, &g, &gerr, &st)) {
        printf("sample %s: %s\n", what, st.msg);
        S->bad++;
        goto out;
    }
    if ((crc != LILY_OK) != (gerr != 0)) {
        printf("sample %s: cpu rc %d, gpu error flag %d\n", what, crc, gerr);
        S->bad++;
        goto out;
    }
    if (crc) goto out;
    if (dr.s[0] != after.s[0] || dr.s[1] != after.s[1]) {
        printf("sample %s: rng state after the step differs\n", what);
        S->bad++;
    }
    if (g.id != c.id) { /* a boundary case only if a 1e-6 nudge moves the CPU there */
        if (ks_near(x, V, &p, cnt, pm, u53, g.id)) S->boundary++;
        else {
            printf("sample %s u=%.17g: cpu %d (z %g), gpu %d (z %g)\n", what, u53 * 0x1.0p-53, c.id, x[c.id], g.id,
                   g.id >= 0 && g.id < V ? x[g.id] : NAN);
            S->bad++;
        }
    }
    double e = isinf(c.logprob) && c.logprob == g.logprob ? 0 : fabs((double)c.logprob - g.logprob);
    if (g.id == c.id && !(e <= S->worst_lp)) S->worst_lp = e;
    int tops_ok = c.n_top == g.n_top;
    for (int j = 0; tops_ok && j < c.n_top; j++) {
        int ci = c.top_ids[j], gi = g.top_ids[j];
        tops_ok = gi >= 0 && gi < V && (ci == gi || x[ci] == x[gi] || (!isfinite(x[ci]) && !isfinite(x[gi])));
        double le = isinf(c.top_logprobs[j]) && c.top_logprobs[j] == g.top_logprobs[j] ? 0
                                                                                       : fabs((double)c.top_logprobs[j] - g.top_logprobs[j]);
        if (!(le <= S->worst_lp)) S->worst_lp = le;
    }
    if (!tops_ok) {
        printf("sample %s: top-%d lists differ (cpu n %d, gpu n %d)\n", what, p.n_logprobs, c.n_top, g.n_top);
        S->bad++;
    }
out:
    free(x); free(cnt); free(pm);
}

static void test_sample_equiv(const char *label, int V, int cases) {
    ks_stats S = { 0, 0, 0, 0 };
    for (int i = 0; i < cases; i++) ks_case(V, i % 5, &S);
    char what[200];
    snprintf(what, sizeof what, "GPU sampler = CPU sampler, %s: %d cases, %d boundary", label, S.cases, S.boundary);
    /* boundary cases need u within 1e-6 of a cumulative-mass edge: a few in a thousand at most */
    int ok = S.bad == 0 && S.boundary <= 1 + S.cases / 100;
    report(what, ok ? S.worst_lp : INFINITY, 1e-4);
}

/* The exact probabilities of the sampling rule (no penalties), independently of sampler.c. */
typedef struct { double z; int id; } ks_zi;
static int ks_zcmp(const void *a, const void *b) {
    const ks_zi *x = a, *y = b;
    if (x->z != y->z) return x->z > y->z ? -1 : 1;
    return x->id - y->id;
}
static void ks_exact(const float *x, int V, const lily_sampling *p, double *prob) {
    ks_zi *c = malloc((size_t)V * sizeof *c);
    for (int i = 0; i < V; i++) { c[i].z = (double)x[i] / p->temperature; c[i].id = i; }
    qsort(c, (size_t)V, sizeof *c, ks_zcmp);
    int n = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    double tot = 0, acc = 0;
    for (int i = 0; i < n; i++) tot += exp(c[i].z - c[0].z);
    if (p->top_p < 1)
        for (int i = 0; i < n; i++) {
            acc += exp(c[i].z - c[0].z);
            if (acc >= p->top_p * tot) { n = i + 1; break; }
        }
    if (p->min_p > 0)
        for (int i = 1; i < n; i++)
            if (c[i].z < c[0].z + log(p->min_p)) { n = i; break; }
    tot = 0;
    for (int i = 0; i < n; i++) tot += exp(c[i].z - c[0].z);
    memset(prob, 0, (size_t)V * sizeof *prob);
    for (int i = 0; i < n; i++) prob[c[i].id] = exp(c[i].z - c[0].z) / tot;
    free(c);
}

/* Many draws from one row through the device's own rng stream: the frequencies against the
 * exact probabilities (chi-square), and the token sequence against the CPU sampler's with the
 * same seed. */
static void test_sample_dist(const char *label, int V, float temp, int top_k, float top_p, float min_p, int draws) {
    float *x = ks_logits(V, 0);
    for (int i = 0; i < V; i++) x[i] = lily_rng_normal(&rng) * 1.5f;
    lily_sampling p;
    lily_sampling_default(&p);
    p.temperature = temp; p.top_k = top_k; p.top_p = top_p; p.min_p = min_p;
    double *prob = malloc((size_t)V * sizeof *prob);
    ks_exact(x, V, &p, prob);
    lily_token *g = malloc((size_t)draws * sizeof *g);
    int *err = calloc((size_t)draws, sizeof *err), *freq = calloc((size_t)V, sizeof *freq);
    lily_rng r0, rc;
    lily_rng_seed(&r0, lily_rng_u64(&rng));
    rc = r0;
    lily_status st = { 0 };
    char what[200];
    if (lct_sample(x, V, &p, NULL, NULL, r0.s, draws, g, err, &st)) {
        printf("%s: %s\n", label, st.msg);
        n_fail++;
        goto out;
    }
    int differ = 0, outside = 0, errs = 0;
    for (int i = 0; i < draws; i++) {
        lily_token t;
        lily_sample_logits(x, V, &p, &rc, NULL, &t, NULL);
        differ += t.id != g[i].id;
        errs += err[i];
        if (g[i].id < 0 || g[i].id >= V || prob[g[i].id] == 0) outside++;
        else freq[g[i].id]++;
    }
    double chi = 0;
    int df = -1;
    for (int i = 0; i < V; i++)
        if (prob[i] > 0) { double e = prob[i] * draws; chi += (freq[i] - e) * (freq[i] - e) / e; df++; }
    /* generous: about 5 standard deviations above the mean of chi-square(df) */
    double lim = df + 5 * sqrt(2.0 * (df > 0 ? df : 1)) + 5;
    snprintf(what, sizeof what, "GPU sampler draws, %s: %d draws over %d tokens, chi2 %.1f (df %d, limit %.0f), %d differ from CPU",
             label, draws, df + 1, chi, df, lim, differ);
    report(what, (outside == 0 && errs == 0 && chi <= lim && differ <= draws / 100) ? 0 : INFINITY, 0);
out:
    free(x); free(prob); free(g); free(err); free(freq);
}

/* Steps on one row with the penalties on: the device counts each chosen token itself, so
 * each step must match the CPU's choice from the same u with the counts of the device's own
 * earlier tokens (followed, so that one boundary case does not shift every later count), up to
 * the boundary cases of the equivalence rule, which are counted and bounded as there: a draw
 * within 1e-6 of a cumulative-mass edge (about 1 in 1,000 runs of 500 steps met one on the H200). */
static void test_sample_steps(int V, int steps) {
    float *x = ks_logits(V, 0);
    int32_t *cnt = calloc((size_t)V, 4);
    uint8_t *pm = calloc((size_t)V, 1);
    for (int i = 0; i < V; i += 7) pm[i] = 1;
    lily_sampling p;
    lily_sampling_default(&p);
    p.temperature = 0.7f; p.top_k = 20; p.top_p = 0.9f;
    p.presence_penalty = 0.5f; p.frequency_penalty = 0.3f; p.repetition_penalty = 1.2f; p.n_logprobs = 3;
    lily_rng r0, rc;
    lily_rng_seed(&r0, lily_rng_u64(&rng));
    rc = r0;
    lily_token *g = malloc((size_t)steps * sizeof *g);
    int *err = calloc((size_t)steps, sizeof *err), differ = 0, boundary = 0, errs = 0;
    lily_status st = { 0 };
    if (lct_sample(x, V, &p, NULL, pm, r0.s, steps, g, err, &st)) { printf("penalty steps: %s\n", st.msg); n_fail++; goto out; }
    for (int i = 0; i < steps; i++) {
        lily_token t;
        const uint64_t u53 = (rc.s[0] + rc.s[1]) >> 11; /* this step's draw (xoroshiro128+, 53 bits) */
        lily_sample_logits_ex(x, V, &p, &rc, cnt, pm, &t, NULL);
        if (t.id != g[i].id) {
            if (g[i].id >= 0 && g[i].id < V && ks_near(x, V, &p, cnt, pm, u53, g[i].id)) boundary++;
            else differ++;
        }
        if (g[i].id >= 0 && g[i].id < V) cnt[g[i].id]++;
        else differ++;
        errs += err[i];
    }
    char what[160];
    snprintf(what, sizeof what, "GPU sampler, %d steps with penalties counted on the device: %d differ from CPU, %d boundary", steps,
             differ, boundary);
    report(what, differ == 0 && boundary <= 1 + steps / 100 && errs == 0 && r0.s[0] == rc.s[0] && r0.s[1] == rc.s[1] ? 0 : INFINITY, 0);
out:
    free(x); free(cnt); free(pm); free(g); free(err);
}

/* level 0: a few small cases (part of every kernel test run); 1: every size, five cases
 * at the real vocabulary and the draw statistics, sized for the emulator (--sampling
 * --small); 2: the same, larger (on a GPU). */
static void test_sampling(int level) {
    static const int sizes[] = { 1, 2, 7, 33, 1000, 1025, 3000 };
    if (level == 0) {
        test_sample_equiv("V=7", 7, 40);
        test_sample_equiv("V=1025", 1025, 20);
        return;
    }
    for (int i = 0; i < 7; i++) {
        char label[40];
        snprintf(label, sizeof label, "V=%d", sizes[i]);
        test_sample_equiv(label, sizes[i], sizes[i] <= 33 ? 60 : level == 1 ? 40 : 400);
    }
    test_sample_equiv("V=248320", 248320, level == 1 ? 5 : 60);
    test_sample_steps(60, level == 1 ? 60 : 500);
    test_sample_dist("top-k 6, top-p 0.9 (sorted)", 12, 0.8f, 6, 0.9f, 0, level == 1 ? 1000 : 20000);
    test_sample_dist("min-p 0.05 (id order)", 12, 1.3f, 0, 1, 0.05f, level == 1 ? 1000 : 20000);
}
