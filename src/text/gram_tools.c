/* gram_tools: grammars for the tool calls Qwen models write (grammar.h gram_tool_call).
 *
 * The shapes are the ones src/text/chat_render.c prints for an assistant's tool_calls and
 * src/text/parse_call.c reads back; the grammar starts right after the model's
 * <tool_call> token:
 * - XML (Qwen3.5/3.6): "\n<function=NAME>\n" then per parameter, in the schema's order,
 *   "<parameter=P>\n" VALUE "\n</parameter>\n", then "</function>\n</tool_call>".
 *   parse_call keeps a value as text when the property's schema allows a string (or says
 *   nothing), else parses it as JSON; the grammar follows the same rule (both use parse_schema_kinds,
 *   parse_call.c). Text values are raw UTF-8 that must not contain
 *   "</parameter>" (parse_call cuts the value at the first one) nor "</tool_call>" (the
 *   output parser cuts the block there), ended by "\n</parameter>\n": an Aho-Corasick
 *   automaton over those strings, as rules, each state a registered string body so the
 *   mask's fast path applies (GRAM_STR_RAW, with the bytes that advance a terminator as
 *   hot first bytes).
 * - JSON (Qwen3): "\n{\"name\": NAME, \"arguments\": ARGS}\n</tool_call>" with ARGS the
 *   function's parameters schema compiled by gram_schema.c.
 * With multi, "\n<tool_call>" and another call may follow each call.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "text/gram_json.h"
#include "text/parse_priv.h"
#include "util/util.h"

#define TC_MAX_TOOLS 512
#define TC_MAX_DEPTH 8

static const char *const TERM[2] = { "</parameter>", "</tool_call>" };
static const char EXIT[] = "\n</parameter>"; /* then "\n" */
static const char END_PARAM[] = "\n</parameter>\n";

/* ---- raw text values: an automaton over TERM (forbidden) and EXIT (the end) ----
 * States are the proper prefixes of the three strings; next[s][b] is the state after byte
 * b (ASCII; multibyte characters always lead to state 0), -1 forbidden, -2 the exit. The
 * characters of a possible EXIT are counted as value characters until they turn out to be
 * the exit, hence dx (how many of the counted characters may still be EXIT's) and the
 * count guard in raw_text. */

#define AC_MAX 48
#define AC_EXIT (-2)
typedef struct { int n, nl; char pre[AC_MAX][16]; int next[AC_MAX][128]; int dx[AC_MAX]; gram_set hot[AC_MAX]; } ac_t;

static int ac_find(const ac_t *a, const char *s) {
    for (int i = 0; i < a->n; i++) if (!strcmp(a->pre[i], s)) return i;
    return -1;
}

static int ends_with(const char *t, size_t l, const char *p) {
    size_t m = strlen(p);
    return l >= m && !memcmp(t + l - m, p, m);
}

static void ac_build(ac_t *a) {
    memset(a, 0, sizeof *a);
    a->n = 1; /* state 0: "" */
    const char *pats[3] = { TERM[0], TERM[1], EXIT };
    for (int t = 0; t < 3; t++)
        for (size_t l = 1; l < strlen(pats[t]); l++) {
            char p[16]; memcpy(p, pats[t], l); p[l] = 0;
            if (ac_find(a, p) < 0) { memcpy(a->pre[a->n], p, l + 1); a->n++; }
        }
    a->nl = ac_find(a, "\n");
    for (int s = 0; s < a->n; s++) {
        size_t l = strlen(a->pre[s]);
        a->dx[s] = !strncmp(EXIT, a->pre[s], l) ? (int)l : 0;
        for (int b = 1; b < 128; b++) {
            char t[20];
            memcpy(t, a->pre[s], l); t[l] = (char)b; t[l + 1] = 0;
            int to = 0;
            if (ends_with(t, l + 1, EXIT)) to = AC_EXIT;
            else if (ends_with(t, l + 1, TERM[0]) || ends_with(t, l + 1, TERM[1])) to = -1;
            else
                for (size_t o = 0; o <= l + 1; o++) { /* the longest suffix that is a state */
                    int f = ac_find(a, t + o);
                    if (f >= 0) { to = f; break; }
                }
            a->next[s][b] = to;
            /* the mask's promise (gram_g_str): a first byte leading elsewhere than "" or "\n" is hot */
            if (b != '<' && to != 0 && to != a->nl) gram_set_add(&a->hot[s], (unsigned)b);
        }
    }
}

/* the automaton is the same for every grammar: built once */
static ac_t ac_shared;
static pthread_once_t ac_once = PTHREAD_ONCE_INIT;
static void ac_init(void) { ac_build(&ac_shared); }

