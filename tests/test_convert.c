/* convert: quantizer round trips and error bounds on fresh random data, search vs
 * min/max, the packing layout, bit-exactness of converting fixtures/tiny against
 * fixtures/tiny-mlx4, the per-expert layout, failure cleanup, and the memory arithmetic. */
#include "t.h"
#include "convert/convert.h"
#include "loader/config.h"
#include "loader/safetensors.h"
#include "util/util.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TINY "../shared/fixtures/tiny"
#define TINY4 "../shared/fixtures/tiny-mlx4"

static double rel(const convert_qerr *e) { return sqrt(e->err2 / e->ref2); }

static void test_roundtrip(lily_rng *r) {
    static const int bits_l[] = { 2, 4, 8 }, groups[] = { 32, 64, 128 };
    for (int bi = 0; bi < 3; bi++)
        for (int gi = 0; gi < 3; gi++) {
            int bits = bits_l[bi], group = groups[gi];
            size_t rows = 37, cols = (size_t)group * 5, n = rows * cols, ng = n / group;
            float *w = malloc(n * 4), *d = malloc(n * 4);
            uint32_t *codes = malloc(n * bits / 8);
            uint16_t *s = malloc(ng * 2), *b = malloc(ng * 2);
            for (size_t i = 0; i < n; i++) w[i] = lily_rng_normal(r) * (0.01f + (float)(i / cols) * 0.1f) + (float)(i % 7) * 0.01f;
            convert_qerr e = { 0 };
            convert_quantize(w, rows, cols, bits, group, CONVERT_QUANT_MINMAX, codes, s, b, &e);
            convert_dequantize(codes, s, b, rows, cols, bits, group, d);
            /* every element within half a step, plus what bf16 rounding of scale and bias costs */
            int within = 1;
            double e2 = 0, r2 = 0;
            for (size_t g = 0; g < ng && within; g++) {
                float lo = w[g * group], hi = lo;
                for (int k = 1; k < group; k++) { lo = fminf(lo, w[g * group + k]); hi = fmaxf(hi, w[g * group + k]); }
                double step = lily_bf16_to_f32(s[g]);
                double tol = 0.5 * step + (fabs(lo) + fabs(hi)) / 128.0 + 1e-7;
                for (int k = 0; k < group; k++) {
                    double diff = fabs((double)w[g * group + k] - d[g * group + k]);
                    if (diff > tol) { within = 0; CHECK(0, "bits %d group %d: element off by %g > %g", bits, group, diff, tol); break; }
                    e2 += diff * diff; r2 += (double)w[g * group + k] * w[g * group + k];
                }
            }
            CHECK(within, "bits %d group %d bound", bits, group);
            CHECK_NEAR(e2 / r2, e.err2 / e.ref2, 1e-6 * e2 / r2 + 1e-12, "reported error equals the dequantized error");
            /* expected size of the error: a uniform step error is step/sqrt(12) */
            double lim = bits == 2 ? 0.7 : bits == 4 ? 0.16 : 0.012;
            CHECK(rel(&e) < lim && rel(&e) > lim / 20, "bits %d group %d: relative error %g", bits, group, rel(&e));
            /* search never worse, per tensor */
            convert_qerr es = { 0 };
            convert_quantize(w, rows, cols, bits, group, CONVERT_QUANT_SEARCH, codes, s, b, &es);
            CHECK(es.err2 <= e.err2, "bits %d group %d: search %g > minmax %g", bits, group, es.err2, e.err2);
            convert_dequantize(codes, s, b, rows, cols, bits, group, d);
            double se2 = 0;
            for (size_t i = 0; i < n; i++) se2 += ((double)w[i] - d[i]) * ((double)w[i] - d[i]);
            CHECK_NEAR(se2, es.err2, 1e-6 * se2, "search's reported error equals its dequantized error");
            if (bits == 4 && group == 64) printf("random normal rows, 4-bit g64: minmax rel err %.5f, search %.5f\n", rel(&e), rel(&es));
            free(w); free(d); free(codes); free(s); free(b);
        }
}

