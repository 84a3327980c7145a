/* The server's pure parts, without HTTP or a model: request validation, the stop-string
 * filter (against a brute-force reference over random splits), response and chunk
 * builders (tool calls included, which a random-weight model never produces), logprob
 * objects, the SSE framing and the metrics text. The server sources are compiled in
 * directly: they are not part of liblily. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "server/metrics.c"
#include "server/request.c"
#include "server/response.c"
#include "server/stop.c"
#include "t.h"

static lily_rng rng;

static int parse(const char *body, srv_kind k, srv_request *r, srv_error *e) {
    return srv_request_parse(body, strlen(body), k, r, e);
}

static void expect_bad(const char *body, srv_kind k, int status, const char *param) {
    srv_request r;
    srv_error e = { 0 };
    int rc = parse(body, k, &r, &e);
    CHECK(rc == -1 && e.http == status && !strcmp(e.param, param) && e.message[0],
          "%s -> want %d param '%s', got rc %d http %d param '%s' (%s)", body, status, param, rc, e.http, e.param,
          e.message);
    if (rc == 0) srv_request_free(&r);
}

static void test_request(void) {
    srv_request r;
    srv_error e;
    const char *ok = "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":"
                     "[{\"type\":\"text\",\"text\":\"hi\"}]}],\"max_tokens\":7,\"max_completion_tokens\":9,\"temperature\":0,"
                     "\"top_p\":0.5,\"top_k\":-1,\"min_p\":0.1,\"seed\":42,\"stop\":[\"a\",\"\",\"bc\"],\"presence_penalty\":1,"
                     "\"frequency_penalty\":-1,\"logprobs\":true,\"top_logprobs\":3,\"n\":1,\"stream\":true,"
                     "\"stream_options\":{\"include_usage\":true},\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
                     "\"f\"}}],\"tool_choice\":\"none\",\"chat_template_kwargs\":{\"enable_thinking\":false},"
                     "\"some_unknown_field\":{\"x\":[1,2]}}";
    CHECK(parse(ok, SRV_CHAT, &r, &e) == 0, "full request accepted: %s", e.message);
    CHECK(r.max_tokens == 9, "max_completion_tokens wins: %d", r.max_tokens);
    CHECK(r.has_temperature && r.temperature == 0, "temperature");
    CHECK(r.has_top_p && r.top_p == 0.5f && r.has_top_k && r.top_k == 0 && r.has_min_p && r.min_p == 0.1f, "truncation");
    CHECK(r.has_seed && r.seed == 42, "seed");
    CHECK(r.n_stop == 2 && !strcmp(r.stop[0], "a") && !strcmp(r.stop[1], "bc"), "stop list, empty dropped");
    CHECK(r.presence_penalty == 1 && r.frequency_penalty == -1, "penalties");
    CHECK(r.logprobs && r.top_logprobs == 3, "logprobs");
    CHECK(r.stream && r.include_usage && r.tool_choice_none && r.has_tools, "flags");
    CHECK(!strcmp(r.model, "m"), "model");
    srv_request_free(&r);

    CHECK(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":\"END\"}", SRV_CHAT, &r, &e) == 0 &&
              r.n_stop == 1 && r.max_tokens == -1 && !r.has_temperature && !r.stream,
          "minimal request, stop string");
    srv_request_free(&r);

    /* the classes of bad input */
    expect_bad("{\"messages\":[", SRV_CHAT, 400, "");
    expect_bad("", SRV_CHAT, 400, "");
    expect_bad("[1,2]", SRV_CHAT, 400, "");
    expect_bad("{\"a\":1,\"a\":2,\"messages\":[]}", SRV_CHAT, 400, "");
    expect_bad("{}", SRV_CHAT, 400, "messages");
    expect_bad("{\"messages\":{}}", SRV_CHAT, 400, "messages");
    expect_bad("{\"messages\":[]}", SRV_CHAT, 400, "messages");
    expect_bad("{\"messages\":[1]}", SRV_CHAT, 400, "messages[0]");
    expect_bad("{\"messages\":[{\"content\":\"x\"}]}", SRV_CHAT, 400, "messages[0]");
    expect_bad("{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", SRV_CHAT, 400, "messages[0]");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":5}]}", SRV_CHAT, 400, "messages[0].content");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}", SRV_CHAT, 400,
               "messages[0].content");
