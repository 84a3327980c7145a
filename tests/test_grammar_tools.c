/* Tool-call grammars (gram_tool_call): random token walks over the synthetic and the real
 * Qwen3 vocabularies whose text, after "<tool_call>", parse_output turns into tool calls
 * of the listed functions with arguments valid against their parameters; chat_render's
 * renderings of assistant tool calls accepted byte for byte and token for token, for the
 * XML (Qwen3.6) and JSON (Qwen3) templates; refusals. LILY_TEST_SEED=N replays a run. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>
#include "t.h"
#include "gram_valid.h"
#include "text/chat.h"
#include "text/grammar.h"
#include "text/gram_priv.h"
#include "util/util.h"

static lily_rng rng;
static int rnd(int n) { return (int)(lily_rng_u64(&rng) % (uint64_t)n); }

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\",\"description\":\"a city\"},"
    "\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]},\"days\":{\"type\":\"integer\"}},"
    "\"required\":[\"location\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"query\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":12},"
    "\"filters\":{\"type\":\"object\",\"properties\":{\"lang\":{\"type\":\"string\"},\"max\":{\"type\":\"integer\"}},\"required\":[\"lang\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":3},\"exact\":{\"type\":\"boolean\"},"
    "\"score\":{\"type\":\"number\"},\"mode\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":3},{\"type\":\"null\"}]}},"
    "\"required\":[\"query\",\"exact\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"ping\"}},"
    /* pydantic's shape: nested models behind $ref; "when" must come back as an object, "who" as text */
    "{\"type\":\"function\",\"function\":{\"name\":\"book\",\"parameters\":{\"type\":\"object\",\"$defs\":{"
    "\"Date\":{\"type\":\"object\",\"properties\":{\"y\":{\"type\":\"integer\"},\"m\":{\"type\":\"integer\"}},"
    "\"required\":[\"y\",\"m\"]},\"Name\":{\"type\":\"string\",\"maxLength\":5}},\"properties\":{"
    "\"when\":{\"$ref\":\"#/$defs/Date\"},\"who\":{\"$ref\":\"#/$defs/Name\"},"
    "\"opt\":{\"allOf\":[{\"$ref\":\"#/$defs/Date\"}]}},\"required\":[\"when\",\"who\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"note_citt\xc3\xa0\",\"parameters\":{\"properties\":{\"text\":{},"
    "\"n\":{\"type\":[\"integer\",\"null\"]}},\"required\":[\"text\"]}}}]";

static const json_t *find_fn(const json_t *tools, const char *name) {
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *fn = json_object_get(json_array_get(tools, i), "function");
        if (!strcmp(json_string_value(json_object_get(fn, "name")), name)) return fn;
    }
    return NULL;
}

/* the text, after "<tool_call>", must parse into n_want calls (any number >= 1 when
 * n_want < 0) of listed functions (only `only` when set) with valid arguments */
static int check_calls(const char *text, size_t n, json_t *tools, const char *only, int n_want, const char *what) {
    size_t fn_len = n + 16;
    char *full = malloc(fn_len);
    memcpy(full, "<tool_call>", 11); memcpy(full + 11, text, n);
    chat_parse_opts o = { .think_open = 0, .tools = tools, .id_seed = 7 };
    chat_parsed p; lily_status st;
    int ok = parse_output(full, n + 11, &o, &p, &st) == LILY_OK;
    free(full);
    if (!ok) { CHECK(0, "%s: parse_output: %s", what, st.msg); return 0; }
    ok = p.content[0] == 0 && p.n_calls >= 1 && (n_want < 0 || p.n_calls == n_want);
    CHECK(ok, "%s: %d calls (want %d), content '%s' from: %.*s", what, p.n_calls, n_want, p.content, (int)n, text);
    for (int i = 0; ok && i < p.n_calls; i++) {
        const json_t *fn = find_fn(tools, p.calls[i].name);
        json_t *args = json_loads(p.calls[i].arguments, 0, NULL);
        json_t *params = json_object_get(fn, "parameters");
        int good = fn && (!only || !strcmp(only, p.calls[i].name)) && json_is_object(args) &&
                   (params ? valid(args, params, params) : json_object_size(args) == 0);
        CHECK(good, "%s: call %d %s(%s) invalid, from: %.*s", what, i, p.calls[i].name, p.calls[i].arguments, (int)n, text);
        ok &= good;
        json_decref(args);
    }
    parse_free(&p);
    return ok;
}

