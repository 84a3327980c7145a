/* Sampling from one logits row; see sampler.h for the contract.
 *
 * Every truncation (top-k, top-p, min-p) keeps a prefix of the tokens sorted by
 * penalized logit, so only that prefix needs sorting. It is found by gathering the
 * tokens within a window below the maximum and widening the window until it provably
 * contains the kept set; with real distributions the first window almost always does,
 * which keeps a 250k-entry vocabulary out of qsort. Without top-k/top-p no sort is
 * needed at all: the draw walks the vocabulary in id order. */
#include "engine/sampler.h"
#include "cpu/fast.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

void lily_sampling_default(lily_sampling *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
}

lily_code lily_sampling_check(const lily_sampling *p, lily_status *st) {
    if (!p) return lily_err(st, LILY_EINVAL, "sampling parameters missing");
    if (!isfinite(p->temperature) || p->temperature < 0)
        return lily_err(st, LILY_EINVAL, "temperature must be a finite number >= 0 (got %g)", p->temperature);
    if (p->top_k < 0) return lily_err(st, LILY_EINVAL, "top_k must be >= 0 (got %d)", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return lily_err(st, LILY_EINVAL, "top_p must be in (0, 1] (got %g)", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return lily_err(st, LILY_EINVAL, "min_p must be in [0, 1] (got %g)", p->min_p);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return lily_err(st, LILY_EINVAL, "presence_penalty and frequency_penalty must be finite");
    if (!(p->repetition_penalty > 0) || !isfinite(p->repetition_penalty))
        return lily_err(st, LILY_EINVAL, "repetition_penalty must be > 0 (got %g)", p->repetition_penalty);
    if (p->n_logprobs < 0 || p->n_logprobs > LILY_MAX_LOGPROBS)
        return lily_err(st, LILY_EINVAL, "n_logprobs must be in [0, %d] (got %d)", LILY_MAX_LOGPROBS, p->n_logprobs);
    if (p->n_bias < 0 || (p->n_bias > 0 && (!p->bias_ids || !p->bias_values)))
        return lily_err(st, LILY_EINVAL, "logit bias: %d entries without their arrays", p->n_bias);
    for (int i = 0; i < p->n_bias; i++)
        if (!isfinite(p->bias_values[i]) || p->bias_ids[i] < 0)
            return lily_err(st, LILY_EINVAL, "logit bias for token %d must be finite", p->bias_ids[i]);
    return LILY_OK;
}

typedef struct {
    const float *logits;
    const lily_sampling *p;
    const int32_t *counts;
    const uint8_t *prompt_mask;
    const uint8_t *allowed;
    int penalize; /* any penalty active */
} pen_ctx;

/* Penalized logit of token i; -inf for non-finite inputs and tokens not allowed. */
static inline double pen_logit(const pen_ctx *c, int i) {
    float x = c->logits[i];
    if (!isfinite(x) || (c->allowed && !c->allowed[i])) return -INFINITY;
    if (!c->penalize) return x;
    int32_t n = c->counts ? c->counts[i] : 0;
    int seen = n > 0 || (c->prompt_mask && c->prompt_mask[i]);
    double z = x;
    if (seen && c->p->repetition_penalty != 1.0f)
        z = z > 0 ? z / c->p->repetition_penalty : z * c->p->repetition_penalty;
    if (n > 0) z -= c->p->presence_penalty + (double)c->p->frequency_penalty * n;
    return z;
}

/* The scans over the row skip, eight at a time, what cannot change their answer: a token
 * that no penalty touches has z = x, so one whose logit is not above the running best
 * (the max, the greedy choice, the top-k heap's worst) is passed over exactly as the
 * scalar loop would pass it. Penalized tokens (counts or prompt mask set) always stop the
 * skip; a disallowed token only lowers z, so the bound still holds. */
int lily_sampler_scan_all;

static float row_max_finite(const float *x, int n) {
#ifdef MM_HAVE_AVX2
    if (!lily_sampler_scan_all && cpu_mm_avx2_available()) return max_finite_avx2(x, n);
#endif
    float r = -INFINITY;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i]) && x[i] > r) r = x[i];
    return r;
}

