#!/usr/bin/env python3
"""PyTorch DDP on the MLP of examples/mlp_cublas: the peer of train_mlp, same model, same method.

The model: nn.Sequential of Linear + ReLU layers (--depth Linear layers, input -> width -> ... ->
output, ReLU after each but the last), mean-squared error (nn.MSELoss, the mean over samples and
outputs), SGD (or AdamW, weight decay 0 as train_mlp's) at --lr, TF32 matmuls
(torch.set_float32_matmul_precision("high"); --precision fp32: "highest"; --precision bf16: the
forward and the loss under torch.autocast to bfloat16, float32 parameters and gradients, as
train_mlp --precision bf16), weights initialised
with train_mlp's bounds (U(+-sqrt(6/in)), the last layer U(+-sqrt(3/in)), biases 0). The data:
synthetic regression on the GPU, x uniform with unit variance, y = x T^T for a fixed random
teacher T, a different slice per rank.

Rows (one per batch size; --batch is per GPU):
  --nprocs 1     torch-1gpu     the plain model, no DDP, no process group: the one-GPU step
  --nprocs N>1   ddp            DistributedDataParallel, default bucket_cap_mb, fp32 gradients
                 ddp-fp16hook   the same with DDP's fp16_compress_hook

Method: -w warm-up steps, then -n steps issued back to back, each timed by CUDA events on the
current stream (zero_grad, forward, loss, backward, optimizer step); the median and mean of rank
0's steps. reduce_ms: the same gradients' reduction alone, in the buckets DDP used (the sizes
DDP reports after it rebuilt them in the first step; where this PyTorch does not report them,
DDP's rule: parameters in reverse order, a bucket closed once it reaches 1 MiB for the first,
bucket_cap_mb after, a tensor never split), each bucket divided by the world and all-reduced
(ddp) or cast to fp16 with the division, all-reduced and cast back (ddp-fp16hook), the median of
--reduce-repeats; empty for torch-1gpu.

    python3 bench/ddp_mlp_bench.py --nprocs 2 --batch 64,256 --csv mlp_torch.csv

CSV (appended, with a header when the file is new), the columns of train_mlp:
  impl,gpus,batch,codec,step_ms,samples_per_s,reduce_ms,step_mean_ms,depth,width,accumulation,optimizer,bucket

Processes are started with torch.multiprocessing (no torchrun), rendezvous over
MASTER_ADDR=127.0.0.1 and a free port: no network needed. Sets NCCL_NVLS_ENABLE=0 and
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (when unset). Exits 77 when PyTorch, CUDA or NCCL is missing
or fewer GPUs than --nprocs are visible, so that scripts can report it as skipped.
"""

import argparse
import datetime
import math
import os
import socket
import statistics
import sys

MIB = 1 << 20
CSV_HEADER = ("impl,gpus,batch,codec,step_ms,samples_per_s,reduce_ms,step_mean_ms,depth,width,accumulation,"
              "optimizer,bucket\n")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_bucket_bytes(counts, cap_bytes, first_cap_bytes, element=4):
    """DDP's cut of tensors (in the order their gradients are written) into buckets, in bytes: a
    tensor joins the open bucket, which closes once it holds at least its limit (first_cap_bytes
    for the first bucket, cap_bytes after), so a bucket may pass its limit by one tensor."""
    sizes, size = [], 0
    for count in counts:
        size += count * element
        if size >= (first_cap_bytes if not sizes else cap_bytes):
            sizes.append(size)
            size = 0
    if size > 0:
        sizes.append(size)
    return sizes


def reported_bucket_bytes(net):
    """The bucket sizes (bytes, in reduction order) DDP reports after rebuilding its buckets, or
    None where this PyTorch reports none (_get_ddp_logging_data is not a public interface)."""
    try:
        text = str(net._get_ddp_logging_data().get("rebuilt_bucket_sizes", ""))
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except (AttributeError, RuntimeError, ValueError):
        return None
    return sizes or None


def build_model(args, device):
    import torch
    from torch import nn

    layers = []
    for layer in range(args.depth):
        fan_in = args.input if layer == 0 else args.width
        fan_out = args.output if layer + 1 == args.depth else args.width
        linear = nn.Linear(fan_in, fan_out, device=device)
        gain = 3.0 if layer + 1 == args.depth else 6.0
        with torch.no_grad():
            linear.weight.uniform_(-math.sqrt(gain / fan_in), math.sqrt(gain / fan_in))
            linear.bias.zero_()
        layers.append(linear)
        if layer + 1 < args.depth:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def synthetic(args, rows, seed, device):
    """x (rows x input), unit variance; y = x T^T, T a fixed teacher (the same for every seed)."""
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(1000 + seed)
    x = (torch.rand(rows, args.input, generator=g, device=device) * 2 - 1) * math.sqrt(3.0)
    g.manual_seed(7)
    bound = math.sqrt(3.0 / args.input)
    teacher = (torch.rand(args.output, args.input, generator=g, device=device) * 2 - 1) * bound
    with torch.no_grad():
        y = torch.matmul(x, teacher.t())
    return x, y


