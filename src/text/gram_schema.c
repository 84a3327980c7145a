/* gram_schema: JSON schema -> byte grammar (gram_priv.h).
 *
 * Why the shapes below: everything repeated is right recursion (a rule calling itself
 * last), so the matcher's stacks stay flat; bounded repetition (digits, minLength,
 * minItems...) is a chain of rules R_k = "state after k items", which keeps the counts
 * exact without counters in the matcher. Objects are the chain T(i, e) = "properties
 * before i decided, e = something emitted yet", which places commas right whichever
 * optional properties are skipped. Shared pieces (whitespace, free strings, any value)
 * are built once per grammar and referenced.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "text/gram_priv.h"
#include "util/util.h"

#define SC_MAX_BOUND 1000
#define SC_MAX_NEST 64

typedef struct {
    gram_grammar *g;
    json_t *root;
    lily_status *st;
    lily_code err;
    char ptr[512];
    int nest;
    json_t **memo_node; int *memo_rule; int n_memo, cap_memo;
    int ws, str, any, esc, chr, num, integer, null_r, bool_r;
} sc;

static int fail(sc *c, const char *fmt, const char *a) {
    if (!c->err) {
        char msg[256];
        snprintf(msg, sizeof msg, fmt, a);
        c->err = lily_err(c->st, LILY_EINVAL, "json schema: %s at #%s", msg, c->ptr);
    }
    return -1;
}

static int rule(sc *c) {
    int r = gram_g_rule(c->g);
    if (r < 0) fail(c, "%s", "schema too large");
    return r;
}
static void alt(sc *c, int r, const int32_t *e, int n) { if (r >= 0) gram_g_alt(c->g, r, e, n); }
static int32_t ref(int r) { return GRAM_REF(r); }
static int32_t byte_el(sc *c, unsigned b) { return gram_g_byte(c->g, b); }
static int32_t range_el(sc *c, unsigned lo, unsigned hi, const char *extra) {
    gram_set s; memset(&s, 0, sizeof s);
    for (unsigned b = lo; b <= hi && lo <= hi; b++) gram_set_add(&s, b);
    for (; extra && *extra; extra++) gram_set_add(&s, (uint8_t)*extra);
    return gram_g_set(c->g, &s);
}

/* a rule matching exactly the n bytes */
static int lit(sc *c, const char *s, size_t n) {
    int r = rule(c);
    if (r < 0) return -1;
    int32_t *e = malloc(sizeof(int32_t) * (n + 1));
    if (!e) return fail(c, "%s", "out of memory");
    for (size_t i = 0; i < n; i++) e[i] = byte_el(c, (uint8_t)s[i]);
    alt(c, r, e, (int)n);
    free(e);
    return r;
}

/* R_k ::= "" (k >= lo) | el R_{k+1} (k < hi); hi < 0 = unbounded */
static int rep(sc *c, int32_t el, int lo, int hi) {
    int top = hi < 0 ? (lo > 0 ? lo : 0) : hi;
    int first = -1, prev = -1;
    for (int k = 0; k <= top; k++) {
        int r = rule(c);
        if (r < 0) return -1;
        if (first < 0) first = r;
        if (prev >= 0) { int32_t e[2] = { el, ref(r) }; alt(c, prev, e, 2); }
        if (k >= lo) alt(c, r, NULL, 0);
        if (k == top && hi < 0) { int32_t e[2] = { el, ref(r) }; alt(c, r, e, 2); }
        prev = r;
    }
    return first;
}

static int ws(sc *c) {
    if (!c->ws) c->ws = rep(c, range_el(c, 1, 0, " \t\n\r"), 0, GRAM_MAX_WS) + 1;
    return c->ws - 1;
}

/* after "\\u": four hex digits that jansson (the server's parser) accepts: no \\u0000, no
 * lone surrogate (a high one must be followed by "\\u" and a low one) */
