#!/usr/bin/env bash
# Graceful stop: SIGTERM/SIGINT make weft-transformer and weft-mnist finish the current step,
# write a checkpoint, say so on every rank and exit 143 / 130; resuming from that checkpoint ends
# bitwise where an uninterrupted run ends (the consolidated weights are the same bytes, and so are
# the last losses). A SIGINT after the first signal stops at once, without a checkpoint; a SIGTERM
# after it changes nothing.
# - 2 ranks, SIGTERM to rank 1 only: rank 0 never sees the signal but stops after the same step
#   (the ranks agree at each step's end);
# - 2 ranks, SIGTERM to mpirun with --mca odls_base_sigkill_timeout 5 (mpirun sends the ranks
#   SIGTERM after that many seconds and SIGKILL as many later);
# - weft-mnist alone, SIGINT;
# - SIGTERM, then SIGINT or SIGTERM again 0.3 s later, during a step of about a second.
# The signals are sent once the metrics show step 3; runs are long enough not to end first (the
# script fails, naming it, if one does). Usage: graceful_stop.sh TRANSFORMER MNIST CHECKPOINT MPIRUN ARGS...
set -euo pipefail
gpt=$1 mnist=$2 tool=$3
shift 3
launch=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail, loss_at, within
export OMP_NUM_THREADS=1
steps() { local c; c=$(grep -c '"step"' "$1" 2>/dev/null) || true; echo "${c:-0}"; }
wait_for_step() {  # wait_for_step METRICS N PID: until METRICS logs N steps (the process must still run)
  for _ in $(seq 600); do
    [ "$(steps "$1")" -ge "$2" ] && return 0
    kill -0 "$3" 2>/dev/null || fail "the run ended before step $2: $(cat "$tmp/err")"
    sleep 0.1
  done
  fail "no step $2 in $1 within 60 s"
}
descendants() { local c; for c in $(pgrep -P "$1"); do echo "$c"; descendants "$c"; done; }
rank_pid() {  # rank_pid PID RANK: the process of that rank among PID's descendants
  for p in $(descendants "$1"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -x "OMPI_COMM_WORLD_RANK=$2" >/dev/null && { echo "$p"; return; }
  done
}
consolidated() { "$tool" consolidate "$1" "$2" >/dev/null 2>"$tmp/err" || fail "consolidate $1: $(cat "$tmp/err")"; }

# Steps of the runs that stop and resume; a sanitizer's run is several times slower per step, so
# fewer steps still outlast the signal (scripts/sanitize.sh sets WEFT_SANITIZER).
S=1000
[ -n "${WEFT_SANITIZER:-}" ] && S=400
cfg=(train --fsdp --n-layer 1 --n-head 2 --d-model 16 --ctx 16 --batch-size 4 --warmup 5 --lr 3e-3 --seed 0 --threads 1
     --eval-every 0 --eval-iters 1 --log-every 1 --dropout 0.1 --steps $S)
mp() { timeout 120 "${launch[@]}" -np 2 "$@"; }

# 1. Two ranks, SIGTERM to rank 1 only.
mp "$gpt" "${cfg[@]}" --metrics "$tmp/u.jsonl" --checkpoint-dir "$tmp/uck" >"$tmp/u.out" 2>"$tmp/err" ||
  fail "uninterrupted run: $(cat "$tmp/err")"
rc=0
mp "$gpt" "${cfg[@]}" --metrics "$tmp/i.jsonl" --checkpoint-dir "$tmp/ck" >/dev/null 2>"$tmp/err" &
pid=$!
wait_for_step "$tmp/i.jsonl" 3 $pid
r1=$(rank_pid $pid 1)
[ -n "$r1" ] || fail "no rank 1 under $pid"
kill -TERM "$r1"
wait $pid || rc=$?
[ "$rc" = 143 ] || fail "SIGTERM to rank 1: mpirun exited $rc, want 143: $(cat "$tmp/err")"
n=$(grep -o "rank 1: stopping after step [0-9]* on SIGTERM" "$tmp/err" | grep -o "[0-9]* on" | cut -d' ' -f1 || true)
[ -n "$n" ] || fail "rank 1 does not say it stops: $(cat "$tmp/err")"
[ "$n" -lt $S ] || fail "the run ended (step $n) before the signal: make it longer"
ck=$(printf '%s/ck/step_%08d' "$tmp" "$n")
for r in 0 1; do
  grep -q "weft-transformer: rank $r: stopping after step $n on SIGTERM; checkpoint written to $ck\$" "$tmp/err" ||
    fail "rank $r does not stop after step $n with the checkpoint: $(cat "$tmp/err")"
done
"$tool" verify "$ck" >/dev/null 2>"$tmp/verr" || fail "the stop checkpoint does not verify: $(cat "$tmp/verr")"
[ "$(ls "$tmp/ck")" = "$(basename "$ck")" ] || fail "more than the stop checkpoint: $(ls -a "$tmp/ck")"
mp "$gpt" "${cfg[@]}" --metrics "$tmp/i.jsonl" --checkpoint-dir "$tmp/ck" --resume "$tmp/ck" >"$tmp/r.out" 2>"$tmp/err" ||
  fail "resume: $(cat "$tmp/err")"
grep -q "resumed from $ck at step $n" "$tmp/err" || fail "did not resume at step $n: $(cat "$tmp/err")"
for s in $((n + 1)) $S; do
  a=$(loss_at "$tmp/u.jsonl" $s) b=$(loss_at "$tmp/i.jsonl" $s)
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "step-$s loss after stop and resume: $b, uninterrupted $a"
done
cmp -s "$tmp/u.out" "$tmp/r.out" || fail "final line differs: $(cat "$tmp/r.out") vs $(cat "$tmp/u.out")"
consolidated "$tmp/uck" "$tmp/u.safetensors"
consolidated "$tmp/ck" "$tmp/r.safetensors"
cmp -s "$tmp/u.safetensors" "$tmp/r.safetensors" || fail "the resumed run's final weights differ from the uninterrupted run's"

# 2. SIGTERM to mpirun: it passes SIGTERM on to the ranks after odls_base_sigkill_timeout seconds.
big=("${cfg[@]}")
big[${#big[@]}-1]=1000000
# mpirun itself, not under `timeout`: timeout passes a SIGTERM on to its child and to its own
# process group, so mpirun would get two, and on a second one it kills the ranks at once.
rc=0
"${launch[@]}" --mca odls_base_sigkill_timeout 5 -np 2 "$gpt" "${big[@]}" --metrics "$tmp/m.jsonl" \
  --checkpoint-dir "$tmp/mck" >/dev/null 2>"$tmp/err" &
pid=$!
(sleep 120; kill -KILL $pid) >/dev/null 2>&1 &
watchdog=$!
wait_for_step "$tmp/m.jsonl" 3 $pid
kill -TERM $pid
wait $pid || rc=$?
kill $watchdog 2>/dev/null || fail "SIGTERM to mpirun: still running after 120 s"
for r in 0 1; do
  grep -Eq "weft-transformer: rank $r: stopping after step [0-9]+ on SIGTERM; checkpoint written to $tmp/mck/step_" \
    "$tmp/err" || fail "SIGTERM to mpirun: rank $r did not stop with a checkpoint: $(cat "$tmp/err")"
done
"$tool" verify "$tmp/mck" >/dev/null 2>"$tmp/verr" || fail "SIGTERM to mpirun: checkpoint: $(cat "$tmp/verr")"

# 3. weft-mnist alone, SIGINT (Ctrl-C): exit 130, then resume to the uninterrupted result (M
# steps in all: --steps counts the steps a run adds).
M=200
[ -n "${WEFT_SANITIZER:-}" ] && M=20
m=(--batch-size 256 --threads 1 --seed 1 --log-every 1 --data "$(mnist_small 1000)")
"$mnist" "${m[@]}" --steps $M --save "$tmp/mu" >"$tmp/mu.out" 2>"$tmp/err" || fail "mnist: $(cat "$tmp/err")"
rc=0
"$mnist" "${m[@]}" --steps $M --save "$tmp/mi" --metrics "$tmp/mi.jsonl" >/dev/null 2>"$tmp/err" &
pid=$!
wait_for_step "$tmp/mi.jsonl" 3 $pid
kill -INT $pid
wait $pid || rc=$?
[ "$rc" = 130 ] || fail "mnist SIGINT: exit $rc, want 130: $(cat "$tmp/err")"
k=$(grep -Eo "^weft-mnist: stopping after step [0-9]+ on SIGINT; checkpoint written to $tmp/mi/step_" "$tmp/err" |
    grep -Eo "step [0-9]+" | cut -d' ' -f2 || true)
[ -n "$k" ] || fail "mnist SIGINT: no stop message: $(cat "$tmp/err")"
[ "$k" -lt $M ] || fail "mnist: the run ended (step $k) before the signal: make it longer"
"$mnist" "${m[@]}" --steps $M --save "$tmp/mi" --resume "$tmp/mi" >"$tmp/mr.out" 2>"$tmp/err" ||
  fail "mnist resume: $(cat "$tmp/err")"
cmp -s "$tmp/mu.out" "$tmp/mr.out" || fail "mnist after SIGINT and resume: $(cat "$tmp/mr.out"), uninterrupted $(cat "$tmp/mu.out")"
consolidated "$tmp/mu" "$tmp/mu.safetensors"
consolidated "$tmp/mi" "$tmp/mi.safetensors"
cmp -s "$tmp/mu.safetensors" "$tmp/mi.safetensors" || fail "mnist: resumed final weights differ from the uninterrupted run's"

# 4. A SIGINT after the first signal (Ctrl-C again) stops at once, without finishing the step or saving. Sent 0.3 s
# into a step of about a second.
slow=(train --n-layer 6 --d-model 384 --ctx 256 --batch-size 8 --steps 1000 --eval-every 0 --eval-iters 1 --threads 1
      --log-every 1)
# two_signals SIGNAL TAG: a slow run sent SIGTERM once step 1 is logged, then SIGNAL 0.3 s later; sets rc.
two_signals() {
  rc=0
  "$gpt" "${slow[@]}" --metrics "$tmp/$2.jsonl" --checkpoint-dir "$tmp/${2}ck" >/dev/null 2>"$tmp/err" &
  local pid=$!
  wait_for_step "$tmp/$2.jsonl" 1 $pid
  kill -TERM $pid
  sleep 0.3
  kill -"$1" $pid 2>/dev/null || true
  wait $pid || rc=$?
}
two_signals INT s
[ "$rc" = 130 ] || fail "second signal: exit $rc, want 130: $(cat "$tmp/err")"
grep -q "weft-transformer: a second stop signal: stopping at once, without a checkpoint" "$tmp/err" ||
  fail "second signal: no message: $(cat "$tmp/err")"
! grep -q "stopping after step" "$tmp/err" || fail "second signal: the run stopped gracefully instead: $(cat "$tmp/err")"
[ -z "$(ls "$tmp/sck" 2>/dev/null | grep step_ || true)" ] || fail "second signal: a checkpoint was written"
# 5. A signal during the last step stops nothing: the run ends as it would have (its validation,
# its checkpoint, exit 0). The signal is sent as step 1 is logged, while step 2 (of 2, about a
# second) runs.
rc=0
last=(train --n-layer 6 --d-model 384 --ctx 256 --batch-size 8 --steps 2 --eval-every 0 --eval-iters 1 --threads 1
      --log-every 1)
"$gpt" "${last[@]}" --metrics "$tmp/l.jsonl" --checkpoint-dir "$tmp/lck" >/dev/null 2>"$tmp/err" &
pid=$!
wait_for_step "$tmp/l.jsonl" 1 $pid
kill -INT $pid
wait $pid || rc=$?
[ "$rc" = 0 ] || fail "SIGINT during the last step: exit $rc, want 0: $(cat "$tmp/err")"
grep -q '"split":"val","step":2' "$tmp/l.jsonl" || fail "SIGINT during the last step: no final validation: $(cat "$tmp/l.jsonl")"

# 5b. A SIGTERM after the first (Slurm signals the ranks and mpirun, which passes its own on) changes nothing: the
# step and the checkpoint go on (it had ended the run at once, the checkpoint lost).
two_signals TERM t
[ "$rc" = 143 ] && grep -q "stopping after step [0-9]* on SIGTERM; checkpoint written to $tmp/tck/step_" "$tmp/err" ||
  fail "two SIGTERMs: exit $rc, want 143 with a checkpoint: $(cat "$tmp/err")"
grep -q "SIGTERM again: still stopping after this step" "$tmp/err" || fail "two SIGTERMs: the second was not noted" \
  "(the step was shorter than 0.3 s?): $(cat "$tmp/err")"

# 6. The step a signal stops after is logged, whatever --log-every (the checkpoint's step).
rc=0
quiet=("${big[@]}")
for i in "${!quiet[@]}"; do [ "${quiet[$i]}" = --log-every ] && quiet[$((i + 1))]=1000000; done
"$gpt" "${quiet[@]:0:1}" "${quiet[@]:2}" --metrics "$tmp/q.jsonl" --checkpoint-dir "$tmp/qck" >/dev/null 2>"$tmp/err" &
pid=$!
wait_for_step "$tmp/q.jsonl" 1 $pid
sleep 0.5
kill -INT $pid
wait $pid || rc=$?
q=$(grep -Eo "stopping after step [0-9]+ on SIGINT" "$tmp/err" | grep -Eo "[0-9]+" || true)
[ -n "$q" ] && [ "$(tail -1 "$tmp/q.jsonl" | grep -o '"step":[0-9]*' | cut -d: -f2)" = "$q" ] ||
  fail "the stopped step ($q) is not the last logged: $(tail -1 "$tmp/q.jsonl"); $(cat "$tmp/err")"

echo "graceful_stop: ok (2 ranks stopped after step $n on SIGTERM to rank 1 and resumed bitwise; SIGTERM to mpirun;" \
     "mnist SIGINT resumed bitwise; a SIGINT after it stops at once, a SIGTERM after it does not)"
