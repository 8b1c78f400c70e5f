#!/usr/bin/env python3
"""Plots bus bandwidth against message size from perf engine CSV files (perf_nccl, perf_gloo).

    scripts/plot_busbw.py OUT.png FILE.csv [FILE.csv ...] [--title TEXT]

One panel per collective; one line per (implementation, placement, file label). Rows come
from the engine's CSV columns: collective, implementation, placement, nranks, bytes, busbw_gbs.
Needs matplotlib (present on the GPU machines).
"""
import csv
import os
import sys


def main(argv):
    title = None
    args = []
    i = 0
    while i < len(argv):
        if argv[i] == "--title" and i + 1 < len(argv):
            title = argv[i + 1]
            i += 2
        else:
            args.append(argv[i])
            i += 1
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, files = args[0], args[1:]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {}  # collective -> label -> [(bytes, busbw)]
    for path in files:
        tag = os.path.splitext(os.path.basename(path))[0]
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                label = f"{row['implementation']} {row['placement']} ({tag}, {row['nranks']} ranks)"
                series.setdefault(row["collective"], {}).setdefault(label, []).append(
                    (int(row["bytes"]), float(row["busbw_gbs"])))
    if not series:
        print("no rows", file=sys.stderr)
        return 1
    names = sorted(series)
    columns = min(3, len(names))
    rows = (len(names) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(6 * columns, 4.2 * rows), squeeze=False)
    for index, name in enumerate(names):
        axis = axes[index // columns][index % columns]
        for label, points in sorted(series[name].items()):
            points.sort()
            style = "--" if label.startswith("raw") else "-"
            axis.plot([p[0] for p in points], [p[1] for p in points], style, marker=".", label=label)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("size (bytes)")
        axis.set_ylabel("bus bandwidth (GB/s)")
        axis.set_title(name)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=6)
    for index in range(len(names), rows * columns):
        axes[index // columns][index % columns].axis("off")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
