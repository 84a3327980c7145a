/* gram_grammar: the byte-level grammar builder and the nondeterministic pushdown matcher
 * (see gram_priv.h for why positions, stacks and stack sets look the way they do). */
#include <stdlib.h>
#include <string.h>
#include "text/gram_priv.h"
#include "util/util.h"

static int grow(void **p, int *cap, int need, size_t esz) {
    if (need <= *cap) return 0;
    int nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * esz);
    if (!q) return -1;
    *p = q; *cap = nc;
    return 0;
}

gram_grammar *gram_g_new(void) {
    gram_grammar *g = calloc(1, sizeof *g);
    if (g) g->root = -1;
    return g;
}

void gram_free(gram_grammar *g) {
    if (!g) return;
    free(g->sets); free(g->el); free(g->pend); free(g->alt_off); free(g->alts);
    free(g->str_rule_id); free(g->str_rem); free(g->str_flags); free(g->str_hot); free(g->str_pos); free(g->str_pos_idx);
    for (int i = 0; i < g->n_added; i++) free(g->added[i]);
    free(g->added);
    free(g);
}

int gram_g_rule(gram_grammar *g) {
    if (g->n_rules >= GRAM_MAX_RULES) { g->oom = 2; return -1; }
    return g->n_rules++;
}

int gram_g_set(gram_grammar *g, const gram_set *s) {
    /* literal bytes repeat a lot; a short backwards scan finds most duplicates */
    for (int i = g->n_sets - 1; i >= 0 && i >= g->n_sets - 64; i--)
        if (!memcmp(&g->sets[i], s, sizeof *s)) return i;
    if (grow((void **)&g->sets, &g->cap_sets, g->n_sets + 1, sizeof *s)) { g->oom = 1; return 0; }
    g->sets[g->n_sets] = *s;
    return g->n_sets++;
}

int gram_g_byte(gram_grammar *g, unsigned b) {
    gram_set s; memset(&s, 0, sizeof s); gram_set_add(&s, b & 255);
    return gram_g_set(g, &s);
}

int32_t gram_g_alt(gram_grammar *g, int r, const int32_t *e, int n) {
    if (r < 0 || g->n_el + n + 1 > GRAM_MAX_ELEMS) { g->oom = 2; return 0; }
    if (grow((void **)&g->el, &g->cap_el, g->n_el + n + 1, sizeof(int32_t)) ||
        grow((void **)&g->pend, &g->cap_pend, g->n_pend + 2, sizeof(int32_t))) { g->oom = 1; return 0; }
    int32_t start = g->n_el;
    for (int i = 0; i < n; i++) g->el[g->n_el++] = e[i];
    g->el[g->n_el++] = GRAM_END;
    g->pend[g->n_pend++] = r; g->pend[g->n_pend++] = start;
    return start;
}

void gram_g_str(gram_grammar *g, int r, int rem, int flags, const gram_set *hot) {
    if (r < 0) return;
    if (grow((void **)&g->str_rule_id, &g->cap_str, g->n_str + 1, sizeof(int32_t))) { g->oom = 1; return; }
    int32_t *q = realloc(g->str_rem, sizeof(int32_t) * (size_t)g->cap_str); /* same capacity */
    if (q) g->str_rem = q;
    int32_t *f = realloc(g->str_flags, sizeof(int32_t) * (size_t)g->cap_str);
    if (f) g->str_flags = f;
    gram_set *h = realloc(g->str_hot, sizeof(gram_set) * (size_t)g->cap_str);
    if (h) g->str_hot = h;
    if (!q || !f || !h) { g->oom = 1; return; }
    if (hot) g->str_hot[g->n_str] = *hot; else memset(&g->str_hot[g->n_str], 0, sizeof(gram_set));
    g->str_rule_id[g->n_str] = r; g->str_rem[g->n_str] = rem; g->str_flags[g->n_str++] = flags;
}

void gram_g_added(gram_grammar *g, const char *content) {
    for (int i = 0; i < g->n_added; i++) if (!strcmp(g->added[i], content)) return;
    char **a = realloc(g->added, sizeof(char *) * ((size_t)g->n_added + 1));
    if (!a) { g->oom = 1; return; }
    g->added = a;
    if (!(a[g->n_added] = strdup(content))) { g->oom = 1; return; }
    g->n_added++;
}

