/* Tokenizer building blocks: hash maps, UTF-8 checking, character classes, the GPT-2
 * byte alphabet and Unicode normalization. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include "tokenizer/tok_internal.h"

/* ---- hashing ---- */
uint64_t tok_hash_bytes(const char *p, size_t n) {
    /* FNV-style over 8-byte words, finished with a 64-bit mixer: fast on short keys. */
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (n * 0x100000001b3ULL);
    while (n >= 8) {
        uint64_t w; memcpy(&w, p, 8);
        h = (h ^ w) * 0x100000001b3ULL; h ^= h >> 29;
        p += 8; n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w ^ ((uint64_t)n << 56)) * 0x100000001b3ULL;
    h = tok_mix64(h);
    return h ? h : 1;
}

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

int tok_strmap_init(tok_strmap *m, uint32_t expect) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least((uint64_t)expect * 2 + 16);
    m->ecap = expect + 16;
    m->slot = calloc(m->cap, sizeof *m->slot);
    m->hash = malloc(m->ecap * sizeof *m->hash);
    m->off = malloc(m->ecap * sizeof *m->off);
    m->len = malloc(m->ecap * sizeof *m->len);
    m->val = malloc(m->ecap * sizeof *m->val);
    return m->slot && m->hash && m->off && m->len && m->val;
}

void tok_strmap_free(tok_strmap *m) {
    free(m->slot); free(m->hash); free(m->off); free(m->len); free(m->val); free(m->blob);
    memset(m, 0, sizeof *m);
}

static int strmap_grow(tok_strmap *m) {
    uint32_t ncap = m->cap * 2;
    uint32_t *ns = calloc(ncap, sizeof *ns);
    if (!ns) return 0;
    for (uint32_t e = 0; e < m->n; e++) {
        uint32_t i = (uint32_t)m->hash[e] & (ncap - 1);
        while (ns[i]) i = (i + 1) & (ncap - 1);
        ns[i] = e + 1;
    }
    free(m->slot); m->slot = ns; m->cap = ncap;
    return 1;
}

int tok_strmap_put(tok_strmap *m, const char *k, size_t n, int32_t v) {
    uint64_t h = tok_hash_bytes(k, n);
    uint32_t i = (uint32_t)h & (m->cap - 1);
    for (; m->slot[i]; i = (i + 1) & (m->cap - 1)) {
        uint32_t e = m->slot[i] - 1;
        if (m->hash[e] == h && m->len[e] == n && !memcmp(m->blob + m->off[e], k, n)) {
            m->val[e] = v;
            return 2;
        }
    }
    if (m->n == m->ecap) {
        uint32_t ne = m->ecap * 2;
        uint64_t *hh = realloc(m->hash, ne * sizeof *hh); if (!hh) return 0; m->hash = hh;
        uint32_t *oo = realloc(m->off, ne * sizeof *oo); if (!oo) return 0; m->off = oo;
        uint32_t *ll = realloc(m->len, ne * sizeof *ll); if (!ll) return 0; m->len = ll;
        int32_t *vv = realloc(m->val, ne * sizeof *vv); if (!vv) return 0; m->val = vv;
        m->ecap = ne;
    }
    if (m->blob_len + n + 1 > m->blob_cap) {
        size_t nc = m->blob_cap ? m->blob_cap * 2 : 4096;
        while (nc < m->blob_len + n + 1) nc *= 2;
        char *b = realloc(m->blob, nc); if (!b) return 0;
        m->blob = b; m->blob_cap = nc;
    }
    if (m->blob_len + n > UINT32_MAX) return 0;
    memcpy(m->blob + m->blob_len, k, n);
    uint32_t e = m->n++;
    m->hash[e] = h; m->off[e] = (uint32_t)m->blob_len; m->len[e] = (uint32_t)n; m->val[e] = v;
    m->blob_len += n;
    m->slot[i] = e + 1;
    if ((uint64_t)m->n * 2 > m->cap) return strmap_grow(m);
    return 1;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *k, size_t n) {
    if (!m->cap) return -1;
    uint64_t h = tok_hash_bytes(k, n);
    for (uint32_t i = (uint32_t)h & (m->cap - 1); m->slot[i]; i = (i + 1) & (m->cap - 1)) {
        uint32_t e = m->slot[i] - 1;
        if (m->hash[e] == h && m->len[e] == n && !memcmp(m->blob + m->off[e], k, n)) return m->val[e];
    }
    return -1;
}

