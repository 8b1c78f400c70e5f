#!/usr/bin/env python3
"""Draws NCCLKIT_TIMELINE traces (Chrome trace JSON, one file per rank, or a merged one) as an
SVG picture: a row per rank and lane (host, compute stream, comm stream), a box per phase, a
tick per instant. For docs and reviews; Perfetto is the place to explore a trace.

    tools/timeline_svg.py trace.rank0.json trace.rank1.json -o docs/timeline.svg
    tools/timeline_svg.py trace.all.json --steps 2 -o picture.svg

--steps N keeps the last N steps of each file (a step's events carry args.step). Plain Python,
no plotting library. A file that is not a trace is an error naming it.
"""

import argparse
import json
import sys
from xml.sax.saxutils import escape

# One colour per phase name's first word; anything else is grey.
COLOURS = {
    "step": "#d9d9d9", "finish": "#bdbdbd", "backward": "#c7e9c0", "gradients": "#a1d99b",
    "pack": "#fdd0a2", "unpack": "#fdae6b", "encode": "#9ecae1", "decode": "#6baed6",
    "count": "#c6dbef", "all_reduce": "#e6550d", "rerun": "#a63603", "all_gather": "#fd8d3c",
}
ROW, LABEL, WIDTH = 22, 190, 1100


def load(paths):
    events, lanes, ranks = [], {}, {}
    for path in paths:
        try:
            with open(path) as f:
                trace = json.load(f)
            items = trace["traceEvents"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            sys.exit(f"timeline_svg: {path} is not a readable trace ({error})")
        for e in items:
            if e.get("ph") == "M" and e.get("name") == "thread_name":
                lanes[(e["pid"], e["tid"])] = e["args"]["name"]
            elif e.get("ph") == "M" and e.get("name") == "process_name":
                ranks[e["pid"]] = e["args"]["name"]
            elif e.get("ph") in ("X", "i"):
                events.append(e)
    return events, lanes, ranks


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", help="trace files (NCCLKIT_TIMELINE's, or merged)")
    parser.add_argument("-o", "--output", required=True, help="the SVG file to write")
    parser.add_argument("--steps", type=int, default=0, help="keep only the last N steps (0: all)")
    parser.add_argument("--title", default="", help="a line above the picture")
    args = parser.parse_args()
    events, lanes, ranks = load(args.traces)
    if args.steps > 0:
        steps = sorted({e.get("args", {}).get("step") for e in events if "step" in e.get("args", {})})
        keep = set(steps[-args.steps:])
        events = [e for e in events if e.get("args", {}).get("step") in keep]
    if not events:
        sys.exit("timeline_svg: no events to draw")
    start = min(e["ts"] for e in events)
    end = max(e["ts"] + e.get("dur", 0) for e in events)
    span = max(end - start, 1e-3)
    rows = sorted({(e["pid"], e["tid"]) for e in events})
    height = 40 + ROW * len(rows) + 40

    def x(ts):
        return LABEL + (ts - start) / span * (WIDTH - LABEL - 10)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           'font-family="sans-serif" font-size="11">',
           f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
           f'<text x="10" y="16" font-size="13">{escape(args.title)}</text>']
    for i, key in enumerate(rows):
        y = 28 + i * ROW
        rank = " ".join(ranks.get(key[0], "rank " + str(key[0])).split(" ")[:2])  # "rank 0", no label
        name = f'{rank}, {lanes.get(key, "lane " + str(key[1]))}'
        out.append(f'<text x="6" y="{y + 15}">{escape(name)}</text>')
        out.append(f'<line x1="{LABEL}" y1="{y + ROW}" x2="{WIDTH - 10}" y2="{y + ROW}" stroke="#eeeeee"/>')
    row_of = {key: i for i, key in enumerate(rows)}
    for e in sorted(events, key=lambda e: -e.get("dur", 0)):  # long boxes first, short ones on top
        y = 28 + row_of[(e["pid"], e["tid"])] * ROW
        title = f'{e["name"]} {e.get("dur", 0) / 1000:.3f} ms'
        if e["ph"] == "i":
            out.append(f'<line x1="{x(e["ts"]):.1f}" y1="{y + 3}" x2="{x(e["ts"]):.1f}" y2="{y + ROW - 3}" '
                       f'stroke="#333333"><title>{escape(e["name"])}</title></line>')
            continue
        colour = COLOURS.get(e["name"].split(" ")[0], "#969696")
        w = max(x(e["ts"] + e["dur"]) - x(e["ts"]), 0.8)
        out.append(f'<rect x="{x(e["ts"]):.1f}" y="{y + 3}" width="{w:.1f}" height="{ROW - 6}" fill="{colour}" '
                   f'stroke="#555555" stroke-width="0.3"><title>{escape(title)}</title></rect>')
    axis = 28 + ROW * len(rows) + 14
    for k in range(11):
        ts = start + span * k / 10
        out.append(f'<text x="{x(ts):.1f}" y="{axis}" text-anchor="middle">{(ts - start) / 1000:.2f}</text>')
    out.append(f'<text x="{WIDTH - 10}" y="{axis + 14}" text-anchor="end">ms</text>')
    legend_x = LABEL
    for name, colour in COLOURS.items():
        out.append(f'<rect x="{legend_x}" y="{axis + 6}" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{legend_x + 13}" y="{axis + 15}">{name}</text>')
        legend_x += 13 + 7 * len(name) + 12
    out.append("</svg>")
    with open(args.output, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"timeline_svg: {len(events)} events in {len(rows)} rows -> {args.output}")


if __name__ == "__main__":
    main()
