#include "loader/safetensors.h"
#include "util/util.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct { const char *name; size_t size; } dtypes[ST_NDTYPES] = {
    [ST_F32] = { "F32", 4 }, [ST_F16] = { "F16", 2 }, [ST_BF16] = { "BF16", 2 },
    [ST_F64] = { "F64", 8 }, [ST_U32] = { "U32", 4 }, [ST_I32] = { "I32", 4 },
    [ST_U8] = { "U8", 1 }, [ST_I8] = { "I8", 1 }, [ST_U16] = { "U16", 2 },
    [ST_I16] = { "I16", 2 }, [ST_I64] = { "I64", 8 }, [ST_U64] = { "U64", 8 },
    [ST_BOOL] = { "BOOL", 1 }, [ST_F8_E4M3] = { "F8_E4M3", 1 }, [ST_F8_E5M2] = { "F8_E5M2", 1 },
};

const char *st_dtype_name(st_dtype t) { return (unsigned)t < ST_NDTYPES ? dtypes[t].name : "?"; }
size_t st_dtype_size(st_dtype t) { return (unsigned)t < ST_NDTYPES ? dtypes[t].size : 0; }
int st_dtype_from_name(const char *s) {
    for (int i = 0; i < ST_NDTYPES; i++)
        if (!strcmp(s, dtypes[i].name)) return i;
    return -1;
}

int64_t st_numel(const st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* Header sizes beyond this are not a checkpoint but an attack or corruption. */
#define ST_MAX_HEADER (100u << 20)

lily_code st_parse(const uint8_t *buf, size_t len, const char *fname, int file_index,
                   st_tensor **out, int *n, lily_status *st) {
    if (len < 8) return lily_err(st, LILY_EFORMAT, "%s: truncated safetensors file (%zu bytes)", fname, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > ST_MAX_HEADER || hlen > len - 8)
        return lily_err(st, LILY_EFORMAT, "%s: header length %llu exceeds file size %zu", fname,
                        (unsigned long long)hlen, len);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return lily_err(st, LILY_EFORMAT, "%s: corrupt header JSON: %s", fname, jerr.text);
    lily_code rc = LILY_OK;
    if (!json_is_object(root)) { rc = lily_err(st, LILY_EFORMAT, "%s: header is not a JSON object", fname); goto done; }
    const uint8_t *data = buf + 8 + hlen;
    size_t dlen = len - 8 - (size_t)hlen;
    const char *key;
    json_t *val;
    size_t first = (size_t)*n;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) continue;
        json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"),
               *jo = json_object_get(val, "data_offsets");
        if (!json_is_object(val) || !json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) ||
            json_array_size(jo) != 2) {
            rc = lily_err(st, LILY_EFORMAT, "%s: tensor '%s': header entry needs dtype, shape, data_offsets", fname, key);
            goto done;
        }
        int dt = st_dtype_from_name(json_string_value(jd));
        if (dt < 0) { rc = lily_err(st, LILY_EFORMAT, "%s: tensor '%s': unknown dtype '%s'", fname, key, json_string_value(jd)); goto done; }
        size_t nd = json_array_size(js);
        if (nd > ST_MAX_DIMS) { rc = lily_err(st, LILY_EFORMAT, "%s: tensor '%s': %zu dims", fname, key, nd); goto done; }
        st_tensor t = { 0 };
        t.dtype = (st_dtype)dt;
        t.ndim = (int)nd;
        t.file = file_index;
        uint64_t numel = 1;
        for (size_t i = 0; i < nd; i++) {
            json_t *d = json_array_get(js, i);
            if (!json_is_integer(d) || json_integer_value(d) < 0 || json_integer_value(d) > (1ll << 40)) {
                rc = lily_err(st, LILY_EFORMAT, "%s: tensor '%s': bad shape", fname, key); goto done;
            }
            t.shape[i] = json_integer_value(d);
            if (t.shape[i] && numel > UINT64_MAX / (uint64_t)t.shape[i] / 8) {
                rc = lily_err(st, LILY_EFORMAT, "%s: tensor '%s': shape overflows", fname, key); goto done;
            }
            numel *= (uint64_t)t.shape[i];
        }
        json_t *b = json_array_get(jo, 0), *e = json_array_get(jo, 1);
        if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
            json_integer_value(e) < json_integer_value(b) || (uint64_t)json_integer_value(e) > dlen) {
            rc = lily_err(st, LILY_EFORMAT, "%s: tensor '%s': data_offsets outside the file's %zu data bytes (truncated shard?)",
                          fname, key, dlen);
            goto done;
        }
        uint64_t nbytes = (uint64_t)(json_integer_value(e) - json_integer_value(b));
        if (nbytes != numel * st_dtype_size(t.dtype)) {
            rc = lily_err(st, LILY_EFORMAT, "%s: tensor '%s': %llu bytes for %s shape of %llu elements", fname, key,
                          (unsigned long long)nbytes, dtypes[dt].name, (unsigned long long)numel);
            goto done;
        }
        t.data = data + json_integer_value(b);
        t.nbytes = (size_t)nbytes;
        t.name = strdup(key);
        st_tensor *grown = realloc(*out, (size_t)(*n + 1) * sizeof **out);
        if (!t.name || !grown) {
            free(t.name);
            if (grown) *out = grown;
            rc = lily_err(st, LILY_ENOMEM, "%s: out of memory", fname);
            goto done;
        }
        *out = grown;
        (*out)[(*n)++] = t;
    }
    /* Overlapping tensors would alias each other's bytes: reject. */
    for (size_t i = first; i < (size_t)*n; i++)
        for (size_t j = i + 1; j < (size_t)*n && rc == LILY_OK; j++) {
            const st_tensor *a = &(*out)[i], *c = &(*out)[j];
            const uint8_t *a0 = a->data, *c0 = c->data;
            if (a->nbytes && c->nbytes && a0 < c0 + c->nbytes && c0 < a0 + a->nbytes)
                rc = lily_err(st, LILY_EFORMAT, "%s: tensors '%s' and '%s' overlap", fname, a->name, c->name);
        }
