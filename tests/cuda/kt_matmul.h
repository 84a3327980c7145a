/* The matrix kernels against the CPU: matmul variants, decode's matrix-vector kernels (one row,
 * 2-8 rows, slots of experts), wgmma, prefill's grouped, split and SwiGLU GEMMs.
 * Included by kernel_test.c, which owns rng, report(), the counters and the matrix makers. */
static void test_matmul(lily_pool *pool, lw_type t, int bits, int group, int rows, int cols, int T) {
    void *hold[3];
    lw_mat W = mk_mat(t, bits, group, rows, cols, hold);
    float *X = rnd((size_t)T * cols, 1.0f), *ref = malloc((size_t)T * rows * 4), *Y = malloc((size_t)T * rows * 4);
    cpu_matmul(pool, &W, X, T, ref);
    const double flo = products_sq(&W, X, T); /* (once: every form is measured against it) */
    int nv = t == LW_Q && cols % 64 == 0 ? 4 : 3; /* the FP16 GEMM takes 4- and 8-bit, cols % 64 */
    int extra[3], ne = 0;
    if (rows <= 8) extra[ne++] = 7;          /* a warp a token for few rows */
    if (T > 8 && rows > 8) extra[ne++] = 8;  /* the exact router's split tiles, tensor cores */
    if (T > 8 && rows > 8) extra[ne++] = 9;  /* and SIMT */
    for (int vi = 0; vi < nv + ne; vi++) {
        int v = vi >= nv ? extra[vi - nv] : vi == 3 ? 5 : vi;
        lily_status st = { 0 };
        char what[160];
        snprintf(what, sizeof what, "matmul %s %s %dx%d T=%d",
                 v == 9 ? "exact-splitk-simt" : v == 8 ? "exact-splitk" : v == 7 ? "rows-fp32" : v == 5 ? "gemm-fp16" : v == 2 ? "tiled-tf32" : v ? "tiled-fp32" : "mv",
                 tname(t, bits), rows, cols, T);
        for (size_t i = 0; i < (size_t)T * rows; i++) Y[i] = NAN;
        if (lct_matmul(&W, 1, X, T, v, NULL, 0, Y, &st)) { printf("%s: %s\n", what, st.msg); n_fail++; continue; }
        /* TF32 and FP16 tensor cores: 10-bit mantissas */
        report(what, rel_den(Y, ref, (size_t)T * rows, flo), v >= 2 && v < 7 ? 3e-3 : 1e-5);
    }
    free(X); free(ref); free(Y);
    for (int i = 0; i < 3; i++) free(hold[i]);
}

/* The decode matrix-vector kernels on an input of wide range: 64-column stretches scaled by 1e5 (past
 * fp16's 65,504), 1e-6 and 1 in turn, so an fp16 input path that did not scale its input would overflow. */
static void test_matvec_range(lily_pool *pool, int rows, int cols) {
    void *hold[3];
    lw_mat W = mk_mat(LW_Q, 4, 64, rows, cols, hold);
    float *X = rnd((size_t)cols, 1.0f), *ref = malloc((size_t)rows * 4), *Y = malloc((size_t)rows * 4);
    static const float sc[3] = { 1e5f, 1e-6f, 1.0f };
    for (int i = 0; i < cols; i++) X[i] *= sc[(i / 64) % 3];
    cpu_matmul(pool, &W, X, 1, ref);
    for (int i = 0; i < rows; i++) Y[i] = NAN;
    lily_status st = { 0 };
    char what[160];
    snprintf(what, sizeof what, "matvec q4 %dx%d, input 1e5/1e-6/1 a 64 columns", rows, cols);
    if (lct_matmul(&W, 1, X, 1, 0, NULL, 0, Y, &st)) { printf("%s: %s\n", what, st.msg); n_fail++; }
    else report(what, rel(Y, ref, (size_t)rows), 1e-5);
    free(X); free(ref); free(Y);
    for (int i = 0; i < 3; i++) free(hold[i]);
}

