/* hub: the listing parser on good and hostile listings, path and id checks, the cache
 * folder, and hub_resolve_model against the fake hub (pull + convert of the bf16 tiny
 * fixture, equal to tiny-mlx4; local folders; offline reuse). */
#include "t.h"
#include "hub/hub.h"
#include "loader/safetensors.h"
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static lily_code parse(const char *j, hub_listing *l, lily_status *st) { return hub_listing_parse(j, strlen(j), l, st); }

static void test_listing(void) {
    const char *good =
        "{\"id\":\"org/m\",\"sha\":\"abcdef0123\",\"siblings\":["
        "{\"rfilename\":\"model.safetensors\",\"blobId\":\"x\",\"size\":123,"
        "\"lfs\":{\"sha256\":\"ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789\",\"size\":123,\"pointerSize\":134}},"
        "{\"rfilename\":\"config.json\",\"blobId\":\"0123456789abcdef0123456789abcdef01234567\",\"size\":10},"
        "{\"rfilename\":\"sub/dir/a.txt\"}]}";
    hub_listing l;
    lily_status st = { 0 };
    CHECK(parse(good, &l, &st) == LILY_OK, "good listing: %s", st.msg);
    CHECK(l.n_files == 3 && !strcmp(l.files[0].path, "config.json"), "sorted files");
    CHECK(l.files[1].is_lfs && l.files[1].size == 123 && !strcmp(l.files[1].sha256, "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789"), "lfs entry, hex lowercased");
    CHECK(!l.files[0].is_lfs && l.files[0].has_size && !l.files[2].has_size, "sizes");
    CHECK(!strcmp(l.sha, "abcdef0123") && l.repo_id && !strcmp(l.repo_id, "org/m"), "sha and id");
    hub_listing_free(&l);
    static const char *bad[] = {
        "", "[]", "{}", "{\"siblings\":{}}", "{\"siblings\":[1]}", "{\"siblings\":[{\"rfilename\":5}]}",
        "{\"siblings\":[{\"rfilename\":\"../etc/passwd\"}]}", "{\"siblings\":[{\"rfilename\":\"/abs\"}]}",
        "{\"siblings\":[{\"rfilename\":\"a//b\"}]}", "{\"siblings\":[{\"rfilename\":\"a/./b\"}]}",
        "{\"siblings\":[{\"rfilename\":\"a/..\"}]}", "{\"siblings\":[{\"rfilename\":\"a\\\\b\"}]}",
        "{\"siblings\":[{\"rfilename\":\"x.partial\"}]}", "{\"siblings\":[{\"rfilename\":\"a/\"}]}",
        "{\"siblings\":[{\"rfilename\":\"a\\u0000b\"}]}", "{\"siblings\":[{\"rfilename\":\"\"}]}",
        "{\"siblings\":[{\"rfilename\":\"a\"},{\"rfilename\":\"a\"}]}",
        "{\"siblings\":[{\"rfilename\":\"a\"},{\"rfilename\":\"a-b\"},{\"rfilename\":\"a/b\"}]}",
        "{\"siblings\":[{\"rfilename\":\"a\",\"size\":-1}]}", "{\"siblings\":[{\"rfilename\":\"a\",\"size\":1.5}]}",
        "{\"siblings\":[{\"rfilename\":\"a\",\"size\":\"1\"}]}",
        "{\"siblings\":[{\"rfilename\":\"a\",\"lfs\":{\"sha256\":\"zz\"}}]}",
        "{\"siblings\":[{\"rfilename\":\"a\",\"lfs\":5}]}",
        "{\"siblings\":[{\"rfilename\":\"a\",\"size\":2,\"lfs\":{\"sha256\":\"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\",\"size\":3}}]}",
        "{\"siblings\":[], \"siblings\":[]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        lily_status s2 = { 0 };
        lily_code rc = parse(bad[i], &l, &s2);
        CHECK(rc == LILY_EFORMAT && s2.msg[0], "hostile listing %zu accepted: %s", i, bad[i]);
        CHECK(l.files == NULL && l.n_files == 0, "nothing left after a refusal");
    }
}

