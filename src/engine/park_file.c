/* Parked conversations on disk (lily_parked_save / lily_parked_load), so a server's
 * conversations survive a restart.
 *
 * Format, version 1, little-endian (the host's order; the magic would not match on a
 * big-endian host's file anyway):
 *   "LILYPARK"  u32 version  u32 0  u8 fingerprint[32]
 *   i32 n  i32 n_snap  i32 snap_pos[LILY_SNAPSHOTS]  u64 payload bytes
 *   payload: tokens i32[n], kv f32[n_full][2][n][nkv*hd], conv, S, then conv, S of each snapshot
 *   u8 sha256[32] of everything before it
 * Every size in the payload follows from n, n_snap and the model's shape, so a reader checks
 * the file's size against them before allocating anything. The fingerprint is a SHA-256 of
 * a text naming every config field that shapes the state or changes what it means, plus the
 * weights' identity (layout; each safetensors file's size and 4 KiB of its data): a file
 * from another model is refused as such instead of restoring garbage. */
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "engine/engine.h"

#define PF_MAGIC "LILYPARK"
#define PF_VERSION 1u
#define PF_HEADER (8 + 4 + 4 + 32 + 4 + 4 + 4 * LILY_SNAPSHOTS + 8)

typedef struct {
    size_t row, nf, nc, ns; /* kv row floats, attention layers, conv floats, DeltaNet floats */
} pf_shape;

static pf_shape shape_of(const lily_config *c) {
    pf_shape s;
    s.row = (size_t)c->n_kv_heads * c->head_dim;
    s.nf = (size_t)cfg_n_full(c);
    s.nc = (size_t)(c->n_layers - cfg_n_full(c)) * cfg_conv_dim(c) * (c->conv_k - 1);
    s.ns = (size_t)(c->n_layers - cfg_n_full(c)) * c->lin_nv * c->lin_dk * c->lin_dv;
    return s;
}

/* The weights' identity, cheaply: each file's size, 4 KiB from its middle and 4 KiB from its end
 * (tensor data: a checkpoint of the same shape with other weights differs there), read
 * from the mapping the loader already holds. */
static void weights_digest(const lily_model *m, char hex[65]) {
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned char d[32] = { 0 };
    unsigned int len = 0;
    if (md && EVP_DigestInit_ex(md, EVP_sha256(), NULL)) {
        for (int i = 0; i < m->w.files.n_files; i++) {
            const st_file *f = &m->w.files.files[i];
            uint64_t size = f->size;
            EVP_DigestUpdate(md, &size, sizeof size);
            if (!f->map) continue;
            size_t k = f->size < 4096 ? f->size : 4096;
            EVP_DigestUpdate(md, (const char *)f->map + (f->size - k) / 2, k);
            EVP_DigestUpdate(md, (const char *)f->map + f->size - k, k);
        }
        EVP_DigestFinal_ex(md, d, &len);
    }
    EVP_MD_CTX_free(md);
    for (int i = 0; i < 32; i++) sprintf(hex + 2 * i, "%02x", d[i]);
}

static void fingerprint(const lily_model *m, unsigned char out[32]) {
    const lily_config *c = &m->w.cfg;
    char full[LILY_MAX_LAYERS + 1], txt[1024], wd[65];
    for (int i = 0; i < c->n_layers && i < LILY_MAX_LAYERS; i++) full[i] = c->full_attn[i] ? '1' : '0';
    full[c->n_layers < LILY_MAX_LAYERS ? c->n_layers : LILY_MAX_LAYERS] = 0;
    weights_digest(m, wd);
    int n = snprintf(txt, sizeof txt,
                     "layers=%d full=%s hidden=%d vocab=%d heads=%d kv=%d hd=%d rot=%d theta=%.17g bf16freq=%d gate=%d "
                     "lin=%d,%d,%d,%d convk=%d moe=%d,%d,%d,%d eps=%.17g tie=%d q=%d,%d layout=%s files=%d weights=%s",
                     c->n_layers, full, c->hidden, c->vocab, c->n_heads, c->n_kv_heads, c->head_dim, c->rot_dim,
                     c->rope_theta, c->rope_bf16_freq, c->attn_output_gate, c->lin_nk, c->lin_nv, c->lin_dk, c->lin_dv,
                     c->conv_k, c->n_experts, c->top_k, c->moe_inter, c->shared_inter, c->eps, c->tie_embeddings,
                     c->q_bits, c->q_group, m->w.layout ? m->w.layout : "", m->w.files.n_files, wd);
    unsigned int len = 0;
    EVP_Digest(txt, (size_t)(n < (int)sizeof txt ? n : (int)sizeof txt - 1), out, &len, EVP_sha256(), NULL);
}

