/* Loading: a HF tokenizer.json, or the slow-tokenizer files (vocab.json + merges.txt +
 * tokenizer_config.json), into one tok_tokenizer. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "tokenizer/tok_internal.h"
#include "util/util.h"

#define MAX_ID (1 << 22) /* far above any real vocabulary; bounds what a hostile file can allocate */

typedef tok_vocab_ent vocab_ent;

/* The raw bytes a token stands for, as HF's ByteLevel decoder gives them: every char
 * mapped back through the byte alphabet, or the UTF-8 itself when one char is not in it. */
static size_t token_bytes(const char *s, size_t n, char *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t w = 0, i = 0, sub;
    while (i < n) {
        int l = tok_utf8_check(u + i, n - i, &sub);
        if (l <= 0) break;
        uint32_t cp; tok_utf8_next(u + i, &cp);
        int b = tok_cp_to_byte(cp);
        if (b < 0) break;
        out[w++] = (char)b;
        i += (size_t)l;
    }
    if (i < n) { memcpy(out, s, n); return n; }
    return w;
}

static void tok_free_partial(tok_tokenizer *t) { tok_free(t); }

void tok_free(tok_tokenizer *t) {
    if (!t) return;
    free(t->pieces); free(t->piece_off); free(t->piece_len); free(t->flags);
    tok_strmap_free(&t->vocab);
    tok_pairmap_free(&t->merges);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    tok_pretok_free(t->pre);
    tok_cache_free(&t->cache);
    free(t);
}

/* HF's rule for tokenizer.json (it does not take the ids written there): an added token
 * spelled like a vocabulary entry or an earlier added token gets that id, any other the next
 * id after the vocabulary (its entry count) and after every added id so far. */
