/* Layer by layer against transformers' hidden_states on tiny/: localizes any error. */
#include "t.h"
#include "cpu/cpu.h"
#include <stdlib.h>

int main(void) {
    const char *dir = "../shared/fixtures/tiny";
    lily_status st = { 0 };
    lily_weights w;
    if (lw_load(dir, &w, &st)) { CHECK(0, "load: %s", st.msg); return T_DONE(); }
    w.cfg.rope_bf16_freq = 1; /* the reference was made after model.to(bfloat16) */
    st_set r;
    if (st_open("../shared/fixtures/tiny/reference.safetensors", &r, &st)) { CHECK(0, "ref: %s", st.msg); return T_DONE(); }
    const st_tensor *ids = st_find(&r, "prompt_ids"), *hid = st_find(&r, "hidden_prefill");
    CHECK(ids && hid, "reference tensors");
    if (!ids || !hid) return T_DONE();
    int P = (int)ids->shape[0], H = w.cfg.hidden, L = w.cfg.n_layers;
    cpu_cache k;
    CHECK(cpu_cache_new(&w.cfg, P, &k, &st) == LILY_OK, "cache");
    lily_pool *pool = lily_pool_new(2);
    float *h = malloc((size_t)(L + 1) * P * H * sizeof(float));
    cpu_forward(&w, &k, pool, ids->data, P, 0, NULL, 0, h);
    const float *ref = hid->data;
    for (int l = 0; l <= L; l++) {
        double num = 0, den = 0;
        for (size_t i = 0; i < (size_t)P * H; i++) {
            double d = h[(size_t)l * P * H + i] - ref[(size_t)l * P * H + i];
            num += d * d; den += (double)ref[(size_t)l * P * H + i] * ref[(size_t)l * P * H + i];
        }
        double e = sqrt(num / den);
        printf("hidden %d: rel err %.3e\n", l, e);
        CHECK(e < 1e-5, "hidden state %d rel err %.3e", l, e);
    }
    free(h);
    cpu_cache_free(&k);
    lily_pool_free(pool);
    st_close(&r);
    lw_free(&w);
    return T_DONE();
}