#define M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"
    expect_bad("{" M ",\"max_tokens\":\"5\"}", SRV_CHAT, 400, "max_tokens");
    expect_bad("{" M ",\"max_tokens\":0}", SRV_CHAT, 400, "max_tokens");
    expect_bad("{" M ",\"max_tokens\":2.5}", SRV_CHAT, 400, "max_tokens");
    expect_bad("{" M ",\"max_completion_tokens\":-3}", SRV_CHAT, 400, "max_completion_tokens");
    expect_bad("{" M ",\"temperature\":\"hot\"}", SRV_CHAT, 400, "temperature");
    expect_bad("{" M ",\"temperature\":3}", SRV_CHAT, 400, "temperature");
    expect_bad("{" M ",\"top_p\":0}", SRV_CHAT, 400, "top_p");
    expect_bad("{" M ",\"top_p\":1.5}", SRV_CHAT, 400, "top_p");
    expect_bad("{" M ",\"top_k\":1.5}", SRV_CHAT, 400, "top_k");
    expect_bad("{" M ",\"min_p\":-0.1}", SRV_CHAT, 400, "min_p");
    expect_bad("{" M ",\"presence_penalty\":5}", SRV_CHAT, 400, "presence_penalty");
    expect_bad("{" M ",\"frequency_penalty\":[]}", SRV_CHAT, 400, "frequency_penalty");
    expect_bad("{" M ",\"seed\":\"1\"}", SRV_CHAT, 400, "seed");
    expect_bad("{" M ",\"stop\":5}", SRV_CHAT, 400, "stop");
    expect_bad("{" M ",\"stop\":[\"a\",5]}", SRV_CHAT, 400, "stop");
    expect_bad("{" M ",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\","
               "\"16\",\"17\"]}", SRV_CHAT, 400, "stop");
    expect_bad("{" M ",\"n\":2}", SRV_CHAT, 400, "n");
    expect_bad("{" M ",\"n\":\"1\"}", SRV_CHAT, 400, "n");
    expect_bad("{" M ",\"stream\":1}", SRV_CHAT, 400, "stream");
    expect_bad("{" M ",\"stream_options\":true}", SRV_CHAT, 400, "stream_options");
    expect_bad("{" M ",\"stream_options\":{\"include_usage\":\"yes\"}}", SRV_CHAT, 400, "include_usage");
    expect_bad("{" M ",\"logprobs\":1}", SRV_CHAT, 400, "logprobs");
    expect_bad("{" M ",\"top_logprobs\":3}", SRV_CHAT, 400, "top_logprobs");
    expect_bad("{" M ",\"logprobs\":true,\"top_logprobs\":21}", SRV_CHAT, 400, "top_logprobs");
    expect_bad("{" M ",\"tools\":{}}", SRV_CHAT, 400, "tools");
    expect_bad("{" M ",\"tools\":[{\"type\":\"function\"}]}", SRV_CHAT, 400, "tools");
    expect_bad("{" M ",\"tool_choice\":\"sometimes\"}", SRV_CHAT, 400, "tool_choice");
    expect_bad("{" M ",\"tool_choice\":{\"type\":\"function\"}}", SRV_CHAT, 400, "tool_choice");
    expect_bad("{" M ",\"chat_template_kwargs\":[]}", SRV_CHAT, 400, "chat_template_kwargs");
    expect_bad("{" M ",\"chat_template_kwargs\":{\"enable_thinking\":\"no\"}}", SRV_CHAT, 400, "enable_thinking");
    expect_bad("{" M ",\"model\":7}", SRV_CHAT, 400, "model");

    CHECK(parse("{" M ",\"logit_bias\":{\"12\":-100,\"7\":2.5}}", SRV_CHAT, &r, &e) == 0 && r.n_bias == 2 &&
              r.bias_ids[0] == 12 && r.bias_vals[0] == -100 && r.bias_ids[1] == 7 && r.bias_vals[1] == 2.5f,
          "logit_bias parsed in order (%s)", e.message);
    srv_request_free(&r);
    expect_bad("{" M ",\"logit_bias\":[1]}", SRV_CHAT, 400, "logit_bias");
    expect_bad("{" M ",\"logit_bias\":{\"x\":1}}", SRV_CHAT, 400, "logit_bias");
    expect_bad("{" M ",\"logit_bias\":{\"-3\":1}}", SRV_CHAT, 400, "logit_bias");
    expect_bad("{" M ",\"logit_bias\":{\"3\":101}}", SRV_CHAT, 400, "logit_bias");
    expect_bad("{" M ",\"logit_bias\":{\"3\":\"1\"}}", SRV_CHAT, 400, "logit_bias");
    expect_bad("{\"prompt\":\"x\",\"logit_bias\":{\"3x\":1}}", SRV_COMPLETION, 400, "logit_bias");

    /* response_format: shape checked here, the schema compiled by the server */
    CHECK(parse("{" M ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":"
                "{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"integer\"}}}}}}", SRV_CHAT, &r, &e) == 0 &&
              r.response_format == 2 && r.schema &&
              !strcmp(r.schema, "{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"integer\"}}}"),
          "json_schema: the schema kept as compact text (%s)", e.message);
    srv_request_free(&r);
    CHECK(parse("{" M ",\"response_format\":{\"type\":\"json_object\"}}", SRV_CHAT, &r, &e) == 0 &&
              r.response_format == 1 && !r.schema, "json_object");
    srv_request_free(&r);
    CHECK(parse("{" M ",\"response_format\":{\"type\":\"text\"}}", SRV_CHAT, &r, &e) == 0 && r.response_format == 0,
          "text");
    srv_request_free(&r);
    CHECK(parse("{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"}}", SRV_COMPLETION, &r, &e) == 0 &&
              r.response_format == 1, "completions take response_format too");
    srv_request_free(&r);
    expect_bad("{" M ",\"response_format\":\"json\"}", SRV_CHAT, 400, "response_format");
    expect_bad("{" M ",\"response_format\":{}}", SRV_CHAT, 400, "response_format");
    expect_bad("{" M ",\"response_format\":{\"type\":\"yaml\"}}", SRV_CHAT, 400, "response_format");
    expect_bad("{" M ",\"response_format\":{\"type\":\"json_schema\"}}", SRV_CHAT, 400, "response_format");
    expect_bad("{" M ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":3}}}", SRV_CHAT, 400,
               "response_format");
    expect_bad("{" M ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"required\","
               "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{}}}}", SRV_CHAT, 400,
               "response_format");

    /* completions */
    CHECK(parse("{\"prompt\":\"hello\",\"logprobs\":2,\"max_tokens\":3}", SRV_COMPLETION, &r, &e) == 0 && r.prompt &&
              !strcmp(r.prompt, "hello") && r.logprobs && r.top_logprobs == 2,
          "completion prompt: %s", e.message);
    srv_request_free(&r);
    CHECK(parse("{\"prompt\":[\"one\"]}", SRV_COMPLETION, &r, &e) == 0 && r.prompt && !strcmp(r.prompt, "one"),
          "one-string array prompt");
    srv_request_free(&r);
    CHECK(parse("{\"prompt\":[1,2,3]}", SRV_COMPLETION, &r, &e) == 0 && r.n_prompt_ids == 3 && r.prompt_ids[2] == 3,
          "token prompt");
    srv_request_free(&r);
    expect_bad("{}", SRV_COMPLETION, 400, "prompt");
    expect_bad("{\"prompt\":\"\"}", SRV_COMPLETION, 400, "prompt");
    expect_bad("{\"prompt\":[\"a\",\"b\"]}", SRV_COMPLETION, 400, "prompt");
    expect_bad("{\"prompt\":[1,-2]}", SRV_COMPLETION, 400, "prompt");
    expect_bad("{\"prompt\":\"x\",\"echo\":true}", SRV_COMPLETION, 400, "echo");
    expect_bad("{\"prompt\":\"x\",\"best_of\":3}", SRV_COMPLETION, 400, "best_of");
    expect_bad("{\"prompt\":\"x\",\"logprobs\":true}", SRV_COMPLETION, 400, "logprobs");

    /* the error body */
    srv_error_set(&e, 400, "invalid_request_error", "top_p", NULL, "bad \"quote\" %d", 5);
    char *js = srv_error_json(&e);
    json_t *o = json_loads(js, 0, NULL);
    json_t *eo = json_object_get(o, "error");
    CHECK(eo && !strcmp(json_string_value(json_object_get(eo, "message")), "bad \"quote\" 5") &&
              !strcmp(json_string_value(json_object_get(eo, "type")), "invalid_request_error") &&
              !strcmp(json_string_value(json_object_get(eo, "param")), "top_p") &&
              json_is_null(json_object_get(eo, "code")),
          "OpenAI error shape: %s", js);
    json_decref(o);
    free(js);
}

