/* Pre-tokenizer: Split(regex, Isolated). The two regexes Qwen ships run through
 * hand-written scanners that follow the regex's alternation order; any other regex goes
 * to PCRE2 (with \s rewritten to Oniguruma's White_Space set) so it is still honored. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tok_internal.h"
#include "util/util.h"

const char TOK_REGEX_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char TOK_REGEX_QWEN35[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char TOK_REGEX_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct tok_pretok {
    int kind;
    pcre2_code *re;
};

static inline int cls_at(const unsigned char *s, size_t i, int *len) {
    if (s[i] < 0x80) { *len = 1; return tok_bmp_class[s[i]]; }
    uint32_t cp;
    *len = tok_utf8_next(s + i, &cp);
    return tok_class(cp);
}

/* End of the regex match starting at i (there always is one: every character is a
 * letter, mark, number, space or "other", and some alternative takes each). */
static size_t qwen_piece_end(const unsigned char *s, size_t n, size_t i, int v35) {
    const int RUN = v35 ? (TOK_CL_L | TOK_CL_M) : TOK_CL_L;
    const int PUNCT_NOT = TOK_CL_WS | TOK_CL_L | TOK_CL_N | (v35 ? TOK_CL_M : 0);
    int l, l2;
    /* 1: (?i:'s|'t|'re|'ve|'m|'ll|'d); U+017F folds to s */
    if (s[i] == '\'' && i + 1 < n) {
        unsigned a = s[i + 1] | 0x20, b = i + 2 < n ? (s[i + 2] | 0x20u) : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if ((a == 'r' || a == 'v') && b == 'e') return i + 3;
        if (a == 'l' && b == 'l') return i + 3;
        if (s[i + 1] == 0xC5 && i + 2 < n && s[i + 2] == 0xBF) return i + 3;
    }
    int c = cls_at(s, i, &l);
    /* 2: [^\r\n\p{L}\p{N}]?RUN+ */
    size_t j = i;
    int run = 0;
    if (c & RUN) run = 1;
    else if (!(c & (TOK_CL_L | TOK_CL_N | TOK_CL_NL)) && i + (size_t)l < n &&
             (cls_at(s, i + (size_t)l, &l2) & RUN)) { j = i + (size_t)l; run = 1; }
    if (run) {
        while (j < n && (cls_at(s, j, &l2) & RUN)) j += (size_t)l2;
        return j;
    }
    /* 3: \p{N} */
    if (c & TOK_CL_N) return i + (size_t)l;
    /* 4: ' '?[^\s\p{L}(\p{M})\p{N}]+[\r\n]* */
    j = i;
    if (s[i] == ' ' && i + 1 < n && !(cls_at(s, i + 1, &l2) & PUNCT_NOT)) j = i + 1;
    if (j > i || !(c & PUNCT_NOT)) {
        while (j < n && !(cls_at(s, j, &l2) & PUNCT_NOT)) j += (size_t)l2;
        while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
        return j;
    }
    /* 5-7: whitespace */
    size_t last_nl = SIZE_MAX, last_start = i;
    j = i;
    while (j < n) {
        int cc = cls_at(s, j, &l2);
        if (!(cc & TOK_CL_WS)) break;
        if (cc & TOK_CL_NL) last_nl = j;
        last_start = j;
        j += (size_t)l2;
    }
    if (last_nl != SIZE_MAX) return last_nl + 1;      /* \s*[\r\n]+ */
    if (j == n || last_start == i) return j;          /* \s+(?!\S) at the end, or \s+ */
    return last_start;                                /* \s+(?!\S) leaving one space */
}

/* Oniguruma's \s is Unicode White_Space; PCRE2's UCP \s adds U+180E. */
#define WS_BODY "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