done:
    json_decref(root);
    return rc;
}

static int cmp_tensor(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static lily_code map_file(st_set *set, const char *path, lily_status *st) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return lily_err(st, LILY_EIO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return lily_err(st, LILY_EIO, "%s: not a regular file", path);
    }
    void *map = NULL;
    if (sb.st_size > 0) {
        map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) {
            close(fd);
            return lily_err(st, LILY_EIO, "%s: mmap failed: %s", path, strerror(errno));
        }
    }
    close(fd);
    st_file *f = realloc(set->files, (size_t)(set->n_files + 1) * sizeof *f);
    if (!f) { if (map) munmap(map, (size_t)sb.st_size); return lily_err(st, LILY_ENOMEM, "out of memory"); }
    set->files = f;
    f[set->n_files] = (st_file){ strdup(path), map, (size_t)sb.st_size };
    int idx = set->n_files++;
    static const uint8_t empty[1];
    return st_parse(map ? map : empty, (size_t)sb.st_size, path, idx, &set->tensors, &set->n_tensors, st);
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Shards named by the index, each once, in name order. */
static lily_code open_index(st_set *set, const char *dir, const char *index_path, lily_status *st) {
    json_error_t jerr;
    json_t *idx = json_load_file(index_path, 0, &jerr);
    if (!idx) return lily_err(st, LILY_EFORMAT, "%s: %s (line %d)", index_path, jerr.text, jerr.line);
    json_t *wm = json_object_get(idx, "weight_map");
    lily_code rc = LILY_OK;
    if (!json_is_object(wm)) { rc = lily_err(st, LILY_EFORMAT, "%s: no weight_map object", index_path); goto out; }
    size_t nn = json_object_size(wm), nu = 0;
    char **names = calloc(nn ? nn : 1, sizeof *names);
    const char *k; json_t *v;
    json_object_foreach(wm, k, v) {
        const char *fn = json_string_value(v);
        if (!fn || strchr(fn, '/') || fn[0] == '.') {
            rc = lily_err(st, LILY_EFORMAT, "%s: tensor '%s' maps to a bad file name", index_path, k);
            break;
        }
        names[nu++] = (char *)fn;
    }
    if (rc == LILY_OK) {
        qsort(names, nu, sizeof *names, cmp_str);
        for (size_t i = 0; i < nu && rc == LILY_OK; i++) {
            if (i && !strcmp(names[i], names[i - 1])) continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            rc = map_file(set, path, st);
        }
    }
    free(names);
    if (rc == LILY_OK) { /* every mapped name must be present in the shard the index names */
        qsort(set->tensors, (size_t)set->n_tensors, sizeof *set->tensors, cmp_tensor);
        json_object_foreach(wm, k, v) {
            const st_tensor *t = st_find(set, k);
            if (!t) { rc = lily_err(st, LILY_EFORMAT, "%s: tensor '%s' is listed but missing from %s", index_path, k, json_string_value(v)); break; }
            if (!ends_with(set->files[t->file].path, json_string_value(v))) {
                rc = lily_err(st, LILY_EFORMAT, "%s: tensor '%s' is in %s, index says %s", index_path, k, set->files[t->file].path, json_string_value(v));
                break;
            }
        }
    }
out:
    json_decref(idx);
    return rc;
}

