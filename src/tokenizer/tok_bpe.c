/* BPE on one pre-tokenized word: byte symbols, merged by lowest rank (leftmost first on
 * ties), as HF does. Short words use a plain scan; long words a heap over a linked list,
 * so no input is quadratic. Results of short words are cached. */
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tok_internal.h"

#define CACHE_SLOTS (1u << 16)
#define CACHE_MAX_KEY 64
#define CACHE_KEYS_MAX ((size_t)8 << 20)
#define CACHE_IDS_MAX ((size_t)2 << 20)
#define SHORT_WORD 32

int tok_ids_push(tok_ids *a, int32_t id) {
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, nc * sizeof *v);
        if (!v) return 0;
        a->v = v; a->cap = nc;
    }
    a->v[a->n++] = id;
    return 1;
}

void tok_cache_init(tok_cache *c) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
}

void tok_cache_free(tok_cache *c) {
    free(c->hash); free(c->key_off); free(c->key_len); free(c->n_ids); free(c->ids_off);
    free(c->keys); free(c->ids);
    pthread_mutex_destroy(&c->mu);
    memset(c, 0, sizeof *c);
}

/* Must hold the lock. Returns the slot holding the key, or the empty slot to use, or
 * UINT32_MAX when the probe ran long (cache treated as full). */
static uint32_t cache_find(const tok_cache *c, uint64_t h, const char *w, size_t n) {
    uint32_t i = (uint32_t)h & (c->cap - 1);
    for (int probe = 0; probe < 32; probe++, i = (i + 1) & (c->cap - 1)) {
        if (!c->hash[i]) return i;
        if (c->hash[i] == h && c->key_len[i] == n && !memcmp(c->keys + c->key_off[i], w, n)) return i;
    }
    return UINT32_MAX;
}

static int cache_get(tok_cache *c, uint64_t h, const char *w, size_t n, tok_ids *out) {
    int hit = 0;
    pthread_mutex_lock(&c->mu);
    if (c->cap) {
        uint32_t i = cache_find(c, h, w, n);
        if (i != UINT32_MAX && c->hash[i]) {
            hit = 1;
            for (uint32_t k = 0; k < c->n_ids[i]; k++)
                if (!tok_ids_push(out, c->ids[c->ids_off[i] + k])) { hit = -1; break; }
        }
    }
    pthread_mutex_unlock(&c->mu);
    return hit;
}

static void cache_put(tok_cache *c, uint64_t h, const char *w, size_t n, const int32_t *ids, size_t k) {
    pthread_mutex_lock(&c->mu);
    if (!c->cap) {
        c->hash = calloc(CACHE_SLOTS, sizeof *c->hash);
        c->key_off = malloc(CACHE_SLOTS * sizeof *c->key_off);
        c->key_len = malloc(CACHE_SLOTS * sizeof *c->key_len);
        c->n_ids = malloc(CACHE_SLOTS * sizeof *c->n_ids);
        c->ids_off = malloc(CACHE_SLOTS * sizeof *c->ids_off);
        c->keys = malloc(CACHE_KEYS_MAX);
        c->ids = malloc(CACHE_IDS_MAX * sizeof *c->ids);
        if (!c->hash || !c->key_off || !c->key_len || !c->n_ids || !c->ids_off || !c->keys || !c->ids) {
            free(c->hash); free(c->key_off); free(c->key_len); free(c->n_ids); free(c->ids_off);
            free(c->keys); free(c->ids);
            c->hash = NULL; c->key_off = NULL; c->key_len = NULL; c->n_ids = NULL; c->ids_off = NULL;
            c->keys = NULL; c->ids = NULL;
            pthread_mutex_unlock(&c->mu);
            return;
        }
        c->cap = CACHE_SLOTS;
    }
    /* Full caches stop growing, like HF's: the first words seen stay. */
    if (c->used * 4 < c->cap * 3 && c->keys_len + n <= CACHE_KEYS_MAX && c->ids_len + k <= CACHE_IDS_MAX) {
        uint32_t i = cache_find(c, h, w, n);
        if (i != UINT32_MAX && !c->hash[i]) {
            memcpy(c->keys + c->keys_len, w, n);
            memcpy(c->ids + c->ids_len, ids, k * sizeof *ids);
            c->hash[i] = h; c->key_off[i] = (uint32_t)c->keys_len; c->key_len[i] = (uint16_t)n;
            c->ids_off[i] = (uint32_t)c->ids_len; c->n_ids[i] = (uint16_t)k;
            c->keys_len += n; c->ids_len += k; c->used++;
        }
    }
    pthread_mutex_unlock(&c->mu);
}

/* Initial symbols: one per byte (a missing byte symbol becomes unk, or is dropped). */
static size_t initial_symbols(const tok_tokenizer *t, const unsigned char *w, size_t n, int32_t *sym) {
    size_t k = 0;
    int prev_unk = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[w[i]];
        if (id >= 0) { sym[k++] = id; prev_unk = 0; continue; }
        if (t->unk_id < 0) continue;
        if (t->fuse_unk && prev_unk) continue;
        sym[k++] = t->unk_id; prev_unk = 1;
    }
    return k;
}

