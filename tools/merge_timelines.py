#!/usr/bin/env python3
"""Merges the per-rank timelines of a run (NCCLKIT_TIMELINE=prefix writes one Chrome trace per
rank, <prefix>.rank<R>.json) into one file, so that Perfetto (https://ui.perfetto.dev, "Open
trace file") or chrome://tracing shows every rank, one process per rank, on one time axis.

    tools/merge_timelines.py /tmp/run/trace            # every /tmp/run/trace.rank*.json
    tools/merge_timelines.py /tmp/run/trace -o all.json

Each rank's times are already microseconds of its system clock, so ranks of one node line up
exactly and ranks of several nodes as well as their clocks agree (NTP: about a millisecond).
A file that is not a trace is an error naming it; nothing is written then.
"""

import argparse
import glob
import json
import re
import sys


def rank_files(prefix):
    """<prefix>.rank<R>.json (the first GradientSync of each rank), in rank order."""
    pattern = re.compile(re.escape(prefix) + r"\.rank(\d+)\.json$")
    found = []
    for path in glob.glob(glob.escape(prefix) + ".rank*.json"):
        match = pattern.match(path)
        if match:
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefix", help="the value NCCLKIT_TIMELINE had")
    parser.add_argument("-o", "--output", help="where to write (default: <prefix>.all.json)")
    args = parser.parse_args()
    files = rank_files(args.prefix)
    if not files:
        sys.exit(f"merge_timelines: no file {args.prefix}.rank<R>.json; give the prefix NCCLKIT_TIMELINE had")
    events, other = [], {}
    for path in files:
        try:
            with open(path) as f:
                trace = json.load(f)
            events.extend(trace["traceEvents"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            sys.exit(f"merge_timelines: {path} is not a readable trace ({error}); was the run cut short?")
        other.update(trace.get("otherData", {}))
    output = args.output or args.prefix + ".all.json"
    with open(output, "w") as f:
        json.dump({"displayTimeUnit": "ms", "otherData": other, "traceEvents": events}, f)
    print(f"merge_timelines: {len(files)} ranks, {len(events)} events -> {output}")


if __name__ == "__main__":
    main()
