#include "loader/config.h"
#include "util/util.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

static lily_code get_int(json_t *o, const char *k, int lo, int hi, int *out, lily_status *st) {
    json_t *v = json_object_get(o, k);
    if (!v) return lily_err(st, LILY_EFORMAT, "config.json: missing field '%s'", k);
    if (!json_is_integer(v)) return lily_err(st, LILY_EFORMAT, "config.json: field '%s' must be an integer", k);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return lily_err(st, LILY_EUNSUPPORTED, "config.json: field '%s' = %lld outside [%d, %d]", k, (long long)x, lo, hi);
    *out = (int)x;
    return LILY_OK;
}

static lily_code get_num(json_t *o, const char *k, double *out, lily_status *st) {
    json_t *v = json_object_get(o, k);
    if (!json_is_number(v)) return lily_err(st, LILY_EFORMAT, "config.json: field '%s' must be a number", k);
    *out = json_number_value(v);
    return LILY_OK;
}

static void eos_add(lily_config *c, json_t *v) {
    if (json_is_integer(v)) {
        if (c->n_eos < 8) c->eos[c->n_eos++] = (int)json_integer_value(v);
    } else if (json_is_array(v)) {
        size_t i; json_t *e;
        json_array_foreach(v, i, e) if (json_is_integer(e) && c->n_eos < 8) c->eos[c->n_eos++] = (int)json_integer_value(e);
    }
}

