#!/usr/bin/env bash
# Writes the tokenizer fixtures under tests/data/tokenizers (scripts/tokenizer_fixtures.py) from
# a venv with tokenizers, sentencepiece, protobuf and transformers (no torch; made on first use
# from PyPI). A developer tool: never part of meson test or CI, which read the committed files.
#   bash scripts/tokenizer_fixtures.sh [--only NAME...] [--mistral PATH/tokenizer.model] [--out DIR]
# Environment: TOKENIZER_VENV (default /tmp/tokenv).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${TOKENIZER_VENV:-/tmp/tokenv}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import tokenizers, sentencepiece, transformers' 2>/dev/null; then
  echo "tokenizer_fixtures.sh: setting up the venv $venv" >&2
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet tokenizers==0.23.3 sentencepiece protobuf transformers==5.24.0 >&2
fi
exec "$venv/bin/python" "$here/tokenizer_fixtures.py" "$@"
