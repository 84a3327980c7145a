/* Responses objects and stream events, converted from the OpenAI chat objects the shared
 * chat path produces (see responses.h). Pure, apart from storing finished responses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "server/anthropic.h"
#include "server/responses.h"

static json_t *out_text_part(const char *text) {
    return json_pack("{s:s,s:s,s:[]}", "type", "output_text", "text", text, "annotations");
}

static json_t *reasoning_part(const char *text) { return json_pack("{s:s,s:s}", "type", "reasoning_text", "text", text); }

static json_t *message_item(const char *text, const char *status) {
    char id[48];
    srv_random_id(id, sizeof id, "msg_");
    return json_pack("{s:s,s:s,s:s,s:s,s:o}", "id", id, "type", "message", "status", status, "role", "assistant", "content",
                     text ? json_pack("[o]", out_text_part(text)) : json_array());
}

static json_t *reasoning_item(const char *text, const char *status) {
    char id[48];
    srv_random_id(id, sizeof id, "rs_");
    return json_pack("{s:s,s:s,s:[],s:o,s:s}", "id", id, "type", "reasoning", "summary", "content",
                     text ? json_pack("[o]", reasoning_part(text)) : json_array(), "status", status);
}

/* A chat tool call -> a function_call item; the parser's "call_<x>" gives "fc_<x>". */
static json_t *call_item(json_t *call, const char *status, int with_args) {
    json_t *fn = json_object_get(call, "function");
    const char *cid = json_string_value(json_object_get(call, "id")) ?: "";
    char id[96], gen[48];
    if (!strncmp(cid, "call_", 5) && cid[5]) snprintf(id, sizeof id, "fc_%s", cid + 5);
    else srv_random_id(id, sizeof id, "fc_");
    if (!*cid) { srv_random_id(gen, sizeof gen, "call_"); cid = gen; }
    return json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "id", id, "type", "function_call", "status", status, "call_id", cid,
                     "name", json_string_value(json_object_get(fn, "name")) ?: "", "arguments",
                     with_args ? json_string_value(json_object_get(fn, "arguments")) ?: "{}" : "");
}

/* The reasoning text of the output items, joined. */
static char *reasoning_text_of(json_t *output) {
    size_t n = 1, i;
    json_t *it;
    json_array_foreach(output, i, it) if (!strcmp(json_string_value(json_object_get(it, "type")) ?: "", "reasoning"))
        n += strlen(json_string_value(json_object_get(json_array_get(json_object_get(it, "content"), 0), "text")) ?: "");
    char *s = malloc(n);
    if (!s) return NULL;
    s[0] = 0;
    json_array_foreach(output, i, it) if (!strcmp(json_string_value(json_object_get(it, "type")) ?: "", "reasoning"))
        strcat(s, json_string_value(json_object_get(json_array_get(json_object_get(it, "content"), 0), "text")) ?: "");
    return s;
}

/* Reasoning tokens: the reasoning text re-encoded, plus the </think> that closed it,
 * never more than were generated. */
static json_t *usage_of(srv_resp_ctx *c, json_t *u, json_t *output) {
    int in = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
    int out = (int)json_integer_value(json_object_get(u, "completion_tokens"));
    int cached = (int)json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
    int rt = 0;
    char *r = c->tok ? reasoning_text_of(output) : NULL;
    if (r && *r) {
        int32_t *ids = NULL;
        int n = 0;
        lily_status st = { 0 };
        if (tok_encode(c->tok, r, strlen(r), 0, &ids, &n, &st) == LILY_OK) rt = n + 1;
        free(ids);
    }
    free(r);
    if (rt > out) rt = out;
    return json_pack("{s:i,s:{s:i},s:i,s:{s:i},s:i}", "input_tokens", in, "input_tokens_details", "cached_tokens", cached,
                     "output_tokens", out, "output_tokens_details", "reasoning_tokens", rt, "total_tokens", in + out);
}

