/* Progress lines on stderr for long commands (pull, convert): a redrawn line on a
 * terminal, otherwise a line every 10% or 30 s, so logs stay short. */
#ifndef LILY_CLI_PROGRESS_H
#define LILY_CLI_PROGRESS_H
#include <stdint.h>

typedef struct {
    const char *name;
    int tty, drawn;
    double last_t;      /* when the last line was printed (non-tty) */
    int last_decile;
    double verify_t0;   /* convert: when its verify phase began */
} cli_progress;

void cli_progress_init(cli_progress *p, const char *name);
/* done/total bytes, seconds elapsed, and a short description of the current item. */
void cli_progress_update(cli_progress *p, uint64_t done, uint64_t total, double elapsed,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* A line that must be seen (retry, warning): printed in both modes. */
void cli_progress_note(cli_progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cli_progress_end(cli_progress *p);
/* "1.23 GB" */
const char *cli_bytes(uint64_t b, char *buf, int n);
#endif
