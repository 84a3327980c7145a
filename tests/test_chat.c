/* Chat template and output parsing: golden renders, Python-compatible printing, errors,
 * hand-checked parses, the streaming parser against the one-shot one at every byte split
 * and random multi-splits, and render -> parse round trips of random tool calls. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "t.h"
#include "text/chat.h"
#include "text/chat_pystr.h"
#include "util/util.h"

#define DATA "../shared/data/qwen-tokenizer"

static json_t *load_json(const char *s) {
    json_error_t e;
    json_t *j = json_loads(s, JSON_PRESERVE_ORDER, &e);
    if (!j) fprintf(stderr, "bad test JSON: %s: %s\n", e.text, s);
    return j;
}

/* ---- rendering ------------------------------------------------------------------ */

static void test_golden(void) {
    static const char *inputs[] = { "conversation", "multiturn-reasoning", "simple" };
    static const struct { const char *file; chat_template_kind kind; } tpl[] = {
        { "Qwen3.5-4B", CHAT_TEMPLATE_QWEN35 }, { "Qwen-Qwen3-0.6B", CHAT_TEMPLATE_QWEN3 } };
    char path[512];
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 3; i++)
            for (int nothink = 0; nothink < 2; nothink++) {
                lily_status st = { 0 };
                snprintf(path, sizeof path, DATA "/golden/chat/inputs/%s.json", inputs[i]);
                char *in = lily_read_file(path, NULL, &st);
                snprintf(path, sizeof path, DATA "/golden/chat/%s.%s.%s.txt", tpl[t].file, inputs[i],
                         nothink ? "nothink" : "default");
                char *want = lily_read_file(path, NULL, &st);
                CHECK(in && want, "golden files readable: %s", st.msg);
                if (!in || !want) { free(in); free(want); continue; }
                json_t *req = load_json(in);
                if (nothink) json_object_set_new(req, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", 0));
                char *got = NULL;
                lily_code rc = chat_render(req, tpl[t].kind, &got, &st);
                CHECK(rc == LILY_OK && !strcmp(got, want), "golden %s", path);
                free(got);
                free(in);
                free(want);
                json_decref(req);
            }
}

static void test_detect(void) {
    static const struct { const char *file; chat_template_kind kind; } c[] = {
        { "qwen3.6/chat_template.jinja", CHAT_TEMPLATE_QWEN36 }, { "qwen3.6/tokenizer_config.json", CHAT_TEMPLATE_QWEN36 },
        { "templates/Qwen3.5-4B.jinja", CHAT_TEMPLATE_QWEN35 }, { "templates/Qwen-Qwen3-0.6B.jinja", CHAT_TEMPLATE_QWEN3 },
        { "qwen3/tokenizer_config.json", CHAT_TEMPLATE_QWEN3 } };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char path[256];
        lily_status st = { 0 };
        snprintf(path, sizeof path, DATA "/%s", c[i].file);
        char *text = lily_read_file(path, NULL, &st);
        CHECK(text && chat_template_detect(text) == c[i].kind, "detect %s", c[i].file);
        free(text);
    }
    CHECK(chat_template_detect(NULL) == CHAT_TEMPLATE_QWEN36, "default kind");
    CHECK(chat_template_detect("{{ messages }}") == CHAT_TEMPLATE_QWEN36, "unknown text -> default");
    chat_template_kind k;
    CHECK(chat_template_from_name("qwen3.5", &k, NULL) == LILY_OK && k == CHAT_TEMPLATE_QWEN35, "name qwen3.5");
    CHECK(chat_template_from_name("llama", &k, NULL) == LILY_EINVAL, "unknown name refused");
}