/* Reference: read byte by byte; the first stop string to be complete wins (the longest
 * when several end on the same byte); the output is the text before it. */
static size_t ref_stop(const char *t, size_t n, char **stops, int ns, int *hit) {
    *hit = 0;
    for (size_t e = 1; e <= n; e++) {
        size_t best = (size_t)-1;
        for (int i = 0; i < ns; i++) {
            size_t l = strlen(stops[i]);
            if (l && l <= e && !memcmp(t + e - l, stops[i], l) && e - l < best) best = e - l;
        }
        if (best != (size_t)-1) { *hit = 1; return best; }
    }
    return n;
}

static void test_stop(void) {
    const char alpha[] = "ab\xc3\xa9 ";  /* includes a two-byte character */
    int bad = 0, trials = 0, leaked = 0;
    for (int trial = 0; trial < 3000; trial++) {
        char text[200];
        size_t n = 0, want = 1 + lily_rng_u64(&rng) % 120;
        while (n < want) {
            int k = (int)(lily_rng_u64(&rng) % 4);
            if (k == 2) { text[n++] = alpha[2]; text[n++] = alpha[3]; }
            else text[n++] = alpha[k == 3 ? 4 : k];
        }
        text[n] = 0;
        char *stops[3];
        int ns = (int)(lily_rng_u64(&rng) % 4);
        char sb[3][8];
        for (int i = 0; i < ns; i++) {
            int l = 1 + (int)(lily_rng_u64(&rng) % 4);
            for (int k = 0; k < l; k++) sb[i][k] = "ab "[lily_rng_u64(&rng) % 3];
            sb[i][l] = 0;
            stops[i] = sb[i];
        }
        srv_stop f;
        srv_stop_init(&f, stops, ns);
        char *out = NULL;
        size_t on = 0, cap = 0;
        int hit = 0;
        for (size_t p = 0; p < n && !hit;) {
            size_t step = 1 + lily_rng_u64(&rng) % 5;
            if (p + step > n) step = n - p;
            hit = srv_stop_feed(&f, text + p, step, &out, &on, &cap) == 1;
            /* what is out so far never contains a stop string */
            for (int i = 0; i < ns && out; i++)
                if (strstr(out, stops[i])) leaked++;
            p += step;
        }
        if (!hit) srv_stop_flush(&f, &out, &on, &cap);
        int rhit;
        size_t rn = ref_stop(text, n, stops, ns, &rhit);
        trials++;
        if (rhit != hit || rn != on || (on && memcmp(out, text, on))) {
            if (bad++ < 3) fprintf(stderr, "stop mismatch: text '%s' out '%.*s' (ref %zu, hit %d/%d) stops '%s' '%s' '%s'\n",
                                   text, (int)on, out ? out : "", rn, hit, rhit, ns > 0 ? stops[0] : "",
                                   ns > 1 ? stops[1] : "", ns > 2 ? stops[2] : "");
        }
        free(out);
        srv_stop_free(&f);
    }
    CHECK(bad == 0, "%d of %d random splits differ from the reference", bad, trials);
    CHECK(leaked == 0, "a stop string reached the output %d times", leaked);

    /* a stop string split over three feeds; text before it released at once */
    srv_stop f;
    char *st1[] = { "STOP" };
    srv_stop_init(&f, st1, 1);
    char *out = NULL;
    size_t on = 0, cap = 0;
    CHECK(srv_stop_feed(&f, "hello S", 7, &out, &on, &cap) == 0 && on == 6, "holds only the possible start (%zu)", on);
    CHECK(srv_stop_feed(&f, "T", 1, &out, &on, &cap) == 0 && on == 6, "still held");
    CHECK(srv_stop_feed(&f, "OP and more", 11, &out, &on, &cap) == 1 && on == 6 && !memcmp(out, "hello ", 6), "stopped");
    CHECK(srv_stop_feed(&f, "x", 1, &out, &on, &cap) == 1 && on == 6, "nothing after a stop");
    free(out);
    srv_stop_free(&f);
}

