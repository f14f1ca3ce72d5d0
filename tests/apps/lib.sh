# Sourced by the app test scripts: a scratch directory removed on exit, and fail().
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
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
  idx_head "$src"/t10k-images-idx3-ubyte* "$d/t10k-images-idx3-ubyte" "$1" 16 $((28 * 28))
  idx_head "$src"/t10k-labels-idx1-ubyte* "$d/t10k-labels-idx1-ubyte" "$1" 8 1
  echo "$d"
}
# idx_head IN OUT N HEADER_BYTES RECORD_BYTES: the first N records of the IDX file IN (gzip'd or
# not) written to OUT, the count in its header (bytes 4-7, big-endian) made N.
idx_head() {
  local count
  count=$(printf '\\x%02x' $(($3 >> 24 & 255)) $(($3 >> 16 & 255)) $(($3 >> 8 & 255)) $(($3 & 255)))
  head -c $(($4 + $3 * $5)) < <(zcat -f "$1") >"$2.part"
  [ "$(stat -c %s "$2.part")" = $(($4 + $3 * $5)) ] || fail "idx_head: $1 holds fewer than $3 records" >&2
  { head -c 4 "$2.part"; printf "$count"; tail -c +9 "$2.part"; } >"$2"
  rm -f "$2.part"
}
