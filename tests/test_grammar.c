/* grammar: JSON schema -> byte grammar -> matcher/masks, checked against jansson plus a
 * small validator for the supported keywords, with random instances, random byte
 * mutations, random token walks over the synthetic and the real Qwen3 vocabularies, and
 * mask == accept_token agreement. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>
#include <jansson.h>
#include "t.h"
#include "text/grammar.h"
#include "util/util.h"

static lily_rng rng;
static int rnd(int n) { return (int)(lily_rng_u64(&rng) % (uint64_t)n); }

/* ---- a validator for the supported keywords (the oracle) ---- */
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

static const char *schemas[] = {
    /* 0: nested object, optional properties, enum, nullable, numbers */
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
    "\"score\":{\"type\":\"number\"},\"tag\":{\"enum\":[\"a\",\"b\\\"c\",1,null,{\"x\":[1,2]}]},"
    "\"ok\":{\"type\":\"boolean\"},\"addr\":{\"type\":[\"object\",\"null\"],\"properties\":{\"city\":{\"type\":\"string\"}},"
    "\"required\":[\"city\"]},\"note\":{\"type\":\"string\",\"nullable\":true}},\"required\":[\"name\",\"ok\"]}",
    /* 1: arrays with bounds, bounded strings */
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":3},\"minItems\":1,\"maxItems\":4}",
    /* 2: recursion through $defs */
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
    "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/node\"}",
    /* 3: anyOf, additionalProperties schema, all-optional object */
    "{\"type\":\"object\",\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"number\"},"
    "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}}]},\"b\":{\"const\":\"x\\u00e9\\n\"}},"
    "\"additionalProperties\":{\"type\":\"integer\"}}",
    /* 4: anything */
    "true",
    /* 5: prefixItems, const, oneOf, definitions, additionalProperties true */
    "{\"definitions\":{\"p\":{\"type\":\"object\",\"properties\":{\"k\":{\"const\":{\"z\":[true,false]}}},"
    "\"additionalProperties\":true}},\"type\":\"array\",\"prefixItems\":[{\"type\":\"null\"},{\"$ref\":\"#/definitions/p\"}],"
    "\"items\":{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":2}]},\"maxItems\":5}",
};
#define N_SCHEMAS (int)(sizeof schemas / sizeof *schemas)

/* valid instances in the grammar's canonical shape (properties in order) */
static const char *good[][8] = {
    { "{\"name\":\"x\",\"ok\":true}", " {\"name\" : \"\\u00e9\\\"\", \"age\":-12, \"score\":1.5e+3,\"tag\":{\"x\":[1,2]},\"ok\":false,\"addr\":null}",
      "{\"name\":\"\xc3\xa9\xe2\x82\xac\",\"tag\":\"b\\\"c\",\"ok\":true,\"addr\":{\"city\":\"\"},\"note\":null}",
      "{\n\t\"name\": \"a\",\n\t\"ok\": true,\n\t\"note\": \"\\/\\b\\f\\n\\r\\t\"\n}", NULL },
    { "[\"a\"]", "[\"abc\",\"\xc3\xa9\xc3\xa9\xc3\xa9\",\"\\n\",\"xy\"]", "[ \"a\" , \"b\" ]", NULL },
    { "{\"v\":1}", "{\"v\":0,\"kids\":[]}", "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[{\"v\":4}]}]}", NULL },
    { "{}", "{\"a\":\"s\"}", "{\"a\":[true,false],\"b\":\"x\xc3\xa9\\n\",\"zz\":5,\"q\":-0}", "{\"b\":\"x\xc3\xa9\\n\"}", "{\"other\":1}", NULL },
    { "1", "\"s\"", "[1,{\"a\":[null,true,\"x\"]},-2.5E-7]", "{}", "null", NULL },
    { "[]", "[null]", "[null,{\"k\":{\"z\":[true,false]},\"more\":[1,{}]},3,\"ab\"]", "[null,{}]", NULL },
};
static const char *bad[][8] = {
    { "{\"ok\":true}", "{\"name\":\"x\",\"ok\":true,}", "{\"name\":\"x\",\"ok\":1}", "{\"name\":\"\x01\",\"ok\":true}", "{\"name\":\"x\",\"ok\":true} ", "{\"name\":\"x\",\"ok\":true,\"age\":1}", "{\"name\":\"x\"\"ok\":true}", NULL },
    { "[]", "[\"\"]", "[\"abcd\"]", "[\"a\",\"a\",\"a\",\"a\",\"a\"]", "[\"a\",]", NULL },
    { "{}", "{\"v\":1.5}", "{\"v\":1,\"kids\":[{}]}", "{\"v\":01}", NULL },
    { "{\"b\":\"y\"}", "{\"a\":null}", "{\"zz\":\"s\"}", "{,}", NULL },
    { "tru", "[1,]", "{\"a\" 1}", "01", "\"\\x\"", NULL },
    { "[1]", "[null,1]", "[null,{},\"abc\"]", "[null,{},1,1,1,1]", NULL },
};

