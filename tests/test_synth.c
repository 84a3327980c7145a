/* lily synth's generator: the same bytes for any thread count, matrices with the
 * documented distribution (unit-variance Irwin-Hall normal scaled by 1/sqrt(fan_in)),
 * in both layouts. */
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "loader/synth.h"
#include "loader/weights.h"
#include "util/util.h"
#include "t.h"

static char tmp[256];

static void make(const char *name, int mlx4, int threads, uint64_t seed, int vocab) {
    char d[512];
    snprintf(d, sizeof d, "%s/%s", tmp, name);
    synth_opts o;
    memset(&o, 0, sizeof o);
    lily_status st = { 0 };
    synth_preset("tiny", &o.cfg, &st);
    o.mlx4 = mlx4; o.seed = seed; o.n_threads = threads;
    if (vocab) o.cfg.vocab = vocab;
    o.shard_bytes = 1 << 20; /* several shards */
    CHECK(synth_write(d, &o, &st) == LILY_OK, "synth %s: %s", name, st.msg);
}

static int same_files(const char *a, const char *b) {
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/%s", tmp, a);
    DIR *dir = opendir(pa);
    if (!dir) return 0;
    int ok = 1, n = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (e->d_name[0] == '.') continue;
        snprintf(pa, sizeof pa, "%s/%s/%s", tmp, a, e->d_name);
        snprintf(pb, sizeof pb, "%s/%s/%s", tmp, b, e->d_name);
        size_t la = 0, lb = 0;
        char *x = lily_read_file(pa, &la, NULL), *y = lily_read_file(pb, &lb, NULL);
        if (!x || !y || la != lb || memcmp(x, y, la)) { ok = 0; fprintf(stderr, "differs: %s\n", e->d_name); }
        free(x); free(y);
        n++;
    }
    closedir(dir);
    return ok && n > 3;
}

/* mean, variance, excess-free kurtosis and max |v| of a matrix scaled by sqrt(fan) */
static void stats(const lw_mat *m, double mul, double *mean, double *var, double *kurt, double *mx) {
    float *row = malloc((size_t)m->cols * sizeof *row);
    double s1 = 0, s2 = 0, s4 = 0, n = (double)m->rows * m->cols;
    *mx = 0;
    for (int r = 0; r < m->rows; r++) {
        lw_row_f32(m, r, row);
        for (int i = 0; i < m->cols; i++) {
            double v = row[i] * mul;
            s1 += v; s2 += v * v; s4 += v * v * v * v;
            if (fabs(v) > *mx) *mx = fabs(v);
        }
    }
    *mean = s1 / n; *var = s2 / n - *mean * *mean; *kurt = (s4 / n) / (*var * *var);
    free(row);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/lily-test-synth-XXXXXX");
    if (!mkdtemp(tmp)) { perror("mkdtemp"); return 1; }
    uint64_t seed = t_seed("test_synth");
    make("mlx-1", 1, 1, seed, 0);
    make("mlx-3", 1, 3, seed, 0);
    make("hf-2", 0, 2, seed, 0);
    make("hf-1", 0, 1, seed, 0);
    CHECK(same_files("mlx-1", "mlx-3"), "mlx layout depends on the thread count");
    CHECK(same_files("hf-1", "hf-2"), "hf layout depends on the thread count");
    /* a vocab of 40000 rows of 128: more than one 16 MB generation chunk, the last one partial */
    make("big-1", 1, 1, seed, 40000);
    make("big-2", 1, 2, seed, 40000);
    CHECK(same_files("big-1", "big-2"), "multi-chunk tensors depend on the thread count");
    {
        char d[512];
        lily_weights w;
        lily_status st = { 0 };
        snprintf(d, sizeof d, "%s/big-2", tmp);
        CHECK(lw_load(d, &w, &st) == LILY_OK, "load multi-chunk synth: %s", st.msg);
        if (st.code == LILY_OK) {
            double mean, var, kurt, mx;
            lw_mat tail = w.embed; /* the rows of the last, partial chunk */
            tail.rows = 40000 - 32768;
            tail.w = (const uint32_t *)w.embed.w + (size_t)32768 * 128 / 8;
            tail.scales = (const uint16_t *)w.embed.scales + (size_t)32768 * 2;
            tail.biases = (const uint16_t *)w.embed.biases + (size_t)32768 * 2;
            stats(&tail, 1.0, &mean, &var, &kurt, &mx);
            CHECK(fabs(mean) < 0.03 && fabs(var - 1) < 0.06, "last chunk of embed: mean %.4f variance %.4f", mean, var);
            lw_free(&w);
        }
    }

    {   /* seeds are recorded in config.json, so they must fit JSON's int64 */
        synth_opts o;
        memset(&o, 0, sizeof o);
        lily_status st = { 0 };
        synth_preset("tiny", &o.cfg, &st);
        o.seed = 1ull << 63;
        char d[512];
        snprintf(d, sizeof d, "%s/bigseed", tmp);
        CHECK(synth_write(d, &o, &st) == LILY_EINVAL && strstr(st.msg, "seed"), "seed 2^63 accepted: %s", st.msg);
    }
    char d[512];
    lily_weights hf, mlx;
    lily_status st = { 0 };
    snprintf(d, sizeof d, "%s/hf-1", tmp);
    CHECK(lw_load(d, &hf, &st) == LILY_OK, "load hf: %s", st.msg);
    snprintf(d, sizeof d, "%s/mlx-1", tmp);
    CHECK(lw_load(d, &mlx, &st) == LILY_OK, "load mlx: %s", st.msg);
    if (t_fail) return T_DONE();
    /* embed [512][128]: unit variance; qkv [1024][128] and experts' gate: 1/sqrt(128) */
    const lw_mat *ms[3] = { &hf.embed, &hf.layers[0].qkv, &hf.layers[1].gate[3] };
    double muls[3] = { 1.0, sqrt(128.0), sqrt(128.0) };
    for (int i = 0; i < 3; i++) {
        double mean, var, kurt, mx, n = (double)ms[i]->rows * ms[i]->cols;
        stats(ms[i], muls[i], &mean, &var, &kurt, &mx);
        CHECK(fabs(mean) < 5 / sqrt(n), "matrix %d mean %.4f", i, mean);
        CHECK(fabs(var - 1) < 0.05, "matrix %d variance %.4f", i, var);
        CHECK(fabs(kurt - 2.7) < 0.12, "matrix %d kurtosis %.3f (Irwin-Hall n=4: 2.7)", i, kurt);
        CHECK(mx <= 3.47, "matrix %d max |v| %.3f beyond the Irwin-Hall bound", i, mx);
    }
    /* the MLX layout's 4-bit matrices dequantize to the same distribution (plus ~1% quantization noise) */
    const lw_mat *q = &mlx.layers[2].z;
    CHECK(q->type == LW_Q && q->bits == 4, "mlx z is 4-bit");
    double mean, var, kurt, mx;
    stats(q, sqrt(128.0), &mean, &var, &kurt, &mx);
    CHECK(fabs(mean) < 0.03 && fabs(var - 1) < 0.06, "mlx z mean %.4f variance %.4f", mean, var);
    lw_free(&hf); lw_free(&mlx);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    CHECK(system(cmd) == 0, "cleanup");
    return T_DONE();
}
