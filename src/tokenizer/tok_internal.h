/* Internals of the tokenizer module, shared by its .c files and its tests. */
#ifndef LILY_TOK_INTERNAL_H
#define LILY_TOK_INTERNAL_H
#include <pthread.h>
#include <stdint.h>
#include <stddef.h>
#include "tokenizer/tokenizer.h"

/* ---- hash maps (open addressing, power-of-two capacity) ---- */
typedef struct {          /* byte string -> int32 */
    uint32_t cap, n;
    uint32_t *slot;       /* 0 = empty, else entry index + 1 */
    uint64_t *hash;       /* per entry */
    uint32_t *off, *len;  /* key bytes in blob, per entry */
    int32_t *val;
    char *blob; size_t blob_len, blob_cap;
    uint32_t ecap;
} tok_strmap;
int tok_strmap_init(tok_strmap *m, uint32_t expect);
void tok_strmap_free(tok_strmap *m);
/* Inserts (returns 1) or overwrites (returns 2); 0 on allocation failure. */
int tok_strmap_put(tok_strmap *m, const char *k, size_t n, int32_t v);
int32_t tok_strmap_get(const tok_strmap *m, const char *k, size_t n); /* -1 if absent */

typedef struct {          /* (left id, right id) -> (rank, result id) */
    uint32_t cap, n;
    uint64_t *key;        /* UINT64_MAX = empty */
    uint32_t *rank;
    int32_t *res;
} tok_pairmap;
int tok_pairmap_init(tok_pairmap *m, uint32_t expect);
void tok_pairmap_free(tok_pairmap *m);
int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t res);
static inline uint64_t tok_mix64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
    return x;
}
/* rank or UINT32_MAX when the pair does not merge */
static inline uint32_t tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b, int32_t *res) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = (uint32_t)tok_mix64(k) & (m->cap - 1);
    for (;;) {
        uint64_t s = m->key[i];
        if (s == k) { *res = m->res[i]; return m->rank[i]; }
        if (s == UINT64_MAX) return UINT32_MAX;
        i = (i + 1) & (m->cap - 1);
    }
}
uint64_t tok_hash_bytes(const char *p, size_t n);

