/* Mask and accept timings of the grammar module over a real tokenizer.
 * Build: make build/liblily.a && cc -O2 -Iinclude -Isrc bench/gram_bench.c build/liblily.a \
 *          -o build/gram-bench -ljansson -lpcre2-8 -lutf8proc -lm -pthread
 * Run:   build/gram-bench [../shared/data/qwen-tokenizer/qwen3/tokenizer.json] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "text/grammar.h"
#include "util/util.h"

/* the fastest of 20 (the dev VM is shared: the minimum is the repeatable number), on a
 * fresh matcher each time (cold) and again on the same state (repeat: the matcher keeps
 * the last state's walked ids, which is what happens inside a string) */
static void time_at(const gram_grammar *g, const gram_vocab *v, const char *prefix, const char *what) {
    int nv = gram_vocab_size(v);
    uint8_t *al = malloc((size_t)nv);
    double cold = 1e9, warm = 1e9;
    lily_status st;
    for (int i = 0; i < 20; i++) {
        gram_matcher *m;
        if (gram_matcher_new(g, &m, &st)) { printf("%s: %s\n", what, st.msg); free(al); return; }
        if (!gram_matcher_accept_bytes(m, prefix, strlen(prefix))) { printf("%s: prefix refused\n", what); gram_matcher_free(m); free(al); return; }
        double t0 = lily_now();
        gram_matcher_mask(m, v, al);
        double t1 = lily_now();
        gram_matcher_mask(m, v, al);
        double t2 = lily_now();
        if (t1 - t0 < cold) cold = t1 - t0;
        if (t2 - t1 < warm) warm = t2 - t1;
        gram_matcher_free(m);
    }
    int n = 0;
    for (int i = 0; i < nv; i++) n += al[i];
    printf("%-34s mask %8.3f ms, repeat %7.3f ms  (%d tokens allowed)\n", what, cold * 1e3, warm * 1e3, n);
    free(al);
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "../shared/data/qwen-tokenizer/qwen3/tokenizer.json";
    tok_tokenizer *t; lily_status st;
    if (tok_load(path, &t, &st)) { fprintf(stderr, "%s\n", st.msg); return 1; }
    gram_vocab *v;
    double t0 = lily_now();
    if (gram_vocab_new(t, tok_vocab_size(t), &v, &st)) { fprintf(stderr, "%s\n", st.msg); return 1; }
    printf("vocab %d tokens: gram_vocab_new %.1f ms\n", tok_vocab_size(t), (lily_now() - t0) * 1e3);
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
                         "\"score\":{\"type\":\"number\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":20}},"
                         "\"kind\":{\"enum\":[\"alpha\",\"beta\",\"gamma\"]}},\"required\":[\"name\",\"age\"]}";
    gram_grammar *g, *o;
    t0 = lily_now();
    if (gram_from_json_schema(schema, strlen(schema), &g, &st)) { fprintf(stderr, "%s\n", st.msg); return 1; }
    printf("schema compile %.3f ms\n", (lily_now() - t0) * 1e3);
    gram_json_object(&o, &st);
    time_at(g, v, "", "schema: start (before '{')");
    time_at(g, v, "{", "schema: start of object");
    time_at(g, v, "{\"name\": \"Al", "schema: inside a free string");
    { /* the state after another plain token inside the string is the same: replayed */
        gram_matcher *m; gram_matcher_new(g, &m, &st);
        uint8_t *al = malloc((size_t)gram_vocab_size(v));
        gram_matcher_accept_bytes(m, "{\"name\": \"Al", 12);
        gram_matcher_mask(m, v, al);
        gram_matcher_accept_bytes(m, " the", 4);
        double t1 = lily_now();
        gram_matcher_mask(m, v, al);
        printf("%-34s mask %8.3f ms\n", "schema: free string, next token", (lily_now() - t1) * 1e3);
        free(al); gram_matcher_free(m);
    }
    time_at(g, v, "{\"name\": \"Al\", \"age\": 4", "schema: inside an integer");
    time_at(g, v, "{\"name\": \"Al\", \"age\": 4, \"score\": 1.", "schema: inside a number fraction");
    time_at(g, v, "{\"name\": \"Al\", \"age\": 4, \"tags\": [\"ab", "schema: inside maxLength string");
    time_at(g, v, "{\"name\": \"Al\", \"age\": 4, \"kind\": \"", "schema: inside an enum");
    time_at(o, v, "{", "json_object: start of object");
    time_at(o, v, "{\"a\": [1, {\"b\": \"x", "json_object: inside a string");
    time_at(o, v, "{\"a\": [1, {\"b\": -12", "json_object: inside a number");
    /* tool calls */
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                        "\"properties\":{\"location\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
                        "\"opts\":{\"type\":\"object\",\"properties\":{\"lang\":{\"type\":\"string\"}}}},\"required\":[\"location\"]}}},"
                        "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"parameters\":{\"type\":\"object\","
                        "\"properties\":{\"q\":{\"type\":\"string\",\"maxLength\":100}},\"required\":[\"q\"]}}}]";
    gram_grammar *tx, *tj;
    if (gram_tool_call(tools, strlen(tools), GRAM_TOOLS_XML, NULL, 1, &tx, &st)) { fprintf(stderr, "%s\n", st.msg); return 1; }
    gram_free(tx); /* the first XML grammar builds the shared terminator automaton */
    t0 = lily_now();
    if (gram_tool_call(tools, strlen(tools), GRAM_TOOLS_XML, NULL, 1, &tx, &st)) { fprintf(stderr, "%s\n", st.msg); return 1; }
    double t1 = lily_now();
    if (gram_tool_call(tools, strlen(tools), GRAM_TOOLS_JSON, NULL, 1, &tj, &st)) { fprintf(stderr, "%s\n", st.msg); return 1; }
    printf("tool grammar compile: xml %.3f ms, json %.3f ms\n", (t1 - t0) * 1e3, (lily_now() - t1) * 1e3);
    time_at(tx, v, "", "tools xml: start");
    time_at(tx, v, "\n<function=", "tools xml: function name");
    time_at(tx, v, "\n<function=get_weather>\n<parameter=location>\nPar", "tools xml: inside a text value");
    time_at(tx, v, "\n<function=search>\n<parameter=q>\nab", "tools xml: inside a maxLength text");
    time_at(tx, v, "\n<function=get_weather>\n<parameter=location>\nPar\n</", "tools xml: text value after '</'");
    time_at(tx, v, "\n<function=get_weather>\n<parameter=location>\nP\n</parameter>\n<parameter=days>\n1", "tools xml: inside an integer");
    time_at(tx, v, "\n<function=get_weather>\n<parameter=location>\nP\n</parameter>\n<parameter=opts>\n{\"lang\": \"e", "tools xml: JSON string in a value");
    time_at(tj, v, "\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Par", "tools json: inside a string");
    time_at(tj, v, "\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call>", "tools json: after </tool_call>");
    gram_free(tx); gram_free(tj);
    /* accept_token cost */
    gram_matcher *m; gram_matcher_new(o, &m, &st);
    int32_t *ids; int n;
    const char *text = "{\"name\": \"The quick brown fox jumps over the lazy dog\", \"values\": [1, 2.5, -3e10, true, null], \"nested\": {\"k\": \"v\"}}";
    tok_encode(t, text, strlen(text), 0, &ids, &n, &st);
    int reps = 200; double acc = 0; int ok = 1;
    for (int r = 0; r < reps; r++) {
        gram_matcher_free(m); gram_matcher_new(o, &m, &st);
        t0 = lily_now();
        for (int i = 0; i < n; i++) ok &= gram_matcher_accept_token(m, v, ids[i]);
        acc += lily_now() - t0;
    }
    printf("accept_token: %.2f us per token (%d tokens, all accepted %d)\n", acc / reps / n * 1e6, n, ok);
    free(ids); gram_matcher_free(m);
    gram_free(g); gram_free(o); gram_vocab_free(v); tok_free(t);
    return 0;
}
