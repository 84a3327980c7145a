/* MoE and its neighbours against the CPU: the sort by expert, the experts, the combine (also
 * folded into the down), routing (decode's and prefill's exact router), the norm, the argmax.
 * Included by kernel_test.c, which owns rng, report(), the counters and the matrix makers. */
/* The MoE sort (k_moe_sort) of n slots over E experts, alone and with the bt-token tile map
 * (merged), against counting on the host: counts, offsets, src/pos inverse and grouped by
 * expert, the map exactly. skew: every other slot to expert 0 (a crowded expert, many empty). */
static void test_moe_sort(int n, int E, int bt, int skew) {
    int *sel = malloc((size_t)n * sizeof *sel), *cnt = calloc((size_t)E, sizeof *cnt), *off = malloc((size_t)E * sizeof *off);
    int *src = malloc((size_t)n * sizeof *src), *pos = malloc((size_t)n * sizeof *pos);
    int *gc = malloc((size_t)E * sizeof *gc), *go = malloc((size_t)E * sizeof *go);
    const int mt = (n + bt - 1) / bt + E;
    int *tiles = malloc((size_t)mt * sizeof *tiles), *want = malloc((size_t)mt * sizeof *want);
    for (int i = 0; i < n; i++) {
        sel[i] = skew && i % 2 ? 0 : (int)(lily_rng_u64(&rng) % (uint64_t)E);
        cnt[sel[i]]++;
    }
    int acc = 0, nt = 0;
    for (int e = 0; e < E; e++) {
        off[e] = acc;
        acc += cnt[e];
        for (int j = 0; j * bt < cnt[e]; j++) want[nt++] = e << 16 | j;
    }
    while (nt < mt) want[nt++] = -1;
    for (int merged = 0; merged < 2; merged++) {
        lily_status st = { 0 };
        char what[160];
        snprintf(what, sizeof what, "moe sort n=%d E=%d%s%s", n, E, skew ? " skewed" : "", merged ? " + tile map" : "");
        if (lct_moe_sort(sel, n, E, bt, merged, gc, go, src, pos, merged ? tiles : NULL, mt, &st)) {
            printf("%s: %s\n", what, st.msg);
            n_fail++;
            continue;
        }
        long bad = 0;
        for (int e = 0; e < E; e++) bad += gc[e] != cnt[e] || go[e] != off[e];
        for (int i = 0; i < n; i++) {
            const int p = pos[i];
            bad += p < 0 || p >= n || src[p] != i || p < off[sel[i]] || p >= off[sel[i]] + cnt[sel[i]];
        }
        for (int j = 0; merged && j < mt; j++) bad += tiles[j] != want[j];
        report(what, (double)bad, 0);
    }
    free(sel); free(cnt); free(off); free(src); free(pos); free(gc); free(go); free(tiles); free(want);
}

