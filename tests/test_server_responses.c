#define _GNU_SOURCE
/* The Responses layer without HTTP or a model: request translation into the OpenAI chat
 * body (a table of cases compared as JSON, each accepted by the chat validator; every bad
 * input class refused with the right status and param), random text surviving the
 * translation, previous_response_id through a real store, the response object and the
 * stream converter fed random chat results (the events folded the way the openai SDK folds
 * them must give the plain answer's output), and the store's bounds under threads. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "server/anthropic_out.c"
#include "server/request.c"
#include "server/response.c"
#include "server/responses.c"
#include "server/responses_out.c"
#include "server/responses_store.c"
#include "t.h"

static lily_rng rng;

typedef struct { const char *in, *want; } tcase;

static const tcase cases[] = {
    /* a system or developer message after the conversation began: a user turn */
    { "{\"input\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"a\"},"
      "{\"role\":\"developer\",\"content\":[{\"type\":\"input_text\",\"text\":\"d\"}]},{\"role\":\"system\",\"content\":\"e\"}]}",
      "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"a\"},"
      "{\"role\":\"user\",\"content\":\"d\"},{\"role\":\"user\",\"content\":\"e\"}]}" },
    { "{\"model\":\"m\",\"input\":\"hi\"}", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}" },
    /* instructions and a developer message form the system message; parts joined; sampling copied */
    { "{\"instructions\":\"be terse\",\"max_output_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":3,\"seed\":5,"
      "\"input\":[{\"role\":\"developer\",\"content\":\"rules\"},{\"type\":\"message\",\"role\":\"user\",\"content\":["
      "{\"type\":\"input_text\",\"text\":\"a\"},{\"type\":\"input_text\",\"text\":\"b\"}]}],\"metadata\":{\"k\":\"v\"},"
      "\"user\":\"u\",\"truncation\":\"auto\",\"store\":false,\"parallel_tool_calls\":false,\"text\":{\"format\":{\"type\":\"text\"}}}",
      "{\"max_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":3,\"seed\":5,\"messages\":["
      "{\"role\":\"system\",\"content\":\"be terse\\n\\nrules\"},{\"role\":\"user\",\"content\":\"ab\"}],\"parallel_tool_calls\":false}" },
    /* a tool round trip: reasoning + assistant text + call form one turn, then the output */
    { "{\"input\":[{\"role\":\"user\",\"content\":\"weather?\"},{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[],"
      "\"content\":[{\"type\":\"reasoning_text\",\"text\":\"hmm\"}]},{\"type\":\"message\",\"role\":\"assistant\",\"id\":\"msg_1\","
      "\"status\":\"completed\",\"content\":[{\"type\":\"output_text\",\"text\":\"checking\",\"annotations\":[]}]},"
      "{\"type\":\"function_call\",\"id\":\"fc_1\",\"call_id\":\"call_1\",\"name\":\"w\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"},"
      "{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"sunny\"},{\"role\":\"user\",\"content\":\"thanks\"}],"
      "\"tools\":[{\"type\":\"function\",\"name\":\"w\",\"description\":\"weather\",\"parameters\":{\"type\":\"object\"},\"strict\":true}],"
      "\"tool_choice\":\"auto\"}",
      "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},{\"role\":\"assistant\",\"content\":\"checking\","
      "\"reasoning_content\":\"hmm\",\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"w\","
      "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"sunny\"},"
      "{\"role\":\"user\",\"content\":\"thanks\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"w\","
      "\"description\":\"weather\",\"parameters\":{\"type\":\"object\"},\"strict\":true}}],\"tool_choice\":\"auto\"}" },
    { "{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},"
      "\"stream\":true,\"max_output_tokens\":1,\"parallel_tool_calls\":true}",
      "{\"max_tokens\":1,\"stream\":true,\"stream_options\":{\"include_usage\":true},\"parallel_tool_calls\":true,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}}],"
      "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}" },
    { "{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\",\"schema\":{\"type\":\"object\"},\"strict\":true}},"
      "\"reasoning\":{\"effort\":\"minimal\",\"summary\":\"auto\"}}",
      "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
      "{\"name\":\"n\",\"schema\":{\"type\":\"object\"},\"strict\":true}},\"chat_template_kwargs\":{\"enable_thinking\":false}}" },
    { "{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":\"none\",\"text\":{\"format\":"
      "{\"type\":\"json_object\"}},\"reasoning\":{\"effort\":\"high\"},\"min_p\":0.1}",
      "{\"min_p\":0.1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":"
      "{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}}],\"tool_choice\":\"none\","
      "\"response_format\":{\"type\":\"json_object\"}}" },
    /* a call with no assistant text before it, summary-only and encrypted-only reasoning,
     * output parts, two assistant messages in a row, a refusal */
    { "{\"input\":[{\"role\":\"user\",\"content\":\"q\"},{\"type\":\"reasoning\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"s1\"}],"
      "\"encrypted_content\":\"zz\"},{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},"
      "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":[{\"type\":\"input_text\",\"text\":\"r\"}]},"
      "{\"type\":\"reasoning\",\"summary\":[],\"encrypted_content\":\"zz\"},{\"role\":\"assistant\",\"content\":\"done\"},"
      "{\"role\":\"assistant\",\"content\":[{\"type\":\"refusal\",\"refusal\":\"no\"}]}]}",
      "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"s1\","
      "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"r\"},{\"role\":\"assistant\",\"content\":\"done\"},"
      "{\"role\":\"assistant\",\"content\":\"no\"}]}" },
};

typedef struct { const char *in, *param; int http; const char *says; } bcase;
static const bcase bads[] = {
    { "[1]", "", 400, NULL },
    { "{\"input\":", "", 400, "JSON" },
    { "{}", "input", 400, NULL },
    { "{\"input\":5}", "input", 400, NULL },
    { "{\"input\":[]}", "input", 400, NULL },
    { "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"http://x/y.png\"}]}]}", "input", 400, "input_image" },
    { "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_file\",\"file_id\":\"f\"}]}]}", "input", 400, "input_file" },
    { "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\"}]}]}", "input", 400, NULL },
    { "{\"input\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "input", 400, "tool" },
    { "{\"input\":[{\"role\":\"user\"}]}", "input", 400, NULL },
    { "{\"input\":[7]}", "input", 400, NULL },
    { "{\"input\":[{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"{}\"}]}", "input", 400, "call_id" },
    { "{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"[1]\"}]}", "input", 400, "arguments" },
    { "{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\"}]}", "input", 400, "output" },
    { "{\"input\":[{\"type\":\"item_reference\",\"id\":\"msg_1\"}]}", "input", 400, "item_reference" },
    { "{\"input\":[{\"type\":\"web_search_call\",\"id\":\"ws_1\"}]}", "input", 400, "web_search_call" },
    { "{\"input\":[{\"type\":\"reasoning\",\"content\":5}]}", "input", 400, NULL },
    { "{\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens", 400, NULL },
    { "{\"input\":\"x\",\"max_output_tokens\":\"5\"}", "max_output_tokens", 400, NULL },
    { "{\"input\":\"x\",\"instructions\":5}", "instructions", 400, NULL },
    { "{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools", 400, "web_search" },
    { "{\"input\":\"x\",\"tools\":[{\"type\":\"function\"}]}", "tools", 400, "name" },
    { "{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":[]}]}", "tools", 400, NULL },
    { "{\"input\":\"x\",\"tools\":{}}", "tools", 400, NULL },
    { "{\"input\":\"x\",\"tool_choice\":{\"type\":\"web_search_preview\"}}", "tool_choice", 400, "web_search_preview" },
    { "{\"input\":\"x\",\"tool_choice\":{\"type\":\"function\"}}", "tool_choice", 400, NULL },
    { "{\"input\":\"x\",\"text\":5}", "text", 400, NULL },
    { "{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"xml\"}}}", "text.format", 400, "xml" },
    { "{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\"}}}", "text.format", 400, "schema" },
    { "{\"input\":\"x\",\"reasoning\":{\"effort\":\"max\"}}", "reasoning.effort", 400, NULL },
    { "{\"input\":\"x\",\"reasoning\":\"high\"}", "reasoning", 400, NULL },
    { "{\"input\":\"x\",\"store\":\"yes\"}", "store", 400, NULL },
    { "{\"input\":\"x\",\"parallel_tool_calls\":1}", "parallel_tool_calls", 400, NULL },
    { "{\"input\":\"x\",\"metadata\":[1]}", "metadata", 400, NULL },
    { "{\"input\":\"x\",\"user\":1}", "user", 400, NULL },
    { "{\"input\":\"x\",\"truncation\":\"x\"}", "truncation", 400, NULL },
    { "{\"input\":\"x\",\"background\":true}", "background", 400, NULL },
    { "{\"input\":\"x\",\"previous_response_id\":5}", "previous_response_id", 400, NULL },
    { "{\"input\":\"x\",\"previous_response_id\":\"resp_nope\"}", "previous_response_id", 400, "resp_nope" },
};

/* translated fine, refused by the chat validator: the param is renamed for this route */
static const bcase vbads[] = {
    { "{\"input\":\"x\",\"temperature\":3}", "temperature", 400, NULL },
    { "{\"input\":\"x\",\"top_p\":0}", "top_p", 400, NULL },
    { "{\"input\":\"x\",\"model\":5}", "model", 400, NULL },
    { "{\"input\":\"x\",\"tool_choice\":\"required\"}", "tool_choice", 400, NULL },
    { "{\"input\":\"x\",\"tool_choice\":\"sometimes\"}", "tool_choice", 400, NULL },
    { "{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":{\"type\":\"function\",\"name\":\"g\"}}", "tool_choice", 400, "g" },
    { "{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_object\"}},\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
      "\"tool_choice\":\"required\"}", "text.format", 400, NULL },
};

static void check_table(void) {
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        srv_error e = { 0 };
        srv_resp_ctx *c = NULL;
        char *out = srv_resp_to_openai(cases[i].in, strlen(cases[i].in), NULL, "m", &c, &e);
        json_t *got = out ? json_loads(out, 0, NULL) : NULL, *want = json_loads(cases[i].want, 0, NULL);
        CHECK(want && got && json_equal(got, want) && c, "case %zu: got %s (%s)", i, out ? out : "NULL", e.message);
        srv_request r;
        int rc = out ? srv_request_parse(out, strlen(out), SRV_CHAT, &r, &e) : -1;
        CHECK(rc == 0, "case %zu: the chat validator refuses it: %s", i, e.message);
        if (rc == 0) srv_request_free(&r);
        /* the echo carries the request's values or the API's defaults */
        json_t *in = json_loads(cases[i].in, 0, NULL);
        if (c) {
            const char *keys[] = { "instructions", "tools", "tool_choice", "temperature", "top_p", "max_output_tokens",
                                   "text", "reasoning", "parallel_tool_calls", "store", "metadata" };
            int ok = !strncmp(c->id, "resp_", 5) && strlen(c->id) == 29 && c->store == !json_is_false(json_object_get(in, "store"));
            for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
                json_t *v = json_object_get(in, keys[k]), *ev = json_object_get(c->echo, keys[k]);
                ok = ok && ev && (!v || json_equal(v, ev));
            }
            CHECK(ok, "case %zu: echo %s", i, json_dumps(c->echo, JSON_COMPACT));
        }
        json_decref(in);
        srv_resp_ctx_free(c);
        json_decref(got);
        json_decref(want);
        free(out);
    }
    for (size_t i = 0; i < sizeof bads / sizeof *bads; i++) {
        srv_error e = { 0 };
        srv_resp_ctx *c = NULL;
        char *out = srv_resp_to_openai(bads[i].in, strlen(bads[i].in), NULL, "m", &c, &e);
        CHECK(!out && !c && e.http == bads[i].http && !strcmp(e.param, bads[i].param) && e.message[0] &&
                  (!bads[i].says || strstr(e.message, bads[i].says)),
              "bad %zu %s: got %s http %d param '%s' (%s)", i, bads[i].in, out ? out : "NULL", e.http, e.param, e.message);
        free(out);
        srv_resp_ctx_free(c);
    }
    for (size_t i = 0; i < sizeof vbads / sizeof *vbads; i++) {
        srv_error e = { 0 };
        srv_resp_ctx *c = NULL;
        char *out = srv_resp_to_openai(vbads[i].in, strlen(vbads[i].in), NULL, "m", &c, &e);
        srv_request r;
        int rc = out ? srv_request_parse(out, strlen(out), SRV_CHAT, &r, &e) : 0;
        if (rc == 0 && out) srv_request_free(&r);
        srv_resp_fix_param(&e);
        CHECK(out && rc && e.http == 400 && !strcmp(e.param, vbads[i].param) && (!vbads[i].says || strstr(e.message, vbads[i].says)),
              "validator bad %zu: %s param '%s' (%s)", i, vbads[i].in, e.param, e.message);
        free(out);
        srv_resp_ctx_free(c);
    }
    static const struct { const char *from, *to; } fp[] = {
        { "max_tokens", "max_output_tokens" }, { "response_format", "text.format" }, { "messages[3].content", "input" },
        { "messages", "input" }, { "temperature", "temperature" }, { "", "" } };
    for (size_t i = 0; i < sizeof fp / sizeof *fp; i++) {
        srv_error e;
        srv_error_set(&e, 400, "invalid_request_error", fp[i].from, NULL, "x");
        srv_resp_fix_param(&e);
        CHECK(!strcmp(e.param, fp[i].to), "fix_param %s -> %s", fp[i].from, e.param);
    }
}

