/* Output parser on arbitrary bytes: the streaming parser, fed in random chunks, must
 * agree exactly with the one-shot parse, and neither may crash.
 * Input: byte 0 = flags (bit 0 think_open, bit 1 no tools), bytes 1..2 = chunking seed,
 * the rest = generated text. */
#include <stdlib.h>
#include <string.h>
#include "text/chat.h"
#include "util/util.h"

static const char *TOOLS_JSON =
    "[{\"type\": \"function\", \"function\": {\"name\": \"search\", \"parameters\": {\"type\": \"object\", \"properties\": {"
    "\"query\": {\"type\": \"string\"}, \"limit\": {\"type\": \"integer\"}, \"x\": {\"type\": [\"number\", \"null\"]}}}}},"
    "{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]";

static int same(const chat_parsed *a, const chat_parsed *b) {
    if (strcmp(a->reasoning, b->reasoning) || strcmp(a->content, b->content) || a->n_calls != b->n_calls) return 0;
    for (int i = 0; i < a->n_calls; i++)
        if (strcmp(a->calls[i].id, b->calls[i].id) || strcmp(a->calls[i].name, b->calls[i].name) ||
            strcmp(a->calls[i].arguments, b->calls[i].arguments))
            return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *tools;
    if (!tools) tools = json_loads(TOOLS_JSON, JSON_PRESERVE_ORDER, NULL);
    if (size < 3) return 0;
    chat_parse_opts o = { data[0] & 1, (data[0] & 2) ? NULL : tools, 42 };
    lily_rng r;
    lily_rng_seed(&r, (uint64_t)data[1] << 8 | data[2]);
    const char *text = (const char *)data + 3;
    size_t n = size - 3;

    chat_parsed want, got = { 0 };
    if (parse_output(text, n, &o, &want, NULL)) return 0;
    parse_stream *s;
    if (parse_stream_new(&o, &s, NULL)) abort();
    json_t *deltas = json_array();
    size_t at = 0;
    while (at < n) {
        size_t len = 1 + lily_rng_u64(&r) % (lily_rng_u64(&r) % 2 ? 4 : 40);
        if (len > n - at) len = n - at;
        if (parse_stream_feed(s, text + at, len, deltas, NULL)) abort();
        at += len;
    }
    if (parse_stream_finish(s, deltas, NULL)) abort();
    for (size_t i = 0; i < json_array_size(deltas); i++)
        if (out_accumulate(&got, json_array_get(deltas, i), NULL)) abort();
    if (!got.reasoning) got.reasoning = strdup("");
    if (!got.content) got.content = strdup("");
    if (!same(&want, &got)) abort();
    json_t *m = out_message(&want);
    if (!m) abort();
    json_decref(m);
    json_decref(deltas);
    parse_stream_free(s);
    parse_free(&want);
    parse_free(&got);
    return 0;
}
