#!/usr/bin/env bash
# GPU test and benchmark runs of the NCCL backend, in two halves:
#
#   scripts/gpu-run.sh build        # here (no GPU needed): build for sm_90 into build-gpu/,
#                                   # copy the stripped binaries into build-gpu/carry/
#   scripts/gpu-run.sh run [OUT]    # on the GPU machine, in the repository root, with
#                                   # build-gpu/carry carried along: runs everything, writes
#                                   # summary.txt, logs.tar.gz and the perf CSV/JSON into OUT
#
# The GPU machine has no compiler toolchain for this project's dependencies (doctest, Gloo), so
# binaries are built here and carried (../shared/gpu.md). With the `run` tool of the GPU
# machines (docs/dev/gpu-runs.md has the exact call):
#   run(kind="nvidia-h100-x4", carry=["build-gpu/carry"], command="scripts/gpu-run.sh run $OUT")
#
# `run` exits non-zero when anything failed, when a phase timed out, or when zero test cases
# ran (a run that tested nothing is a failure, not a pass). The phases share a time budget
# (GPU_RUN_BUDGET seconds, default 540): a phase gets at most what is left of it, and phases
# that find it spent are reported as skipped. GPU_RUN_PHASES (a space-separated list of phase
# names) runs only those phases.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD_DIR:-$ROOT/build-gpu}"
CARRY="$BUILD/carry"
TESTS=(tests_gpu tests_gpu_grouped)
BENCHES=(perf_nccl bench_nccl_enqueue gbench_nccl_enqueue bench_completion_marks fusion_nccl bench_symmetric_windows)

build() {
  local jobs="${BUILD_JOBS:-1}"  # nvcc is slow and the build machine's cores are shared
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || return 1
  local target
  for target in "${TESTS[@]}" "${BENCHES[@]}"; do
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
  strip --strip-debug "$CARRY"/*
  # The phases below run one test file each, by the name of its CTest test: a script that runs
  # the GPU test executable on that file's test cases (the communicator's with the kernels').
  local name files
  for name in check communicator collectives large watchdog fusion codec; do
    files="*/test_nccl_$name.cpp"
    [[ $name == communicator ]] && files+=",*/test_nccl_kernels.cu"
    printf '#!/bin/sh\nexec "$(dirname "$0")/tests_gpu" "--source-file=%s" "$@"\n' "$files" >"$CARRY/gpu_test_nccl_$name"
  done
  printf '#!/bin/sh\nexec "$(dirname "$0")/tests_gpu_grouped" "$@"\n' >"$CARRY/gpu_test_nccl_collectives_grouped"
  chmod +x "$CARRY"/gpu_test_nccl_*
  {
    echo "commit $(git -C "$ROOT" rev-parse HEAD)$(git -C "$ROOT" diff --quiet HEAD -- include tools tests/gpu bench || echo ' (plus uncommitted changes)')"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname) for sm_90"
    echo "nvcc $(/usr/local/cuda/bin/nvcc --version | tail -1)"
  } >"$CARRY/BUILD_INFO"
  du -sh "$CARRY"
  echo "carry build-gpu/carry; on the GPU machine run: scripts/gpu-run.sh run \$OUT"
}

# ---- the GPU machine's half ---------------------------------------------------------------------