static int uesc(sc *c) {
    int r = rule(c), z3 = rule(c), z2 = rule(c);
    if (r < 0 || z2 < 0) return -1;
    int32_t h = range_el(c, '0', '9', "abcdefABCDEF"), nz = range_el(c, '1', '9', "abcdefABCDEF");
    int32_t zero = byte_el(c, '0'), d = range_el(c, 1, 0, "dD");
    int32_t a[4] = { range_el(c, '1', '9', "abcABCeEfF"), h, h, h };
    alt(c, r, a, 4);
    int32_t b[2] = { zero, ref(z3) };
    alt(c, r, b, 2);
    int32_t e[4] = { d, range_el(c, '0', '7', NULL), h, h };
    alt(c, r, e, 4);
    int32_t f[10] = { d, range_el(c, '8', '9', "abAB"), h, h, byte_el(c, '\\'), byte_el(c, 'u'), d,
                      range_el(c, 'c', 'f', "CDEF"), h, h };
    alt(c, r, f, 10);
    int32_t z3a[3] = { nz, h, h }, z3b[2] = { zero, ref(z2) }, z2a[2] = { nz, h }, z2b[2] = { zero, nz };
    alt(c, z3, z3a, 3); alt(c, z3, z3b, 2); alt(c, z2, z2a, 2); alt(c, z2, z2b, 2);
    return r;
}

static int esc(sc *c) {
    if (c->esc) return c->esc - 1;
    int r = rule(c);
    c->esc = r + 1;
    int32_t a[1] = { range_el(c, 1, 0, "\"\\/bfnrt") };
    alt(c, r, a, 1);
    int32_t u[2] = { byte_el(c, 'u'), ref(uesc(c)) };
    alt(c, r, u, 2);
    return r;
}

/* the free string: '"' S with S ::= plain S | '\\' ESC S | '"' (the mask's fast path) */
static int str_free(sc *c) {
    if (c->str) return c->str - 1;
    int s = rule(c), q = rule(c);
    if (s < 0 || q < 0) return -1;
    c->str = q + 1;
    int32_t pl[2] = { range_el(c, 0x20, 0xff, NULL), ref(s) };
    gram_set plain = c->g->sets[pl[0]];
    plain.w[0] &= ~(1ull << '"'); plain.w[1] &= ~(1ull << ('\\' - 64));
    pl[0] = gram_g_set(c->g, &plain);
    int32_t es[3] = { byte_el(c, '\\'), ref(esc(c)), ref(s) };
    int32_t qu[1] = { byte_el(c, '"') };
    c->g->str_rule = s;
    c->g->str_alt_plain = gram_g_alt(c->g, s, pl, 2);
    c->g->str_alt_esc = gram_g_alt(c->g, s, es, 3);
    c->g->str_alt_quote = gram_g_alt(c->g, s, qu, 1);
    int32_t e[2] = { byte_el(c, '"'), ref(s) };
    alt(c, q, e, 2);
    return q;
}

/* one character for length counting: an ASCII byte or escape, or a UTF-8 lead byte with
 * up to three continuation bytes */
static int chr(sc *c) {
    if (c->chr) return c->chr - 1;
    int r = rule(c);
    c->chr = r + 1;
    gram_set s; memset(&s, 0, sizeof s);
    for (unsigned b = 0x20; b < 0x80; b++) if (b != '"' && b != '\\') gram_set_add(&s, b);
    int32_t a[1] = { gram_g_set(c->g, &s) };
    alt(c, r, a, 1);
    int32_t e[2] = { byte_el(c, '\\'), ref(esc(c)) };
    alt(c, r, e, 2);
    int32_t l[2] = { range_el(c, 0xc0, 0xff, NULL), ref(rep(c, range_el(c, 0x80, 0xbf, NULL), 0, 3)) };
    alt(c, r, l, 2);
    return r;
}

static int str_bounded(sc *c, int lo, int hi) {
    if (lo == 0 && hi < 0) return str_free(c);
    int top = hi < 0 ? (lo > 1 ? lo : 1) : hi, ch = chr(c), first = -1, prev = -1;
    int32_t q = byte_el(c, '"');
    for (int k = 0; k <= top; k++) {
        int r = rule(c);
        if (r < 0) return -1;
        if (first < 0) first = r;
        if (prev >= 0) { int32_t e[2] = { ref(ch), ref(r) }; alt(c, prev, e, 2); }
        if (k >= lo) alt(c, r, &q, 1);
        if (k == top && hi < 0) { int32_t e[2] = { ref(ch), ref(r) }; alt(c, r, e, 2); }
        prev = r;
    }
    int o = rule(c);
    int32_t e[2] = { q, ref(first) };
    alt(c, o, e, 2);
    return o;
}