/* The first i in [i, n) that may beat thr (see above), n when none. */
static int next_above(const pen_ctx *c, int i, int n, float thr) {
    const int32_t *cnt = c->penalize ? c->counts : NULL;
    const uint8_t *pm = c->penalize ? c->prompt_mask : NULL;
    if (lily_sampler_scan_all) return i;
#ifdef MM_HAVE_AVX2
    if (cpu_mm_avx2_available()) return next_above_avx2(c->logits, cnt, pm, i, n, thr);
#endif
    for (; i < n; i++)
        if (c->logits[i] > thr || (cnt && cnt[i]) || (pm && pm[i])) return i;
    return n;
}

/* The largest float not above d (d not NaN). */
static float float_below(double d) {
    float f = (float)d;
    if ((double)f > d) f = nextafterf(f, -INFINITY);
    return f;
}

/* A logit bound for a scaled threshold: every untouched logit x <= the result has
 * x * inv_t < z (rounding is monotonic), so next_above may skip it; -inf for z = -inf. */
static float scaled_below(double z, double inv_t) {
    if (z == -INFINITY) return -INFINITY;
    float f = float_below(z / inv_t);
    while (f > -INFINITY && (double)f * inv_t >= z) f = nextafterf(f, -INFINITY);
    return f;
}

/* Relative weight exp(d) of a scaled logit d = z - zmax <= 0. Single precision: the
 * weights need ~7 digits, and expf is several times faster than exp over a 250k row. */
#define W(d) ((double)expf((float)(d)))

typedef struct { double z; int32_t id; } cand;

static int cand_cmp(const void *a, const void *b) { /* z descending, id ascending */
    const cand *x = a, *y = b;
    if (x->z > y->z) return -1;
    if (x->z < y->z) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Sorts c[0..n) as cand_cmp does when the ids ascend on input (the top-p window gathers
 * them in id order): a stable LSD radix sort on z, 16 bits a pass, for a large window; a
 * nearly flat row puts most of the vocabulary in it, and qsort took ~30 ms there. Same
 * order, so the same draw. */
static void sort_window(cand *c, int n) {
    cand *tmp = n >= 4096 ? malloc(sizeof *tmp * (size_t)n) : NULL;
    size_t *cnt = tmp ? malloc(sizeof *cnt * 65536) : NULL;
    uint64_t *key = cnt ? malloc(sizeof *key * (size_t)n * 2) : NULL;
    if (!key) {
        free(tmp); free(cnt);
        qsort(c, (size_t)n, sizeof *c, cand_cmp);
        return;
    }
    uint64_t *ktmp = key + n;
    for (int i = 0; i < n; i++) { /* order-preserving bits of z (-0 as +0), complemented: z descending */
        double z = c[i].z == 0 ? 0.0 : c[i].z;
        uint64_t u;
        memcpy(&u, &z, sizeof u);
        u = (u >> 63) ? ~u : u | (1ull << 63);
        key[i] = ~u;
    }
    for (int shift = 0; shift < 64; shift += 16) {
        memset(cnt, 0, sizeof *cnt * 65536);
        for (int i = 0; i < n; i++) cnt[(key[i] >> shift) & 0xffff]++;
        if (cnt[(key[0] >> shift) & 0xffff] == (size_t)n) continue; /* one digit value: nothing moves */
        size_t pos = 0;
        for (int d = 0; d < 65536; d++) { size_t k = cnt[d]; cnt[d] = pos; pos += k; }
        for (int i = 0; i < n; i++) {
            size_t j = cnt[(key[i] >> shift) & 0xffff]++;
            tmp[j] = c[i];
            ktmp[j] = key[i];
        }
        memcpy(c, tmp, sizeof *c * (size_t)n);
        memcpy(key, ktmp, sizeof *key * (size_t)n);
    }
    free(tmp); free(cnt); free(key);
}

/* Top-n of the unmodified logits into out->top_*, plus the chosen token's logprob. */
static void fill_logprobs(const float *logits, int vocab, int n, double logz, lily_token *out) {
    if (n > vocab) n = vocab;
    out->n_top = 0;
    const pen_ctx raw = { logits, NULL, NULL, NULL, NULL, 0 };
    for (int i = 0; i < vocab && n > 0; i++) {
        if (out->n_top == n && (i = next_above(&raw, i, vocab, out->top_logprobs[n - 1])) >= vocab) break;
        float x = isfinite(logits[i]) ? logits[i] : -INFINITY;
        int k = out->n_top;
        /* insertion: strictly greater moves up, so earlier (lower) ids win ties */
        if (k == n && !(x > out->top_logprobs[k - 1])) continue;
        if (k < n) out->n_top = ++k;
        int j = k - 1;
        while (j > 0 && x > out->top_logprobs[j - 1]) {
            out->top_logprobs[j] = out->top_logprobs[j - 1];
            out->top_ids[j] = out->top_ids[j - 1];
            j--;
        }
        out->top_logprobs[j] = x;
        out->top_ids[j] = i;
    }
    for (int j = 0; j < out->n_top; j++) out->top_logprobs[j] = (float)(out->top_logprobs[j] - logz);
    float x = logits[out->id];
    out->logprob = isfinite(x) ? (float)(x - logz) : -INFINITY;
}

/* Draw among candidates c[0..n) (sorted), weights exp(z - zmax). */
static int32_t draw_sorted(const cand *c, int n, double zmax, double u) {
    double tot = 0;
    for (int i = 0; i < n; i++) tot += W(c[i].z - zmax);
    double t = u * tot, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += W(c[i].z - zmax);
        if (t < acc) return c[i].id;
    }
    return c[n - 1].id; /* rounding: the last kept token */
}

