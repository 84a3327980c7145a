/* lily-bench: prompt processing and decode speed on the GPU, modelled on llama-bench.
 *
 *   lily-bench [--model DIR [--load]] [--tests pp512,pp2048,pp8192,tg128,tg128@4096,tg128@32768,tg32x8@1024,tg32x8l@1024]
 *              [--reps 5] [--warmup 1] [--bw 4.26e12] [--flops 7.9e14] [-o md|csv|json] [--out FILE]
 *   tgNs, tgNs@D: the same decode with sampling on the GPU (T 0.8, top-k 40, top-p 0.95,
 *   min-p 0.05, penalties, 5 logprobs) instead of the argmax
 *
 * Without --model it times the Qwen3.6-35B-A3B shape; with --model it reads that folder's
 * config.json and, with --load, its weights (otherwise random 4-bit weights are made in GPU
 * memory: no checkpoint needed). Each test: warm-up runs, then the median of the repeats,
 * timed with CUDA events. The floor is max(bytes / bandwidth, FLOPs / matrix rate) with the
 * bytes a 4-bit group-64 model must read (every weight once for a prefill chunk that
 * touches every expert, the active weights for a decode step, plus caches).
 * tgNxB@D: N decode rounds of B sessions (each D tokens in) fed together through
 * lcuda_forward_batch, as lily-server's scheduler does; timed on the host clock (each round
 * ends with its [B][vocab] logits in host memory); t/s counts the tokens of all B sessions. tgNxBl@D:
 * the same B sessions in the batched device loop (no logits to the host, the tokens chosen on the
 * GPU), as lily-server's concurrent streams now decode; tgNxBls@D sampling there. ppNxB: B sessions
 * prefilling N tokens each, their passes side by side (as lily-server's arrivals); ppNxBq: one after
 * the other (host clock; t/s counts all B sessions' tokens). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cuda/cuda_backend.h"
#include "loader/config.h"
#include "util/util.h"

static const char *opt(int argc, char **argv, const char *name) {
    size_t n = strlen(name);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], name) && i + 1 < argc) return argv[i + 1];
        if (!strncmp(argv[i], name, n) && argv[i][n] == '=') return argv[i] + n + 1;
    }
    return NULL;
}
static int flag(int argc, char **argv, const char *name) {
    for (int i = 1; i < argc; i++) if (!strcmp(argv[i], name)) return 1;
    return 0;
}

static void preset_35b(lily_config *c) {
    memset(c, 0, sizeof *c);
    c->hidden = 2048; c->n_layers = 40; c->vocab = 248320;
    for (int i = 0; i < 40; i++) c->full_attn[i] = i % 4 == 3;
    c->n_heads = 16; c->n_kv_heads = 2; c->head_dim = 256; c->rot_dim = 64; c->rope_theta = 1e7;
    c->attn_output_gate = 1;
    c->lin_nk = 16; c->lin_nv = 32; c->lin_dk = 128; c->lin_dv = 128; c->conv_k = 4;
    c->n_experts = 256; c->top_k = 8; c->moe_inter = 512; c->shared_inter = 512;
    c->eps = 1e-6; c->q_bits = 4; c->q_group = 64;
}

/* bytes of a 4-bit (or 8-bit) group-64 matrix with bf16 scales and biases */
static double qb(double rows, double cols, int bits) { return rows * cols * (bits / 8.0 + 4.0 / 64); }

typedef struct { double all, active, flops_tok, experts; } model_bytes; /* experts: one expert of every layer */

static model_bytes count(const lily_config *c) {
    model_bytes b = { 0, 0, 0, 0 };
    double H = c->hidden, E = c->n_experts, K = c->top_k, I = c->moe_inter, SI = c->shared_inter;
    double cd = cfg_conv_dim(c), vd = cfg_val_dim(c), nv = c->lin_nv, hd = c->head_dim;
    double mix_att = qb(c->n_heads * 2 * hd, H, 4) + 2 * qb(c->n_kv_heads * hd, H, 4) + qb(H, c->n_heads * hd, 4);
    double mix_gdn = qb(cd, H, 4) + qb(vd, H, 4) + 2 * qb(nv, H, 4) + qb(H, vd, 4);
    double expert = 2 * qb(I, H, 4) + qb(H, I, 4), shared = SI ? 2 * qb(SI, H, 4) + qb(H, SI, 4) + qb(1, H, 8) : 0;
    double router = qb(E, H, 8);
    for (int l = 0; l < c->n_layers; l++) {
        double mix = c->full_attn[l] ? mix_att : mix_gdn;
        b.all += mix + router + E * expert + shared;
        b.active += mix + router + K * expert + shared;
        b.experts += expert;
    }
    b.all += 2 * qb(c->vocab, H, 4);
    b.active += qb(c->vocab, H, 4) + H * 0.5625; /* lm_head + one embedding row */
    /* 2 FLOPs per active weight (lm_head counted once per token) */
    b.flops_tok = 2 * b.active / 0.5625;
    return b;
}

