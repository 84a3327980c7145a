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
#include "text/gram_priv.h"
#include "util/util.h"

static lily_rng rng;
static int rnd(int n) { return (int)(lily_rng_u64(&rng) % (uint64_t)n); }

#include "gram_valid.h"

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
    /* 6: non-ASCII property names beside extra keys, lengths of multibyte strings */
    "{\"type\":\"object\",\"properties\":{\"\xc3\xa9\xe2\x82\xac\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":3},"
    "\"\xc3\xa9" "a\":{\"type\":\"integer\"},\"\\u00e9\":{\"type\":\"boolean\"}},\"additionalProperties\":{\"type\":\"integer\"}}",
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
    { "{}", "{\"\xc3\xa9\xe2\x82\xac\":\"ab\"}", "{\"\xc3\xa9\xe2\x82\xac\":\"\xf0\x9f\x98\x80\xe2\x82\xac" "x\",\"\xc3\xa9" "a\":1}",
      "{\"\xc3\xa9\":true}", "{\"\xc3\xa9" "b\":1}", "{\"\xe2\x82\xac\":2,\"\xc3\xa9\xe2\x82\xac" "x\":3,\"\xc3\xaa\":4}",
      "{\"\xc3\xa9\xe2\x82\xad\":5,\"\xc3\xa9\xe2\x83\x80\":6,\"\xc3\xa9\xf4\x8f\xbf\xbf\":7}", NULL },
};
static const char *bad[][8] = {
    { "{\"ok\":true}", "{\"name\":\"x\",\"ok\":true,}", "{\"name\":\"x\",\"ok\":1}", "{\"name\":\"\x01\",\"ok\":true}", "{\"name\":\"x\",\"ok\":true} ", "{\"name\":\"x\",\"ok\":true,\"age\":1}", "{\"name\":\"x\"\"ok\":true}", NULL },
    { "[]", "[\"\"]", "[\"abcd\"]", "[\"a\",\"a\",\"a\",\"a\",\"a\"]", "[\"a\",]", NULL },
    { "{}", "{\"v\":1.5}", "{\"v\":1,\"kids\":[{}]}", "{\"v\":01}", NULL },
    { "{\"b\":\"y\"}", "{\"a\":null}", "{\"zz\":\"s\"}", "{,}", NULL },
    { "tru", "[1,]", "{\"a\" 1}", "01", "\"\\x\"", NULL },
    { "[1]", "[null,1]", "[null,{},\"abc\"]", "[null,{},1,1,1,1]", NULL },
    { "{\"\xc3\xa9\xe2\x82\xac\":\"a\"}", "{\"\xc3\xa9\xe2\x82\xac\":\"ab\xf0\x9f\x98\x80" "c\"}", "{\"\xc3\xa9\xe2\x82\xac\":\"\xc3\"}",
      "{\"\xc3\xa9\xe2\x82\":1}", "{\"\xc3\xa9\":1}", "{\"\xc3\xa9\xe2\x82\xac" "x\":\"s\"}", "{\"\xc3\xa9\xe2\x82\xac\":\"\xed\xa0\x80" "a\"}", NULL },
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

/* The text must parse as it is (jansson refuses ill-formed UTF-8, so every string the
 * grammar let through is well-formed) and validate, lengths counted in code points. */
static int oracle(const char *s, size_t n, json_t *schema) {
    json_t *v = json_loadb(s, n, JSON_DECODE_ANY, NULL);
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

/* Reference: the number of code points in p[0..n) if it is well-formed UTF-8 made of
 * characters allowed raw in a JSON string (no controls, '"' or '\\'), else -1. Decodes and
 * checks the value ranges (overlong, surrogates, above U+10FFFF) rather than the byte table
 * the grammar is built from. */
static int ref_chars(const uint8_t *p, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n; c++) {
        uint32_t cp = p[i]; int len;
        if (cp < 0x80) len = 1; else if ((cp & 0xe0) == 0xc0) { len = 2; cp &= 0x1f; }
        else if ((cp & 0xf0) == 0xe0) { len = 3; cp &= 0x0f; } else if ((cp & 0xf8) == 0xf0) { len = 4; cp &= 0x07; }
        else return -1;
        if (i + (size_t)len > n) return -1;
        for (int k = 1; k < len; k++) { if ((p[i + k] & 0xc0) != 0x80) return -1; cp = cp << 6 | (p[i + k] & 0x3f); }
        static const uint32_t min_cp[5] = { 0, 0, 0x80, 0x800, 0x10000 };
        if (cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return -1;
        if (cp < 0x20 || cp == '"' || cp == '\\') return -1;
        i += (size_t)len;
    }
    return c;
}

static int takes(const gram_grammar *g, const char *pre, const uint8_t *b, size_t n, const char *post) {
    gram_matcher *m; lily_status st;
    if (gram_matcher_new(g, &m, &st)) return -1;
    int ok = gram_matcher_accept_bytes(m, pre, strlen(pre)) && gram_matcher_accept_bytes(m, (const char *)b, n) &&
             gram_matcher_accept_bytes(m, post, strlen(post)) && gram_matcher_can_end(m);
    gram_matcher_free(m);
    return ok;
}

/* every byte string of length 1-2 and random longer ones (boundary bytes of the UTF-8
 * table mostly), as a free string, a bounded string and an extra object key */
static void test_utf8(void) {
    const char *sch[3] = { "{\"type\":\"string\"}", "{\"type\":\"string\",\"minLength\":1,\"maxLength\":2}",
                           "{\"properties\":{\"\xc3\xa9\xe2\x82\xac\":{\"type\":\"null\"}},\"additionalProperties\":{\"type\":\"integer\"}}" };
    gram_grammar *g[3]; lily_status st;
    for (int k = 0; k < 3; k++) CHECK(gram_from_json_schema(sch[k], strlen(sch[k]), &g[k], &st) == LILY_OK, "%s", st.msg);
    static const uint8_t edge[] = { 0x00, 0x1f, 0x20, 0x41, 0x7e, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1,
                                    0xc2, 0xc3, 0xdf, 0xe0, 0xe1, 0xec, 0xed, 0xee, 0xef, 0xf0, 0xf1, 0xf3, 0xf4, 0xf5, 0xff };
    int bad[3] = { 0 }, n_valid = 0, n_total = 0;
    for (long it = 0; it < 65536 + 256 + 60000; it++) {
        uint8_t b[8]; size_t n;
        if (it < 256) { b[0] = (uint8_t)it; n = 1; }
        else if (it < 65536 + 256) { b[0] = (uint8_t)((it - 256) >> 8); b[1] = (uint8_t)(it - 256); n = 2; }
        else { n = 3 + (size_t)rnd(6); for (size_t i = 0; i < n; i++) b[i] = rnd(5) ? edge[rnd((int)sizeof edge)] : (uint8_t)rnd(256); }
        if (memchr(b, '"', n) || memchr(b, '\\', n)) continue;
        int want = ref_chars(b, n);
        n_total++; n_valid += want >= 0;
        int got0 = takes(g[0], "\"", b, n, "\""), got1 = takes(g[1], "\"", b, n, "\"");
        int got2 = takes(g[2], "{\"", b, n, "\":1}");
        int exp2 = want >= 0 && !(n == 5 && !memcmp(b, "\xc3\xa9\xe2\x82\xac", 5));
        if (got0 != (want >= 0) && bad[0]++ < 5) CHECK(0, "free string %02x %02x %02x %02x (n %zu): grammar %d", b[0], b[1], b[2], b[3], n, got0);
        if (got1 != (want >= 1 && want <= 2) && bad[1]++ < 5) CHECK(0, "maxLength 2 string %02x %02x %02x (n %zu, %d chars): grammar %d", b[0], b[1], b[2], n, want, got1);
        if (got2 != exp2 && bad[2]++ < 5) CHECK(0, "extra key %02x %02x %02x (n %zu): grammar %d", b[0], b[1], b[2], n, got2);
    }
    CHECK(bad[0] + bad[1] + bad[2] == 0, "utf8: %d/%d/%d disagreements", bad[0], bad[1], bad[2]);
    CHECK(n_valid > 1000 && n_valid < n_total, "utf8: %d of %d valid", n_valid, n_total);
    /* every listed key's proper prefix continues, with any other code point, into an extra key */
    const uint8_t ext[][8] = { "\xc3\xa9\xe2\x82\xad", "\xc3\xa9\xe2\x83\x80", "\xc3\xaa", "\xc3\xa9\xf0\x9f\x98\x80", "\xc3\xa9\xe2\x82\xac" "a" };
    for (int i = 0; i < 5; i++) CHECK(takes(g[2], "{\"", ext[i], strlen((const char *)ext[i]), "\":1}") == 1, "extra key %d", i);
    for (int k = 0; k < 3; k++) gram_free(g[k]);
}

/* mask == accept_token at chosen states (inside characters, at each count of a bounded
 * string, after a backslash, inside a listed key): all ids when the vocabulary is small,
 * a sample otherwise */
static void agree_at(const gram_vocab *v, const tok_tokenizer *t, const char *name) {
    static const struct { int schema; const char *prefix; } at[] = {
        { 0, "{\"name\":\"" }, { 0, "{\"name\":\"ab\xe7" }, { 0, "{\"name\":\"\xe7\x95" }, { 0, "{\"name\":\"\xf0\x9f" },
        { 0, "{\"name\":\"\xed" }, { 0, "{\"name\":\"\\" }, { 0, "{\"name\":\"\\u" }, { 6, "{\"\xc3\xa9\xe2\x82\xac\":\"" },
        { 6, "{\"\xc3\xa9\xe2\x82\xac\":\"a" }, { 6, "{\"\xc3\xa9\xe2\x82\xac\":\"a\xc3\xa9" }, { 6, "{\"\xc3\xa9\xe2\x82\xac\":\"abc" },
        { 6, "{\"\xc3\xa9\xe2\x82\xac\":\"ab\xe2\x82" }, { 6, "{\"\xc3" }, { 6, "{\"\xc3\xa9\xe2" }, { 6, "{\"\xc3\xa9\xe2\x82\xac" },
        { 1, "[\"" }, { 1, "[\"a\xc3\xa9" }, { 5, "[null,{},\"x" }, { 3, "{\"q" },
    };
    int nv = gram_vocab_size(v), bad = 0, n_cmp = 0;
    uint8_t *al = malloc((size_t)nv);
    for (size_t k = 0; k < sizeof at / sizeof *at; k++) {
        gram_grammar *g; gram_matcher *m; lily_status st;
        const char *sc = schemas[at[k].schema];
        if (gram_from_json_schema(sc, strlen(sc), &g, &st)) { CHECK(0, "%s", st.msg); continue; }
        gram_matcher_new(g, &m, &st);
        CHECK(gram_matcher_accept_bytes(m, at[k].prefix, strlen(at[k].prefix)), "%s: prefix %zu refused", name, k);
        gram_matcher_mask(m, v, al);
        int n_al = 0, diff = 0;
        for (int i = 0; i < nv; i++) n_al += al[i];
        CHECK(n_al > 0, "%s: prefix %zu: empty mask", name, k);
        uint8_t *full = malloc((size_t)nv); /* the fast paths against the full-trie walk */
        gram_mask_no_fast = 1;
        gram_matcher_mask(m, v, full);
        gram_mask_no_fast = 0;
        for (int i = 0; i < nv; i++) diff += full[i] != al[i];
        free(full);
        CHECK(diff == 0, "%s: prefix %zu: fast and full masks differ on %d ids", name, k, diff);
        int samples = nv <= 4000 ? nv : 3000;
        gram_matcher *m2 = NULL;
        for (int j = 0; j < samples; j++) {
            int id = nv <= 4000 ? j : rnd(nv);
            if (!m2) { gram_matcher_new(g, &m2, &st); gram_matcher_accept_bytes(m2, at[k].prefix, strlen(at[k].prefix)); }
            int a = gram_matcher_accept_token(m2, v, id);
            n_cmp++;
            if (a != al[id] && bad++ < 5) {
                size_t pl; const char *p = tok_piece(t, id, &pl);
                CHECK(0, "%s prefix %zu: id %d '%.*s' mask %d accept %d", name, k, id, (int)pl, p ? p : "", al[id], a);
            }
            if (a) { gram_matcher_free(m2); m2 = NULL; }
        }
        gram_matcher_free(m2); gram_matcher_free(m); gram_free(g);
    }
    CHECK(bad == 0, "%s: mask and accept disagree %d times in %d", name, bad, n_cmp);
    free(al);
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
            if (nv <= 4000) { /* small vocabulary: every mask (fast paths, replayed states) against the full walk */
                uint8_t full[4000];
                gram_mask_no_fast = 1;
                gram_matcher_mask(m, v, full);
                gram_mask_no_fast = 0;
                int diff = 0;
                for (int i = 0; i < nv; i++) diff += full[i] != allowed[i];
                agree_n++;
                if (diff && agree_bad++ < 5) CHECK(0, "%s walk %d: mask and full walk differ on %d ids after '%.*s'", what, w, diff, (int)on, out);
            }
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

/* Added tokens are terminals only where a grammar lists them: "a" then "<tool_call>" or
 * "<tool_x>", then "b", built with the internal builder, listing "<tool_call>" (or not). */
static void test_added(const gram_vocab *v, const tok_tokenizer *t, const char *name) {
    int32_t tc = tok_id(t, "<tool_call>"), te = tok_id(t, "</tool_call>"), ie = tok_id(t, "<|im_end|>");
    CHECK(tc >= 0 && te >= 0 && ie >= 0 && tok_is_added(t, tc), "%s: added tokens %d %d %d", name, tc, te, ie);
    if (tc < 0 || te < 0 || ie < 0) return;
    int nv = gram_vocab_size(v);
    uint8_t *al = malloc((size_t)nv);
    for (int list = 0; list < 2; list++) {
        gram_grammar *g = gram_g_new();
        int r = gram_g_rule(g), mid = gram_g_rule(g);
        const char *x = "<tool_call>", *y = "<tool_x>";
        int32_t e[16]; int n = 0;
        for (const char *p = x; *p; p++) e[n++] = gram_g_byte(g, (uint8_t)*p);
        gram_g_alt(g, mid, e, n);
        n = 0;
        for (const char *p = y; *p; p++) e[n++] = gram_g_byte(g, (uint8_t)*p);
        gram_g_alt(g, mid, e, n);
        int32_t top[3] = { gram_g_byte(g, 'a'), GRAM_REF(mid), gram_g_byte(g, 'b') };
        gram_g_alt(g, r, top, 3);
        if (list) { gram_g_added(g, "<tool_call>"); gram_g_added(g, "<|im_end|>"); }
        lily_status st;
        CHECK(gram_g_finish(g, r, &st) == LILY_OK, "finish: %s", st.msg);
        gram_matcher *m; gram_matcher_new(g, &m, &st);
        gram_matcher_mask(m, v, al);
        CHECK(!al[tc] && !al[te] && !al[ie], "%s list %d: added tokens before 'a'", name, list);
        CHECK(gram_matcher_accept_token(m, v, tc) == 0, "%s list %d: <tool_call> accepted before 'a'", name, list);
        CHECK(gram_matcher_accept_bytes(m, "a", 1), "a");
        gram_matcher_mask(m, v, al);
        int n_added = 0;
        for (int i = 0; i < nv; i++) n_added += al[i] && tok_is_added(t, i);
        CHECK(al[tc] == list && n_added == list, "%s list %d: mask after 'a': <tool_call> %d, %d added allowed", name, list, al[tc], n_added);
        CHECK(!al[ie] && !al[te], "%s list %d: listed <|im_end|> whose bytes do not fit, or unlisted </tool_call>", name, list);
        /* ordinary tokens spelling the same bytes are allowed either way */
        int32_t *ids; int nid;
        tok_encode(t, "<tool_call>", 11, 0, &ids, &nid, &st);
        CHECK(nid > 0 && !tok_is_added(t, ids[0]) && al[ids[0]], "%s list %d: plain spelling '<' refused", name, list);
        gram_matcher *m2; gram_matcher_new(g, &m2, &st);
        gram_matcher_accept_bytes(m2, "a", 1);
        int ok = 1;
        for (int i = 0; i < nid; i++) ok &= gram_matcher_accept_token(m2, v, ids[i]);
        CHECK(ok && gram_matcher_accept_bytes(m2, "b", 1) && gram_matcher_can_end(m2), "%s: plain spelling", name);
        free(ids); gram_matcher_free(m2);
        CHECK(gram_matcher_accept_token(m, v, tc) == list, "%s list %d: accept <tool_call>", name, list);
        if (list) {
            gram_matcher_mask(m, v, al);
            CHECK(!al[tc] && gram_matcher_accept_token(m, v, tc) == 0, "%s: <tool_call> twice", name);
            CHECK(gram_matcher_accept_bytes(m, "b", 1) && gram_matcher_can_end(m), "%s: 'b' after <tool_call>", name);
        }
        gram_matcher_free(m); gram_free(g);
    }
    free(al);
}

static void test_walks(const char *tok_path, const char *name, int n_walks, int check_every) {
    tok_tokenizer *t; lily_status st;
    if (tok_load(tok_path, &t, &st)) { CHECK(0, "load %s: %s", tok_path, st.msg); return; }
    gram_vocab *v;
    int nv = tok_vocab_size(t) + 17; /* a padded logits row */
    CHECK(gram_vocab_new(t, nv, &v, &st) == LILY_OK, "vocab: %s", st.msg);
    CHECK(gram_vocab_size(v) == nv, "vocab size");
    agree_at(v, t, name);
    test_added(v, t, name);
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
    uint64_t seed = t_seed("test_grammar");
    lily_rng_seed(&rng, seed);
    test_errors();
    test_utf8();
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
