/* A fast path for the two big parts of a tokenizer.json (model.vocab, model.merges): a
 * general JSON parser spends most of a load building objects for them. The rest of the
 * file still goes through jansson; anything unexpected makes the caller use jansson alone. */
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tok_internal.h"

typedef struct { const char *p, *e; } cur;

static void ws(cur *c) {
    while (c->p < c->e && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) c->p++;
}

static int hex4(const char *p, unsigned *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char h = p[i];
        int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0) return 0;
        *v = *v * 16 + (unsigned)d;
    }
    return 1;
}

/* Decodes the JSON string at c->p into out (room for the encoded length) when out is not
 * NULL; returns its length, or -1 when malformed. */
static long string(cur *c, char *out) {
    if (c->p >= c->e || *c->p != '"') return -1;
    c->p++;
    long w = 0;
    while (c->p < c->e) {
        unsigned char ch = (unsigned char)*c->p;
        if (ch == '"') { c->p++; return w; }
        if (ch < 0x20) return -1;
        if (ch == '\\') {
            if (c->e - c->p < 2) return -1;
            char x = c->p[1];
            c->p += 2;
            char lit = x == '"' ? '"' : x == '\\' ? '\\' : x == '/' ? '/' : x == 'b' ? '\b' : x == 'f' ? '\f' :
                       x == 'n' ? '\n' : x == 'r' ? '\r' : x == 't' ? '\t' : 0;
            if (lit) { if (out) out[w] = lit; w++; continue; }
            if (x != 'u') return -1;
            unsigned cp, lo;
            if (c->e - c->p < 4 || !hex4(c->p, &cp)) return -1;
            c->p += 4;
            if (cp >= 0xDC00 && cp < 0xE000) return -1;
            if (cp >= 0xD800 && cp < 0xDC00) {
                if (c->e - c->p < 6 || c->p[0] != '\\' || c->p[1] != 'u' || !hex4(c->p + 2, &lo) || lo < 0xDC00 || lo >= 0xE000) return -1;
                c->p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            char b[4]; int l;
            if (cp < 0x80) { b[0] = (char)cp; l = 1; }
            else if (cp < 0x800) { b[0] = (char)(0xC0 | (cp >> 6)); b[1] = (char)(0x80 | (cp & 0x3F)); l = 2; }
            else if (cp < 0x10000) { b[0] = (char)(0xE0 | (cp >> 12)); b[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); b[2] = (char)(0x80 | (cp & 0x3F)); l = 3; }
            else { b[0] = (char)(0xF0 | (cp >> 18)); b[1] = (char)(0x80 | ((cp >> 12) & 0x3F)); b[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); b[3] = (char)(0x80 | (cp & 0x3F)); l = 4; }
            if (out) memcpy(out + w, b, (size_t)l);
            w += l;
            continue;
        }
        if (ch < 0x80) { if (out) out[w] = (char)ch; w++; c->p++; continue; }
        size_t sub;
        int l = tok_utf8_check((const unsigned char *)c->p, (size_t)(c->e - c->p), &sub);
        if (l <= 0) return -1;
        if (out) memcpy(out + w, c->p, (size_t)l);
        w += l; c->p += l;
    }
    return -1;
}

static int skip_value(cur *c, int depth) {
    ws(c);
    if (c->p >= c->e || depth > 64) return 0;
    char ch = *c->p;
    if (ch == '"') return string(c, NULL) >= 0;
    if (ch == '{' || ch == '[') {
        char close = ch == '{' ? '}' : ']';
        c->p++; ws(c);
        if (c->p < c->e && *c->p == close) { c->p++; return 1; }
        for (;;) {
            if (ch == '{') {
                ws(c);
                if (string(c, NULL) < 0) return 0;
                ws(c);
                if (c->p >= c->e || *c->p != ':') return 0;
                c->p++;
            }
            if (!skip_value(c, depth + 1)) return 0;
            ws(c);
            if (c->p >= c->e) return 0;
            if (*c->p == ',') { c->p++; continue; }
            if (*c->p == close) { c->p++; return 1; }
            return 0;
        }
    }
    /* numbers, true, false, null: jansson checks them later */
    const char *s = c->p;
    while (c->p < c->e && !strchr(",}] \n\r\t", *c->p)) c->p++;
    return c->p > s;
}

/* Visits the members of the object at c->p, calling fn(key, value cursor) for each. */
static int members(cur *c, int (*fn)(void *, const char *, long, cur *), void *ctx) {
    ws(c);
    if (c->p >= c->e || *c->p != '{') return 0;
    c->p++; ws(c);
    if (c->p < c->e && *c->p == '}') { c->p++; return 1; }
    char key[64];
    for (;;) {
        ws(c);
        cur k = *c;
        long kl = string(&k, NULL);
        if (kl < 0) return 0;
        if (kl < (long)sizeof key) string(c, key); else { c->p = k.p; key[0] = 0; kl = 0; }
        ws(c);
        if (c->p >= c->e || *c->p != ':') return 0;
        c->p++; ws(c);
        if (!fn(ctx, key, kl, c)) return 0;
        ws(c);
        if (c->p >= c->e) return 0;
        if (*c->p == ',') { c->p++; continue; }
        if (*c->p == '}') { c->p++; return 1; }
        return 0;
    }
}

typedef struct { const char *base; size_t vb, ve, mb, me; int nv, nm; } spans;

static int model_member(void *ctx, const char *k, long kl, cur *c) {
    spans *s = ctx;
    size_t at = (size_t)(c->p - s->base);
    if (!skip_value(c, 1)) return 0;
    if (kl == 5 && !memcmp(k, "vocab", 5)) { s->vb = at; s->ve = (size_t)(c->p - s->base); s->nv++; }
    if (kl == 6 && !memcmp(k, "merges", 6)) { s->mb = at; s->me = (size_t)(c->p - s->base); s->nm++; }
    return 1;
}

static int root_member(void *ctx, const char *k, long kl, cur *c) {
    if (kl == 5 && !memcmp(k, "model", 5)) {
        ws(c);
        if (c->p < c->e && *c->p == '{') return members(c, model_member, ctx);
    }
    return skip_value(c, 1);
}

int tok_json_find_parts(const char *s, size_t n, size_t *vb, size_t *ve, size_t *mb, size_t *me) {
    spans sp = { s, 0, 0, 0, 0, 0, 0 };
    cur c = { s, s + n };
    if (!members(&c, root_member, &sp) || sp.nv != 1 || sp.nm != 1) return 0;
    ws(&c);
    if (c.p != c.e) return 0;
    *vb = sp.vb; *ve = sp.ve; *mb = sp.mb; *me = sp.me;
    return 1;
}

/* "{ "tok": 12, ... }" -> entries, strings decoded into *arena (freed by the caller). */
int tok_json_vocab(const char *s, size_t n, tok_vocab_ent **out, size_t *nout, char **arena) {
    *out = NULL; *arena = NULL; *nout = 0;
    cur c = { s, s + n };
    size_t cap = n / 8 + 16, k = 0, w = 0;
    tok_vocab_ent *v = malloc(cap * sizeof *v);
    char *a = malloc(n + 1);
    if (!v || !a) goto fail;
    ws(&c);
    if (c.p >= c.e || *c.p++ != '{') goto fail;
    ws(&c);
    if (c.p < c.e && *c.p == '}') goto done;
    for (;;) {
        ws(&c);
        long l = string(&c, a + w);
        if (l < 0) goto fail;
        ws(&c);
        if (c.p >= c.e || *c.p++ != ':') goto fail;
        ws(&c);
        long long id = 0; int digits = 0;
        while (c.p < c.e && *c.p >= '0' && *c.p <= '9' && digits < 12) { id = id * 10 + (*c.p++ - '0'); digits++; }
        if (!digits || id >= INT32_MAX || (c.p < c.e && (*c.p == '.' || *c.p == 'e' || *c.p == 'E' || (*c.p >= '0' && *c.p <= '9')))) goto fail;
        if (k == cap) {
            tok_vocab_ent *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) goto fail;
            v = nv;
        }
        v[k].s = a + w; v[k].n = (size_t)l; v[k].id = (int32_t)id; k++;
        w += (size_t)l;
        ws(&c);
        if (c.p >= c.e) goto fail;
        if (*c.p == ',') { c.p++; continue; }
        if (*c.p++ == '}') break;
        goto fail;
    }
done:
    *out = v; *nout = k; *arena = a;
    return 1;
fail:
    free(v); free(a);
    return 0;
}