/* Search beats min/max clearly on Gaussian weights (outliers widen the min/max range). */
static void test_search_gain(lily_rng *r) {
    size_t rows = 256, cols = 512, n = rows * cols;
    float *w = malloc(n * 4);
    for (size_t i = 0; i < n; i++) w[i] = lily_rng_normal(r) * 0.02f;
    uint32_t *codes = malloc(n / 2);
    uint16_t *s = malloc(n / 64 * 2), *b = malloc(n / 64 * 2);
    convert_qerr a = { 0 }, c = { 0 };
    convert_quantize(w, rows, cols, 4, 64, CONVERT_QUANT_MINMAX, codes, s, b, &a);
    convert_quantize(w, rows, cols, 4, 64, CONVERT_QUANT_SEARCH, codes, s, b, &c);
    printf("gaussian 256x512 4-bit g64: minmax %.5f, search %.5f (%.1f%% lower)\n", rel(&a), rel(&c), 100 * (1 - rel(&c) / rel(&a)));
    CHECK(rel(&c) < 0.95 * rel(&a), "search %g should be >5%% below minmax %g", rel(&c), rel(&a));
    free(w); free(codes); free(s); free(b);
}

/* Exactly representable values come back exactly, in MLX's bit positions. */
static void test_packing(lily_rng *r) {
    float w[64];
    int q[64];
    for (int bits = 4; bits <= 8; bits += 4) {
        int levels = (1 << bits) - 1;
        for (int i = 0; i < 64; i++) q[i] = (int)(lily_rng_u64(r) % (uint64_t)(levels + 1));
        q[3] = 0; q[9] = levels;          /* the range is hit, so scale = 1/8, bias = -1 */
        for (int i = 0; i < 64; i++) w[i] = -1.0f + 0.125f * q[i] * (15.0f / levels);
        uint32_t codes[16];
        uint16_t s, b;
        convert_quantize(w, 1, 64, bits, 64, CONVERT_QUANT_MINMAX, codes, &s, &b, NULL);
        int ok = 1, per = 32 / bits;
        for (int i = 0; i < 64; i++) ok &= (int)((codes[i / per] >> (bits * (i % per))) & (uint32_t)levels) == q[i];
        CHECK(ok, "%d-bit codes at bits [j*%d, (j+1)*%d)", bits, bits, bits);
        CHECK(lily_bf16_to_f32(b) == -1.0f, "bias");
    }
}

static int same_tensors(const char *a, const char *b, int want_bytes) {
    st_set x, y;
    lily_status st = { 0 };
    if (st_open(a, &x, &st) || st_open(b, &y, &st)) { CHECK(0, "open: %s", st.msg); return 0; }
    int bad = 0;
    CHECK(x.n_tensors == y.n_tensors, "%s has %d tensors, %s %d", a, x.n_tensors, b, y.n_tensors);
    for (int i = 0; i < y.n_tensors; i++) {
        const st_tensor *t = &y.tensors[i], *u = st_find(&x, t->name);
        int ok = u && u->dtype == t->dtype && u->ndim == t->ndim && u->nbytes == t->nbytes;
        for (int d = 0; ok && d < t->ndim; d++) ok = u->shape[d] == t->shape[d];
        if (ok && want_bytes) ok = !memcmp(u->data, t->data, t->nbytes);
        if (!ok) { bad++; if (bad < 5) CHECK(0, "tensor %s differs between %s and %s", t->name, a, b); }
    }
    CHECK(bad == 0, "%d tensors differ", bad);
    st_close(&x); st_close(&y);
    return bad == 0;
}

static void test_tiny_exact(const char *tmp) {
    char out[512];
    snprintf(out, sizeof out, "%s/tiny-mlx4", tmp);
    convert_opts o;
    convert_opts_default(&o);
    o.shard_bytes = 3000000;
    convert_result res;
    lily_status st = { 0 };
    lily_code rc = convert_run(TINY, out, &o, &res, &st);
    CHECK(rc == LILY_OK, "convert tiny: %s", st.msg);
    if (rc) return;
    same_tensors(out, TINY4, 1);
    char p1[600], p2[600];
    snprintf(p1, sizeof p1, "%s/config.json", out);
    snprintf(p2, sizeof p2, "%s/config.json", TINY4);
    json_t *a = json_load_file(p1, 0, NULL), *b = json_load_file(p2, 0, NULL);
    CHECK(a && b && json_equal(a, b), "config.json equals tiny-mlx4's (quantization included)");
    json_decref(a); json_decref(b);
    snprintf(p1, sizeof p1, "%s/generation_config.json", out);
    CHECK(access(p1, F_OK) == 0, "generation_config.json copied");
    CHECK(res.n_dropped == 21 && res.rel_err > 0.05 && res.rel_err < 0.15, "dropped %d, rel err %g", res.n_dropped, res.rel_err);
    printf("tiny: min/max rel err %.5f (worst %.5f %s)\n", res.rel_err, res.max_rel_err, res.worst);
    /* the search quantizer on the same model: lower error */
    snprintf(out, sizeof out, "%s/tiny-search", tmp);
    o.method = CONVERT_QUANT_SEARCH;
    convert_result rs;
    rc = convert_run(TINY, out, &o, &rs, &st);
    CHECK(rc == LILY_OK && rs.rel_err < res.rel_err, "search: %s %g vs %g", st.msg, rs.rel_err, res.rel_err);
    printf("tiny: search rel err %.5f (%.1f%% lower than min/max)\n", rs.rel_err, 100 * (1 - rs.rel_err / res.rel_err));
    same_tensors(out, TINY4, 0);
}

