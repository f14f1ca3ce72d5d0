#!/usr/bin/env bash
# Sanitizer builds of weft's tests, each in its own build directory (docs/TESTING.md):
#   asan  build-asan: AddressSanitizer + UndefinedBehaviorSanitizer, UBSan fatal
#         (-fno-sanitize-recover=all); the libraries and the test programs that exercise them
#         (every suite but "programs", the apps end to end, and "fuzz": the libFuzzer runs are
#         ASan+UBSan programs of their own, which tests/fuzz/run_fuzz.sh builds; the normal suite
#         runs both).
#   tsan  build-tsan: ThreadSanitizer; the dist and fsdp suites (MPI's communication thread,
#         async collectives, FSDP's hooks and prefetching) at 1 and 2 ranks, with one
#         OpenMP thread (OMP_NUM_THREADS=1, as always for them): the OpenMP runtime is not built with TSan,
#         so with more threads its barriers would be invisible to it and every parallel region
#         would be reported as a race.
# Every report fails the run, except the named suppressions of OpenMPI's own reports in
# scripts/sanitizers/ (lsan.supp, tsan.supp). ASan's and TSan's reports go to files (log_path),
# so a report from a process whose exit status a test script does not look at still fails the
# run; they are printed at the end. UBSan's halt the process with exit status 1 (and go to the
# same files in a clang build, to its stderr in a g++ one).
# Usage: scripts/sanitize.sh [--build-only] [asan] [tsan]   (both when none is named)
# --build-only configures and builds the named builds and runs nothing (.ci/run builds them
# this way, at low priority, while the normal suite runs).
# Extra meson test arguments can be given after "--", e.g. sanitize.sh asan -- core_tensor.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
kinds=()
build_only=0
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  case "$1" in
    asan|tsan) kinds+=("$1") ;;
    --build-only) build_only=1 ;;
    *) echo "sanitize.sh: unknown argument '$1' (--build-only, asan, tsan, -- meson test arguments)" >&2; exit 2 ;;
  esac
  shift
