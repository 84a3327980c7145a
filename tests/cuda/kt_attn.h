/* Attention against loops in double: prefill's (causal, over a cache) and decode's with the
 * q/k prep folded in.
 * Included by kernel_test.c, which owns rng, report(), the counters and the matrix makers. */
/* Prefill attention against plain loops in double: causal over a cache holding pos0 earlier keys,
 * gated. The tensor-core kernel (head dim 256, 8 query heads a KV head) has fp16 operands. */
static void test_attention_s(int T, int nh, int nkv, int hd, int pos0, int splits);
static void test_attention(int T, int nh, int nkv, int hd, int pos0) { test_attention_s(T, nh, nkv, hd, pos0, 0); }
/* splits > 0 (T 1): decode's form, the keys in splits parts (some empty at short context) merged
 * by k_attn_merge */
static void test_attention_s(int T, int nh, int nkv, int hd, int pos0, int splits) {
    const int ctx = pos0 + T, hg = nh / nkv;
    float *q = rnd((size_t)T * nh * hd, 1.0f), *qg = rnd((size_t)T * nh * 2 * hd, 2.0f);
    float *kc = rnd((size_t)ctx * nkv * hd, 1.0f), *vc = rnd((size_t)ctx * nkv * hd, 1.0f);
    lct_kv_round(kc, (size_t)ctx * nkv * hd); /* (the device's cache is fp16: the reference sees the same keys) */
    lct_kv_round(vc, (size_t)ctx * nkv * hd);
    float *o = malloc((size_t)T * nh * hd * 4), *ref = malloc((size_t)T * nh * hd * 4);
    double *sc = malloc((size_t)ctx * sizeof *sc), *acc = malloc((size_t)hd * sizeof *acc);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            const float *qh = q + ((size_t)t * nh + h) * hd;
            const int n = pos0 + t + 1, kh = h / hg;
            double mx = -1e300, sum = 0;
            for (int j = 0; j < n; j++) {
                const float *k = kc + ((size_t)j * nkv + kh) * hd;
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)qh[i] * k[i];
                sc[j] = d / sqrt((double)hd);
                if (sc[j] > mx) mx = sc[j];
            }
            for (int i = 0; i < hd; i++) acc[i] = 0;
            for (int j = 0; j < n; j++) {
                const double p = exp(sc[j] - mx);
                const float *v = vc + ((size_t)j * nkv + kh) * hd;
                sum += p;
                for (int i = 0; i < hd; i++) acc[i] += p * v[i];
            }
            const float *gate = qg + ((size_t)t * nh + h) * 2 * hd + hd;
            for (int i = 0; i < hd; i++) ref[((size_t)t * nh + h) * hd + i] = (float)(acc[i] / sum / (1.0 + exp(-(double)gate[i])));
        }
    const char *e = getenv("LILY_CU_ATTN_TC");
    const int tc = hd == 256 && nh == 8 * nkv && T > 1 && !(e && !strcmp(e, "0"));
    /* the tensor-core kernel twice: staging the fp32 cache itself, and from the fp16 scratch; decode's
     * splits as the default takes them, then (the 35B-A3B heads) by k_attn_gqa, and on the tensor cores
     * (k_attn_dtc) */
    const int dtc = splits && hd == 256 && nh == 8 * nkv;
    for (int h16 = 0; h16 <= (tc && !splits ? 1 : dtc ? 2 : 0); h16++) {
        for (size_t i = 0; i < (size_t)T * nh * hd; i++) o[i] = NAN;
        lily_status st = { 0 };
        char what[160];
        snprintf(what, sizeof what, "attention%s T=%d nh=%d nkv=%d hd=%d after %d%s",
                 tc && !splits ? (h16 ? " (tensor cores, fp16 keys)" : " (tensor cores)") : "", T, nh, nkv, hd, pos0,
                 splits ? (h16 == 1 ? " (decode splits, k_attn_gqa)" : h16 == 2 ? " (decode splits, tensor cores)" : " (decode splits)") : "");
        if (splits && h16) lct_attn_dtc(h16 > 1, 0);
        const lily_code rc = splits ? lct_attention_split(q, qg, kc, vc, nh, nkv, hd, pos0, ctx, splits, o, &st)
                                    : lct_attention(q, qg, kc, vc, T, nh, nkv, hd, pos0, ctx, h16, o, &st);
        lct_attn_dtc(-1, -1);
        if (rc) { printf("%s: %s\n", what, st.msg); n_fail++; }
        else report(what, rel(o, ref, (size_t)T * nh * hd), tc && !splits ? 3e-3 : 1e-5);
    }
    free(q); free(qg); free(kc); free(vc); free(o); free(ref); free(sc); free(acc);
}

