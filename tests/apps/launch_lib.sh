# Sourced by the launcher tests (multihost.sh, slurm.sh) after lib.sh: the training both compare
# across launchers, the per-rank wrapper, and the parity check.
skip() { echo "SKIP: $*"; exit 77; }

# Every launch trains the same: weft-mnist's MLP, 10 steps of a global batch of 64, seed 3.
train_args=(--fsdp --steps 10 --log-every 5 --seed 3 --batch-size 64 --threads 1)

# $tmp/rank.sh DIR PROGRAM ARGS...: one rank, whatever launched it. It notes the host it runs on
# (hostname and network namespace) in DIR/rankR.where and sends its output to DIR/rankR.out, so
# each rank's own words can be checked even when the launcher cannot forward them.
cat >"$tmp/rank.sh" <<'EOF'
#!/bin/sh
dir=$1
shift
r=${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${SLURM_PROCID:-x}}}
echo "$(hostname) $(readlink /proc/self/ns/net)" >"$dir/rank$r.where"
exec "$@" >"$dir/rank$r.out" 2>&1
EOF
chmod +x "$tmp/rank.sh"

# training_of JSONL: what must not depend on the launcher, one line per metrics line (the step,
# the loss as logged, the test accuracy; not the rates).
training_of() {
  while IFS= read -r line; do
    grep -o '"\(split\|step\|loss\|accuracy\)":[^,}]*' <<<"$line" | sort | tr '\n' ' '
    echo
  done <"$1"
}

# checkpoint_sums DIR: the sha256 of every file of the checkpoints under DIR, each index.json's
# without its "run" line (every run records its own identity).
checkpoint_sums() {
  local f
  (cd "$1" && find . -type f ! -name .lock | sort | while read -r f; do
    case $f in
      */index.json) echo "$(grep -v '^ *"run":' "$f" | sha256sum | cut -c1-64)  $f" ;;
      *) sha256sum "$f" ;;
    esac
  done)
}

# same_training WHAT REF_DIR DIR: DIR/metrics.jsonl logs the losses and accuracy of
# REF_DIR/metrics.jsonl exactly (the same digits), and DIR/ck holds the same checkpoint files
# byte for byte (every rank's shard of parameters and Adam state after the last step).
same_training() {
  local what=$1 ref=$2 dir=$3
  [ -s "$ref/metrics.jsonl" ] || fail "no metrics from the reference run"
  [ -s "$dir/metrics.jsonl" ] || fail "$what: no metrics"
  if ! diff <(training_of "$ref/metrics.jsonl") <(training_of "$dir/metrics.jsonl") >"$tmp/diff"; then
    fail "$what: training differs from the single-host mpirun run (< single host, > $what):
$(cat "$tmp/diff")"
  fi
  checkpoint_sums "$ref/ck" >"$tmp/ref.sums"
  checkpoint_sums "$dir/ck" >"$tmp/sums"
  [ "$(wc -l <"$tmp/ref.sums")" -gt 1 ] || fail "no checkpoint from the reference run"
  diff "$tmp/ref.sums" "$tmp/sums" >"$tmp/diff" ||
    fail "$what: checkpoint files differ from the single-host run's (< single host, > $what):
$(cat "$tmp/diff")"
}

# reference_run MNIST DIR MPIRUN [ARGS...]: the training at 4 ranks on this host under mpirun.
reference_run() {
  local mnist=$1 dir=$2
  shift 2
  mkdir -p "$dir"
  timeout 60 "$@" -np 4 "$mnist" "${train_args[@]}" --metrics "$dir/metrics.jsonl" --save "$dir/ck" \
    >"$dir/out" 2>&1 || fail "the single-host mpirun run failed: $(cat "$dir/out")"
}
