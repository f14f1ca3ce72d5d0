#!/usr/bin/env bash
# Slurm: a one-node cluster of its own (slurmctld + slurmd started here from a generated
# slurm.conf in the scratch directory, on free ports, stopped on exit) runs weft-mnist --fsdp as
#  1. `srun -n 4 --mpi=pmix` (OpenMPI started by Slurm's PMIx, no mpirun), and
#  2. `sbatch` of a batch script that calls the same srun (docs/LAUNCH.md's example),
# and each must log the same losses and accuracy, digit for digit, and write byte-identical
# checkpoint shards as `mpirun -np 4` of the same training.
# SKIP (77) without root (slurmd runs jobs as root here), Slurm's commands or its PMIx plugin.
# Usage: slurm.sh WEFT_MNIST MPIRUN [MPIRUN_ARGS...]
set -euo pipefail
mnist=$1
shift
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
echo "slurm ok ($(($(date +%s) - start)) s)"
