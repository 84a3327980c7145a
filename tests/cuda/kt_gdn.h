/* The DeltaNet pieces against loops in double: the gated norm, the conv and gates, the delta rule
 * at prefill and decode's steps.
 * Included by kernel_test.c, which owns rng, report(), the counters and the matrix makers. */
/* The delta rule's gated RMSNorm at prefill against loops in double (a warp a head for dv 128). */
static void test_gated_norm(int T, int nv, int dv) {
    float *o = rnd((size_t)T * nv * dv, 2.0f), *z = rnd((size_t)T * nv * dv, 2.0f), *gw = rnd((size_t)dv, 1.0f);
    float *ref = malloc((size_t)T * nv * dv * 4);
    const float eps = 1e-6f;
    for (int i = 0; i < T * nv; i++) {
        const float *v = o + (size_t)i * dv, *zz = z + (size_t)i * dv;
        double ss = 0;
        for (int j = 0; j < dv; j++) ss += (double)v[j] * v[j];
        const double r = 1.0 / sqrt(ss / dv + eps);
        for (int j = 0; j < dv; j++) ref[(size_t)i * dv + j] = (float)(v[j] * r * gw[j] * (zz[j] / (1.0 + exp(-(double)zz[j]))));
    }
    lily_status st = { 0 };
    char what[160];
    snprintf(what, sizeof what, "gated norm T=%d nv=%d dv=%d", T, nv, dv);
    lct_packed pk = pk_new((size_t)T * nv * dv);
    if (lct_gated_norm(o, z, gw, T, nv, dv, eps, &pk, &st)) { printf("%s: %s\n", what, st.msg); n_fail++; }
    else {
        report(what, rel(o, ref, (size_t)T * nv * dv), 1e-5);
        pk_done(what, &pk, (size_t)T * nv * dv, T > 8 && dv == 128);
    }
    free(o); free(z); free(gw); free(ref);
}

/* One row's q and k heads (the first 2 nk of dk) l2-normalized in double precision, q's also
 * times dk^-0.5, as the conv's launches leave them. */
static void ref_qk_norm(float *u, int nk, int dk) {
    for (int hh = 0; hh < 2 * nk; hh++) {
        float *v = u + (size_t)hh * dk;
        double ss = 0;
        for (int i = 0; i < dk; i++) ss += (double)v[i] * v[i];
        const double r = 1.0 / sqrt(ss + 1e-6) * (hh < nk ? 1.0 / sqrt((double)dk) : 1.0);
        for (int i = 0; i < dk; i++) v[i] = (float)(v[i] * r);
    }
}
/* A head's gates in double precision: beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias). */
static void ref_gates(float b, float a, float al, float dt, float *g, float *beta) {
    const double x = (double)a + dt;
    *beta = (float)(1.0 / (1.0 + exp(-(double)b)));
    *g = (float)(-exp((double)al) * (x > 20.0 ? x : log1p(exp(x))));
}

/* The prefill conv against a double-precision loop: taps over the state then the inputs, SiLU, the
 * q and k heads' l2 norm (q also times dk^-0.5), and the state left holding the last K - 1 inputs;
 * nv > 0: the gates of nv heads in the same launch, beta = sigmoid(b), g = -exp(A_log)
 * softplus(a + dt_bias). */
