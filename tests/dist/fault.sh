#!/usr/bin/env bash
# Runs dist_fault under mpirun and checks that the job fails fast, on every rank, with a
# message that names what went wrong. Usage: fault.sh MPIRUN EXE MODE NP
set -uo pipefail
mpirun=$1 exe=$2 mode=$3 np=$4
log=$(mktemp)
fail() { echo "FAIL ($mode, np $np): $*"; echo "--- output:"; cat "$log"; exit 1; }

# throw: a timeout far beyond the 30 s bound below, so only the abort can end the job in time.
if [ "$mode" = throw ]; then export WEFT_COLLECTIVE_TIMEOUT=120; else export WEFT_COLLECTIVE_TIMEOUT=2; fi
[ "$mode" = mismatch-debug ] && export WEFT_DIST_DEBUG=1
export WEFT_FLIGHT_DIR=$(mktemp -d)
trap 'rm -f "$log"; rm -rf "$WEFT_FLIGHT_DIR"' EXIT
start=$(date +%s%N)
# `timeout` is the backstop: the job must end by itself long before it.
if [ "$mode" = env-differs ]; then  # rank 0 turns the collective check off, the others do not
  # env, not mpirun -x: the sanitizer runs pass their environment through mca_base_env_list,
  # which OpenMPI refuses to mix with -x.
  timeout 50 "$mpirun" --oversubscribe --bind-to none -np 1 env WEFT_COLLECTIVE_CHECK=0 "$exe" throw : \
    -np $((np - 1)) "$exe" throw >"$log" 2>&1
else
  arg=${mode%-debug}
  [ "$mode" = stuck-abort ] && arg=skip  # dist_fault_stuck_abort: MPI_Abort never returns
  timeout 50 "$mpirun" -np "$np" --oversubscribe --bind-to none "$exe" "$arg" >"$log" 2>&1
fi
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "mode $mode, np $np: exit $rc after ${elapsed_ms} ms"
[ "$rc" -ne 0 ] || fail "the job succeeded"
case $mode in mismatch*|fsdp-extra) [ "$rc" -ne 124 ] || fail "timed out";; esac
[ "$elapsed_ms" -lt 30000 ] || fail "took ${elapsed_ms} ms (collective timeout ${WEFT_COLLECTIVE_TIMEOUT} s)"
want() { grep -qF -- "$1" "$log" || fail "output lacks: $1"; }
# Every rank wrote its flight record to WEFT_FLIGHT_DIR, holding $1.
every_rank_recorded() {
  for r in $(seq 0 $((np - 1))); do
    grep -qF -- "$1" "$WEFT_FLIGHT_DIR/flight_rank$r.txt" 2>/dev/null || fail "rank $r's flight record lacks: $1"
  done
}
case $mode in
  stuck-abort)
    want "did not complete within 2 s"
    want "MPI_Abort did not end the job within 10 s: exiting"
    [ "$rc" -eq 124 ] || fail "exit $rc, want 124 (the timeout's status, from the watchdog)";;
  skip|skip-nowait)
    want "all_gather_into_tensor #2 (f32, in 1000 elements, out $((np * 1000))) on group 'world' ($np ranks)"
    want "did not complete within 2 s"
    want "Aborting the job"
    [ "$mode" = skip-nowait ] && want "seen by the communication thread"
    # The flight recorder: the lagging rank is named, and every rank wrote its record.
    want "Lagging: rank $((np - 1)) never issued all_gather_into_tensor #2"
    want "rank $((np - 1)): has not issued #2 on this group: it issued 1 and completed 1"
    every_rank_recorded "all_gather_into_tensor #1 (f32, in 1000 elements"
    ;;
  fsdp-skip)
    # The record names the module and phase whose collective never arrived.
    want "did not complete within 2 s"
    want "Lagging: rank $((np - 1)) never issued all_gather_into_tensor"
    want "[fsdp '0' FORWARD: all-gather of '0']"
    every_rank_recorded "reduce-scatter of '0'"  # the first step's collectives
    ;;
  fsdp-extra)
    # Found by the fingerprint check on every rank, naming both calls by their labels.
    for r in $(seq 0 $((np - 1))); do want "dist_fault: error on rank $r: dist collective check"; done
    want "calls all_gather_into_tensor #12"
    want "[fsdp '0' FORWARD: all-gather of '0']"
    want "all-gather of '1']"
    if grep -q "no error" "$log"; then fail "a rank went on after the mismatch"; fi
    ;;
  throw)
    last=$((np - 1))
    want "dist_fault: error: rank $last fails on its own"
    if grep -q "no error" "$log"; then fail "a rank went on after another one failed"; fi
    ;;
  env-differs)
    # Found at dist::init on every rank, before any collective could wait on another.
    # Every rank throws the same error; mpirun may end the others once the first has exited,
    # before they print, so at least one report is required.
    want "dist_fault: error: dist::init: WEFT_COLLECTIVE_CHECK differs between ranks (on for some, off for others; this rank:"
    [ "$rc" -ne 124 ] || fail "timed out"
    if grep -q "no error" "$log"; then fail "a rank went on"; fi
    ;;
  mismatch|mismatch-debug)
    last=$((np - 1))
    for r in $(seq 0 $last); do want "rank $r caught: dist collective check"; done
    [ "$mode" = mismatch-debug ] && want "(WEFT_DIST_DEBUG)"
    want "rank 0 calls all_gather_into_tensor #2 (f32, in 5 elements, out $((np * 5)))"
    want "rank $last calls all_gather_into_tensor #2 (f32, in 7 elements, out $((np * 7)))"
    ;;
esac
echo "ok: the job failed as it should"
