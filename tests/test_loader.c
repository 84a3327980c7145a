/* Loading: config and safetensors errors name the field, tensor and file; the three
 * weight layouts bind; the MLX 4-bit path reproduces its reference exactly once the
 * fixture's one known defect (norms stored as bf16(1+w)) is undone. */
#include "t.h"
#include "cpu/cpu.h"
#include "loader/synth.h"
#include "util/util.h"
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmp[] = "/tmp/lily-test-loader-XXXXXX";

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return system(cmd);
}

/* Loads dir and checks the error code and that the message contains `want`. */
static void expect_fail(const char *dir, lily_code code, const char *want, const char *what) {
    lily_weights w;
    lily_status st = { 0 };
    lily_code rc = lw_load(dir, &w, &st);
    CHECK(rc == code, "%s: code %d (%s), want %d", what, rc, st.msg, code);
    CHECK(strstr(st.msg, want) != NULL, "%s: message '%s' lacks '%s'", what, st.msg, want);
    if (rc == LILY_OK) lw_free(&w);
}

static void test_config(void) {
    lily_config c;
    lily_status st = { 0 };
    const char *good = "{\"model_type\":\"qwen3_5_moe_text\",\"hidden_size\":64,\"num_hidden_layers\":4,\"vocab_size\":300,"
        "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":64,\"linear_num_key_heads\":1,\"linear_num_value_heads\":2,"
        "\"linear_key_head_dim\":32,\"linear_value_head_dim\":32,\"linear_conv_kernel_dim\":4,\"num_experts\":4,\"num_experts_per_tok\":2,"
        "\"moe_intermediate_size\":64,\"shared_expert_intermediate_size\":64,\"rms_norm_eps\":1e-6,\"rope_theta\":10000.0,"
        "\"partial_rotary_factor\":0.25}";
    CHECK(cfg_parse(good, NULL, &c, &st) == LILY_OK, "flat config: %s", st.msg);
    CHECK(c.full_attn[3] && !c.full_attn[2] && c.rot_dim == 16, "derived: full_attn by interval, rot_dim %d", c.rot_dim);
    struct { const char *json, *want; lily_code code; } bad[] = {
        { "{\"model_type\":\"llama\"}", "model_type", LILY_EUNSUPPORTED },
        { "{\"model_type\":\"qwen3_5_moe\"}", "text_config", LILY_EFORMAT },
        { "{\"model_type\":\"qwen3_5_moe_text\",\"hidden_size\":\"x\"}", "hidden_size", LILY_EFORMAT },
        { "{\"model_type\":\"qwen3_5_moe_text\"}", "hidden_size", LILY_EFORMAT },
        { "not json", "config.json", LILY_EFORMAT },
        { "[1,2]", "not a JSON object", LILY_EFORMAT },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(&st, 0, sizeof st);
        lily_code rc = cfg_parse(bad[i].json, NULL, &c, &st);
        CHECK(rc == bad[i].code && strstr(st.msg, bad[i].want), "config %zu: rc %d msg '%s' (want '%s')", i, rc, st.msg, bad[i].want);
    }
    /* a field out of range names itself */
    char *mut = strdup(good);
    char *p = strstr(mut, "\"num_experts_per_tok\":2");
    memcpy(p, "\"num_experts_per_tok\":9", strlen("\"num_experts_per_tok\":9"));
    CHECK(cfg_parse(mut, NULL, &c, &st) != LILY_OK && strstr(st.msg, "num_experts_per_tok"), "top-k > experts: %s", st.msg);
    free(mut);
    CHECK(cfg_parse(good, "{\"eos_token_id\":[7,8],\"temperature\":0.6,\"top_k\":20}", &c, &st) == LILY_OK &&
          c.n_eos == 2 && c.eos[1] == 8 && c.gen_top_k == 20 && fabsf(c.gen_temperature - 0.6f) < 1e-6f, "generation_config");
}