int tok_pairmap_init(tok_pairmap *m, uint32_t expect) {
    m->n = 0;
    m->cap = pow2_at_least((uint64_t)expect * 2 + 16);
    m->key = malloc(m->cap * sizeof *m->key);
    m->rank = malloc(m->cap * sizeof *m->rank);
    m->res = malloc(m->cap * sizeof *m->res);
    if (!m->key || !m->rank || !m->res) return 0;
    memset(m->key, 0xff, m->cap * sizeof *m->key);
    return 1;
}

void tok_pairmap_free(tok_pairmap *m) {
    free(m->key); free(m->rank); free(m->res);
    memset(m, 0, sizeof *m);
}

int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t res) {
    if ((uint64_t)(m->n + 1) * 2 > m->cap) {
        tok_pairmap g;
        if (!tok_pairmap_init(&g, m->cap)) { tok_pairmap_free(&g); return 0; }
        for (uint32_t i = 0; i < m->cap; i++)
            if (m->key[i] != UINT64_MAX)
                tok_pairmap_put(&g, (int32_t)(m->key[i] >> 32), (int32_t)(uint32_t)m->key[i],
                                m->rank[i], m->res[i]);
        tok_pairmap_free(m);
        *m = g;
    }
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = (uint32_t)tok_mix64(k) & (m->cap - 1);
    while (m->key[i] != UINT64_MAX && m->key[i] != k) i = (i + 1) & (m->cap - 1);
    if (m->key[i] == UINT64_MAX) m->n++;
    m->key[i] = k; m->rank[i] = rank; m->res[i] = res;
    return 1;
}

/* ---- UTF-8 ---- */
int tok_utf8_check(const unsigned char *s, size_t n, size_t *sub) {
    unsigned c = s[0];
    int need; unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80) return 1;
    if (c < 0xC2 || c > 0xF4) { *sub = 1; return 0; }
    if (c < 0xE0) need = 1;
    else if (c < 0xF0) { need = 2; if (c == 0xE0) lo = 0xA0; else if (c == 0xED) hi = 0x9F; }
    else { need = 3; if (c == 0xF0) lo = 0x90; else if (c == 0xF4) hi = 0x8F; }
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n) { *sub = (size_t)k; return -1; }
        unsigned b = s[k];
        if (b < lo || b > hi) { *sub = (size_t)k; return 0; }
        lo = 0x80; hi = 0xBF;
    }
    return need + 1;
}

char *tok_utf8_sanitize(const char *s, size_t n, size_t *out_len, int *oom) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, sub;
    while (i < n) {
        if (u[i] < 0x80) { i++; continue; }
        int l = tok_utf8_check(u + i, n - i, &sub);
        if (l <= 0) break;
        i += (size_t)l;
    }
    if (i == n) return NULL;
    char *o = malloc(n * 3 + 1); /* each bad byte becomes at most 3 bytes */
    if (!o) { *oom = 1; return NULL; }
    memcpy(o, s, i);
    size_t w = i;
    while (i < n) {
        int l = tok_utf8_check(u + i, n - i, &sub);
        if (l > 0) { memcpy(o + w, s + i, (size_t)l); w += (size_t)l; i += (size_t)l; }
        else { memcpy(o + w, "\xEF\xBF\xBD", 3); w += 3; i += sub; }
    }
    o[w] = 0;
    *out_len = w;
    return o;
}

/* ---- character classes ---- */
uint8_t tok_bmp_class[0x30000];
static pthread_once_t class_once = PTHREAD_ONCE_INIT;