/* random strings (any UTF-8, quotes, backslashes, newlines) survive translation exactly */
static void rand_text(char *b, size_t cap) {
    static const char *pieces[] = { "a", "Z", " ", "\\n", "\\\\", "\\\"", "\\u00e9", "\\u4e2d", "<think>", "\\ud83d\\ude00", "{", "}" };
    size_t n = 0, k = 1 + lily_rng_u64(&rng) % 20;
    b[0] = 0;
    for (size_t i = 0; i < k; i++) {
        const char *p = pieces[lily_rng_u64(&rng) % (sizeof pieces / sizeof *pieces)];
        if (n + strlen(p) + 1 >= cap) break;
        strcat(b, p);
        n += strlen(p);
    }
}

static const char *str_at(json_t *o, const char *path) { /* "a.0.b"; the hammer threads call it too */
    char buf[128], *save = NULL;
    snprintf(buf, sizeof buf, "%s", path);
    for (char *tok = strtok_r(buf, ".", &save); tok && o; tok = strtok_r(NULL, ".", &save))
        o = (*tok >= '0' && *tok <= '9') ? json_array_get(o, (size_t)atoi(tok)) : json_object_get(o, tok);
    return json_string_value(o) ?: "\x01";
}

static void check_random(void) {
    for (int it = 0; it < 200; it++) {
        char ins[256], u1[256], u2[256], a[256], out[256];
        rand_text(ins, sizeof ins); rand_text(u1, sizeof u1); rand_text(u2, sizeof u2);
        rand_text(a, sizeof a); rand_text(out, sizeof out);
        char in[2048];
        snprintf(in, sizeof in,
                 "{\"instructions\":\"%s\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"%s\"},"
                 "{\"type\":\"input_text\",\"text\":\"%s\"}]},{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":"
                 "\"output_text\",\"text\":\"%s\"}]},{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"{}\"},"
                 "{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":\"%s\"}]}", ins, u1, u2, a, out);
        json_t *src = json_loads(in, 0, NULL);
        if (!src) continue; /* a surrogate half cut by the size limit: not valid JSON */
        srv_error e = { 0 };
        srv_resp_ctx *c = NULL;
        char *s = srv_resp_to_openai(in, strlen(in), NULL, "m", &c, &e);
        json_t *o = s ? json_loads(s, 0, NULL) : NULL, *m = json_object_get(o, "messages");
        char joined[1024];
        snprintf(joined, sizeof joined, "%s%s", str_at(src, "input.0.content.0.text"), str_at(src, "input.0.content.1.text"));
        int ok = o && json_array_size(m) == 4 && !strcmp(str_at(m, "0.content"), str_at(src, "instructions")) &&
                 !strcmp(str_at(m, "1.content"), joined) && !strcmp(str_at(m, "2.content"), str_at(src, "input.1.content.0.text")) &&
                 !strcmp(str_at(m, "3.content"), str_at(src, "input.3.output")) && c && json_equal(c->input, json_object_get(src, "input"));
        CHECK(ok, "random %d: %s -> %s", it, in, s ? s : e.message);
        srv_resp_ctx_free(c);
        json_decref(o);
        json_decref(src);
        free(s);
    }
}