/* Rewrites tiny with one tensor per expert and checks it converts to the same bytes. */
static void test_per_expert(const char *tmp) {
    st_set src;
    lily_status st = { 0 };
    if (st_open(TINY, &src, &st)) { CHECK(0, "%s", st.msg); return; }
    char dir[512], path[600], cmd[1400];
    snprintf(dir, sizeof dir, "%s/tiny-pe", tmp);
    mkdir(dir, 0755);
    snprintf(cmd, sizeof cmd, "cp %s/config.json %s/generation_config.json %s/", TINY, TINY, dir);
    CHECK(system(cmd) == 0, "copy config");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_writer *w;
    CHECK(st_writer_open(path, &w, &st) == LILY_OK, "%s", st.msg);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < src.n_tensors; i++) {
            const st_tensor *t = &src.tensors[i];
            const char *gu = strstr(t->name, "mlp.experts.gate_up_proj"), *dn = strstr(t->name, "mlp.experts.down_proj");
            if (!gu && !dn) {
                if (pass == 0) st_writer_declare(w, t->name, t->dtype, t->ndim, t->shape, &st);
                else st_writer_write(w, t->data, t->nbytes, &st);
                continue;
            }
            int64_t E = t->shape[0], R = gu ? t->shape[1] / 2 : t->shape[1], C = t->shape[2];
            int stem = (int)((gu ? gu : dn) - t->name);
            for (int64_t e = 0; e < E; e++)
                for (int part = 0; part < (gu ? 2 : 1); part++) {
                    char nm[512];
                    snprintf(nm, sizeof nm, "%.*smlp.experts.%lld.%s.weight", stem, t->name, (long long)e,
                             gu ? (part ? "up_proj" : "gate_proj") : "down_proj");
                    int64_t sh[2] = { R, C };
                    if (pass == 0) st_writer_declare(w, nm, t->dtype, 2, sh, &st);
                    else st_writer_write(w, (const uint8_t *)t->data + ((size_t)(e * (gu ? 2 * R : R) + part * R) * C * 2), (size_t)(R * C * 2), &st);
                }
        }
        /* an MTP head (dropped, experts included) */
        static const uint16_t z[128 * 128];
        int64_t sh[2] = { 128, 128 };
        if (pass == 0) {
            st_writer_declare(w, "mtp.fc.weight", ST_BF16, 2, sh, &st);
            st_writer_declare(w, "mtp.layers.0.mlp.experts.0.gate_proj.weight", ST_BF16, 2, sh, &st);
            st_writer_begin_data(w, "pt", &st);
        } else {
            st_writer_write(w, z, sizeof z, &st);
            st_writer_write(w, z, sizeof z, &st);
        }
    }
    CHECK(st_writer_close(w, &st) == LILY_OK, "%s", st.msg);
    st_close(&src);
    char out[600];
    snprintf(out, sizeof out, "%s/tiny-pe-mlx4", tmp);
    convert_result res;
    lily_code rc = convert_run(dir, out, NULL, &res, &st);
    CHECK(rc == LILY_OK, "convert per-expert: %s", st.msg);
    if (rc == LILY_OK) same_tensors(out, TINY4, 1);
    CHECK(rc == LILY_OK && res.n_dropped == 21 + 2, "vision and MTP tensors dropped: %d", res.n_dropped);
}

static int cancel_after;
static volatile int cancel_flag;
static void count_progress(void *u, const convert_progress *p) { (void)u; (void)p; }
static void count_tensor(void *u, const char *n, int b, double e) {
    (void)u; (void)n; (void)b; (void)e;
    if (--cancel_after == 0) cancel_flag = 1;
}