/* The matrix-vector kernel for T input rows (decode batches, cu_matvec_rows): n matrices
 * reading the same T rows in one launch, optionally through the fused SwiGLU input; bits 0:
 * 4- and 8-bit matrices alternating (one launch per code width). Each case several ways: as
 * cu_matvec_rows picks, without k_mvdpb (k_mvqb), and k_mvdpb's two forms and k_mvdpt alone where
 * they take the shape (cols % 64 == 0, at least 512; dp 1: they must). */
static void test_matvec_rows(lily_pool *pool, int bits, int n, const int *rows, int cols, int T, int swiglu) {
    void *hold[4][3];
    lw_mat W[4];
    float *ref[4], *Y[4];
    for (int i = 0; i < n; i++) {
        W[i] = mk_mat(LW_Q, bits ? bits : 4 + 4 * (i % 2), 64, rows[i], cols, hold[i]);
        ref[i] = malloc((size_t)T * rows[i] * 4);
        Y[i] = malloc((size_t)T * rows[i] * 4);
        for (size_t k = 0; k < (size_t)T * rows[i]; k++) Y[i][k] = NAN;
    }
    float *X = rnd((size_t)T * cols, 1.0f), *X2 = swiglu ? rnd((size_t)T * cols, 1.0f) : NULL;
    float *xin = malloc((size_t)T * cols * 4);
    for (size_t k = 0; k < (size_t)T * cols; k++) xin[k] = swiglu ? X[k] / (1.0f + expf(-X[k])) * X2[k] : X[k];
    for (int i = 0; i < n; i++) cpu_matmul(pool, &W[i], xin, T, ref[i]);
    static const char *kname[5] = { "", " k_mvqb", " k_mvdpb", " k_mvdpb pf", " k_mvdpt" };
    const int dp = bits != 0 && cols % 64 == 0 && cols >= 512;
    for (int kern = 0; kern < 2 + 3 * dp; kern++) {
        lily_status st = { 0 };
        char what[160];
        snprintf(what, sizeof what, "matvec rows q%s n=%d %dx%d T=%d%s%s", bits == 8 ? "8" : bits == 4 ? "4" : "4+8", n, rows[0], cols, T,
                 swiglu ? " swiglu" : "", kname[kern]);
        for (int i = 0; i < n; i++)
            for (size_t k = 0; k < (size_t)T * rows[i]; k++) Y[i][k] = NAN;
        if (lct_matvec_rows(W, n, X, X2, T, Y, kern, &st)) { printf("%s: %s\n", what, st.msg); n_fail++; }
        else {
            double worst = 0;
            for (int i = 0; i < n; i++) {
                double r = rel(Y[i], ref[i], (size_t)T * rows[i]);
                if (!(r <= worst)) worst = r;
            }
            report(what, worst, 1e-5);
        }
    }
    for (int i = 0; i < n; i++) {
        free(ref[i]); free(Y[i]);
        for (int k = 0; k < 3; k++) free(hold[i][k]);
    }
    free(X); free(X2); free(xin);
}

/* A decode batch's in-projection after its folded combine (cu_mvdpb_norm): T rows of x, each row's
 * rmsnorm(x) * nw staged by the launch, against the norm in double and cpu_matmul; the normed rows
 * written to tout (1e-6), and bitwise the ones one token's step writes (cu_matvec_group's norm, a row
 * at a time), so a row's scale is the one its session alone gets. kerns: 0 as the forward pass
 * chooses, 2 k_mvdpb, 4 k_mvdpt. */
