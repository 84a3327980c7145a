/* Matmul dispatch: picks the kernel, prepares the inputs the quantized kernels read
 * (block-permuted X, per-group sums), cuts every job into row tasks and runs all the
 * tasks of all the jobs in one lily_pool_run. Task sizes depend on the shape only. */
#include "cpu/fast.h"
#include <stdlib.h>
#ifdef MM_HAVE_AVX2
#include <cpuid.h>
#endif

cpu_mm_kind cpu_mm_path = CPU_MM_AUTO;

int cpu_mm_avx2_available(void) {
#ifdef MM_HAVE_AVX2
    static int cached = -1;
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        /* F16C through cpuid: clang 14's __builtin_cpu_supports does not know "f16c" */
        unsigned a, b, c, d;
        int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
#else
    return 0;
#endif
}

static mm_rows_fn kernel_for(cpu_mm_kind k) {
    if (k == CPU_MM_AUTO) k = cpu_mm_avx2_available() ? CPU_MM_AVX2 : CPU_MM_C;
    if (k == CPU_MM_C) return mm_rows_c;
#ifdef MM_HAVE_AVX2
    if (k == CPU_MM_AVX2 && cpu_mm_avx2_available()) return mm_rows_avx2;
#endif
    return NULL;
}

/* About 64K weights per task (4..64 rows, a multiple of 4): enough work to pay for the
 * hand-off, enough tasks to balance threads. */
static int task_rows(int cols) {
    int r = 65536 / cols;
    if (r > 64) r = 64;
    r &= ~3;
    return r < 4 ? 4 : r;
}

typedef struct {
    mm_args a;
    mm_rows_fn fn;
    int rows_per, first_task;
    const float *src; /* the caller's X */
    float *own;       /* permuted X + xsum, freed after the run */
} job_state;

typedef struct { job_state *j; int n; } many_ctx;

static void many_task(void *p, int i) {
    many_ctx *c = p;
    int lo = 0, hi = c->n - 1;
    while (lo < hi) { /* the last job whose first task is <= i */
        int mid = (lo + hi + 1) / 2;
        if (c->j[mid].first_task <= i) lo = mid; else hi = mid - 1;
    }
    job_state *j = &c->j[lo];
    int r0 = (i - j->first_task) * j->rows_per, r1 = r0 + j->rows_per;
    if (r1 > j->a.rows) r1 = j->a.rows;
    j->fn(&j->a, r0, r1);
}

/* Permuted X and group sums for a quantized W, shared with an earlier job that has the
 * same input and code layout (gate and up projections read the same X): returns 1 when s
 * got buffers of its own (allocated here, filled by fill_q), 0 when it shares. */
static int prepare_q(job_state *s, const job_state *prev, int nprev, const cpu_mm_job *job) {
    const lw_mat *W = job->W;
    for (int i = 0; i < nprev; i++) {
        const lw_mat *P = prev[i].a.W;
        if (prev[i].src == job->X && prev[i].a.T == job->T && P->type == LW_Q && P->bits == W->bits &&
            P->group == W->group && P->cols == W->cols) {
            s->a.X = prev[i].a.X;
            s->a.xsum = prev[i].a.xsum;
            return 0;
        }
    }
    int T = job->T, n = W->cols, ng = n / W->group;
    s->own = malloc(((size_t)T * n + (size_t)T * ng) * sizeof(float));
    LILY_ASSERT(s->own);
    s->a.X = s->own;
    s->a.xsum = s->own + (size_t)T * n;
    return 1;
}

static void fill_q(const job_state *s) {
    const lw_mat *W = s->a.W;
    int T = s->a.T, n = W->cols, ng = n / W->group;
    float *xs = (float *)s->a.xsum;
    mm_permute(W, s->src, T, (float *)s->a.X);
    for (int t = 0; t < T; t++)
        for (int g = 0; g < ng; g++) {
            const float *x = s->src + (size_t)t * n + (size_t)g * W->group;
            float sum = 0;
            for (int e = 0; e < W->group; e++) sum += x[e];
            xs[(size_t)t * ng + g] = sum;
        }
}

typedef struct { job_state *j; const int *own; } fill_ctx;

