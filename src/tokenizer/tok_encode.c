/* Encoding (added-token split -> normalize -> pre-tokenize -> BPE), decoding and the
 * streaming decoder. */
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tok_internal.h"
#include "util/util.h"

/* ---- added tokens ---- */
static int is_space_cp(uint32_t cp) { return (tok_class(cp) & TOK_CL_WS) != 0; }
static int is_word_cp(uint32_t cp) { return (tok_class(cp) & (TOK_CL_L | TOK_CL_N | TOK_CL_M)) != 0; }

static uint32_t last_cp(const char *s, size_t n, size_t *start) {
    size_t i = n;
    while (i > 0 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) i--;
    if (i > 0) i--;
    uint32_t cp; tok_utf8_next((const unsigned char *)s + i, &cp);
    *start = i;
    return cp;
}

/* Leftmost-longest match at or after `from` among added tokens whose `normalized` flag
 * equals `norm`, lying wholly on bytes `allow` permits (NULL: all); returns the token
 * index or -1; *ms and *me get the (stripped) span. */
static int find_added(const tok_tokenizer *t, const char *s, size_t n, size_t from, int norm,
                      const uint8_t *allow, size_t *ms, size_t *me) {
    const uint8_t mask = norm ? 2 : 1;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = from; i < n; i++) {
        if (!(t->added_first[u[i]] & mask) || (allow && !allow[i])) continue;
        int best = -1; size_t blen = 0;
        for (int k = 0; k < t->n_added; k++) {
            const tok_added *a = &t->added[k];
            if (a->normalized != norm || !a->len || a->len > n - i || a->len <= blen) continue;
            if (a->content[0] != s[i] || memcmp(a->content, s + i, a->len)) continue;
            if (allow && memchr(allow + i, 0, a->len)) continue;
            if (a->single_word) {
                size_t st0; uint32_t cp;
                if (i > 0 && is_word_cp(last_cp(s, i, &st0))) continue;
                if (i + a->len < n) { tok_utf8_next((const unsigned char *)s + i + a->len, &cp); if (is_word_cp(cp)) continue; }
            }
            best = k; blen = a->len;
        }
        if (best < 0) continue;
        size_t a0 = i, a1 = i + blen;
        if (t->added[best].lstrip) {
            while (a0 > from) {
                size_t p; uint32_t cp = last_cp(s, a0, &p);
                if (!is_space_cp(cp)) break;
                a0 = p;
            }
        }
        if (t->added[best].rstrip) {
            while (a1 < n) {
                uint32_t cp; int l = tok_utf8_next((const unsigned char *)s + a1, &cp);
                if (!is_space_cp(cp)) break;
                a1 += (size_t)l;
            }
        }
        *ms = a0; *me = a1;
        return best;
    }
    return -1;
}

typedef struct { const tok_tokenizer *t; tok_ids *out; } word_ctx;

static int on_word(void *ctx, const char *s, size_t n) {
    word_ctx *w = ctx;
    return tok_bpe_word(w->t, s, n, w->out) ? 0 : -1;
}

/* A stretch of normalized text with no added token left in it. */
static int encode_plain(const tok_tokenizer *t, const char *s, size_t n, tok_ids *out) {
    word_ctx w = { t, out };
    return tok_pretok_split(t->pre, s, n, on_word, &w);
}

/* Normalizes a raw stretch, then splits it on normalized added tokens (when parsing, and
 * only when every byte of the stretch allows it: positions move under normalization). */
static int encode_segment(const tok_tokenizer *t, const char *s, size_t n, int parse,
                          const uint8_t *allow, tok_ids *out) {
    int oom = 0;
    size_t nl = 0;
    if (parse && allow && memchr(allow, 0, n)) parse = 0;
    char *norm = tok_normalize(t->norm, s, n, &nl, &oom);
    if (oom) return -1;
    if (norm) { s = norm; n = nl; }
    int rc = 0;
    size_t pos = 0, ms, me;
    int k;
    while (parse && (k = find_added(t, s, n, pos, 1, NULL, &ms, &me)) >= 0) {
        if (ms > pos && encode_plain(t, s + pos, ms - pos, out)) { rc = -1; break; }
        if (!tok_ids_push(out, t->added[k].id)) { rc = -1; break; }
        pos = me;
    }
    if (!rc && pos < n) rc = encode_plain(t, s + pos, n - pos, out);
    free(norm);
    return rc;
}