/* Experts: E matrices, T tokens each routed to K distinct experts. */
static void test_experts(lily_pool *pool, int bits, int E, int rows, int cols, int T, int K) {
    void **hold = calloc((size_t)E * 3, sizeof *hold);
    lw_mat *W = malloc((size_t)E * sizeof *W);
    for (int e = 0; e < E; e++) W[e] = mk_mat(LW_Q, bits, 64, rows, cols, hold + 3 * e);
    float *X = rnd((size_t)T * cols, 1.0f);
    int *sel = malloc((size_t)T * K * sizeof *sel);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int e, dup;
            do {
                e = (int)(lily_rng_u64(&rng) % (uint64_t)E);
                dup = 0;
                for (int j = 0; j < k; j++) dup |= sel[t * K + j] == e;
            } while (dup);
            sel[t * K + k] = e;
        }
    float *ref = malloc((size_t)T * K * rows * 4), *Y = malloc((size_t)T * K * rows * 4);
    for (int i = 0; i < T * K; i++) cpu_matmul(pool, &W[sel[i]], X + (size_t)(i / K) * cols, 1, ref + (size_t)i * rows);
    for (int v = 3; v < 7; v++) {
        if (v == 5 || (v == 6 && cols % 64)) continue; /* 6: the FP16 grouped GEMM */
        lily_status st = { 0 };
        char what[160];
        snprintf(what, sizeof what, "experts %s q%d E=%d %dx%d T=%d K=%d", v == 3 ? "slots" : v == 4 ? "grouped" : "grouped-fp16",
                 bits, E, rows, cols, T, K);
        for (size_t i = 0; i < (size_t)T * K * rows; i++) Y[i] = NAN;
        if (lct_matmul(W, E, X, T, v, sel, K, Y, &st)) { printf("%s: %s\n", what, st.msg); n_fail++; continue; }
        report(what, rel(Y, ref, (size_t)T * K * rows), v == 6 || (v == 4 && T >= 128) ? 3e-3 : 1e-5);
    }
    /* gate (W) and up (U) with SwiGLU in one launch: k_gemm_tc's, so not where it is turned off
     * (it_cuda_emu runs the wmma kernel's cases so, and this one with it on) */
    const char *tc = getenv("LILY_CU_GEMM_TC");
    if (bits == 4 && cols % 128 == 0 && T > 8 && !(tc && !strcmp(tc, "0"))) {
        void **uhold = calloc((size_t)E * 3, sizeof *uhold);
        lw_mat *U = malloc((size_t)E * sizeof *U);
        for (int e = 0; e < E; e++) U[e] = mk_mat(LW_Q, bits, 64, rows, cols, uhold + 3 * e);
        float *u = malloc((size_t)rows * 4);
        for (int i = 0; i < T * K; i++) {
            cpu_matmul(pool, &U[sel[i]], X + (size_t)(i / K) * cols, 1, u);
            float *r = ref + (size_t)i * rows;
            for (int j = 0; j < rows; j++) r[j] = r[j] / (1.0f + expf(-r[j])) * u[j];
        }
        lily_status st = { 0 };
        char what[160];
        snprintf(what, sizeof what, "experts gate|up swiglu q4 E=%d %dx%d T=%d K=%d", E, rows, cols, T, K);
        for (size_t i = 0; i < (size_t)T * K * rows; i++) Y[i] = NAN;
        if (lct_experts_swiglu(W, U, E, X, T, sel, K, 0, Y, &st)) { printf("%s: %s\n", what, st.msg); n_fail++; }
        else report(what, rel(Y, ref, (size_t)T * K * rows), 3e-3);
        if (rows % 128 == 0) { /* the whole FFN with packed fp16 inputs, at each token tile */
            void **dhold = calloc((size_t)E * 3, sizeof *dhold);
            lw_mat *D = malloc((size_t)E * sizeof *D);
            for (int e = 0; e < E; e++) D[e] = mk_mat(LW_Q, bits, 64, cols, rows, dhold + 3 * e);
            float *ref2 = malloc((size_t)T * K * cols * 4), *Y2 = malloc((size_t)T * K * cols * 4);
            for (int i = 0; i < T * K; i++) cpu_matmul(pool, &D[sel[i]], ref + (size_t)i * rows, 1, ref2 + (size_t)i * cols);
            for (int bt = 16; bt <= 64; bt *= 2) {
                snprintf(what, sizeof what, "experts ffn packed q4 E=%d %dx%d T=%d K=%d bt=%d", E, rows, cols, T, K, bt);
                for (size_t i = 0; i < (size_t)T * K * cols; i++) Y2[i] = NAN;
                lily_status st2 = { 0 };
                if (lct_experts_ffn(W, U, D, E, X, T, sel, K, bt, Y2, &st2)) { printf("%s: %s\n", what, st2.msg); n_fail++; }
                else report(what, rel(Y2, ref2, (size_t)T * K * cols), 3e-3);
            }
            for (int i = 0; i < 3 * E; i++) free(dhold[i]);
            free(dhold); free(D); free(ref2); free(Y2);
        }
        for (int i = 0; i < 3 * E; i++) free(uhold[i]);
        free(uhold); free(U); free(u);
    }
    for (int i = 0; i < 3 * E; i++) free(hold[i]);
    free(hold); free(W); free(X); free(sel); free(ref); free(Y);
}

