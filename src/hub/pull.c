/* `lily pull`: list a repository, check the disk, download what is missing, verify,
 * rename into place. A manifest (.lily-pull.json) remembers verified files and the
 * hash each .partial file is meant to have, so a later run can skip or resume. */
#include "hub/hub_internal.h"
#include "util/util.h"
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define LISTING_LIMIT (64u << 20)

void hub_opts_default(hub_opts *o) { memset(o, 0, sizeof *o); }

lily_code hub_cache_dir(const char *repo_id, const char *suffix, char *out, size_t n, lily_status *st) {
    if (!hub_repo_id_valid(repo_id)) return lily_err(st, LILY_EINVAL, "'%s' is not a repository id (org/name)", repo_id);
    const char *home = getenv("LILY_HOME");
    char base[4096];
    if (home && *home) snprintf(base, sizeof base, "%s", home);
    else {
        const char *h = getenv("HOME");
        if (!h || !*h) return lily_err(st, LILY_EINVAL, "neither LILY_HOME nor HOME is set: pass --dir");
        snprintf(base, sizeof base, "%s/.cache/lily", h);
    }
    char mangled[512];
    size_t j = 0;
    for (const char *c = repo_id; *c && j + 3 < sizeof mangled; c++) {
        if (*c == '/') { mangled[j++] = '-'; mangled[j++] = '-'; }
        else mangled[j++] = *c;
    }
    mangled[j] = 0;
    if ((size_t)snprintf(out, n, "%s/models/%s%s", base, mangled, suffix ? suffix : "") >= n)
        return lily_err(st, LILY_EINVAL, "cache path too long");
    return LILY_OK;
}

static lily_code mkdir_p(const char *path, lily_status *st) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return lily_err(st, LILY_EINVAL, "path too long: %s", path);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p; *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) return lily_err(st, LILY_EIO, "creating %s: %s", buf, strerror(errno));
            struct stat sb;
            if (stat(buf, &sb) != 0 || !S_ISDIR(sb.st_mode)) return lily_err(st, LILY_EIO, "%s exists and is not a folder", buf);
            *p = c;
            if (!c) break;
        }
    }
    return LILY_OK;
}

static void sleep_ms(long ms) {
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* ---- manifest ---------------------------------------------------------------- */

typedef struct { json_t *root; char path[4200]; } manifest;

static void manifest_load(manifest *m, const char *dir) {
    snprintf(m->path, sizeof m->path, "%s/.lily-pull.json", dir);
    m->root = json_load_file(m->path, 0, NULL);
    if (!json_is_object(m->root)) { json_decref(m->root); m->root = json_object(); }
    if (!json_is_object(json_object_get(m->root, "files"))) json_object_set_new(m->root, "files", json_object());
    if (!json_is_object(json_object_get(m->root, "partial"))) json_object_set_new(m->root, "partial", json_object());
}

static lily_code manifest_save(manifest *m, lily_status *st) {
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", m->path);
    if (json_dump_file(m->root, tmp, JSON_INDENT(1) | JSON_SORT_KEYS) != 0 || rename(tmp, m->path) != 0) {
        unlink(tmp);
        return lily_err(st, LILY_EIO, "writing %s: %s", m->path, strerror(errno));
    }
    return LILY_OK;
}

/* The identity a file's content must have: LFS sha256, else the git blob id. */
static const char *file_ident(const hub_file *f) { return f->is_lfs ? f->sha256 : f->blob_id; }

static int manifest_has(manifest *m, const hub_file *f) {
    json_t *e = json_object_get(json_object_get(m->root, "files"), f->path);
    const char *id = json_string_value(json_object_get(e, "id"));
    return id && *file_ident(f) && !strcmp(id, file_ident(f));
}

static void manifest_set(manifest *m, const char *sect, const hub_file *f) {
    json_t *e = json_pack("{s:s, s:I}", "id", file_ident(f), "size", (json_int_t)f->size);
    json_object_set_new(json_object_get(m->root, sect), f->path, e);
}

/* ---- one file ------------------------------------------------------------------ */

typedef struct {
    const hub_opts *o;
    hub_progress p;
    uint64_t base_done;     /* bytes finished before the current file */
    uint64_t file_start;    /* offset the current file resumed from */
    double t0;
} run;

static int xfer_progress(void *user, uint64_t offset) {
    run *r = user;
    r->p.bytes_done = r->base_done + (offset - r->file_start);
    r->p.elapsed = lily_now() - r->t0;
    if (r->o->progress) r->o->progress(r->o->progress_user, &r->p);
    return 0;
}

static int hex40(const char *s) {
    if (strlen(s) != 40) return 0;
    for (int i = 0; i < 40; i++) if (!strchr("0123456789abcdef", s[i])) return 0;
    return 1;
}

/* Is a file already in place with the listed size and content? */
static int present(manifest *m, const char *dir, const hub_file *f, int *hashed) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, f->path);
    struct stat sb;
    *hashed = 0;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
    if (f->has_size && (uint64_t)sb.st_size != f->size) return 0;
    if (manifest_has(m, f)) return 1;
    int git = !f->is_lfs && hex40(f->blob_id);
    if (!f->is_lfs && !git) return 0;                    /* nothing to check it against */
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    hub_hash *h = hub_hash_new(git, (uint64_t)sb.st_size);
    char hex[65] = "";
    int ok = h && hub_hash_file(h, fd, (uint64_t)sb.st_size, NULL) == LILY_OK;
    if (ok) hub_hash_hex(h, hex);
    hub_hash_free(h);
    close(fd);
    *hashed = 1;
    return ok && !strcmp(hex, file_ident(f));
}