/* Payload bytes for n tokens and n_snap snapshots; 0 on overflow. */
static uint64_t payload_bytes(const pf_shape *s, int n, int n_snap) {
    uint64_t kv, state, snaps, total;
    if (__builtin_mul_overflow((uint64_t)s->nf * 2 * s->row, (uint64_t)n, &kv) ||
        __builtin_add_overflow((uint64_t)s->nc, (uint64_t)s->ns, &state) ||
        __builtin_mul_overflow(state, (uint64_t)(1 + n_snap), &snaps) ||
        __builtin_add_overflow(kv, snaps, &total) || __builtin_mul_overflow(total, (uint64_t)4, &total) ||
        __builtin_add_overflow(total, (uint64_t)n * 4, &total))
        return 0;
    return total;
}

/* ---- writing ---- */

typedef struct {
    FILE *f;
    EVP_MD_CTX *md;
    int err; /* errno of the first failure */
} pf_out;

static void put(pf_out *o, const void *p, size_t n) {
    if (o->err || !n) return;
    EVP_DigestUpdate(o->md, p, n);
    if (fwrite(p, 1, n, o->f) != n) o->err = errno ? errno : EIO;
}

static lily_code save_host(const lily_parked *p, const lily_model *m, const char *path, lily_status *st);

lily_code lily_parked_save(const lily_parked *p, const lily_model *m, const char *path, lily_status *st) {
    if (!p || !m || !path || !*path) return lily_err(st, LILY_EINVAL, "lily_parked_save: missing argument");
    if (!p->dev) return save_host(p, m, path, st);
    lily_parked h; /* the GPU tier's state through a host copy; p stays where it is */
    lily_code rc = park_host_form(p, &h, st);
    if (rc) return rc;
    rc = save_host(&h, m, path, st);
    park_host_form_free(&h);
    return rc;
}

static lily_code save_host(const lily_parked *p, const lily_model *m, const char *path, lily_status *st) {
    const pf_shape sh = shape_of(&m->w.cfg);
    uint64_t pay = payload_bytes(&sh, p->n, p->n_snap);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) return lily_err(st, LILY_ENOMEM, "out of memory");
    snprintf(tmp, plen + 16, "%s.tmp-XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        lily_code rc = lily_err(st, LILY_EIO, "cannot write '%s': cannot create a temporary file beside it: %s", path,
                                strerror(errno));
        free(tmp);
        return rc;
    }
    pf_out o = { fdopen(fd, "wb"), EVP_MD_CTX_new(), 0 };
    if (!o.f || !o.md) o.err = ENOMEM;
    else EVP_DigestInit_ex(o.md, EVP_sha256(), NULL);

    unsigned char fp[32], hdr[PF_HEADER], *h = hdr;
    fingerprint(m, fp);
    uint32_t ver = PF_VERSION, zero = 0;
    int32_t n = p->n, ns = p->n_snap, pos[LILY_SNAPSHOTS] = { 0 };
    for (int i = 0; i < p->n_snap; i++) pos[i] = p->snap_pos[i];
    memcpy(h, PF_MAGIC, 8); h += 8;
    memcpy(h, &ver, 4); h += 4;
    memcpy(h, &zero, 4); h += 4;
    memcpy(h, fp, 32); h += 32;
    memcpy(h, &n, 4); h += 4;
    memcpy(h, &ns, 4); h += 4;
    memcpy(h, pos, sizeof pos); h += sizeof pos;
    memcpy(h, &pay, 8);
    put(&o, hdr, sizeof hdr);
    put(&o, p->tokens, (size_t)p->n * 4);
    put(&o, p->kv, sh.nf * 2 * (size_t)p->n * sh.row * 4);
    put(&o, p->conv, sh.nc * 4);
    put(&o, p->S, sh.ns * 4);
    for (int i = 0; i < p->n_snap; i++) {
        put(&o, p->snap_conv[i], sh.nc * 4);
        put(&o, p->snap_S[i], sh.ns * 4);
    }
    if (!o.err) {
        unsigned char sum[32];
        unsigned int len = 0;
        EVP_DigestFinal_ex(o.md, sum, &len);
        if (fwrite(sum, 1, 32, o.f) != 32) o.err = errno ? errno : EIO;
    }
    if (!o.err && fflush(o.f)) o.err = errno ? errno : EIO;
    if (!o.err && fsync(fileno(o.f))) o.err = errno ? errno : EIO;
    if (o.f) { if (fclose(o.f) && !o.err) o.err = errno ? errno : EIO; }
    else close(fd);
    EVP_MD_CTX_free(o.md);
    if (!o.err && rename(tmp, path)) o.err = errno ? errno : EIO;
    lily_code rc = LILY_OK;
    if (!o.err) { /* make the rename itself durable; a folder that cannot be synced is no error */
        char *slash = strrchr(tmp, '/');
        if (slash) slash[1] = 0;
        int dfd = open(slash ? tmp : ".", O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) { fsync(dfd); close(dfd); }
    }
    if (o.err) {
        unlink(tmp);
        rc = lily_err(st, LILY_EIO, "cannot write '%s': %s (nothing was left behind)", path, strerror(o.err));
    }
    free(tmp);
    return rc;
}

