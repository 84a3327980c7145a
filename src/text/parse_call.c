/* Shared by both output parsers: UTF-8 cleaning, reading one tool-call block, ids. */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include "text/parse_priv.h"

static const char REPLACEMENT[] = "\xef\xbf\xbd";

void parse_utf8_feed(parse_utf8 *u, const char *s, size_t n, chat_buf *out) {
    size_t run = 0; /* start of a pending run of plain ASCII to copy in one go */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c > 0 && c < 0x80 && !u->n_pend) continue;
        chat_buf_add(out, s + run, i - run);
        run = i + 1;
        if (u->n_pend) {
            if (c >= u->lo && c <= u->hi) {
                u->pend[u->n_pend++] = c;
                u->lo = 0x80;
                u->hi = 0xbf;
                if (u->n_pend == u->need) {
                    chat_buf_add(out, (const char *)u->pend, (size_t)u->n_pend);
                    u->n_pend = 0;
                }
                continue;
            }
            chat_buf_add(out, REPLACEMENT, 3); /* the broken sequence; c starts afresh */
            u->n_pend = 0;
        }
        int need = 0;
        unsigned char lo = 0x80, hi = 0xbf;
        if (c == 0) chat_buf_add(out, REPLACEMENT, 3);
        else if (c < 0x80) chat_buf_addc(out, (char)c);
        else if (c >= 0xc2 && c <= 0xdf) need = 2;
        else if (c == 0xe0) { need = 3; lo = 0xa0; }
        else if (c == 0xed) { need = 3; hi = 0x9f; }
        else if (c >= 0xe1 && c <= 0xef) need = 3;
        else if (c == 0xf0) { need = 4; lo = 0x90; }
        else if (c >= 0xf1 && c <= 0xf3) need = 4;
        else if (c == 0xf4) { need = 4; hi = 0x8f; }
        else chat_buf_add(out, REPLACEMENT, 3);
        if (need) {
            u->pend[0] = c;
            u->n_pend = 1;
            u->need = need;
            u->lo = lo;
            u->hi = hi;
        }
    }
    chat_buf_add(out, s + run, n - run);
}

void parse_utf8_flush(parse_utf8 *u, chat_buf *out) {
    if (u->n_pend) chat_buf_add(out, REPLACEMENT, 3);
    u->n_pend = 0;
}

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
static size_t skip_ws(const char *s, size_t n, size_t i) { while (i < n && is_ws(s[i])) i++; return i; }
static int at(const char *s, size_t n, size_t i, const char *lit) {
    size_t m = strlen(lit);
    return i + m <= n && !memcmp(s + i, lit, m);
}

static const json_t *find_tool(const json_t *tools, const char *name) {
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i), *fn = json_object_get(t, "function");
        if (!fn) fn = t;
        const json_t *nm = json_object_get(fn, "name");
        if (json_is_string(nm) && !strcmp(json_string_value(nm), name)) return fn;
    }
    return NULL;
}

/* Collects what a schema allows: bit 0 = a string, bit 1 = something else. Looks at
 * "type" (a name or a list), enum and const values, the alternatives of anyOf/oneOf/allOf,
 * and $ref to "#", "#/$defs/NAME" or "#/definitions/NAME" of `root` (the function's
 * parameters: pydantic-made schemas put every nested model behind a $ref). */
int parse_schema_kinds(const json_t *sch, const json_t *root, int depth) {
    int k = 0;
    if (!json_is_object(sch) || depth > 16) return 0;
    const json_t *ref = json_object_get(sch, "$ref");
    if (json_is_string(ref)) {
        const char *r = json_string_value(ref);
        const json_t *to = NULL;
        if (!strcmp(r, "#")) to = root;
        else if (!strncmp(r, "#/$defs/", 8)) to = json_object_get(json_object_get(root, "$defs"), r + 8);
        else if (!strncmp(r, "#/definitions/", 14)) to = json_object_get(json_object_get(root, "definitions"), r + 14);
        k |= parse_schema_kinds(to, root, depth + 1);
    }
    const json_t *type = json_object_get(sch, "type"), *e = json_object_get(sch, "enum"), *c = json_object_get(sch, "const");
    if (json_is_string(type)) k |= strcmp(json_string_value(type), "string") ? 2 : 1;
    for (size_t i = 0; i < json_array_size(type); i++) {
        const json_t *t = json_array_get(type, i);
        k |= json_is_string(t) && !strcmp(json_string_value(t), "string") ? 1 : 2;
    }
    if (!type) {
        for (size_t i = 0; i < json_array_size(e); i++) k |= json_is_string(json_array_get(e, i)) ? 1 : 2;
        if (c) k |= json_is_string(c) ? 1 : 2;
    }
    static const char *alts[] = { "anyOf", "oneOf", "allOf" };
    for (int a = 0; a < 3; a++) {
        const json_t *list = json_object_get(sch, alts[a]);
        for (size_t i = 0; i < json_array_size(list); i++) k |= parse_schema_kinds(json_array_get(list, i), root, depth + 1);
    }
    return k;
}

