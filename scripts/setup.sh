#!/usr/bin/env bash
# Installs every build and test dependency (Debian packages only; this is the one list) and
# configures + builds veloxquant in ./build (Release). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  cmake ninja-build g++ pkg-config   # toolchain
  libfmt-dev                         # formatting
  nlohmann-json3-dev                 # JSON output and golden files
  libcli11-dev                       # command line
  libpcre2-dev                       # Unicode regexes of the BPE pre-tokenizers
  libgtest-dev libgmock-dev          # tests
  libbenchmark-dev                   # microbenchmarks
  clang libclang-rt-14-dev           # libFuzzer targets (scripts/fuzz.sh)
  python3                            # scripts/make_references.sh writes the reference JSON
)
# --list: print the packages (one per line) and exit (scripts/device_prepare.sh reads them).
if [ "${1:-}" = --list ]; then printf '%s\n' "${PACKAGES[@]}"; exit 0; fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

SHARED="${VXQ_SHARED_DIR:-$(pwd)/../shared}"
# What this build has (CUDA backend, NCCL for --tp) is printed; the rest of CMake's report is not.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DVXQ_SHARED_DIR="$SHARED" | { grep -E '^-- veloxquant:' || true; }
ninja -C build
