#include "util/util.h"
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

void lily_die(const char *file, int line, const char *what) {
    fprintf(stderr, "lily: invariant failed at %s:%d: %s\n", file, line, what);
    abort();
}

lily_code lily_err(lily_status *st, lily_code code, const char *fmt, ...) {
    if (st) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(st->msg, sizeof st->msg, fmt, ap);
        va_end(ap);
        st->code = code;
    }
    return code;
}

const char *lily_code_name(lily_code c) {
    switch (c) {
    case LILY_OK: return "ok";
    case LILY_EINVAL: return "invalid argument";
    case LILY_EIO: return "I/O error";
    case LILY_ENOMEM: return "out of memory";
    case LILY_EFORMAT: return "bad format";
    case LILY_EUNSUPPORTED: return "unsupported";
    case LILY_ERANGE: return "out of range";
    case LILY_ECANCELED: return "canceled";
    case LILY_EDEVICE: return "device error";
    }
    return "unknown error";
}

float lily_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0) {
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    } else if (exp == 31) {
        v.u = sign | 0x7f800000u | (man << 13);
    } else {
        v.u = sign | ((exp + 112) << 23) | (man << 13);
    }
    return v.f;
}

uint16_t lily_f32_to_f16(float f) {
    union { float f; uint32_t u; } v = { f };
    uint32_t sign = (v.u >> 16) & 0x8000;
    float a = fabsf(f);
    if (isnan(f)) return (uint16_t)(sign | 0x7e00);
    if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00);
    if (a < 6.103515625e-05f) { /* subnormal: round to multiple of 2^-24 */
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f));
    }
    uint32_t u = v.u & 0x7fffffff;
    uint32_t r = u + 0xfff + ((u >> 13) & 1);
    return (uint16_t)(sign | (((r >> 23) - 112) << 10) | ((r >> 13) & 0x3ff));
}

double lily_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

extern char **environ;
int lily_env_note(const char *prog) {
    static const char *const pre[] = { "LILY_CU_", "LILY_MVQ", "LILY_SRV_" };
    char line[1024];
    size_t len = 0;
    int n = 0;
    for (char **e = environ; e && *e; e++)
        for (size_t k = 0; k < sizeof pre / sizeof pre[0]; k++)
            if (!strncmp(*e, pre[k], strlen(pre[k]))) {
                if (len < sizeof line) len += (size_t)snprintf(line + len, sizeof line - len, " %.100s", *e);
                n++;
                break;
            }
    if (n)
        fprintf(stderr, "%s: note: engine switches set (for measuring and tests; they change speed, some several times):%s%s\n", prog,
                line, len >= sizeof line ? " ..." : "");
    return n;
}

char *lily_read_file(const char *path, size_t *len, lily_status *st) {
    FILE *f = fopen(path, "rb");
    if (!f) { lily_err(st, LILY_EIO, "%s: %s", path, strerror(errno)); return NULL; }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        char *nb = realloc(buf, cap * 2 + 1);
        if (!nb) { free(buf); buf = NULL; break; }
        buf = nb; cap *= 2;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf) { lily_err(st, LILY_ENOMEM, "%s: out of memory reading file", path); return NULL; }
    if (err) { free(buf); lily_err(st, LILY_EIO, "%s: read error", path); return NULL; }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

/* ---- RNG ---- */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
void lily_rng_seed(lily_rng *r, uint64_t seed) {
    r->s[0] = splitmix64(&seed);
    r->s[1] = splitmix64(&seed);
}
uint64_t lily_rng_u64(lily_rng *r) { /* xoroshiro128+ */
    uint64_t s0 = r->s[0], s1 = r->s[1], res = s0 + s1;
    s1 ^= s0;
    r->s[0] = ((s0 << 24) | (s0 >> 40)) ^ s1 ^ (s1 << 16);
    r->s[1] = (s1 << 37) | (s1 >> 27);
    return res;
}
double lily_rng_uniform(lily_rng *r) { return (lily_rng_u64(r) >> 11) * 0x1.0p-53; }
float lily_rng_normal(lily_rng *r) {
    double u1 = lily_rng_uniform(r), u2 = lily_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* ---- thread pool ----
 * Workers claim indices from a shared atomic counter, so uneven items balance out;
 * the caller's thread works too. */
struct lily_pool {
    int n;
    pthread_t *th;
    pthread_mutex_t mu, run_mu; /* run_mu: one parallel loop at a time */
    pthread_cond_t go, done;
    uint64_t gen;
    int quit, active;
    void (*fn)(void *, int);
    void *ctx;
    int total;
    int next; /* atomic */
};

static void pool_work(lily_pool *p) {
    for (;;) {
        int i = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
        if (i >= p->total) break;
        p->fn(p->ctx, i);
    }
}

static void *pool_main(void *arg) {
    lily_pool *p = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->gen == seen) pthread_cond_wait(&p->go, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        pool_work(p);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

lily_pool *lily_pool_new(int n_threads) {
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    lily_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->run_mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    p->th = calloc((size_t)n_threads, sizeof *p->th);
    if (!p->th) { free(p); return NULL; }
    for (int i = 1; i < n_threads; i++)
        if (pthread_create(&p->th[i], NULL, pool_main, p) != 0) { p->n = i; break; }
    return p;
}

void lily_pool_free(lily_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
    free(p->th);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->run_mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p);
}

int lily_pool_size(const lily_pool *p) { return p ? p->n : 1; }

void lily_pool_run(lily_pool *p, int n, void (*fn)(void *ctx, int i), void *ctx) {
    if (n <= 0) return;
    if (!p || p->n == 1 || n == 1) {
        for (int i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    pthread_mutex_lock(&p->run_mu);
    pthread_mutex_lock(&p->mu);
    p->fn = fn; p->ctx = ctx; p->total = n; p->next = 0;
    p->active = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    pool_work(p);
    pthread_mutex_lock(&p->mu);
    while (p->active > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->run_mu);
}
