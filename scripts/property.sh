#!/usr/bin/env bash
# The CLI property tests at scale (tests/test_cli_properties.cpp): generate --json over
# ${1:-5000} seeds and extreme sampling settings on stories260K, then bench and eval on model
# files with non-UTF-8 and hostile names. Every run must exit 0 with valid JSON; the first
# failing case is printed with its arguments. Needs a built tree (scripts/setup.sh) and the shared
# assets (CI=true: a missing asset fails instead of skipping).
#   scripts/property.sh          # 5000 cases, about a minute
#   scripts/property.sh 20000
set -euo pipefail
cd "$(dirname "$0")/.."
CI=true VXQ_PROPERTY_CASES="${1:-5000}" build/tests/vxq_tests --gtest_filter='CliProperty.*:CliOddFileNames.*'