static void test_rmsnorm(int n, int T) {
    float *x = rnd((size_t)T * n, 2.0f), *add = rnd((size_t)T * n, 1.0f), *w = rnd(n, 1.0f);
    float *y = malloc((size_t)T * n * 4), *xo = malloc((size_t)T * n * 4), *ref = malloc((size_t)T * n * 4), *xs = malloc((size_t)T * n * 4);
    for (size_t i = 0; i < (size_t)T * n; i++) xs[i] = x[i] + add[i];
    for (int t = 0; t < T; t++) cpu_rmsnorm(xs + (size_t)t * n, w, n, 1e-6, ref + (size_t)t * n);
    lily_status st = { 0 };
    char what[160];
    snprintf(what, sizeof what, "add + rmsnorm n=%d T=%d", n, T);
    lct_packed pk = pk_new((size_t)T * n);
    if (lct_rmsnorm(x, add, w, n, T, 1e-6f, y, xo, &pk, &st)) { printf("%s: %s\n", what, st.msg); n_fail++; }
    else {
        double e1 = rel(y, ref, (size_t)T * n), e2 = rel(xo, xs, (size_t)T * n);
        report(what, e1 > e2 ? e1 : e2, 1e-5);
        pk_done(what, &pk, (size_t)T * n, T > 8 && n % 128 == 0);
    }
    free(x); free(add); free(w); free(y); free(xo); free(ref); free(xs);
}

/* The MoE combine (cu_moe_combine) against the obvious loops: x += (add) + sum_k wt_k D_k (+ sigmoid(sr) SD),
 * then the next layer's norm; three launches in a row, on their own output, as a step's layers run it. */
static void test_moe_combine(int T, int K, int H, int with_add, int with_sd, int with_nw) {
    const int reps = 3;
    float *x = rnd((size_t)T * H, 1.0f), *add = with_add ? rnd((size_t)T * H, 1.0f) : NULL, *D = rnd((size_t)T * K * H, 1.0f);
    float *wt = rnd((size_t)T * K, 0.3f), *SD = with_sd ? rnd((size_t)T * H, 1.0f) : NULL, *sr = rnd((size_t)T, 1.0f);
    float *nw = with_nw ? rnd((size_t)H, 1.0f) : NULL, *t = malloc((size_t)T * H * 4), *xr = malloc((size_t)T * H * 4);
    float *tr = malloc((size_t)T * H * 4);
    memcpy(xr, x, (size_t)T * H * 4);
    for (int rep = 0; rep < reps; rep++)
        for (int r = 0; r < T; r++) {
            double ss = 0, gs = 1.0 / (1.0 + exp(-(double)sr[r]));
            for (int i = 0; i < H; i++) {
                double y = 0;
                for (int k = 0; k < K; k++) y += (double)wt[r * K + k] * D[((size_t)r * K + k) * H + i];
                if (SD) y += gs * SD[(size_t)r * H + i];
                double v = (double)xr[(size_t)r * H + i] + (add ? add[(size_t)r * H + i] : 0.0) + y;
                xr[(size_t)r * H + i] = (float)v;
                ss += v * v;
            }
            if (nw) {
                double rs = 1.0 / sqrt(ss / H + 1e-6);
                for (int i = 0; i < H; i++) tr[(size_t)r * H + i] = (float)(xr[(size_t)r * H + i] * rs * nw[i]);
            }
        }
    for (size_t i = 0; i < (size_t)T * H; i++) t[i] = NAN;
    lily_status st = { 0 };
    char what[160];
    snprintf(what, sizeof what, "moe combine T=%d K=%d H=%d%s%s%s x%d", T, K, H, add ? " add" : "", SD ? " shared" : "",
             nw ? " norm" : "", reps);
    lct_packed pk = pk_new((size_t)T * H);
    if (lct_moe_combine(x, add, D, wt, T, K, H, SD, sr, nw, 1e-6f, t, reps, &pk, &st)) { printf("%s: %s\n", what, st.msg); n_fail++; }
    else {
        double e1 = rel(x, xr, (size_t)T * H), e2 = nw ? rel(t, tr, (size_t)T * H) : 0;
        report(what, e1 > e2 ? e1 : e2, 1e-5);
        if (nw) pk_done(what, &pk, (size_t)T * H, T > 8 && H % 128 == 0);
        else { free(pk.xp); free(pk.xp_ref); }
    }
    free(x); free(add); free(D); free(wt); free(SD); free(sr); free(nw); free(t); free(xr); free(tr);
}

