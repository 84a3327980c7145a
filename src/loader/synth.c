#include "loader/synth.h"
#include "convert/convert.h"
#include "loader/safetensors.h"
#include "util/util.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

typedef enum { K_MAT, K_ROUTER, K_EMBED, K_NORM1P, K_GNORM, K_CONV, K_ALOG, K_DTBIAS } synth_kind;

typedef struct {
    char name[192];   /* output name without .weight/.scales for quantized tensors */
    synth_kind kind;
    int ndim;
    int64_t shape[3]; /* logical shape: [lead?][rows][cols] or [n] */
    int bits;         /* 0: stored as float (dtype), 4/8: MLX quantized */
    st_dtype dtype;   /* float storage */
    float add;        /* added to stored values ((1+w) norms in the MLX layout) */
} synth_spec;

typedef struct {
    synth_spec *v;
    int n, cap;
} spec_list;

static void add(spec_list *L, const char *name, synth_kind k, int ndim, int64_t a, int64_t b, int64_t c,
                int bits, st_dtype dt, float addv) {
    if (L->n == L->cap) {
        L->cap = L->cap ? L->cap * 2 : 256;
        L->v = realloc(L->v, (size_t)L->cap * sizeof *L->v);
        LILY_ASSERT(L->v);
    }
    synth_spec *s = &L->v[L->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->kind = k; s->ndim = ndim; s->shape[0] = a; s->shape[1] = b; s->shape[2] = c;
    s->bits = bits; s->dtype = dt; s->add = addv;
}

static int64_t rows_of(const synth_spec *s) { return s->ndim == 1 ? 1 : s->ndim == 2 ? s->shape[0] : s->shape[0] * s->shape[1]; }
static int64_t cols_of(const synth_spec *s) { return s->shape[s->ndim - 1]; }

static uint64_t spec_bytes(const synth_spec *s) {
    uint64_t n = (uint64_t)rows_of(s) * cols_of(s);
    if (s->bits) return n * s->bits / 8 + 2 * 2 * n / 64;
    return n * st_dtype_size(s->dtype);
}

/* The tensor list of one layout. Matrices whose input dim is a multiple of 64 are
 * quantized in the MLX layout (router and shared-expert gate at 8 bits), as mlx-lm does. */
static void build_specs(const synth_opts *o, spec_list *L) {
    const lily_config *c = &o->cfg;
    int mlx = o->mlx4, H = c->hidden;
    const char *P = mlx ? "language_model.model." : "model.language_model.";
    char n[192];
#define QB(cols, b) (mlx && (cols) % 64 == 0 ? (b) : 0)
#define MAT(kind, r, cols, b, ...) do { snprintf(n, sizeof n, __VA_ARGS__); add(L, n, kind, 2, r, cols, 0, QB(cols, b), ST_BF16, 0); } while (0)
#define VEC(kind, len, dt, addv, ...) do { snprintf(n, sizeof n, __VA_ARGS__); add(L, n, kind, 1, len, 0, 0, 0, dt, addv); } while (0)
    MAT(K_EMBED, c->vocab, H, 4, "%sembed_tokens", P);
    for (int l = 0; l < c->n_layers; l++) {
        VEC(K_NORM1P, H, ST_BF16, mlx ? 1.0f : 0.0f, "%slayers.%d.input_layernorm.weight", P, l);
        VEC(K_NORM1P, H, ST_BF16, mlx ? 1.0f : 0.0f, "%slayers.%d.post_attention_layernorm.weight", P, l);
        if (c->full_attn[l]) {
            int nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
            MAT(K_MAT, 2 * nh * hd, H, 4, "%slayers.%d.self_attn.q_proj", P, l);
            MAT(K_MAT, nkv * hd, H, 4, "%slayers.%d.self_attn.k_proj", P, l);
            MAT(K_MAT, nkv * hd, H, 4, "%slayers.%d.self_attn.v_proj", P, l);
            MAT(K_MAT, H, nh * hd, 4, "%slayers.%d.self_attn.o_proj", P, l);
            VEC(K_NORM1P, hd, ST_BF16, mlx ? 1.0f : 0.0f, "%slayers.%d.self_attn.q_norm.weight", P, l);
            VEC(K_NORM1P, hd, ST_BF16, mlx ? 1.0f : 0.0f, "%slayers.%d.self_attn.k_norm.weight", P, l);
        } else {
            int cd = cfg_conv_dim(c), vd = cfg_val_dim(c), nv = c->lin_nv;
            MAT(K_MAT, cd, H, 4, "%slayers.%d.linear_attn.in_proj_qkv", P, l);
            MAT(K_MAT, vd, H, 4, "%slayers.%d.linear_attn.in_proj_z", P, l);
            MAT(K_MAT, nv, H, 4, "%slayers.%d.linear_attn.in_proj_b", P, l);
            MAT(K_MAT, nv, H, 4, "%slayers.%d.linear_attn.in_proj_a", P, l);
            MAT(K_MAT, H, vd, 4, "%slayers.%d.linear_attn.out_proj", P, l);
            snprintf(n, sizeof n, "%slayers.%d.linear_attn.conv1d.weight", P, l);
            if (mlx) add(L, n, K_CONV, 3, cd, c->conv_k, 1, 0, ST_BF16, 0);
            else add(L, n, K_CONV, 3, cd, 1, c->conv_k, 0, ST_BF16, 0);
            VEC(K_ALOG, nv, ST_F32, 0, "%slayers.%d.linear_attn.A_log", P, l);
            VEC(K_DTBIAS, nv, ST_BF16, 0, "%slayers.%d.linear_attn.dt_bias", P, l);
            VEC(K_GNORM, c->lin_dv, mlx ? ST_BF16 : ST_F32, 0, "%slayers.%d.linear_attn.norm.weight", P, l);
        }
        MAT(K_ROUTER, c->n_experts, H, 8, "%slayers.%d.mlp.gate", P, l);
        int E = c->n_experts, I = c->moe_inter;
        if (mlx) {
            snprintf(n, sizeof n, "%slayers.%d.mlp.switch_mlp.gate_proj", P, l); add(L, n, K_MAT, 3, E, I, H, QB(H, 4), ST_BF16, 0);
            snprintf(n, sizeof n, "%slayers.%d.mlp.switch_mlp.up_proj", P, l); add(L, n, K_MAT, 3, E, I, H, QB(H, 4), ST_BF16, 0);
            snprintf(n, sizeof n, "%slayers.%d.mlp.switch_mlp.down_proj", P, l); add(L, n, K_MAT, 3, E, H, I, QB(I, 4), ST_BF16, 0);
        } else {
            snprintf(n, sizeof n, "%slayers.%d.mlp.experts.gate_up_proj", P, l); add(L, n, K_MAT, 3, E, 2 * I, H, 0, ST_BF16, 0);
            snprintf(n, sizeof n, "%slayers.%d.mlp.experts.down_proj", P, l); add(L, n, K_MAT, 3, E, H, I, 0, ST_BF16, 0);
        }
        if (c->shared_inter) {
            int SI = c->shared_inter;
            MAT(K_MAT, SI, H, 4, "%slayers.%d.mlp.shared_expert.gate_proj", P, l);
            MAT(K_MAT, SI, H, 4, "%slayers.%d.mlp.shared_expert.up_proj", P, l);
            MAT(K_MAT, H, SI, 4, "%slayers.%d.mlp.shared_expert.down_proj", P, l);
            MAT(K_ROUTER, 1, H, 8, "%slayers.%d.mlp.shared_expert_gate", P, l);
        }
    }
    VEC(K_NORM1P, H, ST_BF16, mlx ? 1.0f : 0.0f, "%snorm.weight", P);
    MAT(K_MAT, c->vocab, H, 4, "%s", mlx ? "language_model.lm_head" : "lm_head");
#undef MAT
#undef VEC
#undef QB
}

/* ---- values ---- */
static uint64_t hash_str(const char *s, uint64_t seed) {
    uint64_t h = 1469598103934665603ull ^ seed;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Matrices (nearly all of the bytes) take a cheap approximate normal: the sum of the four
 * 16-bit quarters of one 64-bit draw, centred and scaled to unit variance (Irwin-Hall with
 * n = 4: tails end at +-3.46 sigma, kurtosis 2.6 instead of 3), about ten times cheaper
 * than Box-Muller's log, sqrt and cos. Vectors keep the exact normal. */
static inline float approx_normal(lily_rng *g) {
    uint64_t u = lily_rng_u64(g);
    int32_t s = (int32_t)(u & 0xffff) + (int32_t)((u >> 16) & 0xffff) + (int32_t)((u >> 32) & 0xffff) + (int32_t)(u >> 48);
    return (float)(s - 131070) * (1.0f / 37837.23f); /* sd of the sum: sqrt(4 * (65536^2 - 1) / 12) */
}

static void fill(const synth_spec *s, uint64_t seed, int64_t row0, int64_t nrows, float *out) {
    int64_t cols = cols_of(s);
    double fan = s->ndim == 1 ? 1 : (double)cols;
    for (int64_t r = 0; r < nrows; r++) {
        lily_rng g;
        lily_rng_seed(&g, seed ^ ((uint64_t)(row0 + r) * 0x9e3779b97f4a7c15ull));
        float *o = out + r * cols;
        if (s->kind == K_MAT || s->kind == K_ROUTER || s->kind == K_EMBED) {
            float mul = s->kind == K_EMBED ? 1.0f : (s->kind == K_ROUTER ? 2.0f : 1.0f) / (float)sqrt(fan);
            for (int64_t i = 0; i < cols; i++) o[i] = approx_normal(&g) * mul + s->add;
            continue;
        }
        for (int64_t i = 0; i < cols; i++) {
            float v;
            switch (s->kind) {
            case K_NORM1P: v = 0.1f * lily_rng_normal(&g); break;
            case K_GNORM: v = 1.0f + 0.1f * lily_rng_normal(&g); break;
            case K_CONV: v = 0.5f * lily_rng_normal(&g); break;
            case K_ALOG: v = (float)log(1.0 + 15.0 * lily_rng_uniform(&g)); break;
            default: v = 0.5f * lily_rng_normal(&g); break;
            }
            o[i] = v + s->add;
        }
    }
}

/* Row blocks are generated in parallel: each block seeds its rows' RNGs from the row index,
 * so the result does not depend on the thread count. */
typedef struct {
    const synth_spec *s;
    uint64_t seed;
    int64_t row0, nrows, blk;
    float *buf;
    uint32_t *codes;
    uint16_t *sc, *bi, *half;
} job_t;

static void job_block(void *p, int b) {
    job_t *j = p;
    int64_t r0 = (int64_t)b * j->blk, n = j->blk;
    if (r0 + n > j->nrows) n = j->nrows - r0;
    if (n <= 0) return;
    int64_t cols = cols_of(j->s);
    float *f = j->buf + r0 * cols;
    fill(j->s, j->seed, j->row0 + r0, n, f);
    if (j->s->bits) {
        int per = 32 / j->s->bits;
        convert_quantize(f, (size_t)n, (size_t)cols, j->s->bits, 64, CONVERT_QUANT_MINMAX,
                         j->codes + r0 * cols / per, j->sc + (j->row0 + r0) * cols / 64,
                         j->bi + (j->row0 + r0) * cols / 64, NULL);
    } else if (j->s->dtype == ST_BF16) {
        for (int64_t i = 0; i < n * cols; i++) j->half[r0 * cols + i] = lily_f32_to_bf16(f[i]);
    }
}

/* One parallel step: task 0 writes the previous chunk while the other tasks generate the
 * next one into the other buffer, so the file writes overlap generation. */
typedef struct {
    job_t gen;
    st_writer *w;
    const void *wbuf;
    size_t wlen;
    lily_code wrc;
    lily_status *st;
} step_t;

static void step_task(void *p, int i) {
    step_t *s = p;
    if (i == 0) {
        if (s->wbuf && s->wlen) s->wrc = st_writer_write(s->w, s->wbuf, s->wlen, s->st);
        return;
    }
    job_block(&s->gen, i - 1);
}

static lily_code write_tensor(st_writer *w, lily_pool *pool, const synth_spec *s, uint64_t seed, lily_status *st) {
    int64_t rows = rows_of(s), cols = cols_of(s);
    int64_t chunk = (int64_t)(16u << 20) / (cols * 4); /* ~16 MB of floats at a time */
    if (chunk < 1) chunk = 1;
    if (chunk > rows) chunk = rows;
    int nbuf = chunk < rows ? 2 : 1;
    float *buf[2] = { 0 };
    uint32_t *codes[2] = { 0 };
    uint16_t *half[2] = { 0 };
    uint16_t *sc = s->bits ? malloc((size_t)(rows * cols / 64) * 2) : NULL, *bi = s->bits ? malloc((size_t)(rows * cols / 64) * 2) : NULL;
    lily_code rc = LILY_OK;
    int oom = s->bits && (!sc || !bi);
    for (int b = 0; b < nbuf; b++) {
        buf[b] = malloc((size_t)(chunk * cols) * sizeof(float));
        if (s->bits) codes[b] = malloc((size_t)(chunk * cols * s->bits / 32) * 4);
        if (!s->bits && s->dtype == ST_BF16) half[b] = malloc((size_t)(chunk * cols) * 2);
        oom |= !buf[b] || (s->bits && !codes[b]) || (!s->bits && s->dtype == ST_BF16 && !half[b]);
    }
    if (oom) {
        rc = lily_err(st, LILY_ENOMEM, "out of memory generating %s", s->name);
        goto out;
    }
    step_t step = { .w = w, .st = st };
    int cur = 0;
    int64_t nchunks = (rows + chunk - 1) / chunk;
    for (int64_t k = 0; k <= nchunks && !rc; k++) { /* step k generates chunk k and writes chunk k-1 */
        int64_t r0 = k * chunk, n = k < nchunks ? (rows - r0 < chunk ? rows - r0 : chunk) : 0;
        step.gen = (job_t){ s, seed, r0, n, 16, buf[cur], codes[cur], sc, bi, half[cur] };
        lily_pool_run(pool, 1 + (int)((n + 15) / 16), step_task, &step);
        rc = step.wrc;
        if (n == 0) break;
        step.wbuf = s->bits ? (const void *)codes[cur] : s->dtype == ST_BF16 ? (const void *)half[cur] : (const void *)buf[cur];
        step.wlen = s->bits ? (size_t)(n * cols * s->bits / 8) : (size_t)(n * cols * (s->dtype == ST_BF16 ? 2 : 4));
        cur = (cur + 1) % nbuf;
    }
    if (!rc && s->bits) rc = st_writer_write(w, sc, (size_t)(rows * cols / 64) * 2, st);
    if (!rc && s->bits) rc = st_writer_write(w, bi, (size_t)(rows * cols / 64) * 2, st);
out:
    for (int b = 0; b < 2; b++) { free(buf[b]); free(codes[b]); free(half[b]); }
    free(sc); free(bi);
    return rc;
}

/* Names as the layouts have them: quantized X becomes X.weight/.scales/.biases, official
 * fused experts carry no suffix, vectors and conv are named in full by build_specs. */
static void out_name(const synth_spec *s, int part, char *n, size_t len) {
    static const char *sfx[3] = { ".weight", ".scales", ".biases" };
    if (s->bits) snprintf(n, len, "%s%s", s->name, sfx[part]);
    else if (s->ndim == 1 || s->kind == K_CONV || strstr(s->name, "experts.gate_up_proj") || strstr(s->name, "experts.down_proj"))
        snprintf(n, len, "%s", s->name);
    else snprintf(n, len, "%s.weight", s->name);
}

static void declare(st_writer *w, const synth_spec *s, lily_status *st) {
    char n[256];
    int64_t shape[3];
    for (int i = 0; i < s->ndim; i++) shape[i] = s->shape[i];
    if (!s->bits) {
        out_name(s, 0, n, sizeof n);
        st_writer_declare(w, n, s->dtype, s->ndim, shape, st);
        return;
    }
    int64_t cols = shape[s->ndim - 1];
    out_name(s, 0, n, sizeof n);
    shape[s->ndim - 1] = cols * s->bits / 32;
    st_writer_declare(w, n, ST_U32, s->ndim, shape, st);
    shape[s->ndim - 1] = cols / 64;
    out_name(s, 1, n, sizeof n);
    st_writer_declare(w, n, ST_BF16, s->ndim, shape, st);
    out_name(s, 2, n, sizeof n);
    st_writer_declare(w, n, ST_BF16, s->ndim, shape, st);
}

static lily_code write_json(const char *dir, const char *file, const char *text, lily_status *st) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "w");
    if (!f) return lily_err(st, LILY_EIO, "%s: %s", p, strerror(errno));
    int ok = fputs(text, f) >= 0;
    ok &= fclose(f) == 0;
    return ok ? LILY_OK : lily_err(st, LILY_EIO, "%s: write failed", p);
}

