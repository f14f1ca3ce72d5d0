#!/usr/bin/env bash
# weft-elastic under mpirun: a 4-rank --deterministic weft-transformer run with a checkpoint
# every 10 steps loses a rank to SIGKILL after its step-20 checkpoint; weft-elastic relaunches it
# at 2 ranks (--sizes 4,2,1: 3 does not divide --virtual-batches 8) from the latest complete
# checkpoint. Every loss it logs after the restart, and its final parameters and optimizer state
# (consolidated), are bitwise those of an uninterrupted 4-rank run and of a 1-rank run; the
# restart is logged with both world sizes and the step. A job that fails without losing a rank
# is not restarted; a job that keeps losing ranks stops after --max-restarts; bad options named.
# Usage: elastic.sh WEFT_ELASTIC WEFT_TRANSFORMER WEFT_CHECKPOINT MPIRUN [MPIRUN_ARGS...]
set -euo pipefail
elastic=$1
transformer=$2
checkpoint=$3
shift 3
launch="$*"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail
export OMP_NUM_THREADS=1
run() { timeout 180 "$@"; }

# Steps: under a sanitizer (scripts/sanitize.sh sets WEFT_SANITIZER) fewer, still past the kill.
S=100
[ -n "${WEFT_SANITIZER:-}" ] && S=50
gpt=(train --steps $S --batch-size 8 --ctx 32 --n-layer 2 --d-model 32 --eval-every 25 --eval-iters 2 --log-every 1
     --seed 3 --dropout 0.1 --deterministic --checkpoint-every 10 --threads 1)
consolidate() { run "$checkpoint" consolidate --with-optimizer "$1" "$2" >/dev/null 2>"$tmp/err" || fail "consolidate $1: $(cat "$tmp/err")"; }
run $launch -np 4 "$transformer" "${gpt[@]}" --fsdp --checkpoint-dir "$tmp/ref4" --metrics "$tmp/ref4.jsonl" \
  >/dev/null 2>"$tmp/err" || fail "the uninterrupted 4-rank run: $(tail -3 "$tmp/err")"
run "$transformer" "${gpt[@]}" --checkpoint-dir "$tmp/ref1" --metrics "$tmp/ref1.jsonl" >/dev/null 2>"$tmp/err" ||
  fail "the 1-rank run: $(tail -3 "$tmp/err")"
consolidate "$tmp/ref4" "$tmp/ref4.safetensors"
consolidate "$tmp/ref1" "$tmp/ref1.safetensors"
cmp -s "$tmp/ref4.safetensors" "$tmp/ref1.safetensors" || fail "the 4-rank and 1-rank runs ended apart"

# The elastic run; a rank of it is killed once the step-20 checkpoint is complete.
ck=$tmp/elastic
( for _ in $(seq 3000); do [ -e "$ck/step_00000020/index.json" ] && break; sleep 0.01; done
  pkill -9 -n -f -- "--checkpoint-dir $ck" ) &
killer=$!
run "$elastic" --np 4 --sizes 4,2,1 --max-restarts 2 --launch "$launch -np {n}" --checkpoint-dir "$ck" \
  --resume-args "--resume $ck" -- "$transformer" "${gpt[@]}" --fsdp --checkpoint-dir "$ck" \
  --metrics "$tmp/elastic.jsonl" >"$tmp/elastic.out" 2>"$tmp/elastic.err" ||
  fail "weft-elastic ended with status $?: $(grep weft-elastic "$tmp/elastic.err"; tail -3 "$tmp/elastic.err")"
wait "$killer" || true
restart=$(grep "weft-elastic: restart" "$tmp/elastic.err" || true)
[ "$(grep -c "weft-elastic: restart" "$tmp/elastic.err")" = 1 ] || fail "not exactly one restart: $restart"
[[ "$restart" =~ "at 4 ranks lost 1 rank(s)".*"relaunching at 2 ranks from $ck/step_"[0-9]+" (step "([0-9]+)")" ]] ||
  fail "the restart is not logged with 4 -> 2 ranks and a checkpoint step: $restart"
resumed=${BASH_REMATCH[1]}
[ "$resumed" -ge 20 ] && [ "$resumed" -lt $S ] || fail "resumed from step $resumed, not mid-run: $restart"
grep -q "resumed from $ck/step_.* at step $resumed" "$tmp/elastic.err" || fail "the relaunched job did not resume at step $resumed"
consolidate "$ck" "$tmp/elastic.safetensors"
cmp -s "$tmp/elastic.safetensors" "$tmp/ref4.safetensors" ||
  fail "the restarted run ended with other parameters or optimizer state than the uninterrupted one"
