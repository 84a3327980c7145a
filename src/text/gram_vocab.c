/* gram_vocab: token bytes, and the token mask as a walk over a byte trie of the vocabulary.
 *
 * Why a trie in preorder: tokens sharing a prefix share the matcher work for it, and a
 * prefix the grammar rejects removes its whole subtree at once. With the nodes stored in
 * preorder plus each node's subtree end, the walk is a loop over an array (no recursion):
 * node i's state is computed from the state one level up, and a dead node jumps to its
 * subtree end. Inside a free JSON string (the commonest place in generated JSON and the
 * one where nearly every token fits) the tokens made only of plain string bytes keep the
 * matcher in the same state, so they are copied from a precomputed mask and only the
 * other tokens (quote, backslash, control bytes) are walked, in a second, small trie.
 *
 * Strings hold well-formed UTF-8 only, and a token may end inside a character, so the
 * precomputed set is the tokens made of whole plain characters (ASCII other than '"',
 * '\\' and controls, or complete well-formed multibyte sequences), with their character
 * counts: at a character boundary of a string with r characters left they are exactly
 * the allowed ones among them with count <= r. Tokens that split a character are in the
 * second trie and stepped; a state inside a character walks the full trie. Raw text
 * (tool-call values, GRAM_STR_RAW) and JSON strings that must not spell a terminator
 * (GRAM_STR_NOLT: plain but '<') have their own plain sets and complement tries, and string
 * states may name "hot" first bytes whose tokens are stepped: their range of the full
 * trie is cleared and walked.
 *
 * Added tokens are kept out of the tries (their text, "<tool_call>", would otherwise be
 * offered wherever '<' fits): the mask steps through the few the grammar lists by name.
 */
#include <stdlib.h>
#include <string.h>
#include "text/gram_priv.h"
#include "util/util.h"

typedef struct {
    int n;                /* nodes; node 0 is the root (empty prefix) */
    uint8_t *byte;
    uint16_t *depth;
    int32_t *end;         /* one past the last node of the subtree */
    int32_t *tok0, *ntok; /* tokens ending here: ids[tok0 .. tok0+ntok) */
    int32_t *ids;
    int max_depth;
} vtrie;

typedef struct {
    uint8_t *mask;        /* 1 for the tokens of the set */
    int32_t *by_len;      /* the set by character count, ascending */
    int32_t len_start[66];/* by_len[len_start[c] ..] have count >= c (c <= 64; 65 = n) */
    int n;
} plainset;

struct gram_vocab {
    int n_vocab;
    uint32_t *off;        /* piece of id i: bytes[off[i] .. off[i+1]) ; empty = never allowed */
    uint8_t *bytes;
    uint16_t *nchars;     /* character counts of the plain tokens (below) */
    /* [0]: tokens made only of whole plain JSON-string characters; [1]: the same for raw
     * text (GRAM_STR_RAW, see gram_priv.h); [2]: [0] without '<' (GRAM_STR_NOLT) */
    plainset plain[3];
    int32_t first_lo[256], first_hi[256]; /* all.ids[lo..hi) start with byte b */
    int32_t first_node[256];              /* all's node for that byte, or -1 */
    uint8_t *is_added;    /* 1 for added tokens: outside the tries, allowed only when listed */
    int32_t *added_ids; int n_added;
    vtrie all, special;   /* every allowed token; the non-plain ones */
    vtrie rawspec;        /* the tokens that are not raw-plain */
    vtrie ltspec;         /* the tokens that are not plain[2] */
};

/* The matcher's mask memory. The mask is a function of the stack set alone (for one
 * grammar and vocabulary), and inside a string the stack set repeats exactly after every
 * token of plain characters, so the ids the walks allowed last time are kept with the
 * stack set they were computed from (key) and replayed when it comes again. */
#define CACHE_MAX_IDS 16384
struct gram_scratch {
    int n; gram_sset *ss; gram_set *first; gram_sset work, a, b;
    const gram_vocab *cv; int32_t *key; size_t key_len, key_cap; /* key_len 0: nothing cached */
    int32_t *ids; int n_ids, cap_ids, recording;
};

/* the number of whole plain characters in p[0..n), or -1 if it is not made of them
 * (kind 1: the raw-text notion of plain, see gram_priv.h, counting a final '\n' as none;
 * kind 2: JSON-plain but '<') */