static void test_conv(int T, int cd, int K, int nk, int dk, int nv) {
    float *mixed = rnd((size_t)T * cd, 1.0f), *state = rnd((size_t)cd * (K - 1), 1.0f), *w = rnd((size_t)cd * K, 0.5f);
    float *u = malloc((size_t)T * cd * 4), *ref = malloc((size_t)T * cd * 4), *sref = malloc((size_t)cd * (K - 1) * 4);
    for (int t = 0; t < T; t++)
        for (int ch = 0; ch < cd; ch++) {
            double a = 0;
            for (int j = 0; j < K; j++) {
                const int n = t - (K - 1) + j;
                a += (double)w[(size_t)ch * K + j] * (n >= 0 ? mixed[(size_t)n * cd + ch] : state[(size_t)ch * (K - 1) + n + K - 1]);
            }
            ref[(size_t)t * cd + ch] = (float)(a / (1.0 + exp(-a)));
        }
    for (int t = 0; t < T; t++) ref_qk_norm(ref + (size_t)t * cd, nk, dk);
    for (int ch = 0; ch < cd; ch++)
        for (int j = 0; j < K - 1; j++) {
            const int n = T - (K - 1) + j;
            sref[(size_t)ch * (K - 1) + j] = n >= 0 ? mixed[(size_t)n * cd + ch] : state[(size_t)ch * (K - 1) + n + K - 1];
        }
    for (size_t i = 0; i < (size_t)T * cd; i++) u[i] = NAN;
    const size_t tn = (size_t)T * (nv > 0 ? nv : 1);
    float *bb = rnd(tn, 3.0f), *aa = rnd(tn, 12.0f), *al = rnd((size_t)(nv > 0 ? nv : 1), 1.0f), *dt = rnd((size_t)(nv > 0 ? nv : 1), 10.0f);
    float *g = malloc(tn * 4), *beta = malloc(tn * 4), *gref = malloc(tn * 4), *bref = malloc(tn * 4);
    for (size_t i = 0; i < tn && nv > 0; i++) {
        const int h = (int)(i % (size_t)nv);
        ref_gates(bb[i], aa[i], al[h], dt[h], &gref[i], &bref[i]);
        g[i] = beta[i] = NAN;
    }
    lct_gates gt = { bb, aa, al, dt, nv, g, beta };
    lily_status st = { 0 };
    char what[160];
    snprintf(what, sizeof what, "conv+silu+q/k norm T=%d cd=%d K=%d nk=%d dk=%d (u, state%s)", T, cd, K, nk, dk, nv > 0 ? ", gates" : "");
    if (lct_conv(mixed, state, w, cd, K, T, nk, dk, u, nv > 0 ? &gt : NULL, &st)) { printf("%s: %s\n", what, st.msg); n_fail++; }
    else {
        double e = rel(u, ref, (size_t)T * cd), e2 = rel(state, sref, (size_t)cd * (K - 1));
        if (!(e2 <= e)) e = e2;
        if (nv > 0) {
            const double e3 = rel(g, gref, tn), e4 = rel(beta, bref, tn);
            if (!(e3 <= e)) e = e3;
            if (!(e4 <= e)) e = e4;
        }
        report(what, e, 1e-5);
    }
    free(mixed); free(state); free(w); free(u); free(ref); free(sref);
    free(bb); free(aa); free(al); free(dt); free(g); free(beta); free(gref); free(bref);
}