static lily_code sample_row(const float *logits, const float *row, int vocab, const lily_sampling *p, lily_rng *rng,
                            const int32_t *counts, const uint8_t *prompt_mask, const uint8_t *allowed, double logz,
                            double rmax, lily_token *out, lily_status *st);

lily_code lily_sample_logits_mask(const float *logits, int vocab, const lily_sampling *p,
                                  lily_rng *rng, const int32_t *counts,
                                  const uint8_t *prompt_mask, const uint8_t *allowed,
                                  lily_token *out, lily_status *st) {
    if (!logits || !out || vocab < 1) return lily_err(st, LILY_EINVAL, "sampler: no logits (vocab %d)", vocab);
    lily_code rc = lily_sampling_check(p, st);
    if (rc) return rc;
    memset(out, 0, sizeof *out);

    /* log-partition of the unmodified distribution, for logprobs */
    double rmax = row_max_finite(logits, vocab);
    if (rmax == -INFINITY) return lily_err(st, LILY_EINVAL, "sampler: logits row has no finite value");
    double rs = 0;
#ifdef MM_HAVE_AVX2
    if (cpu_mm_avx2_available()) rs = sum_exp_avx2(logits, vocab, (float)rmax); /* 5x faster over 248k */
    else
#endif
    for (int i = 0; i < vocab; i++)
        if (isfinite(logits[i])) rs += W(logits[i] - rmax);
    double logz = rmax + log(rs);

    /* logit_bias: a biased copy of the row drives the choice; logprobs keep the model's */
    float *biased = NULL;
    if (p->n_bias > 0) {
        if (!(biased = malloc(sizeof *biased * (size_t)vocab))) return lily_err(st, LILY_ENOMEM, "sampler: out of memory");
        memcpy(biased, logits, sizeof *biased * (size_t)vocab);
        for (int i = 0; i < p->n_bias; i++) {
            if (p->bias_ids[i] >= vocab) {
                free(biased);
                return lily_err(st, LILY_EINVAL, "logit bias for token %d, outside the vocabulary of %d", p->bias_ids[i], vocab);
            }
            biased[p->bias_ids[i]] += p->bias_values[i];
        }
    }
    rc = sample_row(logits, biased ? biased : logits, vocab, p, rng, counts, prompt_mask, allowed, logz, rmax, out, st);
    free(biased);
    return rc;
}

int lily_sampling_greedy(const lily_sampling *p) { return p->temperature <= 0 || p->top_k == 1; }

