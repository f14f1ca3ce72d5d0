# Sourced by the app test scripts: a scratch directory removed on exit, and fail().
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# expect_error TEXT ARGS...: "$exe" ARGS fails and its stderr contains TEXT; else fail.
expect_error() {
  local text=$1; shift
  if "$exe" "$@" >/dev/null 2>"$tmp/err"; then fail "accepted: $*"; fi
  grep -qF -- "$text" "$tmp/err" || fail "\"$*\" failed without \"$text\": $(cat "$tmp/err")"
}
# The training loss logged at step $2 in the JSONL metrics file $1 (empty if there is none).
loss_at() { grep "\"step\":$2[,}]" "$1" | grep -v '"split"' | grep -o '"loss":[^,}]*' | cut -d: -f2 || true; }
# within GOT WANT RTOL ATOL WHAT: |GOT - WANT| <= RTOL |WANT| + ATOL, GOT not empty; else fail.
within() {
  awk -v a="$1" -v b="$2" -v r="$3" -v t="$4" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b
                                                       exit !(a != "" && d <= r * m + t) }' || fail "$5: got $1, expected $2"
}
# differs GOT WANT RTOL WHAT: |GOT - WANT| > RTOL |WANT| (a change the test must be able to see); else fail.
differs() {
  awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b
                                             exit !(a != "" && d > r * m) }' || fail "$4: got $1, the same as $2"
}
# mnist_small N: prints a directory holding the Fashion-MNIST training files and the first N test
# images and labels. weft-mnist evaluates on the whole test set after every run (seconds, a minute
# for the CNN under a sanitizer); runs that do not check the accuracy it reaches evaluate on these.
mnist_small() {
  local src=/usr/share/datasets/fashion-mnist d=$tmp/mnist_small
  mkdir -p "$d"
  ln -sf "$src"/train-images-idx3-ubyte* "$src"/train-labels-idx1-ubyte* "$d"/
  idx_head "$src"/t10k-images-idx3-ubyte* "$d/t10k-images-idx3-ubyte" "$1"
  idx_head "$src"/t10k-labels-idx1-ubyte* "$d/t10k-labels-idx1-ubyte" "$1"
  echo "$d"
}
# idx_head IN OUT N: the first N records of the IDX file of bytes IN (gzip'd or not) written to
# OUT, the count in its header (its first dimension, bytes 4-7, big-endian) made N. A record is
# the product of the other dimensions, read from the header.
idx_head() {
  local h count bytes rec=1 i
  h=($(head -c 40 < <(zcat -f "$1") | od -An -v -tu1))
  [ "${#h[@]}" -ge 8 ] && [ "${h[2]}" = 8 ] && [ $((4 + 4 * h[3])) -le "${#h[@]}" ] ||
    fail "idx_head: $1 is not an IDX file of unsigned bytes" >&2
  for ((i = 2; i <= h[3]; ++i)); do
    rec=$((rec * (h[4 * i] << 24 | h[4 * i + 1] << 16 | h[4 * i + 2] << 8 | h[4 * i + 3])))
  done
  bytes=$((4 + 4 * h[3] + $3 * rec))
  count=$(printf '\\x%02x' $(($3 >> 24 & 255)) $(($3 >> 16 & 255)) $(($3 >> 8 & 255)) $(($3 & 255)))
  head -c "$bytes" < <(zcat -f "$1") >"$2.part"
  [ "$(stat -c %s "$2.part")" = "$bytes" ] || fail "idx_head: $1 holds fewer than $3 records" >&2
  { head -c 4 "$2.part"; printf "$count"; tail -c +9 "$2.part"; } >"$2"
  rm -f "$2.part"
}
# at_peak FLAGS...: "$tf" train FLAGS under a --memory-budget and WEFT_MEMORY_LIMIT of exactly its plan's predicted
# peak, which the run must reach (+0.00 %): a plan too low runs out of memory, one too high reports a lower peak.
peak_of() { "$tf" train "$@" --plan | sed -n 's/.*predicted peak *[0-9.]* MiB *\([0-9]*\).*/\1/p'; }
at_peak() {
  local p
  p=$(peak_of "$@")
  [ -n "$p" ] || fail "no plan for $*"
  WEFT_MEMORY_LIMIT=$p "$tf" train "$@" --memory-budget "$p" >/dev/null 2>"$tmp/err" ||
    fail "a budget and limit of the plan's peak ($p bytes) ran out: $*: $(cat "$tmp/err")"
  grep -q "the plan predicted $p bytes (+0.00 %)" "$tmp/err" ||
    fail "the peak is not the plan's: $*: $(grep 'peak memory' "$tmp/err")"
}
