/* Shared helpers: error reporting, the one invariant macro, bf16/f16 conversion,
 * a small thread pool for data-parallel loops. */
#ifndef LILY_UTIL_H
#define LILY_UTIL_H
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include "lily.h"

/* Invariants (programmer errors, never bad input) abort here with file and line. */
#define LILY_ASSERT(c) do { if (!(c)) lily_die(__FILE__, __LINE__, #c); } while (0)
void lily_die(const char *file, int line, const char *what) __attribute__((noreturn));

/* Sets st (when not NULL) and returns code, so callers can `return lily_err(...)`. */
lily_code lily_err(lily_status *st, lily_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static inline float lily_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
    return v.f;
}
static inline uint16_t lily_f32_to_bf16(float f) { /* round to nearest even */
    union { float f; uint32_t u; } v = { f };
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1)) >> 16);
}
float lily_f16_to_f32(uint16_t h);
uint16_t lily_f32_to_f16(float f);

double lily_now(void); /* monotonic seconds */

/* The engine's measuring and test switches (LILY_CU_*, LILY_MVQ*, LILY_SRV_*) set in the environment, named
 * on one stderr line "PROG: note: ..." (nothing when none is): some cost several times the speed
 * (LILY_CU_MVQ_BLOCKS=1 decodes at a tenth), so a run under one should say so. Returns how many. */
int lily_env_note(const char *prog);

/* Thread pool: runs fn(ctx, i) for i in [0, n) across the pool's threads and waits. */
typedef struct lily_pool lily_pool;
lily_pool *lily_pool_new(int n_threads); /* 0 = all cores; NULL on failure */
void lily_pool_free(lily_pool *p);
int lily_pool_size(const lily_pool *p);
void lily_pool_run(lily_pool *p, int n, void (*fn)(void *ctx, int i), void *ctx);

/* Large host blocks written right after allocation (util/bigmem.c: backed by huge pages, and a
 * few freed ones kept for reuse, since faulting fresh pages in cost more than the copies that
 * fill them). Free only with lily_big_free. */
void *lily_big_alloc(size_t n);
void lily_big_free(void *p);

/* Reads a whole file (NUL-terminated); NULL with st set on failure. */
char *lily_read_file(const char *path, size_t *len, lily_status *st);

/* xorshift-style deterministic RNG (splitmix64 seeded). */
typedef struct { uint64_t s[2]; } lily_rng;
void lily_rng_seed(lily_rng *r, uint64_t seed);
uint64_t lily_rng_u64(lily_rng *r);
double lily_rng_uniform(lily_rng *r);  /* [0, 1) */
float lily_rng_normal(lily_rng *r);

#endif
