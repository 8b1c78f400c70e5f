#!/bin/sh
# Runs a GPU test executable: run_gpu_test.sh EXECUTABLE ARGS...
# scripts/dev test builds the GPU tests only where a GPU is visible. Where one is not built:
# no GPU visible means the test is skipped (exit 77, as the test itself would say), a visible
# GPU means it should have been built (a failure that says how to build it).
exe=$1
shift
if [ ! -x "$exe" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "$exe is not built, and a GPU is visible: build it with cmake --build <build folder> --target ncclkit_tests"
    exit 1
  fi
  echo "SKIP: no GPU visible (the GPU tests were not built here: scripts/dev build or the target ncclkit_tests builds them)"
  exit 77
fi
exec "$exe" "$@"