typedef struct {
    gj_ctx c;
    const ac_t *ac;
    int raw_free;      /* +1: the unbounded raw text rule */
    int end_param;     /* +1: "\n</parameter>\n" */
} tctx;

static int lit_rule(tctx *t, int *slot, const char *s) {
    if (!*slot) *slot = gj_lit(&t->c, s, strlen(s)) + 1;
    return *slot - 1;
}

/* Raw text of lo..hi code points (hi < 0: unbounded) then "\n</parameter>\n": rule
 * R[k][s] = k characters counted, automaton state s. Bounded, a step to state s' with k+1
 * counted is allowed iff k+1 - dx[s'] <= hi, and the exit iff k - 12 >= lo (the 12
 * counted characters were "\n</parameter"). */
static int raw_text(tctx *t, int lo, int hi) {
    gj_ctx *c = &t->c;
    int is_free = lo == 0 && hi < 0;
    if (is_free && t->raw_free) return t->raw_free - 1;
    const ac_t *a = t->ac;
    int ns = a->n, xl = (int)strlen(EXIT) - 1, top = is_free ? 0 : (hi < 0 ? lo : hi) + xl;
    int *R = calloc((size_t)(top + 1) * (size_t)ns, sizeof(int));
    if (!R) return gj_fail(c, "%s", "out of memory");
    for (int i = 0; i < (top + 1) * ns && !c->err; i++) R[i] = gj_rule(c);
    int32_t ex[2] = { gj_byte_el(c, '>'), gj_byte_el(c, '\n') };
    /* the byte set leading from s to each state (-1: none), once for all counts */
    int32_t *grp = malloc(sizeof(int32_t) * (size_t)ns * (size_t)ns);
    if (!grp) { free(R); return gj_fail(c, "%s", "out of memory"); }
    for (int s = 0; s < ns; s++)
        for (int to = 0; to < ns; to++) {
            gram_set set; memset(&set, 0, sizeof set);
            int any = 0;
            for (int b = 1; b < 128; b++) if (a->next[s][b] == to) { gram_set_add(&set, (unsigned)b); any = 1; }
            grp[s * ns + to] = any ? gram_g_set(c->g, &set) : -1;
        }
    for (int k = 0; k <= top && !c->err; k++) {
        int nk = k < top ? k + 1 : (hi < 0 ? k : -1);
        for (int s = 0; s < ns; s++) {
            int r = R[k * ns + s];
            for (int to = 0; nk >= 0 && to < ns; to++) { /* ASCII bytes grouped by the state they lead to */
                if ((hi >= 0 && k + 1 - a->dx[to] > hi) || grp[s * ns + to] < 0) continue;
                int32_t e[2] = { grp[s * ns + to], gj_ref(R[nk * ns + to]) };
                gj_alt(c, r, e, 2);
            }
            for (int i = 0; nk >= 0 && (hi < 0 || k + 1 <= hi) && i < 7; i++) {
                int32_t u[6];
                int n = gj_u8_seq(c, i, u);
                u[n++] = gj_ref(R[nk * ns]);
                gj_alt(c, r, u, n);
            }
            if (a->next[s]['>'] == AC_EXIT && (is_free || k - xl >= lo)) gj_alt(c, r, ex, 2);
            if (hi < 0 || k <= hi) gram_g_str(c->g, r, hi < 0 ? -1 : hi - k, GRAM_STR_RAW, &a->hot[s]);
        }
    }
    int r0 = R[0];
    free(R); free(grp);
    if (is_free && !c->err) t->raw_free = r0 + 1;
    return c->err ? -1 : r0;
}

/* 1 if the text can be a raw value: no NUL, no terminator */
static int raw_ok(const char *s, size_t n) {
    if (memchr(s, 0, n)) return 0;
    for (int k = 0; k < 2; k++) {
        size_t m = strlen(TERM[k]);
        for (size_t i = 0; i + m <= n; i++) if (!memcmp(s + i, TERM[k], m)) return 0;
    }
    return 1;
}

/* ---- parse_call.c's typing of XML parameter values ---- */

static int bound_of(json_t *s, const char *kw, int dflt) {
    json_t *v = json_object_get(s, kw);
    if (!json_is_integer(v) || json_integer_value(v) < 0) return dflt;
    return json_integer_value(v) > SC_MAX_BOUND ? SC_MAX_BOUND : (int)json_integer_value(v);
}

/* adds to rule r the raw texts a string under schema s may be; returns how many
 * alternatives were added (0: s allows no string) */
