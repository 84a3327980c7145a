/* lily pull REPO_ID [--revision REV] [--dir DIR]: download a model from the hub. */
#include "cli/cli.h"
#include "cli/progress.h"
#include "hub/hub.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void on_progress(void *user, const hub_progress *p) {
    cli_progress *pr = user;
    if (p->note) { cli_progress_note(pr, "%s: %s", p->file, p->note); return; }
    cli_progress_update(pr, p->bytes_done, p->bytes_total, p->elapsed, "file %d/%d %s",
                        p->files_done + 1, p->files_total, p->file ? p->file : "");
}

int cli_pull(int argc, char **argv) {
    const char *repo = NULL;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-') { if (!strchr(argv[i], '=') && strcmp(argv[i], "-h") && strcmp(argv[i], "--help")) i++; continue; }
        repo = argv[i];
        break;
    }
    if (!repo || cli_flag(argc, argv, "-h") || cli_flag(argc, argv, "--help")) {
        fprintf(repo ? stdout : stderr,
                "usage: lily pull REPO_ID [--revision REV] [--dir DIR]\n"
                "  downloads a model repository from the Hugging Face hub into $LILY_HOME/models/ORG--NAME\n"
                "  (LILY_HOME defaults to ~/.cache/lily). HF_TOKEN: token for gated repositories;\n"
                "  HF_ENDPOINT: a mirror instead of https://huggingface.co.\n");
        return repo ? 0 : 2;
    }
    signal(SIGXFSZ, SIG_IGN);   /* a file size limit must be an error, not a kill */
    hub_opts o;
    hub_opts_default(&o);
    o.revision = cli_opt(argc, argv, "--revision");
    o.dir = cli_opt(argc, argv, "--dir");
    const char *env = getenv("LILY_PULL_RETRY_MS");   /* tests shorten the backoff */
    if (env) o.retry_base_ms = atoi(env);
    if ((env = getenv("LILY_PULL_STALL_S"))) o.stall_seconds = atoi(env);
    if ((env = getenv("LILY_PULL_RETRIES"))) o.max_retries = atoi(env);
    cli_progress pr;
    cli_progress_init(&pr, "pull");
    o.progress = on_progress;
    o.progress_user = &pr;
    char dir[4096];
    lily_status st = { 0 };
    lily_code rc = hub_pull(repo, &o, dir, sizeof dir, &st);
    cli_progress_end(&pr);
    if (rc != LILY_OK) {
        fprintf(stderr, "lily pull: %s\n", st.msg);
        return 1;
    }
    printf("%s\n", dir);
    return 0;
}