/* Walks: random allowed tokens, then, more and more often, tokens that continue one of
 * the closing strings (longest overlap with the text's end first) so walks finish. Only
 * closers the grammar would take whole from here count: inside a free-text parameter a
 * walk otherwise kept starting "}\n</tool_call>" (which the value may not contain) and
 * could run out of steps (CI seed 33773388002). */
static const char *const CLOSERS[] = { "\n</parameter>\n", "</function>\n</tool_call>", "}\n</tool_call>", "\"", "}", "]", NULL };

static int pick(const gram_grammar *g, const tok_tokenizer *t, const uint8_t *al, int32_t *cand, int nc,
                const char *out, size_t on, int closing) {
    if (!closing) return cand[rnd(nc)];
    int best = -1, n_best = 0, best_ov = -1;
    for (int c = 0; CLOSERS[c]; c++) {
        size_t cl = strlen(CLOSERS[c]), ov = 0;
        for (size_t o = cl - 1; o > 0; o--)
            if (o <= on && !memcmp(out + on - o, CLOSERS[c], o)) { ov = o; break; }
        const char *want = CLOSERS[c] + ov;
        size_t wl = cl - ov;
        gram_matcher *m2;
        lily_status st;
        if (gram_matcher_new(g, &m2, &st) == LILY_OK) {
            int whole = gram_matcher_accept_bytes(m2, out, on) && gram_matcher_accept_bytes(m2, want, wl);
            gram_matcher_free(m2);
            if (!whole) continue;
        }
        for (int k = 0; k < nc; k++) {
            size_t pl; const char *p = tok_piece(t, cand[k], &pl);
            if (!p || pl > wl || memcmp(p, want, pl)) continue;
            if ((int)ov > best_ov) { best_ov = (int)ov; n_best = 0; }
            if ((int)ov == best_ov && rnd(++n_best) == 0) best = cand[k];
        }
    }
    (void)al;
    return best >= 0 ? best : cand[rnd(nc)];
}

static void walks(const gram_vocab *v, const tok_tokenizer *t, json_t *tools, gram_tool_format fmt, const char *only,
                  int multi, int n_walks, const char *what) {
    gram_grammar *g; lily_status st;
    if (gram_tool_call(TOOLS, strlen(TOOLS), fmt, only, multi, &g, &st)) { CHECK(0, "%s: %s", what, st.msg); return; }
    int nv = gram_vocab_size(v), ended = 0, used_added = 0, agree_bad = 0;
    uint8_t *al = malloc((size_t)nv);
    int32_t *cand = malloc(sizeof(int32_t) * (size_t)nv);
    char *out = malloc(65536);
    for (int w = 0; w < n_walks; w++) {
        gram_matcher *m;
        gram_matcher_new(g, &m, &st);
        size_t on = 0;
        int done = 0, calls = 0;
        for (int step = 0; step < 1000 && !done; step++) {
            gram_matcher_mask(m, v, al);
            if (nv <= 4000) { /* small vocabulary: every mask (fast paths, replayed states) against the full walk */
                uint8_t full[4000];
                gram_mask_no_fast = 1;
                gram_matcher_mask(m, v, full);
                gram_mask_no_fast = 0;
                for (int i = 0; i < nv; i++) agree_bad += full[i] != al[i];
            }
            int nc = 0;
            for (int i = 0; i < nv; i++) if (al[i]) cand[nc++] = i;
            if (gram_matcher_can_end(m) && (nc == 0 || rnd(3) == 0)) { done = 1; break; }
            if (!nc) { CHECK(0, "%s walk %d: stuck after %.*s", what, w, (int)on, out); break; }
            if (step % 7 == 0) { /* a random id: the mask must say what accept_token says */
                int id = rnd(nv);
                gram_matcher *m2; gram_matcher_new(g, &m2, &st);
                gram_matcher_accept_bytes(m2, out, on);
                if (gram_matcher_accept_token(m2, v, id) != al[id]) agree_bad++;
                gram_matcher_free(m2);
            }
            int id = pick(g, t, al, cand, nc, out, on, rnd(100) < step * 2);
            size_t pl; const char *p = tok_piece(t, id, &pl);
            if (on + pl >= 65536) break;
            CHECK(gram_matcher_accept_token(m, v, id) == 1, "%s: allowed token %d refused", what, id);
            used_added += tok_is_added(t, id);
            memcpy(out + on, p, pl); on += pl;
        }
        for (size_t i = 0; i + 12 <= on; i++) calls += !memcmp(out + i, "</tool_call>", 12);
        if (done) {
            ended++;
            char label[96]; snprintf(label, sizeof label, "%s walk %d", what, w);
            check_calls(out, on, tools, only, multi ? calls : 1, label);
            if (getenv("GRAM_VERBOSE")) printf("--- %s:\n<tool_call>%.*s\n", label, (int)on, out);
            CHECK(multi || gram_matcher_must_end(m), "%s: single call but more may follow", label);
        } else { /* where it was when the budget ran out (a check below may fail on it) */
            size_t from = on > 160 ? on - 160 : 0;
            printf("%s walk %d: not ended after %zu bytes: ...%.*s\n", what, w, on, (int)(on - from), out + from);
        }
        gram_matcher_free(m);
    }
    CHECK(ended * 2 >= n_walks, "%s: only %d of %d walks ended", what, ended, n_walks);
    CHECK(agree_bad == 0, "%s: mask and accept_token disagree %d times", what, agree_bad);
    printf("%s: %d/%d walks ended, %d added tokens used\n", what, ended, n_walks, used_added);
    free(al); free(cand); free(out);
    gram_free(g);
}