/* ---- outputs ---- */

typedef struct { char *reason, *text; int n_calls; char args[2][64], names[2][16]; int incomplete; } chat_result;

static void rand_word(char *b, size_t cap) {
    static const char *w[] = { "sun", " ", "\xc3\xa9", "rain", "\n", "\"q\"", "\\", "\xe4\xb8\xad", "x" };
    size_t k = lily_rng_u64(&rng) % 6;
    b[0] = 0;
    for (size_t i = 0; i < k; i++) strncat(b, w[lily_rng_u64(&rng) % 9], cap - strlen(b) - 1);
}

static json_t *chat_of(const chat_result *r) {
    json_t *msg = json_pack("{s:s,s:s}", "role", "assistant", "content", r->text);
    if (*r->reason) json_object_set_new(msg, "reasoning_content", json_string(r->reason));
    if (r->n_calls) {
        json_t *calls = json_array();
        for (int i = 0; i < r->n_calls; i++) {
            char id[32];
            snprintf(id, sizeof id, "call_k%d", i);
            json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type", "function", "function", "name",
                                                   r->names[i], "arguments", r->args[i]));
        }
        json_object_set_new(msg, "tool_calls", calls);
    }
    return json_pack("{s:s,s:[{s:i,s:o,s:s}],s:{s:i,s:i,s:i,s:{s:i}}}", "model", "m", "choices", "index", 0, "message", msg,
                     "finish_reason", r->n_calls ? "tool_calls" : r->incomplete ? "length" : "stop", "usage", "prompt_tokens",
                     20, "completion_tokens", 9, "total_tokens", 29, "prompt_tokens_details", "cached_tokens", 6);
}