static int plain_chars(const uint8_t *p, size_t n, int kind) {
    int raw = kind == 1;
    int c = 0;
    for (size_t i = 0; i < n; c++) {
        unsigned b = p[i];
        if (b < 0x80) {
            if (raw ? (b == 0 || b == '<') : (b < 0x20 || b == '"' || b == '\\' || (kind == 2 && b == '<'))) return -1;
            i++;
            continue;
        }
        size_t len = b < 0xc2 ? 0 : b < 0xe0 ? 2 : b < 0xf0 ? 3 : b < 0xf5 ? 4 : 0;
        if (!len || i + len > n) return -1;
        unsigned lo = 0x80, hi = 0xbf;
        if (b == 0xe0) lo = 0xa0; else if (b == 0xed) hi = 0x9f; else if (b == 0xf0) lo = 0x90; else if (b == 0xf4) hi = 0x8f;
        if (p[i + 1] < lo || p[i + 1] > hi) return -1;
        for (size_t k = 2; k < len; k++) if ((p[i + k] & 0xc0) != 0x80) return -1;
        i += len;
    }
    return raw && n && p[n - 1] == '\n' ? c - 1 : c;
}

static const gram_vocab *sort_v;
static int cmp_piece(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = sort_v->off[x + 1] - sort_v->off[x], ly = sort_v->off[y + 1] - sort_v->off[y];
    int c = memcmp(sort_v->bytes + sort_v->off[x], sort_v->bytes + sort_v->off[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static void trie_free(vtrie *t) {
    free(t->byte); free(t->depth); free(t->end); free(t->tok0); free(t->ntok); free(t->ids);
    memset(t, 0, sizeof *t);
}

/* ids (n of them, each non-empty) sorted by bytes, then inserted along the previous path */
static int trie_build(vtrie *t, const gram_vocab *v, int32_t *ids, int n) {
    memset(t, 0, sizeof *t);
    sort_v = v; /* gram_vocab_new is not reentrant for this sort only: guarded below */
    qsort(ids, (size_t)n, sizeof *ids, cmp_piece);
    size_t cap = 1;
    for (int i = 0; i < n; i++) cap += v->off[ids[i] + 1] - v->off[ids[i]];
    t->byte = malloc(cap); t->depth = malloc(cap * 2); t->end = malloc(cap * 4);
    t->tok0 = malloc(cap * 4); t->ntok = calloc(cap, 4); t->ids = ids;
    int32_t *path = malloc(sizeof(int32_t) * 65536);
    if (!t->byte || !t->depth || !t->end || !t->tok0 || !t->ntok || !path) { free(path); return -1; }
    t->n = 1; t->byte[0] = 0; t->depth[0] = 0; path[0] = 0; t->tok0[0] = 0;
    int plen = 0; /* path length in bytes */
    const uint8_t *prev = NULL; uint32_t prevn = 0;
    for (int i = 0; i < n; i++) {
        const uint8_t *s = v->bytes + v->off[ids[i]];
        uint32_t ln = v->off[ids[i] + 1] - v->off[ids[i]];
        if (ln > 65535) ln = 65535;
        uint32_t l = 0;
        while (prev && l < prevn && l < ln && (int)l < plen && prev[l] == s[l]) l++;
        if ((int)l > plen) l = (uint32_t)plen;
        for (int k = (int)l + 1; k <= plen; k++) t->end[path[k]] = t->n; /* close finished subtrees */
        plen = (int)l;
        for (uint32_t k = l; k < ln; k++) {
            int nd = t->n++;
            t->byte[nd] = s[k]; t->depth[nd] = (uint16_t)(k + 1); t->tok0[nd] = i; t->ntok[nd] = 0;
            path[++plen] = nd;
        }
        int last = path[plen];
        if (t->ntok[last] == 0) t->tok0[last] = i;
        t->ntok[last]++;
        if (plen > t->max_depth) t->max_depth = plen;
        prev = s; prevn = ln;
    }
    for (int k = 0; k <= plen; k++) t->end[path[k]] = t->n;
    free(path);
    return 0;
}

lily_code gram_vocab_new(const tok_tokenizer *t, int n_vocab, gram_vocab **out, lily_status *st) {
    *out = NULL;
    if (n_vocab <= 0) return lily_err(st, LILY_EINVAL, "gram_vocab_new: n_vocab %d", n_vocab);
    gram_vocab *v = calloc(1, sizeof *v);
    if (!v) return lily_err(st, LILY_ENOMEM, "grammar vocab: out of memory");
    v->n_vocab = n_vocab;
    int tv = tok_vocab_size(t);
    size_t total = 0;
    for (int i = 0; i < n_vocab && i < tv; i++) {
        size_t ln = 0;
        if (tok_piece(t, i, &ln)) total += ln;
    }
    v->off = malloc(sizeof(uint32_t) * ((size_t)n_vocab + 1));
    v->bytes = malloc(total + 1);
    for (int k = 0; k < 3; k++) {
        v->plain[k].mask = calloc((size_t)n_vocab, 1);
        v->plain[k].by_len = malloc(sizeof(int32_t) * (size_t)n_vocab);
    }
    v->nchars = calloc((size_t)n_vocab, sizeof(uint16_t));
    int32_t *rsids = malloc(sizeof(int32_t) * (size_t)n_vocab), *ltids = malloc(sizeof(int32_t) * (size_t)n_vocab);
    v->is_added = calloc((size_t)n_vocab, 1);
    v->added_ids = malloc(sizeof(int32_t) * (size_t)n_vocab);
    int32_t *all = malloc(sizeof(int32_t) * (size_t)n_vocab), *spec = malloc(sizeof(int32_t) * (size_t)n_vocab);
    if (!v->off || !v->bytes || !v->plain[0].mask || !v->plain[0].by_len || !v->plain[1].mask || !v->plain[1].by_len ||
        !v->plain[2].mask || !v->plain[2].by_len || !v->nchars || !v->is_added || !v->added_ids || !all || !spec ||
        !rsids || !ltids) {
        free(all); free(spec); free(rsids); free(ltids); gram_vocab_free(v);
        return lily_err(st, LILY_ENOMEM, "grammar vocab: out of memory");
    }
    int na = 0, ns = 0, nl = 0, nt = 0;
    size_t o = 0;
    for (int i = 0; i < n_vocab; i++) {
        v->off[i] = (uint32_t)o;
        size_t ln = 0;
        const char *p = i < tv ? tok_piece(t, i, &ln) : NULL;
        if (!p || !ln) continue;
        memcpy(v->bytes + o, p, ln); o += ln;
        if (tok_is_added(t, i)) { v->is_added[i] = 1; v->added_ids[v->n_added++] = i; continue; }
        int nc = plain_chars((const uint8_t *)p, ln, 0), nr = plain_chars((const uint8_t *)p, ln, 1);
        int nlt = plain_chars((const uint8_t *)p, ln, 2);
        v->plain[0].mask[i] = nc >= 0;
        v->plain[1].mask[i] = nr >= 0;
        v->plain[2].mask[i] = nlt >= 0;
        /* the counts agree where both are defined (a JSON-plain token has no '\n') */
        int cnt = nc >= 0 ? nc : nr;
        v->nchars[i] = (uint16_t)(cnt > 65535 ? 65535 : cnt > 0 ? cnt : 0);
        all[na++] = i;
        if (nc < 0) spec[ns++] = i;
        if (nr < 0) rsids[nl++] = i;
        if (nlt < 0) ltids[nt++] = i;
    }
    v->off[n_vocab] = (uint32_t)o;
    /* counting sort of the plain tokens by character count (counts above 64 share a bucket) */
    for (int k = 0; k < 3; k++) {
        plainset *ps = &v->plain[k];
        int cnt[66] = { 0 };
        for (int i = 0; i < n_vocab; i++) if (ps->mask[i]) cnt[v->nchars[i] > 64 ? 64 : v->nchars[i]]++;
        ps->len_start[0] = 0;
        for (int c = 0; c < 65; c++) ps->len_start[c + 1] = ps->len_start[c] + cnt[c];
        ps->n = ps->len_start[65];
        int fill[65];
        memcpy(fill, ps->len_start, sizeof fill);
        for (int i = 0; i < n_vocab; i++)
            if (ps->mask[i]) ps->by_len[fill[v->nchars[i] > 64 ? 64 : v->nchars[i]]++] = i;
    }
    static int busy; /* the sort's comparator reads one global vocab */
    while (__atomic_exchange_n(&busy, 1, __ATOMIC_ACQUIRE)) { }
    int bad = trie_build(&v->all, v, all, na);
    if (!bad) bad = trie_build(&v->special, v, spec, ns); else free(spec);
    if (!bad) bad = trie_build(&v->rawspec, v, rsids, nl); else free(rsids);
    if (!bad) bad = trie_build(&v->ltspec, v, ltids, nt); else free(ltids);
    for (int b = 0; b < 256; b++) { v->first_node[b] = -1; v->first_lo[b] = v->first_hi[b] = 0; }
    for (int32_t i = 1; !bad && i < v->all.n; i = v->all.end[i]) { /* the root's children */
        int b = v->all.byte[i];
        v->first_node[b] = i;
        v->first_lo[b] = v->all.tok0[i];
        v->first_hi[b] = v->all.end[i] < v->all.n ? v->all.tok0[v->all.end[i]] : na;
    }
    __atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
    if (bad) { gram_vocab_free(v); return lily_err(st, LILY_ENOMEM, "grammar vocab: out of memory"); }
    *out = v;
    return LILY_OK;
}

int gram_vocab_size(const gram_vocab *v) { return v->n_vocab; }

void gram_vocab_free(gram_vocab *v) {
    if (!v) return;
    free(v->off); free(v->bytes); free(v->nchars);
    for (int k = 0; k < 3; k++) { free(v->plain[k].mask); free(v->plain[k].by_len); }
    free(v->is_added); free(v->added_ids);
    trie_free(&v->all); trie_free(&v->special); trie_free(&v->rawspec); trie_free(&v->ltspec);
    free(v);
}

void gram_scratch_free(struct gram_scratch *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) gram_sset_free(&s->ss[i]);
    gram_sset_free(&s->work); gram_sset_free(&s->a); gram_sset_free(&s->b);
    free(s->key); free(s->ids);
    free(s->ss); free(s->first); free(s);
}

static struct gram_scratch *scratch_get(gram_matcher *m, int depth) {
    struct gram_scratch *s = m->scratch;
    if (!s) { s = m->scratch = calloc(1, sizeof *s); if (!s) return NULL; }
    if (s->n < depth + 1) {
        gram_sset *ss = realloc(s->ss, sizeof *ss * (size_t)(depth + 1));
        if (!ss) return NULL;
        s->ss = ss;
        gram_set *f = realloc(s->first, sizeof *f * (size_t)(depth + 1));
        if (!f) return NULL;
        s->first = f;
        for (int i = s->n; i <= depth; i++) gram_sset_init(&s->ss[i]);
        s->n = depth + 1;
    }
    return s;
}

static void record(struct gram_scratch *s, int32_t id) {
    if (s->n_ids == s->cap_ids) {
        int nc = s->cap_ids ? 2 * s->cap_ids : 1024;
        int32_t *q = nc <= CACHE_MAX_IDS ? realloc(s->ids, sizeof *q * (size_t)nc) : NULL;
        if (!q) { s->recording = 0; return; } /* too many (or no memory): not cached */
        s->ids = q; s->cap_ids = nc;
    }
    s->ids[s->n_ids++] = id;
}

/* the nodes [i, i1) of the trie (a whole trie: 1, t->n) */
static void walk_range(const gram_matcher *m, const vtrie *t, int32_t i, int32_t i1, uint8_t *allowed,
                       struct gram_scratch *s) {
    const gram_sset *lvl0 = &m->cur;
    gram_sset_first(m->g, lvl0, &s->first[0]);
    while (i < i1) {
        int d = t->depth[i];
        const gram_sset *parent = d == 1 ? lvl0 : &s->ss[d - 1];
        if (!gram_set_has(&s->first[d - 1], t->byte[i]) ||
            gram_advance(m->g, parent, t->byte[i], &s->ss[d], &s->work) == 0) {
            i = t->end[i];
            continue;
        }
        for (int32_t k = 0; k < t->ntok[i]; k++) {
            int32_t id = t->ids[t->tok0[i] + k];
            allowed[id] = 1;
            if (s->recording) record(s, id);
        }
        if (t->end[i] > i + 1) gram_sset_first(m->g, &s->ss[d], &s->first[d]);
        i++;
    }
}

static void walk(const gram_matcher *m, const vtrie *t, uint8_t *allowed, struct gram_scratch *s) {
    walk_range(m, t, 1, t->n, allowed, s);
}

int gram_mask_no_fast;

/* allowed[id] = 1 for the set's tokens of at most rem characters (rem -1: all) */
static void plain_upto(const gram_vocab *v, const plainset *ps, int rem, uint8_t *allowed) {
    if (rem < 0 || rem >= 64) {
        memcpy(allowed, ps->mask, (size_t)v->n_vocab);
        /* counts of 64 and above share the last bucket: clear those beyond rem one by one */
        if (rem >= 0)
            for (int k = ps->len_start[64]; k < ps->n; k++)
                if (v->nchars[ps->by_len[k]] > rem) allowed[ps->by_len[k]] = 0;
        return;
    }
    /* the tokens of at most rem characters are by_len[0 .. len_start[rem+1]) */
    int n_ok = ps->len_start[rem + 1];
    if (2 * n_ok < ps->n) {
        for (int k = 0; k < n_ok; k++) allowed[ps->by_len[k]] = 1;
    } else {
        memcpy(allowed, ps->mask, (size_t)v->n_vocab);
        for (int k = n_ok; k < ps->n; k++) allowed[ps->by_len[k]] = 0;
    }
}

static void replay(const struct gram_scratch *s, uint8_t *allowed) {
    for (int k = 0; k < s->n_ids; k++) allowed[s->ids[k]] = 1;
}

/* is this added token's content one the grammar may produce? */
static int listed(const gram_grammar *g, const uint8_t *p, size_t n) {
    for (int i = 0; i < g->n_added; i++)
        if (strlen(g->added[i]) == n && !memcmp(g->added[i], p, n)) return 1;
    return 0;
}

void gram_matcher_mask(const gram_matcher *m, const gram_vocab *v, uint8_t *allowed) {
    memset(allowed, 0, (size_t)v->n_vocab);
    /* the scratch is the matcher's own memory: a matcher is used by one thread at a time */
    struct gram_scratch *s = scratch_get((gram_matcher *)m, v->all.max_depth + 1);
    if (!s) return; /* out of memory: nothing allowed, the caller sees an empty mask */
    int flags = 0;
    const gram_set *hot = NULL;
    int rem = gram_mask_no_fast ? -2 : gram_sset_string_state(m->g, &m->cur, &flags, &hot);
    int hit = !gram_mask_no_fast && s->key_len && s->cv == v && s->key_len == m->cur.len &&
              !memcmp(s->key, m->cur.buf, m->cur.len * sizeof(int32_t));
    s->recording = !hit && !gram_mask_no_fast;
    if (!hit) s->n_ids = 0;
    if (rem >= -1) {
        int kind = flags & GRAM_STR_RAW ? 1 : flags & GRAM_STR_NOLT ? 2 : 0;
        plain_upto(v, &v->plain[kind], rem, allowed);
        /* tokens starting with a hot byte are all stepped: cleared, then their subtree of the
         * full trie walked (after the other walk, which may also set some of them, exactly) */
        for (int b = 0; hot && b < 256; b++)
            if (gram_set_has(hot, (unsigned)b))
                for (int32_t k = v->first_lo[b]; k < v->first_hi[b]; k++) allowed[v->all.ids[k]] = 0;
        if (hit) { replay(s, allowed); return; }
        walk(m, kind == 1 ? &v->rawspec : kind == 2 ? &v->ltspec : &v->special, allowed, s);
        for (int b = 0; hot && b < 256; b++)
            if (gram_set_has(hot, (unsigned)b) && v->first_node[b] >= 0)
                walk_range(m, &v->all, v->first_node[b], v->all.end[v->first_node[b]], allowed, s);
    } else {
        if (hit) { replay(s, allowed); return; }
        walk(m, &v->all, allowed, s);
    }
    for (int k = 0; k < v->n_added && m->g->n_added; k++) {
        int32_t id = v->added_ids[k];
        const uint8_t *p = v->bytes + v->off[id];
        size_t n = v->off[id + 1] - v->off[id];
        if (!listed(m->g, p, n)) continue;
        const gram_sset *src = &m->cur;
        size_t i = 0;
        for (; i < n; i++) {
            gram_sset *dst = (i & 1) ? &s->b : &s->a;
            if (gram_advance(m->g, src, p[i], dst, &s->work) == 0) break;
            src = dst;
        }
        allowed[id] = i == n;
        if (i == n && s->recording) record(s, id);
    }
    s->key_len = 0;
    if (s->recording) { /* remember this state's walked ids */
        if (m->cur.len > s->key_cap) {
            int32_t *q = realloc(s->key, sizeof *q * m->cur.len);
            if (!q) return;
            s->key = q; s->key_cap = m->cur.len;
        }
        memcpy(s->key, m->cur.buf, m->cur.len * sizeof(int32_t));
        s->key_len = m->cur.len; s->cv = v;
    }
}

int gram_matcher_accept_token(gram_matcher *m, const gram_vocab *v, int32_t id) {
    if (id < 0 || id >= v->n_vocab) return 0;
    uint32_t a = v->off[id], b = v->off[id + 1];
    if (a == b) return 0;
    if (v->is_added[id] && !listed(m->g, v->bytes + a, b - a)) return 0;
    return gram_matcher_accept_bytes(m, (const char *)v->bytes + a, b - a);
}
