/* Response bodies and SSE chunks in the shapes OpenAI clients parse. Pure functions of
 * their arguments (no HTTP, no model), so they are unit-tested with hand-made inputs,
 * tool calls included. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include "server/server.h"

void srv_random_id(char *out, size_t n, const char *prefix) {
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    unsigned char r[24];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        for (size_t i = 0; i < sizeof r; i++) r[i] = (unsigned char)(rand() ^ (int)(lily_now() * 1e6));
    size_t p = (size_t)snprintf(out, n, "%s", prefix);
    for (size_t i = 0; i < sizeof r && p + 1 < n; i++) out[p++] = al[r[i] % 62];
    out[p < n ? p : n - 1] = 0;
}

const char *srv_finish_name(srv_finish f, int n_calls) {
    if (n_calls > 0 && (f == SRV_FINISH_STOP || f == SRV_FINISH_LENGTH)) return "tool_calls";
    if (f == SRV_FINISH_LENGTH) return "length";
    return "stop";
}

int srv_sse_append(char **buf, size_t *len, size_t *cap, json_t *obj) {
    char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (!s) return -1;
    size_t n = strlen(s), need = *len + n + 9;
    if (need > *cap) {
        size_t c = *cap ? *cap : 1024;
        while (c < need) c *= 2;
        char *b = realloc(*buf, c);
        if (!b) { free(s); return -1; }
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, "data: ", 6);
    memcpy(*buf + *len + 6, s, n);
    memcpy(*buf + *len + 6 + n, "\n\n", 3);
    *len += n + 8;
    free(s);
    return 0;
}

json_t *srv_usage(int prompt_tokens, int completion_tokens, int cached_tokens) {
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", prompt_tokens, "completion_tokens", completion_tokens,
                     "total_tokens", prompt_tokens + completion_tokens, "prompt_tokens_details", "cached_tokens",
                     cached_tokens);
}

json_t *srv_chat_response(const char *id, const char *model, long created, const chat_parsed *parsed,
                          const char *finish, json_t *logprobs, int prompt_tokens, int completion_tokens,
                          int cached_tokens) {
    json_t *msg = out_message(parsed);
    if (msg && !json_object_get(msg, "reasoning_content")) json_object_set_new(msg, "reasoning_content", json_null());
    return json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:o,s:o,s:s}],s:o}", "id", id, "object", "chat.completion", "created",
                     (json_int_t)created, "model", model, "choices", "index", 0, "message", msg, "logprobs",
                     logprobs ? logprobs : json_null(), "finish_reason", finish, "usage",
                     srv_usage(prompt_tokens, completion_tokens, cached_tokens));
}

json_t *srv_completion_response(const char *id, const char *model, long created, const char *text,
                                const char *finish, json_t *logprobs, int prompt_tokens,
                                int completion_tokens, int cached_tokens) {
    return json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:s,s:o,s:s}],s:o}", "id", id, "object", "text_completion", "created",
                     (json_int_t)created, "model", model, "choices", "index", 0, "text", text, "logprobs",
                     logprobs ? logprobs : json_null(), "finish_reason", finish, "usage",
                     srv_usage(prompt_tokens, completion_tokens, cached_tokens));
}

/* A token's bytes as a JSON string: ill-formed UTF-8 (a token may hold half a
 * character) becomes U+FFFD; the exact bytes are in the "bytes" array. */
static json_t *piece_string(const char *p, size_t n) {
    char *b = malloc(n * 3 + 1);
    if (!b) return json_string("");
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        size_t l = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = l > 0 && i + l <= n && c != 0;
        for (size_t k = 1; ok && k < l; k++) ok = ((unsigned char)p[i + k] >> 6) == 2;
        if (ok && l == 2) ok = c >= 0xc2;
        if (ok && l == 3) {
            unsigned char d = (unsigned char)p[i + 1];
            ok = !(c == 0xe0 && d < 0xa0) && !(c == 0xed && d >= 0xa0);
        }
        if (ok && l == 4) {
            unsigned char d = (unsigned char)p[i + 1];
            ok = !(c == 0xf0 && d < 0x90) && !(c == 0xf4 && d >= 0x90) && c <= 0xf4;
        }
        if (ok) { memcpy(b + o, p + i, l); o += l; i += l; }
        else { memcpy(b + o, "\xef\xbf\xbd", 3); o += 3; i++; }
    }
    json_t *s = json_stringn(b, o);
    free(b);
    return s ? s : json_string("");
}