static json_t *chunk(json_t *delta, const char *finish) {
    return json_pack("{s:s,s:[{s:i,s:o,s:o}]}", "object", "chat.completion.chunk", "choices", "index", 0, "delta", delta,
                     "finish_reason", finish ? json_string(finish) : json_null());
}

/* feeds s (a random split) as deltas; returns the events buffer */
static char *stream_of(srv_resp_stream *st, const chat_result *r, int *rc) {
    char *buf = NULL;
    size_t len = 0, cap = 0;
    *rc = srv_resp_stream_feed(st, chunk(json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL), &buf, &len, &cap);
    for (int pass = 0; pass < 2; pass++) {
        const char *t = pass ? r->text : r->reason;
        size_t n = strlen(t);
        for (size_t i = 0; i < n;) {
            size_t k = 1 + lily_rng_u64(&rng) % 4;
            if (i + k > n) k = n - i;
            while (i + k < n && ((unsigned char)t[i + k] & 0xc0) == 0x80) k++; /* whole characters, as the parser gives */
            json_t *d = json_object();
            json_object_set_new(d, pass ? "content" : "reasoning_content", json_stringn(t + i, k));
            *rc |= srv_resp_stream_feed(st, chunk(d, NULL), &buf, &len, &cap);
            i += k;
        }
    }
    for (int i = 0; i < r->n_calls; i++) {
        char id[32];
        snprintf(id, sizeof id, "call_k%d", i);
        *rc |= srv_resp_stream_feed(st, chunk(json_pack("{s:[{s:i,s:s,s:s,s:{s:s,s:s}}]}", "tool_calls", "index", i, "id", id,
                                                        "type", "function", "function", "name", r->names[i], "arguments",
                                                        r->args[i]), NULL), &buf, &len, &cap);
    }
    st->incomplete = r->incomplete;
    *rc |= srv_resp_stream_feed(st, chunk(json_object(), r->n_calls ? "tool_calls" : r->incomplete ? "length" : "stop"), &buf, &len, &cap);
    *rc |= srv_resp_stream_feed(st, json_loads("{\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":9,"
                                               "\"prompt_tokens_details\":{\"cached_tokens\":6}}}", 0, NULL), &buf, &len, &cap);
    return buf;
}