static int number(sc *c, int integer) {
    int *slot = integer ? &c->integer : &c->num;
    if (*slot) return *slot - 1;
    int32_t dig = range_el(c, '0', '9', NULL);
    int neg = rule(c), ip = rule(c), r = rule(c);
    if (r < 0) return -1;
    int32_t m = byte_el(c, '-');
    alt(c, neg, NULL, 0); alt(c, neg, &m, 1);
    int32_t z = byte_el(c, '0');
    alt(c, ip, &z, 1);
    int32_t nz[2] = { range_el(c, '1', '9', NULL), ref(rep(c, dig, 0, 17)) };
    alt(c, ip, nz, 2);
    if (integer) {
        int32_t e[2] = { ref(neg), ref(ip) };
        alt(c, r, e, 2);
    } else {
        int fr = rule(c), ex = rule(c), sg = rule(c);
        alt(c, fr, NULL, 0);
        int32_t f[2] = { byte_el(c, '.'), ref(rep(c, dig, 1, 16)) };
        alt(c, fr, f, 2);
        alt(c, sg, NULL, 0);
        int32_t s1 = range_el(c, 1, 0, "+-");
        alt(c, sg, &s1, 1);
        alt(c, ex, NULL, 0);
        int32_t x[3] = { range_el(c, 1, 0, "eE"), ref(sg), ref(rep(c, dig, 1, 2)) };
        alt(c, ex, x, 3);
        int32_t e[4] = { ref(neg), ref(ip), ref(fr), ref(ex) };
        alt(c, r, e, 4);
    }
    *slot = r + 1;
    return r;
}

static int lit_rule(sc *c, int *slot, const char *s) {
    if (!*slot) *slot = lit(c, s, strlen(s)) + 1;
    return *slot - 1;
}
static int null_r(sc *c) { return lit_rule(c, &c->null_r, "null"); }
static int bool_r(sc *c) {
    if (c->bool_r) return c->bool_r - 1;
    int r = rule(c);
    c->bool_r = r + 1;
    int32_t t = ref(lit(c, "true", 4)), f = ref(lit(c, "false", 5));
    alt(c, r, &t, 1); alt(c, r, &f, 1);
    return r;
}

/* "[" WS R_0 with R_k as in the file comment; elem(k) is prefix[k] or the extra items rule */
static int array_of(sc *c, const int *prefix, int np, int extra, int lo, int hi) {
    int w = ws(c), L = np > lo ? np : lo;
    if (L < 1) L = 1;
    if (extra < 0 && (hi < 0 || hi > np)) hi = np; /* no items beyond the prefix */
    int top = hi >= 0 ? hi : L;
    if (top < lo) return fail(c, "%s", "minItems cannot be met with these items");
    int32_t close = byte_el(c, ']'), comma = byte_el(c, ',');
    int *R = malloc(sizeof(int) * ((size_t)top + 2));
    if (!R) return fail(c, "%s", "out of memory");
    for (int k = 0; k <= top; k++) R[k] = rule(c);
    for (int k = 0; k <= top && !c->err; k++) {
        if (k >= lo) alt(c, R[k], &close, 1);
        int el = k < np ? prefix[k] : extra;
        int nxt = k < top ? R[k + 1] : (hi < 0 ? R[k] : -1);
        if (el < 0 || nxt < 0) continue;
        if (k == 0) { int32_t e[3] = { ref(el), ref(w), ref(nxt) }; alt(c, R[k], e, 3); }
        else { int32_t e[5] = { comma, ref(w), ref(el), ref(w), ref(nxt) }; alt(c, R[k], e, 5); }
    }
    int o = rule(c);
    int32_t e[3] = { byte_el(c, '['), ref(w), ref(R[0]) };
    alt(c, o, e, 3);
    free(R);
    return o;
}

