#!/usr/bin/env bash
# The mutation pass over FSDP's controls: each mutation turns one control into a no-op (a sed
# on one library file), rebuilds, runs the suites that should notice, restores the file, and
# the table at the end says which test killed it, or SURVIVED. A control no test notices is a
# control the suites do not check. A developer tool (minutes per mutation), not part of
# `meson test`; see docs/TESTING.md.
#
#   scripts/mutation_pass.sh [BUILD_DIR]          # every mutation, its own suites
#   ALL_FSDP=1 scripts/mutation_pass.sh           # every mutation, every fsdp suite at 1/2/4 ranks
#   ONLY=output_dtype scripts/mutation_pass.sh    # the mutations whose name matches
#
# The mutated files must have no uncommitted changes (each is restored with git checkout).
# Each mutation's build and test logs are kept in BUILD_DIR/mutation-logs/.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:-$root/build}")
cd "$root"
jobs=${JOBS:-2}

# name | file | sed script making the control a no-op | suites (meson test names) | ninja targets
mutations=(
  "set_requires_all_reduce|fsdp/fully_shard.cpp|s/if (s->group) s->group->requires_all_reduce = a;/(void)a;/|fsdp_controls_np2 fsdp_controls_np4|tests/dist_tests"
  "partial_reduce_output|fsdp/param_group.cpp|s/post.partial_only = !requires_all_reduce;/post.partial_only = false;/|fsdp_controls_np2 fsdp_controls_np4|tests/dist_tests"
  "set_reshard_after_forward|fsdp/fully_shard.cpp|s/s->reshard_after_forward_ = r;/(void)r;/|fsdp_controls_np1 fsdp_controls_np2 fsdp_controls_np4|tests/dist_tests"
  "set_reshard_after_backward|fsdp/fully_shard.cpp|s/s->reshard_after_backward_ = r;/(void)r;/|fsdp_controls_np1 fsdp_controls_np2 fsdp_controls_np4|tests/dist_tests"
  "set_requires_gradient_sync|fsdp/fully_shard.cpp|s/s->requires_gradient_sync_ = sync;/(void)sync;/|fsdp_controls_np1 fsdp_controls_np2 fsdp_controls_np4|tests/dist_tests"
  "set_unshard_in_backward|fsdp/fully_shard.cpp|s/{ state_->unshard_in_backward_ = u; }/{ (void)u; }/|fsdp_controls_np1 fsdp_controls_np2 fsdp_controls_np4|tests/dist_tests"
  "output_dtype|fsdp/state.cpp|s/^  if (mp_.output_dtype)$/  if (false)/|fsdp_controls_np1 fsdp_controls_np2 fsdp_controls_np4|tests/dist_tests"
  "fingerprint_accepts_all|dist/mpi_backend.cpp|s/if (fingerprint_\[0\] != mine .*{$/if (false) {/|fsdp_controls_np2 fsdp_controls_np4|tests/dist_tests"
  "compare_calls_accepts_all|dist/collective_check.cpp|s/^  if (first_bad < 0) return;/  return;/|fsdp_controls_np2 fsdp_controls_np4|tests/dist_tests"
  "summon_offload_to_cpu|fsdp/summon_full_params.cpp|s/opts_.offload_to_cpu \&\& /false \&\& /|fsdp_controls_np1 fsdp_controls_np2 fsdp_controls_np4 fsdp_cuda_np1|tests/dist_tests tests/test_fsdp_cuda"
  "forward_prefetch|fsdp/state.cpp|s/      next->group->start_unshard();/      (void)next;/|trace fsdp_controls_np2|apps/simple/weft-simple tests/dist_tests"
  "backward_prefetch|fsdp/state.cpp|s/if (\*prev->reshard_after_forward_ \&\& prev->unshard_in_backward_) prev->group->start_unshard();/(void)prev;/|trace fsdp_controls_np2|apps/simple/weft-simple tests/dist_tests"
  "replaced_parameter_note|fsdp/fully_shard.cpp|s/e.slots\[0\]->autograd_meta().attach(nn::replaced_parameter,/(void)(nn::replaced_parameter,/|fsdp_controls_np1 fsdp_controls_np2|tests/dist_tests"
  "checkpoint_keep_best|fsdp/checkpoint_dir.cpp|s/path != final_dir \&\& path != best \&\& /path != final_dir \&\& /|fsdp_checkpoint_np1 fsdp_checkpoint_np2|tests/dist_tests"
  "checkpoint_keep_also|fsdp/checkpoint_dir.cpp|s/!(!keep_also.empty() \&\& fs::equivalent(path, keep_also, ec))/true/|fsdp_checkpoint_np1 fsdp_checkpoint_np2|tests/dist_tests"
  "checkpoint_load_finite|fsdp/checkpoint.cpp|s/if (auto bad = find_nonfinite(value))/if (auto bad = std::optional<FoundElement>())/|fsdp_checkpoint_np1 fsdp_checkpoint_np2|tests/dist_tests"
  "optimizer_check_state|nn/optimizer.cpp|s/if (auto bad = find_element(value, \[\](double v) { return v < 0; }))/if (auto bad = std::optional<FoundElement>())/|fsdp_checkpoint_np1 nn_optim|tests/dist_tests tests/unit_tests"
  "checkpoint_unlisted|fsdp/checkpoint_pieces.cpp|s/WEFT_CHECK(listed.count(e.name)/WEFT_CHECK(true or listed.count(e.name)/|fsdp_checkpoint_np1 fsdp_checkpoint_np2|tests/dist_tests"
  "checkpoint_dir_lock|fsdp/checkpoint_dir.cpp|s/if (::flock(fd_, LOCK_EX . LOCK_NB) != 0) {/if (false) {/|fsdp_checkpoint_np1|tests/dist_tests"
  "checkpoint_leftovers_at_claim|fsdp/checkpoint_dir.cpp|s/^  remove_stale_temporaries(dir, std::numeric_limits<int64_t>::max());//|fsdp_checkpoint_np1|tests/dist_tests"
  "checkpoint_verify_finite|fsdp/checkpoint_verify.cpp|s/if (auto bad = find_nonfinite(source.read(s.file, e)))/if (auto bad = std::optional<FoundElement>())/|fsdp_checkpoint_np1|tests/dist_tests"
  "checkpoint_loss_recorded|fsdp/checkpoint_index.cpp|s/if (const auto. l = ix.training.loss) j/if (const auto\& l = std::optional<double>()) j/|fsdp_checkpoint_np1|tests/dist_tests"
)