/* The events folded as the openai SDK's ResponseStream folds them. Checks framing and
 * sequence numbers; returns the final response (or NULL) and the folded output. */
static json_t *fold(const char *buf, json_t **folded, char *why, size_t wn) {
    json_t *snap = NULL, *final = NULL;
    int seq = 0;
    const char *p = buf;
    *folded = NULL;
    while (*p) {
        const char *nl = strchr(p, '\n'), *end = strstr(p, "\n\n");
        if (strncmp(p, "event: ", 7) || !nl || !end || strncmp(nl + 1, "data: ", 6)) { snprintf(why, wn, "framing"); goto bad; }
        json_t *d = json_loadb(nl + 7, (size_t)(end - nl - 7), 0, NULL);
        const char *ty = json_string_value(json_object_get(d, "type")) ?: "";
        int idx = (int)json_integer_value(json_object_get(d, "output_index"));
        json_t *item = snap ? json_array_get(json_object_get(snap, "output"), (size_t)idx) : NULL;
        if (strncmp(p + 7, ty, (size_t)(nl - p - 7)) || json_integer_value(json_object_get(d, "sequence_number")) != seq++) {
            snprintf(why, wn, "name/sequence at %s", ty);
            json_decref(d);
            goto bad;
        }
        if (!snap) {
            if (strcmp(ty, "response.created")) { snprintf(why, wn, "first %s", ty); json_decref(d); goto bad; }
            snap = json_deep_copy(json_object_get(d, "response"));
        } else if (!strcmp(ty, "response.output_item.added")) {
            if (idx != (int)json_array_size(json_object_get(snap, "output"))) { snprintf(why, wn, "added index"); json_decref(d); goto bad; }
            json_array_append_new(json_object_get(snap, "output"), json_deep_copy(json_object_get(d, "item")));
        } else if (!strcmp(ty, "response.content_part.added")) {
            json_array_append_new(json_object_get(item, "content"), json_deep_copy(json_object_get(d, "part")));
        } else if (!strcmp(ty, "response.output_text.delta") || !strcmp(ty, "response.reasoning_text.delta")) {
            json_t *part = json_array_get(json_object_get(item, "content"), (size_t)json_integer_value(json_object_get(d, "content_index")));
            if (!part || strcmp(str_at(item, "id"), str_at(d, "item_id"))) { snprintf(why, wn, "delta target"); json_decref(d); goto bad; }
            char *t = NULL;
            if (asprintf(&t, "%s%s", str_at(part, "text"), str_at(d, "delta")) < 0) t = NULL;
            json_object_set_new(part, "text", json_string(t ? t : ""));
            free(t);
        } else if (!strcmp(ty, "response.function_call_arguments.delta")) {
            char *t = NULL;
            if (asprintf(&t, "%s%s", str_at(item, "arguments"), str_at(d, "delta")) < 0) t = NULL;
            json_object_set_new(item, "arguments", json_string(t ? t : ""));
            free(t);
        } else if (!strcmp(ty, "response.output_item.done")) {
            /* the done item must be what the deltas built, apart from its status */
            json_t *di = json_deep_copy(json_object_get(d, "item"));
            json_object_set(di, "status", json_object_get(item, "status"));
            if (!json_equal(di, item)) { snprintf(why, wn, "done item differs from the folded one"); json_decref(di); json_decref(d); goto bad; }
            json_decref(di);
            json_object_set(item, "status", json_object_get(json_object_get(d, "item"), "status"));
        } else if (!strcmp(ty, "response.completed") || !strcmp(ty, "response.incomplete") || !strcmp(ty, "response.failed")) {
            final = json_deep_copy(json_object_get(d, "response"));
            if (end[2]) { snprintf(why, wn, "events after %s", ty); json_decref(d); goto bad; }
        }
        json_decref(d);
        p = end + 2;
    }
    *folded = snap ? json_incref(json_object_get(snap, "output")) : NULL;
    json_decref(snap);
    return final;
bad:
    json_decref(snap);
    json_decref(final);
    return NULL;
}

/* item ids are random per item: compare without them */
static json_t *no_ids(json_t *output) {
    json_t *o = json_deep_copy(output);
    size_t i;
    json_t *it;
    json_array_foreach(o, i, it) if (strcmp(str_at(it, "type"), "function_call")) json_object_del(it, "id");
    return o;
}

static srv_resp_ctx *ctx_for(const char *req, srv_resp_store *st) {
    srv_error e;
    srv_resp_ctx *c = NULL;
    free(srv_resp_to_openai(req, strlen(req), st, "m", &c, &e));
    return c;
}

