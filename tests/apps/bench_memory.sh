#!/usr/bin/env bash
# weft-bench-memory on a tiny GPT at 1 and 2 ranks: the tables are well formed, every rank's
# training peak is within FSDP2's bound plus the measured activations (--check, and again here
# from the printed figures), the allocator's timeline reaches exactly its peak (the bench
# checks), 2 ranks need clearly less than 1, and bad flags give clear errors.
set -euo pipefail
bench=$1
mpirun=${2:-}
shift $(( $# < 2 ? $# : 2 ))
mpirun_args=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail, loss_at, within
tiny=(--n-layer 4 --d-model 128 --n-head 4 --ctx 16 --batch-size 1 --steps 3 --check)

check_run() {  # FILE RANKS
  local f=$1 n=$2
  cat "$f"
  grep -q '^# weft-bench-memory: GPT n_layer 4, d_model 128' "$f" || fail "$f: no header line"
  local rows
  rows=$(grep -cE '^\| [0-9]+ \| [0-9.]+ \|' "$f" || true)
  [ "$rows" = "$n" ] || fail "$f: $rows rank rows in the table, expected $n"
  grep -q 'CHECK FAILED' "$f" && fail "$f: a check failed"
  # peak per rank (max over ranks): X MiB in PHASE on rank R; bound ... = Y MiB
  awk '/^peak per rank/ { x = $7; y = $(NF-1); found = 1
         if (!(x > 0 && y > 0 && x <= y)) { print "peak " x " not within bound " y; exit 1 } }
       END { if (!found) { print "no peak line"; exit 1 } }' "$f" || fail "$f: peak line"
  # every rank row: train peak / bound in (0.2, 1]
  awk -F'|' '/^\| [0-9]+ \| [0-9.]+ \|/ { r = $11 + 0; if (!(r > 0.2 && r <= 1.0)) { print "ratio " r; exit 1 } }' "$f" \
    || fail "$f: a rank's peak / bound out of (0.2, 1]"
}

rc=0
"$bench" "${tiny[@]}" --json "$tmp/np1.json" > "$tmp/np1.txt" 2>&1 || rc=$?
[ $rc = 0 ] || { cat "$tmp/np1.txt"; fail "1 rank exited $rc"; }
check_run "$tmp/np1.txt" 1
files=("$tmp/np1.json")
if [ -n "$mpirun" ]; then
  "$mpirun" -np 2 "${mpirun_args[@]}" "$bench" "${tiny[@]}" --json "$tmp/np2.json" > "$tmp/np2.txt" 2>&1 || rc=$?
  [ $rc = 0 ] || { cat "$tmp/np2.txt"; fail "2 ranks exited $rc"; }
  check_run "$tmp/np2.txt" 2
  files+=("$tmp/np2.json")
fi

"$bench" --summary "${files[@]}" > "$tmp/summary.txt" 2>&1 || { cat "$tmp/summary.txt"; fail "--summary failed"; }
cat "$tmp/summary.txt"
grep -qE '^\| 1 \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| (forward|backward|step) \|.* \| 1\.00 \| 1\.00 \|$' "$tmp/summary.txt" \
  || fail "summary: no 1-rank row with ratio 1.00"
if [ -n "$mpirun" ]; then
  # The model (3 MiB of parameters, Adam's state on top) dwarfs the activations of 16 tokens:
  # sharding over 2 ranks must cut the peak well below 1 rank's (the formula gives ~0.6).
  awk -F'|' '/^\| 2 \|/ { r = $10 + 0; found = 1; if (!(r > 0.3 && r < 0.8)) { print "np2 / np1 = " r; exit 1 } }
             END { if (!found) { print "no 2-rank row"; exit 1 } }' "$tmp/summary.txt" || fail "summary: 2-rank ratio"
fi
[ -s "$tmp/np1.json" ] && grep -q '"series":{' "$tmp/np1.json" || fail "np1.json has no timeline"

# --deferred-init: built on the meta device, so the init peak (rank 0's, column 3) is this
# rank's shards, held by --check to Ps + B + 1 MiB, and below the eager build's at 2 ranks.
if [ -n "$mpirun" ]; then run=("$mpirun" -np 2 "${mpirun_args[@]}"); eager="$tmp/np2.txt"; else run=(); eager="$tmp/np1.txt"; fi
"${run[@]}" "$bench" "${tiny[@]}" --deferred-init > "$tmp/deferred.txt" 2>&1 || { cat "$tmp/deferred.txt"; fail "--deferred-init failed"; }
cat "$tmp/deferred.txt"
grep -q 'deferred init;' "$tmp/deferred.txt" || fail "--deferred-init: the header does not say deferred init"
grep -q 'CHECK FAILED' "$tmp/deferred.txt" && fail "--deferred-init: a check failed"
init_of() { awk -F'|' '/^\| 0 \| [0-9.]+ \|/ { print $4 + 0 }' "$1"; }
d=$(init_of "$tmp/deferred.txt"); e=$(init_of "$eager")
if [ -n "$mpirun" ]; then
  awk -v d="$d" -v e="$e" 'BEGIN { exit !(d > 0 && d < e) }' || fail "deferred init peak $d MiB is not below the eager $e MiB"
fi

# Bad input: clear messages, nonzero exits.
if "$bench" --n-layer 2 --d-model 100 --n-head 3 > "$tmp/bad.txt" 2>&1; then fail "--n-head 3 --d-model 100 was accepted"; fi
grep -q 'does not divide --d-model' "$tmp/bad.txt" || { cat "$tmp/bad.txt"; fail "no clear message for --n-head"; }
if "$bench" --steps 1 > "$tmp/bad.txt" 2>&1; then fail "--steps 1 was accepted"; fi
grep -q -- '--steps' "$tmp/bad.txt" || { cat "$tmp/bad.txt"; fail "no clear message for --steps 1"; }
if "$bench" --threads 100000 > "$tmp/bad.txt" 2>&1; then fail "--threads 100000 was accepted"; fi
grep -q -- '--threads: expected an integer from 1 to 1024, got 100000' "$tmp/bad.txt" || { cat "$tmp/bad.txt"; fail "no clear message for --threads"; }
if "$bench" --summary "${files[0]}" "${files[0]}" > "$tmp/twice.txt" 2>&1; then fail "--summary of one file twice was accepted"; fi
grep -q 'two files of 1 ranks' "$tmp/twice.txt" || { cat "$tmp/twice.txt"; fail "no clear message for a file given twice"; }
if "$bench" --summary "$tmp/bad.txt" > "$tmp/bad2.txt" 2>&1; then fail "--summary of a text file was accepted"; fi
grep -q 'not a weft-bench-memory --json file' "$tmp/bad2.txt" || { cat "$tmp/bad2.txt"; fail "no clear message for --summary"; }
# --json's place is checked before the run (it had failed writing after the whole run).
if "$bench" --steps 2 --json "$tmp/nowhere/x.json" > "$tmp/bad.txt" 2>&1; then fail "--json in a missing directory was accepted"; fi
grep -q -- "--json $tmp/nowhere/x.json: $tmp/nowhere is a directory that does not exist" "$tmp/bad.txt" &&
  ! grep -q '^| 0 |' "$tmp/bad.txt" || { cat "$tmp/bad.txt"; fail "--json's place not checked before the run"; }
echo "bench_memory ok"