/* text is valid UTF-8 here */
static lily_code encode_clean(const tok_tokenizer *t, const char *text, size_t len, int parse_special,
                              const uint8_t *allow, int32_t **ids, int *n, lily_status *st) {
    tok_ids out = { 0 };
    int rc = 0;
    size_t pos = 0, ms, me;
    int k;
    while (parse_special && (k = find_added(t, text, len, pos, 0, allow, &ms, &me)) >= 0) {
        if (ms > pos && encode_segment(t, text + pos, ms - pos, 1, allow ? allow + pos : NULL, &out)) { rc = -1; break; }
        if (!tok_ids_push(&out, t->added[k].id)) { rc = -1; break; }
        pos = me;
    }
    if (!rc && pos < len) rc = encode_segment(t, text + pos, len - pos, parse_special, allow ? allow + pos : NULL, &out);
    if (rc) { free(out.v); return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory"); }
    if (out.n > INT32_MAX) { free(out.v); return lily_err(st, LILY_ERANGE, "tokenizer: too many tokens"); }
    *ids = out.v; *n = (int)out.n;
    return LILY_OK;
}

lily_code tok_encode(const tok_tokenizer *t, const char *text, size_t len, int parse_special,
                     int32_t **ids, int *n, lily_status *st) {
    *ids = NULL; *n = 0;
    if (len > (size_t)INT32_MAX / 4) return lily_err(st, LILY_ERANGE, "tokenizer: text of %zu bytes is too long", len);
    int oom = 0;
    size_t clean_len = 0;
    char *clean = tok_utf8_sanitize(text, len, &clean_len, &oom);
    if (oom) return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory");
    lily_code rc = encode_clean(t, clean ? clean : text, clean ? clean_len : len, parse_special, NULL, ids, n, st);
    free(clean);
    return rc;
}

lily_code tok_encode_parts(const tok_tokenizer *t, const tok_part *parts, int n_parts,
                           int32_t **ids, int *n, lily_status *st) {
    *ids = NULL; *n = 0;
    size_t total = 0;
    for (int i = 0; i < n_parts; i++) {
        if (parts[i].len > (size_t)INT32_MAX / 4 || total * 3 > (size_t)INT32_MAX / 4)
            return lily_err(st, LILY_ERANGE, "tokenizer: text too long");
        total += parts[i].len;
    }
    char *buf = malloc(total * 3 + 1);
    uint8_t *allow = malloc(total * 3 + 1);
    if (!buf || !allow) { free(buf); free(allow); return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory"); }
    size_t w = 0;
    int any = 0;
    for (int i = 0; i < n_parts; i++) {
        int oom = 0;
        size_t cl = 0;
        char *clean = tok_utf8_sanitize(parts[i].text, parts[i].len, &cl, &oom);
        if (oom) { free(buf); free(allow); return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory"); }
        const char *p = clean ? clean : parts[i].text;
        size_t pl = clean ? cl : parts[i].len;
        if (pl) memcpy(buf + w, p, pl);
        memset(allow + w, parts[i].parse_special ? 1 : 0, pl);
        any |= parts[i].parse_special;
        w += pl;
        free(clean);
    }
    lily_code rc = encode_clean(t, buf, w, any, allow, ids, n, st);
    free(buf); free(allow);
    return rc;
}

/* ---- decoding ---- */
int tok_vocab_size(const tok_tokenizer *t) { return t->n_vocab; }

int32_t tok_id(const tok_tokenizer *t, const char *token) {
    return tok_strmap_get(&t->vocab, token, strlen(token));
}

int tok_is_special(const tok_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->flags[id] & 2);
}

int tok_is_added(const tok_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->flags[id] & 1);
}

const char *tok_piece(const tok_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab || t->piece_len[id] == UINT32_MAX) return NULL;
    *len = t->piece_len[id];
    return t->pieces + t->piece_off[id];
}