static void check_output(void) {
    srv_resp_store *st = srv_resp_store_new(100, 1 << 20);
    for (int it = 0; it < 300; it++) {
        char reason[128], text[128];
        chat_result r = { reason, text, (int)(lily_rng_u64(&rng) % 3), { "" }, { "" }, (int)(lily_rng_u64(&rng) % 2) };
        rand_word(reason, sizeof reason);
        rand_word(text, sizeof text);
        for (int i = 0; i < r.n_calls; i++) {
            snprintf(r.names[i], sizeof r.names[i], "fn%d", (int)(lily_rng_u64(&rng) % 100));
            snprintf(r.args[i], sizeof r.args[i], "{\"a\": %d, \"s\": \"x\\\"y\"}", (int)(lily_rng_u64(&rng) % 1000));
        }
        /* the plain answer */
        srv_resp_ctx *c = ctx_for("{\"input\":\"hi\",\"instructions\":\"sys\",\"temperature\":0.3}", st);
        json_t *chat = chat_of(&r), *o = c ? srv_resp_object(c, chat, r.incomplete) : NULL, *out = json_object_get(o, "output");
        int want_n = (*reason ? 1 : 0) + (*text || (!*reason && !r.n_calls) ? 1 : 0) + r.n_calls, k = 0, ok = o != NULL;
        ok = ok && (int)json_array_size(out) == want_n && !strcmp(str_at(o, "object"), "response") &&
             !strcmp(str_at(o, "id"), c->id) && !strcmp(str_at(o, "instructions"), "sys") && !strcmp(str_at(o, "output_text"), text) &&
             !strcmp(str_at(o, "status"), r.incomplete && !r.n_calls ? "incomplete" : r.incomplete ? "incomplete" : "completed");
        if (ok && *reason) {
            json_t *ri = json_array_get(out, (size_t)k++);
            ok = !strcmp(str_at(ri, "type"), "reasoning") && !strncmp(str_at(ri, "id"), "rs_", 3) &&
                 !strcmp(str_at(ri, "content.0.type"), "reasoning_text") && !strcmp(str_at(ri, "content.0.text"), reason) &&
                 json_array_size(json_object_get(ri, "summary")) == 0;
        }
        if (ok && (*text || (!*reason && !r.n_calls))) {
            json_t *mi = json_array_get(out, (size_t)k++);
            ok = !strcmp(str_at(mi, "type"), "message") && !strncmp(str_at(mi, "id"), "msg_", 4) &&
                 !strcmp(str_at(mi, "role"), "assistant") && !strcmp(str_at(mi, "content.0.type"), "output_text") &&
                 !strcmp(str_at(mi, "content.0.text"), text) && json_is_array(json_object_get(json_array_get(json_object_get(mi, "content"), 0), "annotations"));
        }
        for (int i = 0; ok && i < r.n_calls; i++) {
            json_t *fi = json_array_get(out, (size_t)k++);
            char cid[32], fid[32];
            snprintf(cid, sizeof cid, "call_k%d", i);
            snprintf(fid, sizeof fid, "fc_k%d", i);
            json_t *a = json_loads(str_at(fi, "arguments"), 0, NULL);
            ok = !strcmp(str_at(fi, "type"), "function_call") && !strcmp(str_at(fi, "call_id"), cid) && !strcmp(str_at(fi, "id"), fid) &&
                 !strcmp(str_at(fi, "name"), r.names[i]) && json_is_object(a) && !strcmp(str_at(fi, "status"), "completed");
            json_decref(a);
        }
        /* a truncated answer: the last text item is incomplete */
        json_t *last = json_array_get(out, json_array_size(out) - 1);
        if (ok && r.incomplete && !r.n_calls)
            ok = !strcmp(str_at(last, "status"), "incomplete") && !strcmp(str_at(o, "incomplete_details.reason"), "max_output_tokens");
        json_t *u = json_object_get(o, "usage");
        ok = ok && json_integer_value(json_object_get(u, "input_tokens")) == 20 && json_integer_value(json_object_get(u, "output_tokens")) == 9 &&
             json_integer_value(json_object_get(u, "total_tokens")) == 29 &&
             json_integer_value(json_object_get(json_object_get(u, "input_tokens_details"), "cached_tokens")) == 6 &&
             json_is_integer(json_object_get(json_object_get(u, "output_tokens_details"), "reasoning_tokens"));
        CHECK(ok, "object %d: %s", it, o ? json_dumps(o, JSON_COMPACT) : "NULL");
        /* stored: GET gives the same object */
        char *body = NULL;
        int code = c ? srv_resp_lookup(st, c->id, 0, &body) : 0;
        json_t *got = body ? json_loads(body, 0, NULL) : NULL;
        CHECK(code == 200 && json_equal(got, o), "stored %d: %d %s", it, code, body ? body : "");
        json_decref(got);
        free(body);

        /* the same result streamed in random pieces */
        srv_resp_stream s = { .ctx = ctx_for("{\"input\":\"hi\",\"stream\":true}", NULL) };
        int rc;
        char *buf = stream_of(&s, &r, &rc), why[128] = "";
        json_t *folded = NULL, *fin = fold(buf ? buf : "", &folded, why, sizeof why);
        json_t *a = no_ids(json_object_get(fin, "output")), *b = no_ids(out), *f = no_ids(folded);
        CHECK(rc == 0 && fin && json_equal(a, b) && json_equal(f, a) &&
                  !strcmp(str_at(fin, "status"), str_at(o, "status")) && json_equal(json_object_get(fin, "usage"), u) &&
                  !strcmp(str_at(fin, "output_text"), text),
              "stream %d (%s): %s\nplain %s", it, why, buf ? buf : "", json_dumps(b, JSON_COMPACT));
        json_decref(a); json_decref(b); json_decref(f); json_decref(fin); json_decref(folded);
        free(buf);
        srv_resp_stream_free(&s);
        json_decref(chat);
        json_decref(o);
        srv_resp_ctx_free(c);
    }
    /* an error mid-stream: response.failed carrying the message, nothing after it */
    srv_resp_stream s = { .ctx = ctx_for("{\"input\":\"hi\"}", NULL) };
    char *buf = NULL, why[64] = "";
    size_t len = 0, cap = 0;
    srv_resp_stream_feed(&s, chunk(json_pack("{s:s}", "content", "par"), NULL), &buf, &len, &cap);
    srv_resp_stream_feed(&s, json_loads("{\"error\":{\"message\":\"bye\",\"type\":\"server_error\"}}", 0, NULL), &buf, &len, &cap);
    srv_resp_stream_feed(&s, chunk(json_pack("{s:s}", "content", "more"), NULL), &buf, &len, &cap);
    json_t *folded = NULL, *fin = fold(buf ? buf : "", &folded, why, sizeof why);
    CHECK(fin && !strcmp(str_at(fin, "status"), "failed") && !strcmp(str_at(fin, "error.message"), "bye") &&
              !strcmp(str_at(fin, "output.0.content.0.text"), "par") && !strstr(buf, "more"),
          "failed stream (%s): %s", why, buf ? buf : "");
    json_decref(fin);
    json_decref(folded);
    free(buf);
    srv_resp_stream_free(&s);
    srv_resp_store_free(st);
}

