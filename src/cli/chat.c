/* lily chat: a conversation in the terminal. Each turn renders the whole conversation with
 * the checkpoint's chat template and prefills it into one session, so only the new turn is
 * computed: the prefill keeps a snapshot where the last turn begins, which is where the
 * next rendering diverges (Qwen3.6 drops the old turn's reasoning), exactly as the server
 * does. Reasoning is shown dimmed on a terminal; lines starting with '/' are commands. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli/cli.h"
#include "lily.h"
#include "text/chat.h"
#include "tokenizer/tokenizer.h"
#include "util/util.h"

typedef struct {
    tok_stream *ts;
    parse_stream *ps;
    json_t *deltas;
    int tty, in_reasoning;
    int32_t im_end;
    const lily_model *m;
    char *text;               /* everything generated this turn */
    size_t n, cap;
} chat_ctx;

static void show(chat_ctx *c) {
    size_t i;
    json_t *d;
    json_array_foreach(c->deltas, i, d) {
        const char *r = json_string_value(json_object_get(d, "reasoning_content"));
        const char *t = json_string_value(json_object_get(d, "content"));
        if (r) {
            if (!c->in_reasoning) fputs(c->tty ? "\x1b[2m" : "[thinking] ", stdout);
            c->in_reasoning = 1;
            fputs(r, stdout);
        }
        if (t) {
            if (c->in_reasoning) fputs(c->tty ? "\x1b[0m\n" : "\n[/thinking]\n", stdout);
            c->in_reasoning = 0;
            fputs(t, stdout);
        }
    }
    json_array_clear(c->deltas);
    fflush(stdout);
}

static void add_text(chat_ctx *c, const char *s, size_t len) {
    if (c->n + len + 1 > c->cap) {
        size_t cap = c->cap ? c->cap : 256;
        while (cap < c->n + len + 1) cap *= 2;
        char *b = realloc(c->text, cap);
        if (!b) return;
        c->text = b;
        c->cap = cap;
    }
    memcpy(c->text + c->n, s, len);
    c->n += len;
    c->text[c->n] = 0;
}

static int on_token(void *user, const lily_token *t) {
    chat_ctx *c = user;
    if (t->id == c->im_end || lily_model_is_eos(c->m, t->id)) return 1;
    const char *txt;
    size_t len;
    if (tok_stream_push(c->ts, t->id, &txt, &len) == LILY_OK && len) {
        add_text(c, txt, len);
        parse_stream_feed(c->ps, txt, len, c->deltas, NULL);
        show(c);
    }
    return 0;
}

static const char usage[] =
    "usage: lily chat --model DIR [--system TEXT] [--no-think] [--temp T] [--top-p P] [--seed N]\n"
    "                 [-n N] [--ctx-len N] [--backend cpu|cuda] [--template qwen3.6|qwen3.5|qwen3]\n"
    "Type a message and Enter. Commands: /reset (new conversation), /exit.\n";