lily_code cfg_parse(const char *config_json, const char *gen_json, lily_config *c, lily_status *st) {
    memset(c, 0, sizeof *c);
    json_error_t jerr;
    json_t *root = json_loads(config_json, 0, &jerr);
    if (!root) return lily_err(st, LILY_EFORMAT, "config.json: %s (line %d)", jerr.text, jerr.line);
    lily_code rc = LILY_OK;
    json_t *t = root;
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    if (!json_is_object(root)) { rc = lily_err(st, LILY_EFORMAT, "config.json: not a JSON object"); goto out; }
    if (!mt) { rc = lily_err(st, LILY_EFORMAT, "config.json: missing field 'model_type'"); goto out; }
    if (!strcmp(mt, "qwen3_5_moe")) {
        t = json_object_get(root, "text_config");
        if (!json_is_object(t)) { rc = lily_err(st, LILY_EFORMAT, "config.json: model_type qwen3_5_moe needs a 'text_config' object"); goto out; }
        const char *tmt = json_string_value(json_object_get(t, "model_type"));
        if (tmt && strcmp(tmt, "qwen3_5_moe_text")) {
            rc = lily_err(st, LILY_EUNSUPPORTED, "config.json: field 'text_config.model_type' is '%s', lily runs qwen3_5_moe_text", tmt);
            goto out;
        }
    } else if (strcmp(mt, "qwen3_5_moe_text")) {
        rc = lily_err(st, LILY_EUNSUPPORTED, "config.json: field 'model_type' is '%s'; lily runs the qwen3_5_moe family only", mt);
        goto out;
    }
#define I(k, lo, hi, dst) if ((rc = get_int(t, k, lo, hi, dst, st))) goto out
    I("hidden_size", 1, 1 << 16, &c->hidden);
    I("num_hidden_layers", 1, LILY_MAX_LAYERS, &c->n_layers);
    I("vocab_size", 1, 1 << 22, &c->vocab);
    I("num_attention_heads", 1, 1024, &c->n_heads);
    I("num_key_value_heads", 1, 1024, &c->n_kv_heads);
    I("head_dim", 2, 4096, &c->head_dim);
    I("linear_num_key_heads", 1, 1024, &c->lin_nk);
    I("linear_num_value_heads", 1, 1024, &c->lin_nv);
    I("linear_key_head_dim", 1, 4096, &c->lin_dk);
    I("linear_value_head_dim", 1, 4096, &c->lin_dv);
    I("linear_conv_kernel_dim", 1, 64, &c->conv_k);
    I("num_experts", 1, 1 << 14, &c->n_experts);
    I("num_experts_per_tok", 1, 1 << 14, &c->top_k);
    I("moe_intermediate_size", 1, 1 << 20, &c->moe_inter);
    I("shared_expert_intermediate_size", 0, 1 << 20, &c->shared_inter);
#undef I
    if (c->top_k > c->n_experts) { rc = lily_err(st, LILY_EFORMAT, "config.json: num_experts_per_tok %d > num_experts %d", c->top_k, c->n_experts); goto out; }
    if (c->n_heads % c->n_kv_heads) { rc = lily_err(st, LILY_EFORMAT, "config.json: num_attention_heads %d not a multiple of num_key_value_heads %d", c->n_heads, c->n_kv_heads); goto out; }
    if (c->lin_nv % c->lin_nk) { rc = lily_err(st, LILY_EFORMAT, "config.json: linear_num_value_heads %d not a multiple of linear_num_key_heads %d", c->lin_nv, c->lin_nk); goto out; }
    if ((rc = get_num(t, "rms_norm_eps", &c->eps, st))) goto out;
    json_t *rp = json_object_get(t, "rope_parameters");
    if (!json_is_object(rp)) rp = json_object_get(t, "rope_scaling");
    json_t *src = json_object_get(rp, "rope_theta") ? rp : t;
    if ((rc = get_num(src, "rope_theta", &c->rope_theta, st))) goto out;
    const char *rt = json_string_value(json_object_get(rp, "rope_type"));
    if (rt && strcmp(rt, "default")) { rc = lily_err(st, LILY_EUNSUPPORTED, "config.json: field 'rope_parameters.rope_type' is '%s'; only 'default' is supported", rt); goto out; }
    double prf = 1.0;
    src = json_object_get(rp, "partial_rotary_factor") ? rp : t;
    if (json_object_get(src, "partial_rotary_factor") && (rc = get_num(src, "partial_rotary_factor", &prf, st))) goto out;
    c->rot_dim = (int)(c->head_dim * prf + 0.5);
    if (c->rot_dim < 2 || c->rot_dim > c->head_dim || c->rot_dim % 2) { rc = lily_err(st, LILY_EFORMAT, "config.json: partial_rotary_factor gives %d rotary dims", c->rot_dim); goto out; }
    json_t *g = json_object_get(t, "attn_output_gate");
    c->attn_output_gate = g ? json_is_true(g) : 1;
    if (!c->attn_output_gate) { rc = lily_err(st, LILY_EUNSUPPORTED, "config.json: field 'attn_output_gate' false is not supported"); goto out; }
    json_t *tie = json_object_get(t, "tie_word_embeddings");
    if (!tie) tie = json_object_get(root, "tie_word_embeddings");
    c->tie_embeddings = json_is_true(tie);
    json_t *bias = json_object_get(t, "attention_bias");
    if (json_is_true(bias)) { rc = lily_err(st, LILY_EUNSUPPORTED, "config.json: field 'attention_bias' true is not supported"); goto out; }
    const char *act = json_string_value(json_object_get(t, "hidden_act"));
    if (act && strcmp(act, "silu")) { rc = lily_err(st, LILY_EUNSUPPORTED, "config.json: field 'hidden_act' is '%s', expected silu", act); goto out; }
    json_t *lt = json_object_get(t, "layer_types");
    if (lt) {
        if (!json_is_array(lt) || (int)json_array_size(lt) != c->n_layers) { rc = lily_err(st, LILY_EFORMAT, "config.json: field 'layer_types' must list %d layers", c->n_layers); goto out; }
        for (int i = 0; i < c->n_layers; i++) {
            const char *s = json_string_value(json_array_get(lt, (size_t)i));
            if (s && !strcmp(s, "full_attention")) c->full_attn[i] = 1;
            else if (s && !strcmp(s, "linear_attention")) c->full_attn[i] = 0;
            else { rc = lily_err(st, LILY_EUNSUPPORTED, "config.json: field 'layer_types[%d]' is '%s'", i, s ? s : "(not a string)"); goto out; }
        }
    } else {
        int interval = 4;
        json_t *fi = json_object_get(t, "full_attention_interval");
        if (fi && (rc = get_int(t, "full_attention_interval", 1, 1024, &interval, st))) goto out;
        for (int i = 0; i < c->n_layers; i++) c->full_attn[i] = (i + 1) % interval == 0;
    }
    eos_add(c, json_object_get(t, "eos_token_id"));
    if (!c->n_eos) eos_add(c, json_object_get(root, "eos_token_id"));
    json_t *q = json_object_get(root, "quantization");
    if (!q) q = json_object_get(root, "quantization_config");
    if (q) {
        json_t *b = json_object_get(q, "bits"), *gs = json_object_get(q, "group_size");
        if (!json_is_integer(b) || !json_is_integer(gs)) { rc = lily_err(st, LILY_EFORMAT, "config.json: field 'quantization' needs integer bits and group_size"); goto out; }
        c->q_bits = (int)json_integer_value(b);
        c->q_group = (int)json_integer_value(gs);
        const char *mode = json_string_value(json_object_get(q, "mode"));
        if ((mode && strcmp(mode, "affine")) || (c->q_bits != 4 && c->q_bits != 8) || c->q_group < 8 || c->q_group > 1024) {
            rc = lily_err(st, LILY_EUNSUPPORTED, "config.json: field 'quantization' (bits %d, group %d%s%s) is not MLX affine 4/8-bit", c->q_bits, c->q_group, mode ? ", mode " : "", mode ? mode : "");
            goto out;
        }
    }
    c->gen_temperature = c->gen_top_p = c->gen_min_p = -1;
    c->gen_top_k = -1;
    if (gen_json) {
        json_t *gr = json_loads(gen_json, 0, &jerr);
        if (!gr) { rc = lily_err(st, LILY_EFORMAT, "generation_config.json: %s (line %d)", jerr.text, jerr.line); goto out; }
        json_t *e = json_object_get(gr, "eos_token_id");
        if (e) { c->n_eos = 0; eos_add(c, e); }
        json_t *v;
        if (json_is_number(v = json_object_get(gr, "temperature"))) c->gen_temperature = (float)json_number_value(v);
        if (json_is_number(v = json_object_get(gr, "top_p"))) c->gen_top_p = (float)json_number_value(v);
        if (json_is_number(v = json_object_get(gr, "min_p"))) c->gen_min_p = (float)json_number_value(v);
        if (json_is_integer(v = json_object_get(gr, "top_k"))) c->gen_top_k = (int)json_integer_value(v);
        if (json_is_false(json_object_get(gr, "do_sample"))) c->gen_temperature = 0;
        json_decref(gr);
    }
out:
    json_decref(root);
    return rc;
}

lily_code cfg_load(const char *dir, lily_config *c, lily_status *st) {
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", dir);
    char *cj = lily_read_file(p, NULL, st);
    if (!cj) return st ? st->code : LILY_EIO;
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    char *gj = lily_read_file(p, NULL, NULL);
    lily_code rc = cfg_parse(cj, gj, c, st);
    free(cj);
    free(gj);
    return rc;
}