static json_t *piece_bytes(const char *p, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)p[i]));
    return a;
}

/* JSON has no -inf: clamp the way OpenAI's API does. */
static double lp_value(float v) { return isfinite(v) ? v : -9999.0; }

static void token_text(const tok_tokenizer *tok, int32_t id, const char **p, size_t *n) {
    *p = tok ? tok_piece(tok, id, n) : NULL;
    if (!*p) { *p = ""; *n = 0; }
}

void srv_logprobs_chat(const tok_tokenizer *tok, const lily_token *t, int n, json_t *content) {
    for (int i = 0; i < n; i++) {
        const char *p;
        size_t pl;
        token_text(tok, t[i].id, &p, &pl);
        json_t *top = json_array();
        for (int k = 0; k < t[i].n_top; k++) {
            const char *q;
            size_t ql;
            token_text(tok, t[i].top_ids[k], &q, &ql);
            json_array_append_new(top, json_pack("{s:o,s:f,s:o}", "token", piece_string(q, ql), "logprob",
                                                 lp_value(t[i].top_logprobs[k]), "bytes", piece_bytes(q, ql)));
        }
        json_array_append_new(content, json_pack("{s:o,s:f,s:o,s:o}", "token", piece_string(p, pl), "logprob",
                                                 lp_value(t[i].logprob), "bytes", piece_bytes(p, pl),
                                                 "top_logprobs", top));
    }
}

void srv_logprobs_completion(const tok_tokenizer *tok, const lily_token *t, int n, json_t *lp, long *offset) {
    json_t *tokens = json_object_get(lp, "tokens"), *tlp = json_object_get(lp, "token_logprobs"),
           *top = json_object_get(lp, "top_logprobs"), *off = json_object_get(lp, "text_offset");
    for (int i = 0; i < n; i++) {
        const char *p;
        size_t pl;
        token_text(tok, t[i].id, &p, &pl);
        json_array_append_new(tokens, piece_string(p, pl));
        json_array_append_new(tlp, json_real(lp_value(t[i].logprob)));
        json_t *alt = json_object();
        for (int j = 0; j < t[i].n_top; j++) {
            const char *q;
            size_t ql;
            token_text(tok, t[i].top_ids[j], &q, &ql);
            json_t *qs = piece_string(q, ql);
            json_object_set_new(alt, json_string_value(qs), json_real(lp_value(t[i].top_logprobs[j])));
            json_decref(qs);
        }
        json_array_append_new(top, alt);
        json_array_append_new(off, json_integer(*offset));
        *offset += (long)pl;
    }
}

json_t *srv_logprobs_completion_new(void) {
    return json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

json_t *srv_chat_chunk(const srv_stream *s, json_t *delta, const char *finish, json_t *logprobs) {
    json_t *c = json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:o,s:o,s:o}]}", "id", s->id, "object", "chat.completion.chunk",
                          "created", (json_int_t)s->created, "model", s->model, "choices", "index", 0, "delta",
                          delta ? delta : json_object(), "logprobs", logprobs ? logprobs : json_null(),
                          "finish_reason", finish ? json_string(finish) : json_null());
    if (c && s->include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}

json_t *srv_completion_chunk(const srv_stream *s, const char *text, size_t len, const char *finish,
                             json_t *logprobs) {
    json_t *c = json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:o,s:o,s:o}]}", "id", s->id, "object", "text_completion",
                          "created", (json_int_t)s->created, "model", s->model, "choices", "index", 0, "text",
                          piece_string(text, len), "logprobs", logprobs ? logprobs : json_null(), "finish_reason",
                          finish ? json_string(finish) : json_null());
    if (c && s->include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}