/* keys[i] (JSON-serialized, with quotes) : vals[i]; opt[i]; extra = value rule of extra keys or -1 */
static int object_of(sc *c, int n, int *keys, const int *vals, const char *opt, int extra, int extra_key) {
    int w = ws(c);
    int32_t comma = byte_el(c, ','), colon = byte_el(c, ':');
    int *T = malloc(sizeof(int) * 2 * ((size_t)n + 1));
    if (!T) return fail(c, "%s", "out of memory");
    for (int i = 0; i < 2 * (n + 1); i++) T[i] = rule(c);
    for (int i = 0; i <= n && !c->err; i++)
        for (int e = 0; e < 2; e++) {
            int r = T[2 * i + e];
            int key = i < n ? keys[i] : (extra >= 0 ? extra_key : -1);
            int val = i < n ? vals[i] : extra;
            int nxt = i < n ? T[2 * (i + 1) + 1] : T[2 * n + 1];
            if (i == n) { int32_t cl = byte_el(c, '}'); alt(c, r, &cl, 1); }
            if (i < n && opt[i]) { int32_t s = ref(T[2 * (i + 1) + e]); alt(c, r, &s, 1); }
            if (key < 0) continue;
            int32_t q[9]; int k = 0;
            if (e) { q[k++] = comma; q[k++] = ref(w); }
            q[k++] = ref(key); q[k++] = ref(w); q[k++] = colon; q[k++] = ref(w); q[k++] = ref(val);
            q[k++] = ref(w); q[k++] = ref(nxt);
            alt(c, r, q, k);
        }
    int o = rule(c);
    int32_t e[3] = { byte_el(c, '{'), ref(w), ref(T[0]) };
    alt(c, o, e, 3);
    free(T);
    return o;
}

static int any(sc *c) {
    if (c->any) return c->any - 1;
    int v = rule(c);
    if (v < 0) return -1;
    c->any = v + 1;
    int ob = object_of(c, 0, NULL, NULL, NULL, v, str_free(c));
    int ar = array_of(c, NULL, 0, v, 0, -1);
    int parts[7] = { ob, ar, str_free(c), number(c, 0), bool_r(c), null_r(c), -1 };
    for (int i = 0; parts[i] >= 0 && i < 6; i++) { int32_t e = ref(parts[i]); alt(c, v, &e, 1); }
    return v;
}

static int compile(sc *c, json_t *s);

/* c->ptr grows by one pointer segment (escaped per RFC 6901) and is restored by ptr_pop */
static size_t ptr_push(sc *c, const char *seg) {
    size_t old = strlen(c->ptr), o = old;
    if (o + 2 < sizeof c->ptr) c->ptr[o++] = '/';
    for (; *seg && o + 3 < sizeof c->ptr; seg++) {
        if (*seg == '~' || *seg == '/') { c->ptr[o++] = '~'; c->ptr[o++] = *seg == '~' ? '0' : '1'; }
        else c->ptr[o++] = *seg;
    }
    c->ptr[o] = 0;
    return old;
}
static void ptr_pop(sc *c, size_t old) { c->ptr[old] = 0; }

static int compile_at(sc *c, json_t *s, const char *seg1, const char *seg2) {
    size_t o = ptr_push(c, seg1);
    if (seg2) ptr_push(c, seg2);
    int r = compile(c, s);
    ptr_pop(c, o);
    return r;
}

static int bound(sc *c, json_t *s, const char *kw, int dflt) {
    json_t *v = json_object_get(s, kw);
    if (!v) return dflt;
    size_t o = ptr_push(c, kw);
    int r;
    if (!json_is_integer(v) || json_integer_value(v) < 0) r = fail(c, "%s must be a non-negative integer", kw);
    else if (json_integer_value(v) > SC_MAX_BOUND) {
        char m[96]; snprintf(m, sizeof m, "%s above %d is not supported", kw, SC_MAX_BOUND);
        r = fail(c, "%s", m);
    } else r = (int)json_integer_value(v);
    ptr_pop(c, o);
    return r == -1 && c->err ? -2 : r;
}