lily_code st_open(const char *path, st_set *set, lily_status *st) {
    memset(set, 0, sizeof *set);
    struct stat sb;
    if (stat(path, &sb) != 0) return lily_err(st, LILY_EIO, "%s: %s", path, strerror(errno));
    lily_code rc = LILY_OK;
    if (S_ISREG(sb.st_mode)) {
        rc = map_file(set, path, st);
    } else {
        char ip[4096];
        snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", path);
        if (access(ip, R_OK) == 0) {
            rc = open_index(set, path, ip, st);
        } else {
            DIR *d = opendir(path);
            if (!d) return lily_err(st, LILY_EIO, "%s: %s", path, strerror(errno));
            char **names = NULL; size_t nn = 0;
            struct dirent *de;
            while ((de = readdir(d)))
                if (ends_with(de->d_name, ".safetensors") && de->d_name[0] != '.' &&
                    strcmp(de->d_name, "reference.safetensors")) {
                    char **g = realloc(names, (nn + 1) * sizeof *names);
                    if (!g) break;
                    names = g; names[nn++] = strdup(de->d_name);
                }
            closedir(d);
            qsort(names, nn, sizeof *names, cmp_str);
            if (!nn) rc = lily_err(st, LILY_EFORMAT, "%s: no .safetensors files and no model.safetensors.index.json", path);
            for (size_t i = 0; i < nn; i++) {
                char p[4096];
                snprintf(p, sizeof p, "%s/%s", path, names[i]);
                if (rc == LILY_OK) rc = map_file(set, p, st);
                free(names[i]);
            }
            free(names);
        }
    }
    if (rc == LILY_OK) {
        qsort(set->tensors, (size_t)set->n_tensors, sizeof *set->tensors, cmp_tensor);
        for (int i = 1; i < set->n_tensors; i++)
            if (!strcmp(set->tensors[i].name, set->tensors[i - 1].name)) {
                rc = lily_err(st, LILY_EFORMAT, "tensor '%s' appears in both %s and %s", set->tensors[i].name,
                              set->files[set->tensors[i - 1].file].path, set->files[set->tensors[i].file].path);
                break;
            }
    }
    if (rc != LILY_OK) st_close(set);
    return rc;
}

void st_close(st_set *set) {
    for (int i = 0; i < set->n_tensors; i++) free(set->tensors[i].name);
    for (int i = 0; i < set->n_files; i++) {
        if (set->files[i].map) munmap(set->files[i].map, set->files[i].size);
        free(set->files[i].path);
    }
    free(set->tensors);
    free(set->files);
    memset(set, 0, sizeof *set);
}

const st_tensor *st_find(const st_set *set, const char *name) {
    int lo = 0, hi = set->n_tensors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(set->tensors[mid].name, name);
        if (!c) return &set->tensors[mid];
        if (c < 0) lo = mid + 1; else hi = mid - 1;
    }
    return NULL;
}

const char *st_file_of(const st_set *set, const st_tensor *t) { return set->files[t->file].path; }

/* ---- writer ---- */
typedef struct { char *name; st_dtype dt; int ndim; int64_t shape[ST_MAX_DIMS]; uint64_t nbytes; } st_decl;
struct st_writer {
    char *path;
    FILE *f;
    st_decl *d;
    int n, cur;
    uint64_t cur_written;
    int data_started;
};

lily_code st_writer_open(const char *path, st_writer **out, lily_status *st) {
    st_writer *w = calloc(1, sizeof *w);
    if (!w) return lily_err(st, LILY_ENOMEM, "out of memory");
    w->path = strdup(path);
    w->f = fopen(path, "wb");
    if (!w->f) {
        lily_code rc = lily_err(st, LILY_EIO, "%s: %s", path, strerror(errno));
        free(w->path); free(w);
        return rc;
    }
    *out = w;
    return LILY_OK;
}