static size_t merge_short(const tok_tokenizer *t, int32_t *sym, size_t k) {
    while (k > 1) {
        uint32_t best = UINT32_MAX; size_t at = 0; int32_t res = 0, r;
        for (size_t i = 0; i + 1 < k; i++) {
            uint32_t rk = tok_pairmap_get(&t->merges, sym[i], sym[i + 1], &r);
            if (rk < best) { best = rk; at = i; res = r; }
        }
        if (best == UINT32_MAX) break;
        sym[at] = res;
        memmove(sym + at + 1, sym + at + 2, (k - at - 2) * sizeof *sym);
        k--;
    }
    return k;
}

/* Binary min-heap of (rank << 32 | left symbol index). */
static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p]; i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c]; i = c;
    }
    if (*n) h[i] = v;
    return top;
}

static int merge_long(const tok_tokenizer *t, int32_t *sym, size_t k, tok_ids *out) {
    int32_t *next = malloc(k * sizeof *next), *prev = malloc(k * sizeof *prev);
    uint64_t *heap = malloc(k * 3 * sizeof *heap); /* k-1 initial + 2 per merge */
    int ok = next && prev && heap;
    if (ok) {
        size_t hn = 0;
        int32_t r;
        for (size_t i = 0; i < k; i++) { next[i] = i + 1 < k ? (int32_t)i + 1 : -1; prev[i] = (int32_t)i - 1; }
        for (size_t i = 0; i + 1 < k; i++) {
            uint32_t rk = tok_pairmap_get(&t->merges, sym[i], sym[i + 1], &r);
            if (rk != UINT32_MAX) heap_push(heap, &hn, ((uint64_t)rk << 32) | i);
        }
        while (hn) {
            uint64_t top = heap_pop(heap, &hn);
            uint32_t rank = (uint32_t)(top >> 32);
            int32_t a = (int32_t)(uint32_t)top, b = next[a];
            if (sym[a] < 0 || b < 0) continue;                   /* a was merged away */
            if (tok_pairmap_get(&t->merges, sym[a], sym[b], &r) != rank) continue; /* stale */
            sym[a] = r;
            sym[b] = -1;
            next[a] = next[b];
            if (next[b] >= 0) prev[next[b]] = a;
            int32_t p = prev[a], q = next[a], r2;
            uint32_t rk;
            if (p >= 0 && (rk = tok_pairmap_get(&t->merges, sym[p], sym[a], &r2)) != UINT32_MAX)
                heap_push(heap, &hn, ((uint64_t)rk << 32) | (uint32_t)p);
            if (q >= 0 && (rk = tok_pairmap_get(&t->merges, sym[a], sym[q], &r2)) != UINT32_MAX)
                heap_push(heap, &hn, ((uint64_t)rk << 32) | (uint32_t)a);
        }
        for (int32_t i = 0; i >= 0 && ok; i = next[i]) ok = tok_ids_push(out, sym[i]);
    }
    free(next); free(prev); free(heap);
    return ok;
}

/* ignore_merges: a word that is itself a vocabulary entry is emitted whole. */
static int32_t whole_word_id(const tok_tokenizer *t, const unsigned char *w, size_t n) {
    char buf[4 * 64];
    if (n > 64) {
        char *big = malloc(n * 2);
        if (!big) return -1;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t cp = tok_byte_to_cp[w[i]];
            if (cp < 0x80) big[m++] = (char)cp;
            else { big[m++] = (char)(0xC0 | (cp >> 6)); big[m++] = (char)(0x80 | (cp & 0x3F)); }
        }
        int32_t id = tok_strmap_get(&t->vocab, big, m);
        free(big);
        return id;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = tok_byte_to_cp[w[i]];
        if (cp < 0x80) buf[m++] = (char)cp;
        else { buf[m++] = (char)(0xC0 | (cp >> 6)); buf[m++] = (char)(0x80 | (cp & 0x3F)); }
    }
    return tok_strmap_get(&t->vocab, buf, m);
}

int tok_bpe_word(const tok_tokenizer *t, const char *w, size_t n, tok_ids *out) {
    const unsigned char *u = (const unsigned char *)w;
    if (n == 1 && t->byte_id[u[0]] >= 0) return tok_ids_push(out, t->byte_id[u[0]]);
    if (t->ignore_merges) {
        int32_t id = whole_word_id(t, u, n);
        if (id >= 0 && !(t->flags[id] & 1)) return tok_ids_push(out, id);
    }
    tok_cache *c = (tok_cache *)&t->cache;
    uint64_t h = 0;
    if (n <= CACHE_MAX_KEY) {
        h = tok_hash_bytes(w, n);
        int hit = cache_get(c, h, w, n, out);
        if (hit) return hit > 0;
    }
    int32_t small[SHORT_WORD];
    int32_t *sym = n <= SHORT_WORD ? small : malloc(n * sizeof *sym);
    if (!sym) return 0;
    size_t k = initial_symbols(t, u, n, sym);
    int ok = 1;
    if (k <= SHORT_WORD) {
        k = merge_short(t, sym, k);
        size_t base = out->n;
        for (size_t i = 0; i < k && ok; i++) ok = tok_ids_push(out, sym[i]);
        if (ok && n <= CACHE_MAX_KEY) cache_put(c, h, w, n, out->v + base, k);
    } else {
        ok = merge_long(t, sym, k, out);
    }
    if (sym != small) free(sym);
    return ok;
}