# Every logged line (training and validation) at the steps after the restart, as the reference
# logged it; lines the killed job had logged past the checkpoint come again from the resumed
# one, and must be the same lines (kept once).
lines() { while IFS= read -r l; do grep -oE '"(loss|split|step)":[^,}]*' <<<"$l" | sort | paste -sd' '; done <"$1"; }
after() { lines "$1" | awk -v s="$resumed" '!seen[$0]++ { match($0, /"step":[0-9]+/); if (substr($0, RSTART + 7, RLENGTH - 7) + 0 > s) print }'; }
[ "$(after "$tmp/elastic.jsonl" | wc -l)" -ge $((S - resumed)) ] || fail "too few lines after the restart: $(after "$tmp/elastic.jsonl" | head -3)"
[ "$(after "$tmp/elastic.jsonl")" = "$(after "$tmp/ref4.jsonl")" ] ||
  fail "losses after the restart differ from the uninterrupted run: $(diff <(after "$tmp/elastic.jsonl") <(after "$tmp/ref4.jsonl") | head -4)"

# SIGTERM to weft-elastic reaches every rank through the launcher: each stops after its step
# with a checkpoint, weft-elastic ends with the job's status 143 without restarting it, and no
# process of the job is left. mpirun passes SIGTERM on odls_base_sigkill_timeout (T) seconds after
# it gets it and ends T seconds after that (docs/CHECKPOINTS.md, "Stopping"): T = 10 gives the
# ranks 10 s for a step and a checkpoint and the whole stop 20 s, well inside the 60 s allowed.
ck2=$tmp/stopped
"$elastic" --np 2 --launch "$launch --mca odls_base_sigkill_timeout 10 -np {n}" --checkpoint-dir "$ck2" --resume-args "--resume $ck2" -- \
  "$transformer" train --steps 100000 --batch-size 8 --ctx 32 --n-layer 2 --d-model 32 --eval-every 0 --threads 1 \
  --fsdp --checkpoint-dir "$ck2" --metrics "$tmp/stopped.jsonl" >/dev/null 2>"$tmp/stopped.err" &
pid=$!
# A failure below first ends what is left of the job (what a broken weft-elastic leaves running).
stop_fail() { pkill -KILL -f -- "--checkpoint-dir $ck2" || true; fail "$@"; }
for _ in $(seq 600); do [ "$(cat "$tmp/stopped.jsonl" 2>/dev/null | wc -l)" -ge 2 ] && break; sleep 0.1; done
kill -TERM "$pid"
status=0
timeout 60 tail --pid="$pid" -f /dev/null || stop_fail "weft-elastic did not end within 60 s of SIGTERM"
wait "$pid" || status=$?
[ "$status" = 143 ] || stop_fail "weft-elastic ended with status $status after SIGTERM, not 143: $(tail -3 "$tmp/stopped.err")"
for r in 0 1; do
  grep -q "rank $r: stopping after step [0-9]* on SIGTERM; checkpoint written to $ck2/step_" "$tmp/stopped.err" ||
    stop_fail "rank $r did not stop with a checkpoint: $(tail -4 "$tmp/stopped.err")"
done
grep -q "weft-elastic: SIGTERM passed on to the job at 2 ranks, which ended with status [0-9]*: not restarting" \
  "$tmp/stopped.err" || stop_fail "no message from weft-elastic: $(grep weft-elastic "$tmp/stopped.err")"
