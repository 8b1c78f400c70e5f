#!/usr/bin/env python3
"""Checks perf_nccl CSVs (--csv, with --raw) against the NCCL backend's targets.

    scripts/perf_targets.py FILE.csv [FILE.csv ...]

For every (collective, placement, size) that has both an ncclkit and a raw row:
  - sizes >= 1 MiB: busbw within 2% of raw (ncclkit busbw >= 0.98 x raw);
  - sizes 8 B .. 64 KiB: time within 1 us of raw (ncclkit time <= raw time + 1 us).
Prints a summary per file and the rows that miss, worst first. Exit status 0 always: the
numbers are for docs/performance.md, not a pass/fail gate (timings vary run to run).

A file of PyTorch rows (bench/pytorch_nccl_bench.py --csv) named perf_torch_REST.csv is set
beside the ncclkit rows of perf_REST.csv when that file is given too: per row the time of
ncclkit over PyTorch's (same collective, placement, size and world; < 1: ncclkit faster).
Rows of perf_nccl --raw-event ("raw+event") and --raw-native ("raw@ncclkit") are set beside
raw's and ncclkit's too.
"""
import csv
import os
import statistics
import sys
from collections import defaultdict


def load(path):
    rows = defaultdict(dict)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            # Type and reduction too: a sweep of several (-d, -o) has a row of each per size.
            key = (row["collective"], row["placement"], int(row["bytes"]), int(row["nranks"]),
                   row.get("type", ""), row.get("redop", ""))
            rows[key][row["implementation"]] = row
    return rows


def small_differences(rows, a="ncclkit", b="raw"):
    """Per row of 8 B - 64 KiB that has both implementations: (time of a - time of b in us,
    key, time of a, time of b), in key order."""
    out = []
    for key, impl in sorted(rows.items()):
        if a in impl and b in impl and 8 <= key[2] <= 64 << 10:
            t_a, t_b = float(impl[a]["time_us"]), float(impl[b]["time_us"])
            out.append((t_a - t_b, key, t_a, t_b))
    return out


def main(paths):
    for path in paths:
        if os.path.basename(path).startswith("perf_torch_"):
            continue  # PyTorch's rows: compare_with_pytorch
        rows = load(path)
        big = []
        for key, impl in sorted(rows.items()):
            if "ncclkit" not in impl or "raw" not in impl:
                continue
            collective, placement, size, nranks = key[:4]
            b_mine, b_raw = float(impl["ncclkit"]["busbw_gbs"]), float(impl["raw"]["busbw_gbs"])
            if size >= 1 << 20 and b_raw > 0:
                big.append((b_mine / b_raw, collective, placement, size, b_mine, b_raw))
        small = [(d, key[0], key[1], key[2], t_mine, t_raw) for d, key, t_mine, t_raw in small_differences(rows)]
        print(f"== {path}")
        if big:
            ok = sum(1 for r in big if r[0] >= 0.98)
            worst = min(big)
            print(f"  >= 1 MiB: {ok} of {len(big)} rows with busbw within 2% of raw; "
                  f"lowest ratio {worst[0]:.3f} ({worst[1]} {worst[2]} {worst[3]} B)")
            for r in sorted(big)[:10]:
                if r[0] < 0.98:
                    print(f"    miss: {r[1]} {r[2]} {r[3]} B: {r[4]:.2f} vs {r[5]:.2f} GB/s ({r[0]:.3f}x)")
        if small:
            diffs = sorted(r[0] for r in small)
            ok = sum(1 for d in diffs if d <= 1.0)
            median = diffs[len(diffs) // 2]
            print(f"  8 B - 64 KiB: {ok} of {len(small)} rows within 1 us of raw; "
                  f"median difference {median:+.2f} us, worst {diffs[-1]:+.2f} us")
            for r in sorted(small, reverse=True)[:10]:
                if r[0] > 1.0:
                    print(f"    miss: {r[1]} {r[2]} {r[3]} B: {r[4]:.2f} vs {r[5]:.2f} us ({r[0]:+.2f})")
        # perf_nccl --raw-event: what one event per call costs alone, and what ncclkit adds to it;
        # --raw-native: whether ncclkit's NCCL communicator runs differently from a plain one, and
        # what ncclkit's issue path adds on that same communicator.
        for a, b in (("raw+event", "raw"), ("ncclkit", "raw+event"), ("raw@ncclkit", "raw"), ("ncclkit", "raw@ncclkit")):
            diffs = [d for d, _, _, _ in small_differences(rows, a, b)]
            if diffs:
                print(f"  8 B - 64 KiB, {a} against {b}: median difference {statistics.median(diffs):+.2f} us "
                      f"over {len(diffs)} rows")
    compare_with_pytorch(paths)
    return 0


def compare_with_pytorch(paths):
    by_name = {os.path.basename(path): path for path in paths}
    for name, path in sorted(by_name.items()):
        if not name.startswith("perf_torch_"):
            continue
        mine_path = by_name.get("perf_" + name[len("perf_torch_"):])
        if mine_path is None:
            continue
        peer, mine = load(path), load(mine_path)
        pairs = []
        for key, impl in sorted(peer.items()):
            if "pytorch" in impl and "ncclkit" in mine.get(key, {}):
                t_mine, t_peer = float(mine[key]["ncclkit"]["time_us"]), float(impl["pytorch"]["time_us"])
                if t_peer > 0:
                    pairs.append((key, t_mine, t_peer))
        print(f"== ncclkit ({mine_path}) against PyTorch ({path})")
        if not pairs:
            print("  no rows in common")
            continue
        ratios = [t_mine / t_peer for _, t_mine, t_peer in pairs]
        faster = sum(1 for r in ratios if r < 1.0)
        print(f"  {len(pairs)} rows; ncclkit faster in {faster}; median time ratio {statistics.median(ratios):.3f} "
              f"(range {min(ratios):.3f} - {max(ratios):.3f}; < 1: ncclkit faster)")
        for collective in sorted({key[0] for key, _, _ in pairs}):
            rows = [(key, a, b) for key, a, b in pairs if key[0] == collective]
            print(f"    {collective}: median ratio {statistics.median(a / b for _, a, b in rows):.3f}, median "
                  f"difference {statistics.median(a - b for _, a, b in rows):+.2f} us over {len(rows)} rows")
        for (collective, placement, size, nranks, *_), t_mine, t_peer in pairs:
            if t_mine >= t_peer:
                print(f"    not faster: {collective} {placement} {size} B: ncclkit {t_mine:.2f} us, "
                      f"PyTorch {t_peer:.2f} us ({t_mine / t_peer:.3f}x)")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1:]))