static lily_code assign_hf_ids(tok_tokenizer *t, lily_status *st) {
    tok_strmap seen;
    if (!tok_strmap_init(&seen, (uint32_t)t->n_added)) { tok_strmap_free(&seen); return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory"); }
    int64_t vocab_len = t->vocab.n, max_added = -1;
    for (int i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        int32_t id = tok_strmap_get(&seen, a->content, a->len);
        if (id < 0) id = tok_strmap_get(&t->vocab, a->content, a->len);
        if (id < 0) id = (int32_t)(max_added < 0 ? vocab_len : (max_added >= vocab_len || !vocab_len ? max_added + 1 : vocab_len));
        if (id >= MAX_ID) { tok_strmap_free(&seen); return lily_err(st, LILY_EFORMAT, "tokenizer: too many added tokens"); }
        a->id = id;
        if (id > max_added) max_added = id;
        if (!tok_strmap_put(&seen, a->content, a->len, id)) { tok_strmap_free(&seen); return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory"); }
    }
    tok_strmap_free(&seen);
    return LILY_OK;
}

/* Builds the id tables from vocab entries and added tokens (already in t->added). */
static lily_code build_tables(tok_tokenizer *t, const vocab_ent *v, size_t nv, int hf_ids, lily_status *st) {
    int32_t maxid = -1;
    size_t bytes = 0;
    if (!tok_strmap_init(&t->vocab, (uint32_t)(nv + (size_t)t->n_added)))
        return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < nv; i++) {
        if (v[i].id < 0 || v[i].id >= MAX_ID)
            return lily_err(st, LILY_EFORMAT, "tokenizer: vocabulary id %d out of range", (int)v[i].id);
        if (v[i].id > maxid) maxid = v[i].id;
        bytes += v[i].n;
        int r = tok_strmap_put(&t->vocab, v[i].s, v[i].n, v[i].id);
        if (!r) return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory");
        if (r == 2) return lily_err(st, LILY_EFORMAT, "tokenizer: vocabulary entry \"%.*s\" appears twice",
                                    (int)(v[i].n > 40 ? 40 : v[i].n), v[i].s);
    }
    if (hf_ids) {
        lily_code rc = assign_hf_ids(t, st);
        if (rc) return rc;
    }
    for (int i = 0; i < t->n_added; i++) {
        if (t->added[i].id < 0 || t->added[i].id >= MAX_ID)
            return lily_err(st, LILY_EFORMAT, "tokenizer: added token id %d out of range", (int)t->added[i].id);
        if (t->added[i].id > maxid) maxid = t->added[i].id;
        bytes += t->added[i].len;
    }
    t->n_vocab = maxid + 1;
    size_t nid = (size_t)t->n_vocab;
    t->piece_off = malloc((nid + 1) * sizeof *t->piece_off);
    t->piece_len = malloc((nid + 1) * sizeof *t->piece_len);
    t->flags = calloc(nid + 1, 1);
    t->pieces = malloc(bytes + 1);
    if (!t->piece_off || !t->piece_len || !t->flags || !t->pieces || bytes > UINT32_MAX)
        return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory for %zu tokens", nid);
    for (size_t i = 0; i <= nid; i++) t->piece_len[i] = UINT32_MAX;
    size_t w = 0;
    for (size_t i = 0; i < nv; i++) {
        t->piece_off[v[i].id] = (uint32_t)w;
        t->piece_len[v[i].id] = (uint32_t)token_bytes(v[i].s, v[i].n, t->pieces + w);
        w += t->piece_len[v[i].id];
    }
    for (int i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        if (!tok_strmap_put(&t->vocab, a->content, a->len, a->id))
            return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory");
        t->piece_off[a->id] = (uint32_t)w;
        t->piece_len[a->id] = (uint32_t)token_bytes(a->content, a->len, t->pieces + w);
        w += t->piece_len[a->id];
        t->flags[a->id] = (uint8_t)(1 | (a->special ? 2 : 0));
        if (a->len) t->added_first[(unsigned char)a->content[0]] |= (uint8_t)(a->normalized ? 2 : 1);
    }
    char key[8];
    for (int b = 0; b < 256; b++) {
        uint32_t cp = tok_byte_to_cp[b];
        size_t kn;
        if (cp < 0x80) { key[0] = (char)cp; kn = 1; }
        else { key[0] = (char)(0xC0 | (cp >> 6)); key[1] = (char)(0x80 | (cp & 0x3F)); kn = 2; }
        t->byte_id[b] = tok_strmap_get(&t->vocab, key, kn);
    }
    return LILY_OK;
}

/* One merge "a b" (split at the single space) or a, b given apart. */
static lily_code add_merge(tok_tokenizer *t, const char *a, size_t an, const char *b, size_t bn,
                           uint32_t rank, char **scratch, size_t *scap, lily_status *st) {
    int32_t ia = tok_strmap_get(&t->vocab, a, an), ib = tok_strmap_get(&t->vocab, b, bn);
    if (*scap < an + bn) {
        size_t nc = (an + bn) * 2 + 64;
        char *s = realloc(*scratch, nc);
        if (!s) return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory");
        *scratch = s; *scap = nc;
    }
    memcpy(*scratch, a, an); memcpy(*scratch + an, b, bn);
    int32_t ir = tok_strmap_get(&t->vocab, *scratch, an + bn);
    if (ia < 0 || ib < 0 || ir < 0)
        return lily_err(st, LILY_EFORMAT, "tokenizer: merge %u (\"%.*s\" \"%.*s\") uses a token not in the vocabulary",
                        rank, (int)(an > 40 ? 40 : an), a, (int)(bn > 40 ? 40 : bn), b);
    if (!tok_pairmap_put(&t->merges, ia, ib, rank, ir))
        return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory");
    return LILY_OK;
}

static lily_code merges_from_json(tok_tokenizer *t, json_t *merges, lily_status *st) {
    size_t n = json_array_size(merges);
    if (!tok_pairmap_init(&t->merges, (uint32_t)n)) return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory");
    char *scratch = NULL; size_t scap = 0;
    lily_code rc = LILY_OK;
    for (size_t i = 0; i < n && rc == LILY_OK; i++) {
        json_t *m = json_array_get(merges, i);
        if (json_is_string(m)) {
            const char *s = json_string_value(m);
            size_t len = json_string_length(m);
            const char *sp = memchr(s, ' ', len);
            if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp - s) - 1))
                rc = lily_err(st, LILY_EFORMAT, "tokenizer: merge %zu is not two tokens separated by one space", i);
            else rc = add_merge(t, s, (size_t)(sp - s), sp + 1, len - (size_t)(sp - s) - 1, (uint32_t)i, &scratch, &scap, st);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            json_t *a = json_array_get(m, 0), *b = json_array_get(m, 1);
            rc = add_merge(t, json_string_value(a), json_string_length(a), json_string_value(b),
                           json_string_length(b), (uint32_t)i, &scratch, &scap, st);
        } else rc = lily_err(st, LILY_EFORMAT, "tokenizer: merge %zu is neither \"a b\" nor [a, b]", i);
    }
    free(scratch);
    return rc;
}

