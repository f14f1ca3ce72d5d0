#!/usr/bin/env bash
# Hugging Face interop reference: runs scripts/hf_reference.py (PyTorch + transformers) in a venv.
#   fixtures  writes the small committed fixtures under tests/data/hf/ (a tiny GPT-2 with tied
#             embeddings as one model.safetensors, a tiny Llama with GQA sharded into several
#             files + model.safetensors.index.json, and each one's expected.safetensors:
#             logits, loss, the loss after one AdamW step, greedy ids), deterministically.
#   check     trains tiny gpt2/llama models with weft-transformer (and fine-tunes the llama3, mistral,
#             qwen2 and qwen3 fixtures with --init-from), exports them with export-hf,
#             loads the exports with transformers' AutoModelForCausalLM and compares prompt
#             logits and 32 greedy tokens against weft's `sample`; prints a PASS/FAIL table and
#             exits non-zero on any failure.
# This is a developer tool: it is never part of meson test or CI (Python never enters the build
# or the tests; the tests only read the committed fixtures).
#   bash scripts/hf_reference.sh fixtures                 # [--out tests/data/hf]
#   bash scripts/hf_reference.sh check --build build      # [--workdir DIR]
#   bash scripts/hf_reference.sh peft-fixture             # tests/data/peft/llama (scripts/peft_reference.py)
#   bash scripts/hf_reference.sh peft-check --build build # export-peft loaded by peft's PeftModel
#   bash scripts/hf_reference.sh chat-fixture             # tests/data/chat (scripts/chat_reference.py)
#   bash scripts/hf_reference.sh chat-templates           # tests/data/chat/qwen3 and templates.json only
#   bash scripts/hf_reference.sh optim-fixture            # tests/test_nn_optim.cpp's expected parameters
# Environment: HF_VENV (default /tmp/hfenv): the venv, made on first use with
#   pip install torch transformers tokenizers safetensors numpy peft   (from PyPI; several GB)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${HF_VENV:-/tmp/hfenv}"
pkgs=(torch transformers tokenizers safetensors numpy peft)

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch, transformers, safetensors, numpy, peft' 2>/dev/null; then
  echo "hf_reference.sh: setting up the venv $venv (pip install ${pkgs[*]}; a few GB, takes a while)" >&2
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip >&2 || true
  "$venv/bin/python" -m pip install "${pkgs[@]}" >&2
fi

case "${1:-}" in
  chat-*) cmd=${1#chat-}; shift; exec "$venv/bin/python" "$here/chat_reference.py" "$cmd" "$@" ;;
  peft-*) cmd=${1#peft-}; shift; exec "$venv/bin/python" "$here/peft_reference.py" "$cmd" "$@" ;;
  optim-fixture) exec "$venv/bin/python" "$here/optim_reference.py" ;;
esac
exec "$venv/bin/python" "$here/hf_reference.py" "$@"
