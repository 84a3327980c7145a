#!/usr/bin/env bash
# Tokenizer speed: lily's tok_encode against the Hugging Face tokenizers library (Rust, via
# npm) on the same few MB of mixed text (prose and Markdown, C/CUDA/JS/Python code, JSON,
# chat templates, many scripts and emoji), one core each (taskset -c 0, RAYON_NUM_THREADS=1).
# usage: bench/tokenizer_bench.sh [TOKENIZER] [MB]   (run from the repo root after `make`)
set -eu
cd "$(dirname "$0")/.."
TOK=${1:-../shared/data/qwen-tokenizer/qwen3/tokenizer.json}
MB=${2:-4}
BUILD=${BUILD:-build}
mkdir -p "$BUILD/bench"
cc -O2 -std=gnu11 -Iinclude -Isrc bench/tok_bench.c "$BUILD/liblily.a" -o "$BUILD/bench/tok_bench" \
   -ljansson -lpcre2-8 -lutf8proc -lm -pthread
text="$BUILD/bench/mixed.txt"
python3 - "$text" "$MB" <<'PY'
import glob, json, sys, random
out, mb = sys.argv[1], float(sys.argv[2])
parts = []
for pat in ["src/**/*.c", "src/**/*.h", "src/**/*.cu", "tests/**/*.js", "tests/**/*.py", "docs/*.md",
            "../shared/docs/*.md", "../shared/data/qwen-tokenizer/**/*.jinja", "../shared/data/qwen-tokenizer/**/*.json"]:
    for f in sorted(glob.glob(pat, recursive=True)):
        if f.endswith("tokenizer.json") or f.endswith("tokenizer_config.json"):
            continue
        parts.append(open(f, encoding="utf-8", errors="replace").read())
for f in ["../shared/data/qwen-tokenizer/golden/qwen3-tokenize.json", "../shared/data/qwen-tokenizer/qwen3.6/real-ids-qwen35.json"]:
    parts += [c["text"] for c in json.load(open(f, encoding="utf-8"))["cases"]]
rnd = random.Random(1)
target, acc, total = int(mb * 1e6), [], 0
while total < target:  # shuffled so that repeats do not come in long identical runs
    p = rnd.choice(parts)
    acc.append(p); total += len(p.encode("utf-8"))
open(out, "w", encoding="utf-8").write("\n".join(acc))
PY
echo "text: $text ($(wc -c < "$text") bytes); tokenizer: $TOK; $(nproc) cores, pinned to core 0"
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
taskset -c 0 "$BUILD/bench/tok_bench" "$TOK" "$text" 3
taskset -c 0 node bench/tok_bench.js "$TOK" "$text" 3
