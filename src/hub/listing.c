/* Parsing the hub's model-info JSON (untrusted) and checking repo paths and ids. */
#include "hub/hub.h"
#include "util/util.h"
#include <ctype.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define HUB_MAX_FILES 100000
#define HUB_MAX_PATH 1024

int hub_path_safe(const char *p) {
    size_t n = strlen(p);
    if (n == 0 || n > HUB_MAX_PATH || p[0] == '/' || p[n - 1] == '/') return 0;
    const char *c = p;
    while (*c) {
        const char *e = strchr(c, '/');
        size_t len = e ? (size_t)(e - c) : strlen(c);
        if (len == 0) return 0;                       /* "a//b" or trailing '/' */
        if (len == 1 && c[0] == '.') return 0;
        if (len == 2 && c[0] == '.' && c[1] == '.') return 0;
        for (size_t i = 0; i < len; i++) {
            unsigned char ch = (unsigned char)c[i];
            if (ch < 0x20 || ch == 0x7f || ch == '\\' || ch == ':') return 0;
        }
        if (!e) break;
        c = e + 1;
    }
    /* Names the downloader itself uses for its side files. */
    if (n >= 8 && !strcmp(p + n - 8, ".partial")) return 0;
    if (!strncmp(p, ".lily-pull", 10)) return 0;
    return 1;
}

int hub_repo_id_valid(const char *id) {
    size_t n = strlen(id);
    if (n == 0 || n > 200) return 0;
    int slashes = 0;
    const char *part = id;
    for (const char *c = id;; c++) {
        if (*c == '/' || *c == 0) {
            size_t len = (size_t)(c - part);
            if (len == 0 || part[0] == '.' || part[0] == '-') return 0;
            if (len >= 2 && part[len - 1] == '.') return 0;
            if (*c == 0) break;
            if (++slashes > 1) return 0;
            part = c + 1;
            continue;
        }
        if (!isalnum((unsigned char)*c) && *c != '-' && *c != '_' && *c != '.') return 0;
        if (c > id && c[-1] == '.' && *c == '.') return 0;
    }
    return 1;
}

static int parse_hex64(const char *s, char out[65]) {
    if (strlen(s) != 64) return 0;
    for (int i = 0; i < 64; i++) {
        if (!isxdigit((unsigned char)s[i])) return 0;
        out[i] = (char)tolower((unsigned char)s[i]);
    }
    out[64] = 0;
    return 1;
}

/* Sizes are JSON integers; anything else (negative, float, huge) is refused. */
static int get_size(json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
    *out = (uint64_t)json_integer_value(v);
    return 1;
}

static int cmp_path(const void *a, const void *b) {
    return strcmp(((const hub_file *)a)->path, ((const hub_file *)b)->path);
}

void hub_listing_free(hub_listing *l) {
    if (!l) return;
    for (int i = 0; i < l->n_files; i++) free(l->files[i].path);
    free(l->files);
    free(l->repo_id);
    memset(l, 0, sizeof *l);
}

