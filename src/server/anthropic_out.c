/* Anthropic Messages responses and stream events, converted from the OpenAI-shaped
 * objects the shared chat path produces (see anthropic.h). Pure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "server/anthropic.h"

const char *srv_anth_error_type(int http) {
    switch (http) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return http >= 500 ? "api_error" : "invalid_request_error";
    }
}

char *srv_anth_error_json(const srv_error *e) {
    json_t *o = json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type", srv_anth_error_type(e->http),
                          "message", e->message);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

/* tool call arguments (a JSON text) -> the input object; a non-object is wrapped */
static json_t *input_of(const char *args) {
    json_t *v = args ? json_loads(args, JSON_DECODE_ANY, NULL) : NULL;
    if (json_is_object(v)) return v;
    json_decref(v);
    return json_object();
}

static json_t *tool_block(json_t *call) {
    json_t *fn = json_object_get(call, "function");
    /* the parser's "call_<random>" becomes "toolu_<random>" */
    const char *id = json_string_value(json_object_get(call, "id")) ?: "";
    char buf[80];
    snprintf(buf, sizeof buf, "toolu_%s", strncmp(id, "call_", 5) ? id : id + 5);
    return json_pack("{s:s,s:s,s:s,s:o}", "type", "tool_use", "id", buf, "name",
                     json_string_value(json_object_get(fn, "name")) ?: "", "input",
                     input_of(json_string_value(json_object_get(fn, "arguments"))));
}

static const char *stop_reason(const char *finish, const char *stop_seq) {
    if (!finish) return "end_turn";
    if (!strcmp(finish, "tool_calls")) return "tool_use";
    if (!strcmp(finish, "length")) return "max_tokens";
    return stop_seq ? "stop_sequence" : "end_turn";
}

static json_t *usage(json_t *u, int out_only) {
    int in = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
    int out = (int)json_integer_value(json_object_get(u, "completion_tokens"));
    int cached = (int)json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
    /* Anthropic counts cache reads apart from input_tokens (total = input + cache_read) */
    if (out_only) return json_pack("{s:i,s:i,s:i}", "output_tokens", out, "input_tokens", in - cached,
                                   "cache_read_input_tokens", cached);
    return json_pack("{s:i,s:i,s:i,s:i}", "input_tokens", in - cached, "output_tokens", out,
                     "cache_read_input_tokens", cached, "cache_creation_input_tokens", 0);
}

json_t *srv_anth_message(const char *id, json_t *chat, const char *stop_seq) {
    json_t *ch = json_array_get(json_object_get(chat, "choices"), 0);
    json_t *msg = json_object_get(ch, "message");
    const char *finish = json_string_value(json_object_get(ch, "finish_reason"));
    json_t *content = json_array();
    const char *r = json_string_value(json_object_get(msg, "reasoning_content"));
    if (r && *r)
        json_array_append_new(content, json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", r, "signature", ""));
    const char *t = json_string_value(json_object_get(msg, "content"));
    if (t && *t) json_array_append_new(content, json_pack("{s:s,s:s}", "type", "text", "text", t));
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(msg, "tool_calls"), i, c) json_array_append_new(content, tool_block(c));
    const char *sr = stop_reason(finish, stop_seq);
    return json_pack("{s:s,s:s,s:s,s:O,s:o,s:s,s:o,s:o}", "id", id, "type", "message", "role", "assistant", "model",
                     json_object_get(chat, "model"), "content", content, "stop_reason", sr, "stop_sequence",
                     !strcmp(sr, "stop_sequence") ? json_string(stop_seq) : json_null(), "usage",
                     usage(json_object_get(chat, "usage"), 0));
}

int srv_anth_event(char **buf, size_t *len, size_t *cap, json_t *obj) {
    const char *name = json_string_value(json_object_get(obj, "type"));
    char head[64];
    int hn = snprintf(head, sizeof head, "event: %s\n", name ? name : "message");
    char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (!s || hn >= (int)sizeof head) { free(s); return -1; }
    size_t n = strlen(s), need = *len + (size_t)hn + n + 9;
    if (need > *cap) {
        size_t c = *cap ? *cap : 1024;
        while (c < need) c *= 2;
        char *b = realloc(*buf, c);
        if (!b) { free(s); return -1; }
        *buf = b;
        *cap = c;
    }
    char *p = *buf + *len;
    memcpy(p, head, (size_t)hn);
    memcpy(p + hn, "data: ", 6);
    memcpy(p + hn + 6, s, n);
    memcpy(p + hn + 6 + n, "\n\n", 3);
    *len += (size_t)hn + n + 8;
    free(s);
    return 0;
}