/* The choice over `row` (the logits, or their biased copy); logprobs from `logits`. */
static lily_code sample_row(const float *logits, const float *row, int vocab, const lily_sampling *p, lily_rng *rng,
                            const int32_t *counts, const uint8_t *prompt_mask, const uint8_t *allowed, double logz,
                            double rmax, lily_token *out, lily_status *st) {
    pen_ctx pc = { row, p, counts, prompt_mask, allowed,
                   (counts || prompt_mask) && (p->presence_penalty != 0 || p->frequency_penalty != 0 ||
                                               p->repetition_penalty != 1.0f) };

    if (lily_sampling_greedy(p)) {
        double best = -INFINITY;
        int32_t id = -1;
        if (!pc.penalize && !allowed && row == logits) { /* the first maximum of the raw row */
            float below = nextafterf((float)rmax, -INFINITY);
            for (id = next_above(&pc, 0, vocab, below); !(logits[id] == rmax); id = next_above(&pc, id + 1, vocab, below)) {}
            best = rmax;
        } else for (int i = 0; i < vocab; i++) {
            if (id >= 0 && (i = next_above(&pc, i, vocab, float_below(best))) >= vocab) break;
            double z = pen_logit(&pc, i);
            if (id < 0 || z > best) { best = z; id = i; }
        }
        if (best == -INFINITY)
            return lily_err(st, LILY_EINVAL, "sampler: every token is %s", allowed ? "excluded" : "penalized to -inf");
        out->id = id;
        fill_logprobs(logits, vocab, p->n_logprobs, logz, out);
        return LILY_OK;
    }
    if (!rng) return lily_err(st, LILY_EINVAL, "sampler: temperature > 0 needs an rng");

    double inv_t = 1.0 / p->temperature;
    double zmax = -INFINITY;
    for (int i = 0; (i = next_above(&pc, i, vocab, float_below(zmax))) < vocab; i++) {
        double z = pen_logit(&pc, i);
        if (z > zmax) zmax = z;
    }
    if (zmax == -INFINITY)
        return lily_err(st, LILY_EINVAL, "sampler: every token is %s", allowed ? "excluded" : "penalized to -inf");
    zmax *= inv_t;
    /* min-p is a fixed threshold on the scaled logit */
    double minp_thr = p->min_p > 0 ? zmax + log(p->min_p) : -INFINITY;
    int top_k = p->top_k > 0 && p->top_k < vocab ? p->top_k : 0;
    int top_p = p->top_p < 1.0f;
    double u = lily_rng_uniform(rng);

    if (!top_k && !top_p) { /* no sort: walk in id order */
        double tot = 0;
        for (int i = 0; i < vocab; i++) {
            double z = pen_logit(&pc, i) * inv_t;
            if (z >= minp_thr) tot += W(z - zmax);
        }
        double t = u * tot, acc = 0;
        int32_t last = -1;
        out->id = -1;
        for (int i = 0; i < vocab; i++) {
            double z = pen_logit(&pc, i) * inv_t;
            if (!(z >= minp_thr) || z == -INFINITY) continue;
            last = i;
            acc += W(z - zmax);
            if (t < acc) { out->id = i; break; }
        }
        if (out->id < 0) out->id = last;
        fill_logprobs(logits, vocab, p->n_logprobs, logz, out);
        return LILY_OK;
    }

    /* total mass over every token (top-p without top-k is relative to it), and the mass by
     * distance below zmax in 1/32 steps (to 64, then the rest), which sets the window */
#define HB 2048
    double total = 0, *hist = NULL, win_thr = -INFINITY;
    if (top_p && !top_k) {
        hist = calloc(HB + 1, sizeof *hist);
        if (!hist) return lily_err(st, LILY_ENOMEM, "sampler: out of memory");
        for (int i = 0; i < vocab; i++) {
            double d = zmax - pen_logit(&pc, i) * inv_t;
            if (!(d < INFINITY)) continue; /* -inf logits weigh nothing */
            double w = W(-d);
            total += w;
            hist[d < 64 ? (int)(d * 32) : HB] += w;
        }
    }

    cand *c = malloc(sizeof *c * (size_t)(top_k ? top_k : vocab));
    if (!c) { free(hist); return lily_err(st, LILY_ENOMEM, "sampler: out of memory"); }
    int n = 0;
    if (top_k) { /* one pass with a min-heap of the k best (worst at the root) */
        float thr = -INFINITY; /* once the heap is full: logits at most this cannot beat its worst */
        for (int i = 0; i < vocab; i++) {
            if (n == top_k && (i = next_above(&pc, i, vocab, thr)) >= vocab) break;
            double z = pen_logit(&pc, i) * inv_t;
            if (z == -INFINITY) continue;
            cand x = { z, i };
            if (n < top_k) { /* sift up */
                int k = n++;
                while (k > 0 && cand_cmp(&x, &c[(k - 1) / 2]) > 0) { c[k] = c[(k - 1) / 2]; k = (k - 1) / 2; }
                c[k] = x;
            } else if (cand_cmp(&x, &c[0]) < 0) { /* better than the worst kept: sift down */
                int k = 0;
                for (;;) {
                    int l = 2 * k + 1, r = l + 1, w = k;
                    const cand *wc = &x;
                    if (l < n && cand_cmp(&c[l], wc) > 0) { w = l; wc = &c[l]; }
                    if (r < n && cand_cmp(&c[r], wc) > 0) w = r;
                    if (w == k) break;
                    c[k] = c[w];
                    k = w;
                }
                c[k] = x;
            }
            if (n == top_k) thr = scaled_below(c[0].z, inv_t); /* beating the worst takes z > c[0].z */
        }
    } else { /* top-p alone: one gather of a window that holds the nucleus, from the histogram
              * (one bucket wider than needed; should its rounding still cut the nucleus short,
              * the walk below sees it and everything is gathered) */
        double need = p->top_p * total, m = 0;
        win_thr = -INFINITY;
        for (int b = 0; b < HB; b++) {
            m += hist[b];
            if (m >= need) { win_thr = b + 2 < HB ? zmax - (b + 2) / 32.0 : -INFINITY; break; }
        }
        if (win_thr < minp_thr) win_thr = minp_thr; /* min-p drops the rest anyway */
    }
    free(hist);
gather:
    if (!top_k) {
        n = 0;
        float gthr = scaled_below(win_thr, inv_t);
        for (int i = 0; (i = next_above(&pc, i, vocab, gthr)) < vocab; i++) {
            double z = pen_logit(&pc, i) * inv_t;
            if (z >= win_thr && z > -INFINITY) { c[n].z = z; c[n].id = i; n++; }
        }
    }
    if (top_k) qsort(c, (size_t)n, sizeof *c, cand_cmp);
    else sort_window(c, n);
    if (top_k && n > top_k) n = top_k;
    if (top_p) {
        if (top_k) {
            total = 0;
            for (int i = 0; i < n; i++) total += W(c[i].z - zmax);
        }
        double acc = 0, need = p->top_p * total;
        int keep = n, reached = 0;
        for (int i = 0; i < n && !reached; i++) {
            acc += W(c[i].z - zmax);
            if (acc >= need) { keep = i + 1; reached = 1; }
        }
        if (!reached && !top_k && win_thr > minp_thr && win_thr > -INFINITY) {
            win_thr = minp_thr; /* the window fell short of the nucleus: take all that min-p keeps */
            goto gather;
        }
        n = keep;
    }
    int keep = 1; /* min-p: a prefix, never empty since c[0] is the maximum */
    while (keep < n && c[keep].z >= minp_thr) keep++;
    n = keep;
    out->id = draw_sorted(c, n, zmax, u);
    free(c);
    fill_logprobs(logits, vocab, p->n_logprobs, logz, out);
    return LILY_OK;
}

lily_code lily_sample_logits_ex(const float *logits, int vocab, const lily_sampling *p,
                                lily_rng *rng, const int32_t *counts,
                                const uint8_t *prompt_mask, lily_token *out,
                                lily_status *st) {
    return lily_sample_logits_mask(logits, vocab, p, rng, counts, prompt_mask, NULL, out, st);
}

lily_code lily_sample_logits(const float *logits, int vocab, const lily_sampling *p,
                             lily_rng *rng, const int32_t *counts, lily_token *out,
                             lily_status *st) {
    return lily_sample_logits_mask(logits, vocab, p, rng, counts, NULL, NULL, out, st);
}