/* ---- previous_response_id and the store ---- */

static void check_chain(void) {
    srv_resp_store *st = srv_resp_store_new(10, 1 << 20);
    srv_resp_ctx *c = ctx_for("{\"input\":\"first\",\"instructions\":\"one\"}", st);
    chat_result r = { "why", "answer", 1, { "{\"a\":1}" }, { "f" }, 0 };
    json_t *chat = chat_of(&r);
    json_t *o = srv_resp_object(c, chat, 0);
    const char *next = "{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"call_k0\",\"output\":\"42\"}],"
                       "\"instructions\":\"two\",\"previous_response_id\":\"%s\"}";
    char req[512];
    snprintf(req, sizeof req, next, c->id);
    srv_error e = { 0 };
    srv_resp_ctx *c2 = NULL;
    char *s = srv_resp_to_openai(req, strlen(req), st, "m", &c2, &e);
    json_t *got = s ? json_loads(s, 0, NULL) : NULL;
    /* the new instructions replace the old ones; the stored input and output come first */
    json_t *want = json_loads("{\"messages\":[{\"role\":\"system\",\"content\":\"two\"},{\"role\":\"user\",\"content\":\"first\"},"
                              "{\"role\":\"assistant\",\"content\":\"answer\",\"reasoning_content\":\"why\",\"tool_calls\":[{\"id\":"
                              "\"call_k0\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]},"
                              "{\"role\":\"tool\",\"tool_call_id\":\"call_k0\",\"content\":\"42\"}]}", 0, NULL);
    CHECK(got && json_equal(got, want), "chain: %s (%s)", s ? s : "NULL", e.message);
    CHECK(c2 && json_array_size(c2->input) == 5 && !strcmp(str_at(c2->echo, "previous_response_id"), c->id),
          "chain: the conversation's items (%zu)", c2 ? json_array_size(c2->input) : 0);
    /* input_items lists them newest first */
    json_t *o2 = srv_resp_object(c2, chat, 0);
    char *body = NULL;
    char path[80];
    snprintf(path, sizeof path, "%s/input_items", c2->id);
    int code = srv_resp_lookup(st, path, 0, &body);
    json_t *li = body ? json_loads(body, 0, NULL) : NULL;
    CHECK(code == 200 && json_array_size(json_object_get(li, "data")) == 5 &&
              !strcmp(str_at(li, "data.0.type"), "function_call_output") && !strcmp(str_at(li, "data.4.content"), "first"),
          "input_items %d %s", code, body ? body : "");
    json_decref(li);
    free(body);
    /* store false: not kept; DELETE; a deleted one is gone for chaining too */
    srv_resp_ctx *c3 = ctx_for("{\"input\":\"x\",\"store\":false}", st);
    json_t *o3 = srv_resp_object(c3, chat, 0);
    code = srv_resp_lookup(st, c3->id, 0, &body);
    CHECK(code == 404 && strstr(body, "not_found"), "store false: %d", code);
    free(body);
    code = srv_resp_lookup(st, c->id, 1, &body);
    CHECK(code == 200 && strstr(body, "\"deleted\":true") && strstr(body, c->id), "delete %d %s", code, body);
    free(body);
    code = srv_resp_lookup(st, c->id, 1, &body);
    CHECK(code == 404, "delete twice %d", code);
    free(body);
    srv_resp_ctx *c4 = NULL;
    char *s4 = srv_resp_to_openai(req, strlen(req), st, "m", &c4, &e);
    CHECK(!s4 && e.http == 400 && !strcmp(e.param, "previous_response_id") && !strcmp(e.code ?: "", "previous_response_not_found"),
          "deleted previous: %d %s", e.http, e.param);
    static const char *badp[] = { "", "/", "x/y", "x/input_items/z" };
    for (size_t i = 0; i < 4; i++) {
        code = srv_resp_lookup(st, badp[i], 0, &body);
        CHECK(code == 404 && body, "path '%s': %d", badp[i], code);
        free(body);
    }
    code = srv_resp_lookup(st, path, 1, &body);
    CHECK(code == 404, "DELETE input_items: %d", code);
    free(body);
    free(s);
    free(s4);
    json_decref(got); json_decref(want); json_decref(o); json_decref(o2); json_decref(o3); json_decref(chat);
    srv_resp_ctx_free(c); srv_resp_ctx_free(c2); srv_resp_ctx_free(c3);
    srv_resp_store_free(st);
}

