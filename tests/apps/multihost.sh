#!/usr/bin/env bash
# Two hosts on one machine: network namespaces a and b joined by a veth pair (10.77.0.1 and
# 10.77.0.2), each with its own hostname, two ranks on each. mpirun runs in a; its rsh agent
# starts the remote daemon in b with `ip netns exec` where a cluster would use ssh. The ranks
# talk over TCP only (btl tcp,self; btl_tcp_if_include and oob_tcp_if_include the veth subnet).
#  1. Parity: weft-mnist --fsdp at 4 ranks across the hosts logs the same losses and accuracy,
#     digit for digit, and writes byte-identical checkpoint shards as at 4 ranks on one host
#     (mpirun's default, shared-memory transport); ranks 0-1 ran in a and 2-3 in b, and the
#     training's traffic crossed the veth.
#  2. Link cut: with WEFT_COLLECTIVE_TIMEOUT=2, the veth taken down mid-run makes the rank on
#     each side of the cut print the named timeout error and exit within 20 s. One rank per
#     host: a rank that shares mpirun's host with the first one to time out may be ended by
#     mpirun's abort (SIGTERM) before its own timeout comes (docs/LAUNCH.md).
# SKIP (77) where network namespaces cannot be made (not root, no CAP_NET_ADMIN, no ip).
# Usage: multihost.sh WEFT_MNIST MPIRUN [MPIRUN_ARGS...]
set -euo pipefail
mnist=$1
shift
launch=("$@")  # for the single-host reference run
mpirun=$1
here=$(dirname "${BASH_SOURCE[0]}")
source "$here/lib.sh"         # $tmp, fail
source "$here/launch_lib.sh"  # skip, train_args, $tmp/rank.sh, same_training, reference_run
export OMP_NUM_THREADS=1

[ "$(id -u)" = 0 ] || skip "network namespaces need root (CAP_NET_ADMIN)"
command -v ip >/dev/null || skip "no ip command (iproute2)"
command -v unshare >/dev/null || skip "no unshare command (util-linux)"

# Unique names, so that runs side by side do not meet; the addresses live inside them.
id=weft-$$-$RANDOM
a=$id-a b=$id-b
cut_job=""
cleanup() {
  set +e
  for ns in "$a" "$b"; do
    if [ -e "/run/netns/$ns" ]; then
      pids=$(ip netns pids "$ns")
      [ -n "$pids" ] && kill -9 $pids
      ip netns del "$ns"
    fi
  done
  [ -n "$cut_job" ] && kill "$cut_job" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 143' TERM INT  # meson's timeout: clean up all the same
ip netns add "$a" 2>"$tmp/err" || skip "cannot make a network namespace: $(cat "$tmp/err")"
ip netns add "$b"
unshare --uts true 2>"$tmp/err" || skip "cannot make a UTS namespace for a hostname: $(cat "$tmp/err")"
ip -n "$a" link add weft0 type veth peer name weft0 netns "$b"
ip -n "$a" addr add 10.77.0.1/24 dev weft0
ip -n "$b" addr add 10.77.0.2/24 dev weft0
for ns in "$a" "$b"; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set weft0 up
done

# The rsh agent: "AGENT HOST COMMAND..." runs COMMAND in HOST's namespace under HOST's name.
# Distinct hostnames matter: OpenMPI 4.1 hangs or crashes in MPI_Comm_split_type when two
# hosts report the same one.
cat >"$tmp/agent" <<EOF
#!/bin/sh
host=\$1
shift
case \$host in
  10.77.0.1) ns=$a ;;
  10.77.0.2) ns=$b ;;
  *) echo "weft test rsh agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" unshare --uts /bin/sh -c "hostname \$ns; \$*"
EOF
chmod +x "$tmp/agent"
# on_hosts SECONDS SLOTS_PER_HOST NP ARGS...: mpirun in host a over both hosts, ended by timeout.
on_hosts() {
  local limit=$1 slots=$2 np=$3
  shift 3
  timeout "$limit" ip netns exec "$a" unshare --uts /bin/sh -c 'hostname "$0"; exec "$@"' "$a" \
    "$mpirun" --host "10.77.0.1:$slots,10.77.0.2:$slots" -np "$np" --bind-to none \
    --mca plm_rsh_agent "$tmp/agent" --mca btl tcp,self \
    --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
    -x OMP_NUM_THREADS -x WEFT_COLLECTIVE_TIMEOUT "$@"
}
veth_bytes() { ip netns exec "$a" cat /sys/class/net/weft0/statistics/rx_bytes; }