/* Decode attention with the q/k prep folded in (cu_attention_dec) against loops in double: the raw q
 * and the new key normalized per head and rotated (RoPE on the first rot dims, pairs i, i + rot / 2,
 * as src/cpu's), the new key and value written at pos0 (poisoned before), then attention over pos0
 * + 1 keys, gated. Every cache row but pos0's must come back unchanged. */
static void ref_head(const float *x, const float *w, const float *inv_freq, int hd, int rot, int p, double *y) {
    double ss = 0;
    for (int i = 0; i < hd; i++) ss += (double)x[i] * x[i];
    const double r = 1.0 / sqrt(ss / hd + 1e-6);
    for (int i = 0; i < hd; i++) y[i] = x[i] * r * w[i];
    for (int i = 0; i < rot / 2; i++) {
        const double ang = (double)(float)((float)p * inv_freq[i]), a = y[i], b = y[i + rot / 2];
        y[i] = a * cos(ang) - b * sin(ang);
        y[i + rot / 2] = b * cos(ang) + a * sin(ang);
    }
}
static void test_attention_dec(int nh, int nkv, int hd, int rot, int pos0, int splits) {
    const int ctx = pos0 + 3, hg = nh / nkv;
    float *qg = rnd((size_t)nh * 2 * hd, 2.0f), *k = rnd((size_t)nkv * hd, 2.0f), *v = rnd((size_t)nkv * hd, 1.0f);
    float *qn = rnd((size_t)hd, 1.0f), *kn = rnd((size_t)hd, 1.0f), *inv = malloc((size_t)(rot / 2) * 4);
    for (int i = 0; i < rot / 2; i++) inv[i] = (float)pow(10000.0, -2.0 * i / rot);
    float *kc = rnd((size_t)ctx * nkv * hd, 1.0f), *vc = rnd((size_t)ctx * nkv * hd, 1.0f);
    lct_kv_round(kc, (size_t)ctx * nkv * hd);
    lct_kv_round(vc, (size_t)ctx * nkv * hd);
    float *kr = malloc((size_t)ctx * nkv * hd * 4), *vr = malloc((size_t)ctx * nkv * hd * 4);
    for (size_t i = 0; i < (size_t)nkv * hd; i++) kc[(size_t)pos0 * nkv * hd + i] = vc[(size_t)pos0 * nkv * hd + i] = NAN;
    memcpy(kr, kc, (size_t)ctx * nkv * hd * 4);
    memcpy(vr, vc, (size_t)ctx * nkv * hd * 4);
    double *y = malloc((size_t)hd * sizeof *y), *sc = malloc((size_t)(pos0 + 1) * sizeof *sc), *acc = malloc((size_t)hd * sizeof *acc);
    for (int h = 0; h < nkv; h++) {
        ref_head(k + (size_t)h * hd, kn, inv, hd, rot, pos0, y);
        for (int i = 0; i < hd; i++) {
            kr[((size_t)pos0 * nkv + h) * hd + i] = (float)y[i];
            vr[((size_t)pos0 * nkv + h) * hd + i] = v[(size_t)h * hd + i];
        }
    }
    lct_kv_round(kr + (size_t)pos0 * nkv * hd, (size_t)nkv * hd); /* the new row as the cache stores it */
    lct_kv_round(vr + (size_t)pos0 * nkv * hd, (size_t)nkv * hd);
    float *o = malloc((size_t)nh * hd * 4), *ref = malloc((size_t)nh * hd * 4);
    for (int h = 0; h < nh; h++) {
        const int kh = h / hg;
        ref_head(qg + (size_t)h * 2 * hd, qn, inv, hd, rot, pos0, y);
        double mx = -1e300, sum = 0;
        for (int j = 0; j <= pos0; j++) {
            double d = 0;
            for (int i = 0; i < hd; i++) d += y[i] * kr[((size_t)j * nkv + kh) * hd + i];
            sc[j] = d / sqrt((double)hd);
            if (sc[j] > mx) mx = sc[j];
        }
        for (int i = 0; i < hd; i++) acc[i] = 0;
        for (int j = 0; j <= pos0; j++) {
            const double p = exp(sc[j] - mx);
            sum += p;
            for (int i = 0; i < hd; i++) acc[i] += p * vr[((size_t)j * nkv + kh) * hd + i];
        }
        const float *gate = qg + (size_t)h * 2 * hd + hd;
        for (int i = 0; i < hd; i++) ref[(size_t)h * hd + i] = (float)(acc[i] / sum / (1.0 + exp(-(double)gate[i])));
    }
    /* k_attn_gqa's forms (keys a warp loads together U, blocks a group of 8 query heads is split over HS),
     * each from the same poisoned cache: the default (U 2, HS 2), then others */
    float *kc0 = malloc((size_t)ctx * nkv * hd * 4), *vc0 = malloc((size_t)ctx * nkv * hd * 4);
    memcpy(kc0, kc, (size_t)ctx * nkv * hd * 4);
    memcpy(vc0, vc, (size_t)ctx * nkv * hd * 4);
    /* then the tensor-core kernel (k_attn_dtc) where the shape takes it, U 1 and 2 */
    /* then (the 35B-A3B heads) k_attn_gqa alone, and the tensor cores (k_attn_dtc) */
    static const int us[6] = { 0, 1, 4, 2, 0, 0 }, hss[6] = { 0, 1, 1, 4, 0, 0 }, dtcs[6] = { -1, -1, -1, -1, 0, 1 };
    for (int ui = 0; ui < (hd == 256 && nh == 8 * nkv ? 6 : 4); ui++) {
    memcpy(kc, kc0, (size_t)ctx * nkv * hd * 4);
    memcpy(vc, vc0, (size_t)ctx * nkv * hd * 4);
    for (size_t i = 0; i < (size_t)nh * hd; i++) o[i] = NAN;
    lily_status st = { 0 };
    char what[160];
    snprintf(what, sizeof what, "decode attention, q/k prep folded nh=%d nkv=%d hd=%d rot=%d after %d, %d splits%s", nh, nkv, hd, rot,
             pos0, splits, ui == 1 ? ", U 1 HS 1" : ui == 2 ? ", U 4 HS 1" : ui == 3 ? ", U 2 HS 4" : ui == 4 ? ", k_attn_gqa" : ui == 5 ? ", tensor cores" : "");
    lct_attn_form(us[ui], hss[ui]);
    lct_attn_dtc(dtcs[ui], dtcs[ui] > 0 ? 0 : -1);
    const lily_code rc = lct_attention_dec(qg, k, v, qn, kn, inv, nh, nkv, hd, rot, 1e-6f, pos0, ctx, splits, kc, vc, o, &st);
    lct_attn_form(0, 0);
    lct_attn_dtc(-1, -1);
    if (rc) {
        printf("%s: %s\n", what, st.msg);
        n_fail++;
    } else {
        /* The new key is rounded to fp16 from the kernel's fp32 and from the reference's double: where
         * the two fall either side of a rounding boundary (~1 element in 5 a test) they differ by an fp16
         * unit, ~5e-4 of the element, moving that key's scores by ~3e-5. Hence 1e-4 for the output and the
         * key rows; the values are copied, rounded once, and must match to fp32 (a misplaced or stale row
         * is an O(1) error in either) */
        const double e1 = rel(o, ref, (size_t)nh * hd), e2 = rel(kc, kr, (size_t)ctx * nkv * hd), e3 = rel(vc, vr, (size_t)ctx * nkv * hd);
        char w2[200];
        report(what, e1 > e2 ? e1 : e2, 1e-4);
        snprintf(w2, sizeof w2, "%s: the value rows", what);
        report(w2, e3, 1e-6);
    }
    }
    free(kc0); free(vc0);
    free(qg); free(k); free(v); free(qn); free(kn); free(inv); free(kc); free(vc); free(kr); free(vr); free(y); free(sc); free(acc);
    free(o); free(ref);
}
