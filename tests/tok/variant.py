#!/usr/bin/env python3
"""Writes a variant of a tokenizer.json for differential tests:
  variant.py IN OUT [--regex qwen35|qwen2|gpt2-split] [--normalizer nfc|none] [--no-added]"""
import json, sys
QWEN35 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# A regex none of lily's fast paths know (forces the PCRE2 fallback): GPT-2's, as a Split.
OTHER = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
src, dst, args = sys.argv[1], sys.argv[2], sys.argv[3:]
t = json.load(open(src, encoding="utf-8"))
i = 0
while i < len(args):
    a = args[i]
    if a == "--regex":
        pat = {"qwen35": QWEN35, "qwen2": QWEN2, "gpt2-split": OTHER}[args[i + 1]]; i += 1
        for p in t["pre_tokenizer"]["pretokenizers"]:
            if p["type"] == "Split": p["pattern"] = {"Regex": pat}
    elif a == "--normalizer":
        t["normalizer"] = {"type": "NFC"} if args[i + 1] == "nfc" else None; i += 1
    elif a == "--no-added":
        t["added_tokens"] = []
    elif a == "--merges-as-pairs":
        t["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in t["model"]["merges"]]
    elif a == "--merges-as-strings":
        t["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in t["model"]["merges"]]
    else:
        sys.exit("unknown option " + a)
    i += 1
json.dump(t, open(dst, "w", encoding="utf-8"), ensure_ascii=False)