static void test_python_printing(void) {
    static const struct { double x; const char *repr; } f[] = {
        { 0.1, "0.1" }, { 1e16, "1e+16" }, { 1e15, "1000000000000000.0" }, { 1e-05, "1e-05" }, { 0.0001, "0.0001" },
        { 5e-324, "5e-324" }, { 1.7976931348623157e308, "1.7976931348623157e+308" }, { -0.0, "-0.0" },
        { 123456789012345678.0, "1.2345678901234568e+17" }, { 2.5, "2.5" }, { 100.0, "100.0" }, { -1.5e-7, "-1.5e-07" },
        { 1.0 / 3, "0.3333333333333333" }, { 0.30000000000000004, "0.30000000000000004" },
        /* powers of two, where the digits that read back are not the correctly rounded ones */
        { 0x1p398, "6.455624695217272e+119" }, { 0x1p-78, "3.308722450212111e-24" }, { 0x1p898, "2.113178124542661e+270" },
        { 0x1p63, "9.223372036854776e+18" } };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        chat_buf b = { 0 };
        chat_py_float(&b, f[i].x);
        char *s = chat_buf_take(&b);
        CHECK(!strcmp(s, f[i].repr), "repr(%.17g) = %s, want %s", f[i].x, s, f[i].repr);
        free(s);
    }
    json_t *v = load_json("{\"s\": \"a\\\"b\\\\c\\n\\u0001\\u007f\\u00e9\\u2028\", \"l\": [1, 2.0, true, null, {}], \"e\": []}");
    chat_buf b = { 0 };
    chat_py_json(&b, v);
    char *s = chat_buf_take(&b);
    CHECK(!strcmp(s, "{\"s\": \"a\\\"b\\\\c\\n\\u0001\x7f\xc3\xa9\xe2\x80\xa8\", \"l\": [1, 2.0, true, null, {}], \"e\": []}"),
          "json.dumps form: %s", s);
    free(s);
    json_decref(v);
    size_t lo, hi;
    const char *ws = "\xe3\x80\x80 \x1c\xc2\x85x y\xc2\xa0\n\xe2\x80\xa8";
    chat_py_strip(ws, strlen(ws), &lo, &hi);
    CHECK(lo == 7 && hi == 10, "str.strip over unicode whitespace: [%zu, %zu)", lo, hi);
}