static char *config_text(const synth_opts *o, int eos1) {
    const lily_config *c = &o->cfg;
    size_t cap = 16384 + (size_t)c->n_layers * 32 + (size_t)c->n_layers * 256;
    char *b = malloc(cap);
    LILY_ASSERT(b);
    size_t k = 0;
#define P(...) k += (size_t)snprintf(b + k, cap - k, __VA_ARGS__)
    P("{\n  \"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"],\n  \"model_type\": \"qwen3_5_moe\",\n");
    P("  \"tie_word_embeddings\": false,\n  \"lily_synthetic\": {\"seed\": %llu},\n", (unsigned long long)o->seed);
    if (o->mlx4) {
        P("  \"quantization\": {\"group_size\": 64, \"bits\": 4");
        for (int l = 0; l < c->n_layers; l++)
            P(", \"language_model.model.layers.%d.mlp.gate\": {\"group_size\": 64, \"bits\": 8}, "
              "\"language_model.model.layers.%d.mlp.shared_expert_gate\": {\"group_size\": 64, \"bits\": 8}", l, l);
        P("},\n");
    }
    P("  \"text_config\": {\n    \"model_type\": \"qwen3_5_moe_text\",\n    \"hidden_size\": %d,\n    \"num_hidden_layers\": %d,\n", c->hidden, c->n_layers);
    P("    \"vocab_size\": %d,\n    \"num_attention_heads\": %d,\n    \"num_key_value_heads\": %d,\n    \"head_dim\": %d,\n", c->vocab, c->n_heads, c->n_kv_heads, c->head_dim);
    P("    \"linear_num_key_heads\": %d,\n    \"linear_num_value_heads\": %d,\n    \"linear_key_head_dim\": %d,\n    \"linear_value_head_dim\": %d,\n", c->lin_nk, c->lin_nv, c->lin_dk, c->lin_dv);
    P("    \"linear_conv_kernel_dim\": %d,\n    \"num_experts\": %d,\n    \"num_experts_per_tok\": %d,\n    \"moe_intermediate_size\": %d,\n", c->conv_k, c->n_experts, c->top_k, c->moe_inter);
    P("    \"shared_expert_intermediate_size\": %d,\n    \"rms_norm_eps\": %g,\n    \"hidden_act\": \"silu\",\n    \"attn_output_gate\": true,\n", c->shared_inter, c->eps);
    P("    \"attention_bias\": false,\n    \"tie_word_embeddings\": false,\n    \"max_position_embeddings\": 262144,\n    \"eos_token_id\": %d,\n", eos1);
    P("    \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": %.1f, \"partial_rotary_factor\": %g, \"mrope_section\": [11, 11, 10], \"mrope_interleaved\": true},\n",
      c->rope_theta, (double)c->rot_dim / c->head_dim);
    P("    \"layer_types\": [");
    for (int l = 0; l < c->n_layers; l++) P("%s\"%s\"", l ? ", " : "", c->full_attn[l] ? "full_attention" : "linear_attention");
    P("]\n  }\n}\n");
