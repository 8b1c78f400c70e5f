#!/usr/bin/env bash
# GPU test and benchmark runs of the NCCL backend, in two halves:
#
#   scripts/gpu-run.sh build                # here (no GPU needed): build for sm_90 into build-gpu/,
#                                           # copy the stripped binaries into build-gpu/carry/
#   scripts/gpu-run.sh run [OUT]            # on the GPU machine, in the repository root, with
#                                           # build-gpu/carry carried along: runs one phase set,
#                                           # writes summary.txt, results.tar.gz (logs, perf CSV
#                                           # and JSON) and busbw.png into OUT
#   scripts/gpu-run.sh run --dry-run [OUT]  # anywhere: the same bookkeeping with every phase
#                                           # faked: what would run, in which order, with what
#
# The GPU machine has no compiler toolchain for this project's dependencies (doctest, Gloo), so
# binaries are built here and carried (../shared/gpu.md). One call of the `run` tool of the GPU
# machines runs one phase set (a command may take 600 s there; docs/dev/gpu-runs.md):
#   run(kind="nvidia-h100-x2", carry=["build-gpu/carry"], timeout_s=600,
#       command="GPU_RUN_SET=tests-a scripts/gpu-run.sh run $OUT")   # then tests-b
#
# Phase sets (GPU_RUN_SET, default tests): the phases share a time budget of GPU_RUN_BUDGET
# seconds (default 540: the call's 600 less the start, the archive and some slack). Every set but
# `tests` fits one call. Times from the runs in docs/dev/gpu-runs.md (runs 43, 47, 60, 68, 69,
# 82-84):
#   tests         every test phase: about 600 s on 2 GPUs, 800 s on 4, more than one call holds
#                 (the phases the budget cuts are reported INCOMPLETE): run tests-a and tests-b,
#                 one call each.
#   tests-a       the argument check; the communicator on every GPU, on 1 and on 2; the collective
#                 matrix natively and on the grouped send/recv path; the watchdog drills on every
#                 GPU and on 1; the codec kernels, also under memcheck: about 250 s on 2 GPUs,
#                 420 s on 4.
#   tests-b       the drills and the matrix over NCCL's network transport; 1 GiB collectives;
#                 GradientSync and the fused compressed reduction, its kernel under memcheck too:
#                 the trainer and the cuBLAS MLP; the nvcc consumer; the GPU demo: about 340 s on
#                 2 GPUs, 430 s on 4.
#   perf          perf_nccl beside raw NCCL and PyTorch (a process per GPU, one thread driving
#                 every GPU, the argument check's cost), the enqueue benchmarks, completion marks:
#                 about 250 s.
#   fusion-bench  fusion_nccl beside PyTorch's fusion, a timeline, symmetric windows.
#   copy-sweep    loose tensors against the batched copy's shape (5 runs of fusion_nccl).
#   mlp-bench     the GPU trainer benchmark: train_mlp (the cuBLAS MLP of examples/mlp_cublas,
#                 8 x 4096, SGD, batch 64 and 256 per GPU) at 1 GPU, 2 GPUs (and 4 where there
#                 are 4), float32 and fp16 gradients, beside PyTorch DDP on the same model
#                 (bench/ddp_mlp_bench.py: no DDP at 1 GPU, DDP and DDP's fp16 hook), and the
#                 table of both (scripts/mlp_table.py) in the summary, and at 2 GPUs
#                 bench_split_step (the step with the 16-bit exchange cut in two, modelled):
#                 about 45 s on 2 GPUs, 65 s on 4.
#   mlp-ablation  mlp-bench, then train_mlp at 2 GPUs with each overlap lever changed alone
#                 (rows "ncclkit/NAME" of the same table; define_phases lists them).
# GPU_RUN_PHASES="name ..." runs the named phases instead of a set.
# GPU_RUN_NCCL=system runs everything with the system's NCCL, even where PyTorch's is the
# version the binaries were built against (which is used by default: both sides of a comparison
# then run the same NCCL); the summary says which ran.
#
# Exit status: 0 when every selected phase ran and passed; 1 when one failed, timed out on its
# own limit, or (a test phase) ran no test case; 3 when none failed but some did not run
# (INCOMPLETE): cut by the time budget, skipped (exit 77: no GPU, no PyTorch), needing more GPUs
# than there are, or named in GPU_RUN_PHASES but not a phase on this machine. The summary's
# last lines list them; a set or list run on purpose without some phases is no failure.
#
# The test phases run with NCCLKIT_TEST_REQUIRE_GPUS set to the number of GPUs they make visible:
# a test that skips what those GPUs could run fails instead (tests/gpu/nccl_support.hpp). The
# fused compressed reduction is required (NCCLKIT_TEST_ALLOW_UNFUSED=1 allows its absence).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD_DIR:-$ROOT/build-gpu}"
CARRY="$BUILD/carry"
TESTS=(tests_gpu tests_gpu_grouped)
BENCHES=(perf_nccl bench_nccl_enqueue gbench_nccl_enqueue bench_completion_marks fusion_nccl bench_symmetric_windows
  bench_split_step)

# "2.28.9" from an nccl.h; nothing where there is none.
nccl_header_version() {
  [[ -f "$1" ]] || return 0
  awk '/^#define NCCL_(MAJOR|MINOR|PATCH) / {v[$2] = $3} END {
    if (v["NCCL_MAJOR"] != "") print v["NCCL_MAJOR"] "." v["NCCL_MINOR"] "." v["NCCL_PATCH"] }' "$1"
}