# 1. Parity.
start=$(date +%s)
reference_run "$mnist" "$tmp/one" "${launch[@]}"
mkdir -p "$tmp/two"
before=$(veth_bytes)
on_hosts 60 2 4 "$tmp/rank.sh" "$tmp/two" "$mnist" "${train_args[@]}" \
  --metrics "$tmp/two/metrics.jsonl" --save "$tmp/two/ck" >"$tmp/two/out" 2>&1 ||
  fail "the run across the two hosts failed: $(cat "$tmp/two/out" "$tmp"/two/rank*.out)"
crossed=$(( $(veth_bytes) - before ))
for r in 0 1 2 3; do
  want=$a; [ $r -ge 2 ] && want=$b
  read -r host _ <"$tmp/two/rank$r.where" || fail "rank $r did not say where it ran"
  [ "$host" = "$want" ] || fail "rank $r ran on $host, expected $want"
done
# 10 steps all-gather and reduce-scatter a 536k-parameter model: megabytes between the hosts.
[ "$crossed" -gt 4000000 ] || fail "only $crossed bytes crossed the veth: the ranks did not talk over it"
same_training "2 hosts x 2 ranks" "$tmp/one" "$tmp/two"
echo "parity: 2 hosts x 2 ranks over TCP log the single-host losses ($(training_of "$tmp/two/metrics.jsonl" |
  grep -o '"loss":[^ ]*' | tr '\n' ' ')) and write identical checkpoints; $crossed bytes crossed the veth" \
  "($(($(date +%s) - start)) s)"

# 2. Link cut. Train "forever", cut the veth once a few steps are logged, and wait for every
# rank to end by itself.
mkdir -p "$tmp/cut"
WEFT_COLLECTIVE_TIMEOUT=2 on_hosts 120 1 2 "$tmp/rank.sh" "$tmp/cut" "$mnist" --fsdp --steps 1000000 \
  --log-every 1 --batch-size 64 --threads 1 --metrics "$tmp/cut/metrics.jsonl" >"$tmp/cut/out" 2>&1 &
cut_job=$!
logged() { cat "$tmp/cut/metrics.jsonl" 2>/dev/null | wc -l; }
for _ in $(seq 150); do
  [ "$(logged)" -ge 3 ] && break
  kill -0 "$cut_job" 2>/dev/null || fail "the run to cut ended early: $(cat "$tmp/cut/out" "$tmp"/cut/rank*.out)"
  sleep 0.2
done
[ "$(logged)" -ge 3 ] || fail "the run to cut logged no 3 steps in 30 s"
ranks_left() {  # weft-mnist processes still alive in either host
  for ns in "$a" "$b"; do
    for p in $(ip netns pids "$ns"); do
      [ "$(cat "/proc/$p/comm" 2>/dev/null)" = weft-mnist ] && echo "$ns:$p"
    done
  done
  true
}
cut_at=$(date +%s%N)
ip -n "$a" link set weft0 down
while [ -n "$(ranks_left)" ] && [ $(( $(date +%s%N) - cut_at )) -lt 20000000000 ]; do sleep 0.1; done
ended_ms=$(( ($(date +%s%N) - cut_at) / 1000000 ))
left=$(ranks_left)
[ -z "$left" ] || fail "ranks still running 20 s after the link cut (collective timeout 2 s): $left"
for r in 0 1; do
  grep -q "^\[weft.dist rank $r\] .* did not complete within 2 s" "$tmp/cut/rank$r.out" ||
    fail "rank $r ended without the collective timeout error: $(tail -n 5 "$tmp/cut/rank$r.out")"
done
echo "link cut: both ranks reported the collective timeout and ended ${ended_ms} ms after the cut, e.g."
grep -h "^\[weft.dist rank" "$tmp"/cut/rank*.out | cut -c1-150
# The launcher is another matter: mpirun cannot reach host b's daemon to end the job. Give the
# link back and report whether mpirun ends by itself (informational).
ip -n "$a" link set weft0 up
for _ in $(seq 150); do kill -0 "$cut_job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$cut_job" 2>/dev/null; then
  echo "mpirun: still waiting for host b's daemon 15 s after the link came back (ended by the test)"
else
  rc=0; wait "$cut_job" || rc=$?
  echo "mpirun: ended with exit status $rc once the link came back"
fi
echo "multihost ok"
