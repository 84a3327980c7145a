/* convert_run: executes the plan into `to.partial`, verifies, renames into place. */
#include "convert/plan.h"
#include "loader/config.h"
#include "loader/weights.h"
#include "util/util.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define MARKER ".lily-convert-incomplete"
#define CHUNK_ELEMS (4u << 20)   /* float elements converted per step: 16 MB */

static const char *aux_files[] = { "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                   "generation_config.json", "vocab.json", "merges.txt",
                                   "special_tokens_map.json", "added_tokens.json" };

void convert_opts_default(convert_opts *o) {
    memset(o, 0, sizeof *o);
    o->bits = 4;
    o->group = 64;
}

typedef struct {
    const convert_opts *o;
    const cv_plan *plan;
    lily_pool *pool;
    convert_progress pr;
    double t0, last_report;
    /* the chunk being quantized */
    const uint8_t *src; st_dtype sdt;
    int64_t nrows, cols;
    int bits, group, ntask;
    float *f;
    uint32_t *codes;
    uint16_t *scales, *biases;
    convert_qerr *terr;
} runner;

static void to_f32(const uint8_t *src, st_dtype dt, size_t n, float *out) {
    if (dt == ST_F32) { memcpy(out, src, n * 4); return; }
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        out[i] = dt == ST_BF16 ? lily_bf16_to_f32(h) : lily_f16_to_f32(h);
    }
}

static void quant_task(void *ctx, int t) {
    runner *r = ctx;
    int64_t per = (r->nrows + r->ntask - 1) / r->ntask, a = t * per, b = a + per < r->nrows ? a + per : r->nrows;
    if (a >= b) return;
    size_t es = st_dtype_size(r->sdt), cols = (size_t)r->cols;
    to_f32(r->src + (size_t)a * cols * es, r->sdt, (size_t)(b - a) * cols, r->f + (size_t)a * cols);
    size_t gpr = cols / (size_t)r->group, wpr = cols * (size_t)r->bits / 32;
    convert_quantize(r->f + (size_t)a * cols, (size_t)(b - a), cols, r->bits, r->group, r->o->method,
                     r->codes + (size_t)a * wpr, r->scales + (size_t)a * gpr, r->biases + (size_t)a * gpr, &r->terr[t]);
}

static void report(runner *r, const char *cur, int force) {
    double now = lily_now();
    if (!r->o->progress || (!force && now - r->last_report < 0.25)) return;
    r->last_report = now;
    r->pr.elapsed = now - r->t0;
    r->pr.current = cur;
    r->o->progress(r->o->progress_user, &r->pr);
}

/* Drops source pages we are done with from our address space (they stay reclaimable
 * page cache), so resident memory stays near one chunk, not the model size. */
static void drop_pages(const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)4095, e = (uintptr_t)p + n;
    if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}