static lily_code fetch_file(run *r, manifest *m, const char *dir, const char *base_url, const char *token,
                            const hub_file *f, lily_status *st) {
    char final[4200], partial[4300], url[8192];
    snprintf(final, sizeof final, "%s/%s", dir, f->path);
    snprintf(partial, sizeof partial, "%s.partial", final);
    char *slash = strrchr(final, '/');
    *slash = 0;
    lily_code rc = mkdir_p(final, st);
    *slash = '/';
    if (rc != LILY_OK) return rc;
    /* URL: each path segment escaped, slashes kept. */
    size_t ul = (size_t)snprintf(url, sizeof url, "%s", base_url);
    for (const char *c = f->path; *c;) {
        const char *e = strchr(c, '/');
        size_t len = e ? (size_t)(e - c) : strlen(c);
        char *esc = curl_easy_escape(NULL, c, (int)len);
        if (!esc) return lily_err(st, LILY_ENOMEM, "out of memory");
        ul += (size_t)snprintf(url + ul, sizeof url - ul, "%s%s", esc, e ? "/" : "");
        curl_free(esc);
        if (ul >= sizeof url) return lily_err(st, LILY_EINVAL, "URL too long for %s", f->path);
        c = e ? e + 1 : c + len;
    }
    /* Only LFS files resume: their sha256 vouches for the bytes kept from an earlier run. */
    int resumable = f->is_lfs;
    json_t *pe = json_object_get(json_object_get(m->root, "partial"), f->path);
    const char *pid = json_string_value(json_object_get(pe, "id"));
    uint64_t offset = 0;
    struct stat sb;
    if (resumable && pid && !strcmp(pid, f->sha256) && stat(partial, &sb) == 0 && S_ISREG(sb.st_mode)
        && (!f->has_size || (uint64_t)sb.st_size <= f->size))
        offset = (uint64_t)sb.st_size;
    int fd = open(partial, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return lily_err(st, LILY_EIO, "creating %s: %s", partial, strerror(errno));
    if (ftruncate(fd, (off_t)offset) != 0) { close(fd); return lily_err(st, LILY_EIO, "%s: %s", partial, strerror(errno)); }
    manifest_set(m, "partial", f);
    if ((rc = manifest_save(m, st)) != LILY_OK) { close(fd); return rc; }
    int git = !f->is_lfs && hex40(f->blob_id) && f->has_size;
    hub_hash *h = hub_hash_new(git, f->size);
    if (!h) { close(fd); return lily_err(st, LILY_ENOMEM, "out of memory"); }
    if (offset && (rc = hub_hash_file(h, fd, offset, st)) != LILY_OK) goto out;
    hub_req req = { .url = url, .token = token, .what = f->path, .stall_seconds = r->o->stall_seconds };
    int tries = r->o->max_retries > 0 ? r->o->max_retries : 6;
    long delay = r->o->retry_base_ms > 0 ? r->o->retry_base_ms : 1000;
    /* A partial that already has every byte (killed between download and rename) only
     * needs its check. */
    for (int attempt = 1; !(f->has_size && offset == f->size && f->size > 0 && resumable); attempt++) {
        int transient = 0;
        r->file_start = offset;
        r->p.attempt = attempt; r->p.note = NULL;
        rc = hub_http_download(&req, fd, &offset, h, xfer_progress, r, &transient, st);
        r->base_done += offset - r->file_start;
        if (rc == LILY_OK || !transient || attempt >= tries) break;
        if (rc == LILY_ERANGE || !resumable) {   /* start this file over */
            if (ftruncate(fd, 0) != 0) { rc = lily_err(st, LILY_EIO, "%s: %s", partial, strerror(errno)); break; }
            r->base_done -= offset;
            offset = 0;
            hub_hash_reset(h);
        }
        char note[600];
        snprintf(note, sizeof note, "retrying in %.1f s (attempt %d of %d): %s", delay / 1000.0, attempt + 1, tries,
                 st ? st->msg : "transfer failed");
        r->p.note = note;
        if (r->o->progress) r->o->progress(r->o->progress_user, &r->p);
        r->p.note = NULL;
        sleep_ms(delay);
        delay = delay * 2 > 60000 ? 60000 : delay * 2;
    }
    if (rc != LILY_OK) goto out;
    if (f->has_size && offset != f->size) {
        rc = lily_err(st, LILY_EFORMAT, "%s: got %llu bytes, the listing says %llu; the download was discarded",
                      f->path, (unsigned long long)offset, (unsigned long long)f->size);
        unlink(partial);
        goto out;
    }
    if (f->is_lfs || git) {
        char hex[65];
        hub_hash_hex(h, hex);
        if (strcmp(hex, file_ident(f)) != 0) {
            rc = lily_err(st, LILY_EFORMAT, "%s: %s mismatch (expected %s, got %s); the corrupt download was discarded",
                          f->path, f->is_lfs ? "sha256" : "git blob id", file_ident(f), hex);
            unlink(partial);
            goto out;
        }
    }
    if (fsync(fd) != 0) { rc = lily_err(st, LILY_EIO, "%s: %s", partial, strerror(errno)); goto out; }
    if (rename(partial, final) != 0) { rc = lily_err(st, LILY_EIO, "renaming %s: %s", partial, strerror(errno)); goto out; }
    json_object_del(json_object_get(m->root, "partial"), f->path);
    manifest_set(m, "files", f);
    rc = manifest_save(m, st);
out:
    hub_hash_free(h);
    close(fd);
    return rc;
}

/* Other weight formats are skipped when the repository has safetensors. */
static int other_weights(const char *p) {
    static const char *ext[] = { ".bin", ".pth", ".pt", ".gguf", ".msgpack", ".h5", ".ot", ".onnx", ".ckpt" };
    size_t n = strlen(p);
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++) {
        size_t e = strlen(ext[i]);
        if (n > e && !strcmp(p + n - e, ext[i])) return 1;
    }
    return 0;
}