static int is_ws(uint32_t cp) {
    /* Unicode White_Space, what Oniguruma's \s matches */
    return (cp >= 9 && cp <= 13) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

/* Letters, numbers and marks assigned after Unicode 15.0 (utf8proc 2.8's data) that the
 * reference implementation (HF tokenizers' regex engine, Unicode 16) already knows; found by
 * probing it with every code point (tests/tok/oracle.js). */
static const struct { uint32_t lo, hi; uint8_t cl; } newer[] = {
    { 0x897, 0x897, TOK_CL_M }, { 0x1C89, 0x1C8A, TOK_CL_L }, { 0xA7CB, 0xA7CD, TOK_CL_L },
    { 0xA7DA, 0xA7DC, TOK_CL_L }, { 0x105C0, 0x105F3, TOK_CL_L }, { 0x10D40, 0x10D49, TOK_CL_N },
    { 0x10D4A, 0x10D65, TOK_CL_L }, { 0x10D69, 0x10D6D, TOK_CL_M }, { 0x10D6F, 0x10D85, TOK_CL_L },
    { 0x10EC2, 0x10EC4, TOK_CL_L }, { 0x10EFC, 0x10EFC, TOK_CL_M }, { 0x11380, 0x11389, TOK_CL_L },
    { 0x1138B, 0x1138B, TOK_CL_L }, { 0x1138E, 0x1138E, TOK_CL_L }, { 0x11390, 0x113B5, TOK_CL_L },
    { 0x113B7, 0x113B7, TOK_CL_L }, { 0x113B8, 0x113C0, TOK_CL_M }, { 0x113C2, 0x113C2, TOK_CL_M },
    { 0x113C5, 0x113C5, TOK_CL_M }, { 0x113C7, 0x113CA, TOK_CL_M }, { 0x113CC, 0x113D0, TOK_CL_M },
    { 0x113D1, 0x113D1, TOK_CL_L }, { 0x113D2, 0x113D2, TOK_CL_M }, { 0x113D3, 0x113D3, TOK_CL_L },
    { 0x113E1, 0x113E2, TOK_CL_M }, { 0x116D0, 0x116E3, TOK_CL_N }, { 0x11BC0, 0x11BE0, TOK_CL_L },
    { 0x11BF0, 0x11BF9, TOK_CL_N }, { 0x11F5A, 0x11F5A, TOK_CL_M }, { 0x13460, 0x143FA, TOK_CL_L },
    { 0x16100, 0x1611D, TOK_CL_L }, { 0x1611E, 0x1612F, TOK_CL_M }, { 0x16130, 0x16139, TOK_CL_N },
    { 0x16D40, 0x16D6C, TOK_CL_L }, { 0x16D70, 0x16D79, TOK_CL_N }, { 0x18CFF, 0x18CFF, TOK_CL_L },
    { 0x1CCF0, 0x1CCF9, TOK_CL_N }, { 0x1E5D0, 0x1E5ED, TOK_CL_L }, { 0x1E5EE, 0x1E5EF, TOK_CL_M },
    { 0x1E5F0, 0x1E5F0, TOK_CL_L }, { 0x1E5F1, 0x1E5FA, TOK_CL_N }, { 0x2EBF0, 0x2EE5D, TOK_CL_L },
};

int tok_class_slow(uint32_t cp) {
    int c = 0;
    for (size_t i = 0; i < sizeof newer / sizeof newer[0]; i++)
        if (cp >= newer[i].lo && cp <= newer[i].hi) return newer[i].cl;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: c = TOK_CL_L; break;
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO: c = TOK_CL_N; break;
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: c = TOK_CL_M; break;
    default: break;
    }
    if (is_ws(cp)) c |= TOK_CL_WS;
    if (cp == '\r' || cp == '\n') c |= TOK_CL_NL;
    return c;
}

static void class_init(void) {
    for (uint32_t cp = 0; cp < 0x30000; cp++)
        tok_bmp_class[cp] = (cp >= 0xD800 && cp < 0xE000) ? 0 : (uint8_t)tok_class_slow(cp);
}

/* ---- GPT-2 byte alphabet ---- */
uint32_t tok_byte_to_cp[256];
static int16_t cp_to_byte[324];

static void alphabet_init(void) {
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        tok_byte_to_cp[b] = printable ? (uint32_t)b : next++;
    }
    for (int i = 0; i < 324; i++) cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) cp_to_byte[tok_byte_to_cp[b]] = (int16_t)b;
}