static int store_consistent(srv_resp_store *s) {
    int n = 0;
    size_t b = 0;
    entry *last = NULL;
    for (entry *e = s->head; e; e = e->next) { n++; b += e->bytes; last = e; }
    return n == s->n && b == s->bytes && last == s->tail && n <= s->max_items && b <= s->max_bytes;
}

static void *hammer(void *arg) {
    srv_resp_store *s = arg;
    lily_rng r;
    lily_rng_seed(&r, (uint64_t)(uintptr_t)&r ^ (uint64_t)time(NULL));
    for (int i = 0; i < 2000; i++) {
        char id[32];
        snprintf(id, sizeof id, "resp_%d", (int)(lily_rng_u64(&r) % 80));
        int op = (int)(lily_rng_u64(&r) % 3);
        if (op == 0) {
            json_t *o = json_pack("{s:s,s:s}", "id", id, "pad", "0123456789012345678901234567890123456789");
            srv_resp_store_put(s, id, o, NULL);
            json_decref(o);
        } else if (op == 1) {
            json_t *in = NULL, *o = srv_resp_store_get(s, id, &in);
            if (o && strcmp(str_at(o, "id"), id)) abort(); /* another entry's data */
            json_decref(o);
            json_decref(in);
        } else srv_resp_store_delete(s, id);
    }
    return NULL;
}

static void check_store(void) {
    srv_resp_store *s = srv_resp_store_new(3, 1 << 20);
    json_t *o = json_pack("{s:s}", "k", "v"), *in = json_pack("[{s:s}]", "role", "user");
    char id[16];
    for (int i = 0; i < 5; i++) { snprintf(id, sizeof id, "r%d", i); srv_resp_store_put(s, id, o, in); }
    int n;
    size_t b;
    srv_resp_store_counts(s, &n, &b);
    json_t *x = srv_resp_store_get(s, "r1", NULL), *y = srv_resp_store_get(s, "r2", NULL), *z = NULL;
    CHECK(n == 3 && !x && y && json_equal(y, o) && store_consistent(s), "count bound: n %d", n);
    json_decref(x);
    json_decref(y);
    srv_resp_store_put(s, "r3", in, o); /* replaced, not added */
    srv_resp_store_counts(s, &n, &b);
    x = srv_resp_store_get(s, "r3", &z);
    CHECK(n == 3 && json_equal(x, in) && json_equal(z, o) && store_consistent(s), "replace: n %d", n);
    json_decref(x);
    json_decref(z);
    srv_resp_store_free(s);
    /* the byte budget: oldest go first; one larger than the budget is refused */
    s = srv_resp_store_new(1000, 3000);
    char big[700];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    json_t *bo = json_pack("{s:s}", "t", big);
    for (int i = 0; i < 10; i++) { snprintf(id, sizeof id, "b%d", i); srv_resp_store_put(s, id, bo, NULL); }
    srv_resp_store_counts(s, &n, &b);
    x = srv_resp_store_get(s, "b9", NULL);
    y = srv_resp_store_get(s, "b0", NULL);
    CHECK(b <= 3000 && n >= 2 && n < 10 && x && !y && store_consistent(s), "byte bound: n %d bytes %zu", n, b);
    json_decref(x);
    json_decref(y);
    char *huge = malloc(5000);
    memset(huge, 'h', 4999);
    huge[4999] = 0;
    json_t *ho = json_pack("{s:s}", "t", huge);
    CHECK(srv_resp_store_put(s, "huge", ho, NULL) == -1 && !srv_resp_store_get(s, "huge", NULL), "over budget refused");
    free(huge);
    json_decref(ho);
    json_decref(bo);
    srv_resp_store_free(s);
    /* threads: puts, gets and deletes of overlapping ids keep the list consistent */
    s = srv_resp_store_new(50, 1 << 20);
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, hammer, s);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    srv_resp_store_counts(s, &n, &b);
    CHECK(store_consistent(s) && n <= 50, "threads: n %d bytes %zu", n, b);
    srv_resp_store_free(s);
    json_decref(o);
    json_decref(in);
}

int main(void) {
    lily_rng_seed(&rng, t_seed("test_server_responses"));
    check_table();
    check_random();
    check_output();
    check_chain();
    check_store();
    return T_DONE();
}
