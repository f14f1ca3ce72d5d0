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
