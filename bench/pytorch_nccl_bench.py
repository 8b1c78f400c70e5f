#!/usr/bin/env python3
"""Times PyTorch's NCCL process group (torch.distributed) the way bench/perf_nccl times ncclkit.

The peer side of docs/performance.md's NCCL tables: the same method as bench/perf_engine.hpp, so the rows can
be set beside perf_nccl's (scripts/perf_targets.py does). N local processes, one GPU each;
for each collective and size: one correctness check against a known result, -w warm-up calls,
then -R rounds of ceil(n/R) back-to-back calls, each round timed on the host from the first
call to torch.cuda.synchronize() and lined up by a barrier before it; a round's time is host
time / calls, averaged over ranks; the row is the median over rounds. Sizes and busbw follow
nccl-tests (all_gather / reduce_scatter / all_to_all: size is the whole buffer; busbw factors
all_reduce 2(n-1)/n, all_gather / reduce_scatter / all_to_all (n-1)/n, broadcast 1).

Placements are those PyTorch's API offers: all_reduce and broadcast work in place only,
all_to_all_single out of place only, all_gather_into_tensor / reduce_scatter_tensor both
(in place: the input is this rank's part of the output, or the output this rank's part of
the input, which NCCL treats as in place). float32, sum, root 0.

    NCCL_NVLS_ENABLE=0 python3 bench/pytorch_nccl_bench.py -p 4 -b 8 -e 64K -f 2 -n 2000 -R 20 \
        --csv perf_torch_small.csv

Needs a PyTorch with CUDA and NCCL (the GPU machines have one); exits 77 when there is none
or fewer GPUs than -p, so that scripts can report it as skipped.
"""

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time

from bench_args import parse_size

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
PLACEMENTS = {"all_reduce": ("in-place",), "broadcast": ("in-place",), "all_to_all": ("out-of-place",),
              "all_gather": ("out-of-place", "in-place"), "reduce_scatter": ("out-of-place", "in-place")}