static int jbool(json_t *o, const char *k) { return json_is_true(json_object_get(o, k)); }

static lily_code add_added(tok_tokenizer *t, json_t *o, int32_t id, int *cap, lily_status *st) {
    json_t *c = json_object_get(o, "content");
    if (!json_is_string(c)) return lily_err(st, LILY_EFORMAT, "tokenizer: added token %d has no content", (int)id);
    if (t->n_added == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        tok_added *a = realloc(t->added, (size_t)nc * sizeof *a);
        if (!a) return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory");
        t->added = a; *cap = nc;
    }
    tok_added *a = &t->added[t->n_added];
    memset(a, 0, sizeof *a);
    a->len = json_string_length(c);
    a->content = malloc(a->len + 1);
    if (!a->content) return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory");
    memcpy(a->content, json_string_value(c), a->len + 1);
    a->id = id;
    a->special = (uint8_t)jbool(o, "special");
    a->lstrip = (uint8_t)jbool(o, "lstrip");
    a->rstrip = (uint8_t)jbool(o, "rstrip");
    a->single_word = (uint8_t)jbool(o, "single_word");
    a->normalized = (uint8_t)jbool(o, "normalized");
    t->n_added++;
    return LILY_OK;
}

static lily_code parse_normalizer(json_t *n, int *out, lily_status *st) {
    if (!n || json_is_null(n)) { *out = TOK_NORM_NONE; return LILY_OK; }
    const char *ty = json_string_value(json_object_get(n, "type"));
    if (!ty) return lily_err(st, LILY_EFORMAT, "tokenizer: normalizer without a type");
    if (!strcmp(ty, "Sequence")) {
        json_t *l = json_object_get(n, "normalizers");
        *out = TOK_NORM_NONE;
        for (size_t i = 0; i < json_array_size(l); i++) {
            int k;
            lily_code rc = parse_normalizer(json_array_get(l, i), &k, st);
            if (rc) return rc;
            if (k == TOK_NORM_NONE) continue;
            if (*out != TOK_NORM_NONE && *out != k)
                return lily_err(st, LILY_EUNSUPPORTED, "tokenizer: normalizer sequence not supported");
            *out = k;
        }
        return LILY_OK;
    }
    static const struct { const char *n; int k; } kinds[] = {
        { "NFC", TOK_NORM_NFC }, { "NFD", TOK_NORM_NFD }, { "NFKC", TOK_NORM_NFKC }, { "NFKD", TOK_NORM_NFKD } };
    for (size_t i = 0; i < 4; i++)
        if (!strcmp(ty, kinds[i].n)) { *out = kinds[i].k; return LILY_OK; }
    return lily_err(st, LILY_EUNSUPPORTED, "tokenizer: normalizer \"%s\" not supported", ty);
}

typedef struct { const char *regex; int literal; int byte_level; int n_split; } pre_spec;

