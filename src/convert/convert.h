/* convert: official-layout checkpoints -> the MLX affine low-bit layout lily runs,
 * the quantizer behind it, and `lily info`'s description of a checkpoint.
 *
 * Contract
 * - Quantization is MLX "affine": per group of `group` consecutive elements of a row,
 *   w ~ scale * q + bias with q in [0, 2^bits - 1], scale and bias stored as bf16,
 *   codes packed little-endian into uint32 words (element j of a word in bits
 *   [j*bits, (j+1)*bits)). bits is 2, 4 or 8; group is 32, 64 or 128.
 * - CONVERT_QUANT_MINMAX reproduces MLX's (and make_fixture.py's) min/max quantizer bit
 *   for bit, float32 arithmetic and bf16 rounding included. CONVERT_QUANT_SEARCH starts
 *   from that answer and searches each group's scale and offset for a smaller squared
 *   error; it never returns a group worse than min/max.
 * - convert_run streams: it holds one tensor's output (or one row block of it) in
 *   memory at a time, writes into a temporary folder beside the target and renames
 *   it into place only after re-opening and checking every tensor. On any failure
 *   the temporary folder is removed and the target is untouched.
 * - Nothing here prints; progress goes through the caller's callback.
 */
#ifndef LILY_CONVERT_H
#define LILY_CONVERT_H
#include <stddef.h>
#include <stdint.h>
#include "lily.h"
#include "loader/config.h"
#include "loader/safetensors.h"

/* ---- quantizer ------------------------------------------------------------ */

typedef enum { CONVERT_QUANT_MINMAX = 0, CONVERT_QUANT_SEARCH } convert_quant_method;

/* Sums over quantized elements: squared error and squared weight (relative error is
 * sqrt(err2 / ref2)), plus the largest absolute error. */
typedef struct { double err2, ref2, max_abs; } convert_qerr;

/* Is (bits, group) a combination the quantizer and packing support? */
int convert_quant_valid(int bits, int group);

/* Quantizes `rows` rows of `cols` floats (cols % group == 0). Writes rows*cols*bits/32
 * code words, rows*cols/group scales and biases (bf16 bits). `err` (may be NULL)
 * accumulates the error of the dequantized weights (added to, not reset). */
void convert_quantize(const float *w, size_t rows, size_t cols, int bits, int group,
                      convert_quant_method method, uint32_t *codes, uint16_t *scales,
                      uint16_t *biases, convert_qerr *err);

/* The inverse: dequantizes into `out` [rows][cols] (float32, scale*q+bias). */
void convert_dequantize(const uint32_t *codes, const uint16_t *scales, const uint16_t *biases,
                        size_t rows, size_t cols, int bits, int group, float *out);

/* ---- conversion ----------------------------------------------------------- */

typedef struct convert_progress {
    int tensors_done, tensors_total;
    uint64_t bytes_in_done, bytes_in_total;   /* source bytes read */
    uint64_t bytes_out_done;                  /* output bytes written (verify: checked) */
    uint64_t bytes_out_total;
    double elapsed;                           /* seconds since start */
    const char *phase;                        /* "convert", "verify" */
    const char *current;                      /* tensor being processed */
} convert_progress;

typedef struct {
    int bits;                     /* 4 (default) */
    int group;                    /* 64 (default) */
    convert_quant_method method;  /* MINMAX (default) */
    int n_threads;                /* 0 = all cores */
    uint64_t shard_bytes;         /* largest output shard; 0 = 5 GB */
    /* Optional progress: called after each tensor (and within large ones). */
    void (*progress)(void *user, const struct convert_progress *p);
    void *progress_user;
    /* Optional per-tensor report: name of the output weight and its relative error. */
    void (*tensor_done)(void *user, const char *name, int bits, double rel_err);
    void *tensor_user;
    volatile int *cancel;         /* when set and nonzero, stop (LILY_ECANCELED) */
} convert_opts;

typedef struct {
    int n_tensors;          /* output tensors written */
    int n_quantized;        /* output matrices quantized */
    int n_dropped;          /* source tensors left out (vision tower, MTP head) */
    uint64_t bytes_in;      /* source bytes of the kept tensors */
    uint64_t bytes_out;     /* output bytes of tensor data */
    double rel_err;         /* sqrt(sum err^2 / sum w^2) over all quantized weights */
    double max_rel_err;     /* worst tensor's relative error */
    char worst[256];        /* which one */
    double seconds;
} convert_result;

void convert_opts_default(convert_opts *o);

/* Converts the checkpoint folder `from` into `to` (which must not exist). */
lily_code convert_run(const char *from, const char *to, const convert_opts *o,
                      convert_result *res, lily_status *st);

/* Upper bound of the bytes convert_run will write for `from` (tensor data, headers,
 * copied files), used for the free-space check. */
lily_code convert_output_estimate(const char *from, const convert_opts *o, uint64_t *bytes,
                                  lily_status *st);

/* ---- info ------------------------------------------------------------------- */

/* What a model needs in memory for one session of `ctx_len` tokens. */
typedef struct {
    uint64_t weights;      /* tensor bytes as stored (text model) */
    uint64_t kv_cache;     /* n_full_attn x kv_heads x head_dim x 2 (K,V) x ctx x kv_bytes */
    uint64_t deltanet;     /* linear-attention layers: f32 recurrent state nv x dk x dv, f32 conv state */
    uint64_t total;
} convert_memory;

/* The arithmetic from the config alone; weight_bytes is passed in. kv_bytes: bytes per
 * cached K/V element (2 for bf16/f16, 4 for f32). */
void convert_memory_estimate(const lily_config *c, uint64_t weight_bytes, int ctx_len, int kv_bytes,
                             convert_memory *out);

/* What a checkpoint folder holds. */
typedef struct {
    lily_config cfg;
    char model_type[64];
    char layout[32];            /* "hf", "hf-per-expert", "mlx" */
    int bits, group;            /* quantized: default bits and group; 0 otherwise */
    int n_bits8;                /* quantized matrices at 8 bits (router and shared-expert gate) */
    int n_tensors, n_other;     /* text-model tensors; vision/MTP/unknown tensors */
    uint64_t n_params;          /* text-model parameters (quantized: elements the codes stand for) */
    uint64_t bytes, other_bytes;
    int dtype_count[ST_NDTYPES];
    uint64_t dtype_bytes[ST_NDTYPES];
    int loads;                  /* does lily's loader accept it? */
    char load_error[512];
} convert_info;

lily_code convert_info_read(const char *dir, convert_info *out, lily_status *st);

#endif
