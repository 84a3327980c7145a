/* Parked conversations on disk: saved, loaded and unparked into a fresh session, a
 * conversation continues exactly as the session that never stopped (logits bit for bit,
 * the same greedy tokens); a file with any byte changed, cut short anywhere, or written for
 * a model of another shape is refused with a reason naming it; a save that cannot complete
 * (no such folder, a full disk) fails with LILY_EIO and leaves no file behind. */
#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include "lily.h"
#include "loader/synth.h"
#include "t.h"
#include "t_model.h"
#include "util/util.h"

static lily_rng rng;

static uint64_t rnd(uint64_t n) { return lily_rng_u64(&rng) % n; }

static int entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    rewind(f);
    unsigned char *b = malloc(*len + 1);
    if (b && fread(b, 1, *len, f) != *len) { free(b); b = NULL; }
    fclose(f);
    return b;
}

static void spit(const char *path, const unsigned char *b, size_t len) {
    FILE *f = fopen(path, "wb");
    if (f) { fwrite(b, 1, len, f); fclose(f); }
}

/* A load of `path` must fail, naming the file. */
static void refused(const lily_model *m, const char *path, const char *what) {
    lily_parked *p = (lily_parked *)1;
    lily_status st = { 0 };
    lily_code rc = lily_parked_load(m, path, &p, &st);
    CHECK(rc != LILY_OK && !p && strstr(st.msg, path), "%s: code %s, message '%s'", what, lily_code_name(rc), st.msg);
    if (rc == LILY_OK) lily_parked_free(p);
}