/* Is this parameter's value kept as a string? Yes when its schema allows a string, and
 * for undeclared or untyped parameters: the model was shown no other type for them. */
static int param_is_string(const json_t *fn, const char *param) {
    const json_t *params = json_object_get(fn, "parameters");
    int k = parse_schema_kinds(json_object_get(json_object_get(params, "properties"), param), params, 0);
    return (k & 1) || !k;
}

/* A name between '=' and '>': trimmed, non-empty, on one line. */
static char *read_name(const char *s, size_t n, size_t *i) {
    const char *gt = memchr(s + *i, '>', n - *i);
    if (!gt) return NULL;
    size_t a = *i, z = (size_t)(gt - s);
    while (a < z && is_ws(s[a])) a++;
    while (z > a && is_ws(s[z - 1])) z--;
    if (a == z || memchr(s + a, '\n', z - a) || memchr(s + a, '<', z - a)) return NULL;
    *i = (size_t)(gt - s) + 1;
    return strndup(s + a, z - a);
}

static int parse_xml(const char *s, size_t n, const json_t *tools, char **name, json_t *args) {
    size_t i = skip_ws(s, n, 0);
    if (!at(s, n, i, "<function=")) return -1;
    i += strlen("<function=");
    *name = read_name(s, n, &i);
    const json_t *fn = *name ? find_tool(tools, *name) : NULL;
    if (!fn) return -1;
    for (;;) {
        i = skip_ws(s, n, i);
        if (at(s, n, i, "</function>")) { i += strlen("</function>"); break; }
        if (!at(s, n, i, "<parameter=")) return -1;
        i += strlen("<parameter=");
        char *param = read_name(s, n, &i);
        if (!param) return -1;
        long end = chat_find(s + i, n - i, "</parameter>");
        if (end < 0) { free(param); return -1; }
        /* The template writes "\n" + value + "\n": take exactly those two away. */
        size_t a = i, z = i + (size_t)end;
        if (a < z && s[a] == '\n') a++;
        if (z > a && s[z - 1] == '\n') z--;
        json_t *v = NULL;
        if (!param_is_string(fn, param)) v = json_loadb(s + a, z - a, JSON_DECODE_ANY | JSON_PRESERVE_ORDER, NULL);
        if (!v) v = json_stringn(s + a, z - a);
        int bad = !v || json_object_set_new(args, param, v);
        free(param);
        if (bad) return -1;
        i += (size_t)end + strlen("</parameter>");
    }
    return skip_ws(s, n, i) == n ? 0 : -1;
}

/* Qwen3's form: {"name": "f", "arguments": {...}} */
static int parse_json_form(const char *s, size_t n, const json_t *tools, char **name, json_t *args) {
    json_t *v = json_loadb(s, n, JSON_PRESERVE_ORDER, NULL), *inner = NULL;
    const json_t *nm = json_object_get(v, "name"), *a = json_object_get(v, "arguments");
    if (json_is_string(a)) /* arguments written as a JSON string holding the object */
        a = inner = json_loadb(json_string_value(a), json_string_length(a), JSON_PRESERVE_ORDER, NULL);
    int rc = -1;
    if (json_is_string(nm) && find_tool(tools, json_string_value(nm)) && json_is_object(a)) {
        *name = strdup(json_string_value(nm));
        rc = *name && !json_object_update(args, (json_t *)a) ? 0 : -1;
    }
    json_decref(inner);
    json_decref(v);
    return rc;
}

int parse_call_block(const char *s, size_t n, const json_t *tools, char **name, char **arguments) {
    *name = *arguments = NULL;
    json_t *args = json_object();
    if (!args) return -1;
    size_t i = skip_ws(s, n, 0);
    int rc = i < n && s[i] == '{' ? parse_json_form(s, n, tools, name, args) : parse_xml(s, n, tools, name, args);
    if (!rc) {
        chat_buf b = { 0 };
        chat_py_json(&b, args);
        *arguments = chat_buf_take(&b);
        if (!*arguments) rc = -1;
    }
    json_decref(args);
    if (rc) { free(*name); *name = NULL; }
    return rc;
}

void parse_rng_init(lily_rng *rng, uint64_t seed) {
    if (!seed && getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed)
        seed = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)rng ^ (uint64_t)clock();
    lily_rng_seed(rng, seed);
}

char *parse_call_id(lily_rng *rng) {
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    char *id = malloc(5 + 24 + 1);
    if (!id) return NULL;
    memcpy(id, "call_", 5);
    for (int k = 0; k < 24; k++) id[5 + k] = alnum[lily_rng_u64(rng) % 62];
    id[29] = 0;
    return id;
}