static int accepts_text(const gram_grammar *g, const char *s, size_t n) {
    gram_matcher *m; lily_status st;
    if (gram_matcher_new(g, &m, &st)) return 0;
    int ok = gram_matcher_accept_bytes(m, s, n) && gram_matcher_can_end(m);
    gram_matcher_free(m);
    return ok;
}

static int accepts_tokens(const gram_grammar *g, const gram_vocab *v, const tok_tokenizer *t, const char *s, size_t n) {
    int32_t *ids; int nid; lily_status st;
    if (tok_encode(t, s, n, 1, &ids, &nid, &st)) return 0;
    gram_matcher *m;
    gram_matcher_new(g, &m, &st);
    int ok = 1, added = 0;
    uint8_t *al = malloc((size_t)gram_vocab_size(v));
    for (int i = 0; i < nid && ok; i++) {
        gram_matcher_mask(m, v, al);
        ok = al[ids[i]] && gram_matcher_accept_token(m, v, ids[i]);
        added += tok_is_added(t, ids[i]);
    }
    ok = ok && gram_matcher_can_end(m) && added > 0; /* </tool_call> came as the added token */
    free(al); free(ids); gram_matcher_free(m);
    return ok;
}

/* At chosen states of raw text values (every automaton state on the way to a terminator
 * or the end, counts up to and past maxLength, inside a character): the mask equals the
 * full-trie walk's (every id) and accept_token (a sample). */