static void test_matvec_rows_norm(lily_pool *pool, int n, const int *rows, int cols, int T) {
    void *hold[4][3];
    lw_mat W[4];
    float *ref[4], *Y[4], *Y1[4];
    for (int i = 0; i < n; i++) {
        W[i] = mk_mat(LW_Q, 4, 64, rows[i], cols, hold[i]);
        ref[i] = malloc((size_t)T * rows[i] * 4);
        Y[i] = malloc((size_t)T * rows[i] * 4);
        Y1[i] = malloc((size_t)T * rows[i] * 4);
    }
    float *X = rnd((size_t)T * cols, 1.0f), *nw = rnd((size_t)cols, 1.0f);
    float *xin = malloc((size_t)T * cols * 4), *tout = malloc((size_t)T * cols * 4), *t1 = malloc((size_t)T * cols * 4);
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int c = 0; c < cols; c++) ss += (double)X[(size_t)t * cols + c] * X[(size_t)t * cols + c];
        const double r = 1.0 / sqrt(ss / cols + 1e-6);
        for (int c = 0; c < cols; c++) xin[(size_t)t * cols + c] = (float)(X[(size_t)t * cols + c] * r * nw[c]);
    }
    for (int i = 0; i < n; i++) cpu_matmul(pool, &W[i], xin, T, ref[i]);
    lily_status st = { 0 };
    char what[160];
    snprintf(what, sizeof what, "matvec rows norm n=%d %dx%d T=%d one row at a time", n, rows[0], cols, T);
    if (lct_matvec_rows_norm(W, n, X, nw, 1e-6f, T, Y1, t1, 5, &st)) { printf("%s: %s\n", what, st.msg); n_fail++; }
    else report(what, rel(t1, xin, (size_t)T * cols), 1e-6);
    static const int kerns[3] = { 0, 2, 4 };
    static const char *kname[3] = { "", " k_mvdpb", " k_mvdpt" };
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < n; i++)
            for (size_t e = 0; e < (size_t)T * rows[i]; e++) Y[i][e] = NAN;
        for (size_t e = 0; e < (size_t)T * cols; e++) tout[e] = NAN;
        memset(&st, 0, sizeof st);
        snprintf(what, sizeof what, "matvec rows norm n=%d %dx%d T=%d%s", n, rows[0], cols, T, kname[k]);
        if (lct_matvec_rows_norm(W, n, X, nw, 1e-6f, T, Y, tout, kerns[k], &st)) { printf("%s: %s\n", what, st.msg); n_fail++; continue; }
        double worst = 0;
        for (int i = 0; i < n; i++) {
            double r = rel(Y[i], ref[i], (size_t)T * rows[i]);
            if (!(r <= worst)) worst = r;
        }
        report(what, worst, 1e-5);
        char w2[256];
        snprintf(w2, sizeof w2, "%s normed rows", what);
        report(w2, rel(tout, xin, (size_t)T * cols), 1e-6);
        size_t diff = 0;
        for (size_t e = 0; e < (size_t)T * cols; e++) diff += memcmp(&tout[e], &t1[e], 4) != 0;
        snprintf(w2, sizeof w2, "%s normed rows bitwise as one token's (elements differing)", what);
        report(w2, (double)diff, 0.0);
    }
    for (int i = 0; i < n; i++) {
        free(ref[i]); free(Y[i]); free(Y1[i]);
        for (int k = 0; k < 3; k++) free(hold[i][k]);
    }
    free(X); free(nw); free(xin); free(tout); free(t1);
}

/* A decode batch's DeltaNet out-projection with the gated norm in k_mvdpt's staging (cu_mvdpt_gated):
 * T rows of o and z, the norm of each head of 128 columns in double on the host; special 1: a NaN in
 * one row's head, that row's outputs must be NaN, the other rows' not. */
