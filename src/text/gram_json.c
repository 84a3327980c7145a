/* gram_json: JSON building blocks as grammar rules (see gram_json.h and gram_schema.c's
 * comment for why repetition is right recursion and bounded counts are rule chains). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "text/gram_json.h"
#include "util/util.h"

int gj_fail(gj_ctx *c, const char *fmt, const char *a) {
    if (!c->err) {
        char msg[256];
        snprintf(msg, sizeof msg, fmt, a);
        c->err = lily_err(c->st, LILY_EINVAL, "json schema: %s at #%s", msg, c->ptr);
    }
    return -1;
}

int gj_rule(gj_ctx *c) {
    int r = gram_g_rule(c->g);
    if (r < 0) gj_fail(c, "%s", "schema too large");
    return r;
}
void gj_alt(gj_ctx *c, int r, const int32_t *e, int n) { if (r >= 0) gram_g_alt(c->g, r, e, n); }
int32_t gj_ref(int r) { return GRAM_REF(r); }
int32_t gj_byte_el(gj_ctx *c, unsigned b) { return gram_g_byte(c->g, b); }
int32_t gj_range_el(gj_ctx *c, unsigned lo, unsigned hi, const char *extra) {
    gram_set s; memset(&s, 0, sizeof s);
    for (unsigned b = lo; b <= hi && lo <= hi; b++) gram_set_add(&s, b);
    for (; extra && *extra; extra++) gram_set_add(&s, (uint8_t)*extra);
    return gram_g_set(c->g, &s);
}

/* a rule matching exactly the n bytes */
int gj_lit(gj_ctx *c, const char *s, size_t n) {
    int r = gj_rule(c);
    if (r < 0) return -1;
    int32_t *e = malloc(sizeof(int32_t) * (n + 1));
    if (!e) return gj_fail(c, "%s", "out of memory");
    for (size_t i = 0; i < n; i++) e[i] = gj_byte_el(c, (uint8_t)s[i]);
    gj_alt(c, r, e, (int)n);
    free(e);
    return r;
}

/* R_k ::= "" (k >= lo) | el R_{k+1} (k < hi); hi < 0 = unbounded */
int gj_rep(gj_ctx *c, int32_t el, int lo, int hi) {
    int top = hi < 0 ? (lo > 0 ? lo : 0) : hi;
    int first = -1, prev = -1;
    for (int k = 0; k <= top; k++) {
        int r = gj_rule(c);
        if (r < 0) return -1;
        if (first < 0) first = r;
        if (prev >= 0) { int32_t e[2] = { el, gj_ref(r) }; gj_alt(c, prev, e, 2); }
        if (k >= lo) gj_alt(c, r, NULL, 0);
        if (k == top && hi < 0) { int32_t e[2] = { el, gj_ref(r) }; gj_alt(c, r, e, 2); }
        prev = r;
    }
    return first;
}

int gj_ws(gj_ctx *c) {
    if (!c->ws) c->ws = gj_rep(c, gj_range_el(c, 1, 0, " \t\n\r"), 0, GRAM_MAX_WS) + 1;
    return c->ws - 1;
}

/* after "\\u": four hex digits that jansson (the server's parser) accepts: no \\u0000, no
 * lone surrogate (a high one must be followed by "\\u" and a low one) */
int gj_uesc(gj_ctx *c) {
    int r = gj_rule(c), z3 = gj_rule(c), z2 = gj_rule(c);
    if (r < 0 || z2 < 0) return -1;
    int32_t h = gj_range_el(c, '0', '9', "abcdefABCDEF"), nz = gj_range_el(c, '1', '9', "abcdefABCDEF");
    int32_t zero = gj_byte_el(c, '0'), d = gj_range_el(c, 1, 0, "dD");
    int32_t a[4] = { gj_range_el(c, '1', '9', "abcABCeEfF"), h, h, h };
    gj_alt(c, r, a, 4);
    int32_t b[2] = { zero, gj_ref(z3) };
    gj_alt(c, r, b, 2);
    int32_t e[4] = { d, gj_range_el(c, '0', '7', NULL), h, h };
    gj_alt(c, r, e, 4);
    int32_t f[10] = { d, gj_range_el(c, '8', '9', "abAB"), h, h, gj_byte_el(c, '\\'), gj_byte_el(c, 'u'), d,
                      gj_range_el(c, 'c', 'f', "CDEF"), h, h };
    gj_alt(c, r, f, 10);
    int32_t z3a[3] = { nz, h, h }, z3b[2] = { zero, gj_ref(z2) }, z2a[2] = { nz, h }, z2b[2] = { zero, nz };
    gj_alt(c, z3, z3a, 3); gj_alt(c, z3, z3b, 2); gj_alt(c, z2, z2a, 2); gj_alt(c, z2, z2b, 2);
    return r;
}

