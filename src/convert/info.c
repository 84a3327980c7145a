/* `lily info`: what a checkpoint is, and the memory arithmetic for a context length. */
#include "convert/convert.h"
#include "loader/weights.h"
#include "util/util.h"
#include <jansson.h>
#include <stdio.h>
#include <string.h>

void convert_memory_estimate(const lily_config *c, uint64_t weight_bytes, int ctx_len, int kv_bytes,
                             convert_memory *out) {
    int n_full = cfg_n_full(c), n_lin = c->n_layers - n_full;
    out->weights = weight_bytes;
    out->kv_cache = (uint64_t)n_full * c->n_kv_heads * c->head_dim * 2ull * (uint64_t)(ctx_len > 0 ? ctx_len : 0) * kv_bytes;
    out->deltanet = (uint64_t)n_lin * ((uint64_t)c->lin_nv * c->lin_dk * c->lin_dv * 4ull +
                                       (uint64_t)cfg_conv_dim(c) * (c->conv_k > 1 ? c->conv_k - 1 : 0) * 4ull);
    out->total = out->weights + out->kv_cache + out->deltanet;
}

static int starts(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }
static int ends(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int is_text(const char *n) {
    if (starts(n, "model.visual.") || starts(n, "model.mtp.") || starts(n, "mtp.") || strstr(n, "vision_tower")) return 0;
    return starts(n, "model.") || starts(n, "language_model.") || starts(n, "lm_head.");
}

/* Group size for quantized tensor base `b`: the per-path override or the default. */
static int group_of(json_t *q, const char *base, int dflt) {
    json_t *o = json_object_get(q, base);
    json_t *g = json_object_get(o, "group_size");
    return json_is_integer(g) && json_integer_value(g) > 0 ? (int)json_integer_value(g) : dflt;
}

lily_code convert_info_read(const char *dir, convert_info *out, lily_status *st) {
    memset(out, 0, sizeof *out);
    lily_code rc = cfg_load(dir, &out->cfg, st);
    if (rc != LILY_OK) return rc;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *cj = json_load_file(path, 0, NULL);
    const char *mt = json_string_value(json_object_get(cj, "model_type"));
    snprintf(out->model_type, sizeof out->model_type, "%s", mt ? mt : "?");
    json_t *q = json_object_get(cj, "quantization");
    if (!q) q = json_object_get(cj, "quantization_config");
    out->bits = out->cfg.q_bits;
    out->group = out->cfg.q_group;
    st_set set;
    if ((rc = st_open(dir, &set, st)) != LILY_OK) { json_decref(cj); return rc; }
    int per_expert = 0, quant = 0;
    for (int i = 0; i < set.n_tensors; i++) {
        const st_tensor *t = &set.tensors[i];
        if (!is_text(t->name)) { out->n_other++; out->other_bytes += t->nbytes; continue; }
        out->n_tensors++;
        out->bytes += t->nbytes;
        out->dtype_count[t->dtype]++;
        out->dtype_bytes[t->dtype] += t->nbytes;
        if (strstr(t->name, ".mlp.experts.0.")) per_expert = 1;
        if (ends(t->name, ".scales") || ends(t->name, ".biases")) continue;
        uint64_t n = (uint64_t)st_numel(t);
        if (t->dtype == ST_U32 && ends(t->name, ".weight")) {
            char base[512], sn[600];
            snprintf(base, sizeof base, "%.*s", (int)(strlen(t->name) - 7), t->name);
            if (snprintf(sn, sizeof sn, "%s.scales", base) >= (int)sizeof sn) continue;
            const st_tensor *s = st_find(&set, sn);
            if (s && s->ndim == t->ndim && t->ndim > 0) {
                quant = 1;
                int64_t cols = s->shape[s->ndim - 1] * group_of(q, base, out->group ? out->group : 64);
                int64_t packed = t->shape[t->ndim - 1];
                int bits = cols ? (int)(packed * 32 / cols) : 0;
                if (bits == 8 && out->bits != 8) out->n_bits8++;
                n = packed ? n / (uint64_t)packed * (uint64_t)cols : 0;
            }
        }
        out->n_params += n;
    }
    snprintf(out->layout, sizeof out->layout, "%s", quant ? "mlx" : per_expert ? "hf-per-expert" : "hf");
    st_close(&set);
    json_decref(cj);
    lily_weights w;
    lily_status ls = { 0 };
    if (lw_load(dir, &w, &ls) == LILY_OK) { out->loads = 1; lw_free(&w); }
    else snprintf(out->load_error, sizeof out->load_error, "%s", ls.msg);
    return LILY_OK;
}
