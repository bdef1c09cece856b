#!/usr/bin/env bash
# make gpu-check: the lazy KV cache on this machine's NVIDIA GPU (native/README.md, "GPU check").
#
# Needs nvcc, CMake, ninja and a C++ compiler; no network, nothing from PyPI. The patched llama.cpp
# source comes packed by `make gpu-pack` (native/work/gpu/llama.cpp.tar.xz, ~10 MB) so that the
# working tree travels to a GPU machine under 64 MiB. Builds libllama with CUDA for the present GPU
# only, builds native/gpu_check/lazy_check.cpp against it, runs it and writes the report to
# $OUT/gpu-check.md (OUT defaults to native/work/gpu/out).
set -euo pipefail

here=$(cd "$(dirname "$0")/../.." && pwd)
pack="$here/native/work/gpu/llama.cpp.tar.xz"
out="${OUT:-$here/native/work/gpu/out}"
n_ctx="${GPU_CHECK_N_CTX:-32768}"
mkdir -p "$out"
[ -f "$pack" ] || { echo "no $pack: run 'make gpu-pack' on a machine with the engine sources first" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
t0=$(date +%s)
tar -xJf "$pack" -C "$work"
cmake -S "$work/llama.cpp" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF \
    > "$out/cmake.log" 2>&1 || { tail -40 "$out/cmake.log" >&2; exit 2; }
# test-backend-ops needs ggml's headers only: compiled meanwhile, linked after the libraries
c++ -O1 -std=c++17 -c "$work/llama.cpp/tests/test-backend-ops.cpp" -I "$work/llama.cpp/ggml/include" \
    -o "$work/test-backend-ops.o" > "$out/test-backend-ops-build.log" 2>&1 &
tbo=$!
cmake --build "$work/build" -j "$(nproc)" --target llama > "$out/build.log" 2>&1 \
    || { grep -B2 -A8 -m5 "error" "$out/build.log" >&2; exit 2; }
lib="$work/build/bin"
inc=(-I "$work/llama.cpp/include" -I "$work/llama.cpp/ggml/include")
libs=(-L "$lib" -lllama -lggml -lggml-cpu -lggml-base -Wl,-rpath,"$lib")
c++ -O2 -std=c++17 "$here/native/gpu_check/lazy_check.cpp" "${inc[@]}" "${libs[@]}" -o "$work/lazy-check"
c++ -O2 -std=c++17 "$here/native/gpu_check/convert_check.cpp" "${inc[@]}" "${libs[@]}" -o "$work/convert-check"
wait $tbo || { tail -20 "$out/test-backend-ops-build.log" >&2; exit 2; }
c++ "$work/test-backend-ops.o" "${libs[@]}" -lpthread -o "$work/test-backend-ops"
t1=$(date +%s)
{
    echo "<!-- make gpu-check: build $((t1 - t0)) s -->"
    rc=0
    "$work/lazy-check" "$work/model.gguf" "$n_ctx" 2> "$out/run.log" || rc=$?
    echo
    "$work/convert-check" 2>> "$out/run.log" || rc=$?
    # every case of the conversion op in llama.cpp's own test, the device against the CPU
    echo "## test-backend-ops -o CONVERT_ROWS on the device"
    echo
    echo '```'
    "$work/test-backend-ops" test -o CONVERT_ROWS -b CUDA0 > "$out/test-backend-ops.log" 2>&1 || rc=$?
    echo "$(grep -c "CONVERT_ROWS(.*OK" "$out/test-backend-ops.log" || true) cases OK"
    grep -E "FAIL|not supported|tests passed|^Backend" "$out/test-backend-ops.log" | tail -24 || true
    echo '```'
    "$work/test-backend-ops" perf -o CONVERT_ROWS -b CUDA0 > "$out/test-backend-ops-perf.log" 2>&1 || true
    echo
    echo "Build $((t1 - t0)) s, check $(( $(date +%s) - t1 )) s ($(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi'))."
    exit $rc
} | tee "$out/gpu-check.md"