static void test_render_errors(void) {
    static const struct { const char *req; const char *msg; } c[] = {
        { "{\"messages\": []}", "no messages" },
        { "[1]", "must be a JSON object" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"developer\", \"content\": \"x\"}]}", "messages[1]: unknown role 'developer'" },
        { "{\"messages\": [{\"content\": \"q\"}]}", "messages[0] has no role" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": \"u\"}}]}]}", "image and video content is not supported" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_audio\"}]}]}", "unexpected content part type 'input_audio'" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "messages[0].content must be" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"system\", \"content\": \"s\"}]}", "system message must be at the beginning" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"<tool_response>x</tool_response>\"}]}", "no user query" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"tool_calls\": {}}]}", "tool_calls must be an array" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"[1]\"}}]}]}", "must be a JSON object" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": null}}]}]}", "must be a JSON object" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"{x\"}}]}]}", "not valid JSON" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": 3}}]}]}", "has no function name" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"reasoning_content\": 1}]}", "reasoning_content must be" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"tools\": {}}", "tools must be an array" },
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        json_t *req = load_json(c[i].req);
        for (int kind = 0; kind < 3; kind++) {
            /* Qwen3's template has no "system first" or "no user query" rule. */
            if (kind == CHAT_TEMPLATE_QWEN3 && (strstr(c[i].msg, "system message") || strstr(c[i].msg, "user query"))) continue;
            lily_status st = { 0 };
            char *out = (char *)1;
            lily_code rc = chat_render(req, (chat_template_kind)kind, &out, &st);
            CHECK(rc == LILY_EINVAL && out == NULL && strstr(st.msg, c[i].msg), "%s [%d]: rc %d msg '%s', want '%s'",
                  c[i].req, kind, rc, st.msg, c[i].msg);
        }
        json_decref(req);
    }
    /* The 3.5 and 3.6 differences, on one request. */
    json_t *req = load_json("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\", "
                            "\"reasoning_content\": \"r\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": "
                            "\"{\\\"b\\\": false, \\\"n\\\": null, \\\"x\\\": 1.50, \\\"l\\\": [true]}\"}}]}, {\"role\": \"user\", \"content\": \"q2\"}], "
                            "\"chat_template_kwargs\": {\"preserve_thinking\": true}, \"add_generation_prompt\": false}");
    char *p36 = NULL, *p35 = NULL;
    chat_render(req, CHAT_TEMPLATE_QWEN36, &p36, NULL);
    chat_render(req, CHAT_TEMPLATE_QWEN35, &p35, NULL);
    const char *tail = "<parameter=b>\n%s\n</parameter>\n<parameter=n>\n%s\n</parameter>\n<parameter=x>\n1.5\n</parameter>\n"
                       "<parameter=l>\n[true]\n</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\nq2<|im_end|>\n";
    char want36[1024], want35[1024];
    snprintf(want36, sizeof want36, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\na\n\n<tool_call>\n<function=f>\n");
    snprintf(want35, sizeof want35, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na\n\n<tool_call>\n<function=f>\n");
    size_t l36 = strlen(want36), l35 = strlen(want35);
    snprintf(want36 + l36, sizeof want36 - l36, tail, "false", "null");
    snprintf(want35 + l35, sizeof want35 - l35, tail, "False", "None");
    CHECK(p36 && !strcmp(p36, want36), "3.6 preserve_thinking and tojson args:\n%s", p36);
    CHECK(p35 && !strcmp(p35, want35), "3.5 ignores preserve_thinking, str() args:\n%s", p35);
    free(p36);
    free(p35);
    CHECK(chat_think_open(req, CHAT_TEMPLATE_QWEN36) == 0, "no generation prompt: not open");
    json_object_set_new(req, "add_generation_prompt", json_true());
    CHECK(chat_think_open(req, CHAT_TEMPLATE_QWEN36) == 1, "3.6 generation prompt opens <think>");
    CHECK(chat_think_open(req, CHAT_TEMPLATE_QWEN3) == 0, "qwen3 prompt does not");
    chat_parse_opts po;
    chat_parse_opts_for(req, CHAT_TEMPLATE_QWEN35, &po);
    CHECK(po.think_open == 1 && po.tools == NULL && po.id_seed == 0, "parse options from a request");
    json_object_set_new(json_object_get(req, "chat_template_kwargs"), "enable_thinking", json_false());
    CHECK(chat_think_open(req, CHAT_TEMPLATE_QWEN36) == 0, "enable_thinking false: closed");
    json_decref(req);
}

/* ---- parsing -------------------------------------------------------------------- */

static const char *TOOLS_JSON =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", \"properties\": {"
    "\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}, \"ratio\": {\"type\": \"number\"}, "
    "\"verbose\": {\"type\": \"boolean\"}, \"opts\": {\"type\": \"object\"}, \"tags\": {\"type\": \"array\"}, "
    "\"maybe\": {\"type\": [\"string\", \"null\"]}, \"n\": {\"type\": [\"integer\", \"null\"]}, "
    "\"any\": {\"anyOf\": [{\"type\": \"integer\"}, {\"type\": \"null\"}]}, \"e\": {\"enum\": [1, 2]}, "
    "\"es\": {\"enum\": [\"1\", \"2\"]}, \"mix\": {\"oneOf\": [{\"type\": \"number\"}, {\"type\": \"string\"}]}}}}}, "
    "{\"type\": \"function\", \"function\": {\"name\": \"search\", \"parameters\": {\"type\": \"object\", \"properties\": {"
    "\"query\": {\"type\": \"string\"}, \"limit\": {\"type\": \"integer\"}}}}}]";
static json_t *TOOLS;

static int same_parse(const chat_parsed *a, const chat_parsed *b) {
    if (strcmp(a->reasoning, b->reasoning) || strcmp(a->content, b->content) || a->n_calls != b->n_calls) return 0;
    for (int i = 0; i < a->n_calls; i++)
        if (strcmp(a->calls[i].id, b->calls[i].id) || strcmp(a->calls[i].name, b->calls[i].name) ||
            strcmp(a->calls[i].arguments, b->calls[i].arguments))
            return 0;
    return 1;
}

/* Streams text cut at the given offsets and folds the deltas back into a result. */
static int stream_parse(const char *t, size_t n, const size_t *cuts, int n_cuts, const chat_parse_opts *o,
                        chat_parsed *out) {
    parse_stream *s;
    memset(out, 0, sizeof *out);
    if (parse_stream_new(o, &s, NULL)) return -1;
    json_t *deltas = json_array();
    size_t at = 0;
    int rc = 0;
    for (int i = 0; i <= n_cuts && !rc; i++) {
        size_t to = i < n_cuts ? cuts[i] : n;
        rc = parse_stream_feed(s, t + at, to - at, deltas, NULL);
        at = to;
    }
    if (!rc) rc = parse_stream_finish(s, deltas, NULL);
    for (size_t i = 0; i < json_array_size(deltas) && !rc; i++) {
        json_t *d = json_array_get(deltas, i);
        const json_t *c = json_object_get(d, "content"), *r = json_object_get(d, "reasoning_content");
        if ((c && !json_string_length(c)) || (r && !json_string_length(r))) rc = -2; /* no empty deltas */
        if (!rc) rc = (int)out_accumulate(out, d, NULL);
    }
    if (!out->reasoning) out->reasoning = strdup("");
    if (!out->content) out->content = strdup("");
    json_decref(deltas);
    parse_stream_free(s);
    return rc;
}

static chat_parsed parse1(const char *t, int think_open) {
    chat_parse_opts o = { think_open, TOOLS, 7 };
    chat_parsed p;
    lily_code rc = parse_output(t, strlen(t), &o, &p, NULL);
    LILY_ASSERT(rc == LILY_OK);
    return p;
}

static void check_parse(const char *t, int think_open, const char *reasoning, const char *content, int n_calls,
                        const char *name0, const char *args0) {
    chat_parsed p = parse1(t, think_open);
    CHECK(!strcmp(p.reasoning, reasoning), "reasoning of %s: [%s] want [%s]", t, p.reasoning, reasoning);
    CHECK(!strcmp(p.content, content), "content of %s: [%s] want [%s]", t, p.content, content);
    CHECK(p.n_calls == n_calls, "calls in %s: %d want %d", t, p.n_calls, n_calls);
    if (p.n_calls && name0) {
        CHECK(!strcmp(p.calls[0].name, name0), "name %s", p.calls[0].name);
        CHECK(!strcmp(p.calls[0].arguments, args0), "arguments %s want %s", p.calls[0].arguments, args0);
        CHECK(strlen(p.calls[0].id) == 29 && !strncmp(p.calls[0].id, "call_", 5), "id %s", p.calls[0].id);
    }
    parse_free(&p);
}

#define CALL(body) "<tool_call>\n<function=" body "\n</function>\n</tool_call>"
#define PARAM(k, v) "\n<parameter=" k ">\n" v "\n</parameter>"

static void test_parse_cases(void) {
    check_parse("I should greet.\n</think>\n\nHello!", 1, "I should greet.", "Hello!", 0, 0, 0);
    check_parse("\nStill thinking about it\n\n", 1, "Still thinking about it", "", 0, 0, 0);
    check_parse("Still </thi", 1, "Still </thi", "", 0, 0, 0);
    check_parse("Hello there.\nBye.", 0, "", "Hello there.\nBye.", 0, 0, 0);
    check_parse("\n<think>\nr1\n</think>\n\nc1", 0, "r1", "c1", 0, 0, 0);
    check_parse("<think>r", 0, "r", "", 0, 0, 0);
    check_parse("<thin", 0, "", "<thin", 0, 0, 0);
    check_parse("a </think> b", 0, "", "a </think> b", 0, 0, 0);
    check_parse("r</think>\n\nLet me check.\n\n" CALL("get_weather>" PARAM("city", "Paris") PARAM("days", "3")
               PARAM("ratio", "0.50") PARAM("verbose", "true") PARAM("opts", "{\"b\": 1, \"a\": [null]}")
               PARAM("tags", "[\"x\",\"y\"]") PARAM("maybe", "null") PARAM("n", "null") PARAM("any", "5")
               PARAM("e", "2") PARAM("es", "2") PARAM("mix", "2")), 1,
               "r", "Let me check.", 1, "get_weather",
               "{\"city\": \"Paris\", \"days\": 3, \"ratio\": 0.5, \"verbose\": true, \"opts\": {\"b\": 1, \"a\": [null]}, "
               "\"tags\": [\"x\", \"y\"], \"maybe\": \"null\", \"n\": null, \"any\": 5, \"e\": 2, \"es\": \"2\", \"mix\": \"2\"}");
    /* strings stay verbatim; a value that does not parse falls back to a string */
    check_parse(CALL("get_weather>" PARAM("city", "007") PARAM("days", "three") PARAM("unknown", "5")
                     PARAM("city", "\nline1\nline2 </param>\n")), 0, "", "", 1, "get_weather",
                "{\"city\": \"\\nline1\\nline2 </param>\\n\", \"days\": \"three\", \"unknown\": \"5\"}");
    check_parse(CALL("search>" PARAM("query", "a") PARAM("limit", "2")) "\n" CALL("search>" PARAM("query", "b")) "\n", 0,
                "", "", 2, "search", "{\"query\": \"a\", \"limit\": 2}");
    check_parse(CALL(" search >"), 0, "", "", 1, "search", "{}");
    check_parse("<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"q\", \"limit\": 3}}\n</tool_call>", 0,
                "", "", 1, "search", "{\"query\": \"q\", \"limit\": 3}");
    check_parse("<tool_call>\n{\"name\": \"search\", \"arguments\": \"{\\\"query\\\": \\\"q\\\"}\"}\n</tool_call>", 0,
                "", "", 1, "search", "{\"query\": \"q\"}");
    check_parse("<tool_call>\n{\"name\": \"search\", \"arguments\": [1]}\n</tool_call>", 0,
                "", "<tool_call>\n{\"name\": \"search\", \"arguments\": [1]}\n</tool_call>", 0, 0, 0);
    /* malformed calls come back as content, verbatim */
    check_parse("x\n" CALL("nosuch>" PARAM("a", "1")), 0, "", "x" CALL("nosuch>" PARAM("a", "1")), 0, 0, 0);
    check_parse(CALL("search>\n<parameter=query>\nq\n"), 0, "", CALL("search>\n<parameter=query>\nq\n"), 0, 0, 0);
    check_parse(CALL("search>" PARAM("query", "q")) "junk", 0, "", "junk", 1, "search", "{\"query\": \"q\"}");
    check_parse("a\n\n<tool_call>\n<function=search>" PARAM("query", "q"), 0, "",
                "a<tool_call>\n<function=search>" PARAM("query", "q"), 0, 0, 0);
    check_parse("<tool_call>\n<function=search>\n</function>\n</tool_call>\ntrailing\n</tool_call>", 0, "",
                "trailing\n</tool_call>", 1, "search", "{}");
    check_parse("<tool_call><function=search><parameter=query>x</parameter></function>extra</tool_call>", 0, "",
                "<tool_call><function=search><parameter=query>x</parameter></function>extra</tool_call>", 0, 0, 0);
    /* invalid UTF-8 and NUL become U+FFFD */
    const char bad[] = "ok\xff\xe4\xb8 \xed\xa0\x80!";
    chat_parse_opts o = { 0, TOOLS, 1 };
    chat_parsed p;
    parse_output(bad, sizeof bad - 1, &o, &p, NULL);
    CHECK(!strcmp(p.content, "ok\xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd!"), "replacement: %s", p.content);
    parse_free(&p);
    parse_output("a\0b", 3, &o, &p, NULL);
    CHECK(!strcmp(p.content, "a\xef\xbf\xbd" "b"), "NUL replaced");
    parse_free(&p);
    /* without tools every call is content */
    o.tools = NULL;
    parse_output(CALL("search>"), strlen(CALL("search>")), &o, &p, NULL);
    CHECK(p.n_calls == 0 && !strcmp(p.content, CALL("search>")), "no tools: call stays content");
    parse_free(&p);
}

static void test_out_message(void) {
    chat_parsed p = parse1("hmm</think>\n\n" CALL("search>" PARAM("query", "q")), 1);
    json_t *m = out_message(&p);
    CHECK(m && json_is_null(json_object_get(m, "content")), "content null with calls");
    CHECK(!strcmp(json_string_value(json_object_get(m, "reasoning_content")), "hmm"), "reasoning_content");
    json_t *tc = json_array_get(json_object_get(m, "tool_calls"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(tc, "function"), "arguments")), "{\"query\": \"q\"}") &&
          !strcmp(json_string_value(json_object_get(tc, "type")), "function") &&
          !strcmp(json_string_value(json_object_get(tc, "id")), p.calls[0].id), "tool call object");
    CHECK(!strcmp(out_finish_reason(&p, 1), "tool_calls"), "finish tool_calls");
    json_decref(m);
    parse_free(&p);
    p = parse1("just text", 0);
    m = out_message(&p);
    CHECK(!strcmp(json_string_value(json_object_get(m, "content")), "just text") && !json_object_get(m, "tool_calls") &&
          !json_object_get(m, "reasoning_content"), "plain message");
    CHECK(!strcmp(out_finish_reason(&p, 0), "stop") && !strcmp(out_finish_reason(&p, 1), "length"), "finish stop/length");
    json_decref(m);
    parse_free(&p);
    p = parse1("", 0);
    m = out_message(&p);
    CHECK(json_is_string(json_object_get(m, "content")), "empty answer without calls: content \"\"");
    json_decref(m);
    parse_free(&p);
}