/* The response object around output (consumed) and usage (consumed; NULL = null). */
static json_t *response_obj(srv_resp_ctx *c, const char *status, json_t *output, json_t *usage, json_t *error) {
    json_t *r = json_pack("{s:s,s:s,s:I,s:s,s:o,s:o,s:s,s:o}", "id", c->id, "object", "response", "created_at",
                          (json_int_t)c->created_at, "status", status, "error", error ? error : json_null(),
                          "incomplete_details", !strcmp(status, "incomplete") ? json_pack("{s:s}", "reason", "max_output_tokens")
                                                                              : json_null(),
                          "model", c->model, "output", output);
    if (!r) { json_decref(usage); return NULL; }
    json_object_update(r, c->echo);
    json_object_set_new(r, "usage", usage ? usage : json_null());
    size_t i, k, n = 0;
    json_t *it, *p;
    json_array_foreach(output, i, it) json_array_foreach(json_object_get(it, "content"), k, p)
        if (!strcmp(json_string_value(json_object_get(p, "type")) ?: "", "output_text"))
            n += strlen(json_string_value(json_object_get(p, "text")) ?: "");
    char *t = malloc(n + 1);
    if (t) {
        t[0] = 0;
        json_array_foreach(output, i, it) json_array_foreach(json_object_get(it, "content"), k, p)
            if (!strcmp(json_string_value(json_object_get(p, "type")) ?: "", "output_text"))
                strcat(t, json_string_value(json_object_get(p, "text")) ?: "");
        json_object_set_new(r, "output_text", json_string(t));
        free(t);
    }
    return r;
}

static void keep(srv_resp_ctx *c, json_t *resp) {
    if (c->store && c->st && resp) srv_resp_store_put(c->st, c->id, resp, c->input);
}

json_t *srv_resp_object(srv_resp_ctx *c, json_t *chat, int incomplete) {
    json_t *ch = json_array_get(json_object_get(chat, "choices"), 0);
    json_t *msg = json_object_get(ch, "message");
    json_t *output = json_array(), *calls = json_object_get(msg, "tool_calls");
    const char *r = json_string_value(json_object_get(msg, "reasoning_content"));
    const char *t = json_string_value(json_object_get(msg, "content"));
    if (r && *r) json_array_append_new(output, reasoning_item(r, "completed"));
    if ((t && *t) || (!(r && *r) && !json_array_size(calls))) json_array_append_new(output, message_item(t ? t : "", "completed"));
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) json_array_append_new(output, call_item(call, "completed", 1));
    json_t *last = json_array_get(output, json_array_size(output) - 1);
    if (incomplete && strcmp(json_string_value(json_object_get(last, "type")) ?: "", "function_call"))
        json_object_set_new(last, "status", json_string("incomplete"));
    json_t *usage = usage_of(c, json_object_get(chat, "usage"), output);
    json_t *resp = response_obj(c, incomplete ? "incomplete" : "completed", output, usage, NULL);
    keep(c, resp);
    return resp;
}

/* ---- streaming ---- */

#undef EV /* anthropic_out.c has its own (the tests include both) */
#define EV(o) (rc |= ev(s, buf, len, cap, (o)))

static int ev(srv_resp_stream *s, char **buf, size_t *len, size_t *cap, json_t *o) {
    if (!o) return -1;
    json_object_set_new(o, "sequence_number", json_integer(s->seq++));
    return srv_anth_event(buf, len, cap, o);
}

static int grow_text(srv_resp_stream *s, const char *t, size_t n) {
    if (s->len + n + 1 > s->cap) {
        size_t c = s->cap ? s->cap : 256;
        while (c < s->len + n + 1) c *= 2;
        char *p = realloc(s->text, c);
        if (!p) return -1;
        s->text = p;
        s->cap = c;
    }
    memcpy(s->text + s->len, t, n);
    s->len += n;
    s->text[s->len] = 0;
    return 0;
}