/* "[ "a b" | ["a", "b"], ... ]": calls fn for each merge in order. 0 when malformed. */
int tok_json_merges(const char *s, size_t n, int (*fn)(void *, const char *, size_t, const char *, size_t),
                    void *ctx) {
    cur c = { s, s + n };
    char *buf = malloc(n + 1);
    if (!buf) return 0;
    int ok = 0;
    ws(&c);
    if (c.p >= c.e || *c.p++ != '[') goto out;
    ws(&c);
    if (c.p < c.e && *c.p == ']') { ok = 1; goto out; }
    for (;;) {
        ws(&c);
        if (c.p < c.e && *c.p == '"') {
            long l = string(&c, buf);
            if (l < 0) goto out;
            const char *sp = memchr(buf, ' ', (size_t)l);
            if (!sp || memchr(sp + 1, ' ', (size_t)(buf + l - sp - 1))) goto out;
            if (!fn(ctx, buf, (size_t)(sp - buf), sp + 1, (size_t)(buf + l - sp - 1))) goto out;
        } else if (c.p < c.e && *c.p == '[') {
            c.p++; ws(&c);
            long la = string(&c, buf);
            if (la < 0) goto out;
            ws(&c);
            if (c.p >= c.e || *c.p++ != ',') goto out;
            ws(&c);
            long lb = string(&c, buf + la);
            if (lb < 0) goto out;
            ws(&c);
            if (c.p >= c.e || *c.p++ != ']') goto out;
            if (!fn(ctx, buf, (size_t)la, buf + la, (size_t)lb)) goto out;
        } else goto out;
        ws(&c);
        if (c.p >= c.e) goto out;
        if (*c.p == ',') { c.p++; continue; }
        if (*c.p++ == ']') { ok = 1; break; }
        goto out;
    }
out:
    free(buf);
    return ok;
}