/* ---- streaming == one-shot ---------------------------------------------------------- */

static const char *piece(lily_rng *r, const char *const *set, size_t n) { return set[lily_rng_u64(r) % n]; }

/* A model-like output: reasoning, content with tag look-alikes, valid and broken tool
 * calls, multi-byte characters (so byte splits land inside them) and a few bad bytes. */
static void gen_output(lily_rng *r, chat_buf *b, int *think_open) {
    static const char *const text[] = {
        "Let me", " think", "\n", "\n\n", "中文", "😀", "é", "<", "</", "</thi", "<tool", "<tool_call", "</tool_call>",
        "<think>", " ", "ok.", "x<y", ">", "\xff", "\xe4\xb8", "\xf0\x9f", "\r\n", "<function=search>", "</think" };
    static const char *const calls[] = {
        CALL("search>" PARAM("query", "héllo\nworld") PARAM("limit", "5")),
        CALL("get_weather>" PARAM("city", "東京") PARAM("opts", "{\"deep\": {\"x\": [1, 2.5e-7]}}") PARAM("verbose", "yes")),
        "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"😀\"}}\n</tool_call>",
        CALL("nosuch>" PARAM("a", "1")),
        CALL("search>\n<parameter=query>\nunclosed"),
        "<tool_call>\n<function=search>\n",
        "<tool_call></tool_call>" };
    *think_open = lily_rng_u64(r) % 2;
    if (!*think_open && lily_rng_u64(r) % 3 == 0) chat_buf_adds(b, lily_rng_u64(r) % 2 ? "<think>\n" : "\n<think>");
    int n = 1 + (int)(lily_rng_u64(r) % 8);
    for (int i = 0; i < n; i++) chat_buf_adds(b, piece(r, text, sizeof text / sizeof *text));
    if (lily_rng_u64(r) % 4) chat_buf_adds(b, "\n</think>\n\n");
    n = (int)(lily_rng_u64(r) % 10);
    for (int i = 0; i < n; i++)
        chat_buf_adds(b, lily_rng_u64(r) % 3 ? piece(r, text, sizeof text / sizeof *text)
                                             : piece(r, calls, sizeof calls / sizeof *calls));
}