/* Decode's experts' down with the combine folded in (cu_mvdp_comb) against cpu_matmul per slot and
 * the combine's loops in double: E experts [H][I], K chosen a token (distinct), the shared expert's
 * down as the token's slot K when shared, T tokens (a batch's rows: token j's routed inputs at rows
 * j K .., its shared one at T K + j, as the experts' gate|up leaves them), reps launches in place on
 * x (a row the launch leaves unwritten keeps x without the experts' sum, which the reference has). */
/* The decode MoE tail's reference for one token: xr = x, then reps times xr = (xr + add) + sum_k wt[k] y_k
 * (+ sigmoid(sr) y_K, the shared slot, when ns > K), in double; y [ns][H] the slots' down outputs. */
static void comb_ref(float *xr, const float *x, const float *add, const float *y, const float *wt, float sr, int K, int ns, int H, int reps) {
    memcpy(xr, x, (size_t)H * 4);
    const double gs = 1.0 / (1.0 + exp(-(double)sr));
    for (int rep = 0; rep < reps; rep++)
        for (int r = 0; r < H; r++) {
            double v = (double)xr[r] + (add ? add[r] : 0.0);
            for (int k = 0; k < ns; k++) v += (k < K ? (double)wt[k] : gs) * y[(size_t)k * H + r];
            xr[r] = (float)v;
        }
}

static void test_mvdp_comb(lily_pool *pool, int E, int H, int I, int group, int K, int shared, int with_add, int T) {
    const int reps = 2, ns = K + shared, nh = T * K + (shared ? T : 0);
    void **hold = malloc((size_t)(E + 1) * 3 * sizeof *hold);
    lw_mat *D = malloc((size_t)E * sizeof *D), SD;
    for (int e = 0; e < E; e++) D[e] = mk_mat(LW_Q, 4, group, H, I, hold + 3 * e);
    SD = mk_mat(LW_Q, 4, group, H, I, hold + 3 * E);
    int *sel = malloc((size_t)T * K * 4), *perm = malloc((size_t)E * 4);
    for (int j = 0; j < T; j++) { /* each token its own K distinct experts */
        for (int e = 0; e < E; e++) perm[e] = e;
        for (int e = E - 1; e > 0; e--) { int q = (int)(lily_rng_u64(&rng) % (uint64_t)(e + 1)), t = perm[e]; perm[e] = perm[q]; perm[q] = t; }
        for (int k = 0; k < K; k++) sel[j * K + k] = perm[k];
    }
    float *wt = rnd((size_t)T * K, 0.3f), *hg = rnd((size_t)nh * I, 1.0f), *hu = rnd((size_t)nh * I, 1.0f), *sr = rnd((size_t)T, 1.0f);
    float *x = rnd((size_t)T * H, 1.0f), *add = with_add ? rnd((size_t)T * H, 1.0f) : NULL;
    float *h = malloc((size_t)I * 4), *y = malloc((size_t)ns * H * 4), *xr = malloc((size_t)T * H * 4);
    for (int j = 0; j < T; j++) {
        for (int k = 0; k < ns; k++) {
            const size_t hr = k < K ? (size_t)j * K + k : (size_t)T * K + j;
            for (int i = 0; i < I; i++) h[i] = hg[hr * I + i] / (1.0f + expf(-hg[hr * I + i])) * hu[hr * I + i];
            cpu_matmul(pool, k < K ? &D[sel[j * K + k]] : &SD, h, 1, y + (size_t)k * H);
        }
        comb_ref(xr + (size_t)j * H, x + (size_t)j * H, add ? add + (size_t)j * H : NULL, y, wt + (size_t)j * K, sr[j], K, ns, H, reps);
    }
    lily_status st = { 0 };
    char what[160];
    snprintf(what, sizeof what, "moe down+combine folded E=%d %dx%d g%d K=%d%s%s T=%d x%d", E, H, I, group, K, shared ? " shared" : "",
             add ? " add" : "", T, reps);
    if (lct_mvdp_comb(D, E, shared ? &SD : NULL, sel, wt, K, T, hg, hu, sr, x, add, reps, &st)) {
        printf("%s: %s\n", what, st.msg);
        n_fail++;
    } else report(what, rel(x, xr, (size_t)T * H), 1e-5);
    for (int i = 0; i < 3 * (E + 1); i++) free(hold[i]);
    free(hold); free(D); free(sel); free(perm); free(wt); free(hg); free(hu); free(sr); free(x); free(add);
    free(h); free(y); free(xr);
}

