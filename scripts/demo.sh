#!/usr/bin/env bash
# Sets up, builds and runs the main job: greedy generation with the default model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
SHARED="${VXQ_SHARED_DIR:-$(pwd)/../shared}"
MODEL="${1:-$SHARED/assets/models/vxq-llama-h64-f16.gguf}"
build/src/vxq generate -m "$MODEL" -p "${2:-To configure the device, the driver}" -n 64 --temp 0 -t 2