static lily_code write_item(runner *r, st_writer *w, cv_item *it, lily_status *st) {
    lily_code rc = LILY_OK;
    if (!it->bits) {   /* float: convert, shift, store as bf16 or f32 */
        const st_tensor *t = it->slabs[0].src;
        float *f = malloc(CHUNK_ELEMS * sizeof *f);
        uint16_t *h = malloc(CHUNK_ELEMS * sizeof *h);
        uint64_t hh = CV_HASH_INIT;
        for (int64_t i = 0; i < it->cols && rc == LILY_OK && f && h; i += CHUNK_ELEMS) {
            size_t n = (size_t)(it->cols - i < CHUNK_ELEMS ? it->cols - i : CHUNK_ELEMS);
            to_f32((const uint8_t *)t->data + (size_t)i * st_dtype_size(t->dtype), t->dtype, n, f);
            if (it->plus_one) for (size_t k = 0; k < n; k++) f[k] += 1.0f;
            const void *out = f;
            size_t nb = n * 4;
            if (it->out_dt == ST_BF16) {
                for (size_t k = 0; k < n; k++) h[k] = lily_f32_to_bf16(f[k]);
                out = h; nb = n * 2;
            }
            hh = cv_hash(hh, out, nb);
            rc = st_writer_write(w, out, nb, st);
            r->pr.bytes_out_done += nb;
        }
        if (!f || !h) rc = lily_err(st, LILY_ENOMEM, "out of memory converting '%s'", it->name);
        it->hash[0] = hh;
        r->pr.bytes_in_done += it->in_bytes;
        free(f); free(h);
        return rc;
    }
    size_t cols = (size_t)it->cols, gpr = cols / (size_t)it->group, wpr = cols * (size_t)it->bits / 32;
    size_t chunk_rows = CHUNK_ELEMS / cols ? CHUNK_ELEMS / cols : 1;
    int nth = lily_pool_size(r->pool);
    r->ntask = nth * 4;
    r->bits = it->bits; r->group = it->group; r->cols = it->cols;
    r->f = malloc(chunk_rows * cols * sizeof *r->f);
    r->codes = malloc(chunk_rows * wpr * sizeof *r->codes);
    uint16_t *sc = malloc((size_t)it->rows * gpr * 2), *bi = malloc((size_t)it->rows * gpr * 2);
    r->terr = calloc((size_t)r->ntask, sizeof *r->terr);
    if (!r->f || !r->codes || !sc || !bi || !r->terr) { rc = lily_err(st, LILY_ENOMEM, "out of memory quantizing '%s'", it->name); goto out; }
    uint64_t hw = CV_HASH_INIT;
    int64_t row_out = 0;
    for (int s = 0; s < it->n_slabs && rc == LILY_OK; s++) {
        const cv_slab *sl = &it->slabs[s];
        size_t es = st_dtype_size(sl->src->dtype);
        for (int64_t r0 = 0; r0 < sl->nrows && rc == LILY_OK; r0 += (int64_t)chunk_rows) {
            if (r->o->cancel && *r->o->cancel) { rc = lily_err(st, LILY_ECANCELED, "canceled"); break; }
            int64_t nr = sl->nrows - r0 < (int64_t)chunk_rows ? sl->nrows - r0 : (int64_t)chunk_rows;
            r->src = (const uint8_t *)sl->src->data + (size_t)(sl->row0 + r0) * cols * es;
            r->sdt = sl->src->dtype;
            r->nrows = nr;
            r->scales = sc + (size_t)row_out * gpr;
            r->biases = bi + (size_t)row_out * gpr;
            lily_pool_run(r->pool, r->ntask, quant_task, r);
            drop_pages(r->src, (size_t)nr * cols * es);
            hw = cv_hash(hw, r->codes, (size_t)nr * wpr * 4);
            rc = st_writer_write(w, r->codes, (size_t)nr * wpr * 4, st);
            row_out += nr;
            r->pr.bytes_in_done += (uint64_t)nr * cols * es;
            r->pr.bytes_out_done += (uint64_t)nr * wpr * 4;
            report(r, it->name, 0);
        }
    }
    if (rc == LILY_OK) {
        size_t nb = (size_t)it->rows * gpr * 2;
        it->hash[0] = hw;
        it->hash[1] = cv_hash(CV_HASH_INIT, sc, nb);
        it->hash[2] = cv_hash(CV_HASH_INIT, bi, nb);
        rc = st_writer_write(w, sc, nb, st);
        if (rc == LILY_OK) rc = st_writer_write(w, bi, nb, st);
        r->pr.bytes_out_done += 2 * nb;
        for (int t = 0; t < r->ntask; t++) {
            it->err.err2 += r->terr[t].err2; it->err.ref2 += r->terr[t].ref2;
            if (r->terr[t].max_abs > it->err.max_abs) it->err.max_abs = r->terr[t].max_abs;
        }
    }
out:
    free(r->f); free(r->codes); free(sc); free(bi); free(r->terr);
    r->f = NULL; r->codes = NULL; r->terr = NULL;
    return rc;
}