static void check_splits(const char *t, size_t n, int think_open, lily_rng *r, int *n_checked) {
    chat_parse_opts o = { think_open, TOOLS, 1 + lily_rng_u64(r) % 1000 };
    chat_parsed want, got;
    if (parse_output(t, n, &o, &want, NULL)) { CHECK(0, "one-shot parse failed"); return; }
    int bad = 0;
    for (size_t cut = 0; cut <= n && !bad; cut++) { /* every single split point */
        int rc = stream_parse(t, n, &cut, 1, &o, &got);
        if (rc || !same_parse(&want, &got)) {
            bad = 1;
            CHECK(0, "split at %zu of [%.*s] (think_open %d): rc %d\n  want r[%s] c[%s] %d calls\n  got  r[%s] c[%s] %d calls",
                  cut, (int)n, t, think_open, rc, want.reasoning, want.content, want.n_calls, got.reasoning,
                  got.content, got.n_calls);
        }
        parse_free(&got);
    }
    for (int k = 0; k < 8 && !bad; k++) { /* random multi-splits, byte-by-byte included */
        size_t cuts[64];
        int nc = k == 0 ? (int)(n < 64 ? n : 64) : (int)(lily_rng_u64(r) % 12);
        for (int i = 0; i < nc; i++) cuts[i] = k == 0 ? (size_t)i + 1 : (size_t)(lily_rng_u64(r) % (n + 1));
        for (int i = 1; i < nc; i++) /* sort */
            for (int j = i; j > 0 && cuts[j - 1] > cuts[j]; j--) { size_t x = cuts[j]; cuts[j] = cuts[j - 1]; cuts[j - 1] = x; }
        int rc = stream_parse(t, n, cuts, nc, &o, &got);
        if (rc || !same_parse(&want, &got)) {
            bad = 1;
            CHECK(0, "multi-split of [%.*s]: rc %d, got c[%s]", (int)n, t, rc, got.content);
        }
        parse_free(&got);
    }
    if (!bad) t_pass++;
    (*n_checked)++;
    parse_free(&want);
}