/* The reference routing of src/cpu/forward.c (softmax, top-k by selection, renormalize). */
static void router_ref(const float *lg, int E, int K, int *sel, float *wt) {
    float *p = malloc((size_t)E * 4), mx = -INFINITY;
    for (int e = 0; e < E; e++) if (lg[e] > mx) mx = lg[e];
    double sum = 0;
    for (int e = 0; e < E; e++) { p[e] = expf(lg[e] - mx); sum += p[e]; }
    for (int e = 0; e < E; e++) p[e] = (float)(p[e] / sum);
    double tot = 0;
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int m = 0; m < j; m++) taken |= sel[m] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        sel[j] = best; wt[j] = p[best]; tot += p[best];
    }
    for (int j = 0; j < K; j++) wt[j] = (float)(wt[j] / tot);
    free(p);
}

/* ties > 0: logits drawn from that many values, so many experts tie and the lowest id must win */
static void test_router(int T, int E, int K, int ties) {
    float *lg = rnd((size_t)T * E, 2.0f);
    if (ties > 0)
        for (size_t i = 0; i < (size_t)T * E; i++) lg[i] = (float)((int)((lg[i] + 2.0f) * 1e3f) % ties) * 0.5f;
    int *sel = malloc((size_t)T * K * 4), *sref = malloc((size_t)T * K * 4);
    float *wt = malloc((size_t)T * K * 4), *wref = malloc((size_t)T * K * 4);
    for (int t = 0; t < T; t++) router_ref(lg + (size_t)t * E, E, K, sref + t * K, wref + t * K);
    lily_status st = { 0 };
    char what[160];
    snprintf(what, sizeof what, "router softmax+top-k T=%d E=%d K=%d%s (weights; ids must match)", T, E, K, ties > 0 ? " ties" : "");
    if (lct_router(lg, T, E, K, sel, wt, &st)) { printf("%s: %s\n", what, st.msg); n_fail++; }
    else {
        int same = !memcmp(sel, sref, (size_t)T * K * 4);
        report(what, same ? rel(wt, wref, (size_t)T * K) : INFINITY, 1e-5);
    }
    free(lg); free(sel); free(sref); free(wt); free(wref);
}

/* The prefill router end to end (cu_router_exact_topk): the logits against the CPU's matmul, the
 * choice and weights against router_ref on the GPU's own logits (so a near-tie cannot flip it).
 * splits: -1 cu_matmul_exact's tiles, 0 cu_router_tc's choice, n > 0 forced; where the shape takes
 * cu_router_tc (rows % 64, cols % 32, T > 8) it must have run, with want slices when want > 0. */
