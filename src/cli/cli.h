/* The `lily` command: one function per subcommand, each in its own file.
 * argv[0] is the subcommand name. Returns the process exit code. */
#ifndef LILY_CLI_H
#define LILY_CLI_H
int cli_check(int argc, char **argv);      /* check.c: run a reference.safetensors */
int cli_synth(int argc, char **argv);      /* synth.c: write a random-weight checkpoint */
int cli_run(int argc, char **argv);        /* run.c: generate text from a prompt */
int cli_chat(int argc, char **argv);       /* chat.c: a conversation in the terminal */
int cli_info(int argc, char **argv);       /* info.c: describe a checkpoint */
int cli_tokenize(int argc, char **argv);   /* tokenize.c */
int cli_detokenize(int argc, char **argv); /* tokenize.c */
int cli_render(int argc, char **argv);     /* render.c: chat request -> prompt text */
int cli_convert(int argc, char **argv);    /* convert.c: official layout -> MLX 4-bit */
int cli_pull(int argc, char **argv);       /* pull.c: download from the Hugging Face hub */

/* Small argument helper: returns the value after `name` ("--x v" or "--x=v"), or NULL. */
const char *cli_opt(int argc, char **argv, const char *name);
int cli_flag(int argc, char **argv, const char *name);
#endif
