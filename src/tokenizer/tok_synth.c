/* A synthetic tokenizer for random-weight demo models: byte-level BPE whose merges are
 * learned here from a little built-in English and code, plus the Qwen3.6 added tokens. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tok_internal.h"
#include "util/util.h"

#define QWEN36_FIRST_ADDED 248044
#define MAX_MERGES 1500

static const struct { const char *s; int special; } qwen_added[] = {
    { "<|endoftext|>", 1 }, { "<|im_start|>", 1 }, { "<|im_end|>", 1 }, { "<|object_ref_start|>", 1 },
    { "<|object_ref_end|>", 1 }, { "<|box_start|>", 1 }, { "<|box_end|>", 1 }, { "<|quad_start|>", 1 },
    { "<|quad_end|>", 1 }, { "<|vision_start|>", 1 }, { "<|vision_end|>", 1 }, { "<|vision_pad|>", 1 },
    { "<|image_pad|>", 1 }, { "<|video_pad|>", 1 }, { "<tool_call>", 0 }, { "</tool_call>", 0 },
    { "<|fim_prefix|>", 0 }, { "<|fim_middle|>", 0 }, { "<|fim_suffix|>", 0 }, { "<|fim_pad|>", 0 },
    { "<|repo_name|>", 0 }, { "<|file_sep|>", 0 }, { "<tool_response>", 0 }, { "</tool_response>", 0 },
    { "<think>", 0 }, { "</think>", 0 }, { "<|audio_start|>", 1 }, { "<|audio_end|>", 1 },
    { "<tts_pad>", 1 }, { "<tts_text_bos>", 1 }, { "<tts_text_eod>", 1 }, { "<tts_text_bos_single>", 1 },
    { "<|audio_pad|>", 1 },
};
#define N_ADDED ((int)(sizeof qwen_added / sizeof qwen_added[0]))

/* Written for this file: ordinary prose, chat phrasing and a little code, so that common
 * words and keywords become single tokens. */
static const char corpus[] =
    "The quick brown fox jumps over the lazy dog. This is a small model that was made with random "
    "weights, so what it says will not make any sense, but the text still has to go in and out. "
    "Hello! How are you today? I am fine, thank you. What is the weather like in Paris? It is "
    "sunny and warm. Let me think about that question for a moment before I answer it. "
    "The user asked for a list of the things they need, and the assistant gave them one. "
    "There are many ways to write a program, and some of them are better than others. "
    "We should test every function we write, and we should read the error messages carefully. "
    "In the beginning the system reads the configuration file, then it loads the model and "
    "starts the server that answers requests from the network. Each request has a message. "
    "def main(args):\n    for i in range(10):\n        if i % 2 == 0:\n            print(i)\n"
    "    return None\n\nclass Model:\n    def __init__(self, name):\n        self.name = name\n"
    "int main(int argc, char **argv) {\n    const char *name = argv[1];\n    if (name == NULL) return 1;\n"
    "    for (int i = 0; i < argc; i++) printf(\"%s\\n\", argv[i]);\n    return 0;\n}\n"
    "function get(url) { return fetch(url).then((response) => response.json()); }\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n"
    "import os\nimport sys\nfrom typing import List, Optional\n\nprint(\"hello world\")\n"
    "The results of the experiment were interesting: the first number was 12, the second was 345, "
    "and the difference between them is important for the rest of the work that we will do here. "
    "You can use this information to make a decision about what to do next with your time.";

typedef struct { int32_t *sym; int n; int count; } word;
typedef struct { word *w; int n, cap; tok_strmap index; } word_set;

static int collect(void *ctx, const char *s, size_t n) {
    word_set *ws = ctx;
    int32_t at = tok_strmap_get(&ws->index, s, n);
    if (at >= 0) { ws->w[at].count++; return 0; }
    if (ws->n == ws->cap) {
        int nc = ws->cap ? ws->cap * 2 : 256;
        word *nw = realloc(ws->w, (size_t)nc * sizeof *nw);
        if (!nw) return -1;
        ws->w = nw; ws->cap = nc;
    }
    word *w = &ws->w[ws->n];
    w->sym = malloc(n * sizeof *w->sym);
    if (!w->sym) return -1;
    for (size_t i = 0; i < n; i++) w->sym[i] = (unsigned char)s[i]; /* byte value, mapped later */
    w->n = (int)n; w->count = 1;
    if (!tok_strmap_put(&ws->index, s, n, ws->n)) { free(w->sym); return -1; }
    ws->n++;
    return 0;
}