static void agree_raw(const gram_vocab *v, const tok_tokenizer *t, const char *name) {
    static const char *const pre[] = {
        "", "a", "abc\n", "abc\n<", "abc\n</", "abc\n</p", "abc\n</parameter", "abc</paramete", "abc</parameter",
        "x\n</tool_cal", "</tool_call", "abcdefghijk", "abcdefghijkl", "abcdefghijk\n", "abcdefghijkl\n",
        "abcdefghijkl\n</para", "abcdefghij\n</paramete", "ab\xe4\xbd", "\xf0\x9f\x98", "a\"b\\", "\n",
    };
    /* inside JSON strings of a call, which must not spell "</parameter>" or "</tool_call>" */
    static const char *const jpre[] = {
        "", "a", "<", "</", "</p", "</paramete", "abc</tool_cal", "x<\\/", "ab\xe4\xbd", "\\u00", "</para<", "<<",
        "abcdefghij</", "abcdefghijk<", "abcdefghijkl",
    };
    static const struct { const char *head; int json, fmt; } heads[] = {
        { "\n<function=search>\n<parameter=query>\n", 0, GRAM_TOOLS_XML },
        { "\n<function=note_citt\xc3\xa0>\n<parameter=text>\n", 0, GRAM_TOOLS_XML },
        { "\n<function=search>\n<parameter=query>\nq\n</parameter>\n<parameter=filters>\n{\"lang\": \"", 1, GRAM_TOOLS_XML },
        { "\n{\"name\": \"search\", \"arguments\": {\"query\": \"", 1, GRAM_TOOLS_JSON }, /* 1..12 characters */
    };
    gram_grammar *gs[2]; lily_status st;
    if (gram_tool_call(TOOLS, strlen(TOOLS), GRAM_TOOLS_XML, NULL, 1, &gs[0], &st)) { CHECK(0, "%s", st.msg); return; }
    if (gram_tool_call(TOOLS, strlen(TOOLS), GRAM_TOOLS_JSON, NULL, 1, &gs[1], &st)) { CHECK(0, "%s", st.msg); gram_free(gs[0]); return; }
    int nv = gram_vocab_size(v), bad = 0, n_fast = 0, n_cmp = 0;
    uint8_t *a1 = malloc((size_t)nv), *a2 = malloc((size_t)nv);
    for (int h = 0; h < 4; h++)
        for (size_t k = 0; k < (heads[h].json ? sizeof jpre / sizeof *jpre : sizeof pre / sizeof *pre); k++) {
            const char *pk = heads[h].json ? jpre[k] : pre[k];
            const gram_grammar *g = gs[heads[h].fmt == GRAM_TOOLS_JSON];
            char text[256];
            snprintf(text, sizeof text, "%s%s", heads[h].head, pk);
            gram_matcher *m;
            gram_matcher_new(g, &m, &st);
            if (!gram_matcher_accept_bytes(m, text, strlen(text))) {
                /* only the bounded values refuse, past 12 characters */
                CHECK((h == 0 || h == 3) && strlen(pk) > 12, "%s: prefix %d/%zu refused", name, h, k);
                gram_matcher_free(m);
                continue;
            }
            gram_matcher_mask(m, v, a1);
            gram_mask_no_fast = 1;
            gram_matcher_mask(m, v, a2);
            gram_mask_no_fast = 0;
            int diff = 0, n_al = 0;
            for (int i = 0; i < nv; i++) { diff += a1[i] != a2[i]; n_al += a1[i]; }
            n_fast++;
            if (diff && bad++ < 5) CHECK(0, "%s: prefix %d/%zu '%s': fast and full masks differ on %d ids", name, h, k, pk, diff);
            CHECK(n_al > 0, "%s: prefix %d/%zu: empty mask", name, h, k);
            for (int j = 0; j < 300; j++) {
                int id = j & 1 ? rnd(nv) : j;
                gram_matcher *m2; gram_matcher_new(g, &m2, &st);
                gram_matcher_accept_bytes(m2, text, strlen(text));
                int acc = gram_matcher_accept_token(m2, v, id);
                n_cmp++;
                if (acc != a1[id] && bad++ < 5) {
                    size_t pl; const char *p = tok_piece(t, id, &pl);
                    CHECK(0, "%s prefix %d/%zu: id %d '%.*s' mask %d accept %d", name, h, k, id, (int)pl, p ? p : "", a1[id], acc);
                }
                gram_matcher_free(m2);
            }
            gram_matcher_free(m);
        }
    CHECK(bad == 0, "%s: raw text masks: %d disagreements (%d states, %d accept comparisons)", name, bad, n_fast, n_cmp);
    free(a1); free(a2); gram_free(gs[0]); gram_free(gs[1]);
}

/* An assistant turn with four tool calls (arguments in the schemas' order) rendered by
 * the real templates: the text after each <tool_call> is accepted by the grammars. */
