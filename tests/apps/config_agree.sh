#!/usr/bin/env bash
# Every rank must get the same configuration: an MPMD launch that hands weft-mnist --fsdp or
# weft-transformer train --fsdp one different flag per rank group (or --fsdp to some ranks only) fails within the time limit
# (no hang, no silent run with different models), and every rank says which flag differs and
# each rank's value; the same launch with agreeing flags trains.
# Usage: config_agree.sh WEFT_MNIST WEFT_TRANSFORMER MPIRUN [MPIRUN_ARGS...]
set -euo pipefail
mnist=$1
transformer=$2
mpirun=$3
shift 3
mpirun_args=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail, loss_at, within
export OMP_NUM_THREADS=1

# mpmd NP_A NP_B -- ARGS_A... -- ARGS_B...: runs `mpirun -np NP_A ARGS_A : -np NP_B ARGS_B`.
mpmd() {
  local na=$1 nb=$2
  shift 3
  local a=() b=()
  while [ "$1" != "--" ]; do a+=("$1"); shift; done
  shift
  b=("$@")
  timeout 60 "$mpirun" "${mpirun_args[@]}" -np "$na" "${a[@]}" : -np "$nb" "${b[@]}"
}

# expect_mismatch NAME FLAG NP VALUES... -- mpmd arguments: the launch fails, not by timeout,
# and each of the NP ranks prints "error on rank R: ...: FLAG is ..." with every value.
expect_mismatch() {
  local name=$1 flag=$2 np=$3
  shift 3
  local rc=0
  mpmd "$@" >"$tmp/$name.out" 2>&1 || rc=$?
  [ "$rc" != 0 ] || fail "$name: ranks with different $flag trained on: $(cat "$tmp/$name.out")"
  [ "$rc" != 124 ] && [ "$rc" != 137 ] || fail "$name: hung with different $flag: $(cat "$tmp/$name.out")"
  for ((r = 0; r < np; ++r)); do
    grep -q "error on rank $r: .*the ranks differ: $flag is " "$tmp/$name.out" ||
      fail "$name: rank $r does not name $flag: $(cat "$tmp/$name.out")"
  done
  local lines
  lines=$(grep -c "the ranks differ: $flag is .*(every rank must get the same flags)" "$tmp/$name.out" || true)
  [ "$lines" -ge "$np" ] || fail "$name: $lines of $np ranks name $flag: $(cat "$tmp/$name.out")"
}

m=(--fsdp --steps 2 --log-every 1 --seed 1 --threads 1 --data "$(mnist_small 1000)")
expect_mismatch mnist_lr --lr 2 1 1 -- "$mnist" "${m[@]}" --batch-size 16 --lr 0.1 -- "$mnist" "${m[@]}" --batch-size 16 --lr 0.2
grep -q -- "--lr is 0.1 on rank 0, 0.2 on rank 1 (every rank must get the same flags)" "$tmp/mnist_lr.out" ||
  fail "mnist --lr: the message lists the values wrongly: $(cat "$tmp/mnist_lr.out")"
expect_mismatch mnist_batch --batch-size 2 1 1 -- "$mnist" "${m[@]}" --batch-size 16 -- "$mnist" "${m[@]}" --batch-size 32
expect_mismatch mnist_batch_np4 --batch-size 4 2 2 -- "$mnist" "${m[@]}" --batch-size 16 -- "$mnist" "${m[@]}" --batch-size 32
grep -q -- "--batch-size is 16 on ranks 0-1, 32 on ranks 2-3" "$tmp/mnist_batch_np4.out" ||
  fail "mnist --batch-size at 4 ranks: the message lists the values wrongly: $(cat "$tmp/mnist_batch_np4.out")"
# Ranks saving to different directories stop before training (they had trained the whole run, then failed at the
# save, writing nothing).
expect_mismatch mnist_save --save 2 1 1 -- "$mnist" "${m[@]}" --batch-size 16 --save "$tmp/sa" -- "$mnist" "${m[@]}" \
  --batch-size 16 --save "$tmp/sb"
grep -q "on rank 0, $tmp/sb on rank 1" "$tmp/mnist_save.out" || fail "mnist --save: $(cat "$tmp/mnist_save.out")"

# --fsdp on some ranks only: the ranks without it join MPI too (started by mpirun) and every rank
# names --fsdp, instead of the --fsdp rank hanging in MPI_Init while the other trains alone.
expect_mismatch mnist_fsdp_some --fsdp 2 1 1 -- "$mnist" "${m[@]}" --batch-size 16 -- "$mnist" "${m[@]:1}" --batch-size 16
grep -q -- "--fsdp is true on rank 0, false on rank 1" "$tmp/mnist_fsdp_some.out" ||
  fail "mnist --fsdp on rank 0 only: $(cat "$tmp/mnist_fsdp_some.out")"

t=(train --fsdp --n-layer 1 --n-head 2 --d-model 16 --ctx 16 --batch-size 4 --warmup 1 --seed 0
   --threads 1 --eval-every 0 --eval-iters 1 --log-every 1)
expect_mismatch transformer_accum --grad-accum 2 1 1 -- "$transformer" "${t[@]}" --steps 2 -- "$transformer" "${t[@]}" --steps 2 --grad-accum 2
expect_mismatch transformer_fsdp_some --fsdp 3 1 2 -- "$transformer" "${t[@]}" --steps 2 -- "$transformer" train \
  "${t[@]:2}" --steps 2