static const gram_grammar *sort_g;
static int cmp_pos(const void *a, const void *b) {
    int32_t x = sort_g->str_pos[*(const int32_t *)a], y = sort_g->str_pos[*(const int32_t *)b];
    return x < y ? -1 : x > y;
}

/* the sorted map from string-body alternative starts to registry entries */
static int str_index(gram_grammar *g) {
    int n = 0;
    for (int i = 0; i < g->n_str; i++) n += g->alt_off[g->str_rule_id[i] + 1] - g->alt_off[g->str_rule_id[i]];
    if (!n) return 0;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *idx = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *ord = malloc(sizeof(int32_t) * (size_t)n);
    if (!pos || !idx || !ord) { free(pos); free(idx); free(ord); return -1; }
    int k = 0;
    for (int i = 0; i < g->n_str; i++)
        for (int a = g->alt_off[g->str_rule_id[i]]; a < g->alt_off[g->str_rule_id[i] + 1]; a++) {
            pos[k] = g->alts[a]; idx[k] = i; ord[k] = k; k++;
        }
    g->str_pos = pos;
    sort_g = g; /* single-threaded per grammar build; qsort has no context argument */
    static int busy;
    while (__atomic_exchange_n(&busy, 1, __ATOMIC_ACQUIRE)) { }
    qsort(ord, (size_t)n, sizeof *ord, cmp_pos);
    __atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
    int32_t *p2 = malloc(sizeof(int32_t) * (size_t)n), *i2 = malloc(sizeof(int32_t) * (size_t)n);
    if (!p2 || !i2) { free(p2); free(i2); free(idx); free(ord); g->str_pos = NULL; free(pos); return -1; }
    for (int j = 0; j < n; j++) { p2[j] = pos[ord[j]]; i2[j] = idx[ord[j]]; }
    free(pos); free(idx); free(ord);
    g->str_pos = p2; g->str_pos_idx = i2; g->n_str_pos = n;
    return 0;
}

/* A rule that can reach itself without consuming a byte would make expansion loop
 * forever; schemas like {"$ref": "#"} produce one, so it is refused here. */
static int left_recursive(const gram_grammar *g, const uint8_t *nullable) {
    int n = g->n_rules;
    uint8_t *state = calloc((size_t)n, 1); /* 0 new, 1 on path, 2 done */
    int32_t *stk = malloc(sizeof(int32_t) * 2 * ((size_t)n + 1));
    int bad = 0;
    if (!state || !stk) { free(state); free(stk); return -1; }
    for (int s0 = 0; s0 < n && !bad; s0++) {
        if (state[s0]) continue;
        /* iterative DFS over "left corner" edges: (rule, next alt index, pos in alt) */
        int sp = 0; stk[0] = s0; stk[1] = 0; state[s0] = 1; sp = 1;
        while (sp > 0 && !bad) {
            int r = stk[2 * (sp - 1)], k = stk[2 * (sp - 1) + 1];
            /* walk the k-th "left edge" of r: enumerate (alt, element) pairs lazily */
            int found = -1, idx = 0;
            for (int a = g->alt_off[r]; a < g->alt_off[r + 1] && found < 0; a++)
                for (int32_t p = g->alts[a]; g->el[p] < 0 && g->el[p] != GRAM_END; p++) {
                    int c = GRAM_REF_ID(g->el[p]);
                    if (idx++ == k) { found = c; break; }
                    if (!nullable[c]) break;
                }
            if (found < 0) { state[r] = 2; sp--; continue; }
            stk[2 * (sp - 1) + 1] = k + 1;
            if (state[found] == 1) { bad = 1; break; }
            if (state[found] == 0) { state[found] = 1; stk[2 * sp] = found; stk[2 * sp + 1] = 0; sp++; }
        }
    }
    free(state); free(stk);
    return bad;
}

