#!/usr/bin/env bash
# Packs binaries built here for a GPU machine that should not spend its time building them: each
# binary stripped and xz-compressed, the shared libraries they link that the lent GPU image lacks
# (what `ldd` resolves outside the C/C++ runtime and CUDA), chosen model files xz-compressed, and
# an unpack.sh for the other side. The folder must be git-ignored (devbin/ is) and carried:
#   scripts/device_pack.sh devbin/a build/tests/vxq_tests build/vxq ... [-- MODEL.gguf ...]
# then on the GPU machine (carry: ["devbin/a"]):
#   devbin/a/unpack.sh        # -> devbin/a/bin/<name>, devbin/a/lib, models/shared/assets/models/
#   export LD_LIBRARY_PATH=$PWD/devbin/a/lib VXQ_SHARED_DIR=$PWD/models/shared
#   export VXQ_CLI=$PWD/devbin/a/bin/vxq   # where vxq_tests' CLI tests find vxq, if it was packed
# Only the models named are unpacked there (tests that need others skip, loudly and counted).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: scripts/device_pack.sh DIR BINARY... [-- MODEL...]" >&2; exit 2; }
dir="$1"; shift
bins=(); models=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do bins+=("$1"); shift; done
[ $# -gt 0 ] && shift
models=("$@")
git check-ignore -q "$dir" || { echo "device_pack: $dir is not git-ignored" >&2; exit 2; }
rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib" "$dir/models"
for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "device_pack: $b is not a built binary" >&2; exit 2; }
  strip -o "$dir/bin/$(basename "$b")" "$b"
  xz -T0 -6 "$dir/bin/$(basename "$b")"
done
# Libraries outside libc / libstdc++ / libgcc / libm and CUDA's own (the GPU image has those).
ldd "${bins[@]}" | awk '/=> \//{print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcuda|libcudart|libcublas[^/]*|libnccl)\.so' |
  while read -r lib; do cp -L "$lib" "$dir/lib/"; done
for m in "${models[@]}"; do xz -T0 -6 -c "$m" > "$dir/models/$(basename "$m").xz"; done
cat > "$dir/unpack.sh" <<'EOF'
#!/usr/bin/env bash
# Unpacks what scripts/device_pack.sh packed (run from the checkout's root).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
for f in "$here"/bin/*.xz; do xz -d -k -f "$f" && chmod +x "${f%.xz}"; done
mkdir -p models/shared/assets/models
for f in "$here"/models/*.xz; do [ -e "$f" ] && xz -d -c "$f" > "models/shared/assets/models/$(basename "${f%.xz}")"; done
echo "unpacked: $(ls "$here/bin" | grep -v '\.xz$' | tr '\n' ' ')"
EOF
chmod +x "$dir/unpack.sh"
echo "$dir: $(du -sh "$dir" | cut -f1) ($(ls "$dir/lib" | tr '\n' ' '))"