static lily_code parse_pre(json_t *p, pre_spec *ps, lily_status *st) {
    if (!p || json_is_null(p)) return LILY_OK;
    const char *ty = json_string_value(json_object_get(p, "type"));
    if (!ty) return lily_err(st, LILY_EFORMAT, "tokenizer: pre_tokenizer without a type");
    if (!strcmp(ty, "Sequence")) {
        json_t *l = json_object_get(p, "pretokenizers");
        for (size_t i = 0; i < json_array_size(l); i++) {
            lily_code rc = parse_pre(json_array_get(l, i), ps, st);
            if (rc) return rc;
        }
        return LILY_OK;
    }
    if (!strcmp(ty, "Split")) {
        json_t *pat = json_object_get(p, "pattern");
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        if (ps->n_split++ || ps->byte_level)
            return lily_err(st, LILY_EUNSUPPORTED, "tokenizer: only one Split before ByteLevel is supported");
        if (!beh || strcmp(beh, "Isolated") || jbool(p, "invert"))
            return lily_err(st, LILY_EUNSUPPORTED, "tokenizer: Split behavior must be Isolated, not inverted");
        json_t *re = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
        if (json_is_string(re)) ps->regex = json_string_value(re);
        else if (json_is_string(lit)) { ps->regex = json_string_value(lit); ps->literal = 1; }
        else return lily_err(st, LILY_EFORMAT, "tokenizer: Split pattern is neither Regex nor String");
        if (!*ps->regex) return lily_err(st, LILY_EUNSUPPORTED, "tokenizer: empty Split pattern");
        return LILY_OK;
    }
    if (!strcmp(ty, "ByteLevel")) {
        if (jbool(p, "add_prefix_space"))
            return lily_err(st, LILY_EUNSUPPORTED, "tokenizer: ByteLevel add_prefix_space not supported");
        json_t *ur = json_object_get(p, "use_regex");
        if (!ur || json_is_true(ur)) {
            if (ps->n_split++) return lily_err(st, LILY_EUNSUPPORTED, "tokenizer: Split followed by ByteLevel(use_regex) not supported");
            ps->regex = TOK_REGEX_GPT2;
        }
        ps->byte_level = 1;
        return LILY_OK;
    }
    return lily_err(st, LILY_EUNSUPPORTED, "tokenizer: pre-tokenizer \"%s\" not supported", ty);
}

static lily_code check_model(json_t *m, lily_status *st) {
    const char *ty = json_string_value(json_object_get(m, "type"));
    if (ty && strcmp(ty, "BPE")) return lily_err(st, LILY_EUNSUPPORTED, "tokenizer: model type \"%s\" not supported (BPE only)", ty);
    if (jbool(m, "byte_fallback")) return lily_err(st, LILY_EUNSUPPORTED, "tokenizer: byte_fallback not supported");
    const char *k[] = { "continuing_subword_prefix", "end_of_word_suffix" };
    for (int i = 0; i < 2; i++) {
        const char *s = json_string_value(json_object_get(m, k[i]));
        if (s && *s) return lily_err(st, LILY_EUNSUPPORTED, "tokenizer: %s not supported", k[i]);
    }
    json_t *d = json_object_get(m, "dropout");
    if (json_is_number(d) && json_number_value(d) > 0) return lily_err(st, LILY_EUNSUPPORTED, "tokenizer: BPE dropout not supported");
    if (!json_is_object(json_object_get(m, "vocab")) || !json_is_array(json_object_get(m, "merges")))
        return lily_err(st, LILY_EFORMAT, "tokenizer: model needs a vocab object and a merges array");
    return LILY_OK;
}

typedef struct { tok_tokenizer *t; char *scratch; size_t scap; uint32_t rank; lily_status *st; lily_code rc; } merge_ctx;

static int merge_cb(void *p, const char *a, size_t an, const char *b, size_t bn) {
    merge_ctx *m = p;
    m->rc = add_merge(m->t, a, an, b, bn, m->rank++, &m->scratch, &m->scap, m->st);
    return m->rc == LILY_OK;
}

/* fast: the original text with model.vocab and model.merges spans (tok_json.c), or NULL
 * when jansson parsed them into root. */
typedef struct { const char *text; size_t vb, ve, mb, me; } fast_parts;

