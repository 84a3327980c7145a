/* Parked conversations in a folder (--cache-dir), so a restarted server resumes them
 * without recomputing their prefixes. Files are complete or absent (lily_parked_save
 * writes through a temporary file) and named by a hash of their tokens, so a sync writes
 * only conversations the folder lacks and leaves it holding exactly the current set. */
#include <dirent.h>
#include <fcntl.h>
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

void srv_park_name(const int32_t *t, int n, char out[64]) {
    unsigned char md[32];
    unsigned int len = 0;
    EVP_Digest(t, (size_t)n * sizeof *t, md, &len, EVP_sha256(), NULL);
    for (int i = 0; i < 16; i++) sprintf(out + 2 * i, "%02x", md[i]);
    strcpy(out + 32, EXT);
}

int srv_park_dir_sync(const char *dir, const lily_model *m, const srv_park_entry *es, int n, int (*stop)(void *), void *u) {
    char path[4096];
    int saved = 0, stopped = 0;
    /* the least recent first: a file written (or touched) later is more recent at the next start */
    for (int i = n - 1; i >= 0; i--) {
        snprintf(path, sizeof path, "%s/%s", dir, es[i].name);
        if (!access(path, F_OK)) { /* the same tokens: the same conversation, already there */
            utimensat(AT_FDCWD, path, NULL, 0);
            saved++;
            continue;
        }
        if (stopped || (stop && stop(u))) { stopped = 1; continue; }
        lily_parked *p = es[i].p, *own = NULL;
        lily_status st = { 0 };
        if (!p && es[i].sess && lily_session_park(es[i].sess, &own, &st)) {
            fprintf(stderr, "lily-server: --cache-dir: %s\n", st.msg);
            continue;
        }
        if (!p) p = own;
        if (p && lily_parked_save(p, m, path, &st)) fprintf(stderr, "lily-server: --cache-dir: %s\n", st.msg);
        else if (p) saved++;
        lily_parked_free(own);
    }
    /* conversations no longer held (resumed and saved under their new tokens, evicted,
     * unreadable) leave the folder */
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.' || (!ends_with(e->d_name, EXT) && !is_tmp(e->d_name))) continue;
        int keep = 0;
        for (int i = 0; i < n && !keep; i++) keep = !strcmp(es[i].name, e->d_name);
        if (keep) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    return saved;
}
