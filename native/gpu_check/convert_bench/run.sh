#!/usr/bin/env bash
# Variants of ggml-cuda/convert-rows.cu timed against each other on this machine's NVIDIA GPU, without building
# ggml-cuda or llama (about a minute): run.sh NAME=FILE.cu ... (the first, the reference: the landed kernel).
# Needs nvcc, CMake and a C++ compiler, and the sources of `make gpu-pack` (native/work/gpu/llama.cpp.tar.xz) for
# ggml's headers and ggml-base. Writes $OUT/convert-bench.md (OUT defaults to native/work/gpu/out); with Nsight
# Compute (ncu) present, also a profile of each variant's kernel in the first case, $OUT/convert-bench-ncu.txt
# (NCU_VARIANTS="NAME ...": of these only).
set -euo pipefail

here=$(cd "$(dirname "$0")/../../.." && pwd)
bench=$here/native/gpu_check/convert_bench
pack=$here/native/work/gpu/llama.cpp.tar.xz
out=${OUT:-$here/native/work/gpu/out}
mkdir -p "$out"
[ $# -ge 1 ] || { echo "usage: run.sh NAME=FILE.cu ..." >&2; exit 2; }
[ -f "$pack" ] || { echo "no $pack: run 'make gpu-pack' first" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xJf "$pack" -C "$work"
src=$work/llama.cpp
# ggml-base: ggml_convert_rows, ggml_nbytes, ...
cmake -S "$src" -B "$work/base" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_CUDA=OFF \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF \
    > "$out/convert-bench-build.log" 2>&1
cmake --build "$work/base" --target ggml-base -j "$(nproc)" >> "$out/convert-bench-build.log" 2>&1 &
base=$!

# common.cuh's fastdiv helpers for the shim
sed -n '/^static const uint3 init_fastdiv_values/,/^typedef void (\*dequantize_kernel_t)/p' \
    "$src/ggml/src/ggml-cuda/common.cuh" | sed '$d' > "$work/fastdiv.cuh"
grep -q fast_div_modulo "$work/fastdiv.cuh" || { echo "common.cuh changed: update run.sh" >&2; exit 2; }

nv=(nvcc -O3 -std=c++17 -arch="${CUDA_ARCH:-native}" -use_fast_math -extended-lambda -I "$work" -I "$src/ggml/include" -I "$src/ggml/src")
: > "$work/variants.h"
pids=()
for v in "$@"; do
    name=${v%%=*}
    file=$v
    file=${file#*=}
    [ "$name" != "$v" ] && [ -f "$file" ] || { echo "not NAME=FILE: $v" >&2; exit 2; }
    mkdir -p "$work/v/$name"
    cp "$file" "$work/v/$name/convert-rows.cu"
    cp "$bench/shim/convert-rows.cuh" "$work/v/$name/"
    echo "X($name)" >> "$work/variants.h"
    "${nv[@]}" -I "$work/v/$name" -DCONVERT_ROWS_VARIANT="$name" -c "$bench/variant.cu" -o "$work/$name.o" \
        > "$work/$name.log" 2>&1 &
    pids+=("$!:$name")
done
for p in "${pids[@]}"; do
    wait "${p%%:*}" || { cat "$work/${p#*:}.log" >&2; exit 2; }
done
wait $base || { tail -30 "$out/convert-bench-build.log" >&2; exit 2; }
lib=$(dirname "$(find "$work/base" -name 'libggml-base.so' | head -1)")
"${nv[@]}" -I "$bench/shim" "$bench/bench.cu" "$work"/*.o -L "$lib" -lggml-base -Xlinker -rpath="$lib" -o "$work/bench"

"$work/bench" | tee "$out/convert-bench.md"
if command -v ncu > /dev/null; then
    skip=3 # the reference's runs come first, then the variant's
    for v in "$@"; do
        case " ${NCU_VARIANTS:-${v%%=*}} " in *" ${v%%=*} "*) ;; *) skip=8; continue ;; esac
        ncu --kernel-name regex:k_convert_rows --launch-skip $skip --launch-count 1 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
            --section WarpStateStats --section SchedulerStats \
            "$work/bench" --case "f16 -> q8_0, rotation 128" --variant "${v%%=*}" --reps 5 || true
        skip=8
    done > "$out/convert-bench-ncu.txt" 2>&1
else
    echo "no ncu on this machine" > "$out/convert-bench-ncu.txt"
fi
