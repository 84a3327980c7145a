/* lily run: generate text from a prompt (raw, or wrapped in the chat template). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "cli/cli.h"
#include "lily.h"
#include "text/chat.h"
#include "tokenizer/tokenizer.h"
#include "util/util.h"

typedef struct { tok_stream *ts; } run_ctx;

static int on_token(void *user, const lily_token *t) {
    run_ctx *r = user;
    const char *txt; size_t len;
    if (tok_stream_push(r->ts, t->id, &txt, &len) == LILY_OK && len) { fwrite(txt, 1, len, stdout); fflush(stdout); }
    return 0;
}

int cli_run(int argc, char **argv) {
    const char *model = cli_opt(argc, argv, "--model"), *prompt = cli_opt(argc, argv, "--prompt");
    const char *ns = cli_opt(argc, argv, "-n"), *temp = cli_opt(argc, argv, "--temp"), *seed = cli_opt(argc, argv, "--seed");
    const char *backend = cli_opt(argc, argv, "--backend"), *ctx = cli_opt(argc, argv, "--ctx-len");
    if (!model) {
        fprintf(stderr, "usage: lily run --model DIR [--prompt TEXT] [--raw] [-n N] [--temp T] [--seed N] [--top-k K] [--top-p P]\n"
                        "                [--min-p P] [--repetition-penalty R] [--presence-penalty X] [--frequency-penalty X]\n"
                        "                [--backend cpu|cuda] [--ctx-len N]\n");
        return 2;
    }
    lily_status st = { 0 };
    tok_tokenizer *tok = NULL;
    if (tok_load(model, &tok, &st)) { fprintf(stderr, "lily run: tokenizer: %s\n", st.msg); return 1; }
    lily_model_opts o;
    lily_model_opts_default(&o);
    if (ctx) o.max_ctx = atoi(ctx);
    if (backend) o.backend = !strcmp(backend, "cuda") ? LILY_BACKEND_CUDA : LILY_BACKEND_CPU;
    lily_model *m = NULL;
    if (lily_model_open(model, &o, &m, &st)) { fprintf(stderr, "lily run: %s\n", st.msg); tok_free(tok); return 1; }
    const char *text = prompt ? prompt : "Hello";
    char *rendered = NULL;
    chat_span *plain = NULL;
    int n_plain = 0;
    if (!cli_flag(argc, argv, "--raw")) { /* wrap in the chat template as a user turn */
        json_t *req = json_pack("{s:[{s:s,s:s}]}", "messages", "role", "user", "content", text);
        if (chat_render_ex(req, CHAT_TEMPLATE_QWEN36, &rendered, &plain, &n_plain, &st)) {
            fprintf(stderr, "lily run: %s\n", st.msg);
            json_decref(req); lily_model_free(m); tok_free(tok); return 1;
        }
        json_decref(req);
        text = rendered;
    }
    int32_t *ids = NULL; int n = 0;
    int rc = 1;
    lily_session *s = NULL;
    run_ctx r = { 0 };
    /* template text may hold special tokens, the user's text never */
    lily_code erc = rendered ? chat_encode(tok, text, plain, n_plain, NULL, NULL, 0, &ids, &n, &st)
                             : tok_encode(tok, text, strlen(text), 0, &ids, &n, &st);
    free(plain);
    if (erc || !n ||
        lily_session_new(m, &s, &st) || tok_stream_new(tok, 1, &r.ts, &st)) {
        fprintf(stderr, "lily run: %s\n", n ? st.msg : "empty prompt");
        goto out;
    }
    double t0 = lily_now();
    if (lily_session_prefill(s, ids, n, NULL, &st)) { fprintf(stderr, "lily run: %s\n", st.msg); goto out; }
    double t1 = lily_now();
    lily_sampling p;
    lily_sampling_default(&p);
    p.temperature = temp ? (float)atof(temp) : 0.0f;
    p.seed = seed ? strtoull(seed, NULL, 10) : 0;
    /* the server's names; lily_session_generate refuses values out of range */
    const char *v;
    if ((v = cli_opt(argc, argv, "--top-k"))) p.top_k = atoi(v);
    if ((v = cli_opt(argc, argv, "--top-p"))) p.top_p = (float)atof(v);
    if ((v = cli_opt(argc, argv, "--min-p"))) p.min_p = (float)atof(v);
    if ((v = cli_opt(argc, argv, "--repetition-penalty"))) p.repetition_penalty = (float)atof(v);
    if ((v = cli_opt(argc, argv, "--presence-penalty"))) p.presence_penalty = (float)atof(v);
    if ((v = cli_opt(argc, argv, "--frequency-penalty"))) p.frequency_penalty = (float)atof(v);
    int made = 0;
    if (lily_session_generate(s, &p, ns ? atoi(ns) : 64, on_token, &r, &made, &st)) { fprintf(stderr, "\nlily run: %s\n", st.msg); goto out; }
    const char *txt; size_t len;
    if (tok_stream_flush(r.ts, &txt, &len) == LILY_OK && len) fwrite(txt, 1, len, stdout);
    double t2 = lily_now();
    fprintf(stderr, "\n[prompt %d tokens %.1f tok/s, generated %d tokens %.1f tok/s]\n", n, n / (t1 - t0), made, made / (t2 - t1));
    rc = 0;
out:
    free(ids);
    free(rendered);
    if (r.ts) tok_stream_free(r.ts);
    lily_session_free(s);
    lily_model_free(m);
    tok_free(tok);
    return rc;
}
