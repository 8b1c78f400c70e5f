#!/usr/bin/env python3
"""The GPU trainer benchmark's scaling efficiency against the GPU count, as an SVG.

    python3 scripts/mlp_plot.py OUT.svg mlp_ncclkit_p1.csv mlp_ncclkit_p2.csv mlp_torch_p1.csv ... [--title TEXT]

Reads the CSV rows that scripts/mlp_table.py reads (train_mlp's and bench/ddp_mlp_bench.py's),
measured the way the table measures them: efficiency = 1-GPU step / N-GPU step at the same
per-GPU batch, optimizer and accumulation, each side against its own 1-GPU step (ncclkit's rows
against ncclkit's float32 one-GPU row, DDP's against torch-1gpu), so every line starts at 1.0 at
one GPU. One line per series (ncclkit fp32, fp16, bf16: solid; DDP and DDP + fp16 hook: dashed),
one panel per per-GPU batch, the GPU counts on a log2 axis; the dotted line at 1.0 is perfect
scaling. No dependencies beyond Python.

Fails loudly (exit 1, a line saying why): a file that cannot be read or is not the benchmark's
CSV, no multi-GPU row, or no multi-GPU row with its 1-GPU row, and then writes nothing. Rows
without their 1-GPU row (left out of the plot) or of different models are listed after the SVG
is written, and the exit status is 1, as the table does.
"""

import argparse
import math
import os
import sys
from xml.sax.saxutils import escape

sys.dont_write_bytecode = True  # no __pycache__ left in scripts/ by the import below
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mlp_table  # noqa: E402  (the rows and their pairing: one reading for the table and the plot)

SOLID, DASHED = "", 'stroke-dasharray="6 4"'
CODEC_ORDER = {"none": 0, "fp16": 1, "bf16": 2}
COLORS = {("ncclkit", "none"): "#1f77b4", ("ncclkit", "fp16"): "#2ca02c", ("ncclkit", "bf16"): "#9467bd",
          ("ddp", "none"): "#d62728", ("ddp-fp16hook", "fp16"): "#ff7f0e"}
SPARE_COLORS = ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def series_name(impl, codec):
    if impl == "ddp":
        return "DDP"
    if impl == "ddp-fp16hook":
        return "DDP + fp16 hook"
    return f"{impl} {'fp32' if codec == 'none' else codec}"


def collect(rows):
    """{batch: {series key: [(gpus, efficiency)]}} of the rows that have a 1-GPU row, and the
    labels of the series keys. A series is (impl, codec, optimizer, accumulation); its 1-GPU point
    is its 1-GPU row's, 1.0 by definition."""
    panels = {}
    for r in rows:
        scaling = mlp_table.efficiency(rows, r) if r["gpus"] > 1 else None
        if scaling is None:
            continue
        key = (r["impl"], r["codec"], r["optimizer"], r["accumulation"])
        points = panels.setdefault(r["batch"], {}).setdefault(key, {1: 1.0})
        points[r["gpus"]] = scaling
    optimizers = {r["optimizer"] for r in rows}
    accumulations = {r["accumulation"] for r in rows}
    labels = {}
    for series in panels.values():
        for impl, codec, optimizer, accumulation in series:
            label = series_name(impl, codec)
            if len(optimizers) > 1:
                label += f", {optimizer}"
            if len(accumulations) > 1:
                label += f", accumulation {accumulation}"
            labels[(impl, codec, optimizer, accumulation)] = label
    ordered = {}
    for batch, series in sorted(panels.items()):
        ordered[batch] = {key: sorted(series[key].items()) for key in sorted(series, key=order)}
    return ordered, labels


def order(key):
    impl, codec, optimizer, accumulation = key
    return (impl in mlp_table.TORCH, impl, CODEC_ORDER.get(codec, len(CODEC_ORDER)), codec, optimizer, accumulation)


def styles(keys):
    """{series key: (color, dash)}: a fixed color for the benchmark's own series, the spare ones in
    turn for others; PyTorch's dashed."""
    found = {}
    spare = 0
    for key in sorted(keys, key=order):
        impl, codec = key[0], key[1]
        color = COLORS.get((impl, codec))
        if color is None:
            color, spare = SPARE_COLORS[spare % len(SPARE_COLORS)], spare + 1
        found[key] = (color, DASHED if impl in mlp_table.TORCH else SOLID)
    return found