static lily_code load_root(tok_tokenizer *t, json_t *root, const fast_parts *fast, lily_status *st) {
    json_t *m = json_object_get(root, "model");
    if (!json_is_object(m)) return lily_err(st, LILY_EFORMAT, "tokenizer: no \"model\" object");
    lily_code rc = check_model(m, st);
    if (rc) return rc;
    rc = parse_normalizer(json_object_get(root, "normalizer"), &t->norm, st);
    if (rc) return rc;
    pre_spec ps = { 0 };
    rc = parse_pre(json_object_get(root, "pre_tokenizer"), &ps, st);
    if (rc) return rc;
    if (!ps.byte_level) return lily_err(st, LILY_EUNSUPPORTED, "tokenizer: not a byte-level BPE (no ByteLevel pre-tokenizer)");
    json_t *dec = json_object_get(root, "decoder");
    const char *dty = json_string_value(json_object_get(dec, "type"));
    if (dec && !json_is_null(dec) && (!dty || strcmp(dty, "ByteLevel")))
        return lily_err(st, LILY_EUNSUPPORTED, "tokenizer: decoder \"%s\" not supported (ByteLevel only)", dty ? dty : "?");
    int cap = 0;
    json_t *added = json_object_get(root, "added_tokens");
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i);
        json_t *id = json_object_get(a, "id");
        if (!json_is_integer(id)) return lily_err(st, LILY_EFORMAT, "tokenizer: added token %zu has no integer id", i);
        json_int_t v = json_integer_value(id);
        if (v < 0 || v >= MAX_ID) return lily_err(st, LILY_EFORMAT, "tokenizer: added token id %lld out of range", (long long)v);
        if ((rc = add_added(t, a, (int32_t)v, &cap, st))) return rc;
    }
    vocab_ent *v = NULL;
    size_t k = 0;
    char *arena = NULL;
    if (fast) {
        if (!tok_json_vocab(fast->text + fast->vb, fast->ve - fast->vb, &v, &k, &arena))
            return lily_err(st, LILY_EFORMAT, "tokenizer: model.vocab is not an object of \"token\": id");
    } else {
        json_t *vocab = json_object_get(m, "vocab");
        size_t nv = json_object_size(vocab);
        v = malloc((nv + 1) * sizeof *v);
        if (!v) return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory");
        const char *key; json_t *val;
        size_t klen;
        json_object_keylen_foreach(vocab, key, klen, val) {
            if (!json_is_integer(val)) { free(v); return lily_err(st, LILY_EFORMAT, "tokenizer: vocab entry without an integer id"); }
            json_int_t iv = json_integer_value(val);
            if (iv < 0 || iv >= MAX_ID) { free(v); return lily_err(st, LILY_EFORMAT, "tokenizer: vocabulary id %lld out of range", (long long)iv); }
            v[k].s = key; v[k].n = klen; v[k].id = (int32_t)iv; k++;
        }
    }
    rc = build_tables(t, v, k, 1, st);
    free(v); free(arena);
    if (rc) return rc;
    json_t *unk = json_object_get(m, "unk_token");
    t->unk_id = json_is_string(unk) ? tok_strmap_get(&t->vocab, json_string_value(unk), json_string_length(unk)) : -1;
    t->fuse_unk = jbool(m, "fuse_unk");
    t->ignore_merges = jbool(m, "ignore_merges");
    if (fast) {
        size_t approx = (fast->me - fast->mb) / 8 + 16;
        if (!tok_pairmap_init(&t->merges, (uint32_t)approx)) return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory");
        merge_ctx mc = { t, NULL, 0, 0, st, LILY_OK };
        int ok = tok_json_merges(fast->text + fast->mb, fast->me - fast->mb, merge_cb, &mc);
        free(mc.scratch);
        if (mc.rc) return mc.rc;
        if (!ok) return lily_err(st, LILY_EFORMAT, "tokenizer: model.merges is not an array of \"a b\" or [a, b]");
    } else if ((rc = merges_from_json(t, json_object_get(m, "merges"), st))) return rc;
    return tok_pretok_new(ps.regex, ps.literal, 0, &t->pre, st);
}

static tok_tokenizer *tok_alloc(void) {
    tok_unicode_init();
    tok_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->unk_id = -1;
    tok_cache_init(&t->cache);
    return t;
}