#undef P
    return b;
}

lily_code synth_preset(const char *name, lily_config *c, lily_status *st) {
    memset(c, 0, sizeof *c);
    if (!strcmp(name, "35b-a3b")) {
        c->hidden = 2048; c->n_layers = 40; c->vocab = 248320; c->n_heads = 16; c->n_kv_heads = 2;
        c->head_dim = 256; c->lin_nk = 16; c->lin_nv = 32; c->lin_dk = 128; c->lin_dv = 128;
        c->n_experts = 256; c->top_k = 8; c->moe_inter = 512; c->shared_inter = 512;
    } else if (!strcmp(name, "tiny")) {
        c->hidden = 128; c->n_layers = 8; c->vocab = 512; c->n_heads = 4; c->n_kv_heads = 2;
        c->head_dim = 256; c->lin_nk = 2; c->lin_nv = 4; c->lin_dk = 128; c->lin_dv = 128;
        c->n_experts = 16; c->top_k = 4; c->moe_inter = 64; c->shared_inter = 64;
    } else {
        return lily_err(st, LILY_EINVAL, "unknown preset '%s' (35b-a3b, tiny)", name);
    }
    c->conv_k = 4; c->rot_dim = c->head_dim / 4; c->rope_theta = 1e7; c->eps = 1e-6; c->attn_output_gate = 1;
    for (int l = 0; l < c->n_layers; l++) c->full_attn[l] = (l + 1) % 4 == 0;
    return LILY_OK;
}

