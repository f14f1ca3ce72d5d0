#!/usr/bin/env bash
# Runs fault.sh N times in a row: an abort path that ends the job only most of the time fails
# here. Usage: fault_repeat.sh N MPIRUN EXE MODE NP
set -uo pipefail
n=$1
shift
for i in $(seq "$n"); do
  echo "run $i of $n"
  bash "$(dirname "${BASH_SOURCE[0]}")/fault.sh" "$@" || exit 1
done
