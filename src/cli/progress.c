#include "cli/progress.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void cli_progress_init(cli_progress *p, const char *name) {
    memset(p, 0, sizeof *p);
    p->name = name;
    p->tty = isatty(2);
    p->last_decile = -1;
}

const char *cli_bytes(uint64_t b, char *buf, int n) {
    if (b >= 1000000000ull) snprintf(buf, n, "%.2f GB", b / 1e9);
    else if (b >= 1000000ull) snprintf(buf, n, "%.1f MB", b / 1e6);
    else if (b >= 1000ull) snprintf(buf, n, "%.1f kB", b / 1e3);
    else snprintf(buf, n, "%llu B", (unsigned long long)b);
    return buf;
}

void cli_progress_update(cli_progress *p, uint64_t done, uint64_t total, double elapsed, const char *fmt, ...) {
    char what[160], d[32], t[32], r[32], eta[32] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    double rate = elapsed > 0.2 ? done / elapsed : 0;
    double pct = total ? 100.0 * done / total : 100.0;
    if (rate > 0 && total > done) {
        double left = (total - done) / rate;
        if (left >= 3600) snprintf(eta, sizeof eta, ", %dh%02dm left", (int)(left / 3600), (int)(left / 60) % 60);
        else snprintf(eta, sizeof eta, ", %dm%02ds left", (int)(left / 60), (int)left % 60);
    }
    cli_bytes(done, d, sizeof d); cli_bytes(total, t, sizeof t); cli_bytes((uint64_t)rate, r, sizeof r);
    if (p->tty) {
        fprintf(stderr, "\r\033[K%s: %5.1f%% %s / %s, %s/s%s  %s", p->name, pct, d, t, r, eta, what);
        p->drawn = 1;
    } else {
        int dec = (int)(pct / 10);
        if (dec == p->last_decile && elapsed - p->last_t < 30) return;
        p->last_decile = dec; p->last_t = elapsed;
        fprintf(stderr, "%s: %5.1f%% %s / %s, %s/s%s  %s\n", p->name, pct, d, t, r, eta, what);
    }
}

void cli_progress_note(cli_progress *p, const char *fmt, ...) {
    if (p->tty && p->drawn) { fputs("\r\033[K", stderr); p->drawn = 0; }
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", p->name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void cli_progress_end(cli_progress *p) {
    if (p->tty && p->drawn) fputc('\n', stderr);
    p->drawn = 0;
}