lily_code st_writer_declare(st_writer *w, const char *name, st_dtype dt, int ndim, const int64_t *shape, lily_status *st) {
    LILY_ASSERT(!w->data_started && ndim >= 0 && ndim <= ST_MAX_DIMS);
    st_decl *g = realloc(w->d, (size_t)(w->n + 1) * sizeof *g);
    if (!g) return lily_err(st, LILY_ENOMEM, "out of memory");
    w->d = g;
    st_decl *d = &w->d[w->n++];
    memset(d, 0, sizeof *d);
    d->name = strdup(name);
    d->dt = dt;
    d->ndim = ndim;
    d->nbytes = st_dtype_size(dt);
    for (int i = 0; i < ndim; i++) { d->shape[i] = shape[i]; d->nbytes *= (uint64_t)shape[i]; }
    return LILY_OK;
}

static lily_code wr(st_writer *w, const void *p, size_t n, lily_status *st) {
    if (n && fwrite(p, 1, n, w->f) != n)
        return lily_err(st, LILY_EIO, "%s: write failed: %s", w->path, strerror(errno ? errno : ENOSPC));
    return LILY_OK;
}

lily_code st_writer_begin_data(st_writer *w, const char *metadata_format, lily_status *st) {
    json_t *h = json_object();
    if (metadata_format) {
        json_t *m = json_object();
        json_object_set_new(m, "format", json_string(metadata_format));
        json_object_set_new(h, "__metadata__", m);
    }
    uint64_t off = 0;
    for (int i = 0; i < w->n; i++) {
        json_t *e = json_object(), *sh = json_array();
        json_object_set_new(e, "dtype", json_string(st_dtype_name(w->d[i].dt)));
        for (int k = 0; k < w->d[i].ndim; k++) json_array_append_new(sh, json_integer(w->d[i].shape[k]));
        json_object_set_new(e, "shape", sh);
        json_object_set_new(e, "data_offsets", json_pack("[I,I]", (json_int_t)off, (json_int_t)(off + w->d[i].nbytes)));
        json_object_set_new(h, w->d[i].name, e);
        off += w->d[i].nbytes;
    }
    char *txt = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (!txt) return lily_err(st, LILY_ENOMEM, "out of memory");
    size_t len = strlen(txt), pad = (8 - len % 8) % 8; /* data aligned to 8 bytes */
    uint8_t hdr[8];
    uint64_t hl = len + pad;
    for (int i = 0; i < 8; i++) hdr[i] = (uint8_t)(hl >> (8 * i));
    lily_code rc = wr(w, hdr, 8, st);
    if (!rc) rc = wr(w, txt, len, st);
    if (!rc) rc = wr(w, "        ", pad, st);
    free(txt);
    w->data_started = 1;
    w->cur = 0;
    w->cur_written = 0;
    return rc;
}

lily_code st_writer_write(st_writer *w, const void *data, size_t n, lily_status *st) {
    LILY_ASSERT(w->data_started);
    const uint8_t *p = data;
    while (n) {
        while (w->cur < w->n && w->cur_written == w->d[w->cur].nbytes) { w->cur++; w->cur_written = 0; }
        if (w->cur >= w->n) return lily_err(st, LILY_EINVAL, "%s: more data written than declared", w->path);
        uint64_t room = w->d[w->cur].nbytes - w->cur_written;
        size_t k = n < room ? n : (size_t)room;
        lily_code rc = wr(w, p, k, st);
        if (rc) return rc;
        p += k; n -= k; w->cur_written += k;
    }
    return LILY_OK;
}

static void writer_free(st_writer *w) {
    for (int i = 0; i < w->n; i++) free(w->d[i].name);
    free(w->d);
    free(w->path);
    free(w);
}

lily_code st_writer_close(st_writer *w, lily_status *st) {
    while (w->cur < w->n && w->cur_written == w->d[w->cur].nbytes) { w->cur++; w->cur_written = 0; }
    lily_code rc = LILY_OK;
    if (w->cur < w->n) rc = lily_err(st, LILY_EINVAL, "%s: tensor '%s' not fully written", w->path, w->d[w->cur].name);
    if (!rc && fflush(w->f) != 0) rc = lily_err(st, LILY_EIO, "%s: %s", w->path, strerror(errno));
    if (!rc && fsync(fileno(w->f)) != 0) rc = lily_err(st, LILY_EIO, "%s: fsync: %s", w->path, strerror(errno));
    if (fclose(w->f) != 0 && !rc) rc = lily_err(st, LILY_EIO, "%s: close: %s", w->path, strerror(errno));
    if (rc) unlink(w->path);
    writer_free(w);
    return rc;
}

void st_writer_abort(st_writer *w) {
    if (!w) return;
    fclose(w->f);
    unlink(w->path);
    writer_free(w);
}