static int literal(sc *c, json_t *v) {
    char *txt = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!txt) return fail(c, "%s", "cannot serialize enum/const value");
    int r = lit(c, txt, strlen(txt));
    free(txt);
    return r;
}

static int ref_target(sc *c, json_t *s, const char *path) {
    json_t *t = NULL;
    const char *name = NULL;
    if (!strcmp(path, "#")) t = c->root;
    else if (!strncmp(path, "#/$defs/", 8)) { name = path + 8; t = json_object_get(c->root, "$defs"); }
    else if (!strncmp(path, "#/definitions/", 14)) { name = path + 14; t = json_object_get(c->root, "definitions"); }
    else return fail(c, "unsupported $ref \"%.100s\" (only #, #/$defs/NAME, #/definitions/NAME)", path);
    if (name) {
        char key[256]; size_t k = 0;
        for (const char *p = name; *p && k + 1 < sizeof key; p++) {
            if (*p == '/') return fail(c, "unsupported $ref \"%.100s\" (nested path)", path);
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) { key[k++] = p[1] == '0' ? '~' : '/'; p++; }
            else key[k++] = *p;
        }
        key[k] = 0;
        t = json_is_object(t) ? json_object_get(t, key) : NULL;
    }
    if (!t) return fail(c, "$ref \"%.100s\" points to nothing", path);
    (void)s;
    for (int i = 0; i < c->n_memo; i++) if (c->memo_node[i] == t) return c->memo_rule[i];
    int r = rule(c);
    if (r < 0) return -1;
    if (c->n_memo == c->cap_memo) {
        int nc = c->cap_memo ? 2 * c->cap_memo : 16;
        json_t **a = realloc(c->memo_node, sizeof *a * (size_t)nc);
        if (a) c->memo_node = a;
        int *b = realloc(c->memo_rule, sizeof *b * (size_t)nc);
        if (b) c->memo_rule = b;
        if (!a || !b) return fail(c, "%s", "out of memory");
        c->cap_memo = nc;
    }
    c->memo_node[c->n_memo] = t; c->memo_rule[c->n_memo++] = r;
    char saved[sizeof c->ptr];
    memcpy(saved, c->ptr, sizeof saved);
    snprintf(c->ptr, sizeof c->ptr, "%s", path + 1);
    int b = compile(c, t);
    memcpy(c->ptr, saved, sizeof saved);
    if (b < 0) return -1;
    int32_t e = ref(b);
    alt(c, r, &e, 1);
    return r;
}

static const char *const sc_annot[] = { "title", "description", "default", "examples", "$schema", "$id",
                                        "format", "$comment", "$defs", "definitions", "nullable", NULL };
static const char *const sc_known[] = { "type", "properties", "required", "additionalProperties", "items",
                                        "prefixItems", "minItems", "maxItems", "enum", "const", "anyOf",
                                        "oneOf", "allOf", "$ref", "minLength", "maxLength", NULL };
static int in_list(const char *k, const char *const *l) {
    for (; *l; l++) if (!strcmp(k, *l)) return 1;
    return 0;
}

/* The body of an extra key's string that differs from every listed property name (names
 * as serialized, without quotes), so that an extra key never shadows a listed property.
 * A trie walk: st 0 plain, 1 after a backslash, 2..5 inside \uXXXX (st-1 digits left).
 * Spellings of a listed name through other escapes are not excluded. */