static void shard_name(const cv_plan *p, int s, char *out, size_t n) {
    if (p->n_shards == 1) cv_fmt(out, n, "model.safetensors");
    else cv_fmt(out, n, "model-%05d-of-%05d.safetensors", s + 1, p->n_shards);
}

static lily_code write_shards(runner *r, const char *tmp, cv_plan *p, lily_status *st) {
    lily_code rc = LILY_OK;
    int i = 0;
    for (int s = 0; s < p->n_shards && rc == LILY_OK; s++) {
        char fn[64], path[4200];
        shard_name(p, s, fn, sizeof fn);
        cv_fmt(path, sizeof path, "%s/%s", tmp, fn);
        st_writer *w;
        if ((rc = st_writer_open(path, &w, st)) != LILY_OK) break;
        int first = i;
        for (; i < p->n_items && p->items[i].shard == s && rc == LILY_OK; i++)
            for (int k = 0, nt = 1; k < nt && rc == LILY_OK; k++) {
                char nm[300]; st_dtype dt; int nd; int64_t sh[5]; uint64_t b;
                nt = cv_item_tensor(&p->items[i], k, nm, sizeof nm, &dt, &nd, sh, &b);
                rc = st_writer_declare(w, nm, dt, nd, sh, st);
            }
        if (rc == LILY_OK) rc = st_writer_begin_data(w, "mlx", st);
        for (int j = first; j < i && rc == LILY_OK; j++) {
            cv_item *it = &p->items[j];
            rc = write_item(r, w, it, st);
            r->pr.tensors_done++;
            if (rc == LILY_OK && it->bits && r->o->tensor_done)
                r->o->tensor_done(r->o->tensor_user, it->name, it->bits,
                                  it->err.ref2 > 0 ? sqrt(it->err.err2 / it->err.ref2) : 0.0);
            report(r, it->name, 0);
        }
        if (rc == LILY_OK) rc = st_writer_close(w, st);
        else st_writer_abort(w);
    }
    return rc;
}

static lily_code write_index(const char *tmp, const cv_plan *p, lily_status *st) {
    json_t *wm = json_object();
    for (int i = 0; i < p->n_items; i++) {
        char fn[64];
        shard_name(p, p->items[i].shard, fn, sizeof fn);
        for (int k = 0, nt = 1; k < nt; k++) {
            char nm[300]; st_dtype dt; int nd; int64_t sh[5]; uint64_t b;
            nt = cv_item_tensor(&p->items[i], k, nm, sizeof nm, &dt, &nd, sh, &b);
            json_object_set_new(wm, nm, json_string(fn));
        }
    }
    json_t *idx = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)p->out_bytes, "weight_map", wm);
    char path[4200];
    cv_fmt(path, sizeof path, "%s/model.safetensors.index.json", tmp);
    int bad = json_dump_file(idx, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(idx);
    return bad ? lily_err(st, LILY_EIO, "writing %s: %s", path, strerror(errno)) : LILY_OK;
}

static lily_code copy_file(const char *from, const char *to, lily_status *st) {
    int in = open(from, O_RDONLY | O_CLOEXEC);
    if (in < 0) return errno == ENOENT ? LILY_OK : lily_err(st, LILY_EIO, "%s: %s", from, strerror(errno));
    int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) { close(in); return lily_err(st, LILY_EIO, "%s: %s", to, strerror(errno)); }
    char buf[1 << 16];
    ssize_t n;
    lily_code rc = LILY_OK;
    while (rc == LILY_OK && (n = read(in, buf, sizeof buf)) != 0) {
        if (n < 0) { if (errno == EINTR) continue; rc = lily_err(st, LILY_EIO, "%s: %s", from, strerror(errno)); break; }
        for (ssize_t off = 0; off < n && rc == LILY_OK;) {
            ssize_t w = write(out, buf + off, (size_t)(n - off));
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) rc = lily_err(st, LILY_EIO, "writing %s: %s", to, strerror(errno));
            else off += w;
        }
    }
    if (rc == LILY_OK && fsync(out) != 0) rc = lily_err(st, LILY_EIO, "writing %s: %s", to, strerror(errno));
    close(in);
    if (close(out) != 0 && rc == LILY_OK) rc = lily_err(st, LILY_EIO, "writing %s: %s", to, strerror(errno));
    return rc;
}

