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
#include "text/gram_json.h"
#include "util/util.h"

static int compile(gj_ctx *c, json_t *s);

/* c->ptr grows by one pointer segment (escaped per RFC 6901) and is restored by ptr_pop */
static size_t ptr_push(gj_ctx *c, const char *seg) {
    size_t old = strlen(c->ptr), o = old;
    if (o + 2 < sizeof c->ptr) c->ptr[o++] = '/';
    for (; *seg && o + 3 < sizeof c->ptr; seg++) {
        if (*seg == '~' || *seg == '/') { c->ptr[o++] = '~'; c->ptr[o++] = *seg == '~' ? '0' : '1'; }
        else c->ptr[o++] = *seg;
    }
    c->ptr[o] = 0;
    return old;
}
static void ptr_pop(gj_ctx *c, size_t old) { c->ptr[old] = 0; }

static int compile_at(gj_ctx *c, json_t *s, const char *seg1, const char *seg2) {
    size_t o = ptr_push(c, seg1);
    if (seg2) ptr_push(c, seg2);
    int r = compile(c, s);
    ptr_pop(c, o);
    return r;
}

static int bound(gj_ctx *c, json_t *s, const char *kw, int dflt) {
    json_t *v = json_object_get(s, kw);
    if (!v) return dflt;
    size_t o = ptr_push(c, kw);
    int r;
    if (!json_is_integer(v) || json_integer_value(v) < 0) r = gj_fail(c, "%s must be a non-negative integer", kw);
    else if (json_integer_value(v) > SC_MAX_BOUND) {
        char m[96]; snprintf(m, sizeof m, "%s above %d is not supported", kw, SC_MAX_BOUND);
        r = gj_fail(c, "%s", m);
    } else r = (int)json_integer_value(v);
    ptr_pop(c, o);
    return r == -1 && c->err ? -2 : r;
}

static int literal(gj_ctx *c, json_t *v) {
    char *txt = json_dumps(v, gj_dump_flags(c));
    if (!txt) return gj_fail(c, "%s", "cannot serialize enum/const value");
    int r = gj_lit(c, txt, strlen(txt));
    free(txt);
    return r;
}

static int ref_target(gj_ctx *c, json_t *s, const char *path) {
    json_t *t = NULL;
    const char *name = NULL;
    if (!strcmp(path, "#")) t = c->root;
    else if (!strncmp(path, "#/$defs/", 8)) { name = path + 8; t = json_object_get(c->root, "$defs"); }
    else if (!strncmp(path, "#/definitions/", 14)) { name = path + 14; t = json_object_get(c->root, "definitions"); }
    else return gj_fail(c, "unsupported $ref \"%.100s\" (only #, #/$defs/NAME, #/definitions/NAME)", path);
    if (name) {
        char key[256]; size_t k = 0;
        for (const char *p = name; *p && k + 1 < sizeof key; p++) {
            if (*p == '/') return gj_fail(c, "unsupported $ref \"%.100s\" (nested path)", path);
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) { key[k++] = p[1] == '0' ? '~' : '/'; p++; }
            else key[k++] = *p;
        }
        key[k] = 0;
        t = json_is_object(t) ? json_object_get(t, key) : NULL;
    }
    if (!t) return gj_fail(c, "$ref \"%.100s\" points to nothing", path);
    (void)s;
    for (int i = 0; i < c->n_memo; i++) if (c->memo_node[i] == t) return c->memo_rule[i];
    int r = gj_rule(c);
    if (r < 0) return -1;
    if (c->n_memo == c->cap_memo) {
        int nc = c->cap_memo ? 2 * c->cap_memo : 16;
        json_t **a = realloc(c->memo_node, sizeof *a * (size_t)nc);
        if (a) c->memo_node = a;
        int *b = realloc(c->memo_rule, sizeof *b * (size_t)nc);
        if (b) c->memo_rule = b;
        if (!a || !b) return gj_fail(c, "%s", "out of memory");
        c->cap_memo = nc;
    }
    c->memo_node[c->n_memo] = t; c->memo_rule[c->n_memo++] = r;
    char saved[sizeof c->ptr];
    memcpy(saved, c->ptr, sizeof saved);
    snprintf(c->ptr, sizeof c->ptr, "%s", path + 1);
    int b = compile(c, t);
    memcpy(c->ptr, saved, sizeof saved);
    if (b < 0) return -1;
    int32_t e = gj_ref(b);
    gj_alt(c, r, &e, 1);
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
 * A trie walk: st 0 plain at a character boundary, 1 after a backslash, 2..5 inside
 * \uXXXX (st-1 digits left), 6 inside a multibyte character. Where the key leaves the
 * trie it continues as a free string body, completing the character it is in first, so
 * keys stay well-formed UTF-8. Spellings of a listed name through other escapes are not
 * excluded. */
