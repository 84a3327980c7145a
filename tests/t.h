/* Minimal test harness: CHECK counts, T_DONE prints the closing "N passed, N failed". */
#ifndef LILY_TEST_H
#define LILY_TEST_H
#include <stdio.h>
#include <math.h>
static int t_pass, t_fail;
#define CHECK(cond, ...) do { if (cond) t_pass++; else { t_fail++; \
    fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_NEAR(a, b, tol, what) do { double a_ = (a), b_ = (b); \
    CHECK(fabs(a_ - b_) <= (tol), "%s: %.9g vs %.9g (tol %g)", what, a_, b_, (double)(tol)); } while (0)
#define T_DONE() (printf("%d passed, %d failed\n", t_pass, t_fail), t_fail ? 1 : 0)
#endif