expect_mismatch transformer_steps --steps 2 1 1 -- "$transformer" "${t[@]}" --steps 3 -- "$transformer" "${t[@]}" --steps 4
# Each flag is named as given (--memory-budget had been named "--plan", --deterministic by its virtual batches).
expect_mismatch transformer_budget --memory-budget 2 1 1 -- "$transformer" "${t[@]}" --steps 2 --memory-budget 100M -- \
  "$transformer" "${t[@]}" --steps 2
expect_mismatch transformer_det --deterministic 2 1 1 -- "$transformer" "${t[@]}" --steps 2 --deterministic -- \
  "$transformer" "${t[@]}" --steps 2
grep -q -- "--deterministic is true on rank 0, false on rank 1" "$tmp/transformer_det.out" ||
  fail "--deterministic on rank 0 only: $(cat "$tmp/transformer_det.out")"
expect_mismatch transformer_clip_np4 --clip 4 2 2 -- "$transformer" "${t[@]}" --steps 2 -- "$transformer" "${t[@]}" --steps 2 --clip 0.5

# --help on one rank: it joins the others, and every rank names it (it had exited unjoined, leaving the others in
# MPI_Init for ever); --step-time on one rank changes its collectives (the others waited in theirs till the timeout).
expect_mismatch mnist_help --help 2 1 1 -- "$mnist" "${m[@]}" --batch-size 16 -- "$mnist" "${m[@]}" --batch-size 16 --help
expect_mismatch transformer_help --help 2 1 1 -- "$transformer" "${t[@]}" --steps 2 --help -- "$transformer" "${t[@]}" --steps 2
grep -q -- "--help is true on rank 0, false on rank 1" "$tmp/transformer_help.out" ||
  fail "--help on rank 0 only: $(cat "$tmp/transformer_help.out")"
expect_mismatch transformer_step_time --step-time 2 1 1 -- "$transformer" "${t[@]}" --steps 2 --memory-budget 1G -- \
  "$transformer" "${t[@]}" --steps 2 --memory-budget 1G --step-time
expect_mismatch mnist_overwrite --overwrite-checkpoints 2 1 1 -- "$mnist" "${m[@]}" --batch-size 16 --save "$tmp/so" \
  --overwrite-checkpoints -- "$mnist" "${m[@]}" --batch-size 16 --save "$tmp/so"
# --help on every rank prints it once and succeeds.
mpmd 1 1 -- "$mnist" --help -- "$mnist" --help >"$tmp/help.out" 2>&1 || fail "--help on every rank: $(cat "$tmp/help.out")"
[ "$(grep -c '^Usage' "$tmp/help.out")" = 1 ] || fail "--help on every rank: not printed once: $(cat "$tmp/help.out")"

# A checkpoint directory each rank sees apart (rank 1 has another directory mounted over the path, as a disk local to
# each host) is refused before training, on every rank: the run had trained to the end, then failed at the first
# save, keeping nothing. Needs a mount namespace of its own (unshare -m: root); else said and skipped.
if unshare -m --propagation private true 2>/dev/null; then
  mkdir -p "$tmp/ck_a" "$tmp/ck_b"
  apart=(unshare -m --propagation private bash -c 'mount --bind "$1" "$2" && shift 2 && exec "$@"' _ "$tmp/ck_b" "$tmp/ck_a")
  for app in mnist transformer; do
    if [ $app = mnist ]; then a=("$mnist" "${m[@]}" --batch-size 16 --save "$tmp/ck_a"); else
      a=("$transformer" "${t[@]}" --steps 2 --checkpoint-dir "$tmp/ck_a"); fi
    rc=0
    mpmd 1 1 -- "${a[@]}" -- "${apart[@]}" "${a[@]}" >"$tmp/apart.out" 2>&1 || rc=$?
    [ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "$app: a directory each rank sees apart (rc $rc): $(cat "$tmp/apart.out")"
    for r in 0 1; do
      grep -q "error on rank $r: .*what --.* holds is rank 0's file, host .* on rank 0, no file on rank 1 (every rank must see the same checkpoint directory" \
        "$tmp/apart.out" || fail "$app: rank $r does not name the directory: $(cat "$tmp/apart.out")"
    done
    ! grep -q "^step 2\|train 2/2" "$tmp/apart.out" || fail "$app: trained before refusing: $(cat "$tmp/apart.out")"
    [ -z "$(ls -A "$tmp/ck_b")" ] && ! ls -A "$tmp/ck_a" | grep -q probe || fail "$app: the probe file was left"
  done
else
  echo "config_agree: the node-local directory case not run: unshare -m cannot make a mount namespace here (needs root)"
fi

# Control: the same MPMD launch with agreeing flags trains at 2 ranks (once per app).
mpmd 1 1 -- "$mnist" "${m[@]}" --batch-size 16 --lr 0.1 -- "$mnist" "${m[@]}" --batch-size 16 --lr 0.1 >"$tmp/ok.out" 2>&1 ||
  fail "mnist with agreeing flags: $(cat "$tmp/ok.out")"
mpmd 1 1 -- "$transformer" "${t[@]}" --steps 2 -- "$transformer" "${t[@]}" --steps 2 >"$tmp/ok.out" 2>&1 ||
  fail "transformer with agreeing flags: $(cat "$tmp/ok.out")"
! grep -q "the ranks differ" "$tmp/ok.out" || fail "agreeing flags reported as different: $(cat "$tmp/ok.out")"
echo "config_agree: ok"