build() {
  local jobs="${BUILD_JOBS:-1}"  # nvcc is slow and the build machine's cores are shared
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || return 1
  local target
  for target in "${TESTS[@]}" "${BENCHES[@]}" nvcc_consumer demo_gpu train_mlp; do
    echo "== building $target"
    cmake --build "$BUILD" -j "$jobs" --target "$target" || return 1
  done
  rm -rf "$CARRY"
  mkdir -p "$CARRY"
  for target in "${TESTS[@]}"; do cp "$BUILD/tests/$target" "$CARRY/"; done
  for target in "${BENCHES[@]}"; do cp "$BUILD/bench/$target" "$CARRY/"; done
  # The GPU machines have no Google Benchmark: its shared library travels too ($ORIGIN RPATH).
  local lib
  lib=$(ldd "$CARRY/gbench_nccl_enqueue" | awk '/libbenchmark/ {print $3}')
  [[ -n "$lib" ]] && cp "$lib" "$CARRY/"
  # A user's .cu over fusion and compression, compiled by nvcc; --gpu runs a tuned compressed step.
  cp "$BUILD/tests/nvcc_consumer" "$CARRY/"
  # The demo, training the digits classifier on one GPU per process. It links Gloo too (its
  # --backend gloo), which the GPU machines lack: Gloo and the libraries it brings travel with it
  # (found through LD_LIBRARY_PATH, which starts with the carry folder).
  cp "$BUILD/examples/demo_gpu" "$CARRY/"
  for lib in $(ldd "$CARRY/demo_gpu" | awk '/libgloo|libhiredis|libibverbs|libnl-/ {print $3}'); do
    cp -L "$lib" "$CARRY/"
  done
  # The cuBLAS MLP trainer (GPU_RUN_SET=mlp-bench). cuBLAS stays here (see find_missing_libraries).
  cp "$BUILD/examples/train_mlp" "$CARRY/"
  # The fusion benchmark of a baseline commit, for A/B rows in one call (GPU_RUN_SET=fusion-ab):
  # BASELINE_FUSION=path/to/fusion_nccl scripts/gpu-run.sh build.
  if [[ -n "${BASELINE_FUSION:-}" ]]; then
    mkdir -p "$CARRY/baseline"
    cp "$BASELINE_FUSION" "$CARRY/baseline/fusion_nccl"
  fi
  strip --strip-debug "$CARRY"/* "$CARRY"/baseline/* 2>/dev/null
  # The phases below run one test file each, by the name of its CTest test: a script that runs
  # the GPU test executable on that file's test cases (the communicator's with the kernels').
  local name files
  for name in check communicator collectives large watchdog fusion gradient_sync codec; do
    files="*/test_nccl_$name.cpp"
    [[ $name == communicator ]] && files+=",*/test_nccl_kernels.cu"
    [[ $name == gradient_sync ]] && files+=",*/test_nccl_trainer.cu,*/test_nccl_mlp_cublas.cu"
    printf '#!/bin/sh\nexec "$(dirname "$0")/tests_gpu" "--source-file=%s" "$@"\n' "$files" >"$CARRY/gpu_test_nccl_$name"
  done
  printf '#!/bin/sh\nexec "$(dirname "$0")/tests_gpu_grouped" "$@"\n' >"$CARRY/gpu_test_nccl_collectives_grouped"
  chmod +x "$CARRY"/gpu_test_nccl_*
  local nccl_include
  nccl_include=$(sed -n 's/^NCCL_INCLUDE_DIR:PATH=//p' "$BUILD/CMakeCache.txt")
  {
    echo "commit $(git -C "$ROOT" rev-parse HEAD)$(git -C "$ROOT" diff --quiet HEAD -- include tools tests/gpu tests/support bench || echo ' (plus uncommitted changes)')"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname) for sm_90"
    echo "nvcc $(/usr/local/cuda/bin/nvcc --version | tail -1)"
    # The fused kernel needs this very NCCL at run time (the `run` half reads this line).
    echo "nccl.h $(nccl_header_version "$nccl_include/nccl.h")"
  } >"$CARRY/BUILD_INFO"
  du -sh "$CARRY"
  echo "carry build-gpu/carry; on the GPU machine run: scripts/gpu-run.sh run \$OUT"
}

# ---- the phases --------------------------------------------------------------------------------

# The sets, by phase name, for a machine of $1 GPUs (the perf phases carry the count in their
# names). A phase runs in the order of define_phases, whatever the order here.
set_phases() {
  local n=$1 names
  local tests_a="check communicator-4gpu collectives-4gpu collectives-grouped watchdog-drills-4gpu codec-test
    codec-memcheck communicator-1gpu watchdog-1gpu communicator-2gpu"
  local tests_b="watchdog-drills-net collectives-net large-1gib fusion-test fused-memcheck gradient-sync-test
    nvcc-consumer demo-gpu"
  case "$2" in
    tests) names="$tests_a $tests_b" ;;
    tests-a) names="$tests_a" ;;
    tests-b) names="$tests_b" ;;
    perf)
      names="perf-p$n-check-off perf-p$n-check-on perf-p$n-small perf-p$n perf-p$n-large torch-p$n-small torch-p$n
        enqueue-bench gbench-enqueue completion-marks perf-g$n-check perf-g$n-small perf-g$n"
      ;;
    fusion-bench) names="fusion-bench-p$n fusion-timeline symmetric-windows torch-fusion-p$n torch-fusion-p$n-high" ;;
    fusion-ab) names="fusion-ab-old-1 fusion-ab-new-1 fusion-ab-new-2 fusion-ab-old-2" ;;
    copy-sweep)
      names="loose-copies-p$n-c4-k64 loose-copies-p$n-c0-k64 loose-copies-p$n-c0-k16 loose-copies-p$n-c0-k32
        loose-copies-p$n-c0-k128"
      ;;
    mlp-bench | mlp-ablation)
      names="train-mlp-p1 torch-mlp-p1 train-mlp-p2 train-mlp-defer-p2 torch-mlp-p2 split-step-p2"
      ((n >= 4)) && names+=" train-mlp-p4 train-mlp-defer-p4 torch-mlp-p4"
      [[ $2 == mlp-ablation ]] && names+=" $MLP_ABLATION"
      ;;
    *) return 1 ;;
  esac
  echo $names  # unquoted: one line, single spaces
}
SET_NAMES="tests tests-a tests-b perf fusion-bench fusion-ab copy-sweep mlp-bench mlp-ablation"
# The ablation's variants of train_mlp at 2 GPUs (define_phases says what each changes); the
# cuBLAS SM targets change the 1-GPU step too, so they have 1-GPU rows of their own.
MLP_ABLATION="mlp-timeline mlp-abl-whole mlp-abl-prio0 mlp-abl-tune mlp-abl-ctas8 mlp-abl-ctas16 mlp-abl-blocks66
  mlp-abl-blocks0 mlp-abl-blocks264 mlp-abl-cublas116-p1 mlp-abl-cublas116 mlp-abl-cublas100-p1 mlp-abl-cublas100
  mlp-abl-bf16-p1 mlp-abl-bf16 mlp-abl-addgrads-p1 mlp-abl-addgrads mlp-abl-separate"