static int accepts(const gram_grammar *g, const char *s, size_t n, int *can_end_at_end, int *prefixes_ok) {
    gram_matcher *m; lily_status st;
    if (gram_matcher_new(g, &m, &st)) return -1;
    int ok = 1; *prefixes_ok = 1;
    for (size_t i = 0; i < n && ok; i++) ok = gram_matcher_accept_bytes(m, s + i, 1);
    *can_end_at_end = ok && gram_matcher_can_end(m);
    gram_matcher_free(m);
    return ok;
}

/* jansson wants valid UTF-8 while the grammar allows any bytes >= 0x20 in strings (tokens
 * split characters); when the raw text is refused, retry with every lead byte >= 0xc0 made
 * 'U' and continuation bytes dropped, which keeps the character counts as the grammar
 * counts them. */
static int oracle(const char *s, size_t n, json_t *schema) {
    json_t *v = json_loadb(s, n, JSON_DECODE_ANY, NULL);
    if (!v) {
        char *t = malloc(n + 1); size_t k = 0;
        for (size_t i = 0; i < n;) {
            uint8_t b = (uint8_t)s[i];
            if (b < 0x80) { t[k++] = (char)b; i++; continue; }
            if (b < 0xc0) { i++; continue; }
            size_t j = i + 1;
            while (j < n && j < i + 4 && ((uint8_t)s[j] & 0xc0) == 0x80) j++;
            size_t want = b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3 : b >= 0xf0 && b <= 0xf4 ? 4 : 0;
            if (want == 4 && ((b == 0xf0 && (uint8_t)s[i + 1] < 0x90) || (b == 0xf4 && (uint8_t)s[i + 1] > 0x8f))) want = 0;
            if (want == 3 && ((b == 0xe0 && (uint8_t)s[i + 1] < 0xa0) || (b == 0xed && (uint8_t)s[i + 1] > 0x9f))) want = 0;
            if (want == j - i) { memcpy(t + k, s + i, want); k += want; } else t[k++] = 'U';
            i = j;
        }
        v = json_loadb(t, k, JSON_DECODE_ANY, NULL);
        free(t);
    }
    if (!v) return 0;
    int r = valid(v, schema, schema);
    json_decref(v);
    return r;
}

