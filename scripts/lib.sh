# Shared set-up for scripts/run and scripts/test: venv, llama-cpp-python build, embedded models.
# Sourced, not executed. Every step is idempotent: a second run rebuilds and re-downloads nothing.
set -euo pipefail

TANDEM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TANDEM_HOME="${TANDEM_HOME:-$HOME/.cache/tandem}"
export TANDEM_HOME
# The one pin of llama-cpp-python is pyproject.toml's dependency; the wheel cache follows it.
LLAMA_CPP_VERSION="$(sed -n 's/^ *"llama-cpp-python==\([^"]*\)".*/\1/p' "$TANDEM_ROOT/pyproject.toml")"
[ -n "$LLAMA_CPP_VERSION" ] || { echo "error: no llama-cpp-python==VERSION in pyproject.toml" >&2; exit 1; }
VENV="${TANDEM_VENV:-$TANDEM_ROOT/.venv}"
PY="$VENV/bin/python"

log() { printf '[tandem] %s\n' "$*" >&2; }

# CMake flags for llama.cpp: never -march=native on x86 (AMX may be advertised yet forbidden by
# the kernel, which kills the process with SIGILL); instead name the ISA extensions this CPU has.
llama_cmake_args() {
  local os; os="$(uname -s)"
  if [ "$os" = "Darwin" ]; then
    if [ "$(uname -m)" = "arm64" ]; then echo "-DGGML_METAL=ON -DGGML_RPC=ON"; else echo "-DGGML_METAL=OFF -DGGML_NATIVE=OFF -DGGML_RPC=ON"; fi
    return
  fi
  # GGML_RPC: the target can be spread over `tandem worker` machines (ggml-rpc).
  local args="-DGGML_NATIVE=OFF -DGGML_RPC=ON" gpu
  gpu="$(llama_gpu_args)"
  [ -n "$gpu" ] && args="$args $gpu"
  if [ -r /proc/cpuinfo ] && [ "$(uname -m)" = "x86_64" ]; then
    # TANDEM_LLAMA_FLAGS (e.g. "avx avx2 fma f16c") builds for those CPU flags instead of this
    # CPU's: an AVX-512 machine reproduces an AVX2-only one's kernels and numerics with it.
    local flags; flags=" ${TANDEM_LLAMA_FLAGS:-$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2)} "
    has() { case "$flags" in *" $1 "*) return 0;; *) return 1;; esac; }
    has avx && args="$args -DGGML_AVX=ON"
    has avx2 && args="$args -DGGML_AVX2=ON"
    has fma && args="$args -DGGML_FMA=ON"
    has f16c && args="$args -DGGML_F16C=ON"
    has avx512f && args="$args -DGGML_AVX512=ON"
    has avx512vbmi && args="$args -DGGML_AVX512_VBMI=ON"
    has avx512_vnni && args="$args -DGGML_AVX512_VNNI=ON"
    has avx512_bf16 && args="$args -DGGML_AVX512_BF16=ON"
    has avx_vnni && args="$args -DGGML_AVX_VNNI=ON"
  fi
  echo "$args"
}

