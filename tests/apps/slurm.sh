#!/usr/bin/env bash
# Slurm: a one-node cluster of its own (slurmctld + slurmd started here from a generated
# slurm.conf in the scratch directory, on free ports, stopped on exit) runs weft-mnist --fsdp as
#  1. `srun -n 4 --mpi=pmix` (OpenMPI started by Slurm's PMIx, no mpirun), and
#  2. `sbatch` of a batch script that calls the same srun (docs/LAUNCH.md's example),
# and each must log the same losses and accuracy, digit for digit, and write byte-identical
# checkpoint shards as `mpirun -np 4` of the same training;
#  3. weft-elastic over `srun -n {n}`: a --deterministic weft-transformer run at 4 ranks loses a
# rank to SIGKILL after its step-40 checkpoint, restarts by itself at 2 ranks from the latest checkpoint, and
# ends with the final parameters, optimizer state and later losses of an uninterrupted run.
# SKIP (77) without root (slurmd runs jobs as root here), Slurm's commands or its PMIx plugin.
# Usage: slurm.sh WEFT_MNIST WEFT_ELASTIC WEFT_TRANSFORMER WEFT_CHECKPOINT MPIRUN [MPIRUN_ARGS...]
set -euo pipefail
mnist=$1
elastic=$2
transformer=$3
checkpoint=$4
shift 4
launch=("$@")
here=$(dirname "${BASH_SOURCE[0]}")
source "$here/lib.sh"         # $tmp, fail
source "$here/launch_lib.sh"  # skip, train_args, $tmp/rank.sh, same_training, reference_run
export OMP_NUM_THREADS=1

[ "$(id -u)" = 0 ] || skip "the test's slurmd runs as root"
for c in slurmctld slurmd srun sbatch sinfo; do
  command -v "$c" >/dev/null || skip "no $c (Debian: slurmctld, slurmd, slurm-client)"
done