static void test_safetensors_errors(void) {
    char d[600];
    snprintf(d, sizeof d, "%s/m", tmp);
    synth_opts o;
    memset(&o, 0, sizeof o);
    lily_status st;
    synth_preset("tiny", &o.cfg, &st);
    o.mlx4 = 1;
    o.seed = 3;
    CHECK(synth_write(d, &o, &st) == LILY_OK, "synth: %s", st.msg);
    lily_weights w;
    lily_code lrc = lw_load(d, &w, &st);
    CHECK(lrc == LILY_OK, "load synth: %s", st.msg);
    if (lrc == LILY_OK) lw_free(&w);
    const char *f = "model-00001-of-00001.safetensors";
    /* truncated shard */
    sh("rm -rf %s/t && cp -r %s %s/t && truncate -s -1000 %s/t/%s", tmp, d, tmp, tmp, f);
    snprintf(d, sizeof d, "%s/t", tmp);
    expect_fail(d, LILY_EFORMAT, f, "truncated shard");
    /* corrupt header */
    sh("rm -rf %s/c && cp -r %s/m %s/c && printf 'XXXXXXXX' | dd of=%s/c/%s bs=1 seek=20 conv=notrunc status=none", tmp, tmp, tmp, tmp, f);
    snprintf(d, sizeof d, "%s/c", tmp);
    expect_fail(d, LILY_EFORMAT, "corrupt header", "corrupt header");
    /* huge header length */
    sh("rm -rf %s/h && cp -r %s/m %s/h && printf '\\377\\377\\377\\377' | dd of=%s/h/%s bs=1 seek=0 conv=notrunc status=none", tmp, tmp, tmp, tmp, f);
    snprintf(d, sizeof d, "%s/h", tmp);
    expect_fail(d, LILY_EFORMAT, "header length", "header length");
    /* config that disagrees with the tensors: a misshapen tensor is named */
    sh("rm -rf %s/s && cp -r %s/m %s/s && sed -i 's/\"moe_intermediate_size\": 64/\"moe_intermediate_size\": 128/' %s/s/config.json", tmp, tmp, tmp, tmp);
    snprintf(d, sizeof d, "%s/s", tmp);
    expect_fail(d, LILY_EFORMAT, "switch_mlp.gate_proj.weight", "misshapen tensor");
    /* more layers in the config than in the files: the missing tensor is named */
    sh("rm -rf %s/l && cp -r %s/m %s/l && sed -i 's/\"num_hidden_layers\": 8/\"num_hidden_layers\": 9/; s/\"full_attention\"]/\"full_attention\", \"linear_attention\"]/' %s/l/config.json", tmp, tmp, tmp, tmp);
    snprintf(d, sizeof d, "%s/l", tmp);
    expect_fail(d, LILY_EFORMAT, "layers.8.input_layernorm.weight", "missing tensor");
    /* fewer layers in the config: the leftover tensors are unexpected */
    sh("rm -rf %s/u && cp -r %s/m %s/u && sed -i 's/\"num_hidden_layers\": 8/\"num_hidden_layers\": 7/; s/, \"full_attention\"]/]/' %s/u/config.json", tmp, tmp, tmp, tmp);
    snprintf(d, sizeof d, "%s/u", tmp);
    expect_fail(d, LILY_EFORMAT, "unexpected tensor", "unexpected tensor");
    /* an index naming a shard that is not there */
    sh("rm -rf %s/x && cp -r %s/m %s/x && rm %s/x/%s", tmp, tmp, tmp, tmp, f);
    snprintf(d, sizeof d, "%s/x", tmp);
    expect_fail(d, LILY_EIO, f, "missing shard");
}

/* tiny-mlx4 stores the (1+w) norms rounded to bf16 while its reference used tiny's exact
 * w: with tiny's norms put back, the 4-bit path must match to float precision. */
static void test_mlx4_fixture(void) {
    lily_status st = { 0 };
    lily_weights q, h;
    if (lw_load("../shared/fixtures/tiny-mlx4", &q, &st) || lw_load("../shared/fixtures/tiny", &h, &st)) {
        CHECK(0, "load fixtures: %s", st.msg);
        return;
    }
    CHECK(!strcmp(q.layout, "mlx") && q.layers[0].qkv.type == LW_Q && q.layers[0].qkv.bits == 4 && q.layers[0].router.bits == 8,
          "tiny-mlx4 binds as MLX 4-bit with an 8-bit router");
    int H = q.cfg.hidden, hd = q.cfg.head_dim;
    memcpy(q.norm, h.norm, (size_t)H * 4);
    for (int l = 0; l < q.cfg.n_layers; l++) {
        memcpy(q.layers[l].ln1, h.layers[l].ln1, (size_t)H * 4);
        memcpy(q.layers[l].ln2, h.layers[l].ln2, (size_t)H * 4);
        if (q.layers[l].full_attn) {
            memcpy(q.layers[l].q_norm, h.layers[l].q_norm, (size_t)hd * 4);
            memcpy(q.layers[l].k_norm, h.layers[l].k_norm, (size_t)hd * 4);
        }
    }
    q.cfg.rope_bf16_freq = 1;
    st_set r;
    CHECK(st_open("../shared/fixtures/tiny-mlx4/reference.safetensors", &r, &st) == LILY_OK, "reference: %s", st.msg);
    const st_tensor *ids = st_find(&r, "prompt_ids"), *lg = st_find(&r, "logits_prefill");
    int P = (int)ids->shape[0], V = q.cfg.vocab;
    cpu_cache k;
    cpu_cache_new(&q.cfg, P, &k, &st);
    float *out = malloc((size_t)P * V * 4);
    cpu_forward(&q, &k, NULL, ids->data, P, 0, out, 1, NULL);
    double num = 0, den = 0;
    const float *ref = lg->data;
    for (size_t i = 0; i < (size_t)P * V; i++) { double d = out[i] - ref[i]; num += d * d; den += (double)ref[i] * ref[i]; }
    double e = sqrt(num / den);
    printf("tiny-mlx4 with exact norms: prefill rel err %.3e\n", e);
    CHECK(e < 1e-4, "tiny-mlx4 (exact norms) prefill rel err %.3e", e);
    free(out);
    cpu_cache_free(&k);
    st_close(&r);
    lw_free(&q);
    lw_free(&h);
}

int main(void) {
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    test_config();
    test_safetensors_errors();
    test_mlx4_fixture();
    sh("rm -rf %s", tmp);
    return T_DONE();
}