int main(void) {
    uint64_t seed = t_seed("test_park_file");
    lily_rng_seed(&rng, seed);
    lily_model_info info;
    lily_model *m = t_open_tiny("test_park_file", 3, &info);
    if (!m) { printf("0 passed, 1 failed\n"); return 1; }
    char tmp[] = "/tmp/lily-test-park-file-XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    char path[600], bad[600];
    snprintf(path, sizeof path, "%s/conv.lpark", tmp);
    snprintf(bad, sizeof bad, "%s/bad.lpark", tmp);
    lily_status st = { 0 };
    const int V = info.vocab_size;
    size_t row = sizeof(float) * (size_t)V;
    lily_sampling greedy;
    lily_sampling_default(&greedy);
    greedy.temperature = 0;

    for (int rep = 0; rep < 2; rep++) {
        lily_session *a, *b;
        CHECK(lily_session_new(m, &a, &st) == LILY_OK && lily_session_new(m, &b, &st) == LILY_OK, "sessions");
        int n1 = 20 + (int)rnd(60), mark = 5 + (int)rnd(10), gen = 6, n2 = 10 + (int)rnd(20);
        int32_t conv[256];
        for (int i = 0; i < n1 + gen + n2; i++) conv[i] = (int32_t)rnd((uint64_t)V);
        CHECK(lily_session_prefill_ex(a, conv, n1, &mark, 1, 1, NULL, &st) == LILY_OK &&
                  lily_session_feed(a, conv + n1, gen, NULL, &st) == LILY_OK, "turn 1: %s", st.msg);
        lily_parked *p = NULL, *q = NULL;
        CHECK(lily_session_park(a, &p, &st) == LILY_OK, "park: %s", st.msg);
        CHECK(lily_parked_save(p, m, path, &st) == LILY_OK, "save: %s", st.msg);
        CHECK(entries(tmp) == 1, "only the file is left in the folder (%d entries)", entries(tmp));
        CHECK(lily_parked_load(m, path, &q, &st) == LILY_OK && q, "load: %s", st.msg);
        if (!p || !q) break;
        int pn, qn;
        const int32_t *pt = lily_parked_tokens(p, &pn), *qt = lily_parked_tokens(q, &qn);
        CHECK(pn == qn && !memcmp(pt, qt, sizeof(int32_t) * (size_t)pn), "tokens round-trip");
        CHECK(lily_parked_bytes(p) == lily_parked_bytes(q), "bytes %zu vs %zu", lily_parked_bytes(p), lily_parked_bytes(q));
        for (int i = 0; i < 4; i++)
            CHECK(lily_parked_snapshot(p, i) == lily_parked_snapshot(q, i), "snapshot %d at %d vs %d", i,
                  lily_parked_snapshot(p, i), lily_parked_snapshot(q, i));
        /* the loaded copy continues in a fresh session exactly as the original session does */
        int reused = -1;
        CHECK(lily_session_unpark(b, q, &st) == LILY_OK, "unpark: %s", st.msg);
        CHECK(lily_session_prefill(b, conv, pn + n2, &reused, &st) == LILY_OK && reused == pn,
              "turn 2 reuses all %d loaded tokens (got %d)", pn, reused);
        CHECK(lily_session_prefill(a, conv, pn + n2, NULL, &st) == LILY_OK, "turn 2 on the original");
        CHECK(!memcmp(lily_session_logits(a), lily_session_logits(b), row), "turn 2 logits equal bit for bit");
        int32_t ga[12], gb[12];
        int na = 0, nb = 0;
        for (int i = 0; i < 12; i++) {
            lily_token ta, tb;
            if (lily_session_sample(a, &greedy, &ta, &st) || lily_session_sample(b, &greedy, &tb, &st)) break;
            ga[na++] = ta.id; gb[nb++] = tb.id;
            if (lily_session_feed(a, &ta.id, 1, NULL, &st) || lily_session_feed(b, &tb.id, 1, NULL, &st)) break;
        }
        CHECK(na == 12 && nb == 12 && !memcmp(ga, gb, sizeof ga), "12 greedy tokens equal");
        /* a diverging follow-up resumes at the loaded snapshot, as from the in-memory one */
        lily_session *c;
        CHECK(lily_session_new(m, &c, &st) == LILY_OK && lily_session_unpark(c, q, &st) == LILY_OK, "unpark again");
        int32_t div[64];
        memcpy(div, conv, sizeof(int32_t) * (size_t)mark);
        for (int i = 0; i < 8; i++) div[mark + i] = (int32_t)rnd((uint64_t)V);
        CHECK(lily_session_prefill(c, div, mark + 8, &reused, &st) == LILY_OK && reused == mark,
              "diverging turn resumes at the snapshot %d (got %d)", mark, reused);
        lily_session_free(c);

        /* damaged copies: one byte changed anywhere, or cut short anywhere */
        size_t len = 0;
        unsigned char *orig = slurp(path, &len), *buf = malloc(len + 1);
        CHECK(orig && buf && len > 100, "read the file back (%zu bytes)", len);
        if (!orig || !buf) break;
        for (int k = 0; k < 12; k++) {
            size_t at = k < 4 ? rnd(112) : rnd(len); /* the header gets a third of the tries */
            memcpy(buf, orig, len);
            buf[at] ^= (unsigned char)(1 + rnd(255));
            spit(bad, buf, len);
            char what[80];
            snprintf(what, sizeof what, "byte %zu of %zu changed", at, len);
            refused(m, bad, what);
        }
        for (int k = 0; k < 8; k++) {
            size_t cut = k == 0 ? 0 : k == 1 ? len - 1 : rnd(len);
            spit(bad, orig, cut);
            char what[80];
            snprintf(what, sizeof what, "cut to %zu of %zu bytes", cut, len);
            refused(m, bad, what);
        }
        memcpy(buf, orig, len);
        buf[len] = 0;
        spit(bad, buf, len + 1);
        refused(m, bad, "one byte too many");
        memcpy(buf, orig, len);
        buf[3] ^= 1;
        spit(bad, buf, len);
        lily_parked *r = NULL;
        CHECK(lily_parked_load(m, bad, &r, &st) == LILY_EFORMAT && strstr(st.msg, "magic"), "wrong magic: %s", st.msg);
        memcpy(buf, orig, len);
        buf[8] = 7;
        spit(bad, buf, len);
        CHECK(lily_parked_load(m, bad, &r, &st) == LILY_EUNSUPPORTED && strstr(st.msg, "version"), "version: %s", st.msg);
        memcpy(buf, orig, len);
        buf[len - 40] ^= 0x10; /* inside the last array: only the checksum can tell */
        spit(bad, buf, len);
        CHECK(lily_parked_load(m, bad, &r, &st) == LILY_EFORMAT && strstr(st.msg, "checksum"), "checksum: %s", st.msg);
        free(orig);
        free(buf);
        unlink(bad);
        lily_parked_free(p);
        lily_parked_free(q);
        lily_session_free(a);
        lily_session_free(b);
    }

    /* a model of another shape refuses the file as such */
    char other[600];
    snprintf(other, sizeof other, "%s/other", tmp);
    synth_opts so;
    memset(&so, 0, sizeof so);
    synth_preset("tiny", &so.cfg, &st);
    so.cfg.hidden = 64;
    so.cfg.n_kv_heads = 1;
    so.seed = 7;
    so.eos[0] = 300; so.eos[1] = 301;
    CHECK(synth_write(other, &so, &st) == LILY_OK, "synth: %s", st.msg);
    lily_model_opts mo;
    lily_model_opts_default(&mo);
    mo.n_threads = 2;
    mo.max_ctx = 256;
    lily_model *m2 = NULL;
    lily_parked *r = NULL;
    CHECK(lily_model_open(other, &mo, &m2, &st) == LILY_OK, "open the other model: %s", st.msg);
    if (m2) {
        CHECK(lily_parked_load(m2, path, &r, &st) == LILY_EUNSUPPORTED && !r && strstr(st.msg, "another shape") &&
                  strstr(st.msg, path), "another model's file: %s", st.msg);
        lily_model_free(m2);
    }
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", other);
    CHECK(system(cmd) == 0, "rm");
    /* the same shape with other weights: a copy of the fixture with one data byte changed */
    snprintf(cmd, sizeof cmd, "mkdir '%s' && cp ../shared/fixtures/tiny/*.json ../shared/fixtures/tiny/model-*.safetensors '%s'/ && chmod u+w '%s'/*",
             other, other, other);
    CHECK(system(cmd) == 0, "copy the fixture");
    char shard[700];
    snprintf(shard, sizeof shard, "%s/model-00003-of-00005.safetensors", other);
    size_t slen = 0;
    unsigned char *sb = slurp(shard, &slen);
    CHECK(sb && slen > 100000, "read %s", shard);
    if (sb) {
        sb[(slen - 4096) / 2 + 1 + rnd(4000)] ^= 0x40;
        spit(shard, sb, slen);
        free(sb);
    }
    CHECK(lily_model_open(other, &mo, &m2, &st) == LILY_OK, "open the altered copy: %s", st.msg);
    if (m2) {
        CHECK(lily_parked_load(m2, path, &r, &st) == LILY_EUNSUPPORTED && !r && strstr(st.msg, "other weights"),
              "the same shape with other weights: %s", st.msg);
        lily_model_free(m2);
        m2 = NULL;
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", other);
    CHECK(system(cmd) == 0, "rm");

    /* saves that cannot complete: nothing is left behind */
    lily_session *s;
    lily_parked *p = NULL;
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = (int32_t)rnd((uint64_t)V);
    CHECK(lily_session_new(m, &s, &st) == LILY_OK && lily_session_prefill(s, ids, 40, NULL, &st) == LILY_OK &&
              lily_session_park(s, &p, &st) == LILY_OK, "park for the failure cases");
    char nodir[700], notdir[700];
    snprintf(nodir, sizeof nodir, "%s/missing/x.lpark", tmp);
    CHECK(lily_parked_save(p, m, nodir, &st) == LILY_EIO && strstr(st.msg, nodir), "no such folder: %s", st.msg);
    snprintf(notdir, sizeof notdir, "%s/x.lpark", path); /* path is a file, not a folder */
    CHECK(lily_parked_save(p, m, notdir, &st) == LILY_EIO && strstr(st.msg, notdir), "a file as the folder: %s", st.msg);
    /* a full disk, as the file size limit makes it: write() fails with EFBIG midway */
    char full[700];
    snprintf(full, sizeof full, "%s/full.lpark", tmp);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 100000;
    signal(SIGXFSZ, SIG_IGN);
    int before = entries(tmp);
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit");
    lily_code rc = lily_parked_save(p, m, full, &st);
    setrlimit(RLIMIT_FSIZE, &old);
    CHECK(rc == LILY_EIO && strstr(st.msg, full), "full disk: %s %s", lily_code_name(rc), st.msg);
    CHECK(entries(tmp) == before && access(full, F_OK) != 0, "nothing left after a failed save (%d vs %d entries)",
          entries(tmp), before);
    /* an existing file is replaced whole */
    CHECK(lily_parked_save(p, m, path, &st) == LILY_OK && lily_parked_load(m, path, &r, &st) == LILY_OK && r,
          "overwrite: %s", st.msg);
    int rn = 0;
    if (r) lily_parked_tokens(r, &rn);
    CHECK(rn == 40, "the new conversation replaced the old (%d tokens)", rn);
    lily_parked_free(r);
    lily_parked_free(p);
    lily_session_free(s);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0, "rm");
    lily_model_free(m);
    return T_DONE();
}
