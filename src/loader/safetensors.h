/* safetensors reading (mmap, never a full copy) and streaming writing.
 *
 * A st_set is one checkpoint: a single *.safetensors file, or shards listed by
 * model.safetensors.index.json. Every header is checked against its file: offsets
 * inside the data area, sizes equal to dtype size x shape, no overflow. Tensor data
 * pointers stay valid until st_close. */
#ifndef LILY_SAFETENSORS_H
#define LILY_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>
#include "lily.h"

typedef enum {
    ST_F32, ST_F16, ST_BF16, ST_F64, ST_U32, ST_I32, ST_U8, ST_I8, ST_U16, ST_I16,
    ST_I64, ST_U64, ST_BOOL, ST_F8_E4M3, ST_F8_E5M2, ST_NDTYPES
} st_dtype;

#define ST_MAX_DIMS 8
typedef struct {
    char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;  /* into the mmapped file */
    size_t nbytes;
    int file;          /* index into st_set.files */
    int used;          /* set by the model loader to find unexpected tensors */
} st_tensor;

typedef struct {
    char *path;
    void *map;
    size_t size;
} st_file;

typedef struct {
    st_file *files;
    int n_files;
    st_tensor *tensors; /* sorted by name */
    int n_tensors;
} st_set;

const char *st_dtype_name(st_dtype t);
size_t st_dtype_size(st_dtype t);
int st_dtype_from_name(const char *s); /* -1 when unknown */

/* Parses one file's header from memory (the whole file in buf[0..len)). Appends tensors
 * to *out (realloc'd, *n updated) with data pointing into buf. `fname` names errors. */
lily_code st_parse(const uint8_t *buf, size_t len, const char *fname, int file_index,
                   st_tensor **out, int *n, lily_status *st);

/* Opens a checkpoint folder (or a single .safetensors file). */
lily_code st_open(const char *path, st_set *set, lily_status *st);
void st_close(st_set *set);
const st_tensor *st_find(const st_set *set, const char *name);
const char *st_file_of(const st_set *set, const st_tensor *t);
int64_t st_numel(const st_tensor *t);

/* Streaming writer: declare every tensor, then write their bytes in declaration order. */
typedef struct st_writer st_writer;
lily_code st_writer_open(const char *path, st_writer **w, lily_status *st);
lily_code st_writer_declare(st_writer *w, const char *name, st_dtype dt, int ndim,
                            const int64_t *shape, lily_status *st);
/* Writes the header; after it, st_writer_write may be called in declaration order. */
lily_code st_writer_begin_data(st_writer *w, const char *metadata_format, lily_status *st);
/* Appends bytes of the current tensor; a tensor may be written in several pieces. */
lily_code st_writer_write(st_writer *w, const void *data, size_t n, lily_status *st);
/* Checks every declared byte was written, flushes, fsyncs and closes. */
lily_code st_writer_close(st_writer *w, lily_status *st);
void st_writer_abort(st_writer *w); /* closes and removes the file */
#endif
