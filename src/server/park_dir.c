/* Parked conversations in a folder (--cache-dir), so a restarted server resumes them
 * without recomputing their prefixes. Files are complete or absent (lily_parked_save
 * writes through a temporary file); this keeps the folder holding exactly the current set. */
#include <dirent.h>
#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "server/server.h"

#define EXT ".lpark"

static int ends_with(const char *s, const char *t) {
    size_t a = strlen(s), b = strlen(t);
    return a >= b && !strcmp(s + a - b, t);
}

/* a crashed save's temporary file: garbage by definition */
static int is_tmp(const char *name) { return strstr(name, EXT ".tmp-") != NULL; }

static void file_name(const lily_parked *p, char out[64]) {
    int n;
    const int32_t *t = lily_parked_tokens(p, &n);
    unsigned char md[32];
    unsigned int len = 0;
    EVP_Digest(t, (size_t)n * sizeof *t, md, &len, EVP_sha256(), NULL);
    for (int i = 0; i < 16; i++) sprintf(out + 2 * i, "%02x", md[i]);
    strcpy(out + 32, EXT);
}

int srv_park_dir_load(const char *dir, const lily_model *m, void (*add)(void *u, lily_parked *p, double age), void *u) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "lily-server: --cache-dir: cannot read '%s': %s\n", dir, strerror(errno));
        return 0;
    }
    int n = 0;
    char path[4096];
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.' || (!ends_with(e->d_name, EXT) && !is_tmp(e->d_name))) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (is_tmp(e->d_name)) { unlink(path); continue; }
        lily_parked *p = NULL;
        lily_status st = { 0 };
        lily_code rc = lily_parked_load(m, path, &p, &st);
        if (rc == LILY_EUNSUPPORTED) {
            fprintf(stderr, "lily-server: --cache-dir: %s; deleted it\n", st.msg);
            unlink(path);
            continue;
        }
        if (rc) {
            fprintf(stderr, "lily-server: --cache-dir: skipped a conversation: %s\n", st.msg);
            continue;
        }
        struct stat sb;
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        double age = !stat(path, &sb) ? (double)(now.tv_sec - sb.st_mtim.tv_sec) + (now.tv_nsec - sb.st_mtim.tv_nsec) * 1e-9 : 0;
        add(u, p, age > 0 ? age : 0);
        n++;
    }
    closedir(d);
    return n;
}

int srv_park_dir_save(const char *dir, const lily_model *m, lily_parked *const *ps, int n) {
    char (*names)[64] = calloc((size_t)n + 1, sizeof *names);
    if (!names) { fprintf(stderr, "lily-server: --cache-dir: out of memory\n"); return 0; }
    char path[4096];
    int saved = 0;
    /* the least recent first, so file times keep the order for the next start */
    for (int i = n - 1; i >= 0; i--) {
        file_name(ps[i], names[i]);
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        lily_status st = { 0 };
        if (lily_parked_save(ps[i], m, path, &st)) {
            fprintf(stderr, "lily-server: --cache-dir: %s\n", st.msg);
            names[i][0] = 0;
        } else {
            saved++;
        }
    }
    /* conversations no longer parked (resumed and saved under their new tokens, evicted,
     * unreadable) leave the folder */
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.' || (!ends_with(e->d_name, EXT) && !is_tmp(e->d_name))) continue;
        int keep = 0;
        for (int i = 0; i < n && !keep; i++) keep = !strcmp(names[i], e->d_name);
        if (keep) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    free(names);
    return saved;
}
