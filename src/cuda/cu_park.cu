/* Parking's GPU tier (engine/park.c): a conversation's state copied into device memory of its
 * own, device to device, in the device's layout (the fp16 cache rows as they are). A slot swap
 * then costs a copy at the GPU's bandwidth (~0.1 ms for the 35B-A3B's ~130 MB of state and one
 * snapshot) where the host tier pays for fresh host pages (35-120 ms for the same bytes,
 * bench/RESULTS.md session 36), and every other stream waits that long. The model keeps a byte
 * budget for the tier; past it lcuda_park answers LILY_ENOMEM and the caller parks on the host. */
#include "cuda/cu_model.h"
#include <stdlib.h>
#include <string.h>

struct lcuda_parked {
    const lcuda_model *m;
    int n, n_snap;
    size_t row;        /* fp16 values a cache row: n_kv_heads * head_dim */
    size_t cb, sb;     /* bytes of conv and of S over all linear layers */
    uint64_t bytes;
    char *d;           /* [n_full][2][n][row] fp16 | conv | S | n_snap x (conv | S) */
};

static size_t kv_bytes(const lcuda_parked *p, int n_full) { return (size_t)n_full * 2 * p->n * p->row * sizeof(uint16_t); }

void lcuda_park_limit(lcuda_model *m, uint64_t bytes) { m->park_limit = bytes; }
uint64_t lcuda_park_used(const lcuda_model *m) { return __atomic_load_n(&m->park_used, __ATOMIC_RELAXED); }

uint64_t lcuda_mem_free(void) {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) { cudaGetLastError(); return 0; }
    return fr;
}

uint64_t lcuda_parked_bytes(const lcuda_parked *p) { return p ? p->bytes : 0; }
const lily_config *lcuda_parked_config(const lcuda_parked *p) { return &p->m->cfg; }

void lcuda_parked_free(lcuda_parked *p) {
    if (!p) return;
    cudaFree(p->d);
    __atomic_fetch_sub(&((lcuda_model *)p->m)->park_used, p->bytes, __ATOMIC_RELAXED);
    free(p);
}

/* One segment of the walk below: b bytes between the session's buffer and *d, which advances. */
static cudaError_t pk_seg(lcuda_session *s, char **d, void *sess, size_t b, int to_parked) {
    cudaError_t e = b ? cudaMemcpyAsync(to_parked ? (void *)*d : sess, to_parked ? (const void *)sess : *d, b,
                                        cudaMemcpyDeviceToDevice, s->st)
                      : cudaSuccess;
    *d += b;
    return e;
}

/* The one walk of p's layout, both ways: the session's cache rows below p->n, conv, S and its
 * snapshot slots slots[j] into p (to_parked) or back; done before returning, since another
 * session's stream may read p next. */
static lily_code pk_copy(lcuda_session *s, const lcuda_parked *p, const int *slots, int to_parked, lily_status *st) {
    char *d = p->d;
    const size_t nb = (size_t)p->n * p->row * sizeof(uint16_t);
    for (int l = 0; l < s->n_full; l++) {
        LCU_CHECK(pk_seg(s, &d, s->kc + (size_t)l * s->kv_n, nb, to_parked));
        LCU_CHECK(pk_seg(s, &d, s->vc + (size_t)l * s->kv_n, nb, to_parked));
    }
    LCU_CHECK(pk_seg(s, &d, s->conv, p->cb, to_parked));
    LCU_CHECK(pk_seg(s, &d, s->S, p->sb, to_parked));
    for (int j = 0; j < p->n_snap; j++) {
        LCU_CHECK(pk_seg(s, &d, s->snap_conv[slots[j]], p->cb, to_parked));
        LCU_CHECK(pk_seg(s, &d, s->snap_S[slots[j]], p->sb, to_parked));
    }
    LCU_CHECK(cudaStreamSynchronize(s->st));
    return LILY_OK;
}

