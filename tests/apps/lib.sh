# Sourced by the app test scripts: a scratch directory removed on exit, and fail().
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