static void test_matvec_rows_gated(lily_pool *pool, int rows, int cols, int T, int special) {
    void *hold[3];
    lw_mat W = mk_mat(LW_Q, 4, 64, rows, cols, hold);
    float *O = rnd((size_t)T * cols, 1.0f), *Z = rnd((size_t)T * cols, 2.0f), *gw = rnd(128, 1.0f);
    if (special == 1) O[(size_t)(T - 1) * cols + 130] = NAN;
    float *xin = malloc((size_t)T * cols * 4), *ref = malloc((size_t)T * rows * 4), *Y = malloc((size_t)T * rows * 4);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < cols / 128; h++) {
            const float *o = O + (size_t)t * cols, *z = Z + (size_t)t * cols;
            double ss = 0;
            for (int c = 128 * h; c < 128 * h + 128; c++) ss += (double)o[c] * o[c];
            const double r = 1.0 / sqrt(ss / 128 + 1e-6);
            for (int c = 128 * h; c < 128 * h + 128; c++) xin[(size_t)t * cols + c] = (float)(o[c] * r * gw[c % 128] * (z[c] / (1.0 + exp(-(double)z[c]))));
        }
    cpu_matmul(pool, &W, xin, T, ref);
    for (size_t k = 0; k < (size_t)T * rows; k++) Y[k] = -1.0f;
    lily_status st = { 0 };
    char what[128];
    snprintf(what, sizeof what, "matvec rows gated norm q4 %dx%d T=%d k_mvdpt%s", rows, cols, T, special == 1 ? " NaN" : "");
    if (lct_matvec_rows_gated(&W, O, Z, gw, 1e-6f, T, Y, &st)) { printf("%s: %s\n", what, st.msg); n_fail++; }
    else if (special == 1) {
        int bad = 0; /* the NaN row all NaN (as the CPU's), the others finite and close */
        for (int i = 0; i < rows; i++) bad += !isnan(Y[(size_t)(T - 1) * rows + i]);
        const double r = T > 1 ? rel(Y, ref, (size_t)(T - 1) * rows) : 0.0;
        report(what, bad ? (double)bad : r, 1e-5);
    } else report(what, rel(Y, ref, (size_t)T * rows), 1e-5);
    free(O); free(Z); free(gw); free(xin); free(ref); free(Y);
    for (int i = 0; i < 3; i++) free(hold[i]);
}

/* Decode's grouped matrix-vector launch (cu_matvec_group) in slot mode, as the forward pass runs
 * it: n matrices of E experts each, nslots routed slots (sel; input row slot / xdiv), optionally
 * the shared expert riding as one more slot (input row xrow) and the SwiGLU input, through the
 * launch as chosen, without k_mvdp, and through k_mvdp at each row count a lane group (R = 1, 2,
 * 4). special 1: a NaN in one input group, every output must be NaN (as the CPU's); 2: one input
 * group all zeros and one of 1e-35 (below the kernel's zero threshold), another scaled by 1e30. */
static void test_matvec_group_b(lily_pool *pool, int bits, int n, const int *rows, int cols, int group, int E, int nslots, int xdiv,
                                int shared, int swiglu, int special, int norm, int route);
static void test_matvec_group(lily_pool *pool, int n, const int *rows, int cols, int group, int E, int nslots, int xdiv,
                              int shared, int swiglu, int special) {
    test_matvec_group_b(pool, 4, n, rows, cols, group, E, nslots, xdiv, shared, swiglu, special, 0, 0);
}
static void router_ref(const float *lg, int E, int K, int *sel, float *wt);
/* The same for bits-bit codes; norm (dense only: E 1; one slot, or a slot a row with xdiv 1): 1 the
 * router group's fused residual add and norm, 2 the norm alone (the in-projection after a folded
 * combine), whose normed input (tout) is checked too. route (xdiv = K a token, nslots / K tokens): the
 * launch routes itself from random logits (mvq_fuse.rlog, decode's folded top-k; a batch's tokens
 * each from their own), its experts and weights checked against router_ref's, the outputs against
 * the reference's experts; without k_mvdp (no-dp) the launch runs the top-k first. shared: 1, one
 * extra slot reading a row of its own (one token's shared expert); more, one a token: with xdiv > 1
 * each reading its token's row (a batch's gate|up), with xdiv 1 rows of their own after the slots'
 * (a batch's down). */
