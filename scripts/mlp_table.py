#!/usr/bin/env python3
"""The GPU trainer benchmark's table: train_mlp's and ddp_mlp_bench.py's CSV rows side by side.

    python3 scripts/mlp_table.py mlp_ncclkit_p1.csv mlp_ncclkit_p2.csv mlp_torch_p1.csv mlp_torch_p2.csv

Reads rows of impl,gpus,batch,codec,step_ms,samples_per_s,reduce_ms,step_mean_ms,depth,width,
accumulation,optimizer,bucket (the last row wins where one (impl, gpus, batch, codec, optimizer,
accumulation) appears twice) and prints a markdown table with, per row (an impl "ncclkit/NAME" is
train_mlp --label NAME: an ablation's variant):
  1-GPU step    what the row is measured against, at the same per-GPU batch, optimizer and
                accumulation: ncclkit's rows against ncclkit's one-GPU row (float32 gradients: at
                one GPU a codec has nothing to compress; "ncclkit/NAME" against its own 1-GPU row,
                else ncclkit's), ddp and ddp-fp16hook against torch-1gpu
                (the plain model, no DDP)
  efficiency    1-GPU step / step
  hidden        the share of communication hidden, 1 - (step - 1-GPU step) / reduction alone
                (below 0 where overlap costs more than it hides; multi-GPU rows only)
  vs PyTorch    samples/s over the best PyTorch row at the same GPUs and batch (ddp or
                ddp-fp16hook; torch-1gpu at one GPU)

Fails loudly: a file that cannot be read, a missing column or a field that is not a number ends
the script at once (exit 1, naming the file and line); rows of different models (depth, width),
a multi-GPU row without its 1-GPU row or its reduction alone, or GPUs and batches where one side
has rows and the other none are listed after the table, which is still printed, and the exit
status is 1.

scripts/mlp_plot.py imports it: the reading (read_rows) and the pairing of rows (one_gpu_row,
efficiency) are this file's, for both.
"""

import csv
import sys

TORCH = ("ddp", "ddp-fp16hook", "torch-1gpu")
COLUMNS = ("impl", "gpus", "batch", "codec", "step_ms", "samples_per_s", "reduce_ms", "depth", "width",
           "accumulation", "optimizer")


class InputError(Exception):
    """A file that cannot be read as the benchmark's CSV."""


def read_rows(paths):
    rows = {}
    for path in paths:
        try:
            f = open(path, newline="")
        except OSError as e:
            raise InputError(f"cannot read {path}: {e.strerror}") from None
        with f:
            reader = csv.DictReader(f)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise InputError(f"{path}: no column {', '.join(missing)} (is it a CSV of train_mlp or "
                                 "ddp_mlp_bench.py?)")
            for row in reader:
                where = f"{path}:{reader.line_num}"
                try:
                    for field in ("gpus", "batch", "depth", "width", "accumulation"):
                        row[field] = int(row[field])
                    for field in ("step_ms", "samples_per_s"):
                        row[field] = float(row[field])
                    row["reduce_ms"] = float(row["reduce_ms"]) if row["reduce_ms"] else None
                except (TypeError, ValueError):
                    raise InputError(f"{where}: a field is not a number: {row}") from None
                if row["gpus"] < 1 or row["batch"] < 1 or not row["step_ms"] > 0:
                    raise InputError(f"{where}: gpus, batch and step_ms must be above 0: {row}")
                row["where"] = where
                key = (row["impl"], row["gpus"], row["batch"], row["codec"], row["optimizer"], row["accumulation"])
                rows[key] = row
    return list(rows.values())


def family(row):
    return "torch" if row["impl"] in TORCH else row["impl"]


def one_gpu_row(rows, row):
    """The 1-GPU row `row` is measured against, or None."""
    # An ablation's row ("ncclkit/whole") is measured against its own 1-GPU row where it has one,
    # else against its implementation's ("ncclkit").
    own = "torch-1gpu" if row["impl"] in TORCH else row["impl"]
    base = own.split("/")[0]
    candidates = [r for r in rows if r["impl"] in (own, base) and r["gpus"] == 1 and r["batch"] == row["batch"]
                  and r["optimizer"] == row["optimizer"] and r["accumulation"] == row["accumulation"]]
    candidates.sort(key=lambda r: (r["impl"] != own, r["codec"] != "none"))
    return candidates[0] if candidates else None


def best_torch(rows, row):
    wanted = ("torch-1gpu",) if row["gpus"] == 1 else ("ddp", "ddp-fp16hook")
    values = [r["samples_per_s"] for r in rows if r["impl"] in wanted and r["gpus"] == row["gpus"]
              and r["batch"] == row["batch"] and r["optimizer"] == row["optimizer"]]
    return max(values) if values else None


