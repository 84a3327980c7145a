/* The model's weights bound to names, shapes and types, for every backend.
 *
 * Matrices keep the checkpoint's storage (bf16/f16/f32, or MLX affine 4/8-bit codes
 * with per-group scales and biases) and point into the mmapped files; only the small
 * vectors (norms, conv, A_log, dt_bias) are converted to float32 at load, with the
 * (1+w) shift applied where the layout stores w. Three layouts are read: the official
 * release (fused experts), the older one-tensor-per-expert layout, and MLX 4-bit. */
#ifndef LILY_WEIGHTS_H
#define LILY_WEIGHTS_H
#include <stdint.h>
#include "loader/config.h"
#include "loader/safetensors.h"

typedef enum { LW_F32, LW_BF16, LW_F16, LW_Q } lw_type;

/* A [rows][cols] matrix, y = W x multiplies by rows (PyTorch Linear: [out][in]). */
typedef struct {
    lw_type type;
    int rows, cols;
    const void *w;        /* F32/BF16/F16: [rows][cols]; Q: uint32 [rows][cols*bits/32], code j of a word in bits j*bits.. */
    const void *scales;   /* Q: [rows][cols/group] of sb_type */
    const void *biases;   /* Q: [rows][cols/group] of sb_type; w = scale * code + bias */
    lw_type sb_type;      /* LW_BF16, LW_F16 or LW_F32 */
    int bits, group;
} lw_mat;

typedef struct {
    int full_attn;
    float *ln1, *ln2;          /* [H], 1+w */
    /* Gated DeltaNet */
    lw_mat qkv;                /* [2*nk*dk + nv*dv][H]: q | k | v blocks, head-major */
    lw_mat z;                  /* [nv*dv][H] */
    lw_mat b, a;               /* [nv][H] */
    lw_mat out;                /* [H][nv*dv] */
    float *conv_w;             /* [conv_dim][K]; tap K-1 multiplies the current token */
    float *A_log, *dt_bias;    /* [nv] */
    float *gnorm;              /* [dv], used as is (no +1) */
    /* gated attention */
    lw_mat q;                  /* [nh*2*hd][H]: per head hd query rows, then hd gate rows */
    lw_mat k, v;               /* [nkv*hd][H] */
    lw_mat o;                  /* [H][nh*hd] */
    float *q_norm, *k_norm;    /* [hd], 1+w */
    /* MoE */
    lw_mat router;             /* [E][H] */
    lw_mat *gate, *up, *down;  /* E each: [I][H], [I][H], [H][I] */
    lw_mat sh_gate, sh_up;     /* [SI][H] */
    lw_mat sh_down;            /* [H][SI] */
    lw_mat sh_router;          /* [1][H] */
} lily_layer;

typedef struct {
    lily_config cfg;
    st_set files;
    lw_mat embed;              /* [V][H] */
    lw_mat lm_head;            /* [V][H] */
    float *norm;               /* [H], 1+w */
    lily_layer *layers;        /* [n_layers] */
    const char *layout;        /* "hf", "hf-per-expert", "mlx" */
    uint64_t n_params;
    uint64_t weight_bytes;
} lily_weights;

lily_code lw_load(const char *dir, lily_weights *w, lily_status *st);
void lw_free(lily_weights *w);

/* Row r of W as float32 (cols values). */
void lw_row_f32(const lw_mat *m, int r, float *out);
static inline uint64_t lw_bytes(const lw_mat *m) {
    if (m->type == LW_Q) return (uint64_t)m->rows * m->cols * m->bits / 8 + 2ull * m->rows * (m->cols / m->group) * (m->sb_type == LW_F32 ? 4 : 2);
    return (uint64_t)m->rows * m->cols * (m->type == LW_F32 ? 4 : 2);
}
#endif
