/* A validator for the JSON-schema keywords the grammar module supports: the oracle of
 * test_grammar.c and test_grammar_tools.c (string lengths in code points). */
#ifndef LILY_TEST_GRAM_VALID_H
#define LILY_TEST_GRAM_VALID_H
#include <stdint.h>
#include <string.h>
#include <jansson.h>

static json_t *resolve(json_t *root, const char *ref) {
    if (!strcmp(ref, "#")) return root;
    if (!strncmp(ref, "#/$defs/", 8)) return json_object_get(json_object_get(root, "$defs"), ref + 8);
    if (!strncmp(ref, "#/definitions/", 14)) return json_object_get(json_object_get(root, "definitions"), ref + 14);
    return NULL;
}
static size_t cp_len(const char *s) { size_t n = 0; for (; *s; s++) n += ((uint8_t)*s & 0xc0) != 0x80; return n; }

static int valid(json_t *v, json_t *s, json_t *root) {
    if (json_is_true(s)) return 1;
    if (!json_is_object(s)) return 0;
    json_t *k;
    if ((k = json_object_get(s, "nullable")) && json_is_true(k) && json_is_null(v)) return 1;
    if ((k = json_object_get(s, "$ref"))) return valid(v, resolve(root, json_string_value(k)), root);
    json_t *comb = json_object_get(s, "anyOf");
    if (!comb) comb = json_object_get(s, "oneOf");
    if (comb) { int any = 0; for (size_t i = 0; i < json_array_size(comb); i++) any |= valid(v, json_array_get(comb, i), root); if (!any) return 0; }
    if ((k = json_object_get(s, "allOf")) && !valid(v, json_array_get(k, 0), root)) return 0;
    if ((k = json_object_get(s, "const")) && !json_equal(k, v)) return 0;
    if ((k = json_object_get(s, "enum"))) { int any = 0; for (size_t i = 0; i < json_array_size(k); i++) any |= json_equal(json_array_get(k, i), v); if (!any) return 0; }
    if ((k = json_object_get(s, "type"))) {
        int ok = 0;
        for (size_t i = 0; i < (json_is_array(k) ? json_array_size(k) : 1); i++) {
            const char *t = json_string_value(json_is_array(k) ? json_array_get(k, i) : k);
            ok |= (!strcmp(t, "string") && json_is_string(v)) || (!strcmp(t, "number") && json_is_number(v)) ||
                  (!strcmp(t, "integer") && json_is_integer(v)) || (!strcmp(t, "boolean") && json_is_boolean(v)) ||
                  (!strcmp(t, "null") && json_is_null(v)) || (!strcmp(t, "object") && json_is_object(v)) ||
                  (!strcmp(t, "array") && json_is_array(v));
        }
        if (!ok) return 0;
    }
    if (json_is_string(v)) {
        size_t n = cp_len(json_string_value(v));
        if ((k = json_object_get(s, "minLength")) && n < (size_t)json_integer_value(k)) return 0;
        if ((k = json_object_get(s, "maxLength")) && n > (size_t)json_integer_value(k)) return 0;
    }
    if (json_is_object(v)) {
        json_t *props = json_object_get(s, "properties"), *ap = json_object_get(s, "additionalProperties");
        json_t *req = json_object_get(s, "required");
        for (size_t i = 0; i < json_array_size(req); i++) if (!json_object_get(v, json_string_value(json_array_get(req, i)))) return 0;
        const char *key; json_t *x;
        json_object_foreach(v, key, x) {
            json_t *ps = json_object_get(props, key);
            if (ps) { if (!valid(x, ps, root)) return 0; }
            else if (ap && !valid(x, ap, root)) return 0;
        }
    }
    if (json_is_array(v)) {
        json_t *pre = json_object_get(s, "prefixItems"), *it = json_object_get(s, "items");
        size_t n = json_array_size(v);
        if ((k = json_object_get(s, "minItems")) && n < (size_t)json_integer_value(k)) return 0;
        if ((k = json_object_get(s, "maxItems")) && n > (size_t)json_integer_value(k)) return 0;
        for (size_t i = 0; i < n; i++) {
            json_t *es = i < json_array_size(pre) ? json_array_get(pre, i) : it;
            if (es && !valid(json_array_get(v, i), es, root)) return 0;
        }
    }
    return 1;
}

#endif
