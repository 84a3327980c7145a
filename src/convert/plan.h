/* Internal to convert/: the list of output tensors and where their rows come from.
 * plan.c builds it from the source names (either expert layout); run.c executes it. */
#ifndef LILY_CONVERT_PLAN_H
#define LILY_CONVERT_PLAN_H
#include "convert/convert.h"
#include "loader/safetensors.h"

/* A run of consecutive rows (of `cols` elements) of a source tensor. */
typedef struct {
    const st_tensor *src;
    int64_t row0, nrows;
} cv_slab;

typedef struct {
    char name[256];        /* quantized: base name (X of X.weight/.scales/.biases); float: full name */
    int bits, group;       /* 0 bits: kept in float */
    int ndim;
    int64_t shape[4];      /* logical (float) output shape; quantized: rows = prod(shape[0..ndim-2]) */
    int64_t rows, cols;
    cv_slab *slabs;
    int n_slabs;
    st_dtype out_dt;       /* float items: BF16 or F32 */
    int plus_one;          /* (1+w) norms stored shifted */
    int shard;             /* output file index */
    uint64_t in_bytes, out_bytes;
    uint64_t hash[3];      /* of each written tensor (weight, scales, biases) */
    convert_qerr err;
} cv_item;

typedef struct {
    cv_item *items;        /* sorted by name */
    int n_items;
    int n_out_tensors;
    int n_dropped;
    uint64_t in_bytes, out_bytes;
    int n_shards;
} cv_plan;

/* Builds the plan; `set` must outlive it. n_experts: from the config (per-expert layout). */
lily_code cv_plan_build(const st_set *set, int n_experts, int bits, int group, uint64_t shard_bytes,
                        cv_plan *p, lily_status *st);
void cv_plan_free(cv_plan *p);

/* Output tensor k (0..2) of an item: name, dtype, shape; returns the count (1 or 3). */
int cv_item_tensor(const cv_item *it, int k, char *name, size_t n, st_dtype *dt, int *ndim, int64_t *shape,
                   uint64_t *bytes);

/* 64-bit running hash of written bytes, for the read-back check. */
uint64_t cv_hash(uint64_t h, const void *p, size_t n);
/* snprintf that reports truncation by its return value (names are bounded far below). */
int cv_fmt(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define CV_HASH_INIT 0x9e3779b97f4a7c15ull
#endif
