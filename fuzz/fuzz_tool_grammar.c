/* Fuzzes tool-call grammar compilation (gram_tool_call); whatever compiles must run
 * matcher steps safely over a small synthetic vocabulary (whose added tokens include
 * <tool_call> and </tool_call>), with mask and accept_token agreeing.
 * Input: one flags byte (bit 0 JSON format, bit 1 multi, bit 2 only the function "f"),
 * the tools JSON up to a NUL, then bytes that pick tokens and raw bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "text/grammar.h"

static gram_vocab *vocab;
static int n_vocab;

static void init(void) {
    char dir[] = "/tmp/fuzz_tool_grammar_XXXXXX", path[128], cfg[128];
    if (!mkdtemp(dir)) abort();
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    lily_status st;
    tok_tokenizer *t;
    if (tok_write_synth_json(path, 400, &st) || tok_load(path, &t, &st)) abort();
    n_vocab = tok_vocab_size(t);
    if (gram_vocab_new(t, n_vocab, &vocab, &st)) abort();
    tok_free(t);
    unlink(path); unlink(cfg); rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!vocab) init();
    if (size < 1) return 0;
    unsigned flags = data[0];
    data++; size--;
    const uint8_t *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - data) : size;
    gram_grammar *g = NULL;
    lily_status st;
    if (gram_tool_call((const char *)data, tlen, (flags & 1) ? GRAM_TOOLS_JSON : GRAM_TOOLS_XML, (flags & 4) ? "f" : NULL,
                       (flags >> 1) & 1, &g, &st) != LILY_OK) {
        if (!memchr(st.msg, 0, sizeof st.msg) || !st.msg[0] || g) abort();
        return 0;
    }
    gram_matcher *m;
    if (gram_matcher_new(g, &m, &st) == LILY_OK) {
        uint8_t *al = malloc((size_t)n_vocab);
        size_t pos = nul ? tlen + 1 : size;
        for (int step = 0; step < 12; step++) {
            gram_matcher_mask(m, vocab, al);
            int pick = -1, seen = 0, want = pos < size ? data[pos++] : step;
            for (int i = 0; i < n_vocab; i++)
                if (al[i] && seen++ <= want) pick = i;
            if (pick < 0) break;
            if (gram_matcher_accept_token(m, vocab, pick) != 1) abort(); /* mask and accept disagree */
        }
        if (pos < size) gram_matcher_accept_bytes(m, (const char *)data + pos, size - pos);
        gram_matcher_can_end(m);
        gram_matcher_must_end(m);
        free(al);
        gram_matcher_free(m);
    }
    gram_free(g);
    return 0;
}
