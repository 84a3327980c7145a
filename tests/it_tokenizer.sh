#!/usr/bin/env bash
# Differential test of the tokenizer against the Hugging Face `tokenizers` library (Rust,
# npm @anush008/tokenizers): fresh random texts (mixed scripts, marks, emoji, whitespace
# runs, digits, contractions, added-token text, invalid UTF-8) encoded by `lily tokenize`
# and by the library on the Qwen3 tokenizer.json and variants (Qwen3.5 regex with NFC and
# without, an unknown regex for the PCRE2 path, merges as strings, no added tokens for
# parse-off), on synthetic tokenizers, and random ids decoded both ways.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
LILY=$BUILD/lily
SRC=../shared/data/qwen-tokenizer/qwen3/tokenizer.json
N=${TOK_IT_CASES:-1500}
SEED=${TOK_IT_SEED:-$(date +%s)}
pass=0; fail=0
ok() { pass=$((pass+1)); echo "ok   $1"; }
bad() { fail=$((fail+1)); echo "FAIL $1"; }
finish() { echo "$pass passed, $fail failed"; [ "$fail" = 0 ]; exit $?; }
if [ ! -d tests/npm/node_modules/@anush008/tokenizers ]; then
  (cd tests/npm && npm install --no-audit --no-fund >/dev/null 2>&1)
fi
if [ ! -d tests/npm/node_modules/@anush008/tokenizers ] || [ ! -x "$LILY" ] || [ ! -f "$SRC" ]; then
  bad "setup: needs tests/npm/node_modules (npm install), $LILY and $SRC"; finish
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "seed $SEED, $N cases per tokenizer"
ORACLE="node tests/tok/oracle.js"
python3 tests/tok/variant.py "$SRC" "$tmp/q35.json" --regex qwen35 --normalizer nfc &
python3 tests/tok/variant.py "$SRC" "$tmp/q35raw.json" --regex qwen35 --normalizer none &
python3 tests/tok/variant.py "$SRC" "$tmp/other.json" --regex gpt2-split --merges-as-strings &
python3 tests/tok/variant.py "$SRC" "$tmp/plain.json" --no-added &
mkdir -p "$tmp/syn300" "$tmp/syn5k" "$tmp/synfull"
$LILY tokenize --synth-out "$tmp/syn300/tokenizer.json" --vocab-size 300 &&
$LILY tokenize --synth-out "$tmp/syn5k/tokenizer.json" --vocab-size 5000 &&
$LILY tokenize --synth-out "$tmp/synfull/tokenizer.json" --vocab-size 248320 || bad "write synthetic tokenizers"
wait
$ORACLE gen "$SEED" "$N" > "$tmp/cases.hex"
$ORACLE gen "$((SEED+1))" "$N" old > "$tmp/old.hex"

# compare NAME ORACLE_TOKENIZER LILY_TOKENIZER CASES [lily flags]
compare() {
  local name=$1 otok=$2 ltok=$3 cases=$4; shift 4
  $ORACLE encode "$otok" < "$cases" > "$tmp/$name.want" || { bad "$name: oracle failed"; return; }
  $LILY tokenize --batch "$@" --tokenizer "$ltok" < "$cases" > "$tmp/$name.got" || { bad "$name: lily failed"; return; }
  local diff
  diff=$(paste -d'|' "$cases" "$tmp/$name.want" "$tmp/$name.got" | awk -F'|' '$2!=$3' )
  local lines; lines=$(wc -l < "$tmp/$name.want")
  if [ -z "$diff" ] && [ "$lines" = "$(wc -l < "$cases")" ]; then ok "$name: $lines texts encode identically"
  else
    bad "$name: $(printf '%s\n' "$diff" | grep -c .) of $lines texts differ"
    printf '%s\n' "$diff" | head -n 3 | sed 's/^/  hex|want|got: /'
  fi
}
compare qwen3-special "$SRC" "$SRC" "$tmp/cases.hex" --special
compare qwen3-plain "$tmp/plain.json" "$SRC" "$tmp/cases.hex"
compare qwen35-nfc "$tmp/q35.json" "$tmp/q35.json" "$tmp/cases.hex" --special
compare qwen35-raw "$tmp/q35raw.json" "$tmp/q35raw.json" "$tmp/cases.hex" --special
compare pcre-fallback "$tmp/other.json" "$tmp/other.json" "$tmp/old.hex" --special
compare synth-300 "$tmp/syn300/tokenizer.json" "$tmp/syn300" "$tmp/cases.hex" --special
compare synth-5000 "$tmp/syn5k/tokenizer.json" "$tmp/syn5k/tokenizer.json" "$tmp/cases.hex" --special
compare synth-248320 "$tmp/synfull/tokenizer.json" "$tmp/synfull" "$tmp/cases.hex" --special