# The GPU backend to build, as CMake flags (nothing: CPU only). TANDEM_GPU chooses: `auto` (the
# default), `cpu`, or `vulkan` (scripts/vulkan: the Vulkan build in its own venv, whatever the
# machine has). Under auto: CUDA where nvcc is installed (on PATH or in $CUDA_HOME/bin) and
# nvidia-smi sees a card, compiled for that card's own compute capability only (every
# architecture takes most of an hour; one a few minutes); a card without nvcc gets a CPU build and
# one line on what to install. Vulkan (AMD and Intel GPUs) only where vulkaninfo sees a real GPU:
# glslc and the Vulkan headers alone do not choose it, nor does Mesa's lavapipe (a Vulkan driver
# that computes on the CPU), so the default build stays the CPU one where there is no GPU.
llama_gpu_args() {
  local nvcc caps
  case "${TANDEM_GPU:-auto}" in
    cpu) return;;
    vulkan) vulkan_cmake_args; return;;
    auto) ;;
    *) log "TANDEM_GPU=${TANDEM_GPU}: expected auto, cpu or vulkan"; return 1;;
  esac
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    nvcc="$(command -v nvcc || true)"
    [ -z "$nvcc" ] && [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] && nvcc="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
    if [ -n "$nvcc" ]; then
      # "8.9" -> 89; several cards: each architecture once, as a CMake list.
      caps="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
        | tr -d ' .' | grep -E '^[0-9]+$' | sort -u | paste -sd';' -)"
      echo "-DGGML_CUDA=ON${caps:+ -DCMAKE_CUDA_ARCHITECTURES=$caps}${nvcc:+ -DCMAKE_CUDA_COMPILER=$nvcc}"
      return
    fi
    log "an NVIDIA GPU is here but no nvcc: building for the CPU; install the CUDA toolkit (nvcc) and rerun to build for the GPU"
  fi
  if command -v glslc >/dev/null 2>&1 && vulkan_gpu_present; then
    if [ -n "$(vulkan_include_dir)" ]; then
      vulkan_cmake_args
    else
      log "a Vulkan GPU is here but the Vulkan headers are older than 1.3.$VULKAN_MIN_HEADER (ggml-vulkan needs VK_EXT_layer_settings): building for the CPU; scripts/vulkan --build-only fetches newer ones"
    fi
  fi
}

# ggml-vulkan uses VK_EXT_layer_settings, which Vulkan headers have from 1.3.261 on (Debian 12's
# libvulkan-dev is 1.3.239; Debian 13's 1.4.309 works).
VULKAN_MIN_HEADER=261
# Where scripts/vulkan unpacks newer headers, installing nothing: Debian 13's libvulkan-dev.
VULKAN_HEADERS_DIR="$TANDEM_HOME/vulkan-headers"

# Whether vulkaninfo sees a device that is not the CPU (lavapipe/llvmpipe says
# PHYSICAL_DEVICE_TYPE_CPU).
vulkan_gpu_present() {
  command -v vulkaninfo >/dev/null 2>&1 || return 1
  vulkaninfo --summary 2>/dev/null | grep -E 'deviceType' | grep -qvE 'PHYSICAL_DEVICE_TYPE_CPU'
}

# The include folder whose vulkan/vulkan_core.h is new enough for ggml-vulkan ($VULKAN_SDK's,
# /usr's, or the unpacked one), or nothing.
vulkan_include_dir() {
  local dir version
  for dir in "${VULKAN_SDK:+$VULKAN_SDK/include}" /usr/include "$VULKAN_HEADERS_DIR/usr/include"; do
    [ -n "$dir" ] && [ -r "$dir/vulkan/vulkan_core.h" ] || continue
    # 1.4's patch numbers go on from 1.3's (1.4.303 came after 1.3.302).
    version="$(sed -n 's/^#define VK_HEADER_VERSION \([0-9][0-9]*\).*/\1/p' "$dir/vulkan/vulkan_core.h")"
    if [ "${version:-0}" -ge "$VULKAN_MIN_HEADER" ]; then echo "$dir"; return; fi
  done
}

vulkan_cmake_args() {
  local inc; inc="$(vulkan_include_dir)"
  echo "-DGGML_VULKAN=ON${inc:+ -DVulkan_INCLUDE_DIR=$inc}"
}

ensure_venv() {
  if [ ! -x "$PY" ]; then
    log "creating venv at $VENV"
    python3 -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip
  fi
}

# The wheel is cached outside the clone, keyed by version and build flags, so CI and fresh
# clones install it in seconds instead of compiling for seven minutes. An installed build
# without the RPC backend (an older cache key) is replaced.
# The cache folder of the wheel for these flags and this Python (the venv's, else python3's, which
# makes the venv).
llama_wheel_dir() {
  local py="$PY"; [ -x "$py" ] || py="$(command -v python3)"
  echo "$TANDEM_HOME/wheels/llama-cpp-$(printf '%s %s %s' "$LLAMA_CPP_VERSION" "$1" "$("$py" -c 'import sys; print(sys.version_info[:2])')" | sha256sum | cut -c1-16)"
}