static void test_ids(void) {
    static const char *good[] = { "Qwen/Qwen3.6-35B-A3B", "mlx-community/Qwen3.6-35B-A3B-4bit", "gpt2", "a_b/c.d" };
    static const char *bad[] = { "", "/x", "x/", "a/b/c", "../x", "a/..", "a b/c", "a/.x", "a/-x", "a/b..c", "a/b." };
    for (size_t i = 0; i < 4; i++) CHECK(hub_repo_id_valid(good[i]), "%s valid", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) CHECK(!hub_repo_id_valid(bad[i]), "'%s' invalid", bad[i]);
    char out[512];
    lily_status st;
    setenv("LILY_HOME", "/x/home", 1);
    CHECK(hub_cache_dir("Qwen/Qwen3.6-35B-A3B", NULL, out, sizeof out, &st) == LILY_OK &&
          !strcmp(out, "/x/home/models/Qwen--Qwen3.6-35B-A3B"), "cache dir %s", out);
    unsetenv("LILY_HOME");
    setenv("HOME", "/h", 1);
    CHECK(hub_cache_dir("a/b", "-mlx4", out, sizeof out, &st) == LILY_OK && !strcmp(out, "/h/.cache/lily/models/a--b-mlx4"), "default %s", out);
}

static int same_bytes(const char *a, const char *b) {
    st_set x, y;
    lily_status st = { 0 };
    if (st_open(a, &x, &st) != LILY_OK) return 0;
    if (st_open(b, &y, &st) != LILY_OK) { st_close(&x); return 0; }
    int ok = x.n_tensors == y.n_tensors;
    for (int i = 0; ok && i < y.n_tensors; i++) {
        const st_tensor *t = &y.tensors[i], *u = st_find(&x, t->name);
        ok = u && u->nbytes == t->nbytes && !memcmp(u->data, t->data, t->nbytes);
    }
    st_close(&x); st_close(&y);
    return ok;
}

static void test_resolve(void) {
    char tmp[] = "/tmp/lily-test-hub-XXXXXX", cmd[2048], path[600], out[4096];
    if (!mkdtemp(tmp)) { CHECK(0, "mkdtemp"); return; }
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s/repo && cp ../shared/fixtures/tiny/*.json ../shared/fixtures/tiny/model-*.safetensors %s/repo/ && "
             "(python3 tests/fake_hub.py %s/repo org/tiny %s/ports 2>/dev/null & echo $! > %s/pid)", tmp, tmp, tmp, tmp, tmp);
    CHECK(system(cmd) == 0, "start fake hub");
    int hp = 0, cp = 0;
    snprintf(path, sizeof path, "%s/ports", tmp);
    for (int i = 0; i < 100 && !hp; i++) {
        FILE *f = fopen(path, "r");
        if (f) { if (fscanf(f, "%d %d", &hp, &cp) != 2) hp = 0; fclose(f); }
        if (!hp) usleep(100000);
    }
    CHECK(hp > 0, "fake hub port");
    char ep[64], home[300];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", hp);
    snprintf(home, sizeof home, "%s/home", tmp);
    setenv("HF_ENDPOINT", ep, 1);
    setenv("LILY_HOME", home, 1);
    lily_status st = { 0 };
    lily_code rc = hub_resolve_model("org/tiny", out, sizeof out, &st);
    CHECK(rc == LILY_OK, "resolve org/tiny: %s", st.msg);
    snprintf(path, sizeof path, "%s/models/org--tiny-mlx4", home);
    CHECK(!strcmp(out, path), "resolved to the converted folder %s", out);
    CHECK(rc == LILY_OK && same_bytes(out, "../shared/fixtures/tiny-mlx4"), "pulled + converted == tiny-mlx4");
    CHECK(hub_resolve_model("../shared/fixtures/tiny-mlx4", out, sizeof out, &st) == LILY_OK &&
          !strcmp(out, "../shared/fixtures/tiny-mlx4"), "a folder is returned as is");
    CHECK(hub_resolve_model("./no/such", out, sizeof out, &st) == LILY_EINVAL, "missing folder: %s", st.msg);
    CHECK(hub_resolve_model("org/absent", out, sizeof out, &st) != LILY_OK && strstr(st.msg, "404"), "absent repo: %s", st.msg);
    /* hub gone: the complete earlier copy still serves */
    snprintf(cmd, sizeof cmd, "kill $(cat %s/pid)", tmp);
    CHECK(system(cmd) == 0, "stop fake hub");
    usleep(200000);
    rc = hub_resolve_model("org/tiny", out, sizeof out, &st);
    CHECK(rc == LILY_OK && !strcmp(out, path), "offline reuse: %s", st.msg);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", tmp);
}

int main(void) {
    test_listing();
    test_ids();
    test_resolve();
    return T_DONE();
}