static int not_key(sc *c, char **names, int n, int d, int st) {
    int r = rule(c), s = str_free(c) >= 0 ? c->g->str_rule : -1;
    if (r < 0 || s < 0) return -1;
    int terminal = 0;
    for (int i = 0; i < n; i++) terminal |= (int)strlen(names[i]) == d;
    if (!terminal && st == 0) { int32_t q = byte_el(c, '"'); alt(c, r, &q, 1); }
    gram_set used; memset(&used, 0, sizeof used);
    char **grp = malloc(sizeof(char *) * ((size_t)n + 1));
    if (!grp) return fail(c, "%s", "out of memory");
    for (int i = 0; i < n && !c->err; i++) {
        if ((int)strlen(names[i]) <= d) continue;
        unsigned b = (uint8_t)names[i][d];
        if (gram_set_has(&used, b)) continue;
        gram_set_add(&used, b);
        int m = 0;
        for (int j = 0; j < n; j++) if ((int)strlen(names[j]) > d && (uint8_t)names[j][d] == b) grp[m++] = names[j];
        int ns = st == 0 ? (b == '\\') : st == 1 ? (b == 'u' ? 5 : 0) : st == 2 ? 0 : st - 1;
        int32_t e[2] = { byte_el(c, b), ref(not_key(c, grp, m, d + 1, ns)) };
        alt(c, r, e, 2);
    }
    free(grp);
    if (st == 0 || st == 1) {
        gram_set other; memset(&other, 0, sizeof other);
        const char *set = st == 1 ? "\"\\/bfnrt" : NULL;
        if (set) for (; *set; set++) gram_set_add(&other, (uint8_t)*set);
        else for (unsigned b = 0x20; b < 256; b++) if (b != '"' && b != '\\') gram_set_add(&other, b);
        for (int k = 0; k < 4; k++) other.w[k] &= ~used.w[k];
        int32_t e[2] = { gram_g_set(c->g, &other), ref(s) };
        alt(c, r, e, 2);
        if (st == 0 && !gram_set_has(&used, '\\')) { int32_t x[3] = { byte_el(c, '\\'), ref(esc(c)), ref(s) }; alt(c, r, x, 3); }
        if (st == 1 && !gram_set_has(&used, 'u')) {
            int32_t x[3] = { byte_el(c, 'u'), ref(uesc(c)), ref(s) };
            alt(c, r, x, 3);
        }
    }
    return r;
}

static int object_type(sc *c, json_t *s) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *ap = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return fail(c, "%s", "properties must be an object");
    if (req && !json_is_array(req)) return fail(c, "%s", "required must be an array");
    int n = props ? (int)json_object_size(props) : 0;
    int *keys = malloc(sizeof(int) * ((size_t)n + 1)), *vals = malloc(sizeof(int) * ((size_t)n + 1));
    char *opt = malloc((size_t)n + 1);
    char **names = calloc((size_t)n + 1, sizeof(char *));
    int r = -1;
    if (!keys || !vals || !opt || !names) { fail(c, "%s", "out of memory"); goto out; }
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        json_t *q = json_array_get(req, i);
        if (!json_is_string(q)) { fail(c, "%s", "required must hold strings"); goto out; }
        if (!json_object_get(props, json_string_value(q))) {
            fail(c, "required property \"%.100s\" is not in properties", json_string_value(q)); goto out;
        }
    }
    int i = 0;
    const char *k; json_t *v;
    json_object_foreach(props, k, v) {
        json_t *ks = json_string(k);
        char *txt = ks ? json_dumps(ks, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        if (!txt) { fail(c, "%s", "out of memory"); goto out; }
        keys[i] = lit(c, txt, strlen(txt));
        txt[strlen(txt) - 1] = 0;
        names[i] = strdup(txt + 1);
        free(txt);
        if (!names[i]) { fail(c, "%s", "out of memory"); goto out; }
        vals[i] = compile_at(c, v, "properties", k);
        opt[i] = 1;
        for (size_t j = 0; req && j < json_array_size(req); j++)
            if (!strcmp(json_string_value(json_array_get(req, j)), k)) opt[i] = 0;
        if (c->err) goto out;
        i++;
    }
    int extra = -1;
    if (ap && !json_is_false(ap)) {
        extra = json_is_true(ap) ? any(c) : compile_at(c, ap, "additionalProperties", NULL);
        if (c->err) goto out;
    }
    int xk = -1;
    if (extra >= 0) {
        int q = rule(c);
        int32_t e[2] = { byte_el(c, '"'), ref(not_key(c, names, n, 0, 0)) };
        alt(c, q, e, 2);
        xk = q;
    }
    r = object_of(c, n, keys, vals, opt, extra, xk);
out:
    for (int j = 0; names && j < n; j++) free(names[j]);
    free(keys); free(vals); free(opt); free(names);
    return c->err ? -1 : r;
}