# Two free TCP ports for this cluster alone.
free_port() {
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 40000))
    ss -Htln "sport = :$p" | grep -q . || { echo "$p"; return; }
  done
  fail "no free port found"
}
ctld_port=$(free_port)
slurmd_port=$(free_port)
[ "$ctld_port" != "$slurmd_port" ] || slurmd_port=$((ctld_port + 1))
s=$tmp/slurm
mkdir -p "$s/state" "$s/spool"
host=$(hostname -s)
node=weft-$$
# auth/none: no munge daemon or key is needed for a cluster on one machine.
cat >"$s/slurm.conf" <<EOF
ClusterName=weft$$
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$s/state
SlurmdSpoolDir=$s/spool
SlurmctldPidFile=$s/slurmctld.pid
SlurmdPidFile=$s/slurmd.pid
SlurmctldLogFile=$s/slurmctld.log
SlurmdLogFile=$s/slurmd.log
PlugStackConfig=$s/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
# A step whose task died ends its other tasks with SIGTERM, then SIGKILL this many seconds later
# (weft's ranks, blocked in a collective with the dead one, wait for the second).
KillWait=3
# 4 CPUs on a 2-core machine: the ranks share the cores, as mpirun --oversubscribe does.
SlurmdParameters=config_overrides
NodeName=$node NodeHostname=$host NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=weft Nodes=$node Default=YES MaxTime=10 State=UP
EOF
: >"$s/plugstack.conf"
export SLURM_CONF=$s/slurm.conf
ctld="" slurmd=""
cleanup() {
  set +e
  [ -n "$ctld" ] && scancel --quiet --partition weft 2>/dev/null
  for p in $slurmd $ctld; do kill "$p" 2>/dev/null; done
  for p in $slurmd $ctld; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 143' TERM INT  # meson's timeout: clean up all the same
start=$(date +%s)
slurmctld -D -i >"$s/slurmctld.out" 2>&1 &
ctld=$!
slurmd -D -N "$node" >"$s/slurmd.out" 2>&1 &
slurmd=$!
state=""
for _ in $(seq 100); do
  state=$(sinfo -h -n "$node" -o %T 2>/dev/null || true)
  [ "$state" = idle ] && break
  sleep 0.2
done
[ "$state" = idle ] || fail "the test cluster did not come up (node state '$state'):
$(cat "$s"/*.out; tail -n 20 "$s/slurmctld.log" "$s/slurmd.log")"
echo "cluster up in $(($(date +%s) - start)) s (ports $ctld_port, $slurmd_port)"
srun --mpi=list 2>&1 | grep -q pmix || skip "this Slurm has no PMIx plugin: $(srun --mpi=list 2>&1)"

t=$(date +%s)
reference_run "$mnist" "$tmp/one" "${launch[@]}"
echo "mpirun -np 4 (the reference): $(($(date +%s) - t)) s"

# 1. srun: each task one rank; OpenMPI finds its rank and peers through Slurm's PMIx server.
mkdir -p "$tmp/srun"
t=$(date +%s)
timeout 60 srun -n 4 --mpi=pmix --kill-on-bad-exit=1 "$tmp/rank.sh" "$tmp/srun" "$mnist" "${train_args[@]}" \
  --metrics "$tmp/srun/metrics.jsonl" --save "$tmp/srun/ck" >"$tmp/srun/out" 2>&1 ||
  fail "srun -n 4 --mpi=pmix failed: $(cat "$tmp/srun/out" "$tmp"/srun/rank*.out)"
grep -q "FSDP over 4 ranks" "$tmp/srun/rank0.out" || fail "srun did not make one world of 4 ranks: $(cat "$tmp/srun/rank0.out")"
same_training "srun -n 4 --mpi=pmix" "$tmp/one" "$tmp/srun"
echo "srun -n 4 --mpi=pmix: the mpirun losses ($(grep -o '"loss":[^,}]*' "$tmp/srun/metrics.jsonl" | tr '\n' ' '))" \
  "and identical checkpoints ($(($(date +%s) - t)) s)"

# 2. sbatch: a batch script like docs/LAUNCH.md's, waited for.
mkdir -p "$tmp/sbatch"
t=$(date +%s)
cat >"$tmp/job.sh" <<EOF
#!/bin/bash
#SBATCH --ntasks=4
#SBATCH --time=5
export OMP_NUM_THREADS=1
srun --mpi=pmix "$tmp/rank.sh" "$tmp/sbatch" "$mnist" ${train_args[*]} \\
  --metrics "$tmp/sbatch/metrics.jsonl" --save "$tmp/sbatch/ck"
EOF
# (Polled here every 0.2 s: sbatch --wait polls at growing intervals, seconds apart.)
job=$(sbatch --parsable --output "$tmp/sbatch/job.out" "$tmp/job.sh" 2>"$tmp/sbatch/out") ||
  fail "sbatch refused the job: $(cat "$tmp/sbatch/out")"
job_state=""
for _ in $(seq 300); do
  job_state=$(scontrol -o show job "$job" | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
  case $job_state in PENDING|CONFIGURING|RUNNING|COMPLETING) sleep 0.2 ;; *) break ;; esac
done
[ "$job_state" = COMPLETED ] || fail "batch job $job ended $job_state: $(scontrol -o show job "$job" | grep -o 'ExitCode=[^ ]*')
$(cat "$tmp/sbatch/job.out" "$tmp"/sbatch/rank*.out 2>/dev/null)"
same_training "sbatch + srun" "$tmp/one" "$tmp/sbatch"
echo "sbatch (srun --mpi=pmix inside): the same losses and checkpoints ($(($(date +%s) - t)) s)"
# 3. weft-elastic: srun's step relaunched inside the allocation on the ranks left.
t=$(date +%s)
el=(train --steps 150 --batch-size 8 --ctx 32 --n-layer 2 --d-model 32 --eval-every 50 --eval-iters 2 --log-every 1
    --seed 3 --threads 1 --fsdp --deterministic --checkpoint-every 20)
timeout 120 "${launch[@]}" -np 4 "$transformer" "${el[@]}" --checkpoint-dir "$tmp/el_ref" --metrics "$tmp/el_ref.jsonl" >/dev/null \
  2>"$tmp/err" || fail "the uninterrupted --deterministic run: $(tail -3 "$tmp/err")"
ck=$tmp/el
( for _ in $(seq 3000); do [ -e "$ck/step_00000040/index.json" ] && break; sleep 0.01; done
  pkill -9 -n -f -- "--checkpoint-dir $ck" ) &
killer=$!
timeout 180 "$elastic" --np 4 --sizes 4,2,1 --launch "srun -n {n} --mpi=pmix --kill-on-bad-exit=1" \
  --checkpoint-dir "$ck" --resume-args "--resume $ck" -- "$transformer" "${el[@]}" --checkpoint-dir "$ck" \
  --metrics "$tmp/el.jsonl" \
  >/dev/null 2>"$tmp/el.err" || fail "weft-elastic over srun: $(grep -a weft-elastic "$tmp/el.err"; tail -3 "$tmp/el.err")"
wait "$killer" || true
restart=$(grep -a "weft-elastic: restart" "$tmp/el.err" || true)
[[ "$restart" =~ "at 4 ranks lost 1 rank(s)".*"relaunching at 2 ranks from $ck/step_"[0-9]+" (step "([0-9]+)")" ]] ||
  fail "weft-elastic over srun: not one restart from 4 to 2 ranks with its step: $restart"
resumed=${BASH_REMATCH[1]}
for d in el_ref el; do
  timeout 60 "$checkpoint" consolidate --with-optimizer "$tmp/$d" "$tmp/$d.safetensors" >/dev/null 2>"$tmp/err" ||
    fail "consolidate $d: $(cat "$tmp/err")"
done
cmp -s "$tmp/el.safetensors" "$tmp/el_ref.safetensors" || fail "weft-elastic over srun ended apart from the uninterrupted run"
# The lines after the checkpoint's step; those the killed job had logged past it come again from
# the resumed one, and must be the same lines (kept once).
later() { training_of "$1" | awk -v s="$resumed" '!seen[$0]++ { if (match($0, /"step":[0-9]+/) && substr($0, RSTART + 7, RLENGTH - 7) + 0 > s) print }'; }
# One line a step after the resumed one (and the evaluations): 150 - step at least, however late
# the kill came (on a loaded machine the run can pass step 60's checkpoint before it).
[ "$(later "$tmp/el.jsonl" | wc -l)" -ge $((150 - resumed)) ] && [ "$(later "$tmp/el.jsonl")" = "$(later "$tmp/el_ref.jsonl")" ] ||
  fail "weft-elastic over srun: the losses after step $resumed differ from the uninterrupted run's (< resumed, > uninterrupted):
$(diff <(later "$tmp/el.jsonl") <(later "$tmp/el_ref.jsonl") | head -20)"
echo "weft-elastic over srun: killed at 4 ranks, resumed at 2 from step $resumed, the uninterrupted run's bytes ($(($(date +%s) - t)) s)"
echo "slurm ok ($(($(date +%s) - start)) s)"