MLP_ABLATION=$(echo $MLP_ABLATION)

# Every phase, in run order: `phase NAME LIMIT COMMAND...` with its environment in front. The
# limit (seconds) guards against a hang; a phase gets at most what is left of the budget.
# `needs NAME GPUS` stands before a phase that cannot run on fewer GPUs; `covered NAME BY` marks
# a phase that is another one on this machine.
define_phases() {
  local bin="$CARRY" n=$GPUS all=$ALL data=$DATA
  # The worlds of 2 and 4 processes that fit (the grouped path and the network transport have
  # nothing to exchange in a world of 1).
  local wide
  if ((n >= 4)); then
    wide=2,4
  else
    wide=2
  fi

  # ---- tests-a
  # NCCLKIT_CHECK_COLLECTIVES: mismatches caught on every rank.
  needs check 2 && CUDA_VISIBLE_DEVICES=$all phase check 120 "$bin/gpu_test_nccl_check"
  # Everything on every GPU (the tests run worlds of 1, 2 and 4 themselves).
  CUDA_VISIBLE_DEVICES=$all phase communicator-4gpu 200 "$bin/gpu_test_nccl_communicator"
  # The matrix runs twice per world (a process per GPU, then one process driving all GPUs
  # through a LocalGroup, whose host-side checks run one member after another): 23 s on 2 GPUs,
  # 58 s on 4 (run 43).
  NCCLKIT_TEST_COLLECTIVE_PATH=native CUDA_VISIBLE_DEVICES=$all phase collectives-4gpu 200 \
    "$bin/gpu_test_nccl_collectives"
  # The same matrix (both modes) with all_to_all, gather and scatter on the grouped send/recv
  # path of NCCL < 2.28 (built with NCCLKIT_NCCL_GROUPED_FALLBACKS); the test checks that the
  # binary takes it.
  needs collectives-grouped 2 && NCCLKIT_TEST_WORLD_SIZES=$wide NCCLKIT_TEST_COLLECTIVE_PATH=grouped \
    CUDA_VISIBLE_DEVICES=$all phase collectives-grouped 150 "$bin/gpu_test_nccl_collectives_grouped" \
    "-tc=every collective*,single-process matrix*"
  needs watchdog-drills-4gpu 2 && CUDA_VISIBLE_DEVICES=$all phase watchdog-drills-4gpu 150 "$bin/gpu_test_nccl_watchdog"
  CUDA_VISIBLE_DEVICES=0 phase codec-test 60 "$bin/gpu_test_nccl_codec"
  # The codec and batched-copy kernels under compute-sanitizer's memcheck (memory errors; not the
  # CUDA API errors NCCL provokes on purpose when it probes for kernels).
  CUDA_VISIBLE_DEVICES=0 phase codec-memcheck 120 /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
    --report-api-errors no --error-exitcode 1 "$bin/gpu_test_nccl_codec"
  # The tests adapt to 1 and 2 visible GPUs (and say what they skip).
  if ((n > 1)); then
    CUDA_VISIBLE_DEVICES=0 phase communicator-1gpu 90 "$bin/gpu_test_nccl_communicator"
  else
    covered communicator-1gpu communicator-4gpu
  fi
  CUDA_VISIBLE_DEVICES=0 phase watchdog-1gpu 30 "$bin/gpu_test_nccl_watchdog"
  if ((n > 2)); then
    CUDA_VISIBLE_DEVICES=0,1 phase communicator-2gpu 90 "$bin/gpu_test_nccl_communicator"
  elif ((n == 2)); then
    covered communicator-2gpu communicator-4gpu
  else
    needs communicator-2gpu 2
  fi

  # ---- tests-b
  # NCCL's network transport between the GPUs of this host: a stand-in for two nodes.
  needs watchdog-drills-net 2 && NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 CUDA_VISIBLE_DEVICES=$all \
    phase watchdog-drills-net 150 "$bin/gpu_test_nccl_watchdog"
  needs collectives-net 2 && NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCLKIT_TEST_WORLD_SIZES=$wide \
    NCCLKIT_TEST_COLLECTIVE_PATH=native CUDA_VISIBLE_DEVICES=$all phase collectives-net 150 \
    "$bin/gpu_test_nccl_collectives"
  # 1 GiB collectives.
  CUDA_VISIBLE_DEVICES=$all phase large-1gib 120 "$bin/gpu_test_nccl_large"
  # GradientSync over NCCL (199-259 s on 4 GPUs, runs 60 and 69).
  CUDA_VISIBLE_DEVICES=$all phase fusion-test 360 "$bin/gpu_test_nccl_fusion"
  # The fused compressed reduction's kernel, at 2 ranks (processes), under memcheck.
  needs fused-memcheck 2 && NCCLKIT_TEST_WORLD_SIZES=2 CUDA_VISIBLE_DEVICES=$all phase fused-memcheck 180 \
    /usr/local/cuda/bin/compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 \
    "$bin/gpu_test_nccl_fusion" --test-case='compressed_all_reduce*'

  # GradientSync's per-bucket callback over NCCL; a peer failing during the fused reduction
  # (exit and stall, four trials each, 3 s timeouts); the trainer on the digits classifier and
  # on the cuBLAS MLP (its gradients against a float64 reference, 2-GPU training).
  needs gradient-sync-test 2 && CUDA_VISIBLE_DEVICES=$all phase gradient-sync-test 270 "$bin/gpu_test_nccl_gradient_sync"
  # A user's .cu, compiled by nvcc, running one tuned compressed GradientSync on one GPU.
  CUDA_VISIBLE_DEVICES=0 phase nvcc-consumer 60 "$bin/nvcc_consumer" --gpu
  # The README's demo where GPUs are: the digits classifier on every GPU (exit 0: 95% reached).
  CUDA_VISIBLE_DEVICES=$all phase demo-gpu 60 "$bin/demo_gpu" --nprocs "$n"

  # ---- perf
  # What NCCLKIT_CHECK_COLLECTIVES costs per all_reduce (the same sweep without and with it).
  CUDA_VISIBLE_DEVICES=$all phase perf-p$n-check-off 60 "$bin/perf_nccl" -p "$n" -b 8 -e 1M -f 8 -n 400 -w 20 -R 5 \
    -O all_reduce -d float --csv "$data/perf_p${n}_check_off.csv"
  NCCLKIT_CHECK_COLLECTIVES=1 CUDA_VISIBLE_DEVICES=$all phase perf-p$n-check-on 60 "$bin/perf_nccl" -p "$n" -b 8 -e 1M \
    -f 8 -n 400 -w 20 -R 5 -O all_reduce -d float --csv "$data/perf_p${n}_check_on.csv"
  # ncclkit against raw NCCL in one harness, a process per GPU; correctness checked up to
  # 64 MiB (the engine's host check is single-threaded), 1 GiB by the large test. Small
  # messages get 2000 timed calls (20 rounds of 100) and the middle sizes 1000 (20 rounds of
  # 50): rounds of a dozen calls leave the comparison to noise, a median of 5 rounds lets
  # single rows land +3 to +11 us off where 20 rounds stay within +1.8, and 5 rounds of 40
  # at 1 MiB (a call of 11-18 us) moved the same code by 5-10% from one sweep to the next.
  CUDA_VISIBLE_DEVICES=$all phase perf-p$n-small 120 "$bin/perf_nccl" -p "$n" --raw -b 8 -e 64K -f 2 -n 2000 -w 50 -R 20 \
    -O all_reduce,all_gather,reduce_scatter,broadcast,all_to_all -d float --csv "$data/perf_p${n}_small.csv"
  CUDA_VISIBLE_DEVICES=$all phase perf-p$n 150 "$bin/perf_nccl" -p "$n" --raw -b 128K -e 64M -f 2 -n 1000 -w 20 -R 20 \
    -O all_reduce,all_gather,reduce_scatter,broadcast,all_to_all -d float --csv "$data/perf_p${n}.csv"
  CUDA_VISIBLE_DEVICES=$all phase perf-p$n-large 90 "$bin/perf_nccl" -p "$n" --raw -b 128M -e 1G -f 2 -n 20 -w 3 -R 5 -c 0 \
    -O all_reduce,all_gather,reduce_scatter,broadcast,all_to_all -d float --csv "$data/perf_p${n}_large.csv"
  # The peer: PyTorch's NCCL process group on the same sizes, the same method (exit 77, reported
  # as not run, where PyTorch is missing); scripts/perf_targets.py sets its rows beside ncclkit's.
  CUDA_VISIBLE_DEVICES=$all phase torch-p$n-small 90 python3 "$ROOT/bench/pytorch_nccl_bench.py" -p "$n" -b 8 -e 64K -f 2 \
    -n 2000 -w 50 -R 20 --csv "$data/perf_torch_p${n}_small.csv"
  CUDA_VISIBLE_DEVICES=$all phase torch-p$n 90 python3 "$ROOT/bench/pytorch_nccl_bench.py" -p "$n" -b 128K -e 64M -f 2 \
    -n 1000 -w 20 -R 20 --csv "$data/perf_torch_p${n}.csv"
  CUDA_VISIBLE_DEVICES=$all phase enqueue-bench 60 "$bin/bench_nccl_enqueue" --json "$data/enqueue.json"
  CUDA_VISIBLE_DEVICES=$all phase gbench-enqueue 60 "$bin/gbench_nccl_enqueue" --benchmark_repetitions=3 \
    --benchmark_out="$data/gbench_enqueue.json" --benchmark_out_format=json
  CUDA_VISIBLE_DEVICES=0 phase completion-marks 30 "$bin/bench_completion_marks"
  # One thread driving every GPU (-g: one grouped call per step), ncclkit and raw: every
  # collective checked, then all_reduce timed, with 100 steps per round as in perf-p4-small
  # (perf-p4 takes 50): with 40 (-n 200 -R 5 from 8 B) a round's start and end weigh on
  # every step, and the raw step itself took 31 us instead of 22.
  CUDA_VISIBLE_DEVICES=$all phase perf-g$n-check 60 "$bin/perf_nccl" -g "$n" --raw -b 8 -e 4M -f 16 -n 10 -w 2 -R 2 \
    -O all_reduce,all_gather,reduce_scatter,broadcast,all_to_all -d float,bfloat16,int32 -o sum,max
  CUDA_VISIBLE_DEVICES=$all phase perf-g$n-small 60 "$bin/perf_nccl" -g "$n" --raw -b 8 -e 64K -f 2 -n 2000 -w 50 -R 20 \
    -O all_reduce -d float --csv "$data/perf_g${n}_small.csv"
  CUDA_VISIBLE_DEVICES=$all phase perf-g$n 90 "$bin/perf_nccl" -g "$n" --raw -b 128K -e 256M -f 4 -n 500 -w 20 -R 5 \
    -O all_reduce -d float --csv "$data/perf_g${n}.csv"

  # ---- fusion-bench: the fusion benchmark beside PyTorch's (docs/performance.md).
  CUDA_VISIBLE_DEVICES=$all phase fusion-bench-p$n 240 "$bin/fusion_nccl" -p "$n" -n 20 -w 5 -R 5 --bucket-mb 8,50 \
    --codec-bucket-mb 50,100 --codec-chunks 2,4,8 --csv "$data/fusion_nccl_p$n.csv"
  # Timelines (NCCLKIT_TIMELINE) of the ResNet-50 rows: one Chrome trace per row and rank, in data/.
  mkdir -p "$data/timeline"
  NCCLKIT_TIMELINE="$data/timeline/resnet50" NCCLKIT_TIMELINE_STEPS=4 CUDA_VISIBLE_DEVICES=$all phase fusion-timeline 120 \
    "$bin/fusion_nccl" -p "$n" --model resnet50 -n 3 -w 1 -R 1 --codec fp16 --codec-chunks 2
  CUDA_VISIBLE_DEVICES=$all phase symmetric-windows 120 "$bin/bench_symmetric_windows" --iters 30 0.5 2 8 25 100 --gpt2
  CUDA_VISIBLE_DEVICES=$all phase torch-fusion-p$n 180 python3 "$ROOT/bench/pytorch_fusion_bench.py" --nprocs "$n" \
    -n 20 -w 5 -R 5 --csv "$data/pytorch_fusion_p$n.csv"
  CUDA_VISIBLE_DEVICES=$all phase torch-fusion-p$n-high 180 python3 "$ROOT/bench/pytorch_fusion_bench.py" \
    --nprocs "$n" --high-priority -n 20 -w 5 -R 5 --csv "$data/pytorch_fusion_p${n}_high.csv"

  # ---- fusion-ab: the fusion benchmark of a baseline build (carry/baseline) and of this one,
  # alternating old, new, new, old, on the same machine: a change that must not cost speed.
  local run which
  for run in old-1 new-1 new-2 old-2; do
    which="$bin/fusion_nccl"
    [[ $run == old-* ]] && which="$bin/baseline/fusion_nccl"
    CUDA_VISIBLE_DEVICES=$all phase fusion-ab-$run 150 "$which" -p "$n" -n 20 -w 5 -R 3 --codec fp16 \
      --codec-chunks 4 --csv "$data/fusion_ab_$run.csv"
  done

  # ---- copy-sweep: loose tensors against the batched copy's shape: blocks per SM
  # (NCCLKIT_COPY_BLOCKS_PER_SM; 0, the default: one short-lived block a chunk) and chunk size
  # (NCCLKIT_COPY_CHUNK_KB).
  local shape c k
  for shape in 4:64 0:64 0:16 0:32 0:128; do
    c=${shape%:*} k=${shape#*:}
    NCCLKIT_COPY_BLOCKS_PER_SM=$c NCCLKIT_COPY_CHUNK_KB=$k CUDA_VISIBLE_DEVICES=$all phase loose-copies-p$n-c$c-k$k 150 \
      "$bin/fusion_nccl" -p "$n" -n 20 -w 5 -R 5 --bucket-mb 100 --codec none --rows "loose 100,loose tuned,pack,bucketed" \
      --csv "$data/loose_copies_p${n}_c${c}_k$k.csv"
  done

  # ---- mlp-bench: the cuBLAS MLP trained by train_mlp beside PyTorch DDP on the same model,
  # batch and optimizer; every run at g GPUs appends to mlp_<impl>_p<g>.csv, which
  # scripts/mlp_table.py joins after the phases (each implementation against its own 1-GPU step).
  local mlp=(--depth 8 --width 4096 --batch 64,256 --steps 50 --warmup 10 --optimizer sgd --lr 0.01) g
  CUDA_VISIBLE_DEVICES=0 phase train-mlp-p1 60 "$bin/train_mlp" --nprocs 1 "${mlp[@]}" --codec none \
    --csv "$data/mlp_ncclkit_p1.csv"
  CUDA_VISIBLE_DEVICES=0 phase torch-mlp-p1 90 python3 "$ROOT/bench/ddp_mlp_bench.py" --nprocs 1 "${mlp[@]}" \
    --csv "$data/mlp_torch_p1.csv"
  for g in 2 4; do
    needs train-mlp-p$g $g && CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((g - 1))) phase train-mlp-p$g 90 "$bin/train_mlp" \
      --nprocs $g "${mlp[@]}" --codec none,fp16 --csv "$data/mlp_ncclkit_p$g.csv"
    # float32 gradients in two halves, the all-gather and update under the next forward (row
    # "ncclkit/defer", against ncclkit's 1-GPU step: at one GPU there is nothing to gather)
    needs train-mlp-defer-p$g $g && CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((g - 1))) phase train-mlp-defer-p$g 90 \
      "$bin/train_mlp" --nprocs $g "${mlp[@]}" --codec none --defer-gather --label defer \
      --csv "$data/mlp_ncclkit_p$g.csv"
    needs torch-mlp-p$g $g && CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((g - 1))) phase torch-mlp-p$g 120 python3 \
      "$ROOT/bench/ddp_mlp_bench.py" --nprocs $g "${mlp[@]}" --csv "$data/mlp_torch_p$g.csv"
  done
  # Where to cut the fused 16-bit exchange across two steps, modelled (bench/bench_split_step.cu
  # says how); its step times are in its log.
  needs split-step-p2 2 && CUDA_VISIBLE_DEVICES=0,1 phase split-step-p2 60 "$bin/bench_split_step" 64,256 198

  # ---- mlp-ablation: mlp-bench, then each overlap lever of train_mlp changed alone at 2 GPUs
  # (rows "ncclkit/NAME" in the same table): no overlap (one flat all-reduce after backward), the
  # comm stream at normal priority, the tuned bucket cap, NCCL's CTAs limited, the fused 16-bit
  # reduction on 66 blocks, one per SM (0: the communicator's default) or 264, two per SM
  # (train_mlp's default: 3 per 2 SMs), fewer SMs planned
  # by cuBLAS (at 1 GPU too); bf16 compute with float32 masters, and gradients zeroed and added
  # to rather than written (both at 1 GPU too); the optimizer's own pass instead of the update
  # fused into the 16-bit reduction.
  # One step's picture first: the fp16 buckets under backward at batch 64 (the timeline keeps the
  # first steps, so few warm-up steps; tools/timeline_svg.py draws it from the traces).
  needs mlp-timeline 2 && NCCLKIT_TIMELINE="$data/timeline/mlp" NCCLKIT_TIMELINE_STEPS=6 CUDA_VISIBLE_DEVICES=0,1 \
    phase mlp-timeline 60 "$bin/train_mlp" --nprocs 2 --depth 8 --width 4096 --batch 64 --steps 3 --warmup 3 \
    --reduce-repeats 1 --codec fp16
  local abl=(--nprocs 2 "${mlp[@]}" --codec none,fp16 --csv "$data/mlp_ablation_p2.csv") v
  local variants=(whole:"--bucket-mb whole" prio0:"--comm-priority 0" tune:"--tune" ctas8:"--max-ctas 8"
    ctas16:"--max-ctas 16" blocks66:"--reduce-blocks 66" blocks0:"--reduce-blocks 0" blocks264:"--reduce-blocks 264"
    cublas116:"--cublas-sms 116" cublas100:"--cublas-sms 100" bf16:"--precision bf16"
    addgrads:"--add-gradients" separate:"--separate-update")
  for v in "${variants[@]}"; do
    local name=${v%%:*} flags=${v#*:}
    if [[ $name == cublas* || $name == bf16 || $name == addgrads ]]; then
      # shellcheck disable=SC2086 # the variant's flags are words
      CUDA_VISIBLE_DEVICES=0 phase mlp-abl-$name-p1 60 "$bin/train_mlp" --nprocs 1 "${mlp[@]}" --codec none \
        $flags --label "$name" --csv "$data/mlp_ablation_p1.csv"
    fi
    # shellcheck disable=SC2086
    needs mlp-abl-$name 2 && CUDA_VISIBLE_DEVICES=0,1 phase mlp-abl-$name 120 "$bin/train_mlp" "${abl[@]}" \
      $flags --label "$name"
  done
}

