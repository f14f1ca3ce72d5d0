#!/usr/bin/env bash
# README command 2: install what is missing, build, and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
meson test -C build --print-errorlogs "$@"
