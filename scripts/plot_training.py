#!/usr/bin/env python3
"""Plots a trainer's metrics file (JSON lines, TrainerOptions::metrics_file) as an SVG: the
training loss of each progress interval and the evaluation loss, against the step, with the
evaluation accuracy on a second axis. No dependencies beyond Python.

    scripts/plot_training.py metrics.jsonl out.svg [--title TEXT]
"""
import json
import sys


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    title = argv[argv.index("--title") + 1] if "--title" in argv else "training"
    rows = [json.loads(line) for line in open(argv[1]) if line.strip()]
    train = [(r["step"], r["loss"]) for r in rows if r["kind"] == "train"]
    evals = [(r["step"], r["loss"], r["accuracy"]) for r in rows if r["kind"] == "eval"]
    if not train:
        print("no training rows in", argv[1])
        return 1
    width, height, left, right, top, bottom = 640, 360, 60, 60, 40, 50
    steps = max(s for s, *_ in train + [(e[0], e[1]) for e in evals])
    loss_max = max(l for _, l in train + [(e[0], e[1]) for e in evals]) * 1.05
    x = lambda s: left + (width - left - right) * s / steps
    y = lambda l: top + (height - top - bottom) * (1 - l / loss_max)
    ya = lambda a: top + (height - top - bottom) * (1 - a)  # accuracy 0..1
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>']
    bottom_y, right_x = height - bottom, width - right
    out.append(f'<line x1="{left}" y1="{bottom_y}" x2="{right_x}" y2="{bottom_y}" stroke="black"/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom_y}" stroke="black"/>')
    out.append(f'<line x1="{right_x}" y1="{top}" x2="{right_x}" y2="{bottom_y}" stroke="black"/>')
    for i in range(5):
        s = steps * i / 4
        out.append(f'<text x="{x(s):.1f}" y="{bottom_y + 16}" text-anchor="middle">{s:.0f}</text>')
        l = loss_max * i / 4
        out.append(f'<text x="{left - 6}" y="{y(l) + 4:.1f}" text-anchor="end">{l:.2f}</text>')
        out.append(f'<text x="{right_x + 6}" y="{ya(i / 4) + 4:.1f}">{25 * i}%</text>')
    out.append(f'<text x="{width / 2}" y="{height - 12}" text-anchor="middle">step</text>')
    out.append(f'<text x="14" y="{height / 2}" transform="rotate(-90 14 {height / 2})" text-anchor="middle">loss</text>')

    def path(points, color, dash=""):
        d = " ".join(f'{"M" if i == 0 else "L"}{px:.1f},{py:.1f}' for i, (px, py) in enumerate(points))
        return f'<path d="{d}" fill="none" stroke="{color}" stroke-width="2" {dash}/>'

    out.append(path([(x(s), y(l)) for s, l in train], "#1f77b4"))
    if evals:
        out.append(path([(x(s), y(l)) for s, l, _ in evals], "#ff7f0e"))
        out.append(path([(x(s), ya(a)) for s, _, a in evals], "#2ca02c", 'stroke-dasharray="4 3"'))
    legend = [("training loss", "#1f77b4", ""), ("test loss", "#ff7f0e", ""), ("test accuracy (right)", "#2ca02c", 'stroke-dasharray="4 3"')]
    for i, (name, color, dash) in enumerate(legend[: 1 + 2 * bool(evals)]):
        ly = top + 10 + 16 * i
        out.append(f'<line x1="{right_x - 170}" y1="{ly}" x2="{right_x - 145}" y2="{ly}" stroke="{color}" stroke-width="2" {dash}/>')
        out.append(f'<text x="{right_x - 140}" y="{ly + 4}">{name}</text>')
    out.append("</svg>")
    open(argv[2], "w").write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
