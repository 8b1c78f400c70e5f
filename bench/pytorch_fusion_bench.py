#!/usr/bin/env python3
"""Times gradient synchronisation of real models' gradient sets through torch.distributed (NCCL).

PyTorch's side of bench/fusion_nccl: the same gradient sets (bench/data/<model>.shapes.txt,
float32), the same method, the same table. One process per GPU, spawned with
torch.multiprocessing. Rows (every collective averages, ReduceOp.AVG, fp32 in and out):

  per-tensor          one all_reduce per tensor (separate allocations, like .grad tensors),
                      reverse registration order
  flatten+unflatten   torch._utils._flatten_dense_tensors over all of them, one all_reduce,
                      _unflatten_dense_tensors and a copy back into each (DDP's older path)
  flat                one all_reduce of a preallocated buffer holding every gradient
  buckets 25 MiB      DDP-like: the flat buffer (reverse registration order) cut into buckets
                      of at most 25 MiB (the first 1 MiB, DDP's defaults; a tensor is never
                      split), one all_reduce per bucket, in order, over views
  fp16 flat           the flat buffer cast into a preallocated fp16 buffer, all_reduce, cast back
  fp16 buckets 25 MiB DDP's fp16_compress_hook per bucket: cast, all_reduce, cast back
  bf16 flat           as fp16 flat, in bfloat16

Method: each row is checked first (each rank's N(0, 1e-3) gradients reduced once, compared with
the float64 average of every rank's: norm-relative error <= 1e-6 for fp32 rows, <= 1e-3 for
16-bit ones); then -R rounds, each running every row in turn (order rotating per round) after
a barrier: -w warm-up steps, then -n steps issued back to back, each timed by CUDA events on
the current (compute) stream: one recorded before the step, one after it, once the collectives
have been joined back to that stream (torch.distributed's synchronous calls do). The table gives
rank 0's median and minimum over every round's steps, and the ratio of medians to the flat row.

    python3 bench/pytorch_fusion_bench.py --nprocs 2 -n 20 -w 5 -R 3 --csv torch_fusion.csv

Sets NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (when unset) before the process
group starts. Needs a PyTorch with CUDA and NCCL; exits 77 when there is none or fewer GPUs
than --nprocs, so that scripts can report it as skipped.
"""

import argparse
import datetime
import os
import statistics
import sys
import tempfile

MODELS = ("resnet50", "gpt2_small")
MIB = 1 << 20