lily_code hub_listing_parse(const char *json, size_t len, hub_listing *out, lily_status *st) {
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return lily_err(st, LILY_EFORMAT, "hub listing is not JSON: %s (line %d)", je.text, je.line);
    lily_code rc = LILY_OK;
    if (!json_is_object(root)) { rc = lily_err(st, LILY_EFORMAT, "hub listing is not a JSON object"); goto done; }
    json_t *id = json_object_get(root, "id");
    if (json_is_string(id)) out->repo_id = strdup(json_string_value(id));
    json_t *sha = json_object_get(root, "sha");
    if (json_is_string(sha) && json_string_length(sha) < sizeof out->sha) {
        const char *s = json_string_value(sha);
        for (const char *c = s; *c; c++)
            if (!isxdigit((unsigned char)*c)) { s = NULL; break; }
        if (s) strcpy(out->sha, s);
    }
    json_t *sib = json_object_get(root, "siblings");
    if (!json_is_array(sib)) { rc = lily_err(st, LILY_EFORMAT, "hub listing has no 'siblings' array"); goto done; }
    size_t n = json_array_size(sib);
    if (n > HUB_MAX_FILES) { rc = lily_err(st, LILY_EFORMAT, "hub listing has %zu files (limit %d)", n, HUB_MAX_FILES); goto done; }
    out->files = calloc(n ? n : 1, sizeof *out->files);
    if (!out->files) { rc = lily_err(st, LILY_ENOMEM, "hub listing: out of memory"); goto done; }
    for (size_t i = 0; i < n; i++) {
        json_t *f = json_array_get(sib, i);
        json_t *name = json_object_get(f, "rfilename");
        if (!json_is_object(f) || !json_is_string(name)) {
            rc = lily_err(st, LILY_EFORMAT, "hub listing: siblings[%zu] has no 'rfilename' string", i); goto done;
        }
        const char *p = json_string_value(name);
        if (strlen(p) != json_string_length(name) || !hub_path_safe(p)) {
            rc = lily_err(st, LILY_EFORMAT, "hub listing: unsafe file name in siblings[%zu]", i); goto done;
        }
        hub_file *hf = &out->files[out->n_files];
        if (!(hf->path = strdup(p))) { rc = lily_err(st, LILY_ENOMEM, "hub listing: out of memory"); goto done; }
        out->n_files++;
        json_t *sz = json_object_get(f, "size");
        if (sz) {
            if (!get_size(sz, &hf->size)) { rc = lily_err(st, LILY_EFORMAT, "hub listing: bad size for '%s'", p); goto done; }
            hf->has_size = 1;
        }
        json_t *blob = json_object_get(f, "blobId");
        if (json_is_string(blob) && json_string_length(blob) < sizeof hf->blob_id)
            strcpy(hf->blob_id, json_string_value(blob));
        json_t *lfs = json_object_get(f, "lfs");
        if (lfs && !json_is_null(lfs)) {
            json_t *h = json_object_get(lfs, "sha256"), *ls = json_object_get(lfs, "size");
            if (!json_is_object(lfs) || !json_is_string(h) || !parse_hex64(json_string_value(h), hf->sha256)) {
                rc = lily_err(st, LILY_EFORMAT, "hub listing: bad lfs.sha256 for '%s'", p); goto done;
            }
            if (ls) {
                uint64_t v;
                if (!get_size(ls, &v) || (hf->has_size && v != hf->size)) {
                    rc = lily_err(st, LILY_EFORMAT, "hub listing: bad lfs.size for '%s'", p); goto done;
                }
                hf->size = v; hf->has_size = 1;
            }
            hf->is_lfs = 1;
        }
    }
    qsort(out->files, out->n_files, sizeof *out->files, cmp_path);
    for (int i = 1; i < out->n_files; i++) {
        if (!strcmp(out->files[i - 1].path, out->files[i].path)) {
            rc = lily_err(st, LILY_EFORMAT, "hub listing: '%s' listed twice", out->files[i].path); goto done;
        }
    }
    /* "a" and "a/b" cannot both be files: look every folder prefix up. */
    for (int i = 0; i < out->n_files; i++) {
        char buf[HUB_MAX_PATH + 1];
        const char *p = out->files[i].path;
        for (const char *c = strchr(p, '/'); c; c = strchr(c + 1, '/')) {
            memcpy(buf, p, (size_t)(c - p)); buf[c - p] = 0;
            hub_file key = { .path = buf };
            if (bsearch(&key, out->files, out->n_files, sizeof *out->files, cmp_path)) {
                rc = lily_err(st, LILY_EFORMAT, "hub listing: '%s' is both a file and a folder", buf); goto done;
            }
        }
    }
done:
    json_decref(root);
    if (rc != LILY_OK) hub_listing_free(out);
    return rc;
}