/* ---- reading ---- */

typedef struct {
    FILE *f;
    EVP_MD_CTX *md;
    const char *name;
    lily_status *st;
} pf_in;

static lily_code get(pf_in *in, void *p, size_t n) {
    if (!n) return LILY_OK;
    if (fread(p, 1, n, in->f) != n)
        return ferror(in->f) ? lily_err(in->st, LILY_EIO, "cannot read '%s': %s", in->name, strerror(errno))
                             : lily_err(in->st, LILY_EFORMAT, "'%s' is truncated", in->name);
    EVP_DigestUpdate(in->md, p, n);
    return LILY_OK;
}

lily_code park_file_read(FILE *f, uint64_t size, const char *name, const lily_model *m, lily_parked **out,
                         lily_status *st) {
    *out = NULL;
    const lily_config *c = &m->w.cfg;
    const pf_shape sh = shape_of(c);
    unsigned char hdr[PF_HEADER], fp[32];
    if (size < PF_HEADER + 32) return lily_err(st, LILY_EFORMAT, "'%s' is not a parked conversation: %llu bytes is too short",
                                               name, (unsigned long long)size);
    pf_in in = { f, EVP_MD_CTX_new(), name, st };
    if (!in.md) return lily_err(st, LILY_ENOMEM, "out of memory");
    EVP_DigestInit_ex(in.md, EVP_sha256(), NULL);
    lily_parked *p = NULL;
    lily_code rc = get(&in, hdr, sizeof hdr);
    if (rc) goto done;
    uint32_t ver;
    int32_t n, ns, pos[LILY_SNAPSHOTS];
    uint64_t pay;
    const unsigned char *h = hdr + 8;
    memcpy(&ver, h, 4); h += 8;
    h += 32;
    memcpy(&n, h, 4); h += 4;
    memcpy(&ns, h, 4); h += 4;
    memcpy(pos, h, sizeof pos); h += sizeof pos;
    memcpy(&pay, h, 8);
    fingerprint(m, fp);
    if (memcmp(hdr, PF_MAGIC, 8)) { rc = lily_err(st, LILY_EFORMAT, "'%s' is not a parked conversation (wrong magic)", name); goto done; }
    if (ver != PF_VERSION) {
        rc = lily_err(st, LILY_EUNSUPPORTED, "'%s' has format version %u; this lily reads version %u", name, ver, PF_VERSION);
        goto done;
    }
    if (memcmp(hdr + 16, fp, 32)) {
        rc = lily_err(st, LILY_EUNSUPPORTED, "'%s' was parked from a model of another shape or other weights", name);
        goto done;
    }
    if (n < 1 || ns < 0 || ns > LILY_SNAPSHOTS) {
        rc = lily_err(st, LILY_EFORMAT, "'%s' is corrupted: %d tokens, %d snapshots", name, n, ns);
        goto done;
    }
    if (n > m->max_ctx) {
        rc = lily_err(st, LILY_ERANGE, "'%s' holds %d tokens, more than the context length %d", name, n, m->max_ctx);
        goto done;
    }
    for (int i = 0; i < LILY_SNAPSHOTS; i++)
        if (i < ns ? pos[i] < 1 || pos[i] >= n : pos[i] != 0) {
            rc = lily_err(st, LILY_EFORMAT, "'%s' is corrupted: snapshot %d at position %d of %d", name, i, pos[i], n);
            goto done;
        }
    uint64_t want = payload_bytes(&sh, n, ns);
    if (!want || pay != want) {
        rc = lily_err(st, LILY_EFORMAT, "'%s' is corrupted: the payload is %llu bytes, %llu expected", name,
                      (unsigned long long)pay, (unsigned long long)want);
        goto done;
    }
    if (size != PF_HEADER + want + 32) {
        rc = lily_err(st, LILY_EFORMAT, "'%s' is %s: %llu bytes, %llu expected", name, size < PF_HEADER + want + 32 ? "truncated" : "corrupted",
                      (unsigned long long)size, (unsigned long long)(PF_HEADER + want + 32));
        goto done;
    }
    /* every size is now backed by bytes in the file */
    if (!(p = calloc(1, sizeof *p))) goto oom;
    p->n = n;
    p->tokens = malloc((size_t)n * 4);
    p->kv = lily_big_alloc(sh.nf * 2 * (size_t)n * sh.row * 4 + 1);
    p->conv = lily_big_alloc(sh.nc * 4 + 1);
    p->S = lily_big_alloc(sh.ns * 4 + 1);
    if (!p->tokens || !p->kv || !p->conv || !p->S) goto oom;
    for (int i = 0; i < ns; i++) {
        p->snap_conv[i] = lily_big_alloc(sh.nc * 4 + 1);
        p->snap_S[i] = lily_big_alloc(sh.ns * 4 + 1);
        p->snap_pos[i] = pos[i];
        p->n_snap++;
        if (!p->snap_conv[i] || !p->snap_S[i]) goto oom;
    }
    if ((rc = get(&in, p->tokens, (size_t)n * 4)) || (rc = get(&in, p->kv, sh.nf * 2 * (size_t)n * sh.row * 4)) ||
        (rc = get(&in, p->conv, sh.nc * 4)) || (rc = get(&in, p->S, sh.ns * 4)))
        goto done;
    for (int i = 0; i < ns; i++)
        if ((rc = get(&in, p->snap_conv[i], sh.nc * 4)) || (rc = get(&in, p->snap_S[i], sh.ns * 4))) goto done;
    unsigned char sum[32], have[32];
    unsigned int len = 0;
    EVP_DigestFinal_ex(in.md, sum, &len);
    if (fread(have, 1, 32, f) != 32) { rc = lily_err(st, LILY_EFORMAT, "'%s' is truncated", name); goto done; }
    if (memcmp(sum, have, 32)) { rc = lily_err(st, LILY_EFORMAT, "'%s' is corrupted: the checksum does not match", name); goto done; }
    for (int i = 0; i < n; i++)
        if (p->tokens[i] < 0 || p->tokens[i] >= c->vocab) {
            rc = lily_err(st, LILY_EFORMAT, "'%s' is corrupted: token %d is %d, outside the vocabulary", name, i, p->tokens[i]);
            goto done;
        }
    p->bytes = sizeof *p + (size_t)want;
    *out = p;
    p = NULL;
    goto done;
oom:
    rc = lily_err(st, LILY_ENOMEM, "out of memory reading '%s'", name);
done:
    lily_parked_free(p);
    EVP_MD_CTX_free(in.md);
    return rc;
}

lily_code lily_parked_load(const lily_model *m, const char *path, lily_parked **out, lily_status *st) {
    *out = NULL;
    if (!m || !path) return lily_err(st, LILY_EINVAL, "lily_parked_load: missing argument");
    FILE *f = fopen(path, "rb");
    if (!f) return lily_err(st, LILY_EIO, "cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    lily_code rc;
    if (fstat(fileno(f), &sb) || !S_ISREG(sb.st_mode))
        rc = lily_err(st, LILY_EIO, "cannot read '%s': not a regular file", path);
    else
        rc = park_file_read(f, (uint64_t)sb.st_size, path, m, out, st);
    fclose(f);
    return rc;
}