# ALL_FSDP: every mutation also runs every fsdp suite (the CUDA one skips without a GPU).
extra_suites="" extra_targets=""
if [ -n "${ALL_FSDP:-}" ]; then
  extra_suites=$(meson test -C "$build" --list 2>/dev/null | grep -o 'fsdp_[a-z_]*_np[0-9]' | sort -u | tr '\n' ' ')
  extra_targets="tests/dist_tests tests/apps_dist_tests tests/test_fsdp_cuda"
fi
logs="$build/mutation-logs"
mkdir -p "$logs"

restore() { [ -n "${current:-}" ] && git checkout -q -- "$current"; current=""; }
trap restore EXIT INT TERM

# The Catch2 test cases that failed in the log $1 (ranks' output interleaves, so each
# "file:line: FAILED" is mapped to the TEST_CASE above that line in the source), and the first
# "FAIL:" line of the app scripts.
failed_cases() {
  sed 's/\x1b\[[0-9;]*m//g' "$1" | grep -ao '[^ ]*tests/[a-z_]*\.cpp:[0-9]*: FAILED' | sort -u |
    while IFS=: read -r src line _; do
      (cd "$build" && awk -v at="$line" 'NR <= at && /^TEST_CASE\(/ { name = $0 } END { print name }' "$src" 2>/dev/null)
    done | sed -E 's/^TEST_CASE\("([^"]*)".*/"\1"/' | sort -u
  grep -a -m1 '^FAIL: ' "$1" || true
}

rows=()
for m in "${mutations[@]}"; do
  IFS='|' read -r name file script suites targets <<<"$m"
  if [ -n "${ONLY:-}" ] && [[ "$name" != *"$ONLY"* ]]; then continue; fi
  if ! git diff --quiet -- "$file"; then
    echo "mutation_pass: $file has uncommitted changes; commit or stash them first" >&2
    exit 2
  fi
  current=$file
  sed -i "$script" "$file"
  if git diff --quiet -- "$file"; then
    rows+=("$name|$file|NOT APPLIED (the sed matched nothing: update the script)")
    restore
    continue
  fi
  echo "=== $name: $(git diff -U0 -- "$file" | grep '^[-+][^-+]' | head -2 | tr '\n' ' ')"
  if ! nice -n 10 ninja -C "$build" -j"$jobs" $targets $extra_targets >"$logs/$name.build.log" 2>&1; then
    rows+=("$name|$file|killed by the build")
    restore
    continue
  fi
  run_suites=$(echo $suites $extra_suites | tr ' ' '\n' | awk '!seen[$0]++' | tr '\n' ' ')
  # shellcheck disable=SC2086
  meson test -C "$build" --no-rebuild $run_suites >"$logs/$name.test.log" 2>&1
  cp "$build/meson-logs/testlog.txt" "$logs/$name.testlog.txt"
  killed=$(grep -E '^ *[0-9]+/[0-9]+ .* (FAIL|TIMEOUT) ' "$logs/$name.test.log" | sed -E 's/.* ([a-z0-9_]+) +(FAIL|TIMEOUT) .*/\1/' | tr '\n' ' ')
  if [ -n "$killed" ]; then
    cases=$(failed_cases "$logs/$name.testlog.txt" | tr '\n' ';' | sed 's/;$//; s/;/; /g')
    rows+=("$name|$file|killed by ${killed% }${cases:+ (test: $cases)}")
  else
    rows+=("$name|$file|SURVIVED ($(echo $run_suites | wc -w) suites)")
  fi
  restore
done

echo
echo "| mutation (made a no-op) | file | result |"
echo "|---|---|---|"
for r in "${rows[@]}"; do
  IFS='|' read -r name file result <<<"$r"
  echo "| $name | $file | $result |"
done