int gj_esc(gj_ctx *c) {
    if (c->esc) return c->esc - 1;
    int r = gj_rule(c);
    c->esc = r + 1;
    int32_t a[1] = { gj_range_el(c, 1, 0, "\"\\/bfnrt") };
    gj_alt(c, r, a, 1);
    int32_t u[2] = { gj_byte_el(c, 'u'), gj_ref(gj_uesc(c)) };
    gj_alt(c, r, u, 2);
    return r;
}

/* Strings hold exactly well-formed UTF-8 (RFC 3629), so the decoded text never needs a
 * U+FFFD and lengths agree with validators, which count code points. Byte-set classes:
 * 0 plain ASCII (0x20-0x7f but '"' and '\\'), 1 C2-DF, 2 80-BF, 3 E0, 4 A0-BF,
 * 5 E1-EC EE-EF, 6 ED, 7 80-9F, 8 F0, 9 90-BF, 10 F1-F3, 11 F4, 12 80-8F. */
int32_t gj_u8_set(gj_ctx *c, int k) {
    if (!c->u8_ok) {
        static const uint8_t rg[13][4] = { { 0x20, 0x7f }, { 0xc2, 0xdf }, { 0x80, 0xbf }, { 0xe0, 0xe0 },
                                           { 0xa0, 0xbf }, { 0xe1, 0xec, 0xee, 0xef }, { 0xed, 0xed },
                                           { 0x80, 0x9f }, { 0xf0, 0xf0 }, { 0x90, 0xbf }, { 0xf1, 0xf3 },
                                           { 0xf4, 0xf4 }, { 0x80, 0x8f } };
        for (int i = 0; i < 13; i++) {
            gram_set s; memset(&s, 0, sizeof s);
            for (unsigned b = rg[i][0]; b <= rg[i][1]; b++) gram_set_add(&s, b);
            for (unsigned b = rg[i][2]; rg[i][2] && b <= rg[i][3]; b++) gram_set_add(&s, b);
            if (i == 0) { s.w[0] &= ~(1ull << '"'); s.w[1] &= ~(1ull << ('\\' - 64)); }
            c->u8[i] = gram_g_set(c->g, &s);
        }
        c->u8_ok = 1;
    }
    return c->u8[k];
}

int gj_u8_seq(gj_ctx *c, int i, int32_t *out) {
    static const int8_t seq[7][5] = { { 1, 2, -1 }, { 3, 4, 2, -1 }, { 5, 2, 2, -1 }, { 6, 7, 2, -1 },
                                      { 8, 9, 2, 2, -1 }, { 10, 2, 2, 2, -1 }, { 11, 12, 2, 2, -1 } };
    int n = 0;
    for (; seq[i][n] >= 0 && n < 5; n++) out[n] = gj_u8_set(c, seq[i][n]);
    return n;
}

int gj_u8_len(unsigned b) { return b < 0x80 ? 1 : b < 0xc2 ? 0 : b < 0xe0 ? 2 : b < 0xf0 ? 3 : b < 0xf5 ? 4 : 0; }

void gj_u8_cont(unsigned lead, int j, unsigned *lo, unsigned *hi) {
    *lo = 0x80; *hi = 0xbf;
    if (j) return;
    if (lead == 0xe0) *lo = 0xa0;
    else if (lead == 0xed) *hi = 0x9f;
    else if (lead == 0xf0) *lo = 0x90;
    else if (lead == 0xf4) *hi = 0x8f;
}

size_t gj_dump_flags(const gj_ctx *c) { return JSON_COMPACT | JSON_ENCODE_ANY | (c->n_forbid ? JSON_ESCAPE_SLASH : 0); }

/* The automaton of the forbidden strings: states are their proper prefixes (state 0 the
 * empty one); next[s][b] is the longest state that the text so far ends with after ASCII
 * byte b, or -1 when it completes a forbidden string. */
#define FSM_MAX 64
typedef struct { int n; char pre[FSM_MAX][GJ_FORBID_LEN + 1]; int16_t next[FSM_MAX][128]; } fsm_t;