/* Token text in the byte-level alphabet. */
static void sym_text(char **tokstr, int32_t id, char *out) { strcpy(out, tokstr[id]); }

lily_code tok_write_synth_json(const char *path, int vocab_size, lily_status *st) {
    if (vocab_size < 300) return lily_err(st, LILY_EINVAL, "synthetic tokenizer: vocab_size %d < 300", vocab_size);
    tok_unicode_init();
    int first_added = vocab_size >= QWEN36_FIRST_ADDED + N_ADDED ? QWEN36_FIRST_ADDED : vocab_size - N_ADDED;
    int n_regular = first_added;
    lily_code rc = LILY_OK;
    /* token strings by id; the 256 byte symbols first, in the GPT-2 alphabet order */
    char **tokstr = calloc((size_t)n_regular, sizeof *tokstr);
    word_set ws = { 0 };
    tok_pretok *pre = NULL;
    json_t *root = NULL, *cfg = NULL;
    int32_t byte_sym[256];
    tok_strmap seen = { 0 };
    if (!tokstr || !tok_strmap_init(&ws.index, 1024) || !tok_strmap_init(&seen, 4096)) { rc = lily_err(st, LILY_ENOMEM, "synthetic tokenizer: out of memory"); goto out; }
    int k = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 256; b++) {
            int printable = tok_byte_to_cp[b] == (uint32_t)b;
            if (printable != (pass == 0)) continue;
            uint32_t cp = tok_byte_to_cp[b];
            char *s = malloc(3);
            if (!s) { rc = lily_err(st, LILY_ENOMEM, "synthetic tokenizer: out of memory"); goto out; }
            if (cp < 0x80) { s[0] = (char)cp; s[1] = 0; }
            else { s[0] = (char)(0xC0 | (cp >> 6)); s[1] = (char)(0x80 | (cp & 0x3F)); s[2] = 0; }
            byte_sym[b] = k;
            if (!tok_strmap_put(&seen, s, strlen(s), k)) { free(s); rc = lily_err(st, LILY_ENOMEM, "synthetic tokenizer: out of memory"); goto out; }
            tokstr[k++] = s;
        }
    if ((rc = tok_pretok_new(TOK_REGEX_QWEN35, 0, 0, &pre, st))) goto out;
    if (tok_pretok_split(pre, corpus, sizeof corpus - 1, collect, &ws)) { rc = lily_err(st, LILY_ENOMEM, "synthetic tokenizer: out of memory"); goto out; }
    for (int i = 0; i < ws.n; i++)
        for (int j = 0; j < ws.w[i].n; j++) ws.w[i].sym[j] = byte_sym[ws.w[i].sym[j]];
    int max_merges = n_regular - 256 < MAX_MERGES ? n_regular - 256 : MAX_MERGES;
    json_t *merges = json_array();
    root = json_object();
    for (int m = 0; m < max_merges; m++) {
        /* most frequent adjacent pair (ties: smallest ids), counted over the word set */
        tok_pairmap counts;
        if (!tok_pairmap_init(&counts, 4096)) { json_decref(merges); rc = lily_err(st, LILY_ENOMEM, "synthetic tokenizer: out of memory"); goto out; }
        int32_t ba = -1, bb = -1; uint32_t bc = 0;
        for (int i = 0; i < ws.n; i++)
            for (int j = 0; j + 1 < ws.w[i].n; j++) {
                int32_t a = ws.w[i].sym[j], b = ws.w[i].sym[j + 1], r;
                uint32_t c = tok_pairmap_get(&counts, a, b, &r);
                c = (c == UINT32_MAX ? 0 : c) + (uint32_t)ws.w[i].count;
                tok_pairmap_put(&counts, a, b, c, 0);
                if (c > bc || (c == bc && (a < ba || (a == ba && b < bb)))) { bc = c; ba = a; bb = b; }
            }
        tok_pairmap_free(&counts);
        if (bc < 2) break;
        size_t la = strlen(tokstr[ba]), lb = strlen(tokstr[bb]);
        char *s = malloc(la + lb + 1);
        if (!s) { json_decref(merges); rc = lily_err(st, LILY_ENOMEM, "synthetic tokenizer: out of memory"); goto out; }
        sym_text(tokstr, ba, s); sym_text(tokstr, bb, s + la);
        int32_t nid = tok_strmap_get(&seen, s, la + lb);
        if (nid >= 0) free(s); /* another pair already spells this token: share its id */
        else {
            nid = k;
            tokstr[k++] = s;
            if (!tok_strmap_put(&seen, s, la + lb, nid)) { json_decref(merges); rc = lily_err(st, LILY_ENOMEM, "synthetic tokenizer: out of memory"); goto out; }
        }
        json_array_append_new(merges, json_pack("[ss]", tokstr[ba], tokstr[bb]));
        for (int i = 0; i < ws.n; i++) {
            word *w = &ws.w[i];
            int o = 0;
            for (int j = 0; j < w->n; j++) {
                if (j + 1 < w->n && w->sym[j] == ba && w->sym[j + 1] == bb) { w->sym[o++] = nid; j++; }
                else w->sym[o++] = w->sym[j];
            }
            w->n = o;
        }
    }
    /* ids nothing merges into, so the regular vocabulary is contiguous up to the added tokens */
    json_t *vocab = json_object();
    for (int i = 0; i < n_regular; i++) {
        char buf[48];
        if (i < k) json_object_set_new(vocab, tokstr[i], json_integer(i));
        else { snprintf(buf, sizeof buf, "<|synth_unused_%d|>", i); json_object_set_new(vocab, buf, json_integer(i)); }
    }
    json_t *added = json_array(), *decoder_map = json_object();
    for (int i = 0; i < N_ADDED; i++) {
        json_t *a = json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", first_added + i, "content", qwen_added[i].s,
                              "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", qwen_added[i].special);
        json_array_append_new(added, a);
        char key[16];
        snprintf(key, sizeof key, "%d", first_added + i);
        json_object_set_new(decoder_map, key, json_pack("{s:s,s:b,s:b,s:b,s:b,s:b}", "content", qwen_added[i].s,
                            "lstrip", 0, "normalized", 0, "rstrip", 0, "single_word", 0, "special", qwen_added[i].special));
    }
    json_t *bl = json_pack("{s:s,s:b,s:b,s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 0);
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "truncation", json_null());
    json_object_set_new(root, "padding", json_null());
    json_object_set_new(root, "added_tokens", added);
    json_object_set_new(root, "normalizer", json_pack("{s:s}", "type", "NFC"));
    json_object_set_new(root, "pre_tokenizer", json_pack("{s:s,s:[{s:s,s:{s:s},s:s,s:b},O]}", "type", "Sequence",
                        "pretokenizers", "type", "Split", "pattern", "Regex", TOK_REGEX_QWEN35, "behavior", "Isolated",
                        "invert", 0, bl));
    json_object_set_new(root, "post_processor", json_null());
    json_object_set_new(root, "decoder", bl);
    json_object_set_new(root, "model", json_pack("{s:s,s:n,s:n,s:s,s:s,s:b,s:b,s:b,s:o,s:o}", "type", "BPE", "dropout",
                        "unk_token", "continuing_subword_prefix", "", "end_of_word_suffix", "", "fuse_unk", 0,
                        "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges", merges));
    if (json_dump_file(root, path, JSON_PRESERVE_ORDER | JSON_COMPACT)) {
        json_decref(decoder_map);
        rc = lily_err(st, LILY_EIO, "synthetic tokenizer: cannot write %s", path);
        goto out;
    }
    cfg = json_pack("{s:b,s:b,s:o,s:n,s:b,s:s,s:s,s:s,s:i,s:s,s:s,s:b}", "add_bos_token", 0, "add_prefix_space", 0,
                    "added_tokens_decoder", decoder_map, "bos_token", "clean_up_tokenization_spaces", 0,
                    "eos_token", "<|im_end|>", "errors", "replace", "pad_token", "<|endoftext|>",
                    "model_max_length", 262144, "pretokenize_regex", TOK_REGEX_QWEN35,
                    "tokenizer_class", "Qwen2Tokenizer", "split_special_tokens", 0);
    char cpath[4096];
    const char *slash = strrchr(path, '/');
    if (slash) snprintf(cpath, sizeof cpath, "%.*s/tokenizer_config.json", (int)(slash - path), path);
    else snprintf(cpath, sizeof cpath, "tokenizer_config.json");
    if (!cfg || json_dump_file(cfg, cpath, JSON_PRESERVE_ORDER | JSON_INDENT(2)))
        rc = lily_err(st, LILY_EIO, "synthetic tokenizer: cannot write %s", cpath);
out:
    json_decref(root);
    json_decref(cfg);
    if (tokstr) for (int i = 0; i < n_regular; i++) free(tokstr[i]);
    free(tokstr);
    for (int i = 0; i < ws.n; i++) free(ws.w[i].sym);
    free(ws.w);
    tok_strmap_free(&ws.index);
    tok_strmap_free(&seen);
    tok_pretok_free(pre);
    return rc;
}
