/* Minimal test harness: CHECK counts, T_DONE prints the closing "N passed, N failed". */
#ifndef LILY_TEST_H
#define LILY_TEST_H
#include <stdio.h>
#include <math.h>
static int t_pass, t_fail;
/* While t_soft is set a failed check is printed as a note and counted in t_soft_fail: a test
 * whose inputs can legitimately land on a knife edge (an MoE router near-tie flips one expert
 * when float rounding changes) runs once soft and, if anything missed, again on fresh inputs
 * that decide. A real defect fails both runs. */
static int t_soft, t_soft_fail;
#define CHECK(cond, ...) do { if (cond) t_pass++; else { if (t_soft) t_soft_fail++; else t_fail++; \
    fprintf(stderr, "%s %s:%d: %s: ", t_soft ? "miss (first inputs)" : "FAIL", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_NEAR(a, b, tol, what) do { double a_ = (a), b_ = (b); \
    CHECK(fabs(a_ - b_) <= (tol), "%s: %.9g vs %.9g (tol %g)", what, a_, b_, (double)(tol)); } while (0)
/* Random tests draw fresh inputs each run; the seed is printed so a failure can be replayed
 * with LILY_TEST_SEED=N. */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static inline uint64_t t_seed(const char *name) {
    const char *e = getenv("LILY_TEST_SEED");
    uint64_t s = e && *e ? strtoull(e, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    fprintf(stderr, "%s seed %llu (replay: LILY_TEST_SEED=%llu)\n", name, (unsigned long long)s, (unsigned long long)s);
    return s;
}
#define T_DONE() (printf("%d passed, %d failed\n", t_pass, t_fail), t_fail ? 1 : 0)
#endif