static int raw_for(tctx *t, json_t *root, json_t *s, int r, int depth) {
    gj_ctx *c = &t->c;
    if (c->err) return 0;
    if (!json_is_object(s) || depth > TC_MAX_DEPTH) { int32_t e = gj_ref(raw_text(t, 0, -1)); gj_alt(c, r, &e, 1); return 1; }
    json_t *ref = json_object_get(s, "$ref");
    if (json_is_string(ref)) {
        const char *p = json_string_value(ref);
        json_t *tg = !strcmp(p, "#") ? root
                   : !strncmp(p, "#/$defs/", 8) ? json_object_get(json_object_get(root, "$defs"), p + 8)
                   : !strncmp(p, "#/definitions/", 14) ? json_object_get(json_object_get(root, "definitions"), p + 14) : NULL;
        return raw_for(t, root, tg, r, depth + 1);
    }
    json_t *cn = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    if (cn || en) {
        int n = 0;
        for (size_t i = 0; i < (en ? json_array_size(en) : 1); i++) {
            json_t *v = en ? json_array_get(en, i) : cn;
            if (!json_is_string(v) || !raw_ok(json_string_value(v), json_string_length(v))) continue;
            size_t l = json_string_length(v);
            char *txt = malloc(l + sizeof END_PARAM);
            if (!txt) { gj_fail(c, "%s", "out of memory"); return 0; }
            memcpy(txt, json_string_value(v), l); memcpy(txt + l, END_PARAM, sizeof END_PARAM); /* with its NUL */
            int32_t e = gj_ref(gj_lit(c, txt, l + sizeof END_PARAM - 1));
            free(txt);
            gj_alt(c, r, &e, 1);
            n++;
        }
        return n;
    }
    static const char *comb[] = { "anyOf", "oneOf", "allOf" };
    for (int k = 0; k < 3; k++) {
        json_t *list = json_object_get(s, comb[k]);
        if (!json_is_array(list)) continue;
        int n = 0;
        for (size_t i = 0; i < json_array_size(list); i++) n += raw_for(t, root, json_array_get(list, i), r, depth + 1);
        return n;
    }
    json_t *ty = json_object_get(s, "type");
    int str = !ty || (json_is_string(ty) && !strcmp(json_string_value(ty), "string"));
    for (size_t i = 0; i < json_array_size(ty); i++)
        str |= json_is_string(json_array_get(ty, i)) && !strcmp(json_string_value(json_array_get(ty, i)), "string");
    if (!str) return 0;
    int lo = bound_of(s, "minLength", 0), hi = bound_of(s, "maxLength", -1);
    if (hi >= 0 && hi < lo) return 0;
    int32_t e = gj_ref(raw_text(t, lo, hi));
    gj_alt(c, r, &e, 1);
    return 1;
}

/* ---- one function ---- */

static const json_t *tool_fn(const json_t *tool) {
    const json_t *fn = json_object_get(tool, "function");
    return fn ? fn : tool;
}

/* a name parse_call reads back unchanged between '=' and '>' */
static int xml_name_ok(const char *s) {
    size_t n = strlen(s);
    if (!n || strpbrk(s, "<>\n") || strchr(" \t\r", s[0]) || strchr(" \t\r", s[n - 1])) return 0;
    return 1;
}

