#!/usr/bin/env python3
"""Nsight Compute's raw CSV (`ncu --csv --page raw` with gpu__time_duration.sum and dram__bytes_read.sum)
of a few decode tokens -> one token's kernels grouped by name and grid, as a markdown table with each
group's byte floor at the given bandwidth. A token ends at its k_argmax_fin (greedy lily-bench tgN).
    python3 tests/cuda/ncu_table.py ncu.csv [--bw 4.26e12]"""
import collections, csv, sys

def main():
    args = sys.argv[1:]
    bw = 4.26e12
    if '--bw' in args:
        i = args.index('--bw'); bw = float(args[i + 1]); del args[i:i + 2]
    if len(args) != 1:
        sys.exit(__doc__)
    try:
        rows = list(csv.reader(open(args[0], newline='')))
    except OSError as e:
        sys.exit('ncu_table: %s' % e)
    try:
        hi = next(i for i, r in enumerate(rows) if r and r[0] == 'ID')
    except StopIteration:
        sys.exit('ncu_table: no header row (ID, ...) in ' + args[0])
    h = rows[hi]
    ix = {k: i for i, k in enumerate(h)}
    for k in ('Kernel Name', 'Grid Size', 'gpu__time_duration.sum', 'dram__bytes_read.sum'):
        if k not in ix:
            sys.exit('ncu_table: column %s missing' % k)
    data = [r for r in rows[hi + 1:] if len(r) == len(h) and r[0].isdigit()]
    num = lambda r, k: float(r[ix[k]].replace(',', ''))
    name = lambda r: r[ix['Kernel Name']].split('(')[0].replace('void ', '')
    ends = [i for i, r in enumerate(data) if name(r).startswith('k_argmax_fin')]
    if len(ends) < 2:
        sys.exit('ncu_table: fewer than two tokens (k_argmax_fin) in the profile')
    tok = data[ends[-2] + 1:ends[-1] + 1]
    groups = collections.OrderedDict()
    for r in tok:
        g = groups.setdefault((name(r), r[ix['Grid Size']]), [0, 0.0, 0.0])
        g[0] += 1; g[1] += num(r, 'gpu__time_duration.sum') / 1e3; g[2] += num(r, 'dram__bytes_read.sum')
    t_all = sum(g[1] for g in groups.values()); b_all = sum(g[2] for g in groups.values())
    print('%d kernels a token, %.0f us under Nsight; %.1f MB read, floor %.0f us at %.2f TB/s\n'
          % (len(tok), t_all, b_all / 1e6, b_all / bw * 1e6, bw / 1e12))
    print('| kernel | grid | launches | us each | us a token | MB a token | GB/s | floor us |')
    print('| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |')
    for (n, grid), (c, t, b) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print('| %s | %s | %d | %.2f | %.1f | %.1f | %.0f | %.1f |' % (n, grid.replace(' ', ''), c, t / c, t, b / 1e6,
                                                                       b / t / 1e3 if t else 0, b / bw * 1e6))

if __name__ == '__main__':
    main()