lily_code synth_write(const char *dir, const synth_opts *o, lily_status *st) {
    const lily_config *c = &o->cfg;
    if (c->hidden % 64 || c->moe_inter % 64 || (c->shared_inter && c->shared_inter % 64))
        return lily_err(st, LILY_EINVAL, "hidden (%d), moe_inter (%d) and shared_inter (%d) must be multiples of 64", c->hidden, c->moe_inter, c->shared_inter);
    if (c->top_k > c->n_experts || c->n_heads % c->n_kv_heads || c->lin_nv % c->lin_nk || c->n_layers < 1 || c->n_layers > LILY_MAX_LAYERS || c->vocab < 1)
        return lily_err(st, LILY_EINVAL, "inconsistent sizes (top-k %d of %d experts, heads %d/%d, linear heads %d/%d, layers %d)",
                        c->top_k, c->n_experts, c->n_heads, c->n_kv_heads, c->lin_nv, c->lin_nk, c->n_layers);
    if (o->seed >> 63) /* config.json records it, and JSON readers stop at int64 */
        return lily_err(st, LILY_EINVAL, "seed %llu must be below 2^63", (unsigned long long)o->seed);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return lily_err(st, LILY_EIO, "%s: %s", dir, strerror(errno));
    int eos0 = o->eos[0] || o->eos[1] ? o->eos[0] : 248046, eos1 = o->eos[0] || o->eos[1] ? o->eos[1] : 248044;
    spec_list L = { 0 };
    build_specs(o, &L);
    uint64_t shard = o->shard_bytes ? o->shard_bytes : (4ull << 30), total = 0, done = 0;
    for (int i = 0; i < L.n; i++) total += spec_bytes(&L.v[i]);
    int n_shards = 0;
    int *first = malloc((size_t)(L.n + 1) * sizeof *first);
    for (int i = 0; i < L.n;) { /* greedy shards in tensor order */
        first[n_shards++] = i;
        uint64_t sz = 0;
        do { sz += spec_bytes(&L.v[i]); i++; } while (i < L.n && sz + spec_bytes(&L.v[i]) <= shard);
    }
    first[n_shards] = L.n;
    lily_pool *pool = lily_pool_new(o->n_threads);
    lily_code rc = LILY_OK;
    char path[4096];
    size_t icap = 1 << 20, ik = 0;
    char *index = malloc(icap);
    ik += (size_t)snprintf(index + ik, icap - ik, "{\n  \"metadata\": {\"total_size\": %llu},\n  \"weight_map\": {", (unsigned long long)total);
    int first_entry = 1;
    for (int sh = 0; sh < n_shards && !rc; sh++) {
        char fname[64];
        snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", sh + 1, n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, fname);
        st_writer *w = NULL;
        if ((rc = st_writer_open(path, &w, st))) break;
        for (int i = first[sh]; i < first[sh + 1]; i++) declare(w, &L.v[i], st);
        rc = st_writer_begin_data(w, "pt", st);
        for (int i = first[sh]; i < first[sh + 1] && !rc; i++) {
            rc = write_tensor(w, pool, &L.v[i], hash_str(L.v[i].name, o->seed), st);
            done += spec_bytes(&L.v[i]);
            if (o->progress) o->progress(o->progress_user, done, total);
        }
        if (rc) { st_writer_abort(w); break; }
        if ((rc = st_writer_close(w, st))) break;
        for (int i = first[sh]; i < first[sh + 1]; i++) {
            int nparts = L.v[i].bits ? 3 : 1;
            for (int k = 0; k < nparts; k++) {
                char tn[256];
                out_name(&L.v[i], k, tn, sizeof tn);
                if (icap - ik < 1024) { icap *= 2; index = realloc(index, icap); LILY_ASSERT(index); }
                ik += (size_t)snprintf(index + ik, icap - ik, "%s\n    \"%s\": \"%s\"", first_entry ? "" : ",", tn, fname);
                first_entry = 0;
            }
        }
    }
    if (!rc) {
        ik += (size_t)snprintf(index + ik, icap - ik, "\n  }\n}\n");
        rc = write_json(dir, "model.safetensors.index.json", index, st);
    }
    if (!rc) {
        char *cfg = config_text(o, eos1);
        rc = write_json(dir, "config.json", cfg, st);
        free(cfg);
    }
    if (!rc) {
        char gen[512];
        snprintf(gen, sizeof gen, "{\n  \"bos_token_id\": %d,\n  \"eos_token_id\": [%d, %d],\n  \"pad_token_id\": %d,\n"
                 "  \"do_sample\": true,\n  \"temperature\": 1.0,\n  \"top_k\": 20,\n  \"top_p\": 0.95\n}\n", eos1, eos0, eos1, eos1);
        rc = write_json(dir, "generation_config.json", gen, st);
    }
    free(index);
    free(first);
    free(L.v);
    lily_pool_free(pool);
    return rc;
}
