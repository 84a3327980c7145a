/* The Anthropic Messages layer without HTTP or a model: request translation into the
 * OpenAI chat body (a table of cases compared as JSON, each result then accepted by the
 * chat validator; bad inputs refused with 400 naming the field), random text that must
 * survive translation byte for byte, and the message/stream converters fed hand-made
 * chat objects (tool calls included, which a random-weight model never produces). */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "server/anthropic.c"
#include "server/anthropic_out.c"
#include "server/request.c"
#include "t.h"

static lily_rng rng;

typedef struct { const char *in, *want; } tcase;

static const tcase cases[] = {
    { "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
      "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}" },
    /* system as blocks, user text blocks joined, sampling and stop copied */
    { "{\"max_tokens\":7,\"system\":[{\"type\":\"text\",\"text\":\"be \"},{\"type\":\"text\",\"text\":\"terse\"}],"
      "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":3,\"stop_sequences\":[\"END\"],\"metadata\":{\"user_id\":\"u\"},"
      "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}]}",
      "{\"max_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":3,\"stop\":[\"END\"],\"messages\":["
      "{\"role\":\"system\",\"content\":\"be terse\"},{\"role\":\"user\",\"content\":\"ab\"}]}" },
    /* a tool round trip: assistant thinking + text + tool_use, user tool_result (+ error) + text */
    { "{\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},"
      "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hmm\",\"signature\":\"s\"},"
      "{\"type\":\"text\",\"text\":\"checking\"},{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"w\",\"input\":{\"city\":\"Paris\"}}]},"
      "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":[{\"type\":\"text\",\"text\":\"sunny\"}]},"
      "{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_2\",\"content\":\"boom\",\"is_error\":true},"
      "{\"type\":\"text\",\"text\":\"thanks\"}]}],"
      "\"tools\":[{\"name\":\"w\",\"description\":\"weather\",\"input_schema\":{\"type\":\"object\"}}],"
      "\"tool_choice\":{\"type\":\"auto\"}}",
      "{\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},"
      "{\"role\":\"assistant\",\"content\":\"checking\",\"reasoning_content\":\"hmm\",\"tool_calls\":[{\"id\":\"toolu_1\","
      "\"type\":\"function\",\"function\":{\"name\":\"w\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"toolu_1\",\"content\":\"sunny\"},"
      "{\"role\":\"tool\",\"tool_call_id\":\"toolu_2\",\"content\":\"Error: boom\"},"
      "{\"role\":\"user\",\"content\":\"thanks\"}],"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"description\":\"weather\",\"parameters\":{\"type\":\"object\"}}}],"
      "\"tool_choice\":\"auto\"}" },
    { "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],"
      "\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"},\"stream\":true}",
      "{\"max_tokens\":1,\"stream\":true,\"stream_options\":{\"include_usage\":true},\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],"
      "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}" },
    { "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],"
      "\"tool_choice\":{\"type\":\"any\"},\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024}}",
      "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],"
      "\"tool_choice\":\"required\",\"chat_template_kwargs\":{\"enable_thinking\":true}}" },
    { "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"none\"},"
      "\"thinking\":{\"type\":\"disabled\"}}",
      "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"none\","
      "\"chat_template_kwargs\":{\"enable_thinking\":false}}" },
    /* tool results alone make no empty user message; redacted thinking is dropped */
    { "{\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":["
      "{\"type\":\"redacted_thinking\",\"data\":\"zz\"},{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}]},"
      "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t\"}]}]}",
      "{\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"\","
      "\"tool_calls\":[{\"id\":\"t\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"t\",\"content\":\"\"}]}" },
};

typedef struct { const char *in, *param; } bcase;
static const bcase bads[] = {
    { "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "max_tokens" },
    { "{\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "max_tokens" },
    { "{\"max_tokens\":\"5\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "max_tokens" },
    { "{\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", "messages" },
    { "{\"max_tokens\":5,\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages" },
    { "{\"max_tokens\":5,\"messages\":[]}", "messages" },
    { "{\"max_tokens\":5}", "messages" },
    { "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{\"type\":\"base64\","
      "\"media_type\":\"image/png\",\"data\":\"AA==\"}}]}]}", "messages" },
    { "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", "messages" },
    { "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages" },
    { "{\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\","
      "\"input\":[]}]}]}", "messages" },
    { "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\"}]}]}", "messages" },
    { "{\"max_tokens\":5,\"system\":[{\"type\":\"image\"}],\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "system" },
    { "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"f\"}]}", "tools" },
    { "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"auto\"}", "tool_choice" },
    { "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"tool\"}}", "tool_choice" },
    { "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"maybe\"}}", "thinking" },
    { "[1]", "" },
    { "{\"max_tokens\":5,", "" },
};

static void check_table(void) {
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        srv_error e = { 0 };
        char *out = srv_anth_to_openai(cases[i].in, strlen(cases[i].in), 0, &e);
        json_t *got = out ? json_loads(out, 0, NULL) : NULL, *want = json_loads(cases[i].want, 0, NULL);
        CHECK(want && got && json_equal(got, want), "case %zu: got %s (%s)", i, out ? out : "NULL", e.message);
        srv_request r;
        int rc = out ? srv_request_parse(out, strlen(out), SRV_CHAT, &r, &e) : -1;
        CHECK(rc == 0, "case %zu: the chat validator refuses it: %s", i, e.message);
        if (rc == 0) srv_request_free(&r);
        json_decref(got);
        json_decref(want);
        free(out);
    }
    for (size_t i = 0; i < sizeof bads / sizeof *bads; i++) {
        srv_error e = { 0 };
        char *out = srv_anth_to_openai(bads[i].in, strlen(bads[i].in), 0, &e);
        CHECK(!out && e.http == 400 && !strcmp(e.param, bads[i].param) && e.message[0] &&
                  !strcmp(srv_anth_error_type(e.http), "invalid_request_error"),
              "bad %zu %s: got %s http %d param '%s' (%s)", i, bads[i].in, out ? out : "NULL", e.http, e.param,
              e.message);
        free(out);
    }
    /* count_tokens needs no max_tokens and never streams */
    srv_error e = { 0 };
    const char *cnt = "{\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}";
    char *out = srv_anth_to_openai(cnt, strlen(cnt), 1, &e);
    CHECK(out && !strstr(out, "max_tokens") && !strstr(out, "stream"), "count: %s", out ? out : e.message);
    free(out);
    /* the image refusal says what is unsupported */
    out = srv_anth_to_openai(bads[7].in, strlen(bads[7].in), 0, &e);
    CHECK(!out && strstr(e.message, "image"), "image message: %s", e.message);
    char *ej = srv_anth_error_json(&e);
    json_t *eo = json_loads(ej, 0, NULL);
    json_t *eb = json_object_get(eo, "error");
    CHECK(eo && !strcmp(json_string_value(json_object_get(eo, "type")) ?: "", "error") &&
              !strcmp(json_string_value(json_object_get(eb, "type")) ?: "", "invalid_request_error") &&
              strstr(json_string_value(json_object_get(eb, "message")) ?: "", "image"), "error json %s", ej);
    static const struct { int http; const char *type; } et[] = {
        { 400, "invalid_request_error" }, { 401, "authentication_error" }, { 404, "not_found_error" },
        { 405, "invalid_request_error" }, { 413, "request_too_large" }, { 500, "api_error" }, { 503, "overloaded_error" } };
    for (size_t i = 0; i < sizeof et / sizeof *et; i++)
        CHECK(!strcmp(srv_anth_error_type(et[i].http), et[i].type), "status %d -> %s", et[i].http, srv_anth_error_type(et[i].http));
    json_decref(eo);
    free(ej);
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

static void check_random(void) {
    for (int it = 0; it < 200; it++) {
        char sys[256], u1[256], u2[256], th[256], a[256];
        rand_text(sys, sizeof sys); rand_text(u1, sizeof u1); rand_text(u2, sizeof u2);
        rand_text(th, sizeof th); rand_text(a, sizeof a);
        char in[2048];
        snprintf(in, sizeof in,
                 "{\"max_tokens\":3,\"system\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"%s\"},"
                 "{\"type\":\"text\",\"text\":\"%s\"}]},{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"%s\"},"
                 "{\"type\":\"text\",\"text\":\"%s\"}]},{\"role\":\"user\",\"content\":\"%s\"}]}", sys, u1, u2, th, a, u1);
        json_t *src = json_loads(in, 0, NULL);
        if (!src) continue; /* a lone surrogate half cut by the size limit: not valid JSON */
        srv_error e = { 0 };
        char *out = srv_anth_to_openai(in, strlen(in), 0, &e);
        json_t *o = out ? json_loads(out, 0, NULL) : NULL, *m = json_object_get(o, "messages");
        json_t *sm = json_object_get(src, "messages");
        const char *s_u1 = json_string_value(json_object_get(json_array_get(json_object_get(json_array_get(sm, 0), "content"), 0), "text"));
        const char *s_u2 = json_string_value(json_object_get(json_array_get(json_object_get(json_array_get(sm, 0), "content"), 1), "text"));
        char joined[1024];
        snprintf(joined, sizeof joined, "%s%s", s_u1, s_u2);
        int ok = o && json_array_size(m) == 4 &&
                 !strcmp(json_string_value(json_object_get(json_array_get(m, 0), "content")) ?: "?", json_string_value(json_object_get(src, "system"))) &&
                 !strcmp(json_string_value(json_object_get(json_array_get(m, 1), "content")) ?: "?", joined) &&
                 !strcmp(json_string_value(json_object_get(json_array_get(m, 2), "reasoning_content")) ?: "?", json_string_value(json_object_get(json_array_get(json_object_get(json_array_get(sm, 1), "content"), 0), "thinking"))) &&
                 !strcmp(json_string_value(json_object_get(json_array_get(m, 2), "content")) ?: "?", json_string_value(json_object_get(json_array_get(json_object_get(json_array_get(sm, 1), "content"), 1), "text"))) &&
                 !strcmp(json_string_value(json_object_get(json_array_get(m, 3), "content")) ?: "?", s_u1);
        CHECK(ok, "random %d: %s -> %s", it, in, out ? out : e.message);
        json_decref(o);
        json_decref(src);
        free(out);
    }
}

/* events of a stream buffer: names and data objects; checks the framing */
static int split_events(const char *buf, char names[][32], json_t **data, int max) {
    int n = 0;
    const char *p = buf;
    while (*p && n < max) {
        if (strncmp(p, "event: ", 7)) return -1;
        const char *nl = strchr(p, '\n');
        if (!nl || nl - p - 7 >= 32) return -1;
        memcpy(names[n], p + 7, (size_t)(nl - p - 7));
        names[n][nl - p - 7] = 0;
        p = nl + 1;
        if (strncmp(p, "data: ", 6)) return -1;
        const char *end = strstr(p, "\n\n");
        if (!end) return -1;
        data[n] = json_loadb(p + 6, (size_t)(end - p - 6), 0, NULL);
        if (!data[n] || strcmp(json_string_value(json_object_get(data[n], "type")) ?: "", names[n])) return -1;
        n++;
        p = end + 2;
    }
    return n;
}

static json_t *chunk(const char *delta_json, const char *finish) {
    json_t *d = json_loads(delta_json, 0, NULL);
    return json_pack("{s:s,s:[{s:i,s:o,s:o}]}", "object", "chat.completion.chunk", "choices", "index", 0, "delta", d,
                     "finish_reason", finish ? json_string(finish) : json_null());
}

static void check_output(void) {
    /* non-streaming */
    const char *chat = "{\"model\":\"m\",\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"hi\","
                       "\"reasoning_content\":\"think\",\"tool_calls\":[{\"id\":\"call_abc\",\"type\":\"function\","
                       "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}]},\"finish_reason\":\"tool_calls\"}],"
                       "\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":4,\"prompt_tokens_details\":{\"cached_tokens\":3}}}";
    json_t *c = json_loads(chat, 0, NULL);
    json_t *m = srv_anth_message("msg_1", c, NULL);
    json_t *want = json_loads("{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\",\"content\":["
                              "{\"type\":\"thinking\",\"thinking\":\"think\",\"signature\":\"\"},{\"type\":\"text\",\"text\":\"hi\"},"
                              "{\"type\":\"tool_use\",\"id\":\"toolu_abc\",\"name\":\"f\",\"input\":{\"x\":1}}],"
                              "\"stop_reason\":\"tool_use\",\"stop_sequence\":null,\"usage\":{\"input_tokens\":7,"
                              "\"output_tokens\":4,\"cache_read_input_tokens\":3,\"cache_creation_input_tokens\":0}}", 0, NULL);
    char *ms = json_dumps(m, JSON_COMPACT);
    CHECK(want && json_equal(m, want), "message %s", ms);
    free(ms);
    json_decref(m);
    json_decref(want);
    static const struct { const char *finish, *seq, *reason; } fr[] = {
        { "stop", NULL, "end_turn" }, { "stop", "END", "stop_sequence" }, { "length", NULL, "max_tokens" },
        { "tool_calls", NULL, "tool_use" } };
    for (size_t i = 0; i < sizeof fr / sizeof *fr; i++) {
        json_object_set_new(json_array_get(json_object_get(c, "choices"), 0), "finish_reason", json_string(fr[i].finish));
        m = srv_anth_message("msg_1", c, fr[i].seq);
        json_t *sq = json_object_get(m, "stop_sequence");
        CHECK(!strcmp(json_string_value(json_object_get(m, "stop_reason")) ?: "", fr[i].reason) &&
                  (fr[i].seq ? !strcmp(json_string_value(sq) ?: "", fr[i].seq) : json_is_null(sq)),
              "finish %s seq %s", fr[i].finish, fr[i].seq ? fr[i].seq : "-");
        json_decref(m);
    }
    json_decref(c);

    /* streaming: random splits of thinking, text and a call give the canonical event order */
    for (int it = 0; it < 50; it++) {
        srv_anth_stream a = { .model = "m", .input_tokens = 12 };
        snprintf(a.id, sizeof a.id, "msg_x");
        char *buf = NULL;
        size_t len = 0, cap = 0;
        int nt = (int)(lily_rng_u64(&rng) % 3), nx = 1 + (int)(lily_rng_u64(&rng) % 3), call = (int)(lily_rng_u64(&rng) % 2);
        int rc = srv_anth_stream_feed(&a, chunk("{\"role\":\"assistant\",\"content\":\"\"}", NULL), &buf, &len, &cap);
        for (int i = 0; i < nt; i++) rc |= srv_anth_stream_feed(&a, chunk("{\"reasoning_content\":\"r\"}", NULL), &buf, &len, &cap);
        for (int i = 0; i < nx; i++) rc |= srv_anth_stream_feed(&a, chunk("{\"content\":\"t\"}", NULL), &buf, &len, &cap);
        if (call)
            rc |= srv_anth_stream_feed(&a, chunk("{\"tool_calls\":[{\"index\":0,\"id\":\"call_q\",\"type\":\"function\","
                                                 "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":[1]}\"}}]}", NULL), &buf, &len, &cap);
        a.stop_seq = call ? NULL : strdup("S");
        rc |= srv_anth_stream_feed(&a, chunk("{}", call ? "tool_calls" : "stop"), &buf, &len, &cap);
        rc |= srv_anth_stream_feed(&a, json_loads("{\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":5,"
                                                  "\"prompt_tokens_details\":{\"cached_tokens\":2}}}", 0, NULL), &buf, &len, &cap);
        char names[64][32];
        json_t *d[64] = { 0 };
        int n = split_events(buf ? buf : "", names, d, 64);
        /* expected: start, ping, [thinking: start, nt deltas, signature, stop], text: start, nx deltas, stop,
         * [tool: start, json delta, stop], message_delta, message_stop */
        int want_n = 2 + (nt ? nt + 3 : 0) + nx + 2 + (call ? 3 : 0) + 2, k = 0, ok = rc == 0 && n == want_n;
        ok = ok && !strcmp(names[k++], "message_start") && !strcmp(names[k++], "ping");
        char text[16] = "", think[16] = "";
        for (int i = 0; ok && i < n; i++) {
            json_t *dl = json_object_get(d[i], "delta");
            const char *ty = json_string_value(json_object_get(dl, "type"));
            if (ty && !strcmp(ty, "text_delta")) strcat(text, json_string_value(json_object_get(dl, "text")));
            if (ty && !strcmp(ty, "thinking_delta")) strcat(think, json_string_value(json_object_get(dl, "thinking")));
        }
        ok = ok && (int)strlen(text) == nx && (int)strlen(think) == nt;
        ok = ok && !strcmp(names[n - 1], "message_stop") && !strcmp(names[n - 2], "message_delta");
        if (ok) {
            json_t *md = d[n - 2], *u = json_object_get(md, "usage");
            ok = !strcmp(json_string_value(json_object_get(json_object_get(md, "delta"), "stop_reason")) ?: "",
                         call ? "tool_use" : "stop_sequence") &&
                 json_integer_value(json_object_get(u, "output_tokens")) == 5 &&
                 json_integer_value(json_object_get(u, "input_tokens")) == 10 &&
                 json_integer_value(json_object_get(u, "cache_read_input_tokens")) == 2 &&
                 json_integer_value(json_object_get(json_object_get(json_object_get(d[0], "message"), "usage"), "input_tokens")) == 12;
            if (call) {
                json_t *cb = json_object_get(d[n - 5], "content_block");
                json_t *jd = json_object_get(d[n - 4], "delta");
                ok = ok && !strcmp(json_string_value(json_object_get(cb, "type")) ?: "", "tool_use") &&
                     !strcmp(json_string_value(json_object_get(cb, "id")) ?: "", "toolu_q") &&
                     !strcmp(json_string_value(json_object_get(jd, "partial_json")) ?: "", "{\"a\":[1]}");
            }
            /* block indexes: each start opens the next index; deltas and stops use the open one */
            int open = -1, next = 0;
            for (int i = 2; ok && i < n - 2; i++) {
                int idx = (int)json_integer_value(json_object_get(d[i], "index"));
                if (!strcmp(names[i], "content_block_start")) { ok = idx == next && open == -1; open = next++; }
                else if (!strcmp(names[i], "content_block_stop")) { ok = idx == open; open = -1; }
                else ok = !strcmp(names[i], "content_block_delta") && idx == open;
            }
            ok = ok && open == -1;
        }
        CHECK(ok, "stream %d (think %d text %d call %d): n %d want %d\n%s", it, nt, nx, call, n, want_n, buf ? buf : "");
        for (int i = 0; i < 64; i++) json_decref(d[i]);
        srv_anth_stream_free(&a);
        free(buf);
    }
    /* an error mid-stream becomes an error event */
    srv_anth_stream a = { .model = "m" };
    char *buf = NULL;
    size_t len = 0, cap = 0;
    srv_anth_stream_feed(&a, json_loads("{\"error\":{\"message\":\"bye\",\"type\":\"server_error\",\"code\":\"shutting_down\"}}", 0, NULL),
                         &buf, &len, &cap);
    CHECK(buf && strstr(buf, "event: error\n") && strstr(buf, "overloaded_error") && strstr(buf, "bye"), "error event %s", buf ? buf : "");
    free(buf);
}

int main(void) {
    lily_rng_seed(&rng, t_seed("test_server_anthropic"));
    check_table();
    check_random();
    check_output();
    return T_DONE();
}