static int not_key(gj_ctx *c, char **names, int n, int d, int st) {
    int r = gj_rule(c), s = gj_str_free(c) >= 0 ? c->strbody - 1 : -1;
    if (r < 0 || s < 0) return -1;
    int terminal = 0;
    for (int i = 0; i < n; i++) terminal |= (int)strlen(names[i]) == d;
    if (!terminal && st == 0) { int32_t q = gj_byte_el(c, '"'); gj_alt(c, r, &q, 1); }
    /* the character being spelled at depth d (st 6): its lead byte and continuations so far */
    unsigned lead = 0; int j = 0;
    if (st == 6) {
        int p = d - 1;
        while (p > 0 && ((uint8_t)names[0][p] & 0xc0) == 0x80) p--;
        lead = (uint8_t)names[0][p]; j = d - 1 - p;
    }
    gram_set used; memset(&used, 0, sizeof used);
    char **grp = malloc(sizeof(char *) * ((size_t)n + 1));
    if (!grp) return gj_fail(c, "%s", "out of memory");
    for (int i = 0; i < n && !c->err; i++) {
        if ((int)strlen(names[i]) <= d) continue;
        unsigned b = (uint8_t)names[i][d];
        if (gram_set_has(&used, b)) continue;
        gram_set_add(&used, b);
        int m = 0;
        for (int k = 0; k < n; k++) if ((int)strlen(names[k]) > d && (uint8_t)names[k][d] == b) grp[m++] = names[k];
        int ns = st == 0 ? (b == '\\' ? 1 : b >= 0x80 ? 6 : 0) : st == 1 ? (b == 'u' ? 5 : 0) : st == 2 ? 0
               : st == 6 ? (j + 2 < gj_u8_len(lead) ? 6 : 0) : st - 1;
        int32_t e[2] = { gj_byte_el(c, b), gj_ref(not_key(c, grp, m, d + 1, ns)) };
        gj_alt(c, r, e, 2);
    }
    free(grp);
    gram_set other; memset(&other, 0, sizeof other);
    if (st == 0) {
        int32_t ua[1] = { gj_u8_set(c, 0) };
        other = c->g->sets[ua[0]];
        for (int k = 0; k < 4; k++) other.w[k] &= ~used.w[k];
        int32_t e[2] = { gram_g_set(c->g, &other), gj_ref(s) };
        gj_alt(c, r, e, 2);
        for (int i = 0; i < 7; i++) { /* multibyte characters whose lead byte leaves the trie */
            int32_t u[6];
            int m = gj_u8_seq(c, i, u);
            gram_set ls = c->g->sets[u[0]];
            for (int k = 0; k < 4; k++) ls.w[k] &= ~used.w[k];
            if (!ls.w[0] && !ls.w[1] && !ls.w[2] && !ls.w[3]) continue;
            u[0] = gram_g_set(c->g, &ls); u[m++] = gj_ref(s);
            gj_alt(c, r, u, m);
        }
        if (!gram_set_has(&used, '\\')) { int32_t x[3] = { gj_byte_el(c, '\\'), gj_ref(gj_esc(c)), gj_ref(s) }; gj_alt(c, r, x, 3); }
    } else if (st == 1) {
        for (const char *set = "\"\\/bfnrt"; *set; set++) if (!gram_set_has(&used, (uint8_t)*set)) gram_set_add(&other, (uint8_t)*set);
        if (other.w[0] || other.w[1]) { int32_t e[2] = { gram_g_set(c->g, &other), gj_ref(s) }; gj_alt(c, r, e, 2); }
        if (!gram_set_has(&used, 'u')) { int32_t x[3] = { gj_byte_el(c, 'u'), gj_ref(gj_uesc(c)), gj_ref(s) }; gj_alt(c, r, x, 3); }
    } else if (st == 6) { /* another continuation byte, then the rest of the character */
        unsigned lo, hi;
        gj_u8_cont(lead, j, &lo, &hi);
        for (unsigned b = lo; b <= hi; b++) if (!gram_set_has(&used, b)) gram_set_add(&other, b);
        if (other.w[2] || other.w[3]) {
            int32_t e[4]; int m = 0;
            e[m++] = gram_g_set(c->g, &other);
            for (int k = j + 2; k < gj_u8_len(lead); k++) e[m++] = gj_u8_set(c, 2);
            e[m++] = gj_ref(s);
            gj_alt(c, r, e, m);
        }
    }
    return r;
}

