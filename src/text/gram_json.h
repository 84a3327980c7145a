/* gram_json: the JSON building blocks of schema grammars (whitespace, strings, numbers,
 * literals, arrays and objects as rule chains), shared by gram_schema.c. Internal. */
#ifndef LILY_GRAM_JSON_H
#define LILY_GRAM_JSON_H
#include <jansson.h>
#include "text/gram_priv.h"

#define SC_MAX_BOUND 1000
#define SC_MAX_NEST 64

/* compile state: the grammar being built, the schema root, the first error, the JSON
 * pointer of the node being compiled, $ref targets already given a rule (recursion), and
 * the shared rules built once per grammar (stored +1, 0 = not built yet) */
typedef struct {
    gram_grammar *g;
    json_t *root;
    lily_status *st;
    lily_code err;
    char ptr[512];
    int nest;
    json_t **memo_node; int *memo_rule; int n_memo, cap_memo;
    int ws, str, strbody, any, esc, num, integer, null_r, bool_r;
    int32_t u8[13]; int u8_ok; /* UTF-8 byte-set elements (gj_u8_set) */
    /* Byte strings no JSON string may contain as written (before unescaping), e.g. a tool
     * call's "</parameter>" that its parser cuts at: ASCII, without '"' or '\\', at most
     * GJ_FORBID_LEN bytes. Literals then escape '/' (JSON_ESCAPE_SLASH), which breaks every
     * such string that contains "</". Set before the first rule is built. */
    const char *const *forbid; int n_forbid;
} gj_ctx;
#define GJ_FORBID_LEN 15
/* json_dumps flags for literals under c (see forbid) */
size_t gj_dump_flags(const gj_ctx *c);

int gj_fail(gj_ctx *c, const char *fmt, const char *a);
int gj_rule(gj_ctx *c);
void gj_alt(gj_ctx *c, int r, const int32_t *e, int n);
int32_t gj_ref(int r);
int32_t gj_byte_el(gj_ctx *c, unsigned b);
int32_t gj_range_el(gj_ctx *c, unsigned lo, unsigned hi, const char *extra);
int gj_lit(gj_ctx *c, const char *s, size_t n);
int gj_rep(gj_ctx *c, int32_t el, int lo, int hi);
int gj_ws(gj_ctx *c);
int gj_uesc(gj_ctx *c);
int gj_esc(gj_ctx *c);
int gj_str_free(gj_ctx *c);   /* '"' body; c->strbody - 1 is the body rule */
/* UTF-8: the byte-set element for class k (see gram_json.c), a multibyte character's
 * byte sets (class i of 7: lead set then continuation sets, returns their count), and the
 * valid range of the next continuation byte after lead byte `lead` and j continuations */
int32_t gj_u8_set(gj_ctx *c, int k);
int gj_u8_seq(gj_ctx *c, int i, int32_t *out);
int gj_u8_len(unsigned lead);
void gj_u8_cont(unsigned lead, int j, unsigned *lo, unsigned *hi);
int gj_str_bounded(gj_ctx *c, int lo, int hi);
int gj_number(gj_ctx *c, int integer);
int gj_lit_rule(gj_ctx *c, int *slot, const char *s);
int gj_null_r(gj_ctx *c);
int gj_bool_r(gj_ctx *c);
int gj_array_of(gj_ctx *c, const int *prefix, int np, int extra, int lo, int hi);
int gj_object_of(gj_ctx *c, int n, int *keys, const int *vals, const char *opt, int extra, int extra_key);
int gj_any(gj_ctx *c);
/* the value rule of schema s, whose $refs resolve against root; ptr is the JSON pointer
 * that error messages give for s ("" for the root) */
int gj_schema(gj_ctx *c, json_t *root, json_t *s, const char *ptr);

#endif
