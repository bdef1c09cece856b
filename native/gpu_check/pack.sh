#!/usr/bin/env bash
# make gpu-pack: the patched llama.cpp sources that `make gpu-check` builds, packed small enough to travel
# with the working tree to a GPU machine (native/work/gpu/llama.cpp.tar.xz, git-ignored). Run after the
# engine's sources are prepared (make engine / native/build.py prepare).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
src="$here/native/work/src/vendor"
[ -d "$src/llama.cpp/ggml" ] || { echo "no prepared sources in $src: run 'native/build.py prepare'" >&2; exit 2; }
mkdir -p "$here/native/work/gpu"
ex=()
for b in cann et hexagon metal musa opencl openvino sycl virtgpu vulkan webgpu zdnn zendnn; do
    ex+=(--exclude="llama.cpp/ggml/src/ggml-$b")
done
tar -C "$src" "${ex[@]}" -cJf "$here/native/work/gpu/llama.cpp.tar.xz" \
    llama.cpp/CMakeLists.txt llama.cpp/cmake llama.cpp/ggml llama.cpp/src llama.cpp/include llama.cpp/licenses llama.cpp/vendor \
    llama.cpp/tests/test-backend-ops.cpp
du -h "$here/native/work/gpu/llama.cpp.tar.xz"