static int object_type(gj_ctx *c, json_t *s) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *ap = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return gj_fail(c, "%s", "properties must be an object");
    if (req && !json_is_array(req)) return gj_fail(c, "%s", "required must be an array");
    int n = props ? (int)json_object_size(props) : 0;
    int *keys = malloc(sizeof(int) * ((size_t)n + 1)), *vals = malloc(sizeof(int) * ((size_t)n + 1));
    char *opt = malloc((size_t)n + 1);
    char **names = calloc((size_t)n + 1, sizeof(char *));
    int r = -1;
    if (!keys || !vals || !opt || !names) { gj_fail(c, "%s", "out of memory"); goto out; }
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        json_t *q = json_array_get(req, i);
        if (!json_is_string(q)) { gj_fail(c, "%s", "required must hold strings"); goto out; }
        if (!json_object_get(props, json_string_value(q))) {
            gj_fail(c, "required property \"%.100s\" is not in properties", json_string_value(q)); goto out;
        }
    }
    int i = 0;
    const char *k; json_t *v;
    json_object_foreach(props, k, v) {
        json_t *ks = json_string(k);
        char *txt = ks ? json_dumps(ks, gj_dump_flags(c)) : NULL;
        json_decref(ks);
        if (!txt) { gj_fail(c, "%s", "out of memory"); goto out; }
        keys[i] = gj_lit(c, txt, strlen(txt));
        txt[strlen(txt) - 1] = 0;
        names[i] = strdup(txt + 1);
        free(txt);
        if (!names[i]) { gj_fail(c, "%s", "out of memory"); goto out; }
        vals[i] = compile_at(c, v, "properties", k);
        opt[i] = 1;
        for (size_t j = 0; req && j < json_array_size(req); j++)
            if (!strcmp(json_string_value(json_array_get(req, j)), k)) opt[i] = 0;
        if (c->err) goto out;
        i++;
    }
    int extra = -1;
    if (ap && !json_is_false(ap)) {
        extra = json_is_true(ap) ? gj_any(c) : compile_at(c, ap, "additionalProperties", NULL);
        if (c->err) goto out;
    }
    int xk = -1;
    if (extra >= 0) {
        int q = gj_rule(c);
        int32_t e[2] = { gj_byte_el(c, '"'), gj_ref(not_key(c, names, n, 0, 0)) };
        gj_alt(c, q, e, 2);
        xk = q;
    }
    r = gj_object_of(c, n, keys, vals, opt, extra, xk);
out:
    for (int j = 0; names && j < n; j++) free(names[j]);
    free(keys); free(vals); free(opt); free(names);
    return c->err ? -1 : r;
}

