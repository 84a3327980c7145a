/* One-shot parse of generated text: plain string searches over the whole text. The
 * streaming parser (parse_stream.c) must agree with this for every chunking. */
#include <stdlib.h>
#include <string.h>
#include "text/parse_priv.h"

typedef struct { const char *p; size_t n; } span;

static span strip_nl(span s) {
    while (s.n && s.p[0] == '\n') { s.p++; s.n--; }
    while (s.n && s.p[s.n - 1] == '\n') s.n--;
    return s;
}

static lily_code add_call(chat_parsed *out, lily_rng *rng, char *name, char *args, lily_status *st) {
    chat_tool_call *c = realloc(out->calls, (size_t)(out->n_calls + 1) * sizeof *c);
    char *id = parse_call_id(rng);
    if (!c || !id) {
        if (c) out->calls = c;
        free(id); free(name); free(args);
        return lily_err(st, LILY_ENOMEM, "out of memory parsing tool calls");
    }
    out->calls = c;
    c[out->n_calls++] = (chat_tool_call){ id, name, args };
    return LILY_OK;
}

lily_code parse_output(const char *text, size_t n, const chat_parse_opts *o, chat_parsed *out, lily_status *st) {
    memset(out, 0, sizeof *out);
    chat_buf clean = { 0 }, reasoning = { 0 }, content = { 0 };
    parse_utf8 u = { 0 };
    parse_utf8_feed(&u, text, n, &clean);
    parse_utf8_flush(&u, &clean);
    chat_buf_add(&clean, "", 0);
    lily_rng rng;
    parse_rng_init(&rng, o->id_seed);
    lily_code rc = LILY_OK;
    const char *s = clean.p;
    size_t len = clean.n, pos = 0;

    /* Reasoning: the prompt opened <think>, or the text itself starts with one. */
    int in_think = o->think_open;
    if (!in_think) {
        size_t k = 0;
        while (k < len && s[k] == '\n') k++;
        if (len - k >= strlen(PARSE_THINK_OPEN) && !memcmp(s + k, PARSE_THINK_OPEN, strlen(PARSE_THINK_OPEN))) {
            in_think = 1;
            pos = k + strlen(PARSE_THINK_OPEN);
        }
    }
    if (in_think) {
        long e = chat_find(s + pos, len - pos, PARSE_THINK_CLOSE);
        size_t end = e < 0 ? len : pos + (size_t)e;
        span r = strip_nl((span){ s + pos, end - pos });
        chat_buf_add(&reasoning, r.p, r.n);
        pos = e < 0 ? len : end + strlen(PARSE_THINK_CLOSE);
    }

    /* Content segments around <tool_call> blocks. */
    while (!rc) {
        long i = chat_find(s + pos, len - pos, PARSE_CALL_OPEN);
        span seg = strip_nl((span){ s + pos, i < 0 ? len - pos : (size_t)i });
        chat_buf_add(&content, seg.p, seg.n);
        if (i < 0) break;
        size_t open = pos + (size_t)i, body = open + strlen(PARSE_CALL_OPEN);
        long j = chat_find(s + body, len - body, PARSE_CALL_CLOSE);
        if (j < 0) { /* unterminated: the model's text is kept as it was */
            chat_buf_add(&content, s + open, len - open);
            break;
        }
        size_t close = body + (size_t)j + strlen(PARSE_CALL_CLOSE);
        char *name, *args;
        if (!parse_call_block(s + body, (size_t)j, o->tools, &name, &args)) rc = add_call(out, &rng, name, args, st);
        else chat_buf_add(&content, s + open, close - open);
        pos = close;
    }
    chat_buf_free(&clean);
    out->reasoning = chat_buf_take(&reasoning);
    out->content = chat_buf_take(&content);
    if (!rc && (!out->reasoning || !out->content)) rc = lily_err(st, LILY_ENOMEM, "out of memory parsing model output");
    if (rc) parse_free(out);
    return rc;
}

void parse_free(chat_parsed *p) {
    for (int i = 0; i < p->n_calls; i++) {
        free(p->calls[i].id);
        free(p->calls[i].name);
        free(p->calls[i].arguments);
    }
    free(p->calls);
    free(p->reasoning);
    free(p->content);
    memset(p, 0, sizeof *p);
}