static void test_gdn(int T, int nk, int nv, int dk, int dv) {
    int cd = 2 * nk * dk + nv * dv;
    float *u = rnd((size_t)T * cd, 1.0f), *g = malloc((size_t)T * nv * 4), *beta = malloc((size_t)T * nv * 4);
    for (int t = 0; t < T; t++)
        for (int hh = 0; hh < 2 * nk; hh++) { /* unit q/k rows, q scaled, as the model feeds them */
            float *v = u + (size_t)t * cd + (size_t)hh * dk;
            double ss = 0;
            for (int i = 0; i < dk; i++) ss += (double)v[i] * v[i];
            float r = (float)(1 / sqrt(ss)) * (hh < nk ? 1.0f / sqrtf((float)dk) : 1.0f);
            for (int i = 0; i < dk; i++) v[i] *= r;
        }
    for (int i = 0; i < T * nv; i++) { g[i] = -(float)lily_rng_uniform(&rng) * 2.0f; beta[i] = (float)lily_rng_uniform(&rng); }
    float *S0 = rnd((size_t)nv * dk * dv, 0.1f), *S = malloc((size_t)nv * dk * dv * 4), *Sref = malloc((size_t)nv * dk * dv * 4);
    memcpy(S, S0, (size_t)nv * dk * dv * 4);
    memcpy(Sref, S0, (size_t)nv * dk * dv * 4);
    float *o = malloc((size_t)T * nv * dv * 4), *oref = malloc((size_t)T * nv * dv * 4);
    float *gh = malloc((size_t)T * 4), *bh = malloc((size_t)T * 4);
    int kd = nk * dk;
    for (int h = 0; h < nv; h++) {
        int kh = h / (nv / nk);
        for (int t = 0; t < T; t++) { gh[t] = g[t * nv + h]; bh[t] = beta[t * nv + h]; }
        cpu_gdn_recurrent(T, dk, dv, u + (size_t)kh * dk, cd, u + kd + (size_t)kh * dk, cd, u + 2 * kd + (size_t)h * dv, cd,
                          gh, bh, Sref + (size_t)h * dk * dv, oref + (size_t)h * dv, nv * dv);
    }
    /* the recurrent kernel, the staged prefill kernel, the chunked (WY) kernels: on the tensor cores,
     * tiled, generic (the first two for the shapes they take) */
    for (int mode = 0; mode < 5; mode++) {
        static const char *names[5] = { "recurrent", "staged", "chunked-tc", "chunked-tiled", "chunked-generic" };
        lily_status st = { 0 };
        char what[160];
        if ((mode == 1 || mode == 2 || mode == 3) && !(dk == 128 && dv % 32 == 0)) continue;
        snprintf(what, sizeof what, "gdn %s T=%d nk=%d nv=%d dk=%d dv=%d (out, state)", names[mode], T, nk, nv, dk, dv);
        memcpy(S, S0, (size_t)nv * dk * dv * 4);
        for (size_t i = 0; i < (size_t)T * nv * dv; i++) o[i] = NAN;
        lily_code rc = mode == 0   ? lct_gdn(T, nk, nv, dk, dv, u, g, beta, S, o, &st)
                       : mode == 1 ? lct_gdn_staged(T, nk, nv, dk, dv, u, g, beta, S, o, &st)
                                   : lct_gdn_chunked(mode - 1, T, nk, nv, dk, dv, u, g, beta, S, o, &st);
        if (rc) {
            printf("%s: %s\n", what, st.msg);
            n_fail++;
        } else {
            double e1 = rel(o, oref, (size_t)T * nv * dv), e2 = rel(S, Sref, (size_t)nv * dk * dv);
            report(what, e1 > e2 ? e1 : e2, 1e-4);
        }
    }
    free(u); free(g); free(beta); free(S0); free(S); free(Sref); free(o); free(oref); free(gh); free(bh);
}

/* Decode's DeltaNet step, fused (cu_gdn_dec), split four ways a head (cu_gdn_dec_split, then the
 * gated norm's own launch) and as two launches, over several tokens (the fused and split forms'
 * shared q|k conv state written once a key head, their counters back at 0) against a
 * reference of double-precision conv, norms and gates and the CPU's recurrence: outputs after the
 * gated norm, the conv state and S after the last token. */