ensure_llama_cpp() {
  local cmake_args key dir
  cmake_args="$(llama_cmake_args)"
  dir="$(llama_wheel_dir "$cmake_args")"
  key="${dir##*/llama-cpp-}"
  # The venv remembers which build it holds, so changing the flags swaps the wheel.
  if [ "$(cat "$VENV/.tandem-llama" 2>/dev/null)" != "$key" ] || ! "$PY" -c "import llama_cpp, pathlib, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_CPP_VERSION' or not any((pathlib.Path(llama_cpp.__file__).parent / 'lib').glob('*ggml-rpc*')))" 2>/dev/null; then
    if ! ls "$dir"/llama_cpp_python-*.whl >/dev/null 2>&1; then
      log "building llama-cpp-python $LLAMA_CPP_VERSION (several minutes) with: $cmake_args"
      rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"
      "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_VERSION" -d "$dir.tmp"
      CMAKE_ARGS="$cmake_args" FORCE_CMAKE=1 "$PY" -m pip wheel --no-deps "$dir.tmp"/llama_cpp_python-*.tar.gz -w "$dir.tmp"
      rm -rf "$dir"; mv "$dir.tmp" "$dir"
    fi
    "$PY" -m pip install -q --no-deps --force-reinstall "$dir"/llama_cpp_python-*.whl
    "$PY" -m pip install -q "typing-extensions>=4.5" "diskcache>=5.6.1" "jinja2>=2.11.3" numpy
    echo "$key" > "$VENV/.tandem-llama"
  fi
  ensure_rpc_server "$dir"
}

