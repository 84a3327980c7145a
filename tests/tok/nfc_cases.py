#!/usr/bin/env python3
"""Hex lines of texts where NFC implementations part (used by it_tokenizer.sh): every
canonical composition pair in Python's tables, alone, doubled, decomposed, and with a mark
between or after; and pairs of conjoining Hangul jamo after jamo or syllables."""
import unicodedata as u

out = []
marks = [0x301, 0x323, 0x328, 0x31B, 0x334, 0x345, 0x5B0, 0x93C, 0x94D, 0x3099, 0x1D165, 0x1D16E]
for cp in range(0x110000):
    d = u.decomposition(chr(cp))
    if not d or d.startswith('<'):
        continue
    parts = [chr(int(x, 16)) for x in d.split()]
    s = ''.join(parts)
    out += [s, u.normalize('NFD', chr(cp)), s + s]
    if len(parts) == 2:
        for m in marks:
            out += [parts[0] + chr(m) + parts[1], s + chr(m)]
jamo = list(range(0x1100, 0x1200)) + list(range(0xA960, 0xA980)) + list(range(0xD7B0, 0xD800))
for a in jamo + list(range(0xAC00, 0xD7A4, 97)):
    out += [chr(a) + chr(b) for b in jamo]
print('\n'.join((s + ' q').encode('utf-8', 'surrogatepass').hex() for s in out))
