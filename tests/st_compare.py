#!/usr/bin/env python3
"""Compares two safetensors checkpoints (folders) tensor by tensor: names, dtypes,
shapes and bytes, and the `quantization` blocks of their config.json files.
Usage: st_compare.py A B [--bytes]   (--bytes: require identical tensor bytes)
Prints one line per difference and "N passed, N failed"; exits nonzero on a difference."""
import json, os, struct, sys


def load(d):
    out = {}
    for fn in sorted(os.listdir(d)):
        if not fn.endswith(".safetensors") or fn == "reference.safetensors":
            continue
        with open(os.path.join(d, fn), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            h = json.loads(f.read(n))
            base = 8 + n
            for k, v in h.items():
                if k == "__metadata__":
                    continue
                f.seek(base + v["data_offsets"][0])
                out[k] = (v["dtype"], v["shape"], f.read(v["data_offsets"][1] - v["data_offsets"][0]))
    return out


a, b = sys.argv[1], sys.argv[2]
want_bytes = "--bytes" in sys.argv
ta, tb = load(a), load(b)
ok = bad = 0
def check(cond, msg):
    global ok, bad
    if cond:
        ok += 1
    else:
        bad += 1
        print("DIFF", msg)
for k in sorted(set(ta) | set(tb)):
    if k not in ta or k not in tb:
        check(False, "%s only in %s" % (k, a if k in ta else b))
        continue
    check(ta[k][0] == tb[k][0] and ta[k][1] == tb[k][1], "%s: %s %s vs %s %s" % (k, ta[k][0], ta[k][1], tb[k][0], tb[k][1]))
    if want_bytes:
        if ta[k][2] != tb[k][2]:
            nd = sum(1 for x, y in zip(ta[k][2], tb[k][2]) if x != y)
            check(False, "%s: %d of %d bytes differ" % (k, nd, len(ta[k][2])))
        else:
            check(True, "")
ca = json.load(open(os.path.join(a, "config.json")))
cb = json.load(open(os.path.join(b, "config.json")))
for key in sorted(set(ca) | set(cb)):
    check(ca.get(key) == cb.get(key), "config.json field %s differs" % key)
print("%d passed, %d failed" % (ok, bad))
sys.exit(1 if bad else 0)