static lily_code get_listing(const char *endpoint, const char *repo, const char *rev, const char *token,
                             const hub_opts *o, hub_listing *l, lily_status *st) {
    char url[4096], what[512];
    char *erev = curl_easy_escape(NULL, rev, 0);
    if (!erev) return lily_err(st, LILY_ENOMEM, "out of memory");
    snprintf(url, sizeof url, "%s/api/models/%s/revision/%s?blobs=true", endpoint, repo, erev);
    curl_free(erev);
    snprintf(what, sizeof what, "listing of %s at %s", repo, rev);
    hub_req req = { .url = url, .token = token, .what = what, .stall_seconds = o->stall_seconds };
    int tries = o->max_retries > 0 ? o->max_retries : 6;
    long delay = o->retry_base_ms > 0 ? o->retry_base_ms : 1000;
    char *body = NULL; size_t len = 0;
    lily_code rc;
    for (int attempt = 1;; attempt++) {
        int transient = 0;
        rc = hub_http_get(&req, LISTING_LIMIT, &body, &len, &transient, st);
        if (rc == LILY_OK || !transient || attempt >= tries) break;
        sleep_ms(delay);
        delay = delay * 2 > 60000 ? 60000 : delay * 2;
    }
    if (rc != LILY_OK) return rc;
    rc = hub_listing_parse(body, len, l, st);
    free(body);
    return rc;
}