static int array_type(sc *c, json_t *s) {
    json_t *items = json_object_get(s, "items"), *pre = json_object_get(s, "prefixItems");
    if (pre && !json_is_array(pre)) return fail(c, "%s", "prefixItems must be an array");
    int np = pre ? (int)json_array_size(pre) : 0;
    if (np > SC_MAX_BOUND) return fail(c, "%s", "too many prefixItems");
    int lo = bound(c, s, "minItems", 0), hi = bound(c, s, "maxItems", -1);
    if (lo == -2 || hi == -2) return -1;
    int *pr = malloc(sizeof(int) * ((size_t)np + 1));
    if (!pr) return fail(c, "%s", "out of memory");
    char idx[24];
    for (int i = 0; i < np && !c->err; i++) {
        snprintf(idx, sizeof idx, "%d", i);
        pr[i] = compile_at(c, json_array_get(pre, (size_t)i), "prefixItems", idx);
    }
    int extra = -1;
    if (!c->err) {
        if (items && json_is_false(items)) extra = -1;
        else if (items) extra = compile_at(c, items, "items", NULL);
        else if (!pre) extra = any(c);
    }
    int r = c->err ? -1 : array_of(c, pr, np, extra, lo, hi);
    free(pr);
    return r;
}

static int one_type(sc *c, json_t *s, const char *t) {
    if (!strcmp(t, "string")) {
        int lo = bound(c, s, "minLength", 0), hi = bound(c, s, "maxLength", -1);
        if (lo == -2 || hi == -2) return -1;
        if (hi >= 0 && hi < lo) return fail(c, "%s", "maxLength below minLength");
        return str_bounded(c, lo, hi);
    }
    if (!strcmp(t, "number")) return number(c, 0);
    if (!strcmp(t, "integer")) return number(c, 1);
    if (!strcmp(t, "boolean")) return bool_r(c);
    if (!strcmp(t, "null")) return null_r(c);
    if (!strcmp(t, "object")) return object_type(c, s);
    if (!strcmp(t, "array")) return array_type(c, s);
    return fail(c, "unknown type \"%.60s\"", t);
}