# rpc-server (the `tandem worker` process) from the same llama.cpp sources as the wheel, so the
# RPC protocol matches: one source file compiled against the wheel's own ggml libraries, copied
# beside it (seconds, instead of a second build of ggml).
ensure_rpc_server() {
  local dir="$1" out="$1/rpc-server" src lib
  [ -x "$out/rpc-server" ] && return
  src="$(ls "$dir"/llama_cpp_python-*.tar.gz 2>/dev/null | head -1 || true)"
  if [ -z "$src" ]; then
    src="$dir/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz"
    "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_VERSION" -d "$dir"
  fi
  log "building rpc-server for tandem worker"
  rm -rf "$out.tmp"; mkdir -p "$out.tmp/src"
  tar -xzf "$src" -C "$out.tmp/src" --strip-components=1 --wildcards \
    '*/vendor/llama.cpp/tools/rpc/rpc-server.cpp' '*/vendor/llama.cpp/ggml/include/*'
  lib="$("$PY" -c 'import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / "lib")')"
  cp -P "$lib"/*ggml* "$out.tmp/"
  local rpath='$ORIGIN'
  [ "$(uname -s)" = "Darwin" ] && rpath='@loader_path'
  "${CXX:-c++}" -std=c++17 -O2 -o "$out.tmp/rpc-server" \
    "$out.tmp/src/vendor/llama.cpp/tools/rpc/rpc-server.cpp" \
    -I"$out.tmp/src/vendor/llama.cpp/ggml/include" -L"$out.tmp" -lggml -lggml-base \
    -Wl,-rpath,"$rpath" -lpthread
  rm -rf "$out.tmp/src" "$out"; mv "$out.tmp" "$out"
  rm -f "$dir"/llama_cpp_python-*.tar.gz  # the wheel and rpc-server are all that is kept
}

# llama.cpp's own llama-server (the peer of bench/llama_server_peer.py), built once from the
# llama.cpp vendored in the same sdist as the wheel, with the same CMake flags, static, and cached
# under $TANDEM_HOME keyed by version and flags. Prints the binary's path on stdout. Only
# scripts/benchmarks calls it: scripts/test and scripts/run never need it. The build takes about
# 12 minutes on 2 cores (CMAKE_BUILD_PARALLEL_LEVEL sets the jobs; every core by default).
ensure_llama_server() {
  local cmake_args dir src
  cmake_args="$(llama_cmake_args)"
  dir="$TANDEM_HOME/llama-server/llama-cpp-$(printf '%s %s' "$LLAMA_CPP_VERSION" "$cmake_args" | sha256sum | cut -c1-16)"
  if [ ! -x "$dir/llama-server" ]; then
    log "building llama-server $LLAMA_CPP_VERSION (about 12 minutes on 2 cores) with: $cmake_args"
    rm -rf "$dir.tmp"; mkdir -p "$dir.tmp/src"
    local py="$PY"; [ -x "$py" ] || py="$(command -v python3)"
    "$py" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_VERSION" -d "$dir.tmp" >&2
    src="$(ls "$dir.tmp"/llama_cpp_python-*.tar.gz | head -1)"
    tar -xzf "$src" -C "$dir.tmp/src" --strip-components=3 --wildcards '*/vendor/llama.cpp/*'
    # shellcheck disable=SC2086  # the flags are words
    cmake -S "$dir.tmp/src" -B "$dir.tmp/build" $cmake_args -DLLAMA_CURL=OFF \
      -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release >&2
    cmake --build "$dir.tmp/build" --target llama-server -j "${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" >&2
    mkdir -p "$dir.tmp/out"
    cp "$dir.tmp/build/bin/llama-server" "$dir.tmp/out/"
    echo "$cmake_args" > "$dir.tmp/out/cmake-args"
    rm -rf "$dir"; mv "$dir.tmp/out" "$dir"; rm -rf "$dir.tmp"
  fi
  echo "$dir/llama-server"
}

ensure_project() {
  local stamp="$VENV/.tandem-deps" want
  want="$(sha256sum "$TANDEM_ROOT/pyproject.toml" | cut -c1-16)"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    log "installing Python dependencies"
    "$PY" -m pip install -q -e "$TANDEM_ROOT[test]"
    echo "$want" > "$stamp"
  fi
}

ensure_models() {
  "$PY" -m models.embedded ensure
}

setup_all() {
  ensure_venv
  ensure_llama_cpp
  ensure_project
  ensure_models
}

# The CPU every timing is read against: model and the SIMD flags that change the kernels.
print_cpu() {
  local model flags
  model="$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//')"
  model="$model (family $(grep -m1 '^cpu family' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | tr -d ' ')"
  model="$model model $(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | tr -d ' '))"
  flags="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | tr ' ' '\n' \
    | grep -xE 'avx|avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512_vnni|avx512_bf16|avx512vbmi|avx_vnni|amx_tile' \
    | tr '\n' ' ')"
  log "CPU: ${model:-$(uname -m)}, $(nproc 2>/dev/null || echo '?') cores, flags: ${flags:-unknown}"
  [ -n "${TANDEM_LLAMA_FLAGS:-}" ] && log "llama.cpp built for TANDEM_LLAMA_FLAGS: $TANDEM_LLAMA_FLAGS"
  return 0
}

# phase NAME COMMAND...: runs the command and records its wall time for `phase_report`.
PHASES=()
# Its exit status is the command's. The command runs in a subshell with errexit on, so a failing
# step inside a set-up function still stops that function.
phase() {
  local name="$1" start end rc; shift
  start=$(date +%s)
  set +e
  (set -e; "$@")
  rc=$?
  set -e
  end=$(date +%s)
  PHASES+=("$name $((end - start))")
  return "$rc"
}

phase_report() {
  local p
  for p in "${PHASES[@]}"; do
    set -- $p
    log "$(printf '%-8s %4d s' "$1" "$2")"
  done
}

# Debian's Chromium for the browser test; Playwright drives it (its own browser download
# cannot work offline, so it is never used).
ensure_browser() {
  if ! command -v chromium >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
      log "installing Debian's chromium for the browser test"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
      log "chromium not found and no apt-get: the browser test will be skipped"
    fi
  fi
}
