#!/usr/bin/env bash
# GPT-2's tokenizer.json with the `tokenizers` library: runs scripts/gpt2_tokenizer.py in a venv.
#   fixture   writes tests/data/gpt2/expected.json (the library's ids and decodings of the test
#             texts) beside tests/data/gpt2/tokenizer.json; --from-gpt2 ENCODER_JSON VOCAB_BPE
#             first rewrites the tokenizer.json from GPT-2's released files.
#   bench     encodes a text folder as `weft-transformer prepare` does and prints MB/s;
#             --compare DIR checks a prepared dataset id for id.
# A developer tool: never part of meson test or CI (the tests only read the committed fixture).
#   bash scripts/gpt2_tokenizer.sh fixture
#   RAYON_NUM_THREADS=1 /usr/bin/time -v bash scripts/gpt2_tokenizer.sh bench --data /usr/share/games/fortunes
# Environment: TOKENIZERS_VENV (default /tmp/tokenizers-venv): the venv, made on first use with
#   pip install tokenizers   (from PyPI)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${TOKENIZERS_VENV:-/tmp/tokenizers-venv}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import tokenizers' 2>/dev/null; then
  echo "gpt2_tokenizer.sh: setting up the venv $venv (pip install tokenizers)" >&2
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet tokenizers >&2
fi
exec "$venv/bin/python" "$here/gpt2_tokenizer.py" "$@"