#define EV(o) (rc |= srv_anth_event(buf, len, cap, (o)))

static int close_block(srv_anth_stream *a, char **buf, size_t *len, size_t *cap) {
    int rc = 0;
    if (!a->open) return 0;
    if (a->open == 2)
        EV(json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index", a->n_blocks - 1, "delta", "type",
                     "signature_delta", "signature", ""));
    EV(json_pack("{s:s,s:i}", "type", "content_block_stop", "index", a->n_blocks - 1));
    a->open = 0;
    return rc;
}

/* text (kind 1) or thinking (kind 2) */
static int add_text(srv_anth_stream *a, int kind, const char *t, char **buf, size_t *len, size_t *cap) {
    int rc = 0;
    if (!*t) return 0;
    if (a->open != kind) {
        rc |= close_block(a, buf, len, cap);
        json_t *blk = kind == 1 ? json_pack("{s:s,s:s}", "type", "text", "text", "")
                                : json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", "");
        EV(json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", a->n_blocks++, "content_block", blk));
        a->open = kind;
    }
    EV(json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index", a->n_blocks - 1, "delta", "type",
                 kind == 1 ? "text_delta" : "thinking_delta", kind == 1 ? "text" : "thinking", t));
    return rc;
}

int srv_anth_stream_feed(srv_anth_stream *a, json_t *chunk, char **buf, size_t *len, size_t *cap) {
    int rc = 0;
    if (!chunk) return -1;
    if (a->done) { json_decref(chunk); return 0; }
    json_t *err = json_object_get(chunk, "error");
    if (err) {
        const char *m = json_string_value(json_object_get(err, "message"));
        const char *code = json_string_value(json_object_get(err, "code"));
        EV(json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type",
                     code && !strcmp(code, "shutting_down") ? "overloaded_error" : "api_error", "message", m ? m : ""));
        a->done = 1;
        json_decref(chunk);
        return rc;
    }
    if (!a->started) {
        a->started = 1;
        EV(json_pack("{s:s,s:{s:s,s:s,s:s,s:[],s:s,s:n,s:n,s:{s:i,s:i,s:i}}}", "type", "message_start", "message",
                     "id", a->id, "type", "message", "role", "assistant", "content", "model", a->model ? a->model : "",
                     "stop_reason", "stop_sequence", "usage", "input_tokens", a->input_tokens - a->cached_tokens,
                     "output_tokens", 0, "cache_read_input_tokens", a->cached_tokens));
        EV(json_pack("{s:s}", "type", "ping"));
    }
    json_t *u = json_object_get(chunk, "usage");
    json_t *ch = json_array_get(json_object_get(chunk, "choices"), 0);
    json_t *d = json_object_get(ch, "delta");
    const char *s;
    if ((s = json_string_value(json_object_get(d, "reasoning_content")))) rc |= add_text(a, 2, s, buf, len, cap);
    if ((s = json_string_value(json_object_get(d, "content")))) rc |= add_text(a, 1, s, buf, len, cap);
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(d, "tool_calls"), i, c) {
        rc |= close_block(a, buf, len, cap);
        json_t *blk = tool_block(c);
        char *in = json_dumps(json_object_get(blk, "input"), JSON_COMPACT);
        json_object_set_new(blk, "input", json_object());
        int idx = a->n_blocks++;
        EV(json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", idx, "content_block", blk));
        EV(json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index", idx, "delta", "type",
                     "input_json_delta", "partial_json", in ? in : "{}"));
        free(in);
        EV(json_pack("{s:s,s:i}", "type", "content_block_stop", "index", idx));
    }
    const char *fin = json_string_value(json_object_get(ch, "finish_reason"));
    if (fin) {
        rc |= close_block(a, buf, len, cap);
        a->stop_reason = stop_reason(fin, a->stop_seq);
    }
    if (u && !json_is_null(u)) {
        rc |= close_block(a, buf, len, cap);
        const char *sr = a->stop_reason ? a->stop_reason : "end_turn";
        EV(json_pack("{s:s,s:{s:s,s:o},s:o}", "type", "message_delta", "delta", "stop_reason", sr, "stop_sequence",
                     !strcmp(sr, "stop_sequence") && a->stop_seq ? json_string(a->stop_seq) : json_null(), "usage",
                     usage(u, 1)));
        EV(json_pack("{s:s}", "type", "message_stop"));
        a->done = 1;
    }
    json_decref(chunk);
    return rc;
}

void srv_anth_stream_free(srv_anth_stream *a) {
    free(a->stop_seq);
    a->stop_seq = NULL;
}
