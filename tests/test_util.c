#include "t.h"
#include "util/util.h"
#include <stdint.h>
#include <stdlib.h>

static void sq(void *ctx, int i) { ((int *)ctx)[i] = i * i; }

int main(void) {
    /* bf16 round trip and rounding to nearest even */
    CHECK(lily_bf16_to_f32(lily_f32_to_bf16(1.0f)) == 1.0f, "1.0");
    CHECK(lily_f32_to_bf16(1.00390625f) == 0x3f80, "tie rounds to even");
    CHECK(lily_f32_to_bf16(1.01171875f) == 0x3f82, "tie rounds to even (up)");
    for (float f = -70000.f; f < 70000.f; f += 13.37f)
        CHECK(fabsf(lily_f16_to_f32(lily_f32_to_f16(f)) - (fabsf(f) > 65504 ? (f > 0 ? INFINITY : -INFINITY) : f)) <= fabsf(f) / 1024 + 1e-3f || fabsf(f) > 65504, "f16 %g", f);
    CHECK(lily_f16_to_f32(0x3c00) == 1.0f, "f16 one");
    CHECK(lily_f16_to_f32(0x0001) == ldexpf(1, -24), "f16 subnormal");
    /* pool covers every index exactly once */
    lily_pool *p = lily_pool_new(4);
    int v[1000];
    for (int rep = 0; rep < 50; rep++) {
        memset(v, 0xff, sizeof v);
        lily_pool_run(p, 1000, sq, v);
        int ok = 1;
        for (int i = 0; i < 1000; i++) ok &= v[i] == i * i;
        CHECK(ok, "pool rep %d", rep);
    }
    lily_pool_free(p);
    lily_rng r; lily_rng_seed(&r, 42);
    double m = 0; for (int i = 0; i < 10000; i++) m += lily_rng_uniform(&r);
    CHECK_NEAR(m / 10000, 0.5, 0.02, "uniform mean");
    /* large blocks (util/bigmem.c): every size holds what was written, and blocks come back
     * from the kept list (more blocks freed than it keeps, several sizes, aligned as malloc aligns) */
    {
        /* (300 + 260 MB freed together pass the kept list's 512 MB; 520 MB alone is never kept) */
        const size_t sz[] = { 1, 100, 1u << 20, (3u << 20) + 5, 1u << 20, (3u << 20) + 5, 64u << 20, 1u << 20,
                              300u << 20, 260u << 20, 520u << 20 };
        enum { NB = sizeof sz / sizeof sz[0] };
        for (int round = 0; round < 3; round++) {
            unsigned char *b[NB];
            for (int i = 0; i < NB; i++) {
                b[i] = lily_big_alloc(sz[i]);
                CHECK(b[i] && ((uintptr_t)b[i] & 15) == 0, "big block %d of %zu bytes (round %d): %p", i, sz[i], round, (void *)b[i]);
                if (!b[i]) return T_DONE();
                const size_t step = sz[i] > (64u << 20) ? (1u << 20) + 3 : 4093;
                for (size_t k = 0; k < sz[i]; k += step) b[i][k] = (unsigned char)(i * 31 + round + k);
                b[i][sz[i] - 1] = (unsigned char)(i + 7);
            }
            for (int i = 0; i < NB; i++) {
                int ok = b[i][sz[i] - 1] == (unsigned char)(i + 7);
                const size_t step = sz[i] > (64u << 20) ? (1u << 20) + 3 : 4093;
                for (size_t k = 0; k < sz[i] - 1; k += step) ok &= b[i][k] == (unsigned char)(i * 31 + round + k);
                CHECK(ok, "big block %d of %zu bytes kept its contents (round %d)", i, sz[i], round);
            }
            for (int i = NB - 1; i >= 0; i--) lily_big_free(b[i]);
        }
        lily_big_free(NULL);
    }
    return T_DONE();
}
