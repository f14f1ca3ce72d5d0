#!/usr/bin/env bash
# README command 1: install what is missing, build, and run the main job: train the mnist MLP
# for one epoch on Fashion-MNIST, sharded with FSDP over 2 ranks started by mpirun, and report
# the test accuracy (rank 0 prints; metrics go to build/mnist-metrics.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
# OpenMPI refuses to start as root unless told to. Each rank gets half the cores as OpenMP
# threads (at least one): more threads than cores makes Eigen's GEMM collapse.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
mpirun -np 2 --oversubscribe --bind-to none ./build/apps/mnist/weft-mnist --fsdp --epochs 1 \
  --metrics build/mnist-metrics.jsonl
