"""Argument helpers shared by the Python benchmarks (pytorch_gloo_bench.py, pytorch_nccl_bench.py)."""

import argparse


def parse_size(text):
    """A byte count with an optional K, M or G suffix (powers of 1024), as perf_nccl's -b/-e take."""
    units = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    number = text.rstrip("KMGB")
    suffix = text[len(number):][:1]
    try:
        return int(float(number) * units[suffix])
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (a number with an optional K, M or G)") from None