static int fsm_find(const fsm_t *a, const char *s) {
    for (int i = 0; i < a->n; i++) if (!strcmp(a->pre[i], s)) return i;
    return -1;
}

static int fsm_build(gj_ctx *c, fsm_t *a) {
    memset(a, 0, sizeof *a);
    a->n = 1;
    for (int f = 0; f < c->n_forbid; f++) {
        size_t m = strlen(c->forbid[f]);
        if (m < 2 || m > GJ_FORBID_LEN || c->forbid[f][0] != '<' || strchr(c->forbid[f] + 1, '<') || strpbrk(c->forbid[f], "\"\\"))
            return gj_fail(c, "%s", "bad forbidden string"); /* gj_str_bounded's fast path relies on one leading '<' */
        for (size_t l = 1; l < m; l++) {
            char p[GJ_FORBID_LEN + 1]; memcpy(p, c->forbid[f], l); p[l] = 0;
            if (fsm_find(a, p) >= 0) continue;
            if (a->n == FSM_MAX) return gj_fail(c, "%s", "too many forbidden strings");
            memcpy(a->pre[a->n++], p, l + 1);
        }
    }
    for (int s = 0; s < a->n; s++) {
        size_t l = strlen(a->pre[s]);
        for (int b = 1; b < 128; b++) {
            char t[GJ_FORBID_LEN + 2];
            memcpy(t, a->pre[s], l); t[l] = (char)b; t[l + 1] = 0;
            int to = 0;
            for (int f = 0; f < c->n_forbid; f++) {
                size_t m = strlen(c->forbid[f]);
                if (l + 1 >= m && !memcmp(t + l + 1 - m, c->forbid[f], m)) to = -1;
            }
            for (size_t o = 0; to == 0 && o <= l; o++) { /* the longest suffix that is a state */
                int k = fsm_find(a, t + o);
                if (k > 0) to = k;
            }
            a->next[s][b] = (int16_t)to;
        }
    }
    return 0;
}

/* A string is '"' B_0 where B_k is "k characters so far": its alternatives are one
 * character (plain ASCII, an escape, or one of the seven multibyte shapes) then B_k+1, and
 * the closing quote when k >= lo. Unbounded strings loop on their last B. Each B_k is
 * registered (gram_g_str) with the characters it has left, which is what lets the mask
 * copy the tokens of whole plain characters instead of stepping through them.
 * With forbidden strings each B_k is one rule per automaton state and plain ASCII is split
 * by the state it leads to; an escape or a multibyte character (bytes no forbidden string
 * has) returns to state 0. Their bodies are registered as GRAM_STR_NOLT: tokens with a '<'
 * (which every forbidden string starts with) are stepped, and from a state inside a
 * forbidden string the bytes that continue it are hot. */
