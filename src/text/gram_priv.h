/* Internals shared by the gram_* files (grammar.h is the public contract).
 *
 * Why these structures:
 * - A grammar is a flat array of elements (`el`) so that a parse position is one int32:
 *   el[p] >= 0 is a byte set (index into `sets`, 256-bit bitmaps), GRAM_END closes an
 *   alternative, and el[p] <= GRAM_REF(0) references a rule. A rule is a list of
 *   alternative start positions (CSR in alt_off/alts).
 * - A parse stack is then a short array of positions (return addresses below, the
 *   current position on top), and the matcher state is a deduplicated set of such
 *   stacks stored back to back in one int32 buffer ([depth, p0..p_top] per stack): cheap
 *   to copy for accept_token's all-or-nothing advance and for the mask's per-depth DFS.
 * - After expansion every stack's top is a byte set, or the stack is empty (accepting).
 *   Calls in tail position replace the top instead of pushing, so right recursion (the
 *   only repetition we generate) does not grow the stacks.
 */
#ifndef LILY_GRAM_PRIV_H
#define LILY_GRAM_PRIV_H
#include <stdint.h>
#include <stddef.h>
#include "text/grammar.h"

#define GRAM_END (-1)
#define GRAM_REF(r) (-2 - (r))
#define GRAM_REF_ID(e) (-2 - (e))
#define GRAM_MAX_STACKS 4096 /* a state with more stacks refuses the byte */
#define GRAM_MAX_DEPTH 512   /* deeper nesting refuses the byte */
#define GRAM_MAX_RULES 200000
#define GRAM_MAX_ELEMS 2000000

typedef struct { uint64_t w[4]; } gram_set;

static inline int gram_set_has(const gram_set *s, unsigned b) { return (int)((s->w[b >> 6] >> (b & 63)) & 1); }
static inline void gram_set_add(gram_set *s, unsigned b) { s->w[b >> 6] |= 1ull << (b & 63); }

struct gram_grammar {
    gram_set *sets; int n_sets, cap_sets;
    int32_t *el; int n_el, cap_el;
    /* rules under construction: (rule, start) pairs; finalized into CSR */
    int32_t *pend; int n_pend, cap_pend;
    int n_rules;
    int32_t *alt_off; /* n_rules + 1 */
    int32_t *alts;
    int root;
    /* string-body rules (the mask's fast path): a stack set made of one stack per
     * alternative of such a rule, all sharing what lies below, is "inside a string at a
     * character boundary, str_rem[i] more characters allowed (-1 = no limit)" */
    int32_t *str_rule_id, *str_rem, *str_flags; int n_str, cap_str;
    gram_set *str_hot;     /* per entry: first bytes whose tokens must be stepped */
    int32_t *str_pos, *str_pos_idx; int n_str_pos; /* sorted alternative starts -> index */
    /* added tokens (exact contents) the grammar may produce; an added token of the
     * vocabulary is allowed only when listed here and its bytes fit */
    char **added; int n_added;
    int oom;
};

/* builder (gram_grammar.c) */
gram_grammar *gram_g_new(void);
int gram_g_rule(gram_grammar *g);                       /* a new empty rule id, or -1 */
int gram_g_set(gram_grammar *g, const gram_set *s);     /* set index (deduplicated) */
int gram_g_byte(gram_grammar *g, unsigned b);
/* appends an alternative (n elements) to rule r; returns its start position */
int32_t gram_g_alt(gram_grammar *g, int r, const int32_t *e, int n);
lily_code gram_g_finish(gram_grammar *g, int root, lily_status *st);
/* registers rule r as a string body with rem characters left (-1 = unbounded), for the
 * mask's fast path. The promise: from r, a token made of whole "plain" characters whose
 * first byte is not in hot (NULL = none) is allowed iff it has at most rem characters
 * (any count when rem is -1). Plain: flags 0 (JSON strings), ASCII 0x20-0x7f but '"' and
 * '\\', or well-formed multibyte; GRAM_STR_RAW (raw text), ASCII 0x01-0x7f but '<', or
 * well-formed multibyte, where a final '\n' is not counted (it may start the end of the
 * text); GRAM_STR_NOLT, JSON-plain but '<'. Every other token is stepped. */
#define GRAM_STR_RAW 1
#define GRAM_STR_NOLT 2
void gram_g_str(gram_grammar *g, int r, int rem, int flags, const gram_set *hot);
/* lists an added token's content as producible (copied) */
void gram_g_added(gram_grammar *g, const char *content);

/* stack sets */
typedef struct {
    int32_t *buf; size_t len, cap; int n;
    int32_t *hash; size_t hcap; /* offsets+1 into buf, 0 = empty */
    int overflow;
} gram_sset;
void gram_sset_init(gram_sset *s);
void gram_sset_free(gram_sset *s);
void gram_sset_clear(gram_sset *s);
int gram_sset_add(gram_sset *s, const int32_t *d, int n); /* 0, or -1 on overflow */
/* out = the closure of in advanced over byte b; returns out->n */
int gram_advance(const gram_grammar *g, const gram_sset *in, unsigned b, gram_sset *out, gram_sset *work);
/* union of the stacks' top byte sets */
void gram_sset_first(const gram_grammar *g, const gram_sset *s, gram_set *u);
int gram_sset_accepting(const gram_sset *s);
/* >= 0 (characters left) or -1 (no limit) if the set is exactly a registered string
 * body at a character boundary (see gram_g_str; *flags and *hot are its own), else -2 */
int gram_sset_string_state(const gram_grammar *g, const gram_sset *s, int *flags, const gram_set **hot);

/* tests only: 1 makes every mask walk the full trie (the fast paths' reference) */
extern int gram_mask_no_fast;

struct gram_matcher {
    const gram_grammar *g;
    gram_sset cur, tmp, tmp2, work;
    struct gram_scratch *scratch; /* mask's per-depth sets, allocated lazily */
};

#endif