/* config.json with the `quantization` (and, as mlx-lm writes it, `quantization_config`) block. */
static lily_code write_config(const char *from, const char *tmp, const cv_plan *p, const convert_opts *o,
                              lily_status *st) {
    char path[4200];
    cv_fmt(path, sizeof path, "%s/config.json", from);
    json_error_t je;
    json_t *c = json_load_file(path, 0, &je);
    if (!json_is_object(c)) { json_decref(c); return lily_err(st, LILY_EFORMAT, "%s: %s", path, je.text); }
    json_t *q = json_pack("{s:i, s:i}", "group_size", o->group, "bits", o->bits);
    for (int i = 0; i < p->n_items; i++)
        if (p->items[i].bits && (p->items[i].bits != o->bits || p->items[i].group != o->group))
            json_object_set_new(q, p->items[i].name, json_pack("{s:i, s:i}", "group_size", p->items[i].group, "bits", p->items[i].bits));
    json_object_set(c, "quantization", q);
    json_object_set_new(c, "quantization_config", q);
    cv_fmt(path, sizeof path, "%s/config.json", tmp);
    int bad = json_dump_file(c, path, JSON_INDENT(2));
    json_decref(c);
    return bad ? lily_err(st, LILY_EIO, "writing %s: %s", path, strerror(errno)) : LILY_OK;
}

/* Re-opens the output and checks every tensor's name, dtype, shape and bytes, then lets
 * the model loader bind it. */
static lily_code verify(runner *r, const char *tmp, cv_plan *p, lily_status *st) {
    st_set set;
    lily_code rc = st_open(tmp, &set, st);
    if (rc != LILY_OK) return rc;
    r->pr.phase = "verify";
    r->pr.tensors_done = 0;
    r->pr.bytes_out_done = 0;
    if (set.n_tensors != p->n_out_tensors)
        rc = lily_err(st, LILY_EFORMAT, "verification: the output holds %d tensors, %d were written", set.n_tensors, p->n_out_tensors);
    for (int i = 0; i < p->n_items && rc == LILY_OK; i++) {
        cv_item *it = &p->items[i];
        for (int k = 0, nt = 1; k < nt && rc == LILY_OK; k++) {
            char nm[300]; st_dtype dt; int nd; int64_t sh[5]; uint64_t b;
            nt = cv_item_tensor(it, k, nm, sizeof nm, &dt, &nd, sh, &b);
            const st_tensor *t = st_find(&set, nm);
            int ok = t && t->dtype == dt && t->ndim == nd && t->nbytes == b;
            for (int d = 0; ok && d < nd; d++) ok = t->shape[d] == sh[d];
            if (!ok) { rc = lily_err(st, LILY_EFORMAT, "verification: tensor '%s' is missing or has the wrong type or shape", nm); break; }
            if (cv_hash(CV_HASH_INIT, t->data, t->nbytes) != it->hash[k])
                rc = lily_err(st, LILY_EIO, "verification: tensor '%s' reads back different bytes than were written", nm);
            drop_pages(t->data, t->nbytes);
            r->pr.bytes_out_done += t->nbytes;
        }
        r->pr.tensors_done++;
        report(r, it->name, 0);
    }
    st_close(&set);
    if (rc == LILY_OK) {
        lily_weights w;
        if ((rc = lw_load(tmp, &w, st)) == LILY_OK) lw_free(&w);
        else {
            char m[sizeof st->msg];
            cv_fmt(m, sizeof m, "%s", st->msg);
            lily_err(st, rc, "verification: the model loader refuses the output: %s", m);
        }
    }
    return rc;
}