/* "pp512", "tg128@4096", "tg32x8@1024" -> prompt?, tokens, batch (1 = plain decode), depth */
static int parse_test(const char *t, int *pp, int *n, int *nb, int *d) {
    *n = 0; *nb = 1; *d = 0;
    *pp = t[0] == 'p';
    if (*pp) {
        const char *x = strchr(t, 'x');
        if (x && (sscanf(x, "x%d", nb) != 1 || *nb < 1 || *nb > 64)) return 0;
        return sscanf(t, "pp%d", n) == 1 && *n > 0;
    }
    if (strncmp(t, "tg", 2) || sscanf(t, "tg%d", n) != 1 || *n < 1) return 0;
    const char *x = strchr(t, 'x'), *at = strchr(t, '@');
    if (x && (sscanf(x, "x%d", nb) != 1 || *nb < 1 || *nb > 64)) return 0;
    if (at && (sscanf(at, "@%d", d) != 1 || *d < 0)) return 0;
    return 1;
}

/* nb sessions, each d tokens in, decoding n rounds together; host-clock milliseconds. */
static lily_code time_batch(lcuda_session **ss, int nb, int n, int d, int vocab, float *logits, double *ms, lily_status *st) {
    int pos[64];
    float *rows[64]; /* as lily_decode_batch: each session's row to its own (page-locked) buffer */
    for (int i = 0; i < nb; i++) rows[i] = logits + (size_t)i * vocab;
    int32_t ids[64];
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)d;
    for (int i = 0; i < nb; i++) {
        lcuda_session_reset(ss[i]);
        double t;
        if (d) { lily_code rc = lcuda_time_forward(ss[i], NULL, d, 0, &t, st); if (rc) return rc; }
        pos[i] = d;
    }
    double t0 = lily_now();
    for (int r = 0; r < n; r++) {
        for (int i = 0; i < nb; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; ids[i] = (int32_t)(x % (uint64_t)vocab); }
        lily_code rc = lcuda_forward_batch(ss, ids, pos, nb, rows, st);
        if (rc) return rc;
        for (int i = 0; i < nb; i++) pos[i]++;
    }
    *ms = (lily_now() - t0) * 1e3;
    return LILY_OK;
}

/* The same rounds in the batched device loop (lcuda_generate_batch: tokens chosen and fed on the
 * GPU, no logits copied, the host a step behind); p NULL greedy, else every row samples with p. */
static lily_code time_batch_loop(lcuda_session **ss, int nb, int n, int d, int vocab, float *logits, const lily_sampling *p,
                                 double *ms, lily_status *st) {
    lcuda_batch_row rows[64];
    float *lg[64];
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)d;
    for (int i = 0; i < nb; i++) {
        lcuda_session_reset(ss[i]);
        double t;
        if (d) { lily_code rc = lcuda_time_forward(ss[i], NULL, d, 0, &t, st); if (rc) return rc; }
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        rows[i] = (lcuda_batch_row){ d, (int32_t)(x % (uint64_t)vocab), p, NULL };
        lg[i] = logits + (size_t)i * vocab;
    }
    int steps = 0, fed = 0;
    double t0 = lily_now();
    lily_code rc = lcuda_generate_batch(ss, rows, nb, n, NULL, NULL, lg, &steps, &fed, st);
    *ms = (lily_now() - t0) * 1e3;
    return rc;
}

/* nb sessions prefilling n tokens each (one pass each, at most the chunk): side by side on their own
 * streams (lcuda_forward_begin for all, then lcuda_forward_wait), as lily_prefill_batch runs the
 * server's arrivals, or with seq one after the other, as before it; host-clock milliseconds. */