static void test_stream_equivalence(uint64_t seed) {
    lily_rng r;
    lily_rng_seed(&r, seed);
    int n_checked = 0;
    static const char *fixed[] = {
        "I should greet.\n</think>\n\nHello!", "<think>\nr1\n</think>\n\nc1", "a\n\n" CALL("search>" PARAM("query", "q")) "\n\nb\n",
        "x\n" CALL("nosuch>" PARAM("a", "1")) "\n", "\n\n\n", "<", "</think>", "<tool_call>", "\n<thin\n", "é😀\n</think>é" };
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++)
        for (int open = 0; open < 2; open++) check_splits(fixed[i], strlen(fixed[i]), open, &r, &n_checked);
    for (int i = 0; i < 300; i++) {
        chat_buf b = { 0 };
        int open;
        gen_output(&r, &b, &open);
        check_splits(b.p ? b.p : "", b.n, open, &r, &n_checked);
        chat_buf_free(&b);
    }
    printf("streaming == one-shot on %d texts (seed %llu)\n", n_checked, (unsigned long long)seed);
}

/* ---- render -> parse round trip ------------------------------------------------------ */

static json_t *random_value(lily_rng *r, const char *type) {
    static const char *const strs[] = { "Paris", "", "two\nlines", " spaced ", "中文 😀", "\"q\" \\ <b>", "\n", "123", "true", "null" };
    if (!strcmp(type, "string")) {
        chat_buf b = { 0 };
        int n = 1 + (int)(lily_rng_u64(r) % 3);
        for (int i = 0; i < n; i++) chat_buf_adds(&b, strs[lily_rng_u64(r) % 10]);
        char *s = chat_buf_take(&b);
        json_t *v = json_string(s);
        free(s);
        return v;
    }
    if (!strcmp(type, "integer")) return json_integer((json_int_t)(lily_rng_u64(r) % 2000001) - 1000000);
    if (!strcmp(type, "number")) return json_real((lily_rng_uniform(r) - 0.5) * pow(10, (int)(lily_rng_u64(r) % 40) - 20));
    if (!strcmp(type, "boolean")) return json_boolean(lily_rng_u64(r) % 2);
    if (!strcmp(type, "array")) return json_pack("[s,i,{s:n}]", "a", 1, "k");
    return json_pack("{s:{s:[f,b]},s:s}", "deep", "x", 2.5, 1, "é", "v");
}