static void rm_flat(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char p[4400];
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            cv_fmt(p, sizeof p, "%s/%s", dir, de->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

static lily_code prepare(const char *from, const convert_opts *o, lily_config *cfg, st_set *set, cv_plan *p,
                         lily_status *st) {
    if (o->bits != 4 && o->bits != 8) return lily_err(st, LILY_EINVAL, "--bits %d: lily runs 4- or 8-bit checkpoints", o->bits);
    if (!convert_quant_valid(o->bits, o->group)) return lily_err(st, LILY_EINVAL, "--group %d: use 32, 64 or 128", o->group);
    lily_code rc = cfg_load(from, cfg, st);
    if (rc != LILY_OK) return rc;
    if (cfg->q_bits) return lily_err(st, LILY_EINVAL, "%s is already quantized (config.json has 'quantization')", from);
    if ((rc = st_open(from, set, st)) != LILY_OK) return rc;
    rc = cv_plan_build(set, cfg->n_experts, o->bits, o->group, o->shard_bytes ? o->shard_bytes : 5000000000ull, p, st);
    if (rc != LILY_OK) st_close(set);
    return rc;
}

lily_code convert_output_estimate(const char *from, const convert_opts *o, uint64_t *bytes, lily_status *st) {
    lily_config cfg; st_set set; cv_plan p;
    lily_code rc = prepare(from, o, &cfg, &set, &p, st);
    if (rc != LILY_OK) return rc;
    *bytes = p.out_bytes + (uint64_t)p.n_shards * (64u << 10) + (4u << 20);
    for (size_t i = 0; i < sizeof aux_files / sizeof *aux_files; i++) {
        char path[4200]; struct stat sb;
        cv_fmt(path, sizeof path, "%s/%s", from, aux_files[i]);
        if (stat(path, &sb) == 0) *bytes += (uint64_t)sb.st_size;
    }
    cv_plan_free(&p);
    st_close(&set);
    return LILY_OK;
}

lily_code convert_run(const char *from, const char *to, const convert_opts *oin, convert_result *res,
                      lily_status *st) {
    convert_opts o;
    if (oin) o = *oin; else convert_opts_default(&o);
    if (res) memset(res, 0, sizeof *res);
    char tob[4096];   /* without trailing slashes, so TO.partial lies beside TO */
    if (cv_fmt(tob, sizeof tob, "%s", to) >= (int)sizeof tob) return lily_err(st, LILY_EINVAL, "path too long: %s", to);
    for (size_t l = strlen(tob); l > 1 && tob[l - 1] == '/'; l--) tob[l - 1] = 0;
    to = tob;
    struct stat sb;
    if (lstat(to, &sb) == 0) return lily_err(st, LILY_EINVAL, "%s already exists; convert writes a new folder", to);
    char tmp[4200], marker[4300];
    cv_fmt(tmp, sizeof tmp, "%s.partial", to);
    cv_fmt(marker, sizeof marker, "%s/" MARKER, tmp);
    if (lstat(tmp, &sb) == 0) {   /* an earlier run that was interrupted */
        if (access(marker, F_OK) != 0) return lily_err(st, LILY_EINVAL, "%s exists and is not an unfinished conversion; remove it", tmp);
        rm_flat(tmp);
    }
    uint64_t need;
    lily_code rc = convert_output_estimate(from, &o, &need, st);
    if (rc != LILY_OK) return rc;
    char parent[4200];
    cv_fmt(parent, sizeof parent, "%s", to);
    char *sl = strrchr(parent, '/');
    if (sl) { if (sl == parent) sl[1] = 0; else *sl = 0; } else cv_fmt(parent, sizeof parent, ".");
    struct statvfs vfs;
    if (statvfs(parent, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < need)
        return lily_err(st, LILY_EIO, "not enough disk space in %s: the converted model needs %.2f GB, %.2f GB are free",
                        parent, need / 1e9, (double)vfs.f_bavail * vfs.f_frsize / 1e9);
    lily_config cfg; st_set set; cv_plan p;
    if ((rc = prepare(from, &o, &cfg, &set, &p, st)) != LILY_OK) return rc;
    runner r = { .o = &o, .plan = &p, .t0 = lily_now() };
    r.pr.tensors_total = p.n_items;
    r.pr.bytes_in_total = p.in_bytes;
    r.pr.bytes_out_total = p.out_bytes;
    r.pr.phase = "convert";
    int fd = -1;
    if (mkdir(tmp, 0755) != 0) { rc = lily_err(st, LILY_EIO, "creating %s: %s", tmp, strerror(errno)); goto fail_nodir; }
    if ((fd = open(marker, O_WRONLY | O_CREAT | O_CLOEXEC, 0644)) < 0) { rc = lily_err(st, LILY_EIO, "%s: %s", marker, strerror(errno)); goto fail; }
    close(fd);
    if (!(r.pool = lily_pool_new(o.n_threads))) { rc = lily_err(st, LILY_ENOMEM, "cannot start threads"); goto fail; }
    if ((rc = write_shards(&r, tmp, &p, st)) != LILY_OK) goto fail;
    if ((rc = write_index(tmp, &p, st)) != LILY_OK) goto fail;
    for (size_t i = 0; i < sizeof aux_files / sizeof *aux_files && rc == LILY_OK; i++) {
        char a[4200], b[4200];
        cv_fmt(a, sizeof a, "%s/%s", from, aux_files[i]);
        cv_fmt(b, sizeof b, "%s/%s", tmp, aux_files[i]);
        rc = copy_file(a, b, st);
    }
    if (rc == LILY_OK) rc = write_config(from, tmp, &p, &o, st);
    if (rc == LILY_OK) rc = verify(&r, tmp, &p, st);
    if (rc != LILY_OK) goto fail;
    if (unlink(marker) != 0 || rename(tmp, to) != 0) { rc = lily_err(st, LILY_EIO, "renaming %s to %s: %s", tmp, to, strerror(errno)); goto fail; }
    if ((fd = open(parent, O_RDONLY | O_DIRECTORY)) >= 0) { fsync(fd); close(fd); }
    report(&r, NULL, 1);
    if (res) {
        convert_qerr all = { 0 };
        for (int i = 0; i < p.n_items; i++) {
            const cv_item *it = &p.items[i];
            if (!it->bits) continue;
            res->n_quantized++;
            all.err2 += it->err.err2; all.ref2 += it->err.ref2;
            double e = it->err.ref2 > 0 ? sqrt(it->err.err2 / it->err.ref2) : 0;
            if (e > res->max_rel_err) { res->max_rel_err = e; cv_fmt(res->worst, sizeof res->worst, "%s", it->name); }
        }
        res->rel_err = all.ref2 > 0 ? sqrt(all.err2 / all.ref2) : 0;
        res->n_tensors = p.n_out_tensors;
        res->n_dropped = p.n_dropped;
        res->bytes_in = p.in_bytes;
        res->bytes_out = p.out_bytes;
        res->seconds = lily_now() - r.t0;
    }
    lily_pool_free(r.pool);
    cv_plan_free(&p);
    st_close(&set);
    return LILY_OK;
fail:
    rm_flat(tmp);
fail_nodir:
    lily_pool_free(r.pool);
    cv_plan_free(&p);
    st_close(&set);
    {
        char m[sizeof st->msg];
        cv_fmt(m, sizeof m, "%s", st ? st->msg : "");
        int full = strstr(m, "No space") || strstr(m, "File too large") || strstr(m, "Disk quota");
        lily_err(st, rc, "%s%s; nothing was written to %s", m, full ? " (the disk is full)" : "", to);
    }
    return rc;
}