static void test_instances(void) {
    for (int si = 0; si < N_SCHEMAS; si++) {
        gram_grammar *g; lily_status st;
        lily_code rc = gram_from_json_schema(schemas[si], strlen(schemas[si]), &g, &st);
        CHECK(rc == LILY_OK, "schema %d: %s", si, st.msg);
        if (rc) continue;
        json_t *schema = json_loads(schemas[si], JSON_DECODE_ANY, NULL);
        for (int k = 0; good[si][k]; k++) {
            const char *s = good[si][k]; size_t n = strlen(s);
            CHECK(oracle(s, n, schema), "schema %d: oracle rejects good[%d] %s", si, k, s);
            /* every prefix is accepted, can_end only at the end */
            gram_matcher *m; gram_matcher_new(g, &m, &st);
            int ok = 1, early = 0;
            for (size_t i = 0; i < n && ok; i++) {
                if (gram_matcher_can_end(m) && i > 0 && strspn(s + i, " \t\n\r") != n - i && oracle(s, i, schema) == 0) early = 1;
                ok = gram_matcher_accept_bytes(m, s + i, 1);
            }
            CHECK(ok && gram_matcher_can_end(m) && !early, "schema %d good[%d] %s: ok %d early %d", si, k, s, ok, early);
            gram_matcher_free(m);
        }
        for (int k = 0; bad[si][k]; k++) {
            const char *s = bad[si][k]; int ce, po;
            int a = accepts(g, s, strlen(s), &ce, &po);
            CHECK(!(a && ce), "schema %d: bad[%d] %s accepted", si, k, s);
        }
        /* random mutations of good instances: whatever the grammar takes completely, the
         * oracle must take (soundness); the unmutated ones were checked above */
        int n_acc = 0, n_rej = 0;
        for (int it = 0; it < 3000; it++) {
            int k = 0; while (good[si][k]) k++;
            const char *src = good[si][rnd(k)];
            char buf[512]; size_t n = strlen(src);
            memcpy(buf, src, n);
            int muts = 1 + rnd(3);
            for (int j = 0; j < muts; j++) {
                int op = rnd(3), pos = rnd((int)n + 1);
                static const char alpha[] = "{}[]\",:0123456789.eE+-tfnul \\ab\x01\xc3\xa9";
                char ch = rnd(4) ? alpha[rnd((int)sizeof alpha - 1)] : (char)rnd(256);
                if (op == 0 && n < sizeof buf - 1) { memmove(buf + pos + 1, buf + pos, n - (size_t)pos); buf[pos] = ch; n++; }
                else if (op == 1 && pos < (int)n) { memmove(buf + pos, buf + pos + 1, n - (size_t)pos - 1); n--; }
                else if (pos < (int)n) buf[pos] = ch;
            }
            int ce, po;
            int a = accepts(g, buf, n, &ce, &po);
            int o = oracle(buf, n, schema);
            if (a && ce) { n_acc++; CHECK(o, "schema %d: grammar takes invalid %.*s", si, (int)n, buf); }
            else n_rej++;
            /* an accepted prefix must have a valid completion: checked by walks below */
        }
        CHECK(n_acc > 0 && n_rej > 0, "schema %d: mutations accepted %d rejected %d", si, n_acc, n_rej);
        json_decref(schema);
        gram_free(g);
    }
}

/* random token walks; every result must parse and validate */
static int closing(const tok_tokenizer *t, int id) {
    size_t n; const char *p = tok_piece(t, id, &n);
    for (size_t i = 0; p && i < n; i++) if (strchr("\"}],", p[i])) return 1;
    return 0;
}