static void test_matvec_group_b(lily_pool *pool, int bits, int n, const int *rows, int cols, int group, int E, int nslots, int xdiv,
                                int shared, int swiglu, int special, int norm, int route) {
    void **hold = calloc((size_t)n * (E + 1) * 3, sizeof *hold);
    lw_mat *W = malloc((size_t)n * E * sizeof *W), XM[4];
    for (int i = 0; i < n; i++) {
        for (int e = 0; e < E; e++) W[i * E + e] = mk_mat(LW_Q, bits, group, rows[i], cols, hold + 3 * (i * E + e));
        if (shared) XM[i] = mk_mat(LW_Q, bits, group, rows[i], cols, hold + 3 * (n * E + i));
    }
    /* the extra slots' rows: after the tokens' (one token's shared expert, a batch's down), or the
     * tokens' own (a batch's gate|up) */
    const int ntok = (nslots + xdiv - 1) / xdiv, xrow = shared > 1 && xdiv > 1 ? 0 : ntok;
    const int nx = xrow + shared > ntok ? xrow + shared : ntok, ns = nslots + shared, T = route ? nslots / xdiv : 1;
    LILY_ASSERT(shared <= 1 || xdiv == 1 || shared == ntok);
    int *sel = malloc((size_t)nslots * sizeof *sel);
    for (int j = 0; j < nslots; j++) sel[j] = (int)(lily_rng_u64(&rng) % (uint64_t)E);
    float *lg = route ? rnd((size_t)T * E, 2.0f) : NULL, *wref = route ? malloc((size_t)nslots * 4) : NULL;
    float *wdev = route ? malloc((size_t)nslots * 4) : NULL;
    int *sdev = route ? malloc((size_t)nslots * sizeof *sdev) : NULL;
    for (int t = 0; t < T && route; t++) router_ref(lg + (size_t)t * E, E, nslots / T, sel + (size_t)t * (nslots / T), wref + (size_t)t * (nslots / T));
    float *X = rnd((size_t)nx * cols, 1.0f), *X2 = swiglu ? rnd((size_t)nx * cols, 1.0f) : NULL;
    if (special == 1) X[(size_t)(cols / 64 / 2) * 64 + 5] = NAN;
    if (special == 2)
        for (int r = 0; r < nx; r++)
            for (int c = 0; c < 64 && 3 * 64 <= cols; c++) {
                X[(size_t)r * cols + c] = 0.f;
                X[(size_t)r * cols + 64 + c] *= 1e-35f;
                X[(size_t)r * cols + 128 + c] *= 1e30f;
            }
    float *xin = malloc((size_t)nx * cols * 4), *add = norm == 1 ? rnd((size_t)nx * cols, 1.0f) : NULL, *nw = norm == 1 || norm == 2 ? rnd((size_t)cols, 1.0f) : NULL;
    float *tout = norm == 1 || norm == 2 ? malloc((size_t)nx * cols * 4) : NULL;
    float *gz = norm == 3 ? rnd((size_t)cols, 2.0f) : NULL, *gw = norm == 3 ? rnd(128, 1.0f) : NULL;
    for (size_t k = 0; k < (size_t)nx * cols; k++) xin[k] = swiglu ? X[k] / (1.0f + expf(-X[k])) * X2[k] : X[k];
    if (norm == 3) /* the gated norm of heads of 128 columns (k_gdn_dec_split's output, cu_matvec_gated) */
        for (int h = 0; h < cols / 128; h++) {
            double ss = 0;
            for (int c = 128 * h; c < 128 * h + 128; c++) ss += (double)X[c] * X[c];
            const double r = 1.0 / sqrt(ss / 128 + 1e-6);
            for (int c = 128 * h; c < 128 * h + 128; c++) xin[c] = (float)(X[c] * r * gw[c % 128] * (gz[c] / (1.0 + exp(-(double)gz[c]))));
        }
    else if (norm) /* a row a slot (one token's; a decode batch's router group: E 1, xdiv 1, a slot a row) */
        for (int t = 0; t < nx; t++) {
            const float *xr = X + (size_t)t * cols, *ar = add ? add + (size_t)t * cols : NULL;
            double ss = 0;
            for (int c = 0; c < cols; c++) ss += ((double)xr[c] + (ar ? ar[c] : 0.f)) * ((double)xr[c] + (ar ? ar[c] : 0.f));
            const double r = 1.0 / sqrt(ss / cols + 1e-6);
            for (int c = 0; c < cols; c++) xin[(size_t)t * cols + c] = (float)(((double)xr[c] + (ar ? ar[c] : 0.f)) * r * nw[c]);
        }
    const lct_mvnorm nm = { add, nw, 1e-6f, tout, gz, gw };
    float *ref[4], *Y[4];
    for (int i = 0; i < n; i++) {
        ref[i] = malloc((size_t)ns * rows[i] * 4);
        Y[i] = malloc((size_t)ns * rows[i] * 4);
        for (int j = 0; j < ns; j++) {
            const lw_mat *m = j < nslots ? &W[i * E + sel[j]] : &XM[i];
            cpu_matmul(pool, m, xin + (size_t)(j < nslots ? j / xdiv : xrow + j - nslots) * cols, 1, ref[i] + (size_t)j * rows[i]);
        }
    }
    static const int dps[6] = { 0, -1, 1, 2, 4, 3 };
    for (int v = 0; v < (cols > 2048 ? 6 : 5); v++) {
        lily_status st = { 0 };
        char what[160];
        snprintf(what, sizeof what, "matvec group %s q%d n=%d %dx%d g%d E=%d slots=%d/%d%s%s%s%s%s", v == 0 ? "as run" : v == 1 ? "no-dp" : v == 2 ? "dp R1" : v == 3 ? "dp R2" : v == 4 ? "dp R4" : "dp G2",
                 bits, n, rows[0], cols, group, E, nslots, xdiv, shared > 1 ? "+shared a token" : shared ? "+shared" : "", swiglu ? " swiglu" : "",
                 special == 1 ? " NaN" : special == 2 ? " 0/tiny/huge" : "", norm == 1 ? " add+norm" : norm == 3 ? " gated norm" : norm ? " norm" : "",
                 route ? " routed" : "");
        if (norm == 3 && v == 1) continue; /* (k_mvdp alone takes the gated norm) */
        const lct_mvroute rt = { lg, E, nslots / T, sdev, wdev, T };
        if (route)
            for (int j = 0; j < nslots; j++) { sdev[j] = -1; wdev[j] = NAN; }
        if (tout) for (size_t c = 0; c < (size_t)nx * cols; c++) tout[c] = NAN;
        /* (the NaN case poisons with 7: NaN is what it wants) */
        for (int i = 0; i < n; i++)
            for (size_t k = 0; k < (size_t)ns * rows[i]; k++) Y[i][k] = special == 1 ? 7.0f : NAN;
        if (lct_matvec_group(W, n, E, shared ? XM : NULL, shared, norm ? NULL : sel, nslots, xdiv, xrow, X, X2, nx, norm ? &nm : NULL, dps[v],
                             route ? &rt : NULL, Y, &st)) {
            printf("%s: %s\n", what, st.msg);
            n_fail++;
            continue;
        }
        /* the error over all the launch's outputs together: a one-row matrix's single output (the
         * shared expert's gate) can cancel to near 0, where its own relative error says nothing */
        double worst = 0, num = 0, den = 0;
        for (int i = 0; i < n; i++) {
            if (special == 1) { /* every output NaN, none left at the poison */
                for (size_t k = 0; k < (size_t)ns * rows[i]; k++) if (!isnan(Y[i][k])) worst = INFINITY;
                continue;
            }
            for (size_t k = 0; k < (size_t)ns * rows[i]; k++) {
                const double d = (double)Y[i][k] - ref[i][k];
                num += d * d;
                den += (double)ref[i][k] * ref[i][k];
            }
        }
        if (special != 1) worst = isfinite(num) && den > 0 ? sqrt(num / den) : INFINITY;
        if (tout) { /* the normed input the experts read: as the reference's (all NaN in the NaN case) */
            double r = 0;
            if (special == 1) {
                for (int c = 0; c < cols; c++) if (!isnan(tout[c])) r = INFINITY;
            } else r = rel(tout, xin, (size_t)nx * cols);
            if (!(r <= 1e-6)) worst = INFINITY;
        }
        if (route && (memcmp(sdev, sel, (size_t)nslots * sizeof *sel) || !(rel(wdev, wref, (size_t)nslots) <= 1e-6))) worst = INFINITY;
        report(what, worst, 1e-5);
    }
    free(lg); free(wref); free(wdev); free(sdev);
    for (int i = 0; i < n; i++) { free(ref[i]); free(Y[i]); }
    for (int i = 0; i < n * (E + 1) * 3; i++) free(hold[i]);
    free(hold); free(W); free(sel); free(X); free(X2); free(xin); free(add); free(nw); free(tout); free(gz); free(gw);
}

