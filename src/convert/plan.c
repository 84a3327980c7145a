/* Source names -> MLX output tensors: renames, expert splitting/stacking, what is
 * quantized at which width, what stays float, what is dropped. */
#include "convert/plan.h"
#include "util/util.h"
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>

static int starts(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }
static int ends(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* Official name -> MLX name; 0 = dropped (vision tower, MTP head, anything else). */
static int map_name(const char *src, char *out, size_t n) {
    if (starts(src, "model.language_model.")) {
        cv_fmt(out, n, "language_model.model.%s", src + strlen("model.language_model."));
        return 1;
    }
    if (!strcmp(src, "lm_head.weight")) { cv_fmt(out, n, "language_model.lm_head.weight"); return 1; }
    if (starts(src, "model.visual.") || starts(src, "model.mtp.") || starts(src, "model.vision")) return 0;
    if (starts(src, "model.")) { /* text-only checkpoints (…ForCausalLM) */
        cv_fmt(out, n, "language_model.model.%s", src + strlen("model."));
        return 1;
    }
    return 0;
}

static int is_float_src(st_dtype d) { return d == ST_BF16 || d == ST_F16 || d == ST_F32; }

static int is_router(const char *nk) { return ends(nk, "mlp.gate.weight") || ends(nk, "mlp.shared_expert_gate.weight"); }

static int plus_one_norm(const char *nk) {
    return ends(nk, ".input_layernorm.weight") || ends(nk, ".post_attention_layernorm.weight") ||
           !strcmp(nk, "language_model.model.norm.weight") || ends(nk, ".q_norm.weight") || ends(nk, ".k_norm.weight");
}

static cv_item *add_item(cv_plan *p, lily_status *st) {
    cv_item *g = realloc(p->items, (size_t)(p->n_items + 1) * sizeof *g);
    if (!g) { lily_err(st, LILY_ENOMEM, "out of memory"); return NULL; }
    p->items = g;
    cv_item *it = &p->items[p->n_items++];
    memset(it, 0, sizeof *it);
    return it;
}

static lily_code add_slab(cv_item *it, const st_tensor *t, int64_t row0, int64_t nrows, lily_status *st) {
    cv_slab *g = realloc(it->slabs, (size_t)(it->n_slabs + 1) * sizeof *g);
    if (!g) return lily_err(st, LILY_ENOMEM, "out of memory");
    it->slabs = g;
    it->slabs[it->n_slabs++] = (cv_slab){ t, row0, nrows };
    it->in_bytes += (uint64_t)nrows * it->cols * st_dtype_size(t->dtype);
    return LILY_OK;
}

/* A quantized output [lead..., rows, cols]; the caller adds slabs. */
static cv_item *quant_item(cv_plan *p, const char *base, int bits, int group, int ndim, const int64_t *shape,
                           lily_status *st) {
    cv_item *it = add_item(p, st);
    if (!it) return NULL;
    cv_fmt(it->name, sizeof it->name, "%s", base);
    it->bits = bits; it->group = group; it->ndim = ndim;
    it->rows = 1;
    for (int i = 0; i < ndim; i++) it->shape[i] = shape[i];
    for (int i = 0; i < ndim - 1; i++) it->rows *= shape[i];
    it->cols = shape[ndim - 1];
    return it;
}

/* Per-expert layout: `…mlp.experts.N.P.weight` -> N, and the name with N replaced by %d. */
static int expert_index(const char *nk, long *e, char *fmt, size_t n) {
    const char *m = strstr(nk, ".mlp.experts.");
    if (!m) return 0;
    const char *d = m + strlen(".mlp.experts.");
    char *end;
    long v = strtol(d, &end, 10);
    if (end == d || *end != '.' || (d[0] == '0' && end - d > 1)) return 0;
    *e = v;
    cv_fmt(fmt, n, "%.*s%%ld%s", (int)(d - nk), nk, end);
    return 1;
}

static int cmp_item(const void *a, const void *b) { return strcmp(((const cv_item *)a)->name, ((const cv_item *)b)->name); }

lily_code cv_plan_build(const st_set *set, int n_experts, int bits, int group, uint64_t shard_bytes,
                        cv_plan *p, lily_status *st) {
    memset(p, 0, sizeof *p);
    lily_code rc = LILY_OK;
    char nk[512], base[512];
    for (int i = 0; i < set->n_tensors && rc == LILY_OK; i++) {
        const st_tensor *t = &set->tensors[i];
        if (!map_name(t->name, nk, sizeof nk)) { p->n_dropped++; continue; }
        if (!is_float_src(t->dtype)) {
            rc = lily_err(st, LILY_EUNSUPPORTED, "tensor '%s' is %s; convert reads bf16/f16/f32 checkpoints (is it already quantized?)",
                          t->name, st_dtype_name(t->dtype));
            break;
        }
        cv_item *it;
        long e;
        char fmt[512];
        if (ends(nk, ".mlp.experts.gate_up_proj") || ends(nk, ".mlp.experts.down_proj")) {
            int gu = ends(nk, "gate_up_proj");
            if (t->ndim != 3 || (gu && t->shape[1] % 2) || t->shape[2] % group) {
                rc = lily_err(st, LILY_EFORMAT, "tensor '%s' has an unexpected shape for fused experts", t->name);
                break;
            }
            size_t stem = strlen(nk) - strlen(gu ? "experts.gate_up_proj" : "experts.down_proj");
            int64_t E = t->shape[0], R = gu ? t->shape[1] / 2 : t->shape[1], C = t->shape[2];
            for (int part = 0; part < (gu ? 2 : 1) && rc == LILY_OK; part++) {
                cv_fmt(base, sizeof base, "%.*sswitch_mlp.%s", (int)stem, nk, gu ? (part ? "up_proj" : "gate_proj") : "down_proj");
                int64_t sh[3] = { E, R, C };
                if (!(it = quant_item(p, base, bits, group, 3, sh, st))) { rc = LILY_ENOMEM; break; }
                /* gate rows come first in each expert's [2I, H] block, then up rows */
                for (int64_t x = 0; x < E && rc == LILY_OK; x++)
                    rc = add_slab(it, t, x * t->shape[1] + part * R, R, st);
            }
            continue;
        }
        if (expert_index(nk, &e, fmt, sizeof fmt)) {
            if (e >= n_experts) { rc = lily_err(st, LILY_EFORMAT, "tensor '%s': expert %ld but num_experts is %d", t->name, e, n_experts); break; }
            if (!ends(nk, "_proj.weight") || t->ndim != 2 || t->shape[1] % group) {
                rc = lily_err(st, LILY_EFORMAT, "tensor '%s' is not an expert projection this converter knows", t->name);
                break;
            }
            /* Each stacked tensor is made once, when its expert 0 comes by; the others must exist. */
            char srcfmt[512], src[512];
            cv_fmt(srcfmt, sizeof srcfmt, "%s", t->name);
            expert_index(t->name, &e, srcfmt, sizeof srcfmt);
            if (e != 0) {
                cv_fmt(src, sizeof src, srcfmt, 0L);
                if (!st_find(set, src)) { rc = lily_err(st, LILY_EFORMAT, "tensor '%s' exists but '%s' is missing", t->name, src); break; }
                continue;
            }
            const char *proj = strrchr(fmt, '%') + 3;             /* ".gate_proj.weight" */
            cv_fmt(base, sizeof base, "%.*sswitch_mlp%.*s", (int)(strstr(fmt, "experts.") - fmt), fmt,
                     (int)(strlen(proj) - strlen(".weight")), proj);
            int64_t sh[3] = { n_experts, t->shape[0], t->shape[1] };
            if (!(it = quant_item(p, base, bits, group, 3, sh, st))) { rc = LILY_ENOMEM; break; }
            for (long x = 0; x < n_experts && rc == LILY_OK; x++) {
                cv_fmt(src, sizeof src, srcfmt, x);
                const st_tensor *xt = st_find(set, src);
                if (!xt) rc = lily_err(st, LILY_EFORMAT, "expert tensor '%s' is missing", src);
                else if (xt->ndim != 2 || xt->shape[0] != t->shape[0] || xt->shape[1] != t->shape[1] || !is_float_src(xt->dtype))
                    rc = lily_err(st, LILY_EFORMAT, "expert tensor '%s' differs in shape or type from expert 0", src);
                else rc = add_slab(it, xt, 0, xt->shape[0], st);
            }
            continue;
        }
        int rb = is_router(nk) ? 8 : bits, rg = group;
        if (t->ndim == 2 && t->shape[1] % rg == 0 && ends(nk, ".weight") && !strstr(nk, "conv1d")) {
            cv_fmt(base, sizeof base, "%.*s", (int)(strlen(nk) - strlen(".weight")), nk);
            if (!(it = quant_item(p, base, rb, rg, 2, t->shape, st))) { rc = LILY_ENOMEM; break; }
            rc = add_slab(it, t, 0, t->shape[0], st);
            continue;
        }
        /* Kept in float: norms, conv, A_log, dt_bias (and any matrix the groups do not divide). */
        if (t->ndim > 4 || t->ndim < 1) { rc = lily_err(st, LILY_EFORMAT, "tensor '%s' has %d dimensions", t->name, t->ndim); break; }
        if (!(it = add_item(p, st))) { rc = LILY_ENOMEM; break; }
        cv_fmt(it->name, sizeof it->name, "%s", nk);
        it->ndim = t->ndim;
        for (int k = 0; k < t->ndim; k++) it->shape[k] = t->shape[k];
        if (strstr(nk, "conv1d.weight") && t->ndim == 3 && t->shape[1] == 1) { /* [C,1,K] -> [C,K,1], same bytes */
            it->shape[1] = t->shape[2]; it->shape[2] = 1;
        }
        it->rows = 1;
        it->cols = st_numel(t);
        it->out_dt = ends(nk, ".A_log") ? ST_F32 : ST_BF16;
        it->plus_one = plus_one_norm(nk);
        rc = add_slab(it, t, 0, 1, st);
    }
    if (rc == LILY_OK && p->n_items == 0) rc = lily_err(st, LILY_EFORMAT, "no language-model tensors found (names model.language_model.* expected)");
    if (rc != LILY_OK) { cv_plan_free(p); return rc; }
    qsort(p->items, (size_t)p->n_items, sizeof *p->items, cmp_item);
    for (int i = 1; i < p->n_items; i++)
        if (!strcmp(p->items[i].name, p->items[i - 1].name)) {
            rc = lily_err(st, LILY_EFORMAT, "two source tensors map to '%s'", p->items[i].name);
            cv_plan_free(p);
            return rc;
        }
    /* Shards: consecutive items, each file up to shard_bytes (an item never splits). */
    uint64_t cur = 0;
    for (int i = 0; i < p->n_items; i++) {
        cv_item *it = &p->items[i];
        int nt = 0;
        for (int k = 0; k < 3; k++) {
            uint64_t b;
            char nm[300]; st_dtype dt; int nd; int64_t sh[5];
            nt = cv_item_tensor(it, k, nm, sizeof nm, &dt, &nd, sh, &b);
            if (k < nt) it->out_bytes += b;
        }
        p->n_out_tensors += nt;
        if (cur && cur + it->out_bytes > shard_bytes) { p->n_shards++; cur = 0; }
        it->shard = p->n_shards;
        cur += it->out_bytes;
        p->in_bytes += it->in_bytes;
        p->out_bytes += it->out_bytes;
    }
    p->n_shards++;
    return LILY_OK;
}

int cv_item_tensor(const cv_item *it, int k, char *name, size_t n, st_dtype *dt, int *ndim, int64_t *shape,
                   uint64_t *bytes) {
    *ndim = it->ndim;
    for (int i = 0; i < it->ndim; i++) shape[i] = it->shape[i];
    if (!it->bits) {
        cv_fmt(name, n, "%s", it->name);
        *dt = it->out_dt;
        *bytes = (uint64_t)it->cols * st_dtype_size(it->out_dt);
        return 1;
    }
    static const char *suf[3] = { "weight", "scales", "biases" };
    cv_fmt(name, n, "%s.%s", it->name, suf[k]);
    if (k == 0) { *dt = ST_U32; shape[it->ndim - 1] = it->cols * it->bits / 32; }
    else { *dt = ST_BF16; shape[it->ndim - 1] = it->cols / it->group; }
    *bytes = (uint64_t)it->rows * shape[it->ndim - 1] * st_dtype_size(*dt);
    return 3;
}

void cv_plan_free(cv_plan *p) {
    for (int i = 0; i < p->n_items; i++) free(p->items[i].slabs);
    free(p->items);
    memset(p, 0, sizeof *p);
}

uint64_t cv_hash(uint64_t h, const void *p, size_t n) {
    /* 16-bit steps: every tensor's bytes come in even-sized pieces, so the result does
     * not depend on how the writer split them. */
    const uint8_t *b = p;
    LILY_ASSERT(n % 2 == 0);
    for (size_t i = 0; i < n; i += 2) h = (h ^ (uint64_t)(b[i] | b[i + 1] << 8)) * 0x100000001b3ull;
    return h;
}

int cv_fmt(char *out, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int r = vsnprintf(out, n, fmt, ap);
    va_end(ap);
    return r;
}