lily_code lcuda_park(lcuda_session *s, int n, const int *snaps, int n_snaps, lcuda_parked **out, lily_status *st) {
    *out = NULL;
    lcuda_model *m = s->m;
    if (!m->park_limit) return lily_err(st, LILY_EUNSUPPORTED, "no GPU parking budget");
    if (n < 1 || n > m->max_ctx || n_snaps < 0 || n_snaps > LCU_SNAPSHOTS)
        return lily_err(st, LILY_EINVAL, "parking %d tokens and %d snapshots", n, n_snaps);
    for (int j = 0; j < n_snaps; j++)
        if (snaps[j] < 0 || snaps[j] >= LCU_SNAPSHOTS || !s->snap_conv[snaps[j]])
            return lily_err(st, LILY_EINVAL, "no snapshot in slot %d", snaps[j]);
    lcuda_parked *p = (lcuda_parked *)calloc(1, sizeof *p);
    if (!p) return lily_err(st, LILY_ENOMEM, "out of memory");
    p->m = m;
    p->n = n;
    p->n_snap = n_snaps;
    p->row = s->kv_n / (size_t)m->max_ctx;
    p->cb = s->n_lin * s->conv_n * sizeof(float);
    p->sb = s->n_lin * s->S_n * sizeof(float);
    p->bytes = kv_bytes(p, s->n_full) + (size_t)(1 + n_snaps) * (p->cb + p->sb);
    /* the budget is taken before the allocation, so two parks cannot both pass the check */
    uint64_t was = __atomic_fetch_add(&m->park_used, p->bytes, __ATOMIC_RELAXED);
    if (was + p->bytes > m->park_limit) {
        __atomic_fetch_sub(&m->park_used, p->bytes, __ATOMIC_RELAXED);
        free(p);
        return lily_err(st, LILY_ENOMEM, "the GPU's parking budget (%.1f MB) is full", m->park_limit / 1048576.0);
    }
    if (cudaMalloc((void **)&p->d, p->bytes) != cudaSuccess) {
        cudaGetLastError();
        p->d = NULL;
        const double mb = p->bytes / 1048576.0;
        lcuda_parked_free(p);
        return lily_err(st, LILY_ENOMEM, "GPU out of memory for a parked conversation (%.1f MB)", mb);
    }
    lily_code rc = pk_copy(s, p, snaps, 1, st);
    if (rc) { lcuda_parked_free(p); return rc; }
    *out = p;
    return LILY_OK;
}

lily_code lcuda_unpark(lcuda_session *s, const lcuda_parked *p, lily_status *st) {
    if (p->m != s->m) return lily_err(st, LILY_EINVAL, "the conversation was parked on another model's GPU");
    int slots[LCU_SNAPSHOTS];
    for (int j = 0; j < p->n_snap; j++) {
        lily_code rc = cu_snap_alloc(s, j, st);
        if (rc) return rc;
        slots[j] = j;
    }
    return pk_copy(s, p, slots, 0, st);
}

lily_code lcuda_parked_read(const lcuda_parked *p, float *kv, float *conv, float *S, float *const *snap_conv,
                            float *const *snap_S, lily_status *st) {
    const int n_full = cfg_n_full(&p->m->cfg);
    const size_t nv = 2 * (size_t)n_full * p->n * p->row; /* fp16 values, in kv's order already */
    uint16_t *h = nv ? (uint16_t *)lily_big_alloc(nv * sizeof(uint16_t)) : NULL;
    if (nv && !h) return lily_err(st, LILY_ENOMEM, "out of memory reading a parked conversation");
    const char *d = p->d;
    cudaError_t e = nv ? cudaMemcpy(h, d, nv * sizeof(uint16_t), cudaMemcpyDeviceToHost) : cudaSuccess;
    d += nv * sizeof(uint16_t);
    if (e == cudaSuccess && p->cb) e = cudaMemcpy(conv, d, p->cb, cudaMemcpyDeviceToHost);
    d += p->cb;
    if (e == cudaSuccess && p->sb) e = cudaMemcpy(S, d, p->sb, cudaMemcpyDeviceToHost);
    d += p->sb;
    for (int j = 0; j < p->n_snap && e == cudaSuccess; j++) {
        if (p->cb) e = cudaMemcpy(snap_conv[j], d, p->cb, cudaMemcpyDeviceToHost);
        d += p->cb;
        if (e == cudaSuccess && p->sb) e = cudaMemcpy(snap_S[j], d, p->sb, cudaMemcpyDeviceToHost);
        d += p->sb;
    }
    if (e != cudaSuccess) {
        lily_big_free(h);
        return cu_fail(st, e, "reading a parked conversation", __FILE__, __LINE__);
    }
    for (size_t i = 0; i < nv; i++) kv[i] = cu_kv_h2f(h[i]);
    lily_big_free(h);
    return LILY_OK;
}
