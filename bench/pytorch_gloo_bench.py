#!/usr/bin/python3
"""Times PyTorch's gloo backend (torch.distributed) the way bench/perf_gloo times ncclkit.

Same method as bench/perf_engine.hpp: N local processes, for each size and type one
correctness check, -w warm-up calls, then -R rounds of ceil(n/R) timed calls each, ranks lined
up (barrier) before each round; a round's time is host time / calls, averaged over ranks; the
table shows the median over rounds, with nccl-tests' algbw and busbw (all_reduce: 2(n-1)/n).

    /usr/bin/python3 bench/pytorch_gloo_bench.py -p 2 -b 16M -e 64M -f 4 -d float,half

Debian's python3-torch (1.13) is enough: `apt-get install -y python3-torch`.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench_args import parse_size

DTYPES = {"float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16, "double": torch.float64,
          "int32": torch.int32, "int64": torch.int64, "int8": torch.int8, "uint8": torch.uint8}



def worker(rank, world, init_file, args, queue):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    rows = []
    sizes = []
    size = args.minbytes
    while size <= args.maxbytes:
        sizes.append(size)
        size = int(size * args.stepfactor)
    batch = -(-args.iters // args.rounds)
    for dtype_name in args.datatype.split(","):
        dtype = DTYPES[dtype_name]
        element = torch.tensor([], dtype=dtype).element_size()
        for size in sizes:
            count = size // element
            # Correctness: rank r holds r + 1 + (i % 3); the sum is known.
            pattern = torch.arange(count, dtype=torch.int64) % 3
            data = (pattern + rank + 1).to(dtype)
            dist.all_reduce(data)
            expected = (pattern * world + world * (world + 1) // 2).to(dtype)
            wrong = int((data != expected).sum())
            data = torch.ones(count, dtype=dtype)
            for _ in range(args.warmup):
                dist.all_reduce(data)
            samples = []
            for _ in range(args.rounds):
                dist.barrier()
                start = time.perf_counter()
                for _ in range(batch):
                    dist.all_reduce(data)
                elapsed = (time.perf_counter() - start) / batch
                t = torch.tensor([elapsed], dtype=torch.float64)
                dist.all_reduce(t)
                samples.append(float(t[0]) / world)
            rows.append((size, count, dtype_name, statistics.median(samples) * 1e6, wrong))
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-p", "--nprocs", type=int, default=2)
    parser.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("16M"))
    parser.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    parser.add_argument("-f", "--stepfactor", type=float, default=4.0)
    parser.add_argument("-n", "--iters", type=int, default=20)
    parser.add_argument("-w", "--warmup", type=int, default=5)
    parser.add_argument("-R", "--rounds", type=int, default=5)
    parser.add_argument("-d", "--datatype", default="float,half")
    parser.add_argument("--csv", help="also write the rows to this file")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        init_file = os.path.join(folder, "rendezvous")
        queue = mp.get_context("spawn").SimpleQueue()
        mp.spawn(worker, args=(args.nprocs, init_file, args, queue), nprocs=args.nprocs, join=True)
        rows = queue.get()

    n = args.nprocs
    factor = 2.0 * (n - 1) / n
    print(f"# PyTorch {torch.__version__} gloo all_reduce, {n} processes, median of {args.rounds} rounds")
    print("#       size         count      type   redop     time   algbw   busbw #wrong")
    print("#        (B)    (elements)                       (us)  (GB/s)  (GB/s)")
    for size, count, dtype_name, time_us, wrong in rows:
        algbw = size / (time_us * 1e3)
        print(f"{size:12d}  {count:12d}  {dtype_name:>8s}  {'sum':>6s}  {time_us:7.0f}  {algbw:6.2f}  {algbw * factor:6.2f}  {wrong:5d}")
    if args.csv:
        with open(args.csv, "w") as out:
            out.write("implementation,collective,type,nranks,bytes,count,time_us,algbw_gbs,busbw_gbs,wrong\n")
            for size, count, dtype_name, time_us, wrong in rows:
                algbw = size / (time_us * 1e3)
                out.write(f"pytorch-gloo,all_reduce,{dtype_name},{n},{size},{count},{time_us:.3f},{algbw:.4f},"
                          f"{algbw * factor:.4f},{wrong}\n")
    return 0 if all(row[4] == 0 for row in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
