#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (what CI runs). Extra args go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir build --output-on-failure -j2 "$@"