static void test_responses(void) {
    /* a parsed output with reasoning, content and a tool call */
    const char *tools_js = "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                           "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}}}}}]";
    json_t *tools = json_loads(tools_js, 0, NULL);
    const char *gen = "Let me check.\n</think>\n\nSure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                      "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    chat_parse_opts po = { 1, tools, 7 };
    chat_parsed parsed;
    lily_status st = { 0 };
    CHECK(parse_output(gen, strlen(gen), &po, &parsed, &st) == LILY_OK, "parse: %s", st.msg);
    CHECK(parsed.n_calls == 1, "one call parsed (%d)", parsed.n_calls);
    json_t *resp = srv_chat_response("chatcmpl-x", "m", 123, &parsed, srv_finish_name(SRV_FINISH_STOP, parsed.n_calls),
                                     NULL, 10, 20, 4);
    json_t *ch = json_array_get(json_object_get(resp, "choices"), 0);
    json_t *msg = json_object_get(ch, "message");
    json_t *call = json_array_get(json_object_get(msg, "tool_calls"), 0);
    json_t *fn = json_object_get(call, "function");
    CHECK(!strcmp(json_string_value(json_object_get(resp, "object")), "chat.completion"), "object");
    CHECK(!strcmp(json_string_value(json_object_get(ch, "finish_reason")), "tool_calls"), "finish tool_calls");
    CHECK(!strcmp(json_string_value(json_object_get(msg, "role")), "assistant"), "role");
    CHECK(fn && !strcmp(json_string_value(json_object_get(fn, "name")), "get_weather"), "call name");
    json_t *args = fn ? json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL) : NULL;
    CHECK(args && !strcmp(json_string_value(json_object_get(args, "city")), "Paris") &&
              json_integer_value(json_object_get(args, "days")) == 3,
          "arguments typed by the schema");
    json_decref(args);
    CHECK(!strncmp(json_string_value(json_object_get(call, "id")), "call_", 5) &&
              !strcmp(json_string_value(json_object_get(call, "type")), "function"),
          "call id and type");
    CHECK(!strcmp(json_string_value(json_object_get(msg, "reasoning_content")), "Let me check."), "reasoning");
    CHECK(!strcmp(json_string_value(json_object_get(msg, "content")), "Sure."), "content beside the call");
    json_t *u = json_object_get(resp, "usage");
    CHECK(json_integer_value(json_object_get(u, "prompt_tokens")) == 10 &&
              json_integer_value(json_object_get(u, "completion_tokens")) == 20 &&
              json_integer_value(json_object_get(u, "total_tokens")) == 30 &&
              json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")) == 4,
          "usage");
    json_decref(resp);

    /* streaming the same text in random pieces gives chunks that accumulate to the same message */
    srv_stream s = { 0 };
    s.kind = SRV_CHAT;
    snprintf(s.id, sizeof s.id, "chatcmpl-y");
    s.model = "m";
    s.created = 5;
    s.include_usage = 1;
    parse_stream *ps;
    CHECK(parse_stream_new(&po, &ps, &st) == LILY_OK, "stream parser");
    chat_parsed acc = { 0 };
    char *sse = NULL;
    size_t sl = 0, scap = 0;
    int n_calls = 0;
    for (size_t p = 0, n = strlen(gen); p <= n;) {
        json_t *deltas = json_array();
        size_t step = 1 + lily_rng_u64(&rng) % 9;
        if (p + step > n) step = n - p;
        if (p == n) parse_stream_finish(ps, deltas, &st);
        else parse_stream_feed(ps, gen + p, step, deltas, &st);
        size_t i;
        json_t *d;
        json_array_foreach(deltas, i, d) {
            if (json_object_get(d, "tool_calls")) n_calls += (int)json_array_size(json_object_get(d, "tool_calls"));
            json_t *chunk = srv_chat_chunk(&s, json_incref(d), NULL, NULL);
            json_t *dd = json_object_get(json_array_get(json_object_get(chunk, "choices"), 0), "delta");
            out_accumulate(&acc, dd, &st);
            CHECK(json_is_null(json_object_get(chunk, "usage")), "usage: null on chunks when include_usage");
            srv_sse_append(&sse, &sl, &scap, chunk);
        }
        json_decref(deltas);
        if (p == n) break;
        p += step;
    }
    parse_stream_free(ps);
    CHECK(n_calls == 1 && acc.n_calls == 1 && !strcmp(acc.calls[0].name, "get_weather") &&
              !strcmp(acc.calls[0].arguments, parsed.calls[0].arguments) && !strcmp(acc.content, "Sure.") &&
              !strcmp(acc.reasoning, "Let me check."),
          "streamed deltas accumulate to the one-shot parse");
    CHECK(!strcmp(srv_finish_name(SRV_FINISH_STOP, n_calls), "tool_calls"), "stream finish reason");
    /* SSE framing: every event is "data: <json>\n\n" */
    int events = 0, framing = 1;
    for (char *p = sse; p && *p;) {
        char *e = strstr(p, "\n\n");
        if (strncmp(p, "data: ", 6) || !e) { framing = 0; break; }
        *e = 0;
        json_t *o = json_loads(p + 6, 0, NULL);
        if (!o) framing = 0;
        json_decref(o);
        events++;
        p = e + 2;
    }
    CHECK(framing && events >= 3, "SSE framing over %d events", events);
    free(sse);
    parse_free(&acc);
    parse_free(&parsed);
    json_decref(tools);

    CHECK(!strcmp(srv_finish_name(SRV_FINISH_LENGTH, 0), "length") && !strcmp(srv_finish_name(SRV_FINISH_STOP, 0), "stop"),
          "finish names");

    /* logprobs objects; a token holding half a character becomes U+FFFD in "token" */
    lily_token t[2] = { 0 };
    t[0].id = 1;
    t[0].logprob = -0.5f;
    t[0].n_top = 2;
    t[0].top_ids[0] = 1; t[0].top_logprobs[0] = -0.5f;
    t[0].top_ids[1] = 2; t[0].top_logprobs[1] = -INFINITY;
    t[1].id = 3;
    t[1].logprob = -1.25f;
    json_t *content = json_array();
    srv_logprobs_chat(NULL, t, 2, content);
    json_t *e0 = json_array_get(content, 0);
    CHECK(json_array_size(content) == 2 && json_real_value(json_object_get(e0, "logprob")) == -0.5 &&
              json_array_size(json_object_get(e0, "top_logprobs")) == 2 &&
              json_real_value(json_object_get(json_array_get(json_object_get(e0, "top_logprobs"), 1), "logprob")) == -9999.0,
          "chat logprobs (-inf clamped)");
    json_decref(content);
    json_t *ps1 = piece_string("a\xe4\xbd", 3), *ps2 = piece_string("\xe4\xbd\xa0", 3);
    CHECK(!strcmp(json_string_value(ps1), "a\xef\xbf\xbd\xef\xbf\xbd") && !strcmp(json_string_value(ps2), "\xe4\xbd\xa0"),
          "partial characters replaced, whole ones kept");
    json_decref(ps1);
    json_decref(ps2);
    json_t *lp = srv_logprobs_completion_new();
    long off = 0;
    srv_logprobs_completion(NULL, t, 2, lp, &off);
    CHECK(json_array_size(json_object_get(lp, "tokens")) == 2 && json_array_size(json_object_get(lp, "text_offset")) == 2,
          "completion logprobs");
    json_t *cc = srv_completion_chunk(&s, "hi", 2, "stop", lp);
    json_t *c0 = json_array_get(json_object_get(cc, "choices"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(c0, "text")), "hi") &&
              !strcmp(json_string_value(json_object_get(c0, "finish_reason")), "stop") &&
              !strcmp(json_string_value(json_object_get(cc, "object")), "text_completion"),
          "completion chunk");
    json_decref(cc);
}