static char *rewrite_regex(const char *re) {
    size_t n = strlen(re);
    char *o = malloc(n * 96 + 1);
    if (!o) return NULL;
    size_t w = 0;
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = re[i];
        if (c == '\\' && i + 1 < n) {
            char e = re[i + 1];
            if (e == 's') {
                w += (size_t)sprintf(o + w, in_class ? "%s" : "[%s]", WS_BODY);
            } else if (e == 'S' && !in_class) {
                w += (size_t)sprintf(o + w, "[^%s]", WS_BODY);
            } else { o[w++] = c; o[w++] = e; }
            i++;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = 1; o[w++] = c;
            if (i + 1 < n && re[i + 1] == '^') o[w++] = re[++i];
            if (i + 1 < n && re[i + 1] == ']') o[w++] = re[++i]; /* literal ] first */
            continue;
        }
        if (c == ']' && in_class) in_class = 0;
        o[w++] = c;
    }
    o[w] = 0;
    return o;
}

lily_code tok_pretok_new(const char *regex, int literal, int force_pcre, tok_pretok **out,
                         lily_status *st) {
    tok_unicode_init();
    tok_pretok *p = calloc(1, sizeof *p);
    if (!p) return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory");
    if (!regex) { p->kind = TOK_PRE_NONE; *out = p; return LILY_OK; }
    if (!literal && !force_pcre && !strcmp(regex, TOK_REGEX_QWEN2)) p->kind = TOK_PRE_QWEN2;
    else if (!literal && !force_pcre && !strcmp(regex, TOK_REGEX_QWEN35)) p->kind = TOK_PRE_QWEN35;
    else {
        p->kind = TOK_PRE_PCRE;
        char *pat = literal ? strdup(regex) : rewrite_regex(regex);
        if (!pat) { free(p); return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory"); }
        int err; PCRE2_SIZE off;
        uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : 0);
        p->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opts, &err, &off, NULL);
        free(pat);
        if (!p->re) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(err, msg, sizeof msg);
            free(p);
            return lily_err(st, LILY_EUNSUPPORTED, "tokenizer: pre-tokenizer regex not supported (%s)",
                            (const char *)msg);
        }
        pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE); /* best effort: interpreted otherwise */
    }
    *out = p;
    return LILY_OK;
}

void tok_pretok_free(tok_pretok *p) {
    if (!p) return;
    if (p->re) pcre2_code_free(p->re);
    free(p);
}

int tok_pretok_kind(const tok_pretok *p) { return p->kind; }

static int split_pcre(const tok_pretok *p, const char *s, size_t n, tok_piece_fn fn, void *ctx) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(p->re, NULL);
    if (!md) return -1;
    const unsigned char *u = (const unsigned char *)s;
    size_t prev = 0, at = 0;
    int rc = 0;
    while (at <= n) {
        int r = pcre2_match(p->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, md, NULL);
        if (r < 0) break; /* no match (or a matching limit: the rest is one piece) */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms > prev && fn(ctx, s + prev, ms - prev)) { rc = -1; break; }
        if (me > ms && fn(ctx, s + ms, me - ms)) { rc = -1; break; }
        prev = me > ms ? me : ms;
        if (me > ms) at = me;
        else { /* empty match: move one character on */
            if (ms >= n) break;
            uint32_t cp;
            at = ms + (size_t)tok_utf8_next(u + ms, &cp);
        }
    }
    if (!rc && prev < n && fn(ctx, s + prev, n - prev)) rc = -1;
    pcre2_match_data_free(md);
    return rc;
}

int tok_pretok_split(const tok_pretok *p, const char *s, size_t n, tok_piece_fn fn, void *ctx) {
    if (n == 0) return 0;
    if (p->kind == TOK_PRE_NONE) return fn(ctx, s, n) ? -1 : 0;
    if (p->kind == TOK_PRE_PCRE) return split_pcre(p, s, n, fn, ctx);
    const unsigned char *u = (const unsigned char *)s;
    int v35 = p->kind == TOK_PRE_QWEN35;
    for (size_t i = 0; i < n;) {
        size_t e = qwen_piece_end(u, n, i, v35);
        LILY_ASSERT(e > i && e <= n);
        if (fn(ctx, s + i, e - i)) return -1;
        i = e;
    }
    return 0;
}