/* Appends `in` with ill-formed parts replaced by U+FFFD; when `hold` is set, a trailing
 * incomplete sequence is not written and its length returned. `o` has room for 3n. */
static size_t lossy_append(const unsigned char *in, size_t n, char *o, size_t *w, int hold) {
    size_t i = 0, sub;
    while (i < n) {
        if (in[i] < 0x80) { o[(*w)++] = (char)in[i++]; continue; }
        int l = tok_utf8_check(in + i, n - i, &sub);
        if (l > 0) { memcpy(o + *w, in + i, (size_t)l); *w += (size_t)l; i += (size_t)l; continue; }
        if (l < 0 && hold) return n - i;
        memcpy(o + *w, "\xEF\xBF\xBD", 3); *w += 3; i += sub;
    }
    return 0;
}

lily_code tok_decode(const tok_tokenizer *t, const int32_t *ids, int n, int skip_special,
                     char **out, size_t *len) {
    size_t total = 0, pl;
    for (int i = 0; i < n; i++)
        if (tok_piece(t, ids[i], &pl) && !(skip_special && tok_is_special(t, ids[i]))) total += pl;
    unsigned char *raw = malloc(total + 1);
    char *o = malloc(total * 3 + 1);
    if (!raw || !o) { free(raw); free(o); *out = NULL; return LILY_ENOMEM; }
    size_t w = 0;
    for (int i = 0; i < n; i++) {
        const char *p = tok_piece(t, ids[i], &pl);
        if (!p || (skip_special && tok_is_special(t, ids[i]))) continue;
        memcpy(raw + w, p, pl); w += pl;
    }
    size_t ow = 0;
    lossy_append(raw, w, o, &ow, 0);
    free(raw);
    o[ow] = 0;
    *out = o;
    if (len) *len = ow;
    return LILY_OK;
}

/* ---- streaming ---- */
struct tok_stream {
    const tok_tokenizer *t;
    int skip_special;
    unsigned char held[4]; size_t n_held;
    unsigned char *raw; size_t raw_cap;
    char *buf; size_t buf_cap;
};

lily_code tok_stream_new(const tok_tokenizer *t, int skip_special, tok_stream **out, lily_status *st) {
    tok_stream *s = calloc(1, sizeof *s);
    if (!s) return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory");
    s->t = t; s->skip_special = skip_special;
    *out = s;
    return LILY_OK;
}

lily_code tok_stream_push(tok_stream *s, int32_t id, const char **text, size_t *len) {
    size_t pl = 0;
    const char *p = tok_piece(s->t, id, &pl);
    if (!p || (s->skip_special && tok_is_special(s->t, id))) pl = 0;
    size_t n = s->n_held + pl;
    if (n > s->raw_cap || n * 3 + 1 > s->buf_cap) {
        size_t rc = n * 2 + 64;
        unsigned char *r = realloc(s->raw, rc);
        if (r) s->raw = r;
        char *b = realloc(s->buf, rc * 3 + 1);
        if (b) s->buf = b;
        if (!r || !b) { *text = ""; *len = 0; return LILY_ENOMEM; }
        s->raw_cap = rc; s->buf_cap = rc * 3 + 1;
    }
    memcpy(s->raw, s->held, s->n_held);
    if (pl) memcpy(s->raw + s->n_held, p, pl);
    size_t w = 0;
    size_t keep = lossy_append(s->raw, n, s->buf, &w, 1);
    memcpy(s->held, s->raw + n - keep, keep);
    s->n_held = keep;
    s->buf[w] = 0;
    *text = s->buf; *len = w;
    return LILY_OK;
}

lily_code tok_stream_flush(tok_stream *s, const char **text, size_t *len) {
    static const char fffd[] = "\xEF\xBF\xBD";
    /* A held tail is always one incomplete sequence: one maximal ill-formed subpart. */
    *text = s->n_held ? fffd : "";
    *len = s->n_held ? 3 : 0;
    s->n_held = 0;
    return LILY_OK;
}

void tok_stream_free(tok_stream *s) {
    if (!s) return;
    free(s->raw); free(s->buf); free(s);
}
