/* The model's shape, read from config.json (multimodal form with text_config, or the
 * flat text-only form) and generation_config.json. Every size comes from here. */
#ifndef LILY_CONFIG_H
#define LILY_CONFIG_H
#include "lily.h"

#define LILY_MAX_LAYERS 256

typedef struct {
    int hidden;          /* H */
    int n_layers;
    int vocab;           /* V */
    unsigned char full_attn[LILY_MAX_LAYERS]; /* 1 = gated attention, 0 = Gated DeltaNet */
    /* gated attention */
    int n_heads, n_kv_heads, head_dim;   /* nh, nkv, hd */
    int rot_dim;                          /* rotary dims: head_dim * partial_rotary_factor */
    double rope_theta;
    int rope_bf16_freq;                   /* round inv_freq to bf16 (see lily_model_opts) */
    int attn_output_gate;
    /* Gated DeltaNet */
    int lin_nk, lin_nv, lin_dk, lin_dv;   /* key heads, value heads, key dim, value dim */
    int conv_k;                           /* causal conv kernel */
    /* MoE */
    int n_experts, top_k, moe_inter, shared_inter;
    double eps;
    int tie_embeddings;
    /* MLX quantization (0 = none): default bits and group size */
    int q_bits, q_group;
    /* generation_config.json */
    int n_eos;
    int eos[8];
    float gen_temperature, gen_top_p, gen_min_p; /* -1 = absent */
    int gen_top_k;                               /* -1 = absent */
} lily_config;

/* Derived sizes. */
static inline int cfg_key_dim(const lily_config *c) { return c->lin_nk * c->lin_dk; }
static inline int cfg_val_dim(const lily_config *c) { return c->lin_nv * c->lin_dv; }
static inline int cfg_conv_dim(const lily_config *c) { return 2 * cfg_key_dim(c) + cfg_val_dim(c); }
static inline int cfg_n_full(const lily_config *c) {
    int n = 0;
    for (int i = 0; i < c->n_layers; i++) n += c->full_attn[i];
    return n;
}

/* Parses config.json text (and optional generation_config.json text, may be NULL). */
lily_code cfg_parse(const char *config_json, const char *gen_json, lily_config *c, lily_status *st);
/* Reads DIR/config.json and DIR/generation_config.json if present. */
lily_code cfg_load(const char *dir, lily_config *c, lily_status *st);
#endif