lily_code tok_load_json(const char *json, size_t len, tok_tokenizer **out, lily_status *st) {
    *out = NULL;
    json_error_t je;
    fast_parts fp = { json, 0, 0, 0, 0 };
    int fast = tok_json_find_parts(json, len, &fp.vb, &fp.ve, &fp.mb, &fp.me);
    json_t *root;
    if (fast) { /* jansson reads the rest, with the two big values replaced by {} and [] */
        char *mod = malloc(len + 5);
        if (!mod) return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory");
        size_t a0 = fp.vb < fp.mb ? fp.vb : fp.mb, a1 = fp.vb < fp.mb ? fp.ve : fp.me;
        size_t b0 = fp.vb < fp.mb ? fp.mb : fp.vb, b1 = fp.vb < fp.mb ? fp.me : fp.ve;
        const char *ra = fp.vb < fp.mb ? "{}" : "[]", *rb = fp.vb < fp.mb ? "[]" : "{}";
        size_t w = 0;
        memcpy(mod + w, json, a0); w += a0;
        memcpy(mod + w, ra, 2); w += 2;
        memcpy(mod + w, json + a1, b0 - a1); w += b0 - a1;
        memcpy(mod + w, rb, 2); w += 2;
        memcpy(mod + w, json + b1, len - b1); w += len - b1;
        root = json_loadb(mod, w, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &je);
        free(mod);
    } else root = json_loadb(json, len, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &je);
    if (!root) return lily_err(st, LILY_EFORMAT, "tokenizer: bad JSON at line %d: %s", je.line, je.text);
    tok_tokenizer *t = tok_alloc();
    lily_code rc = t ? (json_is_object(root) ? load_root(t, root, fast ? &fp : NULL, st)
                                             : lily_err(st, LILY_EFORMAT, "tokenizer: JSON is not an object"))
                     : lily_err(st, LILY_ENOMEM, "tokenizer: out of memory");
    json_decref(root);
    if (rc) { tok_free_partial(t); return rc; }
    *out = t;
    return LILY_OK;
}

/* ---- vocab.json + merges.txt + tokenizer_config.json ---- */
static lily_code load_slow(tok_tokenizer *t, const char *dir, lily_status *st) {
    char path[4096];
    size_t len;
    lily_code rc = LILY_OK;
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    char *vtext = lily_read_file(path, &len, st);
    if (!vtext) return st ? st->code : LILY_EIO;
    json_error_t je;
    json_t *cfg = NULL;
    vocab_ent *v = NULL;
    size_t k = 0;
    char *arena = NULL;
    int vok = tok_json_vocab(vtext, len, &v, &k, &arena);
    free(vtext);
    if (!vok) return lily_err(st, LILY_EFORMAT, "tokenizer: %s is not a JSON object of \"token\": id", path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    struct stat sb;
    const char *regex = TOK_REGEX_QWEN2;
    int cap = 0;
    if (!stat(path, &sb)) {
        char *ctext = lily_read_file(path, &len, st);
        if (!ctext) { rc = st ? st->code : LILY_EIO; goto out; }
        cfg = json_loadb(ctext, len, JSON_ALLOW_NUL, &je);
        free(ctext);
        if (!json_is_object(cfg)) { rc = lily_err(st, LILY_EFORMAT, "tokenizer: %s is not a JSON object", path); goto out; }
        json_t *re = json_object_get(cfg, "pretokenize_regex");
        if (json_is_string(re)) regex = json_string_value(re);
        json_t *ad = json_object_get(cfg, "added_tokens_decoder");
        const char *key; json_t *val;
        json_object_foreach(ad, key, val) {
            char *end; long id = strtol(key, &end, 10);
            if (*end || id < 0 || id >= MAX_ID) { rc = lily_err(st, LILY_EFORMAT, "tokenizer: added_tokens_decoder key \"%s\"", key); goto out; }
            if ((rc = add_added(t, val, (int32_t)id, &cap, st))) goto out;
        }
    }
    rc = build_tables(t, v, k, 0, st); /* transformers keeps added_tokens_decoder's ids */
    if (rc) goto out;
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    char *mtext = lily_read_file(path, &len, st);
    if (!mtext) { rc = st ? st->code : LILY_EIO; goto out; }
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += mtext[i] == '\n';
    if (!tok_pairmap_init(&t->merges, (uint32_t)lines)) { free(mtext); rc = lily_err(st, LILY_ENOMEM, "tokenizer: out of memory"); goto out; }
    char *scratch = NULL; size_t scap = 0;
    uint32_t rank = 0;
    for (char *p = mtext, *e = mtext + len; p < e && rc == LILY_OK;) {
        char *nl = memchr(p, '\n', (size_t)(e - p));
        char *le = nl ? nl : e;
        char *a = p;
        p = nl ? nl + 1 : e;
        while (le > a && (le[-1] == '\r' || le[-1] == ' ')) le--;
        while (a < le && *a == ' ') a++;
        if (a == le || *a == '#') continue;
        char *sp = memchr(a, ' ', (size_t)(le - a));
        if (!sp) { rc = lily_err(st, LILY_EFORMAT, "tokenizer: merges.txt line %u has one token", rank + 1); break; }
        char *b = sp;
        while (b < le && *b == ' ') b++;
        rc = add_merge(t, a, (size_t)(sp - a), b, (size_t)(le - b), rank++, &scratch, &scap, st);
    }
    free(scratch);
    free(mtext);
    if (rc) goto out;
    t->norm = TOK_NORM_NFC; /* Qwen2Tokenizer normalizes to NFC */
    rc = tok_pretok_new(regex, 0, 0, &t->pre, st);
out:
    free(v); free(arena);
    json_decref(cfg);
    return rc;
}

lily_code tok_load(const char *path, tok_tokenizer **out, lily_status *st) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb)) return lily_err(st, LILY_EIO, "tokenizer: cannot open %s", path);
    char file[4096];
    if (S_ISDIR(sb.st_mode)) {
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
        if (stat(file, &sb)) {
            snprintf(file, sizeof file, "%s/vocab.json", path);
            if (stat(file, &sb))
                return lily_err(st, LILY_EIO, "tokenizer: %s has neither tokenizer.json nor vocab.json + merges.txt", path);
            tok_tokenizer *t = tok_alloc();
            if (!t) return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory");
            lily_code rc = load_slow(t, path, st);
            if (rc) { tok_free(t); return rc; }
            *out = t;
            return LILY_OK;
        }
        path = file;
    }
    size_t len;
    char *text = lily_read_file(path, &len, st);
    if (!text) return st ? st->code : LILY_EIO;
    lily_code rc = tok_load_json(text, len, out, st);
    free(text);
    return rc;
}