/* cu_wg_mma64 (wgmma with A from registers, B from shared memory) against double loops: fp16
 * inputs that are multiples of 1/8 in [-2, 2], so every product and sum is exact in fp32 and any
 * misplaced element shows. */
static void test_wgmma(void) {
    uint16_t A[64 * 32], B[64 * 32];
    float fa[64 * 32], fb[64 * 32], D[64 * 64], ref[64 * 64];
    for (int i = 0; i < 64 * 32; i++) {
        fa[i] = (float)((int)(lily_rng_u64(&rng) % 33) - 16) / 8.0f;
        fb[i] = (float)((int)(lily_rng_u64(&rng) % 33) - 16) / 8.0f;
        A[i] = lily_f32_to_f16(fa[i]);
        B[i] = lily_f32_to_f16(fb[i]);
    }
    for (int m = 0; m < 64; m++)
        for (int n = 0; n < 64; n++) {
            double r = 0;
            for (int k = 0; k < 32; k++) r += (double)fa[m * 32 + k] * fb[n * 32 + k];
            ref[m * 64 + n] = (float)r;
            D[m * 64 + n] = NAN;
        }
    lily_status st = { 0 };
    const char *what = "wgmma m64n64k16 x2 (A registers, B shared)";
    if (lct_wgmma(A, B, D, &st)) { printf("%s: %s\n", what, st.msg); n_fail++; }
    else report(what, rel(D, ref, 64 * 64), 0);
}