# ---- the bookkeeping ---------------------------------------------------------------------------

# The run's clock, in seconds since it started (dry runs advance it by their fake durations).
# A dry run counts its fake durations alone: its own seconds of bookkeeping depend on the
# machine's load, and would make the times it prints (and its tests) vary.
now() { NOW=$(( (DRY_RUN ? 0 : SECONDS - START) + FAKE_ELAPSED)); }

is_selected() { [[ " $SELECTED " == *" $1 "* ]]; }
is_test_phase() { [[ " $TEST_PHASES " == *" $1 "* ]]; }

# A selected phase that did not run, and why (reported as INCOMPLETE).
not_run() {
  NOT_RUN+=("$1: $2")
  printf '%-44s NOT RUN: %s\n' "$1" "$2" >>"$SUMMARY"
}

# needs NAME GPUS: true where the machine has GPUS GPUs; else NAME, if selected, did not run.
needs() {
  SEEN+=" $1 "
  ((GPUS >= $2)) && return 0
  is_selected "$1" && not_run "$1" "needs $2 GPUs, this machine has $GPUS"
  return 1
}

# covered NAME BY: on this machine phase NAME would repeat phase BY (the same GPUs).
covered() {
  SEEN+=" $1 "
  is_selected "$1" || return 0
  if is_selected "$2"; then
    printf '%-44s the same as %s on %s GPU(s)\n' "$1" "$2" "$GPUS" >>"$SUMMARY"
  else
    not_run "$1" "the same as $2 on $GPUS GPU(s): select $2"
  fi
}