static void walk(const gram_grammar *g, const gram_vocab *v, const tok_tokenizer *t, json_t *schema,
                 const char *what, int n_walks, int check_every) {
    int nv = gram_vocab_size(v), done = 0, agree_bad = 0, agree_n = 0;
    uint8_t *allowed = malloc((size_t)nv);
    int32_t *cand = malloc(sizeof(int32_t) * (size_t)nv), *close = malloc(sizeof(int32_t) * (size_t)nv);
    for (int w = 0; w < n_walks; w++) {
        gram_matcher *m; lily_status st;
        if (gram_matcher_new(g, &m, &st)) { CHECK(0, "%s: matcher: %s", what, st.msg); break; }
        char out[16384]; size_t on = 0;
        int ended = 0;
        for (int step = 0; step < 300 && !ended; step++) {
            gram_matcher_mask(m, v, allowed);
            int nc = 0, ncl = 0;
            for (int i = 0; i < nv; i++) if (allowed[i]) { cand[nc++] = i; if (closing(t, i)) close[ncl++] = i; }
            CHECK(nc > 0 || gram_matcher_can_end(m), "%s walk %d: stuck after %.*s", what, w, (int)on, out);
            if (gram_matcher_can_end(m) && (nc == 0 || rnd(3) == 0)) { ended = 1; break; }
            if (nc == 0) break;
            if (check_every && step % check_every == 0) {
                gram_matcher *m2 = NULL;
                for (int j = 0; j < 48; j++) {
                    int id = j & 1 ? rnd(nv) : cand[rnd(nc)];
                    if (!m2) { gram_matcher_new(g, &m2, &st); gram_matcher_accept_bytes(m2, out, on); }
                    int a = gram_matcher_accept_token(m2, v, id);
                    agree_n++;
                    if (a != allowed[id]) { agree_bad++; size_t pl; const char *p = tok_piece(t, id, &pl);
                        fprintf(stderr, "%s: id %d '%.*s' mask %d accept %d after '%.*s'\n", what, id, (int)pl, p ? p : "", allowed[id], a, (int)on, out); }
                    if (a) { gram_matcher_free(m2); m2 = NULL; }
                }
                gram_matcher_free(m2);
            }
            /* lean towards closing bytes, more so as the text grows, so walks finish */
            int id = ncl && rnd(100) < 30 + (int)(on / 40) ? close[rnd(ncl)] : cand[rnd(nc)];
            size_t pl; const char *p = tok_piece(t, id, &pl);
            CHECK(gram_matcher_accept_token(m, v, id) == 1, "%s walk %d: allowed token %d refused", what, w, id);
            if (on + pl >= sizeof out) break;
            memcpy(out + on, p, pl); on += pl;
        }
        if (ended) {
            done++;
            CHECK(oracle(out, on, schema), "%s walk %d: result invalid: %.*s", what, w, (int)on, out);
        }
        gram_matcher_free(m);
    }
    CHECK(agree_bad == 0, "%s: mask and accept_token disagree on %d of %d", what, agree_bad, agree_n);
    CHECK(done > 0, "%s: no walk ended", what);
    printf("%s: %d/%d walks ended, %d mask/accept comparisons\n", what, done, n_walks, agree_n);
    free(allowed); free(cand); free(close);
}

static void test_walks(const char *tok_path, const char *name, int n_walks, int check_every) {
    tok_tokenizer *t; lily_status st;
    if (tok_load(tok_path, &t, &st)) { CHECK(0, "load %s: %s", tok_path, st.msg); return; }
    gram_vocab *v;
    int nv = tok_vocab_size(t) + 17; /* a padded logits row */
    CHECK(gram_vocab_new(t, nv, &v, &st) == LILY_OK, "vocab: %s", st.msg);
    CHECK(gram_vocab_size(v) == nv, "vocab size");
    for (int si = 0; si <= N_SCHEMAS; si++) {
        gram_grammar *g; json_t *schema;
        char what[64]; snprintf(what, sizeof what, "%s schema %d", name, si);
        if (si == N_SCHEMAS) {
            CHECK(gram_json_object(&g, &st) == LILY_OK, "json_object: %s", st.msg);
            schema = json_loads("{\"type\":\"object\"}", 0, NULL);
        } else {
            CHECK(gram_from_json_schema(schemas[si], strlen(schemas[si]), &g, &st) == LILY_OK, "%s", st.msg);
            schema = json_loads(schemas[si], JSON_DECODE_ANY, NULL);
        }
        walk(g, v, t, schema, what, n_walks, check_every);
        json_decref(schema);
        gram_free(g);
    }
    /* added tokens and padding ids are never allowed */
    gram_grammar *g; gram_matcher *m; uint8_t *al = malloc((size_t)nv);
    gram_from_json_schema("true", 4, &g, &st);
    gram_matcher_new(g, &m, &st);
    gram_matcher_mask(m, v, al);
    int bad = 0;
    for (int i = 0; i < nv; i++) if (al[i] && (i >= tok_vocab_size(t) || tok_is_added(t, i))) bad++;
    CHECK(bad == 0, "%s: %d added/padding tokens allowed", name, bad);
    CHECK(gram_matcher_accept_token(m, v, nv - 1) == 0 && gram_matcher_accept_token(m, v, -1) == 0, "padding accepted");
    free(al); gram_matcher_free(m); gram_free(g);
    gram_vocab_free(v); tok_free(t);
}