static void test_metrics(void) {
    srv_metrics *m = srv_metrics_new();
    srv_metrics_request(m, "/v1/chat/completions", 200);
    srv_metrics_request(m, "/v1/chat/completions", 200);
    srv_metrics_request(m, "/nowhere", 404);
    srv_metrics_tokens(m, 10, 4, 7);
    srv_metrics_ttft(m, 0.003);
    srv_metrics_itl(m, 0.02);
    srv_metrics_itl(m, 0.2);
    char *t = srv_metrics_render(m, 3, 2, 4);
    CHECK(strstr(t, "lily_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2\n") != NULL, "request counter");
    CHECK(strstr(t, "lily_requests_total{route=\"other\",status=\"404\"} 1\n") != NULL, "unknown route counted");
    CHECK(strstr(t, "lily_prompt_tokens_total 10\n") && strstr(t, "lily_generation_tokens_total 7\n") &&
              strstr(t, "lily_prompt_tokens_cached_total 4\n"),
          "token counters");
    CHECK(strstr(t, "lily_queue_depth 3\n") && strstr(t, "lily_requests_running 2\n"), "gauges");
    CHECK(strstr(t, "lily_inter_token_latency_seconds_bucket{le=\"0.025\"} 1\n") &&
              strstr(t, "lily_inter_token_latency_seconds_bucket{le=\"0.25\"} 2\n") &&
              strstr(t, "lily_inter_token_latency_seconds_count 2\n"),
          "cumulative histogram buckets");
    CHECK(strstr(t, "lily_time_to_first_token_seconds_bucket{le=\"0.0025\"} 0\n") &&
              strstr(t, "lily_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n"),
          "ttft buckets");
    free(t);
    srv_metrics_free(m);
}

int main(void) {
    uint64_t seed = t_seed("test_server_units");
    lily_rng_seed(&rng, seed);
    test_request();
    test_stop();
    test_responses();
    test_metrics();
    return T_DONE();
}