done
[ "${1:-}" = -- ] && shift
[ ${#kinds[@]} -gt 0 ] || kinds=(asan tsan)
jobs=$(nproc)

# The sanitizer builds are compiled by clang (scripts/deps.sh installs it for the fuzz targets),
# which compiled their instrumented files in two thirds of g++'s time (docs/TESTING.md); g++ when
# there is no clang++. Clang links the sanitizer runtimes into the programs only, so the shared
# libraries are linked with undefined symbols allowed (-Db_lundef=false; README command 2's build
# still links each layer with --no-undefined).
cxx=$(command -v clang++ || echo g++)
# configure DIR MESON_OPTIONS...: once, like scripts/build.sh. Unoptimised (-O0: the instrumented
# -O1 compile took 1.6 times as long) but for core, the CPU kernels and fsdp, which keep -O1 so
# that the suites run in minutes (root meson.build, hot_opt); with line tables (-g1) so reports
# name files and lines. A unity build (meson
# compiles each library in blocks of four of its files): the headers are parsed once per block,
# which took a quarter of the ASan build's CPU time and a third of the TSan build's. So names
# local to a file (anonymous namespace, static) must not repeat within a library: a clash is a
# "redefinition" error here, not in the normal build, which compiles each file alone.
configure() {
  local dir=$1; shift
  [ -f "$dir/build.ninja" ] && return 0
  mkdir -p "$dir"
  CXX=$cxx meson setup "$dir" -Dcuda=disabled -Doptimization=0 -Ddebug=false -Dunity=on -Dunity_size=4 -Db_lundef=false \
    "$@" >"$dir/setup.log" 2>&1 ||
    { cat "$dir/setup.log"; echo "sanitize.sh: meson setup $dir failed"; return 1; }
}

# report DIR: prints the sanitizer reports the run left in DIR/sanitizer-reports; fails if any.
report() {
  local reports=$1/sanitizer-reports files
  files=$(find "$reports" -type f 2>/dev/null | sort)
  [ -z "$files" ] && return 0
  echo "sanitize.sh: $(echo "$files" | wc -l) sanitizer report(s) in $reports:"
  for f in $files; do echo "==== $f"; head -c 20000 "$f"; done
  return 1
}

run_asan() {
  local dir=build-asan status=0 targets
  # -Dnative=false: with -march=native on an AVX-512 host GCC zeroes stack structs with aligned
  # 64-byte stores, and ASan's detect_stack_use_after_return frames are not 64-byte aligned
  # (a SIGSEGV in the compiler's store, not in weft's code).
  # -Dbenchmarks=false: the benchmark programs are left out. Only the test programs are built
  # (and with them the libraries and the apps' libraries they link): the apps themselves run
  # end to end in the normal suite (suite "programs"), and their code is the libraries' code.
  configure "$dir" -Db_sanitize=address,undefined -Dnative=false -Dbenchmarks=false \
    -Dcpp_args='-g1 -fno-omit-frame-pointer -fno-sanitize-recover=all' || return 1
  rm -f "$dir/meson-logs/testlog.json"  # .ci/run counts this run's results only
  targets=$(ninja -C "$dir" -t targets all | grep -oE '^tests/[a-z0-9_]+:' | tr -d : | grep -v '^tests/bad_api$')
  [ -n "$targets" ] || { echo "sanitize.sh: no test programs in $dir"; return 1; }
  echo "sanitize.sh: building $dir (ASan + UBSan): the test programs"
  # shellcheck disable=SC2086
  ninja -C "$dir" -j "$jobs" $targets >"$dir/build.log" 2>&1 || { tail -n 50 "$dir/build.log"; echo "sanitize.sh: $dir failed to build"; return 1; }
  [ "$build_only" = 1 ] && return 0
  rm -rf "$dir/sanitizer-reports" && mkdir -p "$dir/sanitizer-reports"
  echo "sanitize.sh: not run under ASan: the programs suite (weft-mnist, weft-transformer and the other apps end to end,"
  echo "  install, bad_input): the normal suite runs them; the libraries they call run under ASan in the other suites"
  echo "sanitize.sh: not run under ASan: the fuzz suite (clang-built ASan+UBSan programs of their own; the normal suite runs them)"
  # 4 ranks reach code that 1, 2 and 3 do not in three suites only: HSDP's 2 x 2 mesh
  # (fsdp_features), the 2-D mesh's groups (dist_mesh) and resharding between 4 and 2 ranks
  # (fsdp_checkpoint); the others' 4-rank runs repeat their 2-rank runs' code with other numbers,
  # at twice the cost (the normal suite runs them all).
  local skip4='dist_collectives|dist_agree|fsdp_parity|fsdp_semantics|fsdp_memory|fsdp_controls|fsdp_deferred|fsdp_plan|apps_hf|tp_parallel'
  local names=()
  [ $# -gt 0 ] || mapfile -t names < <(meson test -C "$dir" --list --no-rebuild --no-suite fuzz --no-suite launch \
    --no-suite programs 2>/dev/null | sed 's|^.* / ||' | grep -vE "^($skip4)_np4\$")
  echo "sanitize.sh: not run under ASan: the 4-rank runs of ${skip4//|/, } (their 2-rank runs are)"
  echo "sanitize.sh: not run under ASan: the launch suite (multihost, slurm): their ranks are started by orted over network"
  echo "  namespaces or by srun, which do not pass ASan's settings on as mpirun does here (mca_base_env_list cannot be mixed"
  echo "  with their -x, and srun's ranks would check OpenMPI's leaks); the same weft code runs under ASan in the mpirun suites"
  # The tests' processes inherit these, the ranks mpirun starts included (OpenMPI passes its
  # environment on to the ranks it starts on this host).
  local reports=$root/$dir/sanitizer-reports
  local asan="log_path=$reports/asan:strict_init_order=1:detect_stack_use_after_return=1"
  # Leaks are checked in every process but the ranks mpirun starts. Each of those leaks a block
  # that a thread of OpenMPI's runtime allocates in libevent_core's event_base_loop, from a
  # plugin that MPI_Finalize unloads: LeakSanitizer cannot name it (<unknown module>), no
  # suppression can match it with the fast unwinder, and the slow one makes these runs 12 times
  # slower. The same suites run alone (one rank, MPI's singleton start) with leak checking on;
  # dist/dist.cpp has LeakSanitizer ignore what MPI_Init_thread and MPI_Finalize allocate.
  # mca_base_env_list: the environment OpenMPI gives the ranks it starts.
  # WEFT_SANITIZER: tests/apps/mnist_cli.sh skips its one-epoch accuracy check (saying so).
  WEFT_SANITIZER="ASan+UBSan" ASAN_OPTIONS="$asan:detect_leaks=1" OMPI_MCA_mca_base_env_list="ASAN_OPTIONS=$asan:detect_leaks=0" \
  LSAN_OPTIONS="suppressions=$root/scripts/sanitizers/lsan.supp:print_suppressions=0" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    meson test -C "$dir" --no-rebuild --print-errorlogs --no-suite fuzz --no-suite launch --no-suite programs \
      "${names[@]}" "$@" ||
    status=1
  report "$dir" || status=1
  return $status
}

run_tsan() {
  local dir=build-tsan status=0 targets
  configure "$dir" -Db_sanitize=thread -Dcpp_args='-g1' || return 1
  rm -f "$dir/meson-logs/testlog.json"
  # Only what the dist and fsdp suites run: the libraries and their test programs, but not
  # apps_dist_tests, which links the transformer app's libraries (fsdp_deferred: deferred
  # initialisation; fsdp_plan: the memory planner's figures): their threads are the hooks and
  # prefetches of the other fsdp suites, and the app's libraries would be 90 more
  # compile-seconds here. ASan runs them.
  targets=$(ninja -C "$dir" -t targets all | grep -oE '^tests/(dist_tests|test_(dist|fsdp)_[a-z0-9_]+|dist_fault|dist_fault_stuck_abort):' |
            tr -d :)
  [ -n "$targets" ] || { echo "sanitize.sh: no dist or fsdp test programs in $dir"; return 1; }
  echo "sanitize.sh: building $dir (TSan):" $targets
  # shellcheck disable=SC2086
  ninja -C "$dir" -j "$jobs" $targets >"$dir/build.log" 2>&1 || { tail -n 50 "$dir/build.log"; echo "sanitize.sh: $dir failed to build"; return 1; }
  [ "$build_only" = 1 ] && return 0
  rm -rf "$dir/sanitizer-reports" && mkdir -p "$dir/sanitizer-reports"
  local tests=("$@")
  if [ ${#tests[@]} -eq 0 ]; then
    # Each rank runs the same threads at 2 ranks as at 4; 4 ranks on 2 cores under TSan take
    # minutes more. The normal and ASan runs keep them.
    mapfile -t tests < <(meson test -C "$dir" --list --no-rebuild --suite dist --suite fsdp | sed 's|^.* / ||' |
                         grep -vE '_np4$|^fsdp_(deferred|plan)_')
    [ ${#tests[@]} -gt 0 ] || { echo "sanitize.sh: no dist or fsdp tests in $dir"; return 1; }
    echo "sanitize.sh: not run under TSan: the 4-rank runs (*_np4): their ranks run the threads of the 2-rank runs"
    echo "sanitize.sh: not run under TSan: fsdp_deferred and fsdp_plan (the threads of the other fsdp suites; ASan runs them)"
  fi
  WEFT_SANITIZER=TSan TSAN_OPTIONS="log_path=$root/$dir/sanitizer-reports/tsan:suppressions=$root/scripts/sanitizers/tsan.supp:second_deadlock_stack=1" \
    meson test -C "$dir" --no-rebuild --print-errorlogs "${tests[@]}" || status=1
  report "$dir" || status=1
  return $status
}

status=0
for k in "${kinds[@]}"; do
  start=$SECONDS
  "run_$k" "$@" || status=1
  echo "sanitize.sh: $k$([ "$build_only" = 1 ] && echo " build") took $((SECONDS - start)) s"
done
exit $status
