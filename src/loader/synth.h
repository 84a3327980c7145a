/* Random-weight checkpoints of any size of the family, in the official (bf16) or the
 * MLX 4-bit layout, for tests, demos and benchmarks. Weights are drawn as the fixture
 * generator draws them (N(0, 1/sqrt(fan_in)) matrices, a sharper router, (1+w) norms
 * near one, decays in a realistic range), so activations stay well-conditioned through
 * every layer. Generation streams tensor by tensor: memory stays small at any size.
 * Matrices draw an approximate normal (Irwin-Hall sum of four uniforms, unit variance,
 * tails cut at +-3.46 sigma) for speed; vectors the exact one. Every row is seeded from
 * the tensor name and row index, so the bytes do not depend on the thread count, and
 * file writes overlap the generation of the next chunk. */
#ifndef LILY_SYNTH_H
#define LILY_SYNTH_H
#include <stdint.h>
#include "lily.h"
#include "loader/config.h"

typedef struct {
    lily_config cfg;      /* shapes; cfg_* derived sizes must be consistent */
    int mlx4;             /* 1: MLX affine 4-bit (8-bit router), 0: official bf16 layout */
    uint64_t seed;
    uint64_t shard_bytes; /* 0 = 4 GB */
    int eos[2];           /* <|im_end|> and <|endoftext|> ids; 0,0 = Qwen3.6's 248046, 248044 */
    int n_threads;        /* 0 = all cores; the files are the same for any count */
    void (*progress)(void *user, uint64_t done, uint64_t total);
    void *progress_user;
} synth_opts;

/* Fills cfg with a preset: "35b-a3b" (the released shape) or "tiny" (the fixtures' shape). */
lily_code synth_preset(const char *name, lily_config *cfg, lily_status *st);
/* Writes config.json, generation_config.json and the shards into dir (created). */
lily_code synth_write(const char *dir, const synth_opts *o, lily_status *st);
#endif
