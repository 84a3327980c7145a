/* Fuzzes encode -> decode on arbitrary bytes with a small built-in tokenizer: the first
 * byte picks the regex path and the options; without a normalizer, decoding must give back
 * the input with ill-formed UTF-8 replaced, and the stream decoder must agree. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tok_internal.h"

static const char *const merge_list[] = {
    "\xC4\xA0 t", "h e", "\xC4\xA0t he", "i n", "in g", "\xC4\xA0 a", "e r", "o n", "\xC4\xA0 \xC4\xA0",
    "\xC4\xA0\xC4\xA0 \xC4\xA0\xC4\xA0", "\xC4\x8A \xC4\x8A", "' s", "1 2", "\xC3\x83 \xC2\xA9", "a a", "aa aa", "aaaa aaaa",
};
#define N_MERGES (int)(sizeof merge_list / sizeof merge_list[0])
static tok_tokenizer *toks[4];

static void build(void) {
    tok_unicode_init();
    static char *vocab[256 + N_MERGES];
    int n = 0;
    for (int b = 0; b < 256; b++) {
        uint32_t cp = tok_byte_to_cp[b];
        char *s = calloc(1, 3);
        if (cp < 0x80) s[0] = (char)cp; else { s[0] = (char)(0xC0 | (cp >> 6)); s[1] = (char)(0x80 | (cp & 0x3F)); }
        vocab[n++] = s;
    }
    for (int i = 0; i < N_MERGES; i++) {
        const char *m = merge_list[i], *sp = strchr(m, ' ');
        char *s = malloc(strlen(m));
        memcpy(s, m, (size_t)(sp - m)); strcpy(s + (sp - m), sp + 1);
        int dup = 0;
        for (int k = 0; k < n; k++) dup |= !strcmp(vocab[k], s);
        if (dup) free(s); else vocab[n++] = s;
    }
    tok_added added[] = {
        { (char *)"<|im_start|>", 12, 0, 1, 0, 0, 0, 0 }, { (char *)"<|im_end|>", 10, 0, 1, 0, 0, 0, 0 },
        { (char *)"<think>", 7, 0, 0, 0, 0, 0, 0 }, { (char *)"<x>", 3, 0, 0, 1, 1, 0, 0 },
    };
    for (int i = 0; i < 4; i++) added[i].id = n + i;
    const char *regex[4] = { TOK_REGEX_QWEN35, TOK_REGEX_QWEN2, TOK_REGEX_GPT2, "[a-z]+|\\d" };
    for (int i = 0; i < 4; i++)
        if (tok_from_parts((const char *const *)vocab, n, merge_list, N_MERGES, added, 4, TOK_NORM_NONE,
                           regex[i], &toks[i], NULL)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!toks[0]) build();
    if (size < 1) return 0;
    tok_tokenizer *t = toks[data[0] & 3];
    int special = (data[0] >> 2) & 1;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    int32_t *ids; int k;
    if (tok_encode(t, text, n, special, &ids, &k, NULL)) return 0;
    char *out; size_t len;
    if (tok_decode(t, ids, k, 0, &out, &len)) abort();
    size_t cl = 0; int oom = 0;
    char *clean = tok_utf8_sanitize(text, n, &cl, &oom);
    const char *want = clean ? clean : text;
    size_t wl = clean ? cl : n;
    int stripped = 0; /* <x> eats the spaces around it (lstrip/rstrip) */
    for (int i = 0; i < k; i++) stripped |= ids[i] == tok_id(t, "<x>");
    if (!stripped && (len != wl || memcmp(out, want, wl))) abort();
    tok_stream *s;
    tok_stream_new(t, 0, &s, NULL);
    size_t at = 0;
    for (int i = 0; i <= k; i++) {
        const char *p; size_t pl;
        if (i < k) tok_stream_push(s, ids[i], &p, &pl); else tok_stream_flush(s, &p, &pl);
        if (at + pl > len || memcmp(out + at, p, pl)) abort();
        at += pl;
    }
    if (at != len) abort();
    tok_stream_free(s);
    free(clean); free(out); free(ids);
    /* the same bytes as three parts, template-like parts parsed and the middle one plain */
    if (n >= 2) {
        size_t a = data[1] % (n + 1), b = a + (n - a) / 2;
        tok_part parts[3] = { { text, a, 1 }, { text + a, b - a, 0 }, { text + b, n - b, 1 } };
        if (tok_encode_parts(t, parts, 3, &ids, &k, NULL) == LILY_OK) {
            for (int i = 0; i < k; i++) if (ids[i] < 0 || ids[i] >= tok_vocab_size(t)) abort();
            free(ids);
        }
    }
    return 0;
}