static int open_item(srv_resp_stream *s, int kind, char **buf, size_t *len, size_t *cap) {
    int rc = 0, idx = (int)json_array_size(s->output);
    json_t *it = kind == 1 ? message_item(NULL, "in_progress") : reasoning_item(NULL, "in_progress");
    json_array_append_new(s->output, it);
    EV(json_pack("{s:s,s:i,s:O}", "type", "response.output_item.added", "output_index", idx, "item", it));
    EV(json_pack("{s:s,s:s,s:i,s:i,s:o}", "type", "response.content_part.added", "item_id",
                 json_string_value(json_object_get(it, "id")), "output_index", idx, "content_index", 0, "part",
                 kind == 1 ? out_text_part("") : reasoning_part("")));
    s->open = kind;
    s->len = 0;
    rc |= grow_text(s, "", 0);
    return rc;
}

static int close_open(srv_resp_stream *s, const char *status, char **buf, size_t *len, size_t *cap) {
    if (!s->open) return 0;
    int rc = 0, idx = (int)json_array_size(s->output) - 1;
    json_t *it = json_array_get(s->output, (size_t)idx);
    const char *id = json_string_value(json_object_get(it, "id"));
    const char *t = s->text ? s->text : "";
    json_t *part = s->open == 1 ? out_text_part(t) : reasoning_part(t);
    if (s->open == 1)
        EV(json_pack("{s:s,s:s,s:i,s:i,s:s,s:[]}", "type", "response.output_text.done", "item_id", id, "output_index", idx,
                     "content_index", 0, "text", t, "logprobs"));
    else
        EV(json_pack("{s:s,s:s,s:i,s:i,s:s}", "type", "response.reasoning_text.done", "item_id", id, "output_index", idx,
                     "content_index", 0, "text", t));
    EV(json_pack("{s:s,s:s,s:i,s:i,s:O}", "type", "response.content_part.done", "item_id", id, "output_index", idx,
                 "content_index", 0, "part", part));
    json_object_set_new(it, "content", json_pack("[o]", part));
    json_object_set_new(it, "status", json_string(status));
    EV(json_pack("{s:s,s:i,s:O}", "type", "response.output_item.done", "output_index", idx, "item", it));
    s->open = 0;
    s->len = 0;
    return rc;
}

/* text (kind 1) or reasoning (kind 2) */
static int push_text(srv_resp_stream *s, int kind, const char *t, char **buf, size_t *len, size_t *cap) {
    int rc = 0;
    if (!*t) return 0;
    if (s->open != kind) {
        rc |= close_open(s, "completed", buf, len, cap);
        rc |= open_item(s, kind, buf, len, cap);
    }
    int idx = (int)json_array_size(s->output) - 1;
    const char *id = json_string_value(json_object_get(json_array_get(s->output, (size_t)idx), "id"));
    rc |= grow_text(s, t, strlen(t));
    if (kind == 1)
        EV(json_pack("{s:s,s:s,s:i,s:i,s:s,s:[]}", "type", "response.output_text.delta", "item_id", id, "output_index", idx,
                     "content_index", 0, "delta", t, "logprobs"));
    else
        EV(json_pack("{s:s,s:s,s:i,s:i,s:s}", "type", "response.reasoning_text.delta", "item_id", id, "output_index", idx,
                     "content_index", 0, "delta", t));
    return rc;
}