static void test_roundtrip(uint64_t seed) {
    static const char *const params[] = { "city", "days", "ratio", "verbose", "opts", "tags" };
    static const char *const types[] = { "string", "integer", "number", "boolean", "object", "array" };
    lily_rng r;
    lily_rng_seed(&r, seed);
    int ok = 0, total = 200, n_split = 0;
    for (int it = 0; it < total; it++) {
        json_t *calls = json_array(), *expect = json_array();
        int n_calls = 1 + (int)(lily_rng_u64(&r) % 3);
        for (int c = 0; c < n_calls; c++) {
            json_t *args = json_object();
            for (int k = 0; k < 6; k++)
                if (lily_rng_u64(&r) % 2) json_object_set_new(args, params[k], random_value(&r, types[k]));
            chat_buf b = { 0 };
            chat_py_json(&b, args);
            char *s = chat_buf_take(&b);
            json_array_append_new(expect, json_string(s));
            json_array_append_new(calls, json_pack("{s:s,s:{s:s,s:s}}", "type", "function", "function", "name",
                                                   "get_weather", "arguments", s));
            free(s);
            json_decref(args);
        }
        const char *content = lily_rng_u64(&r) % 2 ? "Checking the weather." : "";
        json_t *req = json_pack("{s:[{s:s,s:s},{s:s,s:s,s:s,s:o}],s:O,s:b}", "messages", "role", "user", "content", "q",
                                "role", "assistant", "reasoning_content", "need weather\nfor 東京", "content", content,
                                "tool_calls", calls, "tools", TOOLS, "add_generation_prompt", 0);
        char *prompt = NULL;
        lily_status st = { 0 };
        int good = !chat_render(req, CHAT_TEMPLATE_QWEN36, &prompt, &st);
        /* What the model would have written after the generation prompt "...assistant\n<think>\n". */
        const char *start = good ? strstr(prompt, "<|im_start|>assistant\n<think>\n") : NULL;
        good = start != NULL;
        if (good) {
            start += strlen("<|im_start|>assistant\n<think>\n");
            size_t n = strlen(start) - strlen("<|im_end|>\n");
            chat_parse_opts o;
            chat_parse_opts_for(req, CHAT_TEMPLATE_QWEN36, &o);
            o.think_open = 1; /* the generation prompt would have opened <think> */
            chat_parsed p;
            good = !parse_output(start, n, &o, &p, NULL) && !strcmp(p.reasoning, "need weather\nfor 東京") &&
                   !strcmp(p.content, content) && p.n_calls == n_calls;
            for (int c = 0; good && c < n_calls; c++)
                good = !strcmp(p.calls[c].name, "get_weather") &&
                       !strcmp(p.calls[c].arguments, json_string_value(json_array_get(expect, (size_t)c)));
            if (!good) fprintf(stderr, "round trip failed:\n%s\n", start);
            parse_free(&p);
            if (it < 40) check_splits(start, n, 1, &r, &n_split);
        }
        ok += good;
        free(prompt);
        json_decref(req);
        json_decref(expect);
    }
    CHECK(ok == total, "render -> parse round trips: %d of %d", ok, total);
    CHECK(n_split == 40, "rendered outputs split at every byte: %d", n_split);
}

int main(void) {
    uint64_t seed = t_seed("test_chat");
    TOOLS = load_json(TOOLS_JSON);
    test_golden();
    test_detect();
    test_python_printing();
    test_render_errors();
    test_parse_cases();
    test_out_message();
    test_stream_equivalence(seed);
    test_roundtrip(seed);
    json_decref(TOOLS);
    return T_DONE();
}