static void all_init(void) { class_init(); alphabet_init(); }
void tok_unicode_init(void) { pthread_once(&class_once, all_init); }

int tok_cp_to_byte(uint32_t cp) { return cp < 324 ? cp_to_byte[cp] : -1; }

/* ---- normalization ---- */
/* Characters that are NFC, have combining class 0 and never compose with a preceding
 * character: a string made only of these is already in every composed form we apply. */
static int nfc_safe(uint32_t cp) {
    return cp < 0x300 || (cp >= 0x400 && cp <= 0x482) || (cp >= 0x48A && cp <= 0x52F) ||
           (cp >= 0x2010 && cp <= 0x2027) || (cp >= 0x3000 && cp <= 0x3029) ||
           (cp >= 0x3041 && cp <= 0x3096) || (cp >= 0x30A1 && cp <= 0x30FA) ||
           (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x4E00 && cp <= 0x9FFF) ||
           (cp >= 0xAC00 && cp <= 0xD7A3) || (cp >= 0x1F300 && cp <= 0x1FAFF);
}

/* Marks whose normalization data (combining class, compositions) the reference's NFC does
 * not have yet (its tables predate Unicode 11), found by probing it with every code point
 * that has such data in utf8proc, and U+11930/U+11938 (a composition pair of Unicode 13
 * that single code points do not show), found by every canonical pair from Python's tables.
 * It leaves them alone, as if unassigned: they block reordering and composition, so the
 * text is normalized piecewise around them. */
static const uint32_t norm_unknown[][2] = {
    { 0x7FD, 0x7FD }, { 0x898, 0x89F }, { 0x8CA, 0x8D3 }, { 0x9FE, 0x9FE }, { 0xC3C, 0xC3C },
    { 0xD3B, 0xD3C }, { 0xEBA, 0xEBA }, { 0x1715, 0x1715 }, { 0x1ABF, 0x1ACE }, { 0x1DF6, 0x1DFA },
    { 0xA82C, 0xA82C }, { 0x10D24, 0x10D27 }, { 0x10EAB, 0x10EAC }, { 0x10EFD, 0x10EFF },
    { 0x10F46, 0x10F50 }, { 0x10F82, 0x10F85 }, { 0x11070, 0x11070 }, { 0x1133B, 0x1133B },
    { 0x1145E, 0x1145E }, { 0x11839, 0x1183A }, { 0x11930, 0x11930 }, { 0x11938, 0x11938 }, { 0x1193D, 0x1193E }, { 0x11943, 0x11943 },
    { 0x119E0, 0x119E0 }, { 0x11A34, 0x11A34 }, { 0x11A47, 0x11A47 }, { 0x11A99, 0x11A99 },
    { 0x11D42, 0x11D42 }, { 0x11D44, 0x11D45 }, { 0x11D97, 0x11D97 }, { 0x11F41, 0x11F42 },
    { 0x16FF0, 0x16FF1 }, { 0x1E08F, 0x1E08F }, { 0x1E130, 0x1E136 }, { 0x1E2AE, 0x1E2AE },
    { 0x1E2EC, 0x1E2EF }, { 0x1E4EC, 0x1E4EF },
};

/* U+11A7 is the trailing-consonant base: no syllable composes with it (trailing jamo
 * start at U+11A8), but utf8proc 2.8 folds it into a preceding LV syllable and loses it.
 * It is a starter with no decomposition, so copying it as is and splitting there is
 * exactly what NFC does with it. */
static int is_norm_unknown(uint32_t cp) {
    if (cp < 0x7FD) return 0;
    if (cp == 0x11A7) return 1;
    for (size_t i = 0; i < sizeof norm_unknown / sizeof norm_unknown[0]; i++)
        if (cp >= norm_unknown[i][0] && cp <= norm_unknown[i][1]) return 1;
    return 0;
}