/* ---- unicode helpers ---- */
/* Character classes the Qwen regexes care about. */
enum { TOK_CL_L = 1, TOK_CL_N = 2, TOK_CL_M = 4, TOK_CL_WS = 8, TOK_CL_NL = 16 };
extern uint8_t tok_bmp_class[0x30000]; /* planes 0-2 */
void tok_unicode_init(void); /* fills tok_bmp_class once (thread-safe) */
int tok_class_slow(uint32_t cp);
static inline int tok_class(uint32_t cp) {
    return cp < 0x30000 ? tok_bmp_class[cp] : tok_class_slow(cp);
}
/* Decodes one code point from valid UTF-8; returns its byte length. */
static inline int tok_utf8_next(const unsigned char *s, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    if (c < 0xE0) { *cp = ((c & 0x1F) << 6) | (s[1] & 0x3F); return 2; }
    if (c < 0xF0) { *cp = ((c & 0x0F) << 12) | ((s[1] & 0x3F) << 6) | (s[2] & 0x3F); return 3; }
    *cp = ((c & 0x07) << 18) | ((s[1] & 0x3F) << 12) | ((s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    return 4;
}
/* Length of the valid UTF-8 sequence at s (n >= 1 bytes left). 0 when ill-formed and -1
 * when the input ends inside a valid prefix; in both cases *sub gets the length of the
 * maximal ill-formed subpart (>= 1), which becomes one U+FFFD. */
int tok_utf8_check(const unsigned char *s, size_t n, size_t *sub);
/* Replaces ill-formed UTF-8 with U+FFFD into a new buffer; returns NULL (and *out_len
 * untouched) when s is already valid. Sets *oom on allocation failure. */
char *tok_utf8_sanitize(const char *s, size_t n, size_t *out_len, int *oom);

/* GPT-2 byte <-> unicode alphabet */
extern uint32_t tok_byte_to_cp[256];
int tok_cp_to_byte(uint32_t cp); /* -1 if cp is not in the alphabet */

/* ---- normalizer, pre-tokenizer ---- */
enum { TOK_NORM_NONE = 0, TOK_NORM_NFC, TOK_NORM_NFD, TOK_NORM_NFKC, TOK_NORM_NFKD };
enum { TOK_PRE_QWEN2 = 1, TOK_PRE_QWEN35, TOK_PRE_PCRE, TOK_PRE_NONE };
extern const char TOK_REGEX_QWEN2[];
extern const char TOK_REGEX_QWEN35[];
extern const char TOK_REGEX_GPT2[];

typedef struct tok_pretok tok_pretok;
/* regex: as the tokenizer file gives it (Oniguruma syntax); literal: a plain string split. */
lily_code tok_pretok_new(const char *regex, int literal, int force_pcre, tok_pretok **out,
                         lily_status *st);
void tok_pretok_free(tok_pretok *p);
int tok_pretok_kind(const tok_pretok *p);
/* Splits valid UTF-8 text into pieces; calls fn for each non-empty piece.
 * Returns 0 on success, -1 when fn fails or memory runs out. */
typedef int (*tok_piece_fn)(void *ctx, const char *s, size_t n);
int tok_pretok_split(const tok_pretok *p, const char *s, size_t n, tok_piece_fn fn, void *ctx);

/* Normalizes valid UTF-8; returns NULL when the text is unchanged (fast path) and sets
 * *oom on failure. */
char *tok_normalize(int kind, const char *s, size_t n, size_t *out_len, int *oom);

/* ---- the tokenizer ---- */
typedef struct {
    char *content; size_t len;
    int32_t id;
    uint8_t special, lstrip, rstrip, single_word, normalized;
} tok_added;

typedef struct {
    pthread_mutex_t mu;
    uint32_t cap;          /* slots, power of two */
    uint64_t *hash;        /* 0 = empty */
    uint32_t *key_off;     /* into arena */
    uint16_t *key_len, *n_ids;
    uint32_t *ids_off;     /* into id arena */
    char *keys; size_t keys_len, keys_cap;
    int32_t *ids; size_t ids_len, ids_cap;
    uint32_t used;
} tok_cache;

struct tok_tokenizer {
    int n_vocab;                 /* max id + 1 */
    char *pieces; uint32_t *piece_off, *piece_len; /* raw bytes per id; len UINT32_MAX = none */
    uint8_t *flags;              /* per id: 1 added, 2 special */
    tok_strmap vocab;            /* token string (file form) -> id, regular and added */
    tok_pairmap merges;
    int32_t byte_id[256];        /* id of the single-byte symbol, -1 if none */
    int32_t unk_id; int fuse_unk; int ignore_merges;
    tok_added *added; int n_added;
    uint8_t added_first[256];    /* bit 1: a raw-matched added token starts with this byte; bit 2: a normalized one */
    int norm;
    tok_pretok *pre;
    tok_cache cache;
};

/* tokenizer.json fast path (tok_json.c) */
typedef struct { const char *s; size_t n; int32_t id; } tok_vocab_ent;
int tok_json_find_parts(const char *s, size_t n, size_t *vb, size_t *ve, size_t *mb, size_t *me);
int tok_json_vocab(const char *s, size_t n, tok_vocab_ent **out, size_t *nout, char **arena);
int tok_json_merges(const char *s, size_t n, int (*fn)(void *, const char *, size_t, const char *, size_t),
                    void *ctx);

/* BPE on one pre-tokenized word (raw bytes); appends ids. */
typedef struct { int32_t *v; size_t n, cap; } tok_ids;
int tok_ids_push(tok_ids *a, int32_t id);
int tok_bpe_word(const tok_tokenizer *t, const char *w, size_t n, tok_ids *out);
void tok_cache_init(tok_cache *c);
void tok_cache_free(tok_cache *c);

/* Tokenizer from an in-memory vocabulary (used by tests and fuzzers): `vocab` are token
 * strings in file form for ids 0..n_vocab-1, merges "a b" strings in rank order. */
lily_code tok_from_parts(const char *const *vocab, int n_vocab, const char *const *merges,
                         int n_merges, const tok_added *added, int n_added, int norm,
                         const char *regex, tok_tokenizer **out, lily_status *st);
#endif