static int add_call(srv_resp_stream *s, json_t *call, char **buf, size_t *len, size_t *cap) {
    int rc = close_open(s, "completed", buf, len, cap), idx = (int)json_array_size(s->output);
    json_t *it = call_item(call, "in_progress", 0);
    if (!it) return -1;
    json_array_append_new(s->output, it);
    const char *args = json_string_value(json_object_get(json_object_get(call, "function"), "arguments")) ?: "{}";
    char id[96];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(it, "id")));
    EV(json_pack("{s:s,s:i,s:O}", "type", "response.output_item.added", "output_index", idx, "item", it));
    EV(json_pack("{s:s,s:s,s:i,s:s}", "type", "response.function_call_arguments.delta", "item_id", id, "output_index", idx,
                 "delta", args));
    EV(json_pack("{s:s,s:s,s:i,s:O,s:s}", "type", "response.function_call_arguments.done", "item_id", id, "output_index",
                 idx, "name", json_object_get(it, "name"), "arguments", args));
    json_object_set_new(it, "arguments", json_string(args));
    json_object_set_new(it, "status", json_string("completed"));
    EV(json_pack("{s:s,s:i,s:O}", "type", "response.output_item.done", "output_index", idx, "item", it));
    return rc;
}

static int begin(srv_resp_stream *s, char **buf, size_t *len, size_t *cap) {
    int rc = 0;
    if (s->started) return 0;
    s->started = 1;
    if (!s->output) s->output = json_array();
    EV(json_pack("{s:s,s:o}", "type", "response.created", "response", response_obj(s->ctx, "in_progress", json_array(), NULL, NULL)));
    EV(json_pack("{s:s,s:o}", "type", "response.in_progress", "response",
                 response_obj(s->ctx, "in_progress", json_array(), NULL, NULL)));
    return rc;
}

int srv_resp_stream_feed(srv_resp_stream *s, json_t *chunk, char **buf, size_t *len, size_t *cap) {
    int rc = 0;
    if (!chunk) return -1;
    if (s->done) { json_decref(chunk); return 0; }
    rc |= begin(s, buf, len, cap);
    json_t *err = json_object_get(chunk, "error");
    if (err) {
        const char *m = json_string_value(json_object_get(err, "message"));
        rc |= close_open(s, "incomplete", buf, len, cap);
        json_t *e = json_pack("{s:s,s:s}", "code", "server_error", "message", m ? m : "generation failed");
        EV(json_pack("{s:s,s:o}", "type", "response.failed", "response", response_obj(s->ctx, "failed", json_incref(s->output), NULL, e)));
        s->done = 1;
        json_decref(chunk);
        return rc;
    }
    json_t *ch = json_array_get(json_object_get(chunk, "choices"), 0);
    json_t *d = json_object_get(ch, "delta");
    const char *t;
    if ((t = json_string_value(json_object_get(d, "reasoning_content")))) rc |= push_text(s, 2, t, buf, len, cap);
    if ((t = json_string_value(json_object_get(d, "content")))) rc |= push_text(s, 1, t, buf, len, cap);
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(d, "tool_calls"), i, c) rc |= add_call(s, c, buf, len, cap);
    if (json_string_value(json_object_get(ch, "finish_reason"))) {
        rc |= close_open(s, s->incomplete ? "incomplete" : "completed", buf, len, cap);
        if (!json_array_size(s->output)) { /* nothing at all: one empty message, as the plain answer has */
            rc |= open_item(s, 1, buf, len, cap);
            rc |= close_open(s, s->incomplete ? "incomplete" : "completed", buf, len, cap);
        }
    }
    json_t *u = json_object_get(chunk, "usage");
    if (u && !json_is_null(u)) {
        rc |= close_open(s, s->incomplete ? "incomplete" : "completed", buf, len, cap);
        const char *st = s->incomplete ? "incomplete" : "completed";
        json_t *resp = response_obj(s->ctx, st, json_incref(s->output), usage_of(s->ctx, u, s->output), NULL);
        keep(s->ctx, resp);
        char type[32];
        snprintf(type, sizeof type, "response.%s", st);
        EV(json_pack("{s:s,s:o}", "type", type, "response", resp));
        s->done = 1;
    }
    json_decref(chunk);
    return rc;
}

void srv_resp_stream_free(srv_resp_stream *s) {
    srv_resp_ctx_free(s->ctx);
    s->ctx = NULL;
    json_decref(s->output);
    s->output = NULL;
    free(s->text);
    s->text = NULL;
}

#undef EV