# A fake phase for --dry-run: GPU_RUN_FAKE="name=RC[@SECONDS[@CASES]] ..." says how a phase
# ends (default: exit 0 after 1 s, 3 test cases for a test phase); the clock advances by the
# seconds without waiting; a phase that would outlast its limit ends as timed out.
fake_phase() {
  local name=$1 limit=$2 spec="" entry
  for entry in ${GPU_RUN_FAKE:-}; do [[ ${entry%%=*} == "$name" ]] && spec=${entry#*=}; done
  local rc=0 took=1 cases=3
  IFS=@ read -r rc took cases <<<"${spec:-0@1@3}"
  rc=${rc:-0} took=${took:-1} cases=${cases:-3}
  if ((took > limit)); then
    FAKE_ELAPSED=$((FAKE_ELAPSED + limit))
    return 124
  fi
  FAKE_ELAPSED=$((FAKE_ELAPSED + took))
  if ((rc == 77)); then
    echo "SKIPPED: (fake)"
  elif is_test_phase "$name"; then
    local failed=$((rc == 0 ? 0 : 1))
    echo "[doctest] test cases: $cases | $((cases - failed)) passed | $failed failed | 0 skipped"
  fi
  return "$rc"
}

# phase NAME LIMIT COMMAND...: runs one command with a timeout, logs it, tallies doctest's
# counts.
phase() {
  local name="$1" limit="$2"
  shift 2
  SEEN+=" $name "
  is_selected "$name" || return 0
  now
  local left=$((BUDGET - NOW))
  if ((left < GPU_RUN_MIN_PHASE_S)); then
    not_run "$name" "cut by the time budget (${NOW} s of ${BUDGET} s used)"
    return 0
  fi
  # Never run past the budget: a phase gets at most what is left of it.
  local given=$limit
  ((given > left)) && given=$left
  # The GPUs this phase makes visible: the tests must use all of them.
  local visible=$GPUS devices
  if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
    IFS=, read -ra devices <<<"$CUDA_VISIBLE_DEVICES"
    visible=${#devices[@]}
  fi
  local log="$LOGS/$name.log"
  local environment=""
  local variable
  for variable in CUDA_VISIBLE_DEVICES NCCLKIT_TEST_WORLD_SIZES NCCLKIT_TEST_COLLECTIVE_PATH NCCL_P2P_DISABLE \
    NCCL_SHM_DISABLE NCCLKIT_CHECK_COLLECTIVES NCCLKIT_COPY_BLOCKS_PER_SM NCCLKIT_COPY_CHUNK_KB NCCLKIT_TIMELINE; do
    [[ -n "${!variable+set}" ]] && environment+="$variable=${!variable} "
  done
  environment+="NCCLKIT_TEST_REQUIRE_GPUS=$visible"
  echo "\$ $environment $*" >"$log"
  ((DRY_RUN)) && echo "$name (limit ${limit} s): $environment $*"
  local t0=$NOW rc
  if ((DRY_RUN)); then
    fake_phase "$name" "$given" >>"$log" 2>&1
  else
    NCCLKIT_TEST_REQUIRE_GPUS=$visible timeout --kill-after=10 "$given" "$@" >>"$log" 2>&1
  fi
  rc=$?
  now
  local took=$((NOW - t0))
  # doctest's last tally ("[doctest] test cases: 3 | 3 passed | 0 failed | ...") and the SKIP lines.
  local run passed failed skips
  read -r run passed failed skips < <(awk '
    /^\[doctest\] test cases:/ { gsub(/[|:]/, " "); run = $4; passed = $5; failed = $7 }
    /^SKIP:/ { ++skips }
    END { print run + 0, passed + 0, failed + 0, skips + 0 }' "$log")
  CASES_RUN=$((CASES_RUN + run))
  CASES_PASSED=$((CASES_PASSED + passed))
  CASES_FAILED=$((CASES_FAILED + failed))
  local verdict=ok
  if ((rc == 77)); then
    verdict="SKIPPED (exit 77)"
    NOT_RUN+=("$name: skipped (exit 77; its log says why)")
  elif ((rc == 124 || rc == 137)) && ((given < limit)); then
    verdict="CUT after ${given} s"
    NOT_RUN+=("$name: cut by the time budget after ${given} s")
  elif ((rc == 124 || rc == 137)); then
    verdict="TIMED OUT after ${limit} s"
    FAILED+=("$name")
  elif ((rc != 0)); then
    verdict="FAILED rc=$rc"
    FAILED+=("$name")
  elif is_test_phase "$name" && ((run == 0)); then
    verdict="FAILED: no test case"
    FAILED+=("$name")
  fi
  printf '%-44s %-22s %4ss  cases %s run / %s passed / %s failed  SKIP lines %s\n' "$name" "$verdict" "$took" \
    "$run" "$passed" "$failed" "$skips" >>"$SUMMARY"
}

# ---- the GPU machine's half ---------------------------------------------------------------------

# The libraries a carried binary needs and this machine's loader cannot find, one "BINARY: LIBRARY"
# line each.
missing_libraries() {
  local binary
  for binary in "$CARRY"/*; do
    [[ -f "$binary" && -x "$binary" ]] || continue
    ldd "$binary" 2>/dev/null | awk -v b="${binary##*/}" '/=> not found/ {print b ": " $1}'
  done
}

# cuBLAS (train_mlp, and tests_gpu for the cuBLAS MLP's test) does not travel (hundreds of MB): it
# is loaded from the machine's CUDA folder. Where that lacks a library, the same one from the
# CUDA wheels of PyTorch (python3's nvidia/ packages) is taken: only the folders of the missing
# libraries, appended, so that nothing already found (NCCL above all) changes. Prints a line per
# library still missing.
find_missing_libraries() {
  local missing name folder
  missing=$(missing_libraries)
  [[ -z "$missing" ]] && return 0
  for name in $(awk '{print $2}' <<<"$missing" | sort -u); do
    folder=$(python3 -c 'import glob, os, sys, nvidia
for root in nvidia.__path__:
    for path in sorted(glob.glob(os.path.join(root, "**", sys.argv[1]), recursive=True)):
        print(os.path.dirname(path)); sys.exit()' "$name" 2>/dev/null)
    if [[ -n "$folder" && ":$LD_LIBRARY_PATH:" != *":$folder:"* ]]; then
      export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$folder"
      echo "library $name: from PyTorch's CUDA wheels, $folder"
    fi
  done
  missing_libraries | sed 's/^/MISSING LIBRARY (the phases that run it will fail): /'
}

run_all() {
  DRY_RUN=0
  if [[ "${1:-}" == --dry-run ]]; then
    DRY_RUN=1
    shift
  fi
  local out="${1:-${OUT:-$ROOT/out}}"
  BUDGET="${GPU_RUN_BUDGET:-540}"
  GPU_RUN_MIN_PHASE_S="${GPU_RUN_MIN_PHASE_S:-15}"  # a phase starts only with this much budget left
  LOGS="$out/logs" DATA="$out/data"
  mkdir -p "$LOGS" "$DATA"
  SUMMARY="$out/summary.txt"
  : >"$SUMMARY"
  START=$SECONDS FAKE_ELAPSED=0
  CASES_RUN=0 CASES_PASSED=0 CASES_FAILED=0
  FAILED=() NOT_RUN=() SEEN=""
  # Rules of the GPU machines: no NVLink multicast, in every process we start too.
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
  export LD_LIBRARY_PATH="$CARRY:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

  # The GPUs: nvidia-smi's list (capped at 4, what the tests use); --dry-run pretends
  # GPU_RUN_FAKE_GPUS (default 2).
  if ((DRY_RUN)); then
    GPUS=${GPU_RUN_FAKE_GPUS:-2}
  else
    GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  fi
  if ((GPUS < 1)); then
    echo "gpu-run: nvidia-smi lists no GPU here: nothing can run" | tee -a "$SUMMARY"
    return 1
  fi
  ((GPUS > 4)) && GPUS=4
  ALL=$(seq -s, 0 $((GPUS - 1)))

  # The doctest phases of the tests set (the nvcc consumer is a plain program: its exit status says it).
  TEST_PHASES=$(set_phases "$GPUS" tests)
  TEST_PHASES=${TEST_PHASES/ nvcc-consumer/}
  TEST_PHASES=${TEST_PHASES/ demo-gpu/}
  local set="${GPU_RUN_SET:-tests}"
  if [[ -n "${GPU_RUN_PHASES:-}" ]]; then
    SELECTED=$(echo $GPU_RUN_PHASES)  # unquoted: one line, single spaces
    set="(GPU_RUN_PHASES)"
  elif ! SELECTED=$(set_phases "$GPUS" "$set"); then
    echo "gpu-run: GPU_RUN_SET=$set is not a set: one of $SET_NAMES" | tee -a "$SUMMARY" >&2
    return 2
  fi

  # PyTorch's NCCL, where its version is the one the binaries were built against: both sides of
  # a comparison then run the same NCCL (the system's is 2.28.3 on some machines; the fused
  # compressed reduction runs with either, a patch release apart).
  local torch_nccl="" built_nccl torch_version=""
  built_nccl=$(sed -n 's/^nccl.h //p' "$CARRY/BUILD_INFO" 2>/dev/null)
  ((DRY_RUN)) || torch_nccl=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)
  if [[ -n "$torch_nccl" && -e "$torch_nccl/lib/libnccl.so.2" ]]; then
    torch_version=$(nccl_header_version "$torch_nccl/include/nccl.h")
    if [[ -n "$built_nccl" && "$torch_version" == "$built_nccl" && "${GPU_RUN_NCCL:-}" != system ]]; then
      export LD_LIBRARY_PATH="$CARRY:$torch_nccl/lib:${LD_LIBRARY_PATH#"$CARRY:"}"
    fi
  fi

  {
    echo "# GPU run $(date -u +%Y-%m-%dT%H:%M:%SZ)$( ((DRY_RUN)) && echo ' (dry run: every phase faked)')"
    cat "$CARRY/BUILD_INFO" 2>/dev/null
    if ((!DRY_RUN)); then
      nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1
      echo "host: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs"  # host speed differs between machines
      echo "NCCL: $(ls /lib/x86_64-linux-gnu/libnccl.so.* /usr/local/cuda/lib*/libnccl.so.* 2>/dev/null | tr '\n' ' ')"
      if [[ "$LD_LIBRARY_PATH" == *"$torch_nccl/lib"* && -n "$torch_nccl" ]]; then
        echo "NCCL used: PyTorch's $torch_version, $torch_nccl/lib/libnccl.so.2 (the build's is $built_nccl)"
      else
        echo "NCCL used: the system's (the build's is ${built_nccl:-unknown}; PyTorch's ${torch_version:-none})"
      fi
    fi
    echo "GPUs used: $GPUS ($ALL); set $set: $SELECTED; budget $BUDGET s"
  } >>"$SUMMARY" 2>&1
  ((DRY_RUN)) || nvidia-smi topo -m >"$LOGS/topology.txt" 2>&1
  ((DRY_RUN)) || find_missing_libraries >>"$SUMMARY"

  define_phases

  # Selected names that are no phase on this machine (a typo, or perf-p4 on 2 GPUs).
  local name
  for name in $SELECTED; do
    [[ " $SEEN " == *" $name "* ]] || not_run "$name" "no such phase on $GPUS GPU(s)"
  done

  now
  # A plot of busbw against size from the perf CSVs (matplotlib is there on the GPU machines).
  local csvs=() f
  for f in "$DATA"/perf_*.csv; do [[ -s "$f" ]] && csvs+=("$f"); done
  if ((${#csvs[@]})); then
    local card
    card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
    python3 "$ROOT/scripts/plot_busbw.py" "$out/busbw.png" "${csvs[@]}" \
      --title "perf_nccl, $card, $(date -u +%Y-%m-%d)" >>"$SUMMARY" 2>&1 || echo "plot failed" >>"$SUMMARY"
  fi
  echo "TOTAL: $CASES_RUN test cases run, $CASES_PASSED passed, $CASES_FAILED failed; ${#FAILED[@]} failed phases; $NOW s" \
    >>"$SUMMARY"
  # The targets, and PyTorch beside ncclkit, from the perf CSVs.
  if ((${#csvs[@]})); then
    python3 "$ROOT/scripts/perf_targets.py" "${csvs[@]}" >>"$SUMMARY" 2>&1 || echo "perf_targets failed" >>"$SUMMARY"
  fi
  # The GPU trainer benchmark's table, from train_mlp's and ddp_mlp_bench.py's CSVs.
  local mlp_csvs=()
  for f in "$DATA"/mlp_*.csv; do [[ -s "$f" ]] && mlp_csvs+=("$f"); done
  if ((${#mlp_csvs[@]})); then
    local table_status=0
    python3 "$ROOT/scripts/mlp_table.py" "${mlp_csvs[@]}" >"$DATA/mlp_table.md" 2>&1 || table_status=$?
    cat "$DATA/mlp_table.md" >>"$SUMMARY"
    ((table_status == 0)) || echo "mlp_table failed (exit $table_status): its lines above say why" >>"$SUMMARY"
    # Scaling efficiency against the GPU count, from mlp-bench's files (not the ablation's).
    local scaling=()
    for f in "$DATA"/mlp_ncclkit_p*.csv "$DATA"/mlp_torch_p*.csv; do [[ -s "$f" ]] && scaling+=("$f"); done
    if ((${#scaling[@]})); then
      python3 "$ROOT/scripts/mlp_plot.py" "$DATA/mlp_scaling.svg" "${scaling[@]}" \
        --title "8 x 4096 MLP, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%Y-%m-%d)" \
        >>"$SUMMARY" 2>&1 || echo "mlp_plot failed" >>"$SUMMARY"
    fi
  fi
  # Few files come back from a GPU machine: the logs and the data travel as one archive.
  tar -C "$out" -czf "$out/results.tar.gz" logs data && rm -rf "$LOGS" "$DATA"
  local status=0
  {
    if ((${#FAILED[@]})); then
      echo "FAILED: ${#FAILED[@]} phase(s): ${FAILED[*]}"
      status=1
    elif ((CASES_FAILED)); then
      echo "FAILED: $CASES_FAILED test case(s)"
      status=1
    fi
    if ((${#NOT_RUN[@]})); then
      echo "INCOMPLETE: ${#NOT_RUN[@]} selected phase(s) did not run:"
      printf '  %s\n' "${NOT_RUN[@]}"
      ((status)) || status=3
    fi
    ((status)) || echo "PASSED: every selected phase ran and passed ($set)"
  } >>"$SUMMARY"
  cat "$SUMMARY"
  return "$status"
}

case "${1:-}" in
  build) build ;;
  run)
    shift
    run_all "$@"
    ;;
  *)
    echo "usage: scripts/gpu-run.sh build | run [--dry-run] [OUT]" >&2
    exit 2
    ;;
esac