lily_code hub_pull(const char *repo_id, const hub_opts *o, char *out_dir, size_t n, lily_status *st) {
    hub_opts def;
    if (!o) { hub_opts_default(&def); o = &def; }
    if (!hub_repo_id_valid(repo_id)) return lily_err(st, LILY_EINVAL, "'%s' is not a repository id (org/name)", repo_id);
    char endpoint[2048], dir[4096];
    const char *ep = o->endpoint ? o->endpoint : getenv("HF_ENDPOINT");
    snprintf(endpoint, sizeof endpoint, "%s", ep && *ep ? ep : "https://huggingface.co");
    for (size_t l = strlen(endpoint); l > 0 && endpoint[l - 1] == '/'; l--) endpoint[l - 1] = 0;
    if (strncmp(endpoint, "http://", 7) && strncmp(endpoint, "https://", 8))
        return lily_err(st, LILY_EINVAL, "hub endpoint '%s' is not an http(s) URL", endpoint);
    const char *token = o->token ? o->token : getenv("HF_TOKEN");
    if (!token || !*token) token = getenv("HUGGING_FACE_HUB_TOKEN");
    const char *rev = o->revision && *o->revision ? o->revision : "main";
    lily_code rc;
    if (o->dir) snprintf(dir, sizeof dir, "%s", o->dir);
    else if ((rc = hub_cache_dir(repo_id, NULL, dir, sizeof dir, st)) != LILY_OK) return rc;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    /* The listing first: a wrong id, revision or token leaves nothing on disk. */
    hub_listing l;
    if ((rc = get_listing(endpoint, repo_id, rev, token, o, &l, st)) != LILY_OK) return rc;
    if ((rc = mkdir_p(dir, st)) != LILY_OK) { hub_listing_free(&l); return rc; }

    char lockp[4200];
    snprintf(lockp, sizeof lockp, "%s/.lily-pull.lock", dir);
    int lock = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock < 0) { hub_listing_free(&l); return lily_err(st, LILY_EIO, "creating %s: %s", lockp, strerror(errno)); }
    if (flock(lock, LOCK_EX | LOCK_NB) != 0) {
        close(lock);
        hub_listing_free(&l);
        return lily_err(st, LILY_EIO, "another lily pull is downloading into %s", dir);
    }
    manifest m = { 0 };
    int *todo = NULL;
    manifest_load(&m, dir);
    /* "complete" is true only between a fully verified pull and the next attempt. */
    json_object_set_new(m.root, "complete", json_false());
    int has_st = 0;
    for (int i = 0; i < l.n_files; i++) {
        size_t pl = strlen(l.files[i].path);
        if (pl > 12 && !strcmp(l.files[i].path + pl - 12, ".safetensors")) has_st = 1;
    }
    todo = calloc(l.n_files ? l.n_files : 1, sizeof *todo);
    if (!todo) { rc = lily_err(st, LILY_ENOMEM, "out of memory"); goto done; }
    run r = { .o = o, .t0 = lily_now() };
    uint64_t need = 0;
    for (int i = 0; i < l.n_files; i++) {
        const hub_file *f = &l.files[i];
        int hashed;
        if (has_st && other_weights(f->path)) continue;
        if (present(&m, dir, f, &hashed)) {
            if (hashed && *file_ident(f)) manifest_set(&m, "files", f);
            continue;
        }
        todo[i] = 1;
        r.p.files_total++;
        r.p.bytes_total += f->size;
        need += f->size;
        char partial[4300];
        struct stat sb;
        snprintf(partial, sizeof partial, "%s/%s.partial", dir, f->path);
        if (f->is_lfs && stat(partial, &sb) == 0 && (uint64_t)sb.st_size <= f->size) need -= (uint64_t)sb.st_size;
    }
    struct statvfs vfs;
    if (statvfs(dir, &vfs) == 0) {
        uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
        uint64_t margin = (need >> 8) + (1u << 20); /* file system overhead */
        if (need + margin > avail) {
            rc = lily_err(st, LILY_EIO, "not enough disk space in %s: the download needs %.2f GB more, %.2f GB are free",
                          dir, (need + margin) / 1e9, avail / 1e9);
            goto done;
        }
    }
    char base_url[6144];
    snprintf(base_url, sizeof base_url, "%s/%s/resolve/", endpoint, repo_id);
    {
        char *erev = curl_easy_escape(NULL, rev, 0);
        if (!erev) { rc = lily_err(st, LILY_ENOMEM, "out of memory"); goto done; }
        /* Resolve at the commit the listing named, so every file comes from one revision. */
        strncat(base_url, l.sha[0] ? l.sha : erev, sizeof base_url - strlen(base_url) - 2);
        strcat(base_url, "/");
        curl_free(erev);
    }
    json_object_set_new(m.root, "repo", json_string(repo_id));
    json_object_set_new(m.root, "revision", json_string(rev));
    json_object_set_new(m.root, "commit", json_string(l.sha));
    for (int i = 0; i < l.n_files && rc == LILY_OK; i++) {
        if (!todo[i]) continue;
        r.p.file = l.files[i].path;
        rc = fetch_file(&r, &m, dir, base_url, token, &l.files[i], st);
        if (rc == LILY_OK) r.p.files_done++;
    }
    if (rc == LILY_OK) {
        json_object_set_new(m.root, "complete", json_true());
        rc = manifest_save(&m, st);
    }
    if (rc == LILY_OK && out_dir && (size_t)snprintf(out_dir, n, "%s", dir) >= n)
        rc = lily_err(st, LILY_EINVAL, "folder name too long");
done:
    free(todo);
    json_decref(m.root);
    hub_listing_free(&l);
    flock(lock, LOCK_UN);
    close(lock);
    return rc;
}