def timed(step, steps, warmup):
    """Per-step milliseconds (CUDA events on the current stream) after `warmup` untimed steps."""
    import torch

    for _ in range(warmup):
        step()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    torch.cuda.synchronize()
    for s in range(steps):
        starts[s].record()
        step()
        stops[s].record()
    torch.cuda.synchronize()
    return [starts[s].elapsed_time(stops[s]) for s in range(steps)]


def reduce_alone_ms(params, fp16, bucket_sizes, repeats):
    """The gradients' reduction alone, in buckets of `bucket_sizes` bytes (see the module
    docstring)."""
    import torch
    import torch.distributed as dist

    ordered = list(reversed(params))
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ordered])
    if sum(bucket_sizes) != flat.numel() * flat.element_size():
        raise RuntimeError(f"ddp_mlp_bench: DDP's buckets hold {sum(bucket_sizes)} bytes, the gradients "
                         f"{flat.numel() * flat.element_size()}: not the same tensors")
    bounds, begin = [], 0
    for size in bucket_sizes:
        bounds.append((begin, begin + size // flat.element_size()))
        begin = bounds[-1][1]
    buckets = [flat[b:e] for b, e in bounds]
    halves = [torch.empty(e - b, device=flat.device, dtype=torch.float16) for b, e in bounds] if fp16 else []

    def once():
        for i, bucket in enumerate(buckets):
            if fp16:
                halves[i].copy_(bucket).div_(dist.get_world_size())
                dist.all_reduce(halves[i])
                bucket.copy_(halves[i])
            else:
                bucket.div_(dist.get_world_size())
                dist.all_reduce(bucket)

    return statistics.median(timed(once, repeats, 3))


def measure(impl, args, x, y, rank, distributed):
    """One row: (impl, batch, median_ms, mean_ms, reduce_ms or None, loss before, loss after,
    where the bucket sizes came from)."""
    import torch
    from torch import nn

    device = x.device
    torch.manual_seed(0)
    model = build_model(args, device)
    net = model
    if distributed:
        from torch.nn.parallel import DistributedDataParallel
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        net = DistributedDataParallel(model, device_ids=[rank], bucket_cap_mb=args.bucket_mb)
        if impl == "ddp-fp16hook":
            net.register_comm_hook(None, default_hooks.fp16_compress_hook)
    if args.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    loss_fn = nn.MSELoss()

    def loss_of():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            return loss_fn(net(x), y)

    def step():
        optimizer.zero_grad()
        loss = loss_of()
        loss.backward()
        optimizer.step()

    with torch.no_grad():
        before = float(loss_of())
    step_ms = timed(step, args.steps, args.warmup)
    with torch.no_grad():
        after = float(loss_of())
    reduce_ms, source = None, "-"
    if distributed:
        params = list(model.parameters())
        sizes, source = reported_bucket_bytes(net), "as DDP reports them"
        if sizes is None:
            sizes = ddp_bucket_bytes([p.numel() for p in reversed(params)], int(args.bucket_mb * MIB), 1 * MIB)
            source = "by DDP's rule (this PyTorch reports none)"
        source = f"{len(sizes)} buckets {source}"
        reduce_ms = reduce_alone_ms(params, impl == "ddp-fp16hook", sizes, args.reduce_repeats)
    return (impl, x.shape[0], statistics.median(step_ms), statistics.mean(step_ms), reduce_ms, before, after, source)


def worker(rank, n, args, queue):
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    # The interface every PyTorch 2 has; "high" lets float32 matmuls use TF32, as train_mlp's default.
    torch.set_float32_matmul_precision("highest" if args.precision == "fp32" else "high")
    distributed = n > 1
    if distributed:
        dist.init_process_group("nccl", init_method="env://", rank=rank, world_size=n, device_id=device,
                                timeout=datetime.timedelta(seconds=120))
    impls = ["ddp", "ddp-fp16hook"] if distributed else ["torch-1gpu"]
    rows = []
    for batch in args.batch:
        x, y = synthetic(args, batch, rank, device)
        for impl in impls:
            rows.append(measure(impl, args, x, y, rank, distributed))
            torch.cuda.empty_cache()  # the last model's memory, before the next one
    if rank == 0:
        version = torch.cuda.nccl.version() if distributed else None
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version or "-")
        queue.put((rows, torch.__version__, nccl, torch.cuda.get_device_name(device)))
    if distributed:
        dist.barrier(device_ids=[rank])
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-p", "--nprocs", type=int, default=2, help="processes, one GPU each; 1: no DDP (default 2)")
    parser.add_argument("--depth", type=int, default=8, help="Linear layers (default 8)")
    parser.add_argument("--width", type=int, default=4096, help="hidden features (default 4096)")
    parser.add_argument("--input", type=int, help="input features (default: the width)")
    parser.add_argument("--output", type=int, help="output features (default: the width)")
    parser.add_argument("--batch", default="64", help="samples per GPU, comma separated (default 64)")
    parser.add_argument("-n", "--steps", type=int, default=50, help="timed steps (default 50)")
    parser.add_argument("-w", "--warmup", type=int, default=10, help="warm-up steps (default 10)")
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate (default 0.01)")
    parser.add_argument("--precision", choices=("tf32", "fp32", "bf16"), default="tf32",
                        help="matmul precision; bf16: autocast to bfloat16 (default tf32)")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb (default 25, DDP's)")
    parser.add_argument("--reduce-repeats", type=int, default=20, help="timed reductions alone (default 20)")
    parser.add_argument("--csv", help="append the rows to this file")
    args = parser.parse_args()
    args.input = args.input or args.width
    args.output = args.output or args.width
    try:
        args.batch = [int(b) for b in args.batch.split(",") if b]
    except ValueError:
        parser.error(f"--batch wants numbers separated by commas, not '{args.batch}'")
    if (args.nprocs < 1 or args.depth < 1 or min(args.width, args.input, args.output) < 1 or not args.batch
            or min(args.batch) < 1 or args.steps < 1 or args.warmup < 0 or args.reduce_repeats < 1
            or args.bucket_mb <= 0 or args.lr <= 0):
        parser.error("need --nprocs, --depth, --width, --input, --output, --batch, -n, --reduce-repeats >= 1, "
                     "-w >= 0, --bucket-mb > 0 and --lr > 0")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"SKIP: PyTorch is not installed here ({e})")
        return 77
    if not torch.cuda.is_available() or (args.nprocs > 1 and not torch.distributed.is_nccl_available()):
        print("SKIP: this PyTorch has no CUDA or no NCCL")
        return 77
    if torch.cuda.device_count() < args.nprocs:
        print(f"SKIP: --nprocs {args.nprocs} needs {args.nprocs} GPUs, {torch.cuda.device_count()} visible")
        return 77

    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(args.nprocs, args, queue), nprocs=args.nprocs, join=True)
    rows, torch_version, nccl_version, card = queue.get()

    parameters = sum((args.input if l == 0 else args.width) * (args.output if l + 1 == args.depth else args.width)
                     + (args.output if l + 1 == args.depth else args.width) for l in range(args.depth))
    print(f"# ddp_mlp_bench: {args.nprocs} rank(s) on {card}, PyTorch {torch_version}, NCCL {nccl_version}, "
          f"NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}; MLP {args.input} -> {args.width} x {args.depth - 1} "
          f"-> {args.output} ({parameters / 1e6:.1f} M parameters), {args.precision}, {args.optimizer} lr {args.lr:g}")
    date = datetime.datetime.now().strftime("%Y-%m-%dT%H:%M:%S")
    lines = []
    for impl, batch, median, mean, reduce_ms, before, after, source in rows:
        samples = batch * args.nprocs / (median / 1000.0)
        reduce_text = "-" if reduce_ms is None else f"{reduce_ms:.3f} ms ({source})"
        print(f"{impl}: {args.nprocs} GPU(s), batch {batch}/GPU: step {median:.3f} ms median ({mean:.3f} mean, "
              f"{args.steps} steps), {samples:.0f} samples/s; reduction alone {reduce_text}; "
              f"loss {before:.4f} -> {after:.4f}")
        codec = "fp16" if impl == "ddp-fp16hook" else "none"
        bucket = f"{args.bucket_mb:g} MiB (DDP)" if args.nprocs > 1 else "-"
        lines.append(f"{impl},{args.nprocs},{batch},{codec},{median:.4f},{samples:.1f},"
                     f"{'' if reduce_ms is None else f'{reduce_ms:.4f}'},{mean:.4f},{args.depth},{args.width},1,"
                     f"{args.optimizer},{bucket}\n")
    print(f"# {date}: medians of rank 0's {args.steps} timed steps after {args.warmup} warm-up steps")
    if args.csv:
        fresh = not os.path.exists(args.csv)
        with open(args.csv, "a") as out:
            if fresh:
                out.write(CSV_HEADER)
            out.writelines(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