int gj_str_bounded(gj_ctx *c, int lo, int hi) {
    int is_free = lo == 0 && hi < 0;
    if (is_free && c->str) return c->str - 1;
    fsm_t *a = NULL;
    int ns = 1;
    if (c->n_forbid) {
        if (!(a = malloc(sizeof *a))) return gj_fail(c, "%s", "out of memory");
        if (fsm_build(c, a) < 0) { free(a); return -1; }
        ns = a->n;
    }
    int top = hi < 0 ? lo : hi;
    int *B = calloc(((size_t)top + 1) * (size_t)ns, sizeof(int));
    int32_t *grp = calloc((size_t)ns * (size_t)ns, sizeof(int32_t));
    gram_set *hot = a ? calloc((size_t)ns, sizeof *hot) : NULL;
    if (!B || !grp || (a && !hot)) { free(B); free(grp); free(hot); free(a); return gj_fail(c, "%s", "out of memory"); }
    for (int k = 0; k < (top + 1) * ns; k++) B[k] = gj_rule(c);
    for (int s = 0; a && s < ns; s++) {
        /* the mask's promise (gram_g_str): a first byte not leading back to state 0 is hot */
        for (int b = 1; b < 128; b++) if (a->next[s][b] != 0) gram_set_add(&hot[s], (unsigned)b);
        for (int to = 0; to < ns; to++) { /* plain ASCII from s, grouped by the state it leads to */
            gram_set set; memset(&set, 0, sizeof set);
            int any = 0;
            for (int b = 0x20; b < 0x80; b++)
                if (b != '"' && b != '\\' && a->next[s][b] == to) { gram_set_add(&set, (unsigned)b); any = 1; }
            grp[s * ns + to] = any ? gram_g_set(c->g, &set) : -1;
        }
    }
    int32_t q = gj_byte_el(c, '"'), bs = gj_byte_el(c, '\\'), esc = gj_ref(gj_esc(c));
    for (int k = 0; k <= top && !c->err; k++) {
        int nk = k < top ? k + 1 : (hi < 0 ? k : -1);
        for (int s = 0; s < ns; s++) {
            int r = B[k * ns + s];
            if (nk >= 0) {
                for (int to = 0; to < ns; to++) {
                    int32_t set = a ? grp[s * ns + to] : (to == 0 ? gj_u8_set(c, 0) : -1);
                    if (set < 0) continue;
                    int32_t e[2] = { set, gj_ref(B[nk * ns + to]) };
                    gj_alt(c, r, e, 2);
                }
                int32_t e[3] = { bs, esc, gj_ref(B[nk * ns]) };
                gj_alt(c, r, e, 3);
                for (int i = 0; i < 7; i++) {
                    int32_t u[6];
                    int n = gj_u8_seq(c, i, u);
                    u[n++] = gj_ref(B[nk * ns]);
                    gj_alt(c, r, u, n);
                }
            }
            if (k >= lo) gj_alt(c, r, &q, 1);
            gram_g_str(c->g, r, hi < 0 ? -1 : hi - k, a ? GRAM_STR_NOLT : 0, a ? &hot[s] : NULL);
        }
    }
    int o = gj_rule(c);
    int32_t e[2] = { q, gj_ref(B[0]) };
    gj_alt(c, o, e, 2);
    if (is_free && !c->err) { c->str = o + 1; c->strbody = B[0] + 1; }
    free(B); free(grp); free(hot); free(a);
    return c->err ? -1 : o;
}

int gj_str_free(gj_ctx *c) { return gj_str_bounded(c, 0, -1); }

int gj_number(gj_ctx *c, int integer) {
    int *slot = integer ? &c->integer : &c->num;
    if (*slot) return *slot - 1;
    int32_t dig = gj_range_el(c, '0', '9', NULL);
    int neg = gj_rule(c), ip = gj_rule(c), r = gj_rule(c);
    if (r < 0) return -1;
    int32_t m = gj_byte_el(c, '-');
    gj_alt(c, neg, NULL, 0); gj_alt(c, neg, &m, 1);
    int32_t z = gj_byte_el(c, '0');
    gj_alt(c, ip, &z, 1);
    int32_t nz[2] = { gj_range_el(c, '1', '9', NULL), gj_ref(gj_rep(c, dig, 0, 17)) };
    gj_alt(c, ip, nz, 2);
    if (integer) {
        int32_t e[2] = { gj_ref(neg), gj_ref(ip) };
        gj_alt(c, r, e, 2);
    } else {
        int fr = gj_rule(c), ex = gj_rule(c), sg = gj_rule(c);
        gj_alt(c, fr, NULL, 0);
        int32_t f[2] = { gj_byte_el(c, '.'), gj_ref(gj_rep(c, dig, 1, 16)) };
        gj_alt(c, fr, f, 2);
        gj_alt(c, sg, NULL, 0);
        int32_t s1 = gj_range_el(c, 1, 0, "+-");
        gj_alt(c, sg, &s1, 1);
        gj_alt(c, ex, NULL, 0);
        int32_t x[3] = { gj_range_el(c, 1, 0, "eE"), gj_ref(sg), gj_ref(gj_rep(c, dig, 1, 2)) };
        gj_alt(c, ex, x, 3);
        int32_t e[4] = { gj_ref(neg), gj_ref(ip), gj_ref(fr), gj_ref(ex) };
        gj_alt(c, r, e, 4);
    }
    *slot = r + 1;
    return r;
}

int gj_lit_rule(gj_ctx *c, int *slot, const char *s) {
    if (!*slot) *slot = gj_lit(c, s, strlen(s)) + 1;
    return *slot - 1;
}
int gj_null_r(gj_ctx *c) { return gj_lit_rule(c, &c->null_r, "null"); }
int gj_bool_r(gj_ctx *c) {
    if (c->bool_r) return c->bool_r - 1;
    int r = gj_rule(c);
    c->bool_r = r + 1;
    int32_t t = gj_ref(gj_lit(c, "true", 4)), f = gj_ref(gj_lit(c, "false", 5));
    gj_alt(c, r, &t, 1); gj_alt(c, r, &f, 1);
    return r;
}

