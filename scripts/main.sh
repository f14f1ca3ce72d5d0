#!/usr/bin/env bash
# README command 1: install what is missing, build, and run the main job (train the mnist MLP
# for one epoch on Fashion-MNIST and report test accuracy).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
./build/apps/mnist/weft-mnist --epochs 1 --metrics build/mnist-metrics.jsonl