static void test_render(const gram_vocab *v, const tok_tokenizer *t, json_t *tools) {
    const char *calls =
        "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
        "{\"location\":\"Paris, \\\"FR\\\" <b> \\u00e9\\n2 lines\",\"unit\":\"celsius\",\"days\":3}}},"
        "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"search\",\"arguments\":{\"query\":\"caf\\u00e9 < x\","
        "\"filters\":{\"lang\":\"fr\",\"max\":10},\"tags\":[\"a\",\"b\"],\"exact\":true,\"score\":-1.5e-07,\"mode\":\"abc\"}}},"
        "{\"id\":\"c3\",\"type\":\"function\",\"function\":{\"name\":\"ping\",\"arguments\":{}}},"
        "{\"id\":\"c4\",\"type\":\"function\",\"function\":{\"name\":\"note_citt\\u00e0\",\"arguments\":"
        "{\"text\":\"{\\\"json\\\": 1}\\n</param\",\"n\":null}}}]";
    for (int tpl = 0; tpl < 2; tpl++) {
        chat_template_kind kind = tpl ? CHAT_TEMPLATE_QWEN3 : CHAT_TEMPLATE_QWEN36;
        gram_tool_format fmt = tpl ? GRAM_TOOLS_JSON : GRAM_TOOLS_XML;
        json_t *req = json_pack("{s:[{s:s,s:s},{s:s,s:s,s:o}],s:O}", "messages", "role", "user", "content", "hi",
                                "role", "assistant", "content", "", "tool_calls",
                                json_loads(calls, JSON_PRESERVE_ORDER, NULL), "tools", tools);
        char *txt; lily_status st;
        if (!req || chat_render(req, kind, &txt, &st)) { CHECK(0, "render %d: %s", tpl, req ? st.msg : "pack"); json_decref(req); continue; }
        const char *a = strstr(txt, "<|im_start|>assistant\n"), *z = a ? strstr(a, "<|im_end|>") : NULL;
        CHECK(a && z, "render %d: no assistant turn", tpl);
        if (!a || !z) { free(txt); json_decref(req); continue; }
        gram_grammar *gm, *g1, *gn, *gw;
        CHECK(gram_tool_call(TOOLS, strlen(TOOLS), fmt, NULL, 1, &gm, &st) == LILY_OK, "%s", st.msg);
        CHECK(gram_tool_call(TOOLS, strlen(TOOLS), fmt, NULL, 0, &g1, &st) == LILY_OK, "%s", st.msg);
        CHECK(gram_tool_call(TOOLS, strlen(TOOLS), fmt, "ping", 0, &gw, &st) == LILY_OK, "%s", st.msg);
        const char *first = strstr(a, "<tool_call>") + 11, *last_end = NULL;
        int n_calls = 0;
        for (const char *p = strstr(a, "<tool_call>"); p && p < z; p = strstr(p + 1, "<tool_call>")) {
            const char *b = p + 11, *e = strstr(b, "</tool_call>") + 12;
            last_end = e;
            size_t n = (size_t)(e - b);
            char name[64] = { 0 };
            const char *nm = tpl ? strstr(b, "\"name\": \"") + 9 : strstr(b, "<function=") + 10;
            size_t k = 0;
            while (nm[k] != (tpl ? '"' : '>') && k < 63) { name[k] = nm[k]; k++; }
            CHECK(gram_tool_call(TOOLS, strlen(TOOLS), fmt, name, 0, &gn, &st) == LILY_OK, "%s", st.msg);
            CHECK(accepts_text(g1, b, n) && accepts_text(gm, b, n) && accepts_text(gn, b, n),
                  "template %d call %d (%s) refused: %.*s", tpl, n_calls, name, (int)n, b);
            CHECK(!strcmp(name, "ping") || !accepts_text(gw, b, n), "template %d call %d accepted as ping", tpl, n_calls);
            CHECK(accepts_tokens(g1, v, t, b, n), "template %d call %d: tokens refused", tpl, n_calls);
            CHECK(check_calls(b, n, tools, name, 1, "rendered call"), "template %d call %d does not parse back", tpl, n_calls);
            gram_free(gn);
            n_calls++;
        }
        CHECK(n_calls == 4, "template %d: %d calls rendered", tpl, n_calls);
        if (last_end) {
            size_t n = (size_t)(last_end - first);
            CHECK(accepts_text(gm, first, n) && !accepts_text(g1, first, n), "template %d: all calls in a row", tpl);
            CHECK(accepts_tokens(gm, v, t, first, n), "template %d: all calls in a row, as tokens", tpl);
        }
        gram_free(gm); gram_free(g1); gram_free(gw);
        free(txt); json_decref(req);
    }
}

static void expect_err(const char *tools, const char *name, const char *needle) {
    gram_grammar *g = NULL; lily_status st; st.msg[0] = 0;
    for (int f = 0; f < 2; f++) {
        lily_code rc = gram_tool_call(tools, strlen(tools), (gram_tool_format)f, name, 1, &g, &st);
        CHECK(rc == LILY_EINVAL && !g && strstr(st.msg, needle), "%s fmt %d: rc %d '%s' (want '%s')", tools, f, rc, st.msg, needle);
        gram_free(g); g = NULL;
    }
}