static void expect_err(const char *schema, const char *needle) {
    gram_grammar *g = NULL; lily_status st; st.msg[0] = 0;
    lily_code rc = gram_from_json_schema(schema, strlen(schema), &g, &st);
    CHECK(rc == LILY_EINVAL && strstr(st.msg, needle) && !g, "%s: rc %d msg '%s' (want '%s')", schema, rc, st.msg, needle);
    gram_free(g);
}

static void test_errors(void) {
    expect_err("{\"type\":\"string\",\"pattern\":\"a+\"}", "\"pattern\" at #/pattern");
    expect_err("{\"properties\":{\"a\":{\"minimum\":1}}}", "\"minimum\" at #/properties/a/minimum");
    expect_err("{\"type\":\"object\",\"properties\":{\"x\":{\"not\":{}}}}", "\"not\"");
    expect_err("{\"type\":", "bad JSON");
    expect_err("{\"a\":1,\"a\":2}", "bad JSON");
    expect_err("{\"$ref\":\"#/$defs/missing\"}", "points to nothing");
    expect_err("{\"$ref\":\"http://x/y\"}", "unsupported $ref");
    expect_err("{\"$ref\":\"#\"}", "left-recursive");
    expect_err("{\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"},{\"type\":\"null\"}]}},\"$ref\":\"#/$defs/a\"}", "left-recursive");
    expect_err("{\"type\":\"string\",\"maxLength\":100000}", "maxLength above");
    expect_err("{\"type\":\"array\",\"minItems\":5000}", "minItems above");
    expect_err("{\"type\":\"string\",\"minLength\":-1}", "non-negative");
    expect_err("{\"type\":\"wat\"}", "unknown type");
    expect_err("false", "allows nothing");
    expect_err("{\"required\":[\"q\"]}", "not in properties");
    expect_err("{\"allOf\":[{},{}]}", "allOf");
    expect_err("{\"type\":\"object\",\"anyOf\":[{}]}", "combined");
    expect_err("[1]", "must be an object");
    expect_err("{\"type\":\"array\",\"prefixItems\":[{}],\"items\":false,\"minItems\":2}", "minItems cannot be met");
    /* deep nesting is refused, not a stack overflow */
    char deep[4096]; size_t o = 0;
    for (int i = 0; i < 200; i++) o += (size_t)sprintf(deep + o, "{\"items\":");
    o += (size_t)sprintf(deep + o, "{}");
    for (int i = 0; i < 200; i++) deep[o++] = '}';
    deep[o] = 0;
    expect_err(deep, "nested too deeply");
}

int main(void) {
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    if (getenv("GRAM_SEED")) seed = strtoull(getenv("GRAM_SEED"), NULL, 10);
    lily_rng_seed(&rng, seed);
    printf("seed %llu\n", (unsigned long long)seed);
    test_errors();
    test_instances();
    char dir[] = "/tmp/gram_synth_XXXXXX";
    if (mkdtemp(dir)) {
        char path[256]; lily_status st;
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        CHECK(tok_write_synth_json(path, 1000, &st) == LILY_OK, "synth: %s", st.msg);
        test_walks(path, "synth", 12, 3);
        char cmd[300]; snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        CHECK(system(cmd) == 0, "rm");
    }
    const char *q = "../shared/data/qwen-tokenizer/qwen3/tokenizer.json";
    CHECK(access(q, R_OK) == 0, "missing %s", q);
    test_walks(q, "qwen3", 4, 10);
    return T_DONE();
}