/* utf8proc on one stretch, appended to o (room for the worst case is checked by caller). */
static int map_append(const unsigned char *s, size_t n, int opt, char **o, size_t *w, size_t *cap) {
    if (!n) return 1;
    utf8proc_uint8_t *m = NULL;
    utf8proc_ssize_t r = utf8proc_map(s, (utf8proc_ssize_t)n, &m, (utf8proc_option_t)opt);
    if (r < 0) { free(m); return 0; }
    if (*w + (size_t)r + 1 > *cap) {
        size_t nc = (*w + (size_t)r + 1) * 2;
        char *b = realloc(*o, nc);
        if (!b) { free(m); return 0; }
        *o = b; *cap = nc;
    }
    memcpy(*o + *w, m, (size_t)r);
    *w += (size_t)r;
    free(m);
    return 1;
}

/* Normalizes [s, s+n) around ill-behaved characters into o. */
static int normalize_span(const unsigned char *u, size_t n, int opt, char **o, size_t *w, size_t *cap) {
    size_t start = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp; int l = tok_utf8_next(u + i, &cp);
        if (cp >= 0x7FD && is_norm_unknown(cp)) {
            if (!map_append(u + start, i - start, opt, o, w, cap)) return 0;
            if (*w + (size_t)l + 1 > *cap) {
                size_t nc = (*w + (size_t)l + 1) * 2;
                char *b = realloc(*o, nc);
                if (!b) return 0;
                *o = b; *cap = nc;
            }
            memcpy(*o + *w, u + i, (size_t)l); *w += (size_t)l;
            start = i + (size_t)l;
        }
        i += (size_t)l;
    }
    return map_append(u + start, n - start, opt, o, w, cap);
}

static int append_raw(const unsigned char *u, size_t n, char **o, size_t *w, size_t *cap) {
    if (*w + n + 1 > *cap) {
        size_t nc = (*w + n + 1) * 2;
        char *b = realloc(*o, nc);
        if (!b) return 0;
        *o = b; *cap = nc;
    }
    memcpy(*o + *w, u, n); *w += n;
    return 1;
}

char *tok_normalize(int kind, const char *s, size_t n, size_t *out_len, int *oom) {
    if (kind == TOK_NORM_NONE || n == 0) return NULL;
    const unsigned char *u = (const unsigned char *)s;
    int opt = UTF8PROC_STABLE;
    if (kind == TOK_NORM_NFC) opt |= UTF8PROC_COMPOSE;
    else if (kind == TOK_NORM_NFD) opt |= UTF8PROC_DECOMPOSE;
    else if (kind == TOK_NORM_NFKC) opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    size_t cap = 0, w = 0;
    char *o = NULL;
    if (kind != TOK_NORM_NFC) {
        size_t i = 0;
        while (i < n && u[i] < 0x80) i++;
        if (i == n) return NULL;
        if (!normalize_span(u, n, opt, &o, &w, &cap)) goto oom;
    } else {
        /* A safe character is a starter nothing before it can combine with, so the text
         * splits before it: only stretches around unsafe characters (with the safe
         * character just before them, which may compose with them) go to utf8proc. */
        size_t done = 0, prev_safe = 0, i = 0;
        while (i < n) {
            if (u[i] < 0x80) { prev_safe = i++; continue; }
            uint32_t cp; int l = tok_utf8_next(u + i, &cp);
            if (nfc_safe(cp)) { prev_safe = i; i += (size_t)l; continue; }
            size_t rs = prev_safe > done ? prev_safe : done, re = i + (size_t)l;
            while (re < n) {
                if (u[re] < 0x80) break;
                int l2 = tok_utf8_next(u + re, &cp);
                if (nfc_safe(cp)) break;
                re += (size_t)l2;
            }
            if (!o) { cap = n + n / 4 + 64; o = malloc(cap); if (!o) goto oom; }
            if (!append_raw(u + done, rs - done, &o, &w, &cap)) goto oom;
            if (!normalize_span(u + rs, re - rs, opt, &o, &w, &cap)) goto oom;
            done = i = re;
            prev_safe = re;
        }
        if (!o) return NULL;
        if (!append_raw(u + done, n - done, &o, &w, &cap)) goto oom;
    }
    o[w] = 0;
    *out_len = w;
    return o;
oom:
    free(o);
    *oom = 1;
    return NULL;
}