static void test_failures(const char *tmp) {
    char out[512], part[600];
    lily_status st = { 0 };
    snprintf(out, sizeof out, "%s/tiny-mlx4", tmp);
    CHECK(convert_run(TINY, out, NULL, NULL, &st) == LILY_EINVAL && strstr(st.msg, "exists"), "existing target refused: %s", st.msg);
    CHECK(convert_run(TINY4, "/nonexistent-dir/x", NULL, NULL, &st) != LILY_OK && strstr(st.msg, "quantized"), "quantized source: %s", st.msg);
    /* canceled half way: neither the target nor the temporary folder remains */
    snprintf(out, sizeof out, "%s/canceled", tmp);
    snprintf(part, sizeof part, "%s.partial", out);
    convert_opts o;
    convert_opts_default(&o);
    o.cancel = &cancel_flag;
    o.progress = count_progress;
    o.tensor_done = count_tensor;
    cancel_after = 40;
    cancel_flag = 0;
    o.shard_bytes = 1000000;
    lily_code rc = convert_run(TINY, out, &o, NULL, &st);
    CHECK(rc == LILY_ECANCELED, "canceled: %d %s", rc, st.msg);
    CHECK(access(out, F_OK) != 0 && access(part, F_OK) != 0, "nothing left after cancel");
    /* a stale .partial from a killed run is cleaned up; a foreign one is refused */
    mkdir(part, 0755);
    char m[700];
    snprintf(m, sizeof m, "%s/.lily-convert-incomplete", part);
    fclose(fopen(m, "w"));
    rc = convert_run(TINY, out, NULL, NULL, &st);
    CHECK(rc == LILY_OK && access(part, F_OK) != 0, "stale partial replaced: %s", st.msg);
    snprintf(out, sizeof out, "%s/foreign", tmp);
    snprintf(part, sizeof part, "%s.partial", out);
    mkdir(part, 0755);
    CHECK(convert_run(TINY, out, NULL, NULL, &st) == LILY_EINVAL && access(out, F_OK) != 0, "foreign partial refused: %s", st.msg);
    o.bits = 3;
    CHECK(convert_run(TINY, out, &o, NULL, &st) == LILY_EINVAL, "bits 3 refused");
}

static void test_memory(void) {
    const char *cfgjson =
        "{\"model_type\":\"qwen3_5_moe\",\"text_config\":{\"model_type\":\"qwen3_5_moe_text\",\"hidden_size\":2048,"
        "\"num_hidden_layers\":40,\"vocab_size\":248320,\"num_attention_heads\":16,\"num_key_value_heads\":2,\"head_dim\":256,"
        "\"linear_num_key_heads\":16,\"linear_num_value_heads\":32,\"linear_key_head_dim\":128,\"linear_value_head_dim\":128,"
        "\"linear_conv_kernel_dim\":4,\"num_experts\":256,\"num_experts_per_tok\":8,\"moe_intermediate_size\":512,"
        "\"shared_expert_intermediate_size\":512,\"rms_norm_eps\":1e-6,\"full_attention_interval\":4,"
        "\"partial_rotary_factor\":0.25,\"rope_parameters\":{\"rope_theta\":10000000,\"partial_rotary_factor\":0.25}}}";
    lily_config c;
    lily_status st = { 0 };
    lily_code rc = cfg_parse(cfgjson, NULL, &c, &st);
    CHECK(rc == LILY_OK, "cfg_parse: %s", st.msg);
    if (rc) return;
    int ctx = 1 + (int)(time(NULL) % 100000);
    convert_memory m;
    convert_memory_estimate(&c, 123456789, ctx, 2, &m);
    /* spec: 10 full-attention layers x 2 kv heads x 256 x (K+V) values per token */
    CHECK(m.kv_cache == 10ull * 2 * 256 * 2 * ctx * 2, "kv bytes %llu at ctx %d", (unsigned long long)m.kv_cache, ctx);
    /* 30 linear layers x (32 x 128 x 128 f32 state + 8192 x 3 f32 conv state) */
    CHECK(m.deltanet == 30ull * (32 * 128 * 128 * 4 + 8192 * 3 * 4), "deltanet %llu", (unsigned long long)m.deltanet);
    CHECK(m.total == 123456789ull + m.kv_cache + m.deltanet, "total");
}

int main(void) {
    lily_rng r;
    lily_rng_seed(&r, t_seed("test_convert"));
    test_roundtrip(&r);
    test_search_gain(&r);
    test_packing(&r);
    test_memory();
    char tmp[] = "/tmp/lily-test-convert-XXXXXX";
    if (!mkdtemp(tmp)) { CHECK(0, "mkdtemp"); return T_DONE(); }
    test_tiny_exact(tmp);
    test_per_expert(tmp);
    test_failures(tmp);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return T_DONE();
}