static lily_code time_prefills(lcuda_session **ss, int nb, int n, int vocab, float *logits, int seq, double *ms, lily_status *st) {
    int32_t *ids = malloc((size_t)nb * n * sizeof *ids);
    if (!ids) return lily_err(st, LILY_ENOMEM, "out of memory");
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    for (int i = 0; i < nb * n; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; ids[i] = (int32_t)(x % (uint64_t)vocab); }
    for (int i = 0; i < nb; i++) lcuda_session_reset(ss[i]);
    lily_code rc = LILY_OK;
    double t0 = lily_now();
    for (int i = 0; i < nb && !rc; i++) {
        rc = lcuda_forward_begin(ss[i], ids + (size_t)i * n, n, 0, st);
        if (!rc && seq) rc = lcuda_forward_wait(ss[i], logits + (size_t)i * vocab, st);
    }
    for (int i = 0; i < nb && !rc && !seq; i++) rc = lcuda_forward_wait(ss[i], logits + (size_t)i * vocab, st);
    *ms = (lily_now() - t0) * 1e3;
    free(ids);
    return rc;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (flag(argc, argv, "--help") || flag(argc, argv, "-h")) {
        fprintf(stderr, "usage: lily-bench [--model DIR [--load]] [--tests pp512,pp2048,pp8192,tg128,tg128@4096,tg128@32768,tg32x8@1024,tg32x8l@1024]\n"
                        "                  [--reps 5] [--warmup 1] [--bw 4.26e12] [--flops 7.9e14] [-o md|csv|json] [--out FILE] [--profile]\n");
        return 2;
    }
    lily_env_note("lily-bench");
    const char *model = opt(argc, argv, "--model"), *tests = opt(argc, argv, "--tests");
    const char *fmt = opt(argc, argv, "-o"), *outp = opt(argc, argv, "--out");
    int reps = opt(argc, argv, "--reps") ? atoi(opt(argc, argv, "--reps")) : 5;
    int warm = opt(argc, argv, "--warmup") ? atoi(opt(argc, argv, "--warmup")) : 1;
    double bw = opt(argc, argv, "--bw") ? atof(opt(argc, argv, "--bw")) : 4.26e12;
    double peak = opt(argc, argv, "--flops") ? atof(opt(argc, argv, "--flops")) : 7.9e14;
    if (!tests) tests = "pp512,pp2048,pp8192,tg128,tg128@4096,tg128@32768";
    if (!fmt) fmt = "md";
    if (reps < 1) reps = 1;
    char why[256];
    if (!lcuda_available(why, sizeof why)) { fprintf(stderr, "lily-bench: %s\n", why); return 1; }
    lily_status st = { 0 };
    lily_config cfg;
    if (model) { if (cfg_load(model, &cfg, &st)) { fprintf(stderr, "lily-bench: %s\n", st.msg); return 1; } }
    else preset_35b(&cfg);
    /* the largest context any test reaches */
    int max_ctx = 0, max_nb = 1;
    char list[512];
    snprintf(list, sizeof list, "%s", tests);
    for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
        int pp, n, nb, d;
        if (parse_test(t, &pp, &n, &nb, &d)) { if (n + d > max_ctx) max_ctx = n + d; if (nb > max_nb) max_nb = nb; }
        else { fprintf(stderr, "lily-bench: unknown test '%s'\n", t); return 2; }
    }
    max_ctx += 16;
    lcuda_model *m = NULL;
    double t0 = lily_now();
    if (model && flag(argc, argv, "--load")) {
        lily_weights w;
        if (lw_load(model, &w, &st) || lcuda_model_new(&w, max_ctx, 1, NULL, NULL, &m, &st)) { fprintf(stderr, "lily-bench: %s\n", st.msg); return 1; }
    } else if (lcuda_model_random(&cfg, max_ctx, 1, &m, &st)) { fprintf(stderr, "lily-bench: %s\n", st.msg); return 1; }
    fprintf(stderr, "model ready in %.1f s: %.2f GB on the GPU, context %d\n", lily_now() - t0, lcuda_model_bytes(m) / 1e9, max_ctx);
    lcuda_session *s = NULL, *bs[64] = { NULL };
    if (lcuda_session_new(m, &s, &st)) { fprintf(stderr, "lily-bench: %s\n", st.msg); return 1; }
    bs[0] = s;
    for (int i = 1; i < max_nb; i++)
        if (lcuda_session_new(m, &bs[i], &st)) { fprintf(stderr, "lily-bench: session %d: %s\n", i + 1, st.msg); return 1; }
    float *blg = max_nb > 1 || strchr(tests, 'x') ? lcuda_host_alloc((size_t)max_nb * cfg.vocab * sizeof(float)) : NULL;
    const int prof = flag(argc, argv, "--profile");
    if (prof) { /* where the time goes, stage by stage (events between launches, no graph) */
        static char rep[16384];
        int Ts[3] = { 1, 1, 512 }, Ps[3] = { 0, max_ctx > 4200 ? 4096 : 0, 0 };
        for (int i = 0; i < 3; i++) {
            if (lcuda_profile(s, Ts[i], Ps[i], rep, sizeof rep, &st) || lcuda_profile(s, Ts[i], Ps[i], rep, sizeof rep, &st)) {
                fprintf(stderr, "lily-bench: profile: %s\n", st.msg);
                return 1;
            }
            printf("%s\n", rep);
        }
    }
    model_bytes mb = count(&cfg);
    double kv_tok = 2.0 * cfg_n_full(&cfg) * cfg.n_kv_heads * cfg.head_dim * 4; /* fp32 K+V per context token */
    int n_lin = cfg.n_layers - cfg_n_full(&cfg);
    double state = 2.0 * n_lin * cfg.lin_nv * cfg.lin_dk * cfg.lin_dv * 4; /* read + write */
    FILE *out = outp ? fopen(outp, "w") : stdout;
    if (!out) { fprintf(stderr, "lily-bench: cannot write %s\n", outp); return 1; }
    if (!strcmp(fmt, "csv")) fprintf(out, "model,test,tokens,depth,reps,median_ms,tok_s,eff_GB_s,floor_tok_s,pct_floor\n");
    else if (!strcmp(fmt, "json")) fprintf(out, "[\n");
    else fprintf(out, "| model | test | t/s | ms | eff. GB/s | floor t/s | %% of floor |\n| --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
    const char *mname = model ? model : "qwen3.6-35b-a3b-shape (random 4-bit on GPU)";
    int first = 1, rc = 0;
    snprintf(list, sizeof list, "%s", tests);
    for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
        int pp, n, nb, d, batched = strchr(t, 'x') != NULL;
        parse_test(t, &pp, &n, &nb, &d);
        /* tgNs: decode with sampling on the GPU (typical chat settings, 5 logprobs); tgNxBl@D: the batch
         * in the batched device loop (lcuda_generate_batch), tgNxBls@D sampled there */
        int sampled = !pp && strchr(t, 's') != NULL, loop = batched && strchr(t, 'l') != NULL;
        lily_sampling sp;
        lily_sampling_default(&sp);
        sp.temperature = 0.8f; sp.top_k = 40; sp.top_p = 0.95f; sp.min_p = 0.05f;
        sp.presence_penalty = 0.5f; sp.repetition_penalty = 1.05f; sp.n_logprobs = 5;
        double *ms = calloc((size_t)reps, sizeof *ms);
        for (int r = -warm; r < reps; r++) {
            double x = 0;
            lcuda_session_reset(s);
            if (batched && pp) { if (!blg || time_prefills(bs, nb, n, cfg.vocab, blg, strchr(t, 'q') != NULL, &x, &st)) goto fail; }
            else if (batched && loop) { if (!blg || time_batch_loop(bs, nb, n, d, cfg.vocab, blg, sampled ? &sp : NULL, &x, &st)) goto fail; }
            else if (batched) { if (!blg || time_batch(bs, nb, n, d, cfg.vocab, blg, &x, &st)) goto fail; }
            else if (pp) { if (lcuda_time_forward(s, NULL, n, 0, &x, &st)) goto fail; }
            else {
                if (d && lcuda_time_forward(s, NULL, d, 0, &x, &st)) goto fail;
                if (lcuda_time_decode(s, d, n, sampled ? &sp : NULL, &x, &st)) goto fail;
            }
            if (r >= 0) ms[r] = x;
        }
        qsort(ms, (size_t)reps, sizeof *ms, cmp_d);
        double med = reps % 2 ? ms[reps / 2] : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2]);
        double tps = (double)n * nb / (med / 1e3), bytes, floor_s;
        if (batched && pp) {
            /* each pass reads the dense weights and the experts its n tokens route to */
            double E = cfg.n_experts, touched = E * (1 - pow(1 - cfg.top_k / E, n));
            bytes = nb * (mb.active + (touched - cfg.top_k) * mb.experts + n * kv_tok);
            floor_s = bytes / bw;
        } else if (batched) {
            /* a round reads the dense weights once and each expert the nb tokens route to once */
            double E = cfg.n_experts, touched = E * (1 - pow(1 - cfg.top_k / E, nb));
            bytes = n * (mb.active + (touched - cfg.top_k) * mb.experts + nb * state) + nb * kv_tok * ((double)n * d + (double)n * n / 2);
            floor_s = bytes / bw;
        } else if (pp) {
            /* every weight once per chunk (a big chunk routes to every expert), the KV written */
            double chunks = ceil(n / 2048.0);
            bytes = chunks * mb.all + n * kv_tok;
            double fl = n * mb.flops_tok + 4.0 * cfg_n_full(&cfg) * cfg.n_heads * cfg.head_dim * (double)n * n / 2;
            floor_s = fmax(bytes / bw, fl / peak);
        } else {
            bytes = n * (mb.active + state) + kv_tok * ((double)n * d + (double)n * n / 2);
            floor_s = bytes / bw;
        }
        double ftps = (double)n * nb / floor_s, gbs = bytes / (med / 1e3) / 1e9;
        if (!strcmp(fmt, "csv")) fprintf(out, "%s,%s,%d,%d,%d,%.3f,%.1f,%.1f,%.1f,%.1f\n", mname, t, n, d, reps, med, tps, gbs, ftps, 100 * tps / ftps);
        else if (!strcmp(fmt, "json")) fprintf(out, "%s  {\"model\": \"%s\", \"test\": \"%s\", \"tokens\": %d, \"depth\": %d, \"reps\": %d, \"median_ms\": %.3f, \"tok_s\": %.1f, \"eff_GB_s\": %.1f, \"floor_tok_s\": %.1f, \"pct_floor\": %.1f}",
                                                first ? "" : ",\n", mname, t, n, d, reps, med, tps, gbs, ftps, 100 * tps / ftps);
        else fprintf(out, "| %s | %s | %.1f | %.2f | %.0f | %.0f | %.1f |\n", mname, t, tps, med, gbs, ftps, 100 * tps / ftps);
        fflush(out);
        first = 0;
        free(ms);
        /* --profile with a batch test: one more round of the batch, an event after each stage
         * (no graph, as the batch runs), printed after the row */
        if (pp && !batched && prof && n <= 2048) { /* --profile with a prompt test: its pass stage by stage */
            static char rep[16384];
            if (lcuda_profile(s, n, 0, rep, sizeof rep, &st) || lcuda_profile(s, n, 0, rep, sizeof rep, &st)) goto fail;
            fprintf(out, "\n%s\n", rep);
        }
        if (batched && !pp && prof) {
            static char rep[16384];
            int32_t ids[64];
            int pos[64];
            float *rows[64];
            for (int i = 0; i < nb; i++) { ids[i] = (int32_t)((i * 7919u + 17u) % (unsigned)cfg.vocab); pos[i] = d + n; rows[i] = blg + (size_t)i * cfg.vocab; }
            if (lcuda_profile_batch(bs, ids, pos, nb, rows, rep, sizeof rep, &st)) goto fail;
            fprintf(out, "\n%s\n", rep);
        }
        continue;
    fail:
        fprintf(stderr, "lily-bench: %s: %s\n", t, st.msg);
        free(ms);
        rc = 1;
        break;
    }
    if (!strcmp(fmt, "json")) fprintf(out, "\n]\n");
    if (out != stdout) fclose(out);
    for (int i = 0; i < max_nb; i++) lcuda_session_free(bs[i]);
    lcuda_host_free(blg);
    lcuda_model_free(m);
    return rc;
}