static int array_type(gj_ctx *c, json_t *s) {
    json_t *items = json_object_get(s, "items"), *pre = json_object_get(s, "prefixItems");
    if (pre && !json_is_array(pre)) return gj_fail(c, "%s", "prefixItems must be an array");
    int np = pre ? (int)json_array_size(pre) : 0;
    if (np > SC_MAX_BOUND) return gj_fail(c, "%s", "too many prefixItems");
    int lo = bound(c, s, "minItems", 0), hi = bound(c, s, "maxItems", -1);
    if (lo == -2 || hi == -2) return -1;
    int *pr = malloc(sizeof(int) * ((size_t)np + 1));
    if (!pr) return gj_fail(c, "%s", "out of memory");
    char idx[24];
    for (int i = 0; i < np && !c->err; i++) {
        snprintf(idx, sizeof idx, "%d", i);
        pr[i] = compile_at(c, json_array_get(pre, (size_t)i), "prefixItems", idx);
    }
    int extra = -1;
    if (!c->err) {
        if (items && json_is_false(items)) extra = -1;
        else if (items) extra = compile_at(c, items, "items", NULL);
        else if (!pre) extra = gj_any(c);
    }
    int r = c->err ? -1 : gj_array_of(c, pr, np, extra, lo, hi);
    free(pr);
    return r;
}

static int one_type(gj_ctx *c, json_t *s, const char *t) {
    if (!strcmp(t, "string")) {
        int lo = bound(c, s, "minLength", 0), hi = bound(c, s, "maxLength", -1);
        if (lo == -2 || hi == -2) return -1;
        if (hi >= 0 && hi < lo) return gj_fail(c, "%s", "maxLength below minLength");
        return gj_str_bounded(c, lo, hi);
    }
    if (!strcmp(t, "number")) return gj_number(c, 0);
    if (!strcmp(t, "integer")) return gj_number(c, 1);
    if (!strcmp(t, "boolean")) return gj_bool_r(c);
    if (!strcmp(t, "null")) return gj_null_r(c);
    if (!strcmp(t, "object")) return object_type(c, s);
    if (!strcmp(t, "array")) return array_type(c, s);
    return gj_fail(c, "unknown type \"%.60s\"", t);
}