/* A prefill projection group in one launch (cu_gemm_tc_group): n matrices of their own row counts. */
static void test_gemm_group(lily_pool *pool, int n, const int *rows, int cols, int T) {
    void *hold[4][3];
    lw_mat W[4];
    float *ref[4], *Y[4];
    float *X = rnd((size_t)T * cols, 1.0f);
    for (int i = 0; i < n; i++) {
        W[i] = mk_mat(LW_Q, 4, 64, rows[i], cols, hold[i]);
        ref[i] = malloc((size_t)T * rows[i] * 4);
        Y[i] = malloc((size_t)T * rows[i] * 4);
        cpu_matmul(pool, &W[i], X, T, ref[i]);
    }
    /* packed 2, 3: the wgmma forms (the emulator and sm_90a builds on a 9.x device have them) */
    for (int packed = 0; packed < 2 + 2 * lct_has_wgmma(); packed++) {
        for (int i = 0; i < n; i++)
            for (size_t k = 0; k < (size_t)T * rows[i]; k++) Y[i][k] = NAN;
        lily_status st = { 0 };
        char what[160];
        snprintf(what, sizeof what, "gemm group q4 n=%d %d|%d.. x%d T=%d%s", n, rows[0], n > 1 ? rows[1] : 0, cols, T,
                 packed == 3 ? " packed, wgmma 2" : packed == 2 ? " packed, wgmma 1" : packed ? " packed" : "");
        if (lct_gemm_group(W, n, X, T, packed, Y, &st)) { printf("%s: %s\n", what, st.msg); n_fail++; continue; }
        double worst = 0;
        for (int i = 0; i < n; i++) {
            double r = rel(Y[i], ref[i], (size_t)T * rows[i]);
            if (!(r <= worst)) worst = r;
        }
        report(what, worst, 3e-3);
    }
    for (int i = 0; i < n; i++) {
        free(ref[i]); free(Y[i]);
        for (int k = 0; k < 3; k++) free(hold[i][k]);
    }
    free(X);
}