static void test_errors(void) {
    expect_err("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":"
               "{\"a\":{\"type\":\"string\",\"pattern\":\"x\"}}}}}]", NULL, "tool \"f\": json schema: unsupported keyword \"pattern\"");
    expect_err("[{\"type\":\"function\",\"function\":{\"name\":\"g\",\"parameters\":{\"type\":\"array\"}}}]", NULL, "tool \"g\"");
    expect_err("[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", "h", "no function named \"h\"");
    expect_err("[]", NULL, "non-empty array");
    expect_err("[{\"type\":\"function\",\"function\":{\"description\":\"x\"}}]", NULL, "name");
    expect_err("[{", NULL, "bad JSON");
    gram_grammar *g; lily_status st;
    /* two untyped recursive parameter schemas: "#" is each tool's own */
    const char *rec = "[{\"name\":\"a\",\"parameters\":{\"properties\":{\"x\":{\"$ref\":\"#\"},\"a\":{\"type\":\"integer\"}}}},"
                      "{\"name\":\"b\",\"parameters\":{\"properties\":{\"y\":{\"$ref\":\"#\"},\"b\":{\"type\":\"string\"}}}}]";
    CHECK(gram_tool_call(rec, strlen(rec), GRAM_TOOLS_JSON, NULL, 0, &g, &st) == LILY_OK, "recursive: %s", st.msg);
    const char *yes[] = { "\n{\"name\": \"b\", \"arguments\": {\"y\": {\"y\": {\"b\": \"s\"}}}}\n</tool_call>",
                          "\n{\"name\": \"a\", \"arguments\": {\"x\": {\"a\": 1}, \"a\": 2}}\n</tool_call>" };
    const char *no[] = { "\n{\"name\": \"b\", \"arguments\": {\"y\": {\"a\": 1}}}\n</tool_call>",
                         "\n{\"name\": \"a\", \"arguments\": {\"x\": {\"y\": {}}}}\n</tool_call>" };
    for (int i = 0; i < 2; i++) {
        CHECK(accepts_text(g, yes[i], strlen(yes[i])), "recursive: refused %s", yes[i]);
        CHECK(!accepts_text(g, no[i], strlen(no[i])), "recursive: accepted %s", no[i]);
    }
    gram_free(g);
    const char *lt = "[{\"type\":\"function\",\"function\":{\"name\":\"a<b\"}}]";
    CHECK(gram_tool_call(lt, strlen(lt), GRAM_TOOLS_XML, NULL, 0, &g, &st) == LILY_EINVAL && strstr(st.msg, "tool \"a<b\""),
          "XML name with '<': %s", st.msg);
    CHECK(gram_tool_call(lt, strlen(lt), GRAM_TOOLS_JSON, NULL, 0, &g, &st) == LILY_OK, "JSON name with '<': %s", st.msg);
    gram_free(g);
}

/* A JSON value inside a call must not hold the strings its parsers cut at: parse_call ends an
 * XML parameter at the first "</parameter>", parse_output ends the call at "</tool_call>".
 * Written with "\/" they are the same JSON and pass. */
