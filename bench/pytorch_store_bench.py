#!/usr/bin/python3
"""PyTorch's TCPStore measured the way bench/bench_tcp_store.cpp measures ncclkit's TcpStore.

    /usr/bin/python3 bench/pytorch_store_bench.py [--ncclkit BUILD/bench/bench_tcp_store]

Needs PyTorch (Debian: apt-get install -y python3-torch, 1.13; run it with /usr/bin/python3).
With --ncclkit, it runs that benchmark binary too, in alternation with PyTorch's runs
(measurement by measurement), and prints both side by side with the ratio ncclkit / PyTorch.

Measurements (each the median of --rounds runs, the two stores taking turns):
  set+get      one set and one get of a 16-byte value, client and server in this process;
               timed in batches of 100 calls for 0.5 s, the median batch per call
  add          one add, timed the same way
  rendezvous threads 256   256 threads, each its own client (connecting included), set their
               key, then wait for all 256 keys; from the first thread's start to the last join
  rendezvous processes N   N forked processes do the same; from the first fork until every
               process is reaped. PyTorch's server cannot adopt a socket bound before the fork,
               so the parent starts it right after forking and the children connect once a
               pipe says it is up (without the pipe they would hit PyTorch's connect retry
               delay, which would not be a fair comparison).
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time

HOST = "127.0.0.1"
VALUE = bytes(range(16))
TIMEOUT = datetime.timedelta(seconds=60)


def torch_store():
    import torch.distributed as dist  # imported late: --help works without torch

    return dist.TCPStore


def master(TCPStore, port=0):
    return TCPStore(HOST, port, None, True, TIMEOUT, wait_for_workers=False)


def client(TCPStore, port):
    return TCPStore(HOST, port, None, False, TIMEOUT)


def per_op_seconds(fn, min_seconds=0.5, batch=100):
    """Runs fn in batches of `batch` calls until min_seconds have passed; returns the median
    seconds per call over the batches (as bench_tcp_store's median_us counter)."""
    samples, start = [], time.perf_counter()
    while time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - t0) / batch)
    return statistics.median(samples)


def bench_set_get(TCPStore):
    server = master(TCPStore)
    store = client(TCPStore, server.port)
    store.set("key", VALUE)
    assert store.get("key") == VALUE

    def once():
        store.set("key", VALUE)
        store.get("key")

    return per_op_seconds(once)


def bench_add(TCPStore):
    server = master(TCPStore)
    store = client(TCPStore, server.port)
    start = store.add("counter", 0)
    calls = [0]

    def once():
        store.add("counter", 1)
        calls[0] += 1

    seconds = per_op_seconds(once)
    assert store.add("counter", 0) == start + calls[0], "add lost counts"
    return seconds


def bench_threads(TCPStore, clients):
    keys = [f"rank/{i}" for i in range(clients)]
    server = master(TCPStore)
    port = server.port
    failures = []

    def work(i):
        try:
            store = client(TCPStore, port)
            store.set(keys[i], "1")
            store.wait(keys)
        except Exception as error:  # noqa: BLE001 - report any failure
            failures.append(repr(error))

    start = time.perf_counter()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if failures:
        raise RuntimeError(f"{len(failures)} clients failed, first: {failures[0]}")
    return elapsed


def free_port():
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def bench_processes(TCPStore, nprocs):
    keys = [f"rank/{i}" for i in range(nprocs)]
    port = free_port()
    ready_read, ready_write = os.pipe()
    start = time.perf_counter()
    pids = []
    for rank in range(nprocs):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(ready_write)
                os.read(ready_read, 1)  # the server is up (or the parent died: EOF)
                store = client(TCPStore, port)
                store.set(keys[rank], "1")
                store.wait(keys)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    os.close(ready_read)
    server = master(TCPStore, port)
    os.write(ready_write, b"x" * nprocs)
    os.close(ready_write)
    failed = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        failed += status != 0
    elapsed = time.perf_counter() - start
    del server
    if failed:
        raise RuntimeError(f"{failed} of {nprocs} processes failed")
    return elapsed


# measurement -> (Google Benchmark filter in bench_tcp_store, PyTorch function)
def measurements(process_counts):
    table = {
        "set+get": ("BM_TcpStoreSetGet", bench_set_get),
        "add": ("BM_TcpStoreAdd", bench_add),
        "rendezvous threads 256": ("BM_TcpStoreRendezvousThreads/256", lambda s: bench_threads(s, 256)),
    }
    for n in process_counts:
        table[f"rendezvous processes {n}"] = (f"BM_TcpStoreRendezvousProcesses/{n}/",
                                              lambda s, n=n: bench_processes(s, n))
    return table


def run_ncclkit(binary, name_filter):
    """Runs the benchmarks of bench_tcp_store matching name_filter once; seconds per run."""
    out = subprocess.run([binary, "--benchmark_format=json", f"--benchmark_filter={name_filter}"],
                         check=True, capture_output=True, text=True).stdout
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    # Latency benchmarks report the median over batches (counter median_us); the rendezvous
    # ones one run each (real_time).
    results = [entry["median_us"] * 1e-6 if "median_us" in entry else entry["real_time"] * scale[entry["time_unit"]]
               for entry in json.loads(out)["benchmarks"] if "error_occurred" not in entry]
    if len(results) != 1:
        raise RuntimeError(f"{binary} --benchmark_filter={name_filter} gave {len(results)} results: {out}")
    return results[0]


def show(seconds):
    if seconds is None:
        return "-"
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.1f} ms"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ncclkit", help="path of bench_tcp_store, to run in alternation and compare")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each measurement (median reported)")
    parser.add_argument("--processes", default="8,64,256", help="process counts to rendezvous")
    args = parser.parse_args()

    import torch

    TCPStore = torch_store()
    table = measurements([int(x) for x in args.processes.split(",")])
    print(f"# {datetime.datetime.now().isoformat(timespec='seconds')}  {platform.node()}  "
          f"{os.cpu_count()} CPUs  load {os.getloadavg()[0]:.1f}  torch {torch.__version__}  "
          f"python {platform.python_version()}  rounds {args.rounds}")
    ours = {key: [] for key in table}
    theirs = {key: [] for key in table}
    # Alternate the two stores measurement by measurement (and which goes first), so that a
    # change in machine load over the run affects both alike.
    for round_index in range(args.rounds):
        for key, (name_filter, pytorch_fn) in table.items():
            order = ["ncclkit", "pytorch"] if round_index % 2 == 0 else ["pytorch", "ncclkit"]
            for who in order:
                if who == "ncclkit" and args.ncclkit:
                    ours[key].append(run_ncclkit(args.ncclkit, name_filter))
                elif who == "pytorch":
                    theirs[key].append(pytorch_fn(TCPStore))
    print(f"# load after: {os.getloadavg()[0]:.1f}")
    print(f"| {'measurement':<26} | {'ncclkit TcpStore':>16} | {'PyTorch TCPStore':>16} | {'ratio':>6} |")
    print(f"|{'-' * 28}|{'-' * 18}|{'-' * 18}|{'-' * 8}|")
    for key in table:
        mine = statistics.median(ours[key]) if ours[key] else None
        value = statistics.median(theirs[key])
        ratio = f"{mine / value:.2f}" if mine is not None else "-"
        print(f"| {key:<26} | {show(mine):>16} | {show(value):>16} | {ratio:>6} |")
    if args.ncclkit:
        print("# every run (ncclkit / PyTorch):")
        for key in table:
            print(f"#   {key}: " + ", ".join(show(x) for x in ours[key]) + "  /  " +
                  ", ".join(show(x) for x in theirs[key]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