def svg(panels, labels, title, subtitle):
    counts = sorted({gpus for series in panels.values() for points in series.values() for gpus, _ in points})
    highest = max(e for series in panels.values() for points in series.values() for _, e in points)
    top_value = max(1.2, math.ceil(highest * 1.05 / 0.2) * 0.2)
    panel_width, panel_height, gap, left, top, bottom, legend_width = 300, 260, 40, 60, 64, 50, 190
    width = left + len(panels) * panel_width + (len(panels) - 1) * gap + 20 + legend_width
    height = top + panel_height + bottom
    lowest_log, highest_log = math.log2(counts[0]), math.log2(counts[-1])
    span_log = highest_log - lowest_log or 1.0
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           'font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>',
           f'<text x="{width / 2}" y="38" text-anchor="middle" fill="#555">{escape(subtitle)}</text>']
    keys = sorted({key for series in panels.values() for key in series}, key=order)
    style = styles(keys)
    for index, (batch, series) in enumerate(panels.items()):
        x0 = left + index * (panel_width + gap)
        inner = 12  # room between the axis and the first and last GPU count
        x = lambda gpus: x0 + inner + (panel_width - 2 * inner) * (math.log2(gpus) - lowest_log) / span_log
        y = lambda value: top + panel_height * (1 - value / top_value)
        x1, y_bottom = x0 + panel_width, top + panel_height
        out.append(f'<text x="{x0 + panel_width / 2}" y="{top - 8}" text-anchor="middle">batch {batch} per GPU</text>')
        steps = round(top_value / 0.2)
        for i in range(steps + 1):
            value = 0.2 * i
            out.append(f'<line x1="{x0}" y1="{y(value):.1f}" x2="{x1}" y2="{y(value):.1f}" stroke="#e5e5e5"/>')
            if index == 0:
                out.append(f'<text x="{x0 - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{value:.1f}</text>')
        out.append(f'<line x1="{x0}" y1="{y(1):.1f}" x2="{x1}" y2="{y(1):.1f}" stroke="#888" stroke-dasharray="2 3"/>')
        out.append(f'<line x1="{x0}" y1="{y_bottom}" x2="{x1}" y2="{y_bottom}" stroke="black"/>')
        out.append(f'<line x1="{x0}" y1="{top}" x2="{x0}" y2="{y_bottom}" stroke="black"/>')
        for gpus in counts:
            out.append(f'<line x1="{x(gpus):.1f}" y1="{y_bottom}" x2="{x(gpus):.1f}" y2="{y_bottom + 4}" '
                       'stroke="black"/>')
            out.append(f'<text x="{x(gpus):.1f}" y="{y_bottom + 16}" text-anchor="middle">{gpus}</text>')
        out.append(f'<text x="{x0 + panel_width / 2}" y="{height - 12}" text-anchor="middle">GPUs</text>')
        for key, points in series.items():
            color, dash = style[key]
            coordinates = " ".join(f"{x(gpus):.1f},{y(value):.1f}" for gpus, value in points)
            values = ", ".join(f"{gpus} GPU{'s' if gpus > 1 else ''} {value:.2f}" for gpus, value in points)
            out.append(f'<polyline points="{coordinates}" fill="none" stroke="{color}" stroke-width="2" {dash}>'
                       f'<title>{escape(labels[key])}, batch {batch}: {values}</title></polyline>')
            for gpus, value in points:
                out.append(f'<circle cx="{x(gpus):.1f}" cy="{y(value):.1f}" r="3" fill="{color}"/>')
    out.append(f'<text x="16" y="{top + panel_height / 2}" transform="rotate(-90 16 {top + panel_height / 2})" '
               'text-anchor="middle">efficiency (1-GPU step / N-GPU step)</text>')
    legend_x = width - legend_width
    for i, key in enumerate(keys):
        color, dash = style[key]
        ly = top + 10 + 18 * i
        out.append(f'<line x1="{legend_x}" y1="{ly}" x2="{legend_x + 28}" y2="{ly}" stroke="{color}" stroke-width="2" '
                   f'{dash}/>')
        out.append(f'<text x="{legend_x + 34}" y="{ly + 4}">{escape(labels[key])}</text>')
    ly = top + 10 + 18 * len(keys)
    out.append(f'<line x1="{legend_x}" y1="{ly}" x2="{legend_x + 28}" y2="{ly}" stroke="#888" stroke-dasharray="2 3"/>')
    out.append(f'<text x="{legend_x + 34}" y="{ly + 4}">perfect scaling</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv):
    parser = argparse.ArgumentParser(prog="mlp_plot.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", metavar="OUT.svg", help="the SVG to write")
    parser.add_argument("files", metavar="FILE.csv", nargs="+", help="train_mlp's and ddp_mlp_bench.py's CSVs")
    parser.add_argument("--title", default="GPU trainer benchmark: scaling efficiency", help="the plot's title")
    args = parser.parse_args(argv[1:])

    def fail(message):
        print(f"mlp_plot: {message}", file=sys.stderr)
        return 1

    if not args.out.endswith(".svg"):
        return fail(f"the first argument is the SVG to write, and ends in .svg, not {args.out!r} "
                    "(usage: mlp_plot.py OUT.svg FILE.csv [FILE.csv ...])")
    try:
        rows = mlp_table.read_rows(args.files)
    except mlp_table.InputError as e:
        return fail(str(e))
    if not any(r["gpus"] > 1 for r in rows):
        return fail("no multi-GPU rows in " + ", ".join(args.files) + ": nothing to plot against the 1-GPU "
                    "step (give the CSVs of the N-GPU runs too)")
    panels, labels = collect(rows)
    if not panels:
        return fail("no multi-GPU row has its 1-GPU row (of its side, ncclkit or PyTorch, at the same batch, "
                    "optimizer and accumulation) in " + ", ".join(args.files) + ": give the CSVs of the 1-GPU runs too")
    shapes = sorted({(r["depth"], r["width"]) for r in rows})
    model = ", ".join(f"{d} x {w}" for d, w in shapes)
    subtitle = f"MLP {model} (depth x width); each side against its own 1-GPU step at the same per-GPU batch"
    try:
        with open(args.out, "w") as f:
            f.write(svg(panels, labels, args.title, subtitle))
    except OSError as e:
        return fail(f"cannot write {args.out}: {e.strerror}")
    models = mlp_table.mixed_models(rows)
    found = ([models] if models else []) + mlp_table.without_one_gpu_row(rows)
    return mlp_table.report_incomplete(f"mlp_plot: wrote {args.out}, but it", found)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