/* An out-projection whose launch is small for the GPU, split in two halves of its columns
 * (cu_gemm_tc_xp2): the parts must add up to the product, and the split must happen
 * (LILY_CU_GT_SPLIT=0 turns it off: then one part). */
static void test_gemm_split(lily_pool *pool, int rows, int cols, int T) {
    void *hold[3];
    lw_mat W = mk_mat(LW_Q, 4, 64, rows, cols, hold);
    float *X = rnd((size_t)T * cols, 1.0f), *ref = malloc((size_t)T * rows * 4), *Y = malloc((size_t)T * rows * 4);
    cpu_matmul(pool, &W, X, T, ref);
    const char *off = getenv("LILY_CU_GT_SPLIT");
    const int want = off && *off == '0' ? 1 : 2;
    for (int wg = 0; wg < 1 + 2 * lct_has_wgmma(); wg++) {
        for (size_t k = 0; k < (size_t)T * rows; k++) Y[k] = NAN;
        lily_status st = { 0 };
        char what[160];
        int parts = 0;
        snprintf(what, sizeof what, "gemm split-K q4 %dx%d T=%d (%d parts)%s", rows, cols, T, want,
                 wg == 2 ? ", wgmma 2" : wg ? ", wgmma 1" : "");
        if (lct_gemm_split(&W, X, T, wg, Y, &parts, &st)) { printf("%s: %s\n", what, st.msg); n_fail++; }
        else if (parts != want) { printf("%s: wrote %d parts\n", what, parts); n_fail++; }
        else report(what, rel(Y, ref, (size_t)T * rows), 3e-3);
    }
    free(X); free(ref); free(Y);
    for (int k = 0; k < 3; k++) free(hold[k]);
}

/* The shared expert's gate and up at prefill, silu(x G^T) * (x U^T) in one launch (k_gemm_tc). */
static void test_swiglu_dense(lily_pool *pool, int rows, int cols, int T) {
    void *hold[2][3];
    lw_mat G = mk_mat(LW_Q, 4, 64, rows, cols, hold[0]), U = mk_mat(LW_Q, 4, 64, rows, cols, hold[1]);
    float *X = rnd((size_t)T * cols, 1.0f), *ref = malloc((size_t)T * rows * 4), *u = malloc((size_t)T * rows * 4);
    float *Y = malloc((size_t)T * rows * 4);
    cpu_matmul(pool, &G, X, T, ref);
    cpu_matmul(pool, &U, X, T, u);
    for (size_t i = 0; i < (size_t)T * rows; i++) ref[i] = ref[i] / (1.0f + expf(-ref[i])) * u[i];
    for (int packed = 0; packed < 2; packed++) {
        for (size_t i = 0; i < (size_t)T * rows; i++) Y[i] = NAN;
        lily_status st = { 0 };
        char what[160];
        snprintf(what, sizeof what, "gate|up swiglu q4 %dx%d T=%d%s", rows, cols, T, packed ? " packed" : "");
        if (lct_experts_swiglu(&G, &U, 1, X, T, NULL, 0, packed, Y, &st)) { printf("%s: %s\n", what, st.msg); n_fail++; }
        else report(what, rel(Y, ref, (size_t)T * rows), 3e-3);
    }
    free(X); free(ref); free(u); free(Y);
    for (int i = 0; i < 2; i++) for (int k = 0; k < 3; k++) free(hold[i][k]);
}