run_all() {
  local out="${1:-${OUT:-$ROOT/out}}"
  local budget="${GPU_RUN_BUDGET:-540}"
  local logs="$out/logs" data="$out/data"
  mkdir -p "$logs" "$data"
  local summary="$out/summary.txt"
  : >"$summary"
  local start_time=$SECONDS
  # Rules of the GPU machines: no NVLink multicast, in every process we start too.
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
  export LD_LIBRARY_PATH="$CARRY:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # PyTorch's NCCL, where there is one, for ncclkit too: both sides of a comparison then run the
  # same NCCL, and it is the version the binaries were built against (2.28.9) where the system's
  # is older (2.28.3 on some H100 machines), which the fused compressed reduction needs.
  local torch_nccl
  torch_nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  if [[ -n "$torch_nccl" && -e "$torch_nccl/libnccl.so.2" ]]; then
    export LD_LIBRARY_PATH="$CARRY:$torch_nccl:${LD_LIBRARY_PATH#"$CARRY:"}"
    # The GPU tests then require the fused kernel wherever its version matches the build's.
    export NCCLKIT_TEST_REQUIRE_FUSED=1
  fi
  local cases_run=0 cases_passed=0 cases_failed=0 failures=0

  {
    echo "# GPU run $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    cat "$CARRY/BUILD_INFO" 2>/dev/null
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1
    echo "host: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs"  # host speed differs between machines
    echo "NCCL: $(ls /lib/x86_64-linux-gnu/libnccl.so.* /usr/local/cuda/lib*/libnccl.so.* 2>/dev/null | tr '\n' ' ')"
    if [[ -n "$torch_nccl" ]]; then echo "NCCL used: PyTorch's, $torch_nccl/libnccl.so.2"; else echo "NCCL used: the system's"; fi
  } >>"$summary" 2>&1
  nvidia-smi topo -m >"$logs/topology.txt" 2>&1

  # phase NAME TIMEOUT COMMAND...: runs one command with a timeout, logs it, tallies doctest's
  # counts. Exit 77 means "skipped: no GPU" and counts zero cases.
  phase() {
    local name="$1" limit="$2"
    shift 2
    if [[ -n "${GPU_RUN_PHASES:-}" && " $GPU_RUN_PHASES " != *" $name "* ]]; then
      return
    fi
    local elapsed=$((SECONDS - start_time))
    if ((elapsed + 15 > budget)); then
      printf '%-44s SKIPPED (time budget: %ss used of %ss)\n' "$name" "$elapsed" "$budget" >>"$summary"
      return
    fi
    # Never run past the budget: a phase gets at most what is left of it.
    ((limit > budget - elapsed)) && limit=$((budget - elapsed))
    local log="$logs/$name.log"
    local t0=$SECONDS
    echo "\$ $*" >"$log"
    timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    local took=$((SECONDS - t0))
    local counts run=0 passed=0 failed=0
    counts=$(grep -E '^\[doctest\] test cases:' "$log" | tail -1)
    if [[ -n "$counts" ]]; then
      run=$(sed -E 's/.*test cases: *([0-9]+).*/\1/' <<<"$counts")
      passed=$(sed -E 's/.*\| *([0-9]+) passed.*/\1/' <<<"$counts")
      failed=$(sed -E 's/.*\| *([0-9]+) failed.*/\1/' <<<"$counts")
    fi
    cases_run=$((cases_run + run))
    cases_passed=$((cases_passed + passed))
    cases_failed=$((cases_failed + failed))
    local verdict=ok
    if ((rc == 77)); then
      verdict="skipped (see its log)"
    elif ((rc == 124 || rc == 137)); then
      verdict="TIMED OUT after ${limit}s"
      failures=$((failures + 1))
    elif ((rc != 0)); then
      verdict="FAILED rc=$rc"
      failures=$((failures + 1))
    fi
    local skips
    skips=$(grep -c '^SKIP:' "$log")
    printf '%-44s %-22s %4ss  cases %s run / %s passed / %s failed  SKIP lines %s\n' "$name" "$verdict" "$took" \
      "$run" "$passed" "$failed" "$skips" >>"$summary"
  }

  local bin="$CARRY"
  # Every GPU of the machine (4 on the usual kind; the phases follow a machine with fewer).
  local gpus
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  ((gpus >= 1 && gpus <= 4)) || gpus=4
  local all
  all=$(seq -s, 0 $((gpus - 1)))
  local n=$gpus
  echo "GPUs used: $gpus ($all)" >>"$summary"
  # 0. NCCLKIT_CHECK_COLLECTIVES: mismatches caught on every rank, and what the check costs per
  #    all_reduce (the same sweep without and with it).
  CUDA_VISIBLE_DEVICES=$all phase check 120 "$bin/gpu_test_nccl_check"
  CUDA_VISIBLE_DEVICES=$all phase perf-p$n-check-off 60 "$bin/perf_nccl" -p "$n" -b 8 -e 1M -f 8 -n 400 -w 20 -R 5 \
    -O all_reduce -d float --csv "$data/perf_p${n}_check_off.csv"
  NCCLKIT_CHECK_COLLECTIVES=1 CUDA_VISIBLE_DEVICES=$all phase perf-p$n-check-on 60 "$bin/perf_nccl" -p "$n" -b 8 -e 1M \
    -f 8 -n 400 -w 20 -R 5 -O all_reduce -d float --csv "$data/perf_p${n}_check_on.csv"
  # 1. Everything on the 4 GPUs (the tests run worlds of 1, 2 and 4 themselves).
  CUDA_VISIBLE_DEVICES=$all phase communicator-4gpu 200 "$bin/gpu_test_nccl_communicator"
  # Fusion: GradientSync over NCCL, then the fusion benchmark beside PyTorch's (docs/performance.md).
  CUDA_VISIBLE_DEVICES=$all phase fusion-test 300 "$bin/gpu_test_nccl_fusion"
  CUDA_VISIBLE_DEVICES=0 phase codec-test 60 "$bin/gpu_test_nccl_codec"
  # The codec and batched-copy kernels under compute-sanitizer's memcheck (memory errors; not the
  # CUDA API errors NCCL provokes on purpose when it probes for kernels).
  CUDA_VISIBLE_DEVICES=0 phase codec-memcheck 120 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --report-api-errors no \
    --error-exitcode 1 "$bin/gpu_test_nccl_codec"
  # The fused compressed reduction's kernel, at 2 ranks (processes), under memcheck as well.
  NCCLKIT_TEST_WORLD_SIZES=2 CUDA_VISIBLE_DEVICES=$all phase fused-memcheck 180 /usr/local/cuda/bin/compute-sanitizer \
    --tool memcheck --report-api-errors no --error-exitcode 1 "$bin/gpu_test_nccl_fusion" --test-case='compressed_all_reduce*'
  CUDA_VISIBLE_DEVICES=$all phase fusion-bench-p$n 240 "$bin/fusion_nccl" -p "$n" -n 20 -w 5 -R 5 --bucket-mb 8,50 \
    --codec-bucket-mb 50,100 --codec-chunks 2,4,8 --csv "$data/fusion_nccl_p$n.csv"
  # Loose tensors against the batched copy's shape: blocks per SM (NCCLKIT_COPY_BLOCKS_PER_SM;
  # 0, the default: one short-lived block a chunk) and chunk size (NCCLKIT_COPY_CHUNK_KB).
  local shape c k
  for shape in 4:64 0:64 0:16 0:32 0:128; do
    c=${shape%:*} k=${shape#*:}
    NCCLKIT_COPY_BLOCKS_PER_SM=$c NCCLKIT_COPY_CHUNK_KB=$k CUDA_VISIBLE_DEVICES=$all phase loose-copies-p$n-c$c-k$k 150 \
      "$bin/fusion_nccl" -p "$n" -n 20 -w 5 -R 5 --bucket-mb 100 --codec none --rows "loose 100,loose tuned,pack,bucketed" \
      --csv "$data/loose_copies_p${n}_c${c}_k$k.csv"
  done
  # Timelines (NCCLKIT_TIMELINE) of the ResNet-50 rows: one Chrome trace per row and rank, in data/.
  mkdir -p "$data/timeline"
  NCCLKIT_TIMELINE="$data/timeline/resnet50" NCCLKIT_TIMELINE_STEPS=4 CUDA_VISIBLE_DEVICES=$all phase fusion-timeline 120 \
    "$bin/fusion_nccl" -p "$n" --model resnet50 -n 3 -w 1 -R 1 --codec fp16 --codec-chunks 2
  CUDA_VISIBLE_DEVICES=$all phase symmetric-windows 120 "$bin/bench_symmetric_windows" --iters 30 0.5 2 8 25 100 --gpt2
  CUDA_VISIBLE_DEVICES=$all phase torch-fusion-p$n 180 python3 "$ROOT/bench/pytorch_fusion_bench.py" --nprocs "$n" \
    -n 20 -w 5 -R 5 --csv "$data/pytorch_fusion_p$n.csv"
  CUDA_VISIBLE_DEVICES=$all phase torch-fusion-p$n-high 180 python3 "$ROOT/bench/pytorch_fusion_bench.py" \
    --nprocs "$n" --high-priority -n 20 -w 5 -R 5 --csv "$data/pytorch_fusion_p${n}_high.csv"
  # The matrix runs twice per world (a process per GPU, then one process driving all GPUs
  # through a LocalGroup, whose host-side checks run one member after another): about 31 s
  # for the process mode alone at worlds 1, 2, 4; about 100 s expected for both.
  CUDA_VISIBLE_DEVICES=$all phase collectives-4gpu 300 "$bin/gpu_test_nccl_collectives"
  # The same matrix (both modes) with all_to_all, gather and scatter on the grouped send/recv
  # path of NCCL < 2.28 (built with NCCLKIT_NCCL_GROUPED_FALLBACKS); worlds 2 and 4 only, where
  # the grouped path has peers to exchange with. The log says which path the binary took.
  NCCLKIT_TEST_WORLD_SIZES=2,4 CUDA_VISIBLE_DEVICES=$all phase collectives-grouped 180 \
    "$bin/gpu_test_nccl_collectives_grouped" "-tc=every collective*,single-process matrix*"
  CUDA_VISIBLE_DEVICES=$all phase watchdog-drills-4gpu 150 "$bin/gpu_test_nccl_watchdog"
  # 2. Perf: ncclkit against raw NCCL in one harness, 4 processes; correctness checked up to
  #    64 MiB (the engine's host check is single-threaded), 1 GiB by the large test. Small
  #    messages get 2000 timed calls (20 rounds of 100) and the middle sizes 1000 (20 rounds of
  #    50): rounds of a dozen calls leave the comparison to noise, a median of 5 rounds lets
  #    single rows land +3 to +11 us off where 20 rounds stay within +1.8, and 5 rounds of 40
  #    at 1 MiB (a call of 11-18 us) moved the same code by 5-10% from one sweep to the next.
  CUDA_VISIBLE_DEVICES=$all phase perf-p$n-small 120 "$bin/perf_nccl" -p "$n" --raw -b 8 -e 64K -f 2 -n 2000 -w 50 -R 20 \
    -O all_reduce,all_gather,reduce_scatter,broadcast,all_to_all -d float --csv "$data/perf_p${n}_small.csv"
  CUDA_VISIBLE_DEVICES=$all phase perf-p$n 150 "$bin/perf_nccl" -p "$n" --raw -b 128K -e 64M -f 2 -n 1000 -w 20 -R 20 \
    -O all_reduce,all_gather,reduce_scatter,broadcast,all_to_all -d float --csv "$data/perf_p${n}.csv"
  CUDA_VISIBLE_DEVICES=$all phase perf-p$n-large 90 "$bin/perf_nccl" -p "$n" --raw -b 128M -e 1G -f 2 -n 20 -w 3 -R 5 -c 0 \
    -O all_reduce,all_gather,reduce_scatter,broadcast,all_to_all -d float --csv "$data/perf_p${n}_large.csv"
  # The peer: PyTorch's NCCL process group on the same sizes, the same method (exit 77, reported
  # as skipped, where PyTorch is missing); scripts/perf_targets.py sets its rows beside ncclkit's.
  CUDA_VISIBLE_DEVICES=$all phase torch-p$n-small 90 python3 "$ROOT/bench/pytorch_nccl_bench.py" -p "$n" -b 8 -e 64K -f 2 \
    -n 2000 -w 50 -R 20 --csv "$data/perf_torch_p${n}_small.csv"
  CUDA_VISIBLE_DEVICES=$all phase torch-p$n 90 python3 "$ROOT/bench/pytorch_nccl_bench.py" -p "$n" -b 128K -e 64M -f 2 \
    -n 1000 -w 20 -R 20 --csv "$data/perf_torch_p${n}.csv"
  CUDA_VISIBLE_DEVICES=$all phase enqueue-bench 60 "$bin/bench_nccl_enqueue" --json "$data/enqueue.json"
  CUDA_VISIBLE_DEVICES=$all phase gbench-enqueue 60 "$bin/gbench_nccl_enqueue" --benchmark_repetitions=3 \
    --benchmark_out="$data/gbench_enqueue.json" --benchmark_out_format=json
  CUDA_VISIBLE_DEVICES=0 phase completion-marks 30 "$bin/bench_completion_marks"
  # 3. NCCL's network transport between the GPUs of this host: a stand-in for two nodes.
  NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 CUDA_VISIBLE_DEVICES=$all phase watchdog-drills-net 150 "$bin/gpu_test_nccl_watchdog"
  # (Both matrix modes: 23 s before the single-process matrix was added.)
  NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCLKIT_TEST_WORLD_SIZES=2,4 CUDA_VISIBLE_DEVICES=$all \
    phase collectives-net 240 "$bin/gpu_test_nccl_collectives"
  # 4. 1 GiB collectives.
  CUDA_VISIBLE_DEVICES=$all phase large-1gib 180 "$bin/gpu_test_nccl_large"
  # 5. The tests adapt to 1 and 2 visible GPUs (and say what they skip).
  CUDA_VISIBLE_DEVICES=0 phase communicator-1gpu 90 "$bin/gpu_test_nccl_communicator"
  CUDA_VISIBLE_DEVICES=0 phase watchdog-1gpu 30 "$bin/gpu_test_nccl_watchdog"
  CUDA_VISIBLE_DEVICES=0,1 phase communicator-2gpu 90 "$bin/gpu_test_nccl_communicator"
  # 6. One thread driving 4 GPUs (-g: one grouped call per step), ncclkit and raw: every
  #    collective checked, then all_reduce timed, with 100 steps per round as in perf-p4-small
  #    (perf-p4 takes 50): with 40 (-n 200 -R 5 from 8 B) a round's start and end weigh on
  #    every step, and the raw step itself took 31 us instead of 22.
  CUDA_VISIBLE_DEVICES=$all phase perf-g$n-check 60 "$bin/perf_nccl" -g "$n" --raw -b 8 -e 4M -f 16 -n 10 -w 2 -R 2 \
    -O all_reduce,all_gather,reduce_scatter,broadcast,all_to_all -d float,bfloat16,int32 -o sum,max
  CUDA_VISIBLE_DEVICES=$all phase perf-g$n-small 60 "$bin/perf_nccl" -g "$n" --raw -b 8 -e 64K -f 2 -n 2000 -w 50 -R 20 \
    -O all_reduce -d float --csv "$data/perf_g${n}_small.csv"
  CUDA_VISIBLE_DEVICES=$all phase perf-g$n 90 "$bin/perf_nccl" -g "$n" --raw -b 128K -e 256M -f 4 -n 500 -w 20 -R 5 \
    -O all_reduce -d float --csv "$data/perf_g${n}.csv"

  # A plot of busbw against size from the perf CSVs (matplotlib is there on the GPU machines).
  local csvs=()
  for f in "$data"/perf_*.csv; do [[ -s "$f" ]] && csvs+=("$f"); done
  if ((${#csvs[@]})); then
    local card
    card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
    python3 "$ROOT/scripts/plot_busbw.py" "$out/busbw.png" "${csvs[@]}" \
      --title "perf_nccl, $card, $(date -u +%Y-%m-%d)" >>"$summary" 2>&1 || echo "plot failed" >>"$summary"
  fi
  {
    echo "TOTAL: $cases_run test cases run, $cases_passed passed, $cases_failed failed; $failures failed phases; $((SECONDS - start_time)) s"
  } >>"$summary"
  # The targets, and PyTorch beside ncclkit, from the perf CSVs.
  if ((${#csvs[@]})); then
    python3 "$ROOT/scripts/perf_targets.py" "${csvs[@]}" >>"$summary" 2>&1 || echo "perf_targets failed" >>"$summary"
  fi
  # Few files come back from a GPU machine: the logs and the data travel as one archive.
  tar -C "$out" -czf "$out/results.tar.gz" logs data && rm -rf "$logs" "$data"
  cat "$summary"
  if ((cases_run == 0)); then
    echo "gpu-run: zero test cases ran: this is a failure" | tee -a "$summary"
    return 1
  fi
  ((failures == 0 && cases_failed == 0))
}

case "${1:-}" in
  build) build ;;
  run) shift; run_all "$@" ;;
  *)
    echo "usage: scripts/gpu-run.sh build | run [OUT]" >&2
    exit 2
    ;;
esac