# small hand-made files: lstrip/rstrip added tokens, ByteLevel's own GPT-2 regex with
# ignore_merges, and added-token ids written in the file that HF re-derives
python3 - "$tmp/gapids.json" <<'PY'
import json, sys
t = json.load(open("fuzz/corpus/tokenizer_json/small.json"))
t["added_tokens"][0]["id"] = 1000
t["added_tokens"][1]["id"] = 5
json.dump(t, open(sys.argv[1], "w"))
PY
compare small-lstrip fuzz/corpus/tokenizer_json/small.json fuzz/corpus/tokenizer_json/small.json "$tmp/cases.hex" --special
compare gpt2-bytelevel-regex fuzz/corpus/tokenizer_json/gpt2.json fuzz/corpus/tokenizer_json/gpt2.json "$tmp/old.hex" --special
compare added-ids-rederived "$tmp/gapids.json" "$tmp/gapids.json" "$tmp/cases.hex" --special

# NFC's hard cases, all of them rather than by chance: canonical composition pairs and
# conjoining Hangul jamo (utf8proc and the library's tables part there)
python3 tests/tok/nfc_cases.py > "$tmp/nfc.hex"
compare nfc-pairs "$SRC" "$SRC" "$tmp/nfc.hex" --special

# decoding random ids (many split UTF-8 sequences), with and without skipping specials
$ORACLE genids "$((SEED+2))" "$N" 151669 > "$tmp/ids.txt"
for skip in 0 1; do
  flag=; [ $skip = 1 ] && flag=--skip-special
  $ORACLE decode "$SRC" $skip < "$tmp/ids.txt" > "$tmp/dec.want"
  $LILY detokenize --batch $flag --tokenizer "$SRC" < "$tmp/ids.txt" > "$tmp/dec.got"
  d=$(paste -d'|' "$tmp/ids.txt" "$tmp/dec.want" "$tmp/dec.got" | awk -F'|' '$2!=$3')
  if [ -z "$d" ]; then ok "decode skip=$skip: $N id lists decode identically"
  else bad "decode skip=$skip: $(printf '%s\n' "$d" | grep -c .) differ"; printf '%s\n' "$d" | head -n 3; fi
done

# the plain CLI form: stdin text -> ids -> text
txt=$'Hello <|im_start|>user\nnaïve 你好 🦙\n'
ids=$(printf '%s' "$txt" | $LILY tokenize --tokenizer "$SRC" --special)
back=$(echo "$ids" | $LILY detokenize --tokenizer "$SRC"; echo x)
if [ "${back%x}" = "$txt" ] && echo "$ids" | grep -qw 151644; then ok "tokenize/detokenize CLI round trip"
else bad "CLI round trip: ids '$ids'"; fi
ids=$(printf '%s' "$txt" | $LILY tokenize --tokenizer "$SRC")
if echo "$ids" | grep -qw 151644; then bad "without --special, <|im_start|> became a special token"; else ok "no injection without --special"; fi
finish
