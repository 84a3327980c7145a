/* lily check: replays a reference.safetensors (prefill, continuation, greedy generation)
 * and compares the logits and greedy tokens with the engine's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "lily.h"
#include "loader/safetensors.h"

static const st_tensor *need(const st_set *r, const char *name, st_dtype dt, lily_status *st) {
    const st_tensor *t = st_find(r, name);
    if (!t) { snprintf(st->msg, sizeof st->msg, "reference has no tensor '%s'", name); return NULL; }
    if (t->dtype != dt) { snprintf(st->msg, sizeof st->msg, "reference tensor '%s' has dtype %s", name, st_dtype_name(t->dtype)); return NULL; }
    return t;
}

static double rel_err(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    if (!isfinite(num)) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

int cli_check(int argc, char **argv) {
    const char *model = cli_opt(argc, argv, "--model"), *ref = cli_opt(argc, argv, "--reference");
    const char *backend = cli_opt(argc, argv, "--backend"), *tols = cli_opt(argc, argv, "--tol");
    const char *thr = cli_opt(argc, argv, "--threads");
    if (!model || !ref) {
        fprintf(stderr, "usage: lily check --model DIR --reference FILE [--backend cpu|cuda] [--tol 1e-4] [--threads N] [--rope-freq bf16|f32]\n");
        return 2;
    }
    lily_model_opts o;
    lily_model_opts_default(&o);
    o.backend = LILY_BACKEND_CPU;
    const char *rf = cli_opt(argc, argv, "--rope-freq");
    o.rope_bf16_freq = !rf || !strcmp(rf, "bf16"); /* the fixtures' convention */
    double tol = 1e-4;
    if (backend && !strcmp(backend, "cuda")) { o.backend = LILY_BACKEND_CUDA; tol = 1e-2; }
    else if (backend && strcmp(backend, "cpu")) { fprintf(stderr, "lily check: unknown backend '%s'\n", backend); return 2; }
    if (tols) tol = atof(tols);
    if (thr) o.n_threads = atoi(thr);
    lily_status st = { 0 };
    st_set r;
    if (st_open(ref, &r, &st)) { fprintf(stderr, "lily check: %s\n", st.msg); return 1; }
    const st_tensor *tp = need(&r, "prompt_ids", ST_I32, &st), *tlp = tp ? need(&r, "logits_prefill", ST_F32, &st) : NULL;
    const st_tensor *tc = tlp ? need(&r, "cont_ids", ST_I32, &st) : NULL, *tlc = tc ? need(&r, "logits_cont", ST_F32, &st) : NULL;
    const st_tensor *tg = tlc ? need(&r, "gen_ids", ST_I32, &st) : NULL, *tlg = tg ? need(&r, "logits_gen", ST_F32, &st) : NULL;
    if (!tlg) { fprintf(stderr, "lily check: %s\n", st.msg); st_close(&r); return 1; }
    int P = (int)tp->shape[0], C = (int)tc->shape[0], G = (int)tg->shape[0];
    int V = (int)tlp->shape[tlp->ndim - 1];
    o.max_ctx = P + C + G + 1;
    lily_model *m = NULL;
    if (lily_model_open(model, &o, &m, &st)) { fprintf(stderr, "lily check: %s\n", st.msg); st_close(&r); return 1; }
    lily_model_info info;
    lily_model_get_info(m, &info);
    int ok = 1;
    if (info.vocab_size != V || st_numel(tlp) != (int64_t)P * V || st_numel(tlc) != (int64_t)C * V || st_numel(tlg) != (int64_t)G * V) {
        fprintf(stderr, "lily check: reference shapes do not match the model (vocab %d)\n", info.vocab_size);
        lily_model_free(m); st_close(&r); return 1;
    }
    lily_session *s = NULL;
    if (lily_session_new(m, &s, &st)) { fprintf(stderr, "lily check: %s\n", st.msg); lily_model_free(m); st_close(&r); return 1; }
    float *lg = malloc((size_t)(P > C ? P : C) * V * sizeof(float));
    printf("model %s (%s, %s backend), reference %s, tolerance %g\n", model, info.layout, info.backend, ref, tol);
    const struct { const char *name; const st_tensor *ids, *logits; int n; } ph[2] = {
        { "prefill", tp, tlp, P }, { "continuation", tc, tlc, C } };
    for (int p = 0; p < 2 && ok; p++) {
        if (lily_session_feed(s, ph[p].ids->data, ph[p].n, lg, &st)) { fprintf(stderr, "lily check: %s\n", st.msg); ok = 0; break; }
        double e = rel_err(lg, ph[p].logits->data, (size_t)ph[p].n * V);
        int agree = 0;
        for (int i = 0; i < ph[p].n; i++)
            agree += argmax(lg + (size_t)i * V, V) == argmax((const float *)ph[p].logits->data + (size_t)i * V, V);
        int pass = e <= tol;
        printf("%-13s %4d tokens  rel err %.3e  argmax agrees %d/%d  %s\n", ph[p].name, ph[p].n, e, agree, ph[p].n, pass ? "ok" : "FAIL");
        ok &= pass;
    }
    if (ok) { /* greedy generation: our argmax must reproduce gen_ids */
        const int32_t *gen = tg->data;
        const float *refl = tlg->data;
        double num = 0, den = 0;
        int agree = 0, first_bad = -1;
        for (int i = 0; i < G; i++) {
            int mine = argmax(lily_session_logits(s), V);
            if (mine == gen[i]) agree++; else if (first_bad < 0) first_bad = i;
            if (lily_session_feed(s, &gen[i], 1, lg, &st)) { fprintf(stderr, "lily check: %s\n", st.msg); ok = 0; break; }
            for (int j = 0; j < V; j++) { double d = (double)lg[j] - refl[(size_t)i * V + j]; num += d * d; den += (double)refl[(size_t)i * V + j] * refl[(size_t)i * V + j]; }
        }
        double e = den > 0 ? sqrt(num / den) : INFINITY;
        if (!isfinite(num)) e = INFINITY;
        int pass = ok && e <= tol && agree == G;
        printf("%-13s %4d tokens  rel err %.3e  greedy tokens agree %d/%d%s  %s\n", "generation", G, e, agree, G,
               first_bad >= 0 ? " (first mismatch shown below)" : "", pass ? "ok" : "FAIL");
        if (first_bad >= 0) printf("  step %d: expected %d\n", first_bad, gen[first_bad]);
        ok &= pass;
    }
    printf("%s\n", ok ? "PASS" : "FAIL");
    free(lg);
    lily_session_free(s);
    lily_model_free(m);
    st_close(&r);
    return ok ? 0 : 1;
}