int cli_chat(int argc, char **argv) {
    const char *model = cli_opt(argc, argv, "--model");
    if (!model) { fputs(usage, stderr); return 2; }
    const char *sys = cli_opt(argc, argv, "--system"), *temp = cli_opt(argc, argv, "--temp");
    const char *top_p = cli_opt(argc, argv, "--top-p"), *seed = cli_opt(argc, argv, "--seed");
    const char *ns = cli_opt(argc, argv, "-n"), *ctx = cli_opt(argc, argv, "--ctx-len");
    const char *backend = cli_opt(argc, argv, "--backend"), *tname = cli_opt(argc, argv, "--template");
    int no_think = cli_flag(argc, argv, "--no-think");
    lily_status st = { 0 };
    chat_template_kind kind = chat_template_for_dir(model);
    if (tname && chat_template_from_name(tname, &kind, &st)) { fprintf(stderr, "lily chat: %s\n", st.msg); return 2; }
    tok_tokenizer *tok = NULL;
    if (tok_load(model, &tok, &st)) { fprintf(stderr, "lily chat: tokenizer: %s\n", st.msg); return 1; }
    lily_model_opts o;
    lily_model_opts_default(&o);
    o.max_ctx = ctx ? atoi(ctx) : 8192;
    if (backend) o.backend = !strcmp(backend, "cuda") ? LILY_BACKEND_CUDA : LILY_BACKEND_CPU;
    lily_model *m = NULL;
    lily_session *s = NULL;
    if (lily_model_open(model, &o, &m, &st) || lily_session_new(m, &s, &st)) {
        fprintf(stderr, "lily chat: %s\n", st.msg);
        lily_model_free(m);
        tok_free(tok);
        return 1;
    }
    lily_model_info info;
    lily_model_get_info(m, &info);
    lily_sampling p;
    lily_sampling_default(&p);
    p.temperature = temp ? (float)atof(temp) : info.gen_temperature >= 0 ? info.gen_temperature : 0.7f;
    p.top_p = top_p ? (float)atof(top_p) : info.gen_top_p > 0 && info.gen_top_p <= 1 ? info.gen_top_p : 1.0f;
    p.top_k = info.gen_top_k > 0 ? info.gen_top_k : 0;
    p.min_p = info.gen_min_p >= 0 && info.gen_min_p <= 1 ? info.gen_min_p : 0;
    p.seed = seed ? strtoull(seed, NULL, 10) : (uint64_t)(lily_now() * 1e6);
    int max_tokens = ns ? atoi(ns) : 2048;

    chat_ctx c = { .tty = isatty(1), .m = m, .im_end = tok_id(tok, "<|im_end|>"), .deltas = json_array() };
    int32_t im_start = tok_id(tok, "<|im_start|>");
    json_t *msgs = json_array();
    if (sys) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", sys));
    char *line = NULL;
    size_t line_cap = 0;
    int rc = 0;
    if (isatty(0)) fprintf(stderr, "lily chat: %s (%s, template %s). /reset starts over, /exit quits.\n", model,
                           info.backend, chat_template_name(kind));
    for (;;) {
        if (isatty(0)) { fputs("> ", stdout); fflush(stdout); }
        ssize_t got = getline(&line, &line_cap, stdin);
        if (got < 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (!got) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            json_array_clear(msgs);
            if (sys) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", sys));
            fputs("[new conversation]\n", stdout);
            continue;
        }
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", line));
        json_t *req = json_pack("{s:O}", "messages", msgs);
        if (no_think) json_object_set_new(req, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", 0));
        char *text = NULL;
        chat_span *plain = NULL;
        int n_plain = 0, n = 0, reused = 0, made = 0;
        int32_t *ids = NULL;
        chat_parse_opts po;
        chat_parse_opts_for(req, kind, &po);
        po.tools = NULL;
        lily_code e = chat_render_ex(req, kind, &text, &plain, &n_plain, &st);
        if (!e) e = chat_encode(tok, text, plain, n_plain, NULL, NULL, 0, &ids, &n, &st);
        free(plain);
        free(text);
        int mark = 0; /* where the last turn begins: the next rendering diverges there */
        for (int i = n - 1; i > 0 && im_start >= 0; i--)
            if (ids[i] == im_start) { mark = i; break; }
        double t0 = lily_now(), t1 = t0;
        if (!e && n + 1 >= o.max_ctx)
            e = lily_err(&st, LILY_ERANGE, "the conversation (%d tokens) fills the context (%d); /reset", n, o.max_ctx);
        if (!e) e = lily_session_prefill_ex(s, ids, n, mark ? &mark : NULL, mark ? 1 : 0, 1, &reused, &st);
        if (!e) e = tok_stream_new(tok, 1, &c.ts, &st);
        if (!e) e = parse_stream_new(&po, &c.ps, &st);
        if (!e) {
            t1 = lily_now();
            c.n = 0;
            c.in_reasoning = 0;
            int room = o.max_ctx - n;
            e = lily_session_generate(s, &p, max_tokens < room ? max_tokens : room, on_token, &c, &made, &st);
        }
        double t2 = lily_now();
        if (c.ts) {
            const char *tail;
            size_t tl;
            if (tok_stream_flush(c.ts, &tail, &tl) == LILY_OK && tl) {
                add_text(&c, tail, tl);
                parse_stream_feed(c.ps, tail, tl, c.deltas, NULL);
            }
        }
        if (c.ps) parse_stream_finish(c.ps, c.deltas, NULL);
        show(&c);
        if (c.in_reasoning) fputs(c.tty ? "\x1b[0m" : "\n[/thinking]", stdout);
        fputs("\n", stdout);
        fflush(stdout);
        chat_parsed parsed;
        if (!e && parse_output(c.text ? c.text : "", c.n, &po, &parsed, &st) == LILY_OK) {
            json_t *am = json_pack("{s:s,s:s}", "role", "assistant", "content", parsed.content);
            if (parsed.reasoning[0]) json_object_set_new(am, "reasoning_content", json_string(parsed.reasoning));
            json_array_append_new(msgs, am);
            parse_free(&parsed);
            fprintf(stderr, "[prompt %d tokens (%d cached) %.1f tok/s, generated %d tokens %.1f tok/s]\n", n, reused,
                    (n - reused) / (t1 - t0 + 1e-9), made, made / (t2 - t1 + 1e-9));
        } else {
            fprintf(stderr, "lily chat: %s\n", st.msg);
            json_array_remove(msgs, json_array_size(msgs) - 1); /* the turn did not happen */
            rc = 1;
        }
        free(ids);
        json_decref(req);
        tok_stream_free(c.ts);
        parse_stream_free(c.ps);
        c.ts = NULL;
        c.ps = NULL;
    }
    free(line);
    free(c.text);
    json_decref(c.deltas);
    json_decref(msgs);
    lily_session_free(s);
    lily_model_free(m);
    tok_free(tok);
    return rc;
}
