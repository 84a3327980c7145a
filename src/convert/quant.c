/* The affine group quantizer: MLX-exact min/max, and a search that refines it. */
#include "convert/convert.h"
#include "util/util.h"
#include <math.h>

int convert_quant_valid(int bits, int group) {
    return (bits == 2 || bits == 4 || bits == 8) && (group == 32 || group == 64 || group == 128);
}

/* MLX / make_fixture.py arithmetic, step by step in float32:
 * scale = bf16(max((hi - lo) / levels, 1e-8)), bias = bf16(lo). */
static void minmax_params(const float *g, int n, int levels, uint16_t *s, uint16_t *b) {
    float lo = g[0], hi = g[0];
    for (int i = 1; i < n; i++) {
        if (g[i] < lo) lo = g[i];
        if (g[i] > hi) hi = g[i];
    }
    float scale = (hi - lo) / (float)levels;
    if (scale < 1e-8f) scale = 1e-8f;
    *s = lily_f32_to_bf16(scale);
    *b = lily_f32_to_bf16(lo);
}

/* The best code for each element under fixed (scale, bias): round half to even of
 * (w - bias) / scale in float32, clamped; exactly torch's round().clamp(). */
static inline int code_of(float w, float s, float b, int levels) {
    float q = rintf((w - b) / s);
    if (!(q >= 0.0f)) return 0; /* also catches NaN */
    if (q > (float)levels) return levels;
    return (int)q;
}

/* Squared error of a group under (s, b). The search ranks candidates with it; it
 * multiplies by 1/s instead of dividing (several times faster), which can differ from
 * code_of only on exact rounding ties. */
static float group_err(const float *g, int n, float s, float b, int levels) {
    float inv = 1.0f / s, e = 0, top = (float)levels;
    for (int i = 0; i < n; i++) {
        float x = (g[i] - b) * inv;
        x = x > 0 ? x : 0;
        x = x < top ? x : top;
        /* round half to even for 0 <= x <= 255: adding 1.5 * 2^23 drops the fraction */
        float q = (x + 12582912.0f) - 12582912.0f;
        float d = g[i] - (s * q + b);
        e += d * d;
    }
    return e;
}

/* Least-squares scale and bias for fixed codes, rounded to bf16. Returns 0 when the
 * codes are all equal (no scale to fit). */
static int refit(const float *g, int n, float s, float b, int levels, uint16_t *so, uint16_t *bo) {
    double sq = 0, sqq = 0, sw = 0, sqw = 0;
    for (int i = 0; i < n; i++) {
        double q = code_of(g[i], s, b, levels);
        sq += q; sqq += q * q; sw += g[i]; sqw += q * g[i];
    }
    double det = n * sqq - sq * sq;
    if (det <= 0) return 0;
    double ns = (n * sqw - sq * sw) / det, nb = (sw - ns * sq) / n;
    if (!(ns > 0) || !isfinite(nb)) return 0;
    *so = lily_f32_to_bf16((float)ns);
    *bo = lily_f32_to_bf16((float)nb);
    return lily_bf16_to_f32(*so) > 0;
}

/* Tries a range of scales around min/max (each followed by two least-squares refits)
 * and keeps whatever lowers the squared error, starting from the min/max answer. */
static void search_params(const float *g, int n, int levels, uint16_t *s, uint16_t *b) {
    minmax_params(g, n, levels, s, b);
    float lo = g[0], hi = g[0];
    for (int i = 1; i < n; i++) { lo = fminf(lo, g[i]); hi = fmaxf(hi, g[i]); }
    float fs = lily_bf16_to_f32(*s), fb = lily_bf16_to_f32(*b);
    float best = group_err(g, n, fs, fb, levels);
    if (best == 0 || hi == lo) return;
    static const float widen[] = { -0.9f, -0.6f, -0.3f, 0.0f, 0.3f, 0.6f, 1.0f, 1.5f, 2.0f };
    for (size_t k = 0; k < sizeof widen / sizeof widen[0]; k++) {
        /* A narrower range (levels + widen > levels) clips the tails to gain resolution. */
        for (int centre = 0; centre < 2; centre++) {
            float cs = (hi - lo) / ((float)levels + widen[k]);
            float cb = centre ? 0.5f * (hi + lo) - 0.5f * cs * (float)levels : lo;
            uint16_t ts = lily_f32_to_bf16(cs), tb = lily_f32_to_bf16(cb);
            if (!(lily_bf16_to_f32(ts) > 0)) continue;
            for (int it = 0; it < 3; it++) {
                float ss = lily_bf16_to_f32(ts), bb = lily_bf16_to_f32(tb);
                float e = group_err(g, n, ss, bb, levels);
                if (e < best) { best = e; *s = ts; *b = tb; }
                if (it == 2 || !refit(g, n, ss, bb, levels, &ts, &tb)) break;
            }
        }
    }
}

void convert_quantize(const float *w, size_t rows, size_t cols, int bits, int group,
                      convert_quant_method method, uint32_t *codes, uint16_t *scales,
                      uint16_t *biases, convert_qerr *err) {
    LILY_ASSERT(convert_quant_valid(bits, group) && cols % (size_t)group == 0);
    int levels = (1 << bits) - 1, per = 32 / bits;
    size_t groups = rows * (cols / (size_t)group);
    double e2 = 0, r2 = 0, mx = 0;
    for (size_t gi = 0; gi < groups; gi++) {
        const float *g = w + gi * (size_t)group;
        uint16_t s, b;
        if (method == CONVERT_QUANT_SEARCH) search_params(g, group, levels, &s, &b);
        else minmax_params(g, group, levels, &s, &b);
        scales[gi] = s; biases[gi] = b;
        float fs = lily_bf16_to_f32(s), fb = lily_bf16_to_f32(b);
        uint32_t *out = codes + gi * (size_t)(group / per);
        for (int j = 0; j < group; j += per) {
            uint32_t word = 0;
            for (int k = 0; k < per; k++) {
                int q = code_of(g[j + k], fs, fb, levels);
                word |= (uint32_t)q << (bits * k);
                if (!err) continue; /* the statistics cost as much as the codes */
                double d = (double)g[j + k] - ((double)fs * q + (double)fb);
                e2 += d * d; r2 += (double)g[j + k] * g[j + k];
                if (fabs(d) > mx) mx = fabs(d);
            }
            out[j / per] = word;
        }
    }
    if (err) {
        err->err2 += e2; err->ref2 += r2;
        if (mx > err->max_abs) err->max_abs = mx;
    }
}

void convert_dequantize(const uint32_t *codes, const uint16_t *scales, const uint16_t *biases,
                        size_t rows, size_t cols, int bits, int group, float *out) {
    LILY_ASSERT(convert_quant_valid(bits, group) && cols % (size_t)group == 0);
    int per = 32 / bits;
    uint32_t mask = (1u << bits) - 1;
    size_t n = rows * cols;
    for (size_t i = 0; i < n; i++) {
        uint32_t q = (codes[i / per] >> (bits * (i % per))) & mask;
        size_t gi = i / (size_t)group;
        out[i] = lily_bf16_to_f32(scales[gi]) * (float)q + lily_bf16_to_f32(biases[gi]);
    }
}