FACTORS = {"all_reduce": lambda n: 2.0 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
           "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}
ELEMENT = 4  # float32



def shape(collective, size, n):
    """(count per part or in total, total elements of the big buffer, bytes) as in perf_engine."""
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        count = size // ELEMENT // n
        return count, count * n, count * n * ELEMENT
    count = size // ELEMENT
    return count, count, count * ELEMENT


def make_call(torch, dist, collective, placement, count, total, rank, n, device):
    """Buffers and a zero-argument function issuing one call, plus a checker of its result."""
    f32 = torch.float32
    if collective == "all_reduce":
        data = torch.empty(total, dtype=f32, device=device)
        def fill():
            data.copy_(torch.arange(total, device=device, dtype=torch.int64).remainder(3).to(f32) + (rank + 1))
        def check():
            expected = torch.arange(total, device=device, dtype=torch.int64).remainder(3).to(f32) * n + n * (n + 1) // 2
            return int((data != expected).sum())
        return fill, (lambda: dist.all_reduce(data)), check
    if collective == "broadcast":
        data = torch.empty(total, dtype=f32, device=device)
        def fill():
            data.fill_(rank + 1)
        return fill, (lambda: dist.broadcast(data, src=0)), (lambda: int((data != 1).sum()))
    if collective == "all_to_all":
        send = torch.empty(total, dtype=f32, device=device)
        recv = torch.empty(total, dtype=f32, device=device)
        def fill():
            # Block j of rank r holds r * n + j; after the exchange block j holds j * n + r.
            send.copy_((torch.arange(n, device=device, dtype=f32) + rank * n).repeat_interleave(count))
            recv.fill_(-1)
        def check():
            expected = (torch.arange(n, device=device, dtype=f32) * n + rank).repeat_interleave(count)
            return int((recv != expected).sum())
        return fill, (lambda: dist.all_to_all_single(recv, send)), check
    big = torch.empty(total, dtype=f32, device=device)
    part = big[rank * count:(rank + 1) * count] if placement == "in-place" else torch.empty(count, dtype=f32, device=device)
    if collective == "all_gather":
        def fill():
            big.fill_(-1)
            part.fill_(rank + 1)
        def check():
            expected = torch.arange(1, n + 1, device=device, dtype=f32).repeat_interleave(count)
            return int((big != expected).sum())
        return fill, (lambda: dist.all_gather_into_tensor(big, part)), check
    # reduce_scatter: part r of every rank's input holds r + rank + 1; the sum lands in part.
    def fill():
        big.copy_(torch.arange(n, device=device, dtype=f32).repeat_interleave(count) + (rank + 1))
    def check():
        return int((part != rank * n + n * (n + 1) // 2).sum())
    return fill, (lambda: dist.reduce_scatter_tensor(part, big)), check


def worker(rank, n, init_file, args, queue):
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method="file://" + init_file, rank=rank, world_size=n, device_id=device)
    sizes, size = [], args.minbytes
    while size <= args.maxbytes:
        sizes.append(size)
        size = int(size * args.stepfactor)
    batch = -(-args.iters // args.rounds)
    rows = []
    for collective in args.op.split(","):
        for size in sizes:
            count, total, nbytes = shape(collective, size, n)
            if count == 0:
                continue
            for placement in PLACEMENTS[collective]:
                fill, call, check = make_call(torch, dist, collective, placement, count, total, rank, n, device)
                fill()
                call()
                torch.cuda.synchronize()
                wrong = check() if args.check else -1
                for _ in range(args.warmup):
                    call()
                torch.cuda.synchronize()
                samples = []
                for _ in range(args.rounds):
                    dist.barrier(device_ids=[rank])
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    for _ in range(batch):
                        call()
                    torch.cuda.synchronize()
                    elapsed = (time.perf_counter() - start) / batch
                    t = torch.tensor([elapsed, max(wrong, 0)], dtype=torch.float64, device=device)
                    dist.all_reduce(t)
                    samples.append(float(t[0]) / n)
                    wrong_all = int(t[1]) if wrong >= 0 else -1
                rows.append((collective, placement, nbytes, count, statistics.median(samples) * 1e6, wrong_all))
    if rank == 0:
        version = torch.cuda.nccl.version()  # a tuple in recent PyTorch, an int in old ones
        queue.put((rows, torch.__version__, ".".join(map(str, version)) if isinstance(version, tuple) else str(version)))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-p", "--nprocs", type=int, default=2, help="processes, one GPU each")
    parser.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8"))
    parser.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64K"))
    parser.add_argument("-f", "--stepfactor", type=float, default=2.0)
    parser.add_argument("-n", "--iters", type=int, default=200, help="timed calls in all (split over the rounds)")
    parser.add_argument("-w", "--warmup", type=int, default=20)
    parser.add_argument("-R", "--rounds", type=int, default=5)
    parser.add_argument("-c", "--check", type=int, default=1, help="1: check each row's result once")
    parser.add_argument("-O", "--op", default=",".join(COLLECTIVES), help="collectives, comma-separated")
    parser.add_argument("--csv", help="also write the rows to this file (perf_nccl's columns)")
    args = parser.parse_args()
    for name in args.op.split(","):
        if name not in COLLECTIVES:
            parser.error(f"unknown collective '{name}' (choose from {', '.join(COLLECTIVES)})")
    if args.nprocs < 1 or args.minbytes > args.maxbytes or args.stepfactor <= 1 or args.rounds < 1 or args.iters < 1:
        parser.error("need -p >= 1, -b <= -e, -f > 1, -R >= 1 and -n >= 1")
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"SKIP: PyTorch is not installed here ({e})")
        return 77
    if not torch.cuda.is_available() or not torch.distributed.is_nccl_available():
        print("SKIP: this PyTorch has no CUDA or no NCCL")
        return 77
    if torch.cuda.device_count() < args.nprocs:
        print(f"SKIP: -p {args.nprocs} needs {args.nprocs} GPUs, {torch.cuda.device_count()} visible")
        return 77
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

    with tempfile.TemporaryDirectory() as folder:
        queue = mp.get_context("spawn").SimpleQueue()
        mp.spawn(worker, args=(args.nprocs, os.path.join(folder, "rendezvous"), args, queue), nprocs=args.nprocs,
                 join=True)
        rows, torch_version, nccl_version = queue.get()

    n = args.nprocs
    print(f"# PyTorch {torch_version} NCCL process group (NCCL {nccl_version}), {n} processes, float sum, "
          f"median of {args.rounds} rounds of {-(-args.iters // args.rounds)} calls")
    print("#  collective     placement          size         count      time   algbw   busbw  #wrong")
    print("#                                     (B)    (elements)      (us)  (GB/s)  (GB/s)")
    date = datetime.datetime.now().strftime("%Y-%m-%dT%H:%M:%S")
    lines = []
    for collective, placement, nbytes, count, time_us, wrong in rows:
        algbw = nbytes / (time_us * 1e3) if time_us > 0 else 0.0
        busbw = algbw * FACTORS[collective](n)
        print(f"{collective:>14s}  {placement:>12s}  {nbytes:12d}  {count:12d}  {time_us:8.2f}  {algbw:6.2f}  "
              f"{busbw:6.2f}  {wrong:6d}")
        lines.append(f"{date},{collective},pytorch,{placement},float,sum,0,{n},{nbytes},{count},{time_us:.3f},"
                     f"{algbw:.4f},{busbw:.4f},{wrong}\n")
    if args.csv:
        with open(args.csv, "w") as out:
            out.write("date,collective,implementation,placement,type,redop,root,nranks,bytes,count,time_us,algbw_gbs,"
                      "busbw_gbs,wrong\n")
            out.writelines(lines)
    bad = sum(1 for row in rows if row[5] > 0)
    if bad:
        print(f"# FAILED: {bad} rows with wrong values")
    return 2 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