lily_code gram_g_finish(gram_grammar *g, int root, lily_status *st) {
    if (g->oom == 1) return lily_err(st, LILY_ENOMEM, "grammar: out of memory");
    if (g->oom == 2) return lily_err(st, LILY_EINVAL, "schema too large: the grammar exceeds %d rules or %d elements",
                                     GRAM_MAX_RULES, GRAM_MAX_ELEMS);
    int n = g->n_rules, na = g->n_pend / 2;
    g->alt_off = calloc((size_t)n + 1, sizeof(int32_t));
    g->alts = malloc(sizeof(int32_t) * ((size_t)na + 1));
    if (!g->alt_off || !g->alts) return lily_err(st, LILY_ENOMEM, "grammar: out of memory");
    for (int i = 0; i < na; i++) g->alt_off[g->pend[2 * i] + 1]++;
    for (int r = 0; r < n; r++) g->alt_off[r + 1] += g->alt_off[r];
    int32_t *fill = calloc((size_t)n + 1, sizeof(int32_t));
    if (!fill) return lily_err(st, LILY_ENOMEM, "grammar: out of memory");
    for (int i = 0; i < na; i++) {
        int r = g->pend[2 * i];
        g->alts[g->alt_off[r] + fill[r]++] = g->pend[2 * i + 1];
    }
    free(fill);
    free(g->pend); g->pend = NULL; g->n_pend = g->cap_pend = 0;
    g->root = root;
    /* nullable rules by fixpoint, then the left-recursion check */
    uint8_t *nul = calloc((size_t)n + 1, 1);
    if (!nul) return lily_err(st, LILY_ENOMEM, "grammar: out of memory");
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < n; r++) {
            if (nul[r]) continue;
            for (int a = g->alt_off[r]; a < g->alt_off[r + 1] && !nul[r]; a++) {
                int32_t p = g->alts[a];
                while (g->el[p] != GRAM_END && g->el[p] < 0 && nul[GRAM_REF_ID(g->el[p])]) p++;
                if (g->el[p] == GRAM_END) { nul[r] = 1; changed = 1; }
            }
        }
    }
    int lr = left_recursive(g, nul);
    free(nul);
    if (lr < 0) return lily_err(st, LILY_ENOMEM, "grammar: out of memory");
    if (lr) return lily_err(st, LILY_EINVAL, "schema is left-recursive: a $ref reaches itself before any value byte");
    if (str_index(g)) return lily_err(st, LILY_ENOMEM, "grammar: out of memory");
    return LILY_OK;
}

/* ---- stack sets ---- */

void gram_sset_init(gram_sset *s) { memset(s, 0, sizeof *s); }
void gram_sset_free(gram_sset *s) { free(s->buf); free(s->hash); memset(s, 0, sizeof *s); }
void gram_sset_clear(gram_sset *s) {
    if (s->n && s->hash) memset(s->hash, 0, s->hcap * sizeof(int32_t));
    s->len = 0; s->n = 0; s->overflow = 0;
}

static int sset_reserve(gram_sset *s, size_t need) {
    if (need <= s->cap) return 0;
    size_t nc = s->cap ? s->cap : 256;
    while (nc < need) nc *= 2;
    int32_t *q = realloc(s->buf, nc * sizeof(int32_t));
    if (!q) return -1;
    s->buf = q; s->cap = nc;
    return 0;
}

static uint32_t stack_hash(const int32_t *d, int n) {
    uint32_t h = 2166136261u ^ (uint32_t)n;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)d[i]) * 16777619u;
    return h;
}

/* Adds stack d[0..n) unless present; returns 0, or -1 on overflow. */
int gram_sset_add(gram_sset *s, const int32_t *d, int n) {
    if (s->n >= GRAM_MAX_STACKS) { s->overflow = 1; return -1; }
    if ((size_t)(s->n + 1) * 2 > s->hcap) {
        size_t nc = s->hcap ? s->hcap * 2 : 64;
        int32_t *h = calloc(nc, sizeof(int32_t));
        if (!h) { s->overflow = 1; return -1; }
        for (size_t o = 0; o < s->len; o += (size_t)s->buf[o] + 1) {
            size_t i = stack_hash(s->buf + o + 1, s->buf[o]) & (nc - 1);
            while (h[i]) i = (i + 1) & (nc - 1);
            h[i] = (int32_t)o + 1;
        }
        free(s->hash); s->hash = h; s->hcap = nc;
    }
    size_t i = stack_hash(d, n) & (s->hcap - 1);
    while (s->hash[i]) {
        const int32_t *e = s->buf + s->hash[i] - 1;
        if (e[0] == n && !memcmp(e + 1, d, (size_t)n * sizeof(int32_t))) return 0;
        i = (i + 1) & (s->hcap - 1);
    }
    if (sset_reserve(s, s->len + (size_t)n + 1)) { s->overflow = 1; return -1; }
    s->hash[i] = (int32_t)s->len + 1;
    s->buf[s->len] = n;
    memcpy(s->buf + s->len + 1, d, (size_t)n * sizeof(int32_t));
    s->len += (size_t)n + 1; s->n++;
    return 0;
}