if pgrep -f -- "--checkpoint-dir $ck2" >/dev/null; then stop_fail "processes of the stopped job are left: $(pgrep -af -- "--checkpoint-dir $ck2")"; fi
# The same weft-elastic again goes on from the checkpoint the stop wrote (its --resume-args on the first launch too).
stopped_at=$(ls -d "$ck2"/step_* | sort | tail -1) && stopped_at=$((10#${stopped_at##*step_}))
run "$elastic" --np 2 --launch "$launch -np {n}" --checkpoint-dir "$ck2" --resume-args "--resume $ck2" -- \
  "$transformer" train --steps $((stopped_at + 2)) --batch-size 8 --ctx 32 --n-layer 2 --d-model 32 --eval-every 0 \
  --threads 1 --fsdp --checkpoint-dir "$ck2" >/dev/null 2>"$tmp/again.err" || fail "weft-elastic again: $(tail -3 "$tmp/again.err")"
grep -q "holds a complete checkpoint: starting at 2 ranks from $ck2/step_0*$stopped_at (step $stopped_at)" "$tmp/again.err" &&
  grep -q "resumed from $ck2/step_0*$stopped_at at step $stopped_at" "$tmp/again.err" ||
  fail "weft-elastic again did not go on from step $stopped_at: $(grep -E 'weft-elastic|resumed' "$tmp/again.err")"

# No restart for a job whose ranks are all alive; the restart limit; options.
if run "$elastic" --np 2 --launch "$launch -np {n}" -- "$transformer" train --steps 0 >/dev/null 2>"$tmp/bad"; then
  fail "a failing job succeeded"; fi
grep -q "failed with status 1[0-9]* without losing a rank: not restarting" "$tmp/bad" || fail "bad flags: $(tail -2 "$tmp/bad")"
if run "$elastic" --np 2 --max-restarts 1 --launch "$launch -np {n}" -- sh -c 'kill -9 $$' >/dev/null 2>"$tmp/limit"; then
  fail "a job that always loses a rank succeeded"; fi
grep -q "restart 1 of 1: the job at 2 ranks lost" "$tmp/limit" && grep -q "giving up after 1 restart(s)" "$tmp/limit" ||
  fail "the restart limit: $(grep weft-elastic "$tmp/limit")"
# A new run replacing a directory's checkpoints, resumed from them at a relaunch (its first launch had been resumed too).
if "$elastic" --np 2 --launch x{n} --checkpoint-dir c --resume-args '--resume c' -- prog --overwrite-checkpoints \
  >/dev/null 2>"$tmp/opt"; then fail "--overwrite-checkpoints with --resume-args accepted"; fi
grep -q "the program's --overwrite-checkpoints replaces c's checkpoints with a new run's" "$tmp/opt" ||
  fail "--overwrite-checkpoints with --resume-args: $(cat "$tmp/opt")"
for bad in "--np 0" "--np 2 --launch mpirun" "--np 4 --sizes 2,1 --launch x{n}" "--np 2 --launch x{n} --resume-args y"; do
  # shellcheck disable=SC2086
  if "$elastic" $bad -- true >/dev/null 2>"$tmp/opt"; then fail "weft-elastic $bad succeeded"; fi
  grep -q "weft-elastic: " "$tmp/opt" || fail "weft-elastic $bad: no message: $(cat "$tmp/opt")"
done
for opt in --np --launch --sizes --max-restarts --checkpoint-dir --resume-args; do  # no value: named (it had spun for ever)
  for end in "" "-- true"; do  # last, or right before -- (which it had taken as the value)
    # shellcheck disable=SC2086
    rc=0 && timeout 10 "$elastic" $opt $end >/dev/null 2>"$tmp/opt" || rc=$?
    [ "$rc" = 2 ] && grep -q "weft-elastic: $opt needs a value" "$tmp/opt" || fail "weft-elastic $opt $end: status $rc: $(cat "$tmp/opt")"
  done
done
"$elastic" --help | grep -q "Usage: weft-elastic --np N --launch" || fail "weft-elastic --help prints no usage"
# The default sizes are --np's divisors: after a loss at 4 ranks, 2 (3 would not split the batch).
"$elastic" --np 4 --max-restarts 1 --launch 'env W={n}' -- sh -c 'kill -9 $$' >/dev/null 2>"$tmp/div" || true
grep -q "relaunching at 2 ranks" "$tmp/div" || fail "default sizes: $(grep weft-elastic "$tmp/div")"
# --checkpoint-dir without --resume-args: a launch adds nothing (it had added an empty argument), and the restart says so
# (it had named the checkpoint as its start).
mkdir -p "$tmp/nores/step_00000005" && echo '{}' >"$tmp/nores/step_00000005/index.json"
"$elastic" --np 2 --max-restarts 1 --launch 'env W={n}' --checkpoint-dir "$tmp/nores" -- \
  sh -c 'echo "arguments: $#" >&2; kill -9 $$' sh >/dev/null 2>"$tmp/nores.err" || true
grep -qF "relaunching at 1 ranks from its own arguments (no --resume-args to add; the newest checkpoint: $tmp/nores/step_00000005 (step 5))" \
  "$tmp/nores.err" && [ "$(grep -c "^arguments: 0$" "$tmp/nores.err")" = 2 ] ||
  fail "no --resume-args: $(grep -E "weft-elastic|arguments" "$tmp/nores.err")"
# Ranks that stopped on a signal sent to them (scancel, kill) are not lost: no restart.
rc=0 && "$elastic" --np 2 --launch 'env W={n}' -- sh -c 'echo "x: stopping after step 3 on SIGTERM; checkpoint written to c" >&2
  exit 143' >/dev/null 2>"$tmp/term" || rc=$?
[ "$rc" = 143 ] && grep -q "the job at 2 ranks was stopped by a signal to its ranks (status 143): not restarting" "$tmp/term" &&
  ! grep -q "restart 1" "$tmp/term" || fail "a stopped job: status $rc: $(grep weft-elastic "$tmp/term")"
# The checkpoint a start names: the highest step by number (step_100000000 after step_99999999), in a directory whose
# name holds a space, passed whole through a quoted --resume-args.
sp="$tmp/e k"
mkdir -p "$sp/step_99999999" "$sp/step_100000000" && touch "$sp/step_99999999/index.json" "$sp/step_100000000/index.json"
"$elastic" --np 1 --launch "env WORLD={n}" --checkpoint-dir "$sp" --resume-args "--resume \"$sp\"" -- \
  printf '%s|' >"$tmp/sp.out" 2>"$tmp/sp.err" || fail "weft-elastic on a directory with a space: $(cat "$tmp/sp.err")"
grep -qF "starting at 1 ranks from $sp/step_100000000 (step 100000000)" "$tmp/sp.err" ||
  fail "the newest step by number is not named: $(cat "$tmp/sp.err")"
[ "$(cat "$tmp/sp.out")" = "--resume|$sp|" ] || fail "--resume-args was split: $(cat "$tmp/sp.out")"
echo "elastic: killed at 4 ranks, resumed at 2 from step $resumed, every later loss and the final bytes as uninterrupted"