static void test_gdn_dec(int steps, int nk, int nv, int K) {
    const int dk = 128, dv = 128, cd = 2 * nk * dk + nv * dv, vd = nv * dv, kd = nk * dk;
    const float eps = 1e-6f;
    float *mixed = rnd((size_t)steps * cd, 1.0f), *state0 = rnd((size_t)cd * (K - 1), 1.0f), *cw = rnd((size_t)cd * K, 0.5f);
    float *bb = rnd((size_t)steps * nv, 3.0f), *aa = rnd((size_t)steps * nv, 4.0f), *al = rnd((size_t)nv, 1.0f), *dt = rnd((size_t)nv, 2.0f);
    float *z = rnd((size_t)steps * vd, 2.0f), *gw = rnd((size_t)dv, 1.0f), *S0 = rnd((size_t)nv * dk * dv, 0.1f);
    float *sref = malloc((size_t)cd * (K - 1) * 4), *Sref = malloc((size_t)nv * dk * dv * 4), *oref = malloc((size_t)steps * vd * 4);
    float *u = malloc((size_t)cd * 4), *ob = malloc((size_t)vd * 4);
    memcpy(sref, state0, (size_t)cd * (K - 1) * 4);
    memcpy(Sref, S0, (size_t)nv * dk * dv * 4);
    for (int t = 0; t < steps; t++) {
        const float *m = mixed + (size_t)t * cd;
        for (int ch = 0; ch < cd; ch++) {
            float *cs = sref + (size_t)ch * (K - 1);
            double a = (double)cw[(size_t)ch * K + K - 1] * m[ch];
            for (int j = 0; j < K - 1; j++) a += (double)cw[(size_t)ch * K + j] * cs[j];
            u[ch] = (float)(a / (1.0 + exp(-a)));
            for (int j = 0; j + 1 < K - 1; j++) cs[j] = cs[j + 1];
            if (K > 1) cs[K - 2] = m[ch];
        }
        ref_qk_norm(u, nk, dk);
        for (int h = 0; h < nv; h++) {
            const int kh = h / (nv / nk);
            float g, beta;
            ref_gates(bb[(size_t)t * nv + h], aa[(size_t)t * nv + h], al[h], dt[h], &g, &beta);
            cpu_gdn_recurrent(1, dk, dv, u + (size_t)kh * dk, cd, u + kd + (size_t)kh * dk, cd, u + 2 * kd + (size_t)h * dv, cd, &g, &beta,
                              Sref + (size_t)h * dk * dv, ob + (size_t)h * dv, vd);
            double ss = 0;
            for (int j = 0; j < dv; j++) ss += (double)ob[h * dv + j] * ob[h * dv + j];
            const double r = 1.0 / sqrt(ss / dv + eps);
            for (int j = 0; j < dv; j++) {
                const double zz = z[(size_t)t * vd + h * dv + j];
                oref[(size_t)t * vd + h * dv + j] = (float)(ob[h * dv + j] * r * gw[j] * (zz / (1.0 + exp(-zz))));
            }
        }
    }
    float *st_ = malloc((size_t)cd * (K - 1) * 4), *S = malloc((size_t)nv * dk * dv * 4), *o = malloc((size_t)steps * vd * 4);
    for (int fused = 2; fused >= 0; fused--) {
        lily_status st = { 0 };
        char what[160];
        snprintf(what, sizeof what, "gdn decode step %s steps=%d nk=%d nv=%d K=%d (out, conv state, S)",
                 fused == 2 ? "split+gated norm" : fused ? "fused" : "prep+rec", steps, nk, nv, K);
        memcpy(st_, state0, (size_t)cd * (K - 1) * 4);
        memcpy(S, S0, (size_t)nv * dk * dv * 4);
        for (size_t i = 0; i < (size_t)steps * vd; i++) o[i] = NAN;
        if (lct_gdn_dec(fused, steps, nk, nv, K, mixed, st_, cw, bb, aa, al, dt, S, z, gw, eps, o, &st)) {
            printf("%s: %s\n", what, st.msg);
            n_fail++;
            continue;
        }
        double e = rel(o, oref, (size_t)steps * vd), e2 = rel(S, Sref, (size_t)nv * dk * dv), e3 = rel(st_, sref, (size_t)cd * (K - 1));
        if (!(e2 <= e)) e = e2;
        if (!(e3 <= e)) e = e3;
        report(what, e, 1e-4);
    }
    free(mixed); free(state0); free(cw); free(bb); free(aa); free(al); free(dt); free(z); free(gw); free(S0);
    free(sref); free(Sref); free(oref); free(u); free(ob); free(st_); free(S); free(o);
}