/* "[" WS R_0 with R_k as in the file comment; elem(k) is prefix[k] or the extra items rule */
int gj_array_of(gj_ctx *c, const int *prefix, int np, int extra, int lo, int hi) {
    int w = gj_ws(c), L = np > lo ? np : lo;
    if (L < 1) L = 1;
    if (extra < 0 && (hi < 0 || hi > np)) hi = np; /* no items beyond the prefix */
    int top = hi >= 0 ? hi : L;
    if (top < lo) return gj_fail(c, "%s", "minItems cannot be met with these items");
    int32_t close = gj_byte_el(c, ']'), comma = gj_byte_el(c, ',');
    int *R = malloc(sizeof(int) * ((size_t)top + 2));
    if (!R) return gj_fail(c, "%s", "out of memory");
    for (int k = 0; k <= top; k++) R[k] = gj_rule(c);
    for (int k = 0; k <= top && !c->err; k++) {
        if (k >= lo) gj_alt(c, R[k], &close, 1);
        int el = k < np ? prefix[k] : extra;
        int nxt = k < top ? R[k + 1] : (hi < 0 ? R[k] : -1);
        if (el < 0 || nxt < 0) continue;
        if (k == 0) { int32_t e[3] = { gj_ref(el), gj_ref(w), gj_ref(nxt) }; gj_alt(c, R[k], e, 3); }
        else { int32_t e[5] = { comma, gj_ref(w), gj_ref(el), gj_ref(w), gj_ref(nxt) }; gj_alt(c, R[k], e, 5); }
    }
    int o = gj_rule(c);
    int32_t e[3] = { gj_byte_el(c, '['), gj_ref(w), gj_ref(R[0]) };
    gj_alt(c, o, e, 3);
    free(R);
    return o;
}

/* keys[i] (JSON-serialized, with quotes) : vals[i]; opt[i]; extra = value rule of extra keys or -1 */
int gj_object_of(gj_ctx *c, int n, int *keys, const int *vals, const char *opt, int extra, int extra_key) {
    int w = gj_ws(c);
    int32_t comma = gj_byte_el(c, ','), colon = gj_byte_el(c, ':');
    int *T = malloc(sizeof(int) * 2 * ((size_t)n + 1));
    if (!T) return gj_fail(c, "%s", "out of memory");
    for (int i = 0; i < 2 * (n + 1); i++) T[i] = gj_rule(c);
    for (int i = 0; i <= n && !c->err; i++)
        for (int e = 0; e < 2; e++) {
            int r = T[2 * i + e];
            int key = i < n ? keys[i] : (extra >= 0 ? extra_key : -1);
            int val = i < n ? vals[i] : extra;
            int nxt = i < n ? T[2 * (i + 1) + 1] : T[2 * n + 1];
            if (i == n) { int32_t cl = gj_byte_el(c, '}'); gj_alt(c, r, &cl, 1); }
            if (i < n && opt[i]) { int32_t s = gj_ref(T[2 * (i + 1) + e]); gj_alt(c, r, &s, 1); }
            if (key < 0) continue;
            int32_t q[9]; int k = 0;
            if (e) { q[k++] = comma; q[k++] = gj_ref(w); }
            q[k++] = gj_ref(key); q[k++] = gj_ref(w); q[k++] = colon; q[k++] = gj_ref(w); q[k++] = gj_ref(val);
            q[k++] = gj_ref(w); q[k++] = gj_ref(nxt);
            gj_alt(c, r, q, k);
        }
    int o = gj_rule(c);
    int32_t e[3] = { gj_byte_el(c, '{'), gj_ref(w), gj_ref(T[0]) };
    gj_alt(c, o, e, 3);
    free(T);
    return o;
}

int gj_any(gj_ctx *c) {
    if (c->any) return c->any - 1;
    int v = gj_rule(c);
    if (v < 0) return -1;
    c->any = v + 1;
    int ob = gj_object_of(c, 0, NULL, NULL, NULL, v, gj_str_free(c));
    int ar = gj_array_of(c, NULL, 0, v, 0, -1);
    int parts[7] = { ob, ar, gj_str_free(c), gj_number(c, 0), gj_bool_r(c), gj_null_r(c), -1 };
    for (int i = 0; parts[i] >= 0 && i < 6; i++) { int32_t e = gj_ref(parts[i]); gj_alt(c, v, &e, 1); }
    return v;
}

