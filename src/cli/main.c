#include <stdio.h>
#include <string.h>
#include "cli/cli.h"
#include "util/util.h"

/* Subcommands still being written are weak stand-ins that say so and fail. */
#define PENDING(fn, what) \
    __attribute__((weak)) int fn(int argc, char **argv) { \
        (void)argc; (void)argv; fprintf(stderr, "lily: '%s' is not built into this binary\n", what); return 2; }
PENDING(cli_check, "check")
PENDING(cli_synth, "synth")
PENDING(cli_run, "run")
PENDING(cli_chat, "chat")
PENDING(cli_info, "info")
PENDING(cli_tokenize, "tokenize")
PENDING(cli_detokenize, "detokenize")
PENDING(cli_render, "render")
PENDING(cli_convert, "convert")
PENDING(cli_pull, "pull")

static const struct { const char *name; int (*fn)(int, char **); const char *help; } cmds[] = {
    { "check", cli_check, "--model DIR --reference FILE [--backend cpu|cuda]   compare with reference logits" },
    { "synth", cli_synth, "--out DIR [--layout hf|mlx4] [--preset 35b-a3b|tiny] ...   random-weight checkpoint" },
    { "run", cli_run, "--model DIR [--prompt TEXT] [-n N] [--temp T]   generate text" },
    { "chat", cli_chat, "--model DIR [--system TEXT] [--no-think] [--temp T]   converse in the terminal" },
    { "info", cli_info, "DIR [--ctx-len N]   what a checkpoint is" },
    { "tokenize", cli_tokenize, "--tokenizer FILE [--special]   text on stdin -> ids" },
    { "detokenize", cli_detokenize, "--tokenizer FILE   ids on stdin -> text" },
    { "render", cli_render, "[--template qwen3.6|qwen3.5|qwen3]   chat request JSON on stdin -> prompt" },
    { "convert", cli_convert, "--from DIR --to DIR [--bits 4] [--group 64]   official -> MLX 4-bit" },
    { "pull", cli_pull, "REPO_ID [--revision REV] [--dir DIR]   download from the Hugging Face hub" },
};

static void usage(FILE *f) {
    fprintf(f, "usage: lily COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        fprintf(f, "  %-11s %s\n", cmds[i].name, cmds[i].help);
}

const char *cli_opt(int argc, char **argv, const char *name) {
    size_t n = strlen(name);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], name) == 0) return i + 1 < argc ? argv[i + 1] : NULL;
        if (strncmp(argv[i], name, n) == 0 && argv[i][n] == '=') return argv[i] + n + 1;
    }
    return NULL;
}

int cli_flag(int argc, char **argv, const char *name) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], name) == 0) return 1;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    lily_env_note("lily");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "lily: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