static void test_forbidden(void) {
    static const char *fn_xml = "\n<function=search>\n<parameter=query>\nq\n</parameter>\n<parameter=filters>\n{\"lang\": \"%s\"}"
                                "\n</parameter>\n<parameter=exact>\ntrue\n</parameter>\n</function>\n</tool_call>";
    static const char *fn_json = "\n{\"name\": \"search\", \"arguments\": {\"query\": \"q\", \"filters\": {\"lang\": \"%s\"}, "
                                 "\"exact\": true}}\n</tool_call>";
    static const struct { const char *s; int ok; } v[] = {
        { "plain", 1 }, { "a</b>", 1 }, { "</paramete", 1 }, { "<\\/parameter>", 1 }, { "<\\/tool_call>", 1 },
        { "x</parameter>", 0 }, { "</tool_call>y", 0 }, { "<</parameter>", 0 }, { "</para</parameter>", 0 },
    };
    for (int f = 0; f < 2; f++) {
        gram_grammar *g; lily_status st;
        if (gram_tool_call(TOOLS, strlen(TOOLS), (gram_tool_format)f, NULL, 0, &g, &st)) { CHECK(0, "%s", st.msg); continue; }
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
            char text[512];
            snprintf(text, sizeof text, f ? fn_json : fn_xml, v[i].s);
            CHECK(accepts_text(g, text, strlen(text)) == v[i].ok, "%s call with lang \"%s\": accepted %d, want %d",
                  f ? "json" : "xml", v[i].s, !v[i].ok, v[i].ok);
            if (v[i].ok) {
                json_t *tools = json_loads(TOOLS, 0, NULL);
                check_calls(text, strlen(text), tools, "search", 1, "call with \"/\" in a JSON value");
                json_decref(tools);
            }
        }
        gram_free(g);
    }
    /* a listed name with "</" is written with "\/" in the JSON form */
    const char *odd = "[{\"name\":\"a</tool_call>\",\"parameters\":{\"properties\":{\"k</parameter>\":{\"enum\":[\"</tool_call>\"]}}}}]";
    gram_grammar *g; lily_status st;
    CHECK(gram_tool_call(odd, strlen(odd), GRAM_TOOLS_JSON, NULL, 0, &g, &st) == LILY_OK, "odd names: %s", st.msg);
    const char *yes = "\n{\"name\": \"a<\\/tool_call>\", \"arguments\": {\"k<\\/parameter>\": \"<\\/tool_call>\"}}\n</tool_call>";
    const char *no = "\n{\"name\": \"a</tool_call>\", \"arguments\": {}}\n</tool_call>";
    CHECK(accepts_text(g, yes, strlen(yes)), "escaped name, key and enum value refused");
    CHECK(!accepts_text(g, no, strlen(no)), "a name holding </tool_call> accepted as written");
    gram_free(g);
}

static void run_vocab(const char *path, const char *name, int n_walks, json_t *tools, int render) {
    tok_tokenizer *t; gram_vocab *v; lily_status st;
    if (tok_load(path, &t, &st)) { CHECK(0, "load %s: %s", path, st.msg); return; }
    CHECK(gram_vocab_new(t, tok_vocab_size(t) + 5, &v, &st) == LILY_OK, "vocab: %s", st.msg);
    char what[96];
    for (int f = 0; f < 2; f++)
        for (int multi = 0; multi < 2; multi++) {
            snprintf(what, sizeof what, "%s %s multi %d", name, f ? "json" : "xml", multi);
            walks(v, t, tools, (gram_tool_format)f, NULL, multi, n_walks, what);
        }
    snprintf(what, sizeof what, "%s xml search only", name);
    walks(v, t, tools, GRAM_TOOLS_XML, "search", 0, n_walks, what);
    snprintf(what, sizeof what, "%s json note only", name);
    walks(v, t, tools, GRAM_TOOLS_JSON, "note_citt\xc3\xa0", 1, n_walks, what);
    agree_raw(v, t, name);
    if (render) test_render(v, t, tools);
    gram_vocab_free(v); tok_free(t);
}

int main(void) {
    uint64_t seed = t_seed("test_grammar_tools");
    lily_rng_seed(&rng, seed);
    json_t *tools = json_loads(TOOLS, JSON_PRESERVE_ORDER, NULL);
    CHECK(tools != NULL, "tools JSON");
    test_errors();
    test_forbidden();
    char dir[] = "/tmp/gram_tools_XXXXXX";
    if (mkdtemp(dir)) {
        char path[256]; lily_status st;
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        CHECK(tok_write_synth_json(path, 1000, &st) == LILY_OK, "synth: %s", st.msg);
        /* pieces that finish a terminator after a partial one ("</" then "parameter>"), so the
         * masks' fast path is checked where it must step them */
        json_t *tj = json_load_file(path, 0, NULL), *voc = json_object_get(json_object_get(tj, "model"), "vocab");
        static const char *extra[] = { "parameter>", "ool_call>", "tool_call>", "ameter>", "aram", "</pa", "x</", "meter>\"" };
        for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) json_object_set_new(voc, extra[i], json_integer(2000 + (int)i));
        CHECK(tj && json_dump_file(tj, path, 0) == 0, "extend the synth vocabulary");
        json_decref(tj);
        run_vocab(path, "synth", 8, tools, 0);
        char cmd[300]; snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        CHECK(system(cmd) == 0, "rm");
    }
    const char *q = "../shared/data/qwen-tokenizer/qwen3/tokenizer.json";
    CHECK(access(q, R_OK) == 0, "missing %s", q);
    run_vocab(q, "qwen3", 3, tools, 1);
    json_decref(tools);
    return T_DONE();
}