def efficiency(rows, row):
    """Scaling efficiency of `row`: its 1-GPU row's step / its step (1.0 at one GPU), or None
    where there is no 1-GPU row to measure it against."""
    one = one_gpu_row(rows, row)
    return one["step_ms"] / row["step_ms"] if one else None


def derived(rows, row):
    """(1-GPU step, efficiency, hidden, vs PyTorch) of `row`, None where there is no input."""
    one = one_gpu_row(rows, row)
    one_step = one["step_ms"] if one else None
    scaling = efficiency(rows, row)
    hidden = None
    if row["gpus"] > 1 and one_step and row["reduce_ms"]:
        hidden = 1 - (row["step_ms"] - one_step) / row["reduce_ms"]
    torch_best = best_torch(rows, row)
    versus = row["samples_per_s"] / torch_best if torch_best else None
    return one_step, scaling, hidden, versus


def describe(row):
    """The row for a message: what it measured and where it was read."""
    return f"{row['impl']} {row['codec']} at {row['gpus']} GPU(s), batch {row['batch']} ({row['where']})"


def mixed_models(rows):
    """A line naming the models when the rows are of more than one (depth x width), else None."""
    shapes = sorted({(r["depth"], r["width"]) for r in rows})
    if len(shapes) < 2:
        return None
    return ("rows of different models (depth x width: " + ", ".join(f"{d} x {w}" for d, w in shapes) +
            "); give the files of one run")


def without_one_gpu_row(rows):
    """A line for each row that has no 1-GPU row to measure it against."""
    found = []
    for r in rows:
        if one_gpu_row(rows, r) is None:
            baseline = "torch-1gpu" if r["impl"] in TORCH else f"{r['impl'].split('/')[0]} at 1 GPU"
            found.append(f"{describe(r)}: no {baseline} row at that batch to measure it against")
    return found


def problems(rows):
    """What is missing for the table to be whole: one line each."""
    models = mixed_models(rows)
    found = [models] if models else []
    found += without_one_gpu_row(rows)
    for r in rows:
        if r["gpus"] > 1 and r["reduce_ms"] is None:
            found.append(f"{describe(r)}: no reduction alone (reduce_ms), so no share hidden")
    for gpus, batch in sorted({(r["gpus"], r["batch"]) for r in rows}):
        sides = {family(r) for r in rows if r["gpus"] == gpus and r["batch"] == batch}
        if "torch" not in sides:
            found.append(f"{gpus} GPU(s), batch {batch}: no PyTorch row to compare with")
        if sides == {"torch"}:
            found.append(f"{gpus} GPU(s), batch {batch}: only PyTorch rows, none of train_mlp")
    return found


def report_incomplete(what, found):
    """Lists `found` (problem lines) on stderr after `what` ("mlp_table: the table"); the exit
    status: 1 when there are any, else 0."""
    if not found:
        return 0
    sys.stdout.flush()
    print(f"{what} is incomplete ({len(found)} problem(s)):", file=sys.stderr)
    for line in found:
        print(f"  {line}", file=sys.stderr)
    return 1


def table(rows):
    rows = sorted(rows, key=lambda r: (r["batch"], r["gpus"], r["impl"] in TORCH, r["impl"], r["codec"]))
    lines = ["| impl | GPUs | batch/GPU | gradients | step ms | 1-GPU step ms | efficiency | samples/s | "
             "reduction alone ms | hidden | vs PyTorch |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]

    def cell(value, form, suffix=""):
        return "-" if value is None else format(value, form) + suffix

    for r in rows:
        one_step, scaling, hidden, versus = derived(rows, r)
        reduce_ms = r["reduce_ms"] if r["gpus"] > 1 else None
        lines.append(f"| {r['impl']} | {r['gpus']} | {r['batch']} | {r['codec']} | {r['step_ms']:.3f} | "
                     f"{cell(one_step, '.3f')} | {cell(scaling, '.2f')} | {r['samples_per_s']:,.0f} | "
                     f"{cell(reduce_ms, '.3f')} | {cell(hidden, '.2f')} | {cell(versus, '.2f', 'x')} |")
    return "\n".join(lines)


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) >= 2 else 2
    try:
        rows = read_rows(argv[1:])
    except InputError as e:
        print(f"mlp_table: {e}", file=sys.stderr)
        return 1
    if not rows:
        print("mlp_table: no rows in " + ", ".join(argv[1:]), file=sys.stderr)
        return 1
    print("GPU trainer benchmark (efficiency = 1-GPU step / step, each against its own 1-GPU step; "
          "hidden = 1 - (step - 1-GPU step) / reduction alone; vs PyTorch = samples/s / PyTorch's best):")
    print(table(rows))
    return report_incomplete("mlp_table: the table", problems(rows))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
