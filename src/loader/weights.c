#include "loader/weights.h"
#include "util/util.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    lily_weights *w;
    lily_status *st;
    const char *P;   /* text-model prefix */
    int mlx;         /* MLX layout: norms already 1+w */
    char name[512];
} ctx_t;

static const char *nm(ctx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *nm(ctx_t *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->name, sizeof c->name, fmt, ap);
    va_end(ap);
    return c->name;
}

static st_tensor *find(ctx_t *c, const char *name) {
    return (st_tensor *)st_find(&c->w->files, name);
}

static lw_type lw_of(st_dtype d) {
    return d == ST_F32 ? LW_F32 : d == ST_BF16 ? LW_BF16 : d == ST_F16 ? LW_F16 : (lw_type)-1;
}

static void shape_str(const st_tensor *t, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

static lily_code bad_shape(ctx_t *c, const st_tensor *t, const char *want) {
    char s[128];
    shape_str(t, s, sizeof s);
    return lily_err(c->st, LILY_EFORMAT, "tensor '%s' in %s has shape %s %s, expected %s", t->name,
                    st_file_of(&c->w->files, t), st_dtype_name(t->dtype), s, want);
}

/* Checks t is [lead?][rows][cols] (lead = 0: 2-D). */
static int has_shape(const st_tensor *t, int lead, int64_t rows, int64_t cols) {
    if (lead) return t->ndim == 3 && t->shape[0] == lead && t->shape[1] == rows && t->shape[2] == cols;
    return t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols;
}

/* Binds `base` as a [lead][rows][cols] matrix stack (lead 0 = single matrix) and returns views
 * of slice e, rows [r0, r0+rows_out). MLX-quantized when base.scales exists. `suffix` is
 * ".weight" normally, "" for the official fused expert tensors. */
static lily_code bind(ctx_t *c, const char *base, const char *suffix, int lead, int rows, int cols,
                      int n_out, int rows_out, lw_mat *out) {
    char wn[600], sn[600], bn[600];
    snprintf(wn, sizeof wn, "%s%s", base, suffix);
    snprintf(sn, sizeof sn, "%s.scales", base);
    snprintf(bn, sizeof bn, "%s.biases", base);
    st_tensor *tw = find(c, wn), *ts = find(c, sn), *tb = find(c, bn);
    if (!tw) return lily_err(c->st, LILY_EFORMAT, "missing tensor '%s' in the checkpoint", wn);
    char want[160];
    lw_mat m = { 0 };
    m.rows = rows_out;
    m.cols = cols;
    size_t row_bytes;
    if (ts) {
        if (!tb) return lily_err(c->st, LILY_EFORMAT, "missing tensor '%s' (quantized '%s' needs scales and biases)", bn, wn);
        int group = c->w->cfg.q_group ? c->w->cfg.q_group : 64;
        if (cols % group) return lily_err(c->st, LILY_EFORMAT, "tensor '%s': %d columns not a multiple of group size %d", wn, cols, group);
        if (tw->dtype != ST_U32) return lily_err(c->st, LILY_EFORMAT, "tensor '%s' in %s has dtype %s, expected U32 codes", wn, st_file_of(&c->w->files, tw), st_dtype_name(tw->dtype));
        int64_t packed = tw->ndim ? tw->shape[tw->ndim - 1] : 0;
        int bits = (int)(packed * 32 / cols);
        if (packed * 32 != (int64_t)bits * cols || (bits != 4 && bits != 8)) {
            snprintf(want, sizeof want, "U32 [%s%d, %d] (4-bit) or [.., %d] (8-bit)", lead ? "E, " : "", rows, cols / 8, cols / 4);
            return bad_shape(c, tw, want);
        }
        if (!has_shape(tw, lead, rows, packed)) {
            snprintf(want, sizeof want, "U32 [%s%d, %lld]", lead ? "E, " : "", rows, (long long)packed);
            return bad_shape(c, tw, want);
        }
        int ng = cols / group;
        lw_type sbt = lw_of(ts->dtype);
        if ((int)sbt < 0 || ts->dtype != tb->dtype) return lily_err(c->st, LILY_EFORMAT, "tensor '%s' dtype %s: scales/biases must be float and alike", sn, st_dtype_name(ts->dtype));
        snprintf(want, sizeof want, "[%s%d, %d]", lead ? "E, " : "", rows, ng);
        if (!has_shape(ts, lead, rows, ng)) return bad_shape(c, ts, want);
        if (!has_shape(tb, lead, rows, ng)) return bad_shape(c, tb, want);
        m.type = LW_Q;
        m.bits = bits;
        m.group = group;
        m.sb_type = sbt;
        row_bytes = (size_t)packed * 4;
        size_t sb_row = (size_t)ng * st_dtype_size(ts->dtype);
        for (int e = 0; e < n_out; e++) {
            /* slice e selects leading index e (lead) or row block e (no lead) */
            out[e] = m;
            size_t row0 = lead ? (size_t)e * rows : (size_t)e * rows_out;
            out[e].w = (const uint8_t *)tw->data + row0 * row_bytes;
            out[e].scales = (const uint8_t *)ts->data + row0 * sb_row;
            out[e].biases = (const uint8_t *)tb->data + row0 * sb_row;
        }
        ts->used = tb->used = 1;
    } else {
        lw_type t = lw_of(tw->dtype);
        if ((int)t < 0) return lily_err(c->st, LILY_EFORMAT, "tensor '%s' in %s has dtype %s, expected BF16, F16 or F32", wn, st_file_of(&c->w->files, tw), st_dtype_name(tw->dtype));
        snprintf(want, sizeof want, "[%s%d, %d]", lead ? "E, " : "", rows, cols);
        if (!has_shape(tw, lead, rows, cols)) return bad_shape(c, tw, want);
        m.type = t;
        row_bytes = (size_t)cols * st_dtype_size(tw->dtype);
        for (int e = 0; e < n_out; e++) {
            out[e] = m;
            size_t row0 = lead ? (size_t)e * rows : (size_t)e * rows_out;
            out[e].w = (const uint8_t *)tw->data + row0 * row_bytes;
        }
    }
    tw->used = 1;
    return LILY_OK;
}

static lily_code mat(ctx_t *c, const char *base, int rows, int cols, lw_mat *out) {
    return bind(c, base, ".weight", 0, rows, cols, 1, rows, out);
}

/* Small vectors become float32, shifted by one where the file stores w of a (1+w) norm. */
static lily_code vec(ctx_t *c, const char *name, int n, float add, float **out) {
    st_tensor *t = find(c, name);
    if (!t) return lily_err(c->st, LILY_EFORMAT, "missing tensor '%s' in the checkpoint", name);
    if (st_numel(t) != n || (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16)) {
        char want[64];
        snprintf(want, sizeof want, "%d float values", n);
        return bad_shape(c, t, want);
    }
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return lily_err(c->st, LILY_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        float x = t->dtype == ST_F32 ? ((const float *)t->data)[i]
                : t->dtype == ST_BF16 ? lily_bf16_to_f32(((const uint16_t *)t->data)[i])
                                      : lily_f16_to_f32(((const uint16_t *)t->data)[i]);
        v[i] = x + add;
    }
    t->used = 1;
    *out = v;
    return LILY_OK;
}

static lily_code experts(ctx_t *c, int l, lily_layer *L) {
    const lily_config *g = &c->w->cfg;
    int E = g->n_experts, I = g->moe_inter, H = g->hidden;
    L->gate = calloc((size_t)E, sizeof *L->gate);
    L->up = calloc((size_t)E, sizeof *L->up);
    L->down = calloc((size_t)E, sizeof *L->down);
    if (!L->gate || !L->up || !L->down) return lily_err(c->st, LILY_ENOMEM, "out of memory");
    char b[512];
    lily_code rc;
    snprintf(b, sizeof b, "%slayers.%d.mlp.switch_mlp.gate_proj", c->P, l);
    if (find(c, nm(c, "%s.weight", b))) { /* MLX: stacked [E][I][..] */
        if ((rc = bind(c, b, ".weight", E, I, H, E, I, L->gate))) return rc;
        snprintf(b, sizeof b, "%slayers.%d.mlp.switch_mlp.up_proj", c->P, l);
        if ((rc = bind(c, b, ".weight", E, I, H, E, I, L->up))) return rc;
        snprintf(b, sizeof b, "%slayers.%d.mlp.switch_mlp.down_proj", c->P, l);
        return bind(c, b, ".weight", E, H, I, E, H, L->down);
    }
    snprintf(b, sizeof b, "%slayers.%d.mlp.experts.gate_up_proj", c->P, l);
    if (find(c, b)) { /* official: [E][2I][H], gate rows first, then up rows */
        lw_mat *gu = calloc((size_t)E * 2, sizeof *gu);
        if (!gu) return lily_err(c->st, LILY_ENOMEM, "out of memory");
        /* bind as E stacked [2I][H] then split each into two row blocks */
        rc = bind(c, b, "", E, 2 * I, H, E, 2 * I, gu);
        for (int e = 0; !rc && e < E; e++) {
            L->gate[e] = gu[e];
            L->gate[e].rows = I;
            L->up[e] = gu[e];
            L->up[e].rows = I;
            L->up[e].w = (const uint8_t *)gu[e].w + (size_t)I * H * (gu[e].type == LW_F32 ? 4 : 2);
        }
        int quant = !rc && gu[0].type == LW_Q;
        free(gu);
        if (rc) return rc;
        if (quant) return lily_err(c->st, LILY_EUNSUPPORTED, "quantized fused gate_up_proj is not supported");
        snprintf(b, sizeof b, "%slayers.%d.mlp.experts.down_proj", c->P, l);
        return bind(c, b, "", E, H, I, E, H, L->down);
    }
    /* one tensor per expert */
    for (int e = 0; e < E; e++) {
        snprintf(b, sizeof b, "%slayers.%d.mlp.experts.%d.gate_proj", c->P, l, e);
        if ((rc = mat(c, b, I, H, &L->gate[e]))) return rc;
        snprintf(b, sizeof b, "%slayers.%d.mlp.experts.%d.up_proj", c->P, l, e);
        if ((rc = mat(c, b, I, H, &L->up[e]))) return rc;
        snprintf(b, sizeof b, "%slayers.%d.mlp.experts.%d.down_proj", c->P, l, e);
        if ((rc = mat(c, b, H, I, &L->down[e]))) return rc;
    }
    c->w->layout = c->mlx ? "mlx" : "hf-per-expert";
    return LILY_OK;
}

static lily_code layer(ctx_t *c, int l) {
    const lily_config *g = &c->w->cfg;
    lily_layer *L = &c->w->layers[l];
    int H = g->hidden;
    float shift = c->mlx ? 0.0f : 1.0f;
    char b[512];
    lily_code rc;
    L->full_attn = g->full_attn[l];
#define M(field, rows, cols, ...) do { snprintf(b, sizeof b, __VA_ARGS__); if ((rc = mat(c, b, rows, cols, &L->field))) return rc; } while (0)
#define V(field, n, add, ...) do { snprintf(b, sizeof b, __VA_ARGS__); if ((rc = vec(c, b, n, add, &L->field))) return rc; } while (0)
    V(ln1, H, shift, "%slayers.%d.input_layernorm.weight", c->P, l);
    V(ln2, H, shift, "%slayers.%d.post_attention_layernorm.weight", c->P, l);
    if (L->full_attn) {
        int nh = g->n_heads, nkv = g->n_kv_heads, hd = g->head_dim;
        M(q, nh * hd * 2, H, "%slayers.%d.self_attn.q_proj", c->P, l);
        M(k, nkv * hd, H, "%slayers.%d.self_attn.k_proj", c->P, l);
        M(v, nkv * hd, H, "%slayers.%d.self_attn.v_proj", c->P, l);
        M(o, H, nh * hd, "%slayers.%d.self_attn.o_proj", c->P, l);
        V(q_norm, hd, shift, "%slayers.%d.self_attn.q_norm.weight", c->P, l);
        V(k_norm, hd, shift, "%slayers.%d.self_attn.k_norm.weight", c->P, l);
    } else {
        int nv = g->lin_nv, vd = cfg_val_dim(g), cd = cfg_conv_dim(g);
        M(qkv, cd, H, "%slayers.%d.linear_attn.in_proj_qkv", c->P, l);
        M(z, vd, H, "%slayers.%d.linear_attn.in_proj_z", c->P, l);
        M(b, nv, H, "%slayers.%d.linear_attn.in_proj_b", c->P, l);
        M(a, nv, H, "%slayers.%d.linear_attn.in_proj_a", c->P, l);
        M(out, H, vd, "%slayers.%d.linear_attn.out_proj", c->P, l);
        /* [C][1][K] (official) and [C][K][1] (MLX) are the same bytes */
        V(conv_w, cd * g->conv_k, 0, "%slayers.%d.linear_attn.conv1d.weight", c->P, l);
        V(A_log, nv, 0, "%slayers.%d.linear_attn.A_log", c->P, l);
        V(dt_bias, nv, 0, "%slayers.%d.linear_attn.dt_bias", c->P, l);
        V(gnorm, g->lin_dv, 0, "%slayers.%d.linear_attn.norm.weight", c->P, l);
    }
    M(router, g->n_experts, H, "%slayers.%d.mlp.gate", c->P, l);
    if ((rc = experts(c, l, L))) return rc;
    if (g->shared_inter) {
        int SI = g->shared_inter;
        M(sh_gate, SI, H, "%slayers.%d.mlp.shared_expert.gate_proj", c->P, l);
        M(sh_up, SI, H, "%slayers.%d.mlp.shared_expert.up_proj", c->P, l);
        M(sh_down, H, SI, "%slayers.%d.mlp.shared_expert.down_proj", c->P, l);
        M(sh_router, 1, H, "%slayers.%d.mlp.shared_expert_gate", c->P, l);
    }
#undef M
#undef V
    return LILY_OK;
}

/* Tensors outside the text model that a checkpoint may carry and lily ignores. */
static int ignorable(const char *n) {
    static const char *skip[] = { "model.visual.", "visual.", "vision_tower.", "model.vision_tower.",
                                  "language_model.vision_tower.", "mtp.", "model.mtp.", "language_model.mtp." };
    for (size_t i = 0; i < sizeof skip / sizeof *skip; i++)
        if (!strncmp(n, skip[i], strlen(skip[i]))) return 1;
    return 0;
}

lily_code lw_load(const char *dir, lily_weights *w, lily_status *st) {
    memset(w, 0, sizeof *w);
    lily_code rc = cfg_load(dir, &w->cfg, st);
    if (rc) return rc;
    if ((rc = st_open(dir, &w->files, st))) return rc;
    ctx_t c = { .w = w, .st = st };
    const char *lm;
    if (find(&c, "model.language_model.embed_tokens.weight")) { c.P = "model.language_model."; lm = "lm_head"; }
    else if (find(&c, "language_model.model.embed_tokens.weight")) { c.P = "language_model.model."; lm = "language_model.lm_head"; c.mlx = 1; }
    else if (find(&c, "model.embed_tokens.weight")) { c.P = "model."; lm = "lm_head"; }
    else { rc = lily_err(st, LILY_EFORMAT, "%s: no embed_tokens tensor under any known prefix (model.language_model., language_model.model., model.)", dir); goto fail; }
    w->layout = c.mlx ? "mlx" : "hf";
    const lily_config *g = &w->cfg;
    char b[512];
    snprintf(b, sizeof b, "%sembed_tokens", c.P);
    if ((rc = mat(&c, b, g->vocab, g->hidden, &w->embed))) goto fail;
    if (g->tie_embeddings && !find(&c, nm(&c, "%s.weight", lm))) w->lm_head = w->embed;
    else if ((rc = mat(&c, lm, g->vocab, g->hidden, &w->lm_head))) goto fail;
    snprintf(b, sizeof b, "%snorm.weight", c.P);
    if ((rc = vec(&c, b, g->hidden, c.mlx ? 0.0f : 1.0f, &w->norm))) goto fail;
    w->layers = calloc((size_t)g->n_layers, sizeof *w->layers);
    if (!w->layers) { rc = lily_err(st, LILY_ENOMEM, "out of memory"); goto fail; }
    for (int l = 0; l < g->n_layers; l++)
        if ((rc = layer(&c, l))) goto fail;
    for (int i = 0; i < w->files.n_tensors; i++) {
        const st_tensor *t = &w->files.tensors[i];
        if (!t->used && !ignorable(t->name)) {
            rc = lily_err(st, LILY_EFORMAT, "unexpected tensor '%s' in %s (not part of a %d-layer qwen3_5_moe text model)",
                          t->name, st_file_of(&w->files, t), g->n_layers);
            goto fail;
        }
        if (t->used) w->weight_bytes += t->nbytes;
    }
    /* parameter count from the logical shapes */
    uint64_t H = (uint64_t)g->hidden, p = 2ull * g->vocab * H + H;
    if (g->tie_embeddings) p -= (uint64_t)g->vocab * H;
    for (int l = 0; l < g->n_layers; l++) {
        p += 2 * H;
        if (g->full_attn[l]) p += H * g->head_dim * (3ull * g->n_heads + 2ull * g->n_kv_heads) + 2ull * g->head_dim;
        else p += H * (cfg_conv_dim(g) + 2ull * cfg_val_dim(g) + 2ull * g->lin_nv) + (uint64_t)cfg_conv_dim(g) * g->conv_k + 2ull * g->lin_nv + g->lin_dv;
        p += H * g->n_experts + 3ull * H * g->moe_inter * g->n_experts;
        if (g->shared_inter) p += 3ull * H * g->shared_inter + H;
    }
    w->n_params = p;
    return LILY_OK;
fail:
    lw_free(w);
    return rc;
}

void lw_free(lily_weights *w) {
    if (w->layers)
        for (int l = 0; l < w->cfg.n_layers; l++) {
            lily_layer *L = &w->layers[l];
            free(L->ln1); free(L->ln2); free(L->conv_w); free(L->A_log); free(L->dt_bias);
            free(L->gnorm); free(L->q_norm); free(L->k_norm);
            free(L->gate); free(L->up); free(L->down);
        }
    free(w->layers);
    free(w->norm);
    st_close(&w->files);
    memset(w, 0, sizeof *w);
}

static inline float sb(const void *p, lw_type t, size_t i) {
    return t == LW_BF16 ? lily_bf16_to_f32(((const uint16_t *)p)[i])
         : t == LW_F16 ? lily_f16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

void lw_row_f32(const lw_mat *m, int r, float *out) {
    size_t n = (size_t)m->cols;
    switch (m->type) {
    case LW_F32: memcpy(out, (const float *)m->w + (size_t)r * n, n * sizeof *out); break;
    case LW_BF16: { const uint16_t *p = (const uint16_t *)m->w + (size_t)r * n; for (size_t i = 0; i < n; i++) out[i] = lily_bf16_to_f32(p[i]); break; }
    case LW_F16: { const uint16_t *p = (const uint16_t *)m->w + (size_t)r * n; for (size_t i = 0; i < n; i++) out[i] = lily_f16_to_f32(p[i]); break; }
    case LW_Q: {
        int per = 32 / m->bits, ng = m->cols / m->group;
        uint32_t mask = (1u << m->bits) - 1;
        const uint32_t *q = (const uint32_t *)m->w + (size_t)r * (n / per);
        for (int g = 0; g < ng; g++) {
            float s = sb(m->scales, m->sb_type, (size_t)r * ng + g), b = sb(m->biases, m->sb_type, (size_t)r * ng + g);
            for (int j = g * m->group; j < (g + 1) * m->group; j++)
                out[j] = s * (float)((q[j / per] >> (m->bits * (j % per))) & mask) + b;
        }
        break;
    }
    }
}