def read_shapes(model):
    """[(name, shape)] of bench/data/<model>.shapes.txt, in registration order."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", f"{model}.shapes.txt")
    if not os.path.exists(path):
        raise SystemExit(f"pytorch_fusion_bench: no shapes file {path} for model '{model}' "
                         f"(choose from {', '.join(MODELS)})")
    shapes = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, shape = line.split()
            shapes.append((name, tuple(int(x) for x in shape.split("x"))))
    return shapes


def bucket_bounds(counts, cap_bytes, first_cap_bytes, element=4):
    """DDP-like buckets over tensors laid out in the given order: [(begin, end)] in elements."""
    bounds, begin, size, first = [], 0, 0, True
    offset = 0
    for count in counts:
        cap = first_cap_bytes if first else cap_bytes
        if size > 0 and (size + count) * element > cap:
            bounds.append((begin, offset))
            begin, size, first = offset, 0, False
        size += count
        offset += count
    if size > 0:
        bounds.append((begin, offset))
    return bounds


def worker(rank, n, init_file, args, queue):
    import torch
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    extra = {}
    if args.high_priority:
        # ProcessGroupNCCL's own streams at high priority, as ncclkit's fusion_nccl runs its comm stream.
        options = dist.ProcessGroupNCCL.Options()
        options.is_high_priority_stream = True
        extra["pg_options"] = options
    dist.init_process_group("nccl", init_method="file://" + init_file, rank=rank, world_size=n, device_id=device,
                            **extra)
    avg = dist.ReduceOp.AVG
    results = []
    for model in args.model:
        shapes = read_shapes(model)
        # Reverse registration order: the order backward produces gradients, as ncclkit's layout
        # and DDP's buckets place them.
        ordered = list(reversed(shapes))
        counts = [int(torch.Size(shape).numel()) for _, shape in ordered]
        total = sum(counts)

        def source(r):
            g = torch.Generator(device=device)
            g.manual_seed(0x51ED27 * (r + 1))
            return torch.randn(total, generator=g, device=device, dtype=torch.float32) * 1e-3

        # Separate allocations (per-tensor, flatten rows) and one flat buffer with views.
        separate = [torch.empty(shape, device=device) for _, shape in ordered]
        flat = torch.empty(total, device=device)
        half = torch.empty(total, device=device, dtype=torch.float16)
        bhalf = torch.empty(total, device=device, dtype=torch.bfloat16)
        bounds = bucket_bounds(counts, args.bucket_mb * MIB, args.first_bucket_mb * MIB)
        buckets = [flat[b:e] for b, e in bounds]
        half_buckets = [half[b:e] for b, e in bounds]

        def per_tensor():
            for t in separate:
                dist.all_reduce(t, op=avg)

        def flatten_unflatten():
            packed = _flatten_dense_tensors(separate)
            dist.all_reduce(packed, op=avg)
            for t, s in zip(separate, _unflatten_dense_tensors(packed, separate)):
                t.copy_(s)

        def flat_row():
            dist.all_reduce(flat, op=avg)

        def bucketed():
            for b in buckets:
                dist.all_reduce(b, op=avg)

        def fp16_flat():
            half.copy_(flat)
            dist.all_reduce(half, op=avg)
            flat.copy_(half)

        def fp16_buckets():
            for b, h in zip(buckets, half_buckets):
                h.copy_(b)
                dist.all_reduce(h, op=avg)
                b.copy_(h)

        def bf16_flat():
            bhalf.copy_(flat)
            dist.all_reduce(bhalf, op=avg)
            flat.copy_(bhalf)

        def fill_separate(values):
            offset = 0
            for t, c in zip(separate, counts):
                t.view(-1).copy_(values[offset:offset + c])
                offset += c

        def read_separate():
            return torch.cat([t.view(-1) for t in separate])

        cap = f"{args.bucket_mb:g} MiB"
        rows = [
            ("per-tensor", per_tensor, "separate", 1e-6),
            ("flatten+unflatten", flatten_unflatten, "separate", 1e-6),
            (f"buckets {cap} ({len(bounds)} buckets)", bucketed, "flat", 1e-6),
            ("flat", flat_row, "flat", 1e-6),
            ("fp16 flat", fp16_flat, "flat", 1e-3),
            (f"fp16 buckets {cap}", fp16_buckets, "flat", 1e-3),
            ("bf16 flat", bf16_flat, "flat", 1e-2),
        ]

        errors = {}
        if args.check:
            mine = source(rank)
            reference = torch.zeros(total, device=device, dtype=torch.float64)
            for r in range(n):
                reference += (mine if r == rank else source(r)).double() / n
            for name, step, storage, bound in rows:
                if storage == "separate":
                    fill_separate(mine)
                else:
                    flat.copy_(mine)
                step()
                out = read_separate() if storage == "separate" else flat
                error = float((out.double() - reference).norm() / reference.norm())
                errors[name] = error
                if not error <= bound and bound < 1e-5:  # a wrong fp32 result is a bug: stop
                    raise RuntimeError(f"{model}, {name}: rank {rank} got a result off the float64 average by "
                                       f"{error:.3e} (norm-relative; the bound is {bound:g}): not timing it")
            del mine, reference
            torch.cuda.synchronize()

        starts = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps)]
        stops = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps)]
        samples = {name: [] for name, _, _, _ in rows}
        for round_ in range(args.rounds):
            for k in range(len(rows)):
                name, step, _, _ = rows[(k + round_) % len(rows)]
                dist.barrier(device_ids=[rank])
                torch.cuda.synchronize()
                for _ in range(args.warmup):
                    step()
                for s in range(args.steps):
                    starts[s].record()
                    step()
                    stops[s].record()
                torch.cuda.synchronize()
                samples[name].extend(starts[s].elapsed_time(stops[s]) for s in range(args.steps))
        flat_median = statistics.median(samples["flat"])
        for name, _, _, _ in rows:
            median = statistics.median(samples[name])
            results.append((model, len(shapes), total * 4 / MIB, name, median, median / flat_median,
                            min(samples[name]), len(samples[name]), errors.get(name, -1.0)))
        del separate, flat, half, bhalf, buckets, half_buckets
        torch.cuda.empty_cache()
    if rank == 0:
        version = torch.cuda.nccl.version()  # a tuple in recent PyTorch, an int in old ones
        queue.put((results, torch.__version__, ".".join(map(str, version)) if isinstance(version, tuple)
                   else str(version), torch.cuda.get_device_name(device)))
    dist.barrier(device_ids=[rank])
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-p", "--nprocs", type=int, default=2, help="processes, one GPU each (default 2)")
    parser.add_argument("-n", "--steps", type=int, default=20, help="timed steps per row and round (default 20)")
    parser.add_argument("-w", "--warmup", type=int, default=5, help="warm-up steps per row and round (default 5)")
    parser.add_argument("-R", "--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--model", default="all", help="resnet50, gpt2_small or all, comma separated (default all)")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="bucket cap of the bucket rows (default 25)")
    parser.add_argument("--first-bucket-mb", type=float, default=1.0, help="cap of the first bucket (default 1)")
    parser.add_argument("--no-check", dest="check", action="store_false", help="skip the correctness check")
    parser.add_argument("--high-priority", action="store_true",
                        help="run ProcessGroupNCCL's streams at high priority (is_high_priority_stream)")
    parser.add_argument("--csv", help="also write the table to this file")
    args = parser.parse_args()
    args.model = list(MODELS) if args.model == "all" else [m for m in args.model.split(",") if m]
    for model in args.model:
        read_shapes(model)  # fail here, before spawning, on a bad name
    if args.nprocs < 1 or args.steps < 1 or args.warmup < 0 or args.rounds < 1 or args.bucket_mb <= 0:
        parser.error("need --nprocs >= 1, -n >= 1, -w >= 0, -R >= 1 and --bucket-mb > 0")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
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
        print(f"SKIP: --nprocs {args.nprocs} needs {args.nprocs} GPUs, {torch.cuda.device_count()} visible")
        return 77

    with tempfile.TemporaryDirectory() as folder:
        queue = mp.get_context("spawn").SimpleQueue()
        mp.spawn(worker, args=(args.nprocs, os.path.join(folder, "rendezvous"), args, queue), nprocs=args.nprocs,
                 join=True)
        results, torch_version, nccl_version, card = queue.get()

    print(f"# pytorch_fusion_bench: {args.nprocs} ranks (one process per GPU), {card}, PyTorch {torch_version}, "
          f"NCCL {nccl_version}, NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}, "
          f"TORCH_SYMM_MEM_DISABLE_MULTICAST={os.environ['TORCH_SYMM_MEM_DISABLE_MULTICAST']}, "
          f"{'high' if args.high_priority else 'default'}-priority NCCL streams, float32 in/out, avg")
    print(f"{'model':<11s} {'tensors':>7s} {'MiB':>8s}  {'row':<28s} {'median_ms':>10s} {'vs_flat':>9s} "
          f"{'min_ms':>10s} {'check_err':>10s}")
    bounds = {"fp16": 1e-3, "bf16": 1e-2}
    for model, tensors, mib, name, median, ratio, low, count, error in results:
        err = "-" if error < 0 else f"{error:.1e}" + ("!" if error > bounds.get(name.split()[0], 1e-6) else "")
        print(f"{model:<11s} {tensors:7d} {mib:8.1f}  {name:<28s} {median:10.3f} {ratio:8.3f}x {low:10.3f} {err:>10s}")
    print(f"# median and min over {args.rounds} rounds x {args.steps} steps (after {args.warmup} warm-up steps per "
          f"round) of rank 0; vs_flat = median / flat's median\n"
          f"# check_err: norm-relative error against the float64 average on N(0,1e-3) gradients "
          f"(bound 1e-6 fp32, 1e-3 fp16, 1e-2 bf16; '!': over its bound, timed anyway for a 16-bit row)")
    if args.csv:
        date = datetime.datetime.now().strftime("%Y-%m-%dT%H:%M:%S")
        with open(args.csv, "w") as out:
            out.write("date,implementation,model,tensors,mib,row,median_ms,ratio_to_flat,min_ms,samples,check_error\n")
            for model, tensors, mib, name, median, ratio, low, count, error in results:
                out.write(f"{date},pytorch,{model},{tensors},{mib:.3f},{name},{median:.4f},{ratio:.4f},{low:.4f},"
                          f"{count},{error:.3e}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
