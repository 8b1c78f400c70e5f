#!/usr/bin/env bash
# Smoke run of the TcpStore frame fuzz target (tests/fuzz/fuzz_tcp_frame.cpp), for CI.
#
#   tests/fuzz/run-smoke.sh [SECONDS]      (default 45)
#
# 1. Builds the plain target with g++ (ASan + UBSan), writes a seed corpus and replays it.
# 2. With clang++ that supports -fsanitize=fuzzer (Debian: clang + libclang-rt-14-dev), runs
#    libFuzzer on that corpus for SECONDS; without it, runs the plain target's random
#    mutations for SECONDS instead, and says so.
# Build output goes to $NCCLKIT_FUZZ_BUILD (default build-fuzz/ in the repository).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
seconds=${1:-45}
out=${NCCLKIT_FUZZ_BUILD:-$root/build-fuzz}
mkdir -p "$out/corpus"
source_file="$here/fuzz_tcp_frame.cpp"

echo "== fuzz smoke: building the plain target (g++, address+undefined sanitizers)"
g++ -std=c++20 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all \
  -I"$root/include" "$source_file" -o "$out/fuzz_tcp_frame_replay"
"$out/fuzz_tcp_frame_replay" --write-corpus "$out/corpus" "$out/corpus"

clang=""
for candidate in clang++ clang++-14; do
  if command -v "$candidate" >/dev/null 2>&1 &&
     echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
       "$candidate" -x c++ -fsanitize=fuzzer -o /dev/null - >/dev/null 2>&1; then
    clang=$candidate
    break
  fi
done

if [[ -n "$clang" ]]; then
  echo "== fuzz smoke: libFuzzer ($clang) for ${seconds}s"
  "$clang" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DNCCLKIT_LIBFUZZER \
    -I"$root/include" "$source_file" -o "$out/fuzz_tcp_frame"
  mkdir -p "$out/artifacts"
  "$out/fuzz_tcp_frame" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="$out/artifacts/" "$out/corpus"
else
  echo "== fuzz smoke: no clang++ with libFuzzer here (apt-get install clang libclang-rt-14-dev);"
  echo "   running the plain target's random mutations for ${seconds}s instead"
  "$out/fuzz_tcp_frame_replay" --seconds "$seconds"
fi
echo "== fuzz smoke: OK"