/* after "<function=": NAME ">\n" params "</function>\n</tool_call>" */
static int xml_fn(tctx *t, const char *name, json_t *params) {
    gj_ctx *c = &t->c;
    if (!xml_name_ok(name)) return gj_fail(c, "the name \"%.80s\" cannot be written in the XML tool-call format", name);
    json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
    /* the whole schema once, for the same refusals as response_format (its rules stay unused) */
    if (params && gj_schema(c, params, params, "") < 0) return -1;
    int n = json_is_object(props) ? (int)json_object_size(props) : 0;
    int *T = malloc(sizeof(int) * ((size_t)n + 1));
    if (!T) return gj_fail(c, "%s", "out of memory");
    for (int i = 0; i <= n; i++) T[i] = gj_rule(c);
    int tail = gj_lit(c, "</function>\n</tool_call>", 24);
    int32_t te = gj_ref(tail);
    gj_alt(c, T[n], &te, 1);
    int i = 0;
    const char *k; json_t *ps;
    json_object_foreach(props, k, ps) {
        if (c->err) break;
        if (!xml_name_ok(k)) { gj_fail(c, "the parameter name \"%.80s\" cannot be written in the XML tool-call format", k); break; }
        int opt = 1;
        for (size_t j = 0; j < json_array_size(req); j++)
            if (json_is_string(json_array_get(req, j)) && !strcmp(json_string_value(json_array_get(req, j)), k)) opt = 0;
        size_t kl = strlen(k);
        char *head = malloc(kl + 16);
        if (!head) { gj_fail(c, "%s", "out of memory"); break; }
        int hl = snprintf(head, kl + 16, "<parameter=%s>\n", k);
        int h = gj_lit(c, head, (size_t)hl);
        free(head);
        int v;
        int kd = parse_schema_kinds(ps, params, 0);
        if ((kd & 1) || !kd) {
            v = gj_rule(c);
            if (!raw_for(t, params, ps, v, 0)) { int32_t e = gj_ref(raw_text(t, 0, -1)); gj_alt(c, v, &e, 1); }
        } else {
            char ptr[300];
            snprintf(ptr, sizeof ptr, "/properties/%.200s", k);
            int jv = gj_schema(c, params, ps, ptr);
            v = gj_rule(c);
            int32_t e[2] = { gj_ref(jv), gj_ref(lit_rule(t, &t->end_param, END_PARAM)) };
            gj_alt(c, v, e, 2);
        }
        int32_t e[3] = { gj_ref(h), gj_ref(v), gj_ref(T[i + 1]) };
        gj_alt(c, T[i], e, 3);
        if (opt) { int32_t s = gj_ref(T[i + 1]); gj_alt(c, T[i], &s, 1); }
        i++;
    }
    int r = gj_rule(c);
    size_t nl = strlen(name);
    char *head = malloc(nl + 4);
    if (!head) { free(T); return gj_fail(c, "%s", "out of memory"); }
    memcpy(head, name, nl); memcpy(head + nl, ">\n", 3);
    int32_t e[2] = { gj_ref(gj_lit(c, head, nl + 2)), gj_ref(T[0]) };
    free(head);
    gj_alt(c, r, e, 2);
    free(T);
    return c->err ? -1 : r;
}

/* after "{": "name" : NAME , "arguments" : ARGS } "\n</tool_call>" with ARGS from params */
static int json_fn(tctx *t, const char *name, json_t *params) {
    gj_ctx *c = &t->c;
    int w = gj_ws(c), args;
    if (params) args = gj_schema(c, params, params, "");
    else { int32_t e[3] = { gj_byte_el(c, '{'), gj_ref(w), gj_byte_el(c, '}') }; args = gj_rule(c); gj_alt(c, args, e, 3); }
    json_t *js = json_string(name);
    char *q = js ? json_dumps(js, gj_dump_flags(c)) : NULL;
    json_decref(js);
    if (!q) return gj_fail(c, "%s", "out of memory");
    int nm = gj_lit(c, q, strlen(q));
    free(q);
    int r = gj_rule(c);
    int32_t e[13] = { gj_ref(gj_lit(c, "\"name\"", 6)), gj_ref(w), gj_byte_el(c, ':'), gj_ref(w), gj_ref(nm), gj_ref(w),
                      gj_byte_el(c, ','), gj_ref(w), gj_ref(gj_lit(c, "\"arguments\"", 11)), gj_ref(w), gj_byte_el(c, ':'),
                      gj_ref(w), gj_ref(args) };
    gj_alt(c, r, e, 13);
    return c->err ? -1 : r;
}

/* the parameters schema as an object schema (a missing type means object), or NULL for a
 * function without parameters. A copy made for that is kept in `keep` until the grammar is
 * done: the $ref memo is keyed by node addresses, which must not be reused meanwhile. */
static json_t *params_of(gj_ctx *c, const json_t *fn, json_t *keep) {
    json_t *p = json_object_get(fn, "parameters");
    if (!p || json_is_null(p)) return NULL;
    if (!json_is_object(p)) { gj_fail(c, "%s", "parameters must be a JSON schema object"); return NULL; }
    json_t *ty = json_object_get(p, "type");
    if (ty && !(json_is_string(ty) && !strcmp(json_string_value(ty), "object"))) {
        gj_fail(c, "%s", "parameters must be an object schema (\"type\": \"object\")");
        return NULL;
    }
    if (ty) return p;
    json_t *q = json_copy(p); /* shallow: the subschemas stay shared, the memo keys with them */
    if (!q || json_array_append_new(keep, q) || json_object_set_new(q, "type", json_string("object"))) {
        gj_fail(c, "%s", "out of memory");
        return NULL;
    }
    return q;
}