lily_code tok_from_parts(const char *const *vocab, int n_vocab, const char *const *merges,
                         int n_merges, const tok_added *added, int n_added, int norm,
                         const char *regex, tok_tokenizer **out, lily_status *st) {
    *out = NULL;
    tok_tokenizer *t = tok_alloc();
    if (!t) return lily_err(st, LILY_ENOMEM, "tokenizer: out of memory");
    lily_code rc = LILY_OK;
    vocab_ent *v = malloc(((size_t)n_vocab + 1) * sizeof *v);
    t->added = calloc((size_t)n_added + 1, sizeof *t->added);
    if (!v || !t->added) rc = lily_err(st, LILY_ENOMEM, "tokenizer: out of memory");
    for (int i = 0; !rc && i < n_added; i++) {
        t->added[i] = added[i];
        t->added[i].content = malloc(added[i].len + 1);
        if (!t->added[i].content) { rc = lily_err(st, LILY_ENOMEM, "tokenizer: out of memory"); break; }
        memcpy(t->added[i].content, added[i].content, added[i].len);
        t->added[i].content[added[i].len] = 0;
        t->n_added++;
    }
    for (int i = 0; !rc && i < n_vocab; i++) { v[i].s = vocab[i]; v[i].n = strlen(vocab[i]); v[i].id = i; }
    if (!rc) rc = build_tables(t, v, (size_t)n_vocab, 0, st);
    free(v);
    if (!rc && !tok_pairmap_init(&t->merges, (uint32_t)n_merges)) rc = lily_err(st, LILY_ENOMEM, "tokenizer: out of memory");
    char *scratch = NULL; size_t scap = 0;
    for (int i = 0; !rc && i < n_merges; i++) {
        const char *sp = strchr(merges[i], ' ');
        if (!sp) { rc = lily_err(st, LILY_EFORMAT, "tokenizer: merge %d has no space", i); break; }
        rc = add_merge(t, merges[i], (size_t)(sp - merges[i]), sp + 1, strlen(sp + 1), (uint32_t)i, &scratch, &scap, st);
    }
    free(scratch);
    t->norm = norm;
    if (!rc) rc = tok_pretok_new(regex, 0, 0, &t->pre, st);
    if (rc) { tok_free(t); return rc; }
    *out = t;
    return LILY_OK;
}