/* The work list holds stacks as [p0..p_top, depth] so the last one can be popped. */
static int work_push(gram_sset *w, const int32_t *d, int n, int32_t top) {
    if (sset_reserve(w, w->len + (size_t)n + 2)) return -1;
    if (n) memcpy(w->buf + w->len, d, (size_t)n * sizeof(int32_t));
    w->buf[w->len + n] = top;
    w->buf[w->len + n + 1] = n + 1;
    w->len += (size_t)n + 2;
    return 0;
}

/* Expands every stack on the work list until its top is a byte set (or it is empty). */
static int closure(const gram_grammar *g, gram_sset *w, gram_sset *out) {
    long budget = (long)GRAM_MAX_STACKS * 16;
    while (w->len) {
        if (--budget < 0) { out->overflow = 1; return -1; }
        int n = w->buf[w->len - 1];
        w->len -= (size_t)n + 1;
        int32_t *d = w->buf + w->len; /* stays valid until the next push */
        for (;;) {
            if (n == 0) { if (gram_sset_add(out, d, 0)) return -1; break; }
            int32_t p = d[n - 1], e = g->el[p];
            if (e >= 0) { if (gram_sset_add(out, d, n)) return -1; break; }
            if (e == GRAM_END) { n--; continue; }
            int r = GRAM_REF_ID(e);
            if (g->el[p + 1] == GRAM_END) n--; else d[n - 1] = p + 1;
            if (n + 1 > GRAM_MAX_DEPTH) break; /* too deep: this parse is dropped */
            int a0 = g->alt_off[r], a1 = g->alt_off[r + 1];
            /* pushing may move w->buf: copy the prefix first */
            size_t base = w->len;
            int32_t tmp_small[64], *tmp = n <= 64 ? tmp_small : malloc((size_t)n * sizeof(int32_t));
            if (!tmp) { out->overflow = 1; return -1; }
            memcpy(tmp, w->buf + base, (size_t)n * sizeof(int32_t));
            for (int a = a1 - 1; a >= a0; a--)
                if (work_push(w, tmp, n, g->alts[a])) { if (tmp != tmp_small) free(tmp); out->overflow = 1; return -1; }
            if (tmp != tmp_small) free(tmp);
            break;
        }
    }
    return 0;
}

int gram_advance(const gram_grammar *g, const gram_sset *in, unsigned b, gram_sset *out, gram_sset *w) {
    gram_sset_clear(out);
    w->len = 0;
    for (size_t o = 0; o < in->len; o += (size_t)in->buf[o] + 1) {
        int n = in->buf[o];
        if (n == 0) continue;
        const int32_t *d = in->buf + o + 1;
        int32_t p = d[n - 1];
        if (!gram_set_has(&g->sets[g->el[p]], b)) continue;
        if (work_push(w, d, n - 1, p + 1)) { out->overflow = 1; break; }
        if (closure(g, w, out)) break;
    }
    if (out->overflow) { gram_sset_clear(out); out->overflow = 1; }
    return out->n;
}

void gram_sset_first(const gram_grammar *g, const gram_sset *s, gram_set *u) {
    memset(u, 0, sizeof *u);
    for (size_t o = 0; o < s->len; o += (size_t)s->buf[o] + 1) {
        int n = s->buf[o];
        if (!n) continue;
        const gram_set *t = &g->sets[g->el[s->buf[o + n]]];
        for (int k = 0; k < 4; k++) u->w[k] |= t->w[k];
    }
}