static void fill_task(void *p, int i) {
    fill_ctx *c = p;
    fill_q(&c->j[c->own[i]]);
}

/* Runs the jobs `fn` supports in one region; returns how many it left for the caller. */
static void run_fast(lily_pool *pool, const cpu_mm_job *jobs, int n, mm_rows_fn fn, int *left) {
    job_state stack[64];
    int ostack[64];
    job_state *st = n <= 64 ? stack : malloc((size_t)n * sizeof *st);
    int *own = n <= 64 ? ostack : malloc((size_t)n * sizeof *own);
    LILY_ASSERT(st && own);
    int m = 0, tasks = 0, nown = 0;
    size_t fill_floats = 0;
    for (int i = 0; i < n; i++) {
        const cpu_mm_job *j = &jobs[i];
        left[i] = 0;
        if (j->T <= 0 || j->W->rows <= 0) continue;
        if (!mm_fast_supported(j->W)) { left[i] = 1; continue; }
        job_state *s = &st[m++];
        memset(s, 0, sizeof *s);
        s->a = (mm_args){ j->W, j->T, j->W->rows, j->W->cols, j->X, NULL, j->Y };
        s->src = j->X;
        s->fn = fn;
        if (j->W->type == LW_Q && prepare_q(s, st, m - 1, j)) {
            own[nown++] = m - 1;
            fill_floats += (size_t)j->T * j->W->cols;
        }
        s->rows_per = task_rows(j->W->cols);
        s->first_task = tasks;
        tasks += (j->W->rows + s->rows_per - 1) / s->rows_per;
    }
    /* The inputs' permutation and group sums: on the pool when there is enough of it (the
     * MoE's experts at prefill: every routed token's row once more), else right here, where
     * a hand-off would cost more than it saves (decode). Same values either way. */
    fill_ctx fc = { st, own };
    if (fill_floats >= 65536 && nown > 1) lily_pool_run(pool, nown, fill_task, &fc);
    else for (int i = 0; i < nown; i++) fill_q(&st[own[i]]);
    many_ctx c = { st, m };
    lily_pool_run(pool, tasks, many_task, &c);
    for (int i = 0; i < m; i++) free(st[i].own);
    if (st != stack) free(st);
    if (own != ostack) free(own);
}

int cpu_matmul_kind(lily_pool *pool, const cpu_mm_job *jobs, int n, cpu_mm_kind kind) {
    if (kind == CPU_MM_REF) {
        for (int i = 0; i < n; i++)
            if (jobs[i].T > 0) cpu_matmul_ref(pool, jobs[i].W, jobs[i].X, jobs[i].T, jobs[i].Y);
        return 1;
    }
    mm_rows_fn fn = kernel_for(kind);
    if (!fn) return 0;
    for (int i = 0; i < n; i++)
        if (jobs[i].T > 0 && !mm_fast_supported(jobs[i].W)) return 0;
    int stack[64], *left = n <= 64 ? stack : malloc((size_t)n * sizeof *left);
    LILY_ASSERT(left);
    run_fast(pool, jobs, n, fn, left);
    if (left != stack) free(left);
    return 1;
}

void cpu_matmul_many(lily_pool *pool, const cpu_mm_job *jobs, int n) {
    mm_rows_fn fn = cpu_mm_path == CPU_MM_REF ? NULL : kernel_for(cpu_mm_path);
    if (!fn) { cpu_matmul_kind(pool, jobs, n, CPU_MM_REF); return; }
    int stack[64], *left = n <= 64 ? stack : malloc((size_t)n * sizeof *left);
    LILY_ASSERT(left);
    run_fast(pool, jobs, n, fn, left);
    for (int i = 0; i < n; i++) /* what the fast kernels decline */
        if (left[i]) cpu_matmul_ref(pool, jobs[i].W, jobs[i].X, jobs[i].T, jobs[i].Y);
    if (left != stack) free(left);
}

void cpu_matmul(lily_pool *pool, const lw_mat *W, const float *X, int T, float *Y) {
    cpu_mm_job j = { W, X, T, Y };
    cpu_matmul_many(pool, &j, 1);
}