static int compile(gj_ctx *c, json_t *s) {
    if (json_is_true(s)) return gj_any(c);
    if (json_is_false(s)) return gj_fail(c, "%s", "the schema false allows nothing");
    if (!json_is_object(s)) return gj_fail(c, "%s", "a schema must be an object or a boolean");
    if (++c->nest > SC_MAX_NEST) { c->nest--; return gj_fail(c, "%s", "schema nested too deeply"); }
    const char *k; json_t *v;
    int r = -1, n_constraint = 0;
    json_object_foreach(s, k, v) {
        if (in_list(k, sc_annot)) continue;
        if (!in_list(k, sc_known)) {
            size_t o = ptr_push(c, k);
            gj_fail(c, "unsupported keyword \"%.80s\"", k);
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
        if (n_constraint > 1) { gj_fail(c, "\"%s\" combined with other constraint keywords is not supported", kw); goto out; }
        if (ref_s) {
            if (!json_is_string(ref_s)) { gj_fail(c, "%s", "$ref must be a string"); goto out; }
            body = ref_target(c, s, json_string_value(ref_s));
        } else {
            if (!json_is_array(comb) || json_array_size(comb) == 0) { gj_fail(c, "%s must be a non-empty array", kw); goto out; }
            if (!strcmp(kw, "allOf") && json_array_size(comb) != 1) { gj_fail(c, "%s", "allOf with more than one member is not supported"); goto out; }
            body = gj_rule(c);
            char idx[24];
            for (size_t i = 0; i < json_array_size(comb) && !c->err; i++) {
                snprintf(idx, sizeof idx, "%zu", i);
                int32_t e = gj_ref(compile_at(c, json_array_get(comb, i), kw, idx));
                gj_alt(c, body, &e, 1);
            }
        }
    } else if (en || cn) {
        if (en && (!json_is_array(en) || json_array_size(en) == 0)) { gj_fail(c, "%s", "enum must be a non-empty array"); goto out; }
        body = gj_rule(c);
        for (size_t i = 0; en && i < json_array_size(en) && !c->err; i++) {
            int32_t e = gj_ref(literal(c, json_array_get(en, i)));
            gj_alt(c, body, &e, 1);
        }
        if (cn && !en) { int32_t e = gj_ref(literal(c, cn)); gj_alt(c, body, &e, 1); }
    } else {
        json_t *ty = json_object_get(s, "type");
        body = gj_rule(c);
        if (json_is_string(ty)) {
            int32_t e = gj_ref(one_type(c, s, json_string_value(ty)));
            gj_alt(c, body, &e, 1);
        } else if (json_is_array(ty) && json_array_size(ty) > 0) {
            for (size_t i = 0; i < json_array_size(ty) && !c->err; i++) {
                json_t *t = json_array_get(ty, i);
                if (!json_is_string(t)) { gj_fail(c, "%s", "type must hold strings"); break; }
                if (!strcmp(json_string_value(t), "null")) { nullable = 1; continue; }
                int32_t e = gj_ref(one_type(c, s, json_string_value(t)));
                gj_alt(c, body, &e, 1);
            }
        } else if (ty) {
            gj_fail(c, "%s", "type must be a string or a non-empty array");
        } else {
            const char *t = NULL;
            if (json_object_get(s, "properties") || json_object_get(s, "required") ||
                json_object_get(s, "additionalProperties")) t = "object";
            else if (json_object_get(s, "items") || json_object_get(s, "prefixItems") ||
                     json_object_get(s, "minItems") || json_object_get(s, "maxItems")) t = "array";
            else if (json_object_get(s, "minLength") || json_object_get(s, "maxLength")) t = "string";
            int32_t e = gj_ref(t ? one_type(c, s, t) : gj_any(c));
            gj_alt(c, body, &e, 1);
        }
    }
    if (c->err) goto out;
    if (nullable) {
        r = gj_rule(c);
        int32_t a = gj_ref(body), b = gj_ref(gj_null_r(c));
        gj_alt(c, r, &a, 1); gj_alt(c, r, &b, 1);
    } else r = body;
out:
    c->nest--;
    return c->err ? -1 : r;
}

int gj_schema(gj_ctx *c, json_t *root, json_t *s, const char *ptr) {
    json_t *saved_root = c->root;
    char saved[sizeof c->ptr];
    memcpy(saved, c->ptr, sizeof saved);
    c->root = root;
    snprintf(c->ptr, sizeof c->ptr, "%s", ptr);
    int r = compile(c, s);
    c->root = saved_root;
    memcpy(c->ptr, saved, sizeof saved);
    return r;
}

static lily_code finish(gj_ctx *c, int value, gram_grammar **out) {
    int top = c->err ? -1 : gj_rule(c);
    if (!c->err) { int32_t e[2] = { gj_ref(gj_ws(c)), gj_ref(value) }; gj_alt(c, top, e, 2); }
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
    gj_ctx c; memset(&c, 0, sizeof c);
    c.st = st; c.root = root; c.g = gram_g_new();
    if (!c.g) { json_decref(root); return lily_err(st, LILY_ENOMEM, "grammar: out of memory"); }
    int v = compile(&c, root);
    lily_code rc = finish(&c, v, out);
    json_decref(root);
    return rc;
}

lily_code gram_json_object(gram_grammar **out, lily_status *st) {
    *out = NULL;
    gj_ctx c; memset(&c, 0, sizeof c);
    c.st = st; c.g = gram_g_new();
    if (!c.g) return lily_err(st, LILY_ENOMEM, "grammar: out of memory");
    int v = gj_any(&c);
    int o = gj_object_of(&c, 0, NULL, NULL, NULL, v, gj_str_free(&c));
    return finish(&c, o, out);
}