int gram_sset_accepting(const gram_sset *s) {
    for (size_t o = 0; o < s->len; o += (size_t)s->buf[o] + 1)
        if (s->buf[o] == 0) return 1;
    return 0;
}

static int str_lookup(const gram_grammar *g, int32_t p) {
    int lo = 0, hi = g->n_str_pos - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (g->str_pos[mid] == p) return g->str_pos_idx[mid];
        if (g->str_pos[mid] < p) lo = mid + 1; else hi = mid - 1;
    }
    return -1;
}

int gram_sset_string_state(const gram_grammar *g, const gram_sset *s, int *flags, const gram_set **hot) {
    if (!g->n_str_pos || s->n == 0 || s->n > 16) return -2;
    const int32_t *a = s->buf;
    int n = a[0];
    if (n == 0) return -2;
    int idx = str_lookup(g, a[n]);
    if (idx < 0) return -2;
    int r = g->str_rule_id[idx];
    if (s->n != g->alt_off[r + 1] - g->alt_off[r]) return -2;
    /* deduplicated stacks with one shared prefix and every top an alternative of r: then
     * the tops are exactly r's alternatives */
    for (const int32_t *b = a + n + 1; b < s->buf + s->len; b += b[0] + 1)
        if (b[0] != n || memcmp(a + 1, b + 1, (size_t)(n - 1) * 4) || str_lookup(g, b[n]) != idx) return -2;
    *flags = g->str_flags[idx];
    const gram_set *h = &g->str_hot[idx];
    *hot = h->w[0] | h->w[1] | h->w[2] | h->w[3] ? h : NULL;
    return g->str_rem[idx];
}

/* ---- matcher ---- */

lily_code gram_matcher_new(const gram_grammar *g, gram_matcher **out, lily_status *st) {
    *out = NULL;
    gram_matcher *m = calloc(1, sizeof *m);
    if (!m) return lily_err(st, LILY_ENOMEM, "grammar: out of memory");
    m->g = g;
    gram_sset_init(&m->cur); gram_sset_init(&m->tmp); gram_sset_init(&m->tmp2); gram_sset_init(&m->work);
    /* start: one stack calling the root rule */
    int32_t start_pos;
    {
        /* the root is entered through its alternatives directly */
        m->work.len = 0;
        for (int a = g->alt_off[g->root + 1] - 1; a >= g->alt_off[g->root]; a--) {
            start_pos = g->alts[a];
            if (work_push(&m->work, NULL, 0, start_pos)) { gram_matcher_free(m); return lily_err(st, LILY_ENOMEM, "grammar: out of memory"); }
        }
        if (closure(g, &m->work, &m->cur) || m->cur.overflow) {
            gram_matcher_free(m);
            return lily_err(st, LILY_EINVAL, "grammar: the start state exceeds %d parse stacks", GRAM_MAX_STACKS);
        }
    }
    *out = m;
    return LILY_OK;
}

void gram_scratch_free(struct gram_scratch *s); /* gram_vocab.c */

void gram_matcher_free(gram_matcher *m) {
    if (!m) return;
    gram_sset_free(&m->cur); gram_sset_free(&m->tmp); gram_sset_free(&m->tmp2); gram_sset_free(&m->work);
    gram_scratch_free(m->scratch);
    free(m);
}

int gram_matcher_accept_bytes(gram_matcher *m, const char *bytes, size_t n) {
    if (n == 0) return 1;
    const gram_sset *src = &m->cur;
    for (size_t i = 0; i < n; i++) {
        gram_sset *dst = (i & 1) ? &m->tmp2 : &m->tmp;
        if (gram_advance(m->g, src, (uint8_t)bytes[i], dst, &m->work) == 0) return 0;
        src = dst;
    }
    gram_sset t = m->cur; m->cur = *(gram_sset *)src; *(gram_sset *)src = t;
    return 1;
}

int gram_matcher_can_end(const gram_matcher *m) { return gram_sset_accepting(&m->cur); }

int gram_matcher_must_end(const gram_matcher *m) {
    for (size_t o = 0; o < m->cur.len; o += (size_t)m->cur.buf[o] + 1)
        if (m->cur.buf[o] != 0) return 0;
    return 1;
}
