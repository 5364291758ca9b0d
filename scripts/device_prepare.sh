#!/usr/bin/env bash
# Prepares what a GPU machine needs from this one to run bench/gpu.sh, in two git-ignored folders
# of the checkout (the device tool carries them: `carry: ["devdeps", "models"]`, 64 MiB in all):
#   devdeps/  the Debian packages of scripts/setup.sh's list that the CUDA build links or includes
#             (and their library dependencies), as .deb files: the GPU machine has CUDA, CMake and
#             Ninja but not these, and cannot download; bench/gpu.sh unpacks them (VXQ_DEPS_DEBS).
#   models/shared/  the assets the GPU tests and benchmarks read (VXQ_SHARED_DIR=models/shared):
#             the golden files, the vxq-llama-h64 models, stories260K, the tokenizer files, the
#             texts the tests name. The 26M passkey and ternary f16 models do not fit beside them.
# Then, on the GPU machine: VXQ_DEPS_DEBS=devdeps VXQ_SHARED_DIR=models/shared bench/gpu.sh
#
#   scripts/device_prepare.sh            (SHARED: VXQ_SHARED_DIR, default ../shared)
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED="${VXQ_SHARED_DIR:-$(pwd)/../shared}"

# What the build needs beyond a toolchain: setup.sh's list without the tools the GPU machine has
# (or the CUDA build does not use), plus each package's library dependencies, without the C/C++
# runtime and system libraries every Debian or Ubuntu image has.
TOOLS='^(cmake|ninja-build|g\+\+|clang|libclang-rt-.*|python3)$'
BASE='^(libc6|libc6-dev|libc-dev-bin|libcrypt.*|libgcc-s1|libstdc\+\+6|gcc-[0-9]+-base|libgssapi.*|libk5crypto3|libkeyutils1|libkrb5.*|libssl.*|libtirpc.*|libnsl.*|linux-libc-dev|rpcsvc-proto|libcom-err2|googletest)$'
mapfile -t wanted < <(scripts/setup.sh --list | grep -Ev "$TOOLS")
mapfile -t debs < <(for p in "${wanted[@]}"; do apt-cache depends --recurse --important "$p" | grep -E '^[a-z]'; done |
  sort -u | grep -Ev "$BASE")
rm -rf devdeps && mkdir -p devdeps
if ! (cd devdeps && apt-get download "${debs[@]}" >/dev/null 2>../devdeps.err); then
  cat devdeps.err >&2
  rm -f devdeps.err
  exit 1
fi
rm -f devdeps.err  # apt's note that it downloaded as root, unsandboxed
echo "devdeps/: ${#debs[@]} packages, $(du -sh devdeps | cut -f1)"

rm -rf models/shared && mkdir -p models/shared/assets/models models/shared/assets/text
cp -r "$SHARED/golden" models/shared/
cp "$SHARED"/assets/models/vxq-llama-h64-*.gguf "$SHARED"/assets/models/stories260K.gguf \
   "$SHARED"/assets/models/*.json "$SHARED"/assets/models/tok512.bin "$SHARED"/assets/models/vxq-tokenizer.model \
   "$SHARED"/assets/models/vxq-ternary-h64-tq2_0.gguf models/shared/assets/models/
cp "$SHARED"/assets/text/wikitext2_test.raw.crlf.txt "$SHARED"/assets/text/wikitext2_test.tokens.txt \
   "$SHARED"/assets/text/tinystories_valid_head.txt models/shared/assets/text/
echo "models/shared/: $(du -sh models/shared | cut -f1)"
total=$(du -sbc devdeps models | tail -1 | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
echo "carried with the tracked tree: $(( (total + tree) / 1048576 )) MiB of the 64 MiB a device run may carry"