lily_code gram_tool_call(const char *tools_json, size_t len, gram_tool_format fmt, const char *name, int multi,
                         gram_grammar **out, lily_status *st) {
    *out = NULL;
    if (fmt != GRAM_TOOLS_XML && fmt != GRAM_TOOLS_JSON) return lily_err(st, LILY_EINVAL, "tool grammar: unknown format %d", (int)fmt);
    json_error_t je;
    json_t *tools = json_loadb(tools_json, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!tools) return lily_err(st, LILY_EINVAL, "tools: bad JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    if (!json_is_array(tools) || json_array_size(tools) == 0 || json_array_size(tools) > TC_MAX_TOOLS) {
        json_decref(tools);
        return lily_err(st, LILY_EINVAL, "tools: must be a non-empty array (at most %d tools)", TC_MAX_TOOLS);
    }
    tctx *t = calloc(1, sizeof *t);
    gram_grammar *g = gram_g_new();
    json_t *keep = json_array();
    if (!t || !g || !keep) {
        free(t); gram_free(g); json_decref(tools); json_decref(keep);
        return lily_err(st, LILY_ENOMEM, "grammar: out of memory");
    }
    pthread_once(&ac_once, ac_init);
    t->ac = &ac_shared;
    gj_ctx *c = &t->c;
    c->g = g; c->st = st;
    c->forbid = TERM; c->n_forbid = 2; /* JSON values too: the parsers cut at these */
    int call = gj_rule(c), n_fn = 0;
    const char *bad_tool = NULL;
    for (size_t i = 0; i < json_array_size(tools) && !c->err; i++) {
        const json_t *fn = tool_fn(json_array_get(tools, i));
        const json_t *nm = json_object_get(fn, "name");
        if (!json_is_string(nm) || !json_string_length(nm) || memchr(json_string_value(nm), 0, json_string_length(nm))) {
            c->err = lily_err(st, LILY_EINVAL, "tools[%zu]: a function needs a non-empty \"name\"", i);
            break;
        }
        const char *fname = json_string_value(nm);
        if (name && strcmp(name, fname)) continue;
        json_t *params = params_of(c, fn, keep);
        int body = c->err ? -1 : fmt == GRAM_TOOLS_XML ? xml_fn(t, fname, params) : json_fn(t, fname, params);
        if (c->err) { bad_tool = fname; break; }
        int32_t e = gj_ref(body);
        gj_alt(c, call, &e, 1);
        n_fn++;
    }
    if (!c->err && !n_fn) c->err = lily_err(st, LILY_EINVAL, "tools: no function named \"%.100s\"", name ? name : "");
    if (c->err && bad_tool) {
        char msg[sizeof st->msg];
        snprintf(msg, sizeof msg, "%s", st->msg);
        lily_err(st, c->err, "tool \"%.80s\": %s", bad_tool, msg);
    }
    int root = -1;
    if (!c->err) {
        int one = gj_rule(c);
        int32_t e[3];
        if (fmt == GRAM_TOOLS_XML) { e[0] = gj_ref(gj_lit(c, "\n<function=", 11)); e[1] = gj_ref(call); }
        else { e[0] = gj_ref(gj_lit(c, "\n{", 2)); e[1] = gj_ref(gj_ws(c)); e[2] = gj_ref(call); }
        gj_alt(c, one, e, fmt == GRAM_TOOLS_XML ? 2 : 3);
        if (fmt == GRAM_TOOLS_JSON) { /* WS "}" "\n</tool_call>" closes the object and the call */
            int one2 = gj_rule(c);
            int32_t f[3] = { gj_ref(one), gj_ref(gj_ws(c)), gj_ref(gj_lit(c, "}\n</tool_call>", 14)) };
            gj_alt(c, one2, f, 3);
            one = one2;
        }
        root = one;
        gram_g_added(g, "</tool_call>");
        if (multi) {
            int more = gj_rule(c);
            gj_alt(c, more, NULL, 0);
            int32_t m[3] = { gj_ref(gj_lit(c, "\n<tool_call>", 12)), gj_ref(one), gj_ref(more) };
            gj_alt(c, more, m, 3);
            root = gj_rule(c);
            int32_t r2[2] = { gj_ref(one), gj_ref(more) };
            gj_alt(c, root, r2, 2);
            gram_g_added(g, "<tool_call>");
        }
    }
    lily_code rc = c->err;
    free(c->memo_node); free(c->memo_rule);
    free(t);
    json_decref(tools); json_decref(keep);
    if (!rc) rc = gram_g_finish(g, root, st);
    if (rc) { gram_free(g); return rc; }
    *out = g;
    return LILY_OK;
}
