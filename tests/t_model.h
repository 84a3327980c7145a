/* The small real-architecture fixture for session tests, on the backend LILY_TEST_BACKEND
 * names ("cuda": the CUDA backend, e.g. on the emulator in tests/it_cuda_emu.sh; else the
 * CPU). Prints the backend it got so a run shows which one it checked. */
#ifndef LILY_T_MODEL_H
#define LILY_T_MODEL_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lily.h"

static lily_model *t_open_tiny(const char *test, int max_sessions, lily_model_info *info) {
    const char *dir = "../shared/fixtures/tiny";
    lily_model_opts o;
    lily_model_opts_default(&o);
    o.n_threads = 2;
    o.max_ctx = 256;
    o.max_sessions = max_sessions;
    const char *be = getenv("LILY_TEST_BACKEND");
    if (be && !strcmp(be, "cuda")) o.backend = LILY_BACKEND_CUDA;
    lily_model *m = NULL;
    lily_status st = { 0 };
    if (lily_model_open(dir, &o, &m, &st)) {
        fprintf(stderr, "%s: cannot open %s: %s\n", test, dir, st.msg);
        return NULL;
    }
    lily_model_get_info(m, info);
    fprintf(stderr, "%s on the %s backend\n", test, info->backend);
    return m;
}
#endif
