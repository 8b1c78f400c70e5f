#!/usr/bin/env bash
# A/B timing of two builds of the perf tool on one GPU machine, in one call of the `run` tool:
# a change to the issue path is judged against the build before it on the same host, not
# against a number from another machine (hosts differ by more than the change).
#
#   scripts/gpu-ab.sh OLD_DIR NEW_DIR OUT SWEEPS -- PERF_NCCL_ARGS...
#
# OLD_DIR and NEW_DIR each hold a perf_nccl (e.g. build-gpu/carry-old and build-gpu/carry,
# both carried). The sweeps alternate old, new, new, old, ... (ABBA, so that a drift of the
# host over the call weighs on both alike); each writes OUT/ab_<old|new>_<i>.csv, with raw
# NCCL interleaved in the same process as the yardstick (PERF_NCCL_ARGS should include
# --raw). At the end scripts/perf_targets.py prints each sweep's counts against the targets,
# and a line per build gives the median over its sweeps of the median (ncclkit - raw) time
# difference per call at 8 B - 64 KiB, and each sweep's rows within 1 us of raw.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if (($# < 5)) || [[ "$5" != "--" ]]; then
  echo "usage: scripts/gpu-ab.sh OLD_DIR NEW_DIR OUT SWEEPS -- PERF_NCCL_ARGS..." >&2
  exit 2
fi
old="$1" new="$2" out="$3" sweeps="$4"
shift 5
if ! [[ "$sweeps" =~ ^[1-9][0-9]*$ ]]; then
  echo "gpu-ab: SWEEPS must be a positive number, not '$sweeps'" >&2
  exit 2
fi
for dir in "$old" "$new"; do
  if [[ ! -x "$dir/perf_nccl" ]]; then
    echo "gpu-ab: no perf_nccl in $dir (carry both folders)" >&2
    exit 2
  fi
done
mkdir -p "$out"
rm -f "$out"/ab_*  # sweeps of an earlier call would be counted in
# Rules of the GPU machines: no NVLink multicast.
export NCCL_NVLS_ENABLE=0 NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
base_path="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

status=0
for ((i = 1; i <= sweeps; ++i)); do
  order=(old new)
  ((i % 2 == 0)) && order=(new old)
  for side in "${order[@]}"; do
    dir="$old"
    [[ "$side" == new ]] && dir="$new"
    csv="$out/ab_${side}_$i.csv"
    if ! LD_LIBRARY_PATH="$dir:$base_path" "$dir/perf_nccl" "$@" --csv "$csv" >"$out/ab_${side}_$i.log" 2>&1; then
      echo "gpu-ab: sweep $i of $side failed (see ab_${side}_$i.log); its rows are not counted"
      rm -f "$csv"
      status=1
    fi
  done
done

python3 "$ROOT/scripts/perf_targets.py" "$out"/ab_*.csv
python3 - "$out" "$ROOT/scripts" <<'EOF'
import glob, os, statistics, sys
from collections import defaultdict

out = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from perf_targets import load, small_differences  # the same rows and selection as the targets

per_build = defaultdict(list)
for path in sorted(glob.glob(os.path.join(out, "ab_*.csv"))):
    side = os.path.basename(path).split("_")[1]
    diffs = [d for d, _, _, _ in small_differences(load(path))]
    if diffs:
        per_build[side].append((statistics.median(diffs), sum(1 for d in diffs if d <= 1.0), len(diffs)))
for side in ("old", "new"):
    sweeps = per_build.get(side, [])
    if sweeps:
        print(f"{side}: median over {len(sweeps)} sweeps of the median (ncclkit - raw) per call at 8 B - 64 KiB: "
              f"{statistics.median(m for m, _, _ in sweeps):+.3f} us (sweeps: "
              f"{', '.join(f'{m:+.2f} with {k} of {n} rows within 1 us' for m, k, n in sweeps)})")
EOF
exit $status