static void test_router_exact(lily_pool *pool, int T, int E, int cols, int K, int splits, int want, lw_type type, int bits) {
    void *hold[3] = { NULL, NULL, NULL };
    lw_mat W = mk_mat(type, bits, 64, E, cols, hold);
    float *X = rnd((size_t)T * cols, 1.0f), *ref = malloc((size_t)T * E * 4), *lg = malloc((size_t)T * E * 4);
    int *sel = malloc((size_t)T * K * 4), *sref = malloc((size_t)T * K * 4);
    float *wt = malloc((size_t)T * K * 4), *wref = malloc((size_t)T * K * 4);
    cpu_matmul(pool, &W, X, T, ref);
    for (size_t i = 0; i < (size_t)T * E; i++) lg[i] = NAN;
    lily_status st = { 0 };
    char what[200];
    int used = 0;
    const int tc = splits >= 0 && T > 8 && E % 64 == 0 && cols % 64 == 0 && type != LW_F32;
    snprintf(what, sizeof what, "router exact matmul + top-k T=%d E=%d cols=%d K=%d %s%d %s (logits, weights; ids must match)", T, E,
             cols, K, type == LW_Q ? "q" : type == LW_BF16 ? "bf" : type == LW_F16 ? "f" : "f", type == LW_Q ? bits : type == LW_F32 ? 32 : 16,
             splits < 0 ? "tiles" : tc ? "code copy" : "(copy declined)");
    if (lct_router_exact(&W, X, T, K, splits, lg, sel, wt, &used, &st)) { printf("%s: %s\n", what, st.msg); n_fail++; }
    else if (tc != (used > 0) || (want > 0 && used != want)) {
        printf("%s: cu_router_tc gave %d slices, expected %s %d\n", what, used, tc ? "" : "none:", want);
        n_fail++;
    } else {
        for (int t = 0; t < T; t++) router_ref(lg + (size_t)t * E, E, K, sref + t * K, wref + t * K);
        const int same = !memcmp(sel, sref, (size_t)T * K * 4);
        const double e1 = rel(lg, ref, (size_t)T * E), e2 = rel(wt, wref, (size_t)T * K);
        report(what, same ? (e1 > e2 ? e1 : e2) : INFINITY, 1e-5);
    }
    free(X); free(ref); free(lg); free(sel); free(sref); free(wt); free(wref);
    for (int i = 0; i < 3; i++) free(hold[i]);
}

static void test_argmax(int V) {
    float *x = rnd(V, 3.0f);
    int at = (int)(lily_rng_u64(&rng) % (uint64_t)V);
    x[at] = 50.0f;
    if (at + 1 < V) x[V - 1] = 50.0f; /* a tie: the lower id wins */
    for (int d = 1; d <= 256; d += 255) /* ties in the same warp and the same thread of a block too */
        if (at + d < V - 1) x[at + d] = 50.0f;
    int nan_at = (at + V / 2) % V;
    if (V > 2 && nan_at != at && nan_at != V - 1) x[nan_at] = NAN; /* never chosen, not in the sum */
    double sum = 0;
    for (int i = 0; i < V; i++)
        if (x[i] == x[i]) sum += exp((double)x[i] - 50.0);
    int out[2];
    lily_status st = { 0 };
    char what[160];
    snprintf(what, sizeof what, "argmax + logprob V=%d", V);
    if (lct_argmax(x, V, out, &st)) { printf("%s: %s\n", what, st.msg); n_fail++; }
    else {
        float lp;
        memcpy(&lp, &out[1], 4);
        float ref = (float)-log(sum);
        report(what, out[0] == at ? fabs(lp - ref) / fmax(fabs(ref), 1e-3) : INFINITY, 1e-4);
    }
    free(x);
}