static int compile(sc *c, json_t *s) {
    if (json_is_true(s)) return any(c);
    if (json_is_false(s)) return fail(c, "%s", "the schema false allows nothing");
    if (!json_is_object(s)) return fail(c, "%s", "a schema must be an object or a boolean");
    if (++c->nest > SC_MAX_NEST) { c->nest--; return fail(c, "%s", "schema nested too deeply"); }
    const char *k; json_t *v;
    int r = -1, n_constraint = 0;
    json_object_foreach(s, k, v) {
        if (in_list(k, sc_annot)) continue;
        if (!in_list(k, sc_known)) {
            size_t o = ptr_push(c, k);
            fail(c, "unsupported keyword \"%.80s\"", k);
            ptr_pop(c, o);
            goto out;
        }
        n_constraint++;
    }
    json_t *nul = json_object_get(s, "nullable");
    int nullable = nul && json_is_true(nul);
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    json_t *ref_s = json_object_get(s, "$ref");
    json_t *comb = json_object_get(s, "anyOf");
    const char *comb_kw = "anyOf";
    if (!comb) { comb = json_object_get(s, "oneOf"); comb_kw = "oneOf"; }
    if (!comb) { comb = json_object_get(s, "allOf"); comb_kw = "allOf"; }
    int body = -1;
    if (ref_s || comb) {
        const char *kw = ref_s ? "$ref" : comb_kw;
        if (n_constraint > 1) { fail(c, "\"%s\" combined with other constraint keywords is not supported", kw); goto out; }
        if (ref_s) {
            if (!json_is_string(ref_s)) { fail(c, "%s", "$ref must be a string"); goto out; }
            body = ref_target(c, s, json_string_value(ref_s));
        } else {
            if (!json_is_array(comb) || json_array_size(comb) == 0) { fail(c, "%s must be a non-empty array", kw); goto out; }
            if (!strcmp(kw, "allOf") && json_array_size(comb) != 1) { fail(c, "%s", "allOf with more than one member is not supported"); goto out; }
            body = rule(c);
            char idx[24];
            for (size_t i = 0; i < json_array_size(comb) && !c->err; i++) {
                snprintf(idx, sizeof idx, "%zu", i);
                int32_t e = ref(compile_at(c, json_array_get(comb, i), kw, idx));
                alt(c, body, &e, 1);
            }
        }
    } else if (en || cn) {
        if (en && (!json_is_array(en) || json_array_size(en) == 0)) { fail(c, "%s", "enum must be a non-empty array"); goto out; }
        body = rule(c);
        for (size_t i = 0; en && i < json_array_size(en) && !c->err; i++) {
            int32_t e = ref(literal(c, json_array_get(en, i)));
            alt(c, body, &e, 1);
        }
        if (cn && !en) { int32_t e = ref(literal(c, cn)); alt(c, body, &e, 1); }
    } else {
        json_t *ty = json_object_get(s, "type");
        body = rule(c);
        if (json_is_string(ty)) {
            int32_t e = ref(one_type(c, s, json_string_value(ty)));
            alt(c, body, &e, 1);
        } else if (json_is_array(ty) && json_array_size(ty) > 0) {
            for (size_t i = 0; i < json_array_size(ty) && !c->err; i++) {
                json_t *t = json_array_get(ty, i);
                if (!json_is_string(t)) { fail(c, "%s", "type must hold strings"); break; }
                if (!strcmp(json_string_value(t), "null")) { nullable = 1; continue; }
                int32_t e = ref(one_type(c, s, json_string_value(t)));
                alt(c, body, &e, 1);
            }
        } else if (ty) {
            fail(c, "%s", "type must be a string or a non-empty array");
        } else {
            const char *t = NULL;
            if (json_object_get(s, "properties") || json_object_get(s, "required") ||
                json_object_get(s, "additionalProperties")) t = "object";
            else if (json_object_get(s, "items") || json_object_get(s, "prefixItems") ||
                     json_object_get(s, "minItems") || json_object_get(s, "maxItems")) t = "array";
            else if (json_object_get(s, "minLength") || json_object_get(s, "maxLength")) t = "string";
            int32_t e = ref(t ? one_type(c, s, t) : any(c));
            alt(c, body, &e, 1);
        }
    }
    if (c->err) goto out;
    if (nullable) {
        r = rule(c);
        int32_t a = ref(body), b = ref(null_r(c));
        alt(c, r, &a, 1); alt(c, r, &b, 1);
    } else r = body;
out:
    c->nest--;
    return c->err ? -1 : r;
}

static lily_code finish(sc *c, int value, gram_grammar **out) {
    int top = c->err ? -1 : rule(c);
    if (!c->err) { int32_t e[2] = { ref(ws(c)), ref(value) }; alt(c, top, e, 2); }
    free(c->memo_node); free(c->memo_rule);
    lily_code rc = c->err;
    if (!rc) rc = gram_g_finish(c->g, top, c->st);
    if (rc) { gram_free(c->g); return rc; }
    *out = c->g;
    return LILY_OK;
}

lily_code gram_from_json_schema(const char *schema, size_t len, gram_grammar **out, lily_status *st) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(schema, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!root) return lily_err(st, LILY_EINVAL, "json schema: bad JSON: %s (line %d, column %d, byte %d)",
                               je.text, je.line, je.column, je.position);
    sc c; memset(&c, 0, sizeof c);
    c.st = st; c.root = root; c.g = gram_g_new();
    if (!c.g) { json_decref(root); return lily_err(st, LILY_ENOMEM, "grammar: out of memory"); }
    int v = compile(&c, root);
    lily_code rc = finish(&c, v, out);
    json_decref(root);
    return rc;
}

lily_code gram_json_object(gram_grammar **out, lily_status *st) {
    *out = NULL;
    sc c; memset(&c, 0, sizeof c);
    c.st = st; c.g = gram_g_new();
    if (!c.g) return lily_err(st, LILY_ENOMEM, "grammar: out of memory");
    int v = any(&c);
    int o = object_of(&c, 0, NULL, NULL, NULL, v, str_free(&c));
    return finish(&c, o, out);
}
