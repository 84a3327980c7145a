/* --model-path for the server: a folder, or a hub repo id pulled (and converted once
 * when it is the bf16 release) into the cache. */
#include "convert/convert.h"
#include "hub/hub.h"
#include "util/util.h"
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static lily_code put(char *out, size_t n, const char *dir, lily_status *st) {
    if ((size_t)snprintf(out, n, "%s", dir) >= n) return lily_err(st, LILY_EINVAL, "folder name too long: %s", dir);
    return LILY_OK;
}

/* Does DIR/config.json say the weights are already quantized? -1 when unreadable. */
static int quantized(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *c = json_load_file(p, 0, NULL);
    if (!json_is_object(c)) { json_decref(c); return -1; }
    int q = json_object_get(c, "quantization") != NULL || json_object_get(c, "quantization_config") != NULL;
    json_decref(c);
    return q;
}

/* Did the last pull into DIR finish and verify every file? */
static int complete(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/.lily-pull.json", dir);
    json_t *m = json_load_file(p, 0, NULL);
    int ok = json_is_true(json_object_get(m, "complete"));
    json_decref(m);
    return ok;
}

lily_code hub_resolve_model_ex(const char *path_or_id, const hub_opts *o, char *out_dir, size_t n,
                               lily_status *st) {
    struct stat sb;
    if (stat(path_or_id, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode)) return lily_err(st, LILY_EINVAL, "%s is not a folder", path_or_id);
        return put(out_dir, n, path_or_id, st);
    }
    if (path_or_id[0] == '/' || path_or_id[0] == '.' || path_or_id[0] == '~' || !hub_repo_id_valid(path_or_id))
        return lily_err(st, LILY_EINVAL, "%s: no such folder, and not a hub repository id (org/name)", path_or_id);
    char dir[4096], conv[4096];
    lily_code rc = hub_pull(path_or_id, o, dir, sizeof dir, st);
    if (rc != LILY_OK && (rc == LILY_EIO || rc == LILY_ECANCELED)) {
        /* Offline (or the hub is down): a copy that was complete before still serves. */
        lily_status dummy;
        if (o && o->dir) snprintf(dir, sizeof dir, "%s", o->dir);
        else if (hub_cache_dir(path_or_id, NULL, dir, sizeof dir, &dummy) != LILY_OK) return rc;
        if ((size_t)snprintf(conv, sizeof conv, "%s-mlx4", dir) < sizeof conv && quantized(conv) == 1)
            return put(out_dir, n, conv, st);
        if (!complete(dir)) return rc;
        rc = LILY_OK;
    }
    if (rc != LILY_OK) return rc;
    int q = quantized(dir);
    if (q < 0) return lily_err(st, LILY_EFORMAT, "%s: the repository has no readable config.json", path_or_id);
    if (q) return put(out_dir, n, dir, st);
    /* The bf16 release: convert once, beside the download. */
    if ((size_t)snprintf(conv, sizeof conv, "%s-mlx4", dir) >= sizeof conv) return lily_err(st, LILY_EINVAL, "path too long");
    if (quantized(conv) == 1) return put(out_dir, n, conv, st);
    convert_opts co;
    convert_opts_default(&co);
    if ((rc = convert_run(dir, conv, &co, NULL, st)) != LILY_OK) return rc;
    return put(out_dir, n, conv, st);
}

lily_code hub_resolve_model(const char *path_or_id, char *out_dir, size_t n, lily_status *st) {
    return hub_resolve_model_ex(path_or_id, NULL, out_dir, n, st);
}
