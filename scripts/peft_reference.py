#!/usr/bin/env python3
"""Hugging Face peft reference for weft's LoRA adapters (export-peft, train --init-from ADAPTER_DIR).

Run it through scripts/hf_reference.sh (peft-fixture, peft-check), which makes the venv. A
developer tool: never part of meson test or CI (the tests read the committed fixture).

  fixture [--out tests/data/peft/llama]
      A peft LoRA adapter (r 4, alpha 8, dropout 0, target_modules q_proj, v_proj, down_proj,
      random A and B: init_lora_weights False) on tests/data/hf/llama, saved with
      save_pretrained; base_model_name_or_path "../../hf/llama" (relative to the adapter's
      directory). Beside it expected.safetensors: ids [2,17] int64 and logits [2,16,256] f32 of
      PeftModel(ids[:, :-1]).

  check --build BUILD_DIR [--workdir DIR]
      Fine-tunes tests/data/hf/llama with `train --lora-rank 4` (6 steps, --fsdp off), writes its
      adapters with `export-peft`, loads them with PeftModel.from_pretrained on the base and
      compares the prompt's logits with weft's `sample --logits-out` (max |diff| <= 1e-5 max
      |logit|). Exits non-zero on a failure.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = os.path.join(ROOT, "tests", "data", "hf", "llama")
PROMPT = b"Hello, w"


def load_base():
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)


def cmd_fixture(args):
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(5)
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"],
                     init_lora_weights=False, task_type="CAUSAL_LM")
    model = get_peft_model(load_base(), cfg)
    model.eval()
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out)
    os.remove(os.path.join(args.out, "README.md"))  # peft's model card template
    path = os.path.join(args.out, "adapter_config.json")
    with open(path) as f:
        config = json.load(f)
    config["base_model_name_or_path"] = "../../hf/llama"
    with open(path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(0, 256, (2, 17), generator=gen, dtype=torch.int64)
    with torch.no_grad():
        logits = model(ids[:, :-1]).logits.float().contiguous()
    import peft, transformers
    save_file({"ids": ids, "logits": logits}, os.path.join(args.out, "expected.safetensors"),
              metadata={"made_by": "scripts/peft_reference.py fixture", "peft": peft.__version__,
                        "transformers": transformers.__version__, "torch": torch.__version__})
    print(f"wrote {args.out}: adapter_config.json, adapter_model.safetensors, expected.safetensors")
    return 0


def run(argv):
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr[-2000:]}")
    return r


def cmd_check(args):
    from peft import PeftModel
    exe = os.path.join(os.path.abspath(args.build), "apps", "transformer", "weft-transformer")
    work = args.workdir or tempfile.mkdtemp(prefix="peft_check_")
    ck, out, logits_file = (os.path.join(work, n) for n in ("ck", "adapter", "weft_logits.safetensors"))
    run([exe, "train", "--init-from", BASE, "--ctx", "32", "--batch-size", "8", "--steps", "6", "--warmup", "1",
         "--lr", "1e-2", "--seed", "0", "--threads", "1", "--eval-every", "0", "--eval-iters", "2",
         "--lora-rank", "4", "--lora-alpha", "8", "--lora-targets", "q_proj,v_proj,o_proj,down_proj",
         "--checkpoint-dir", ck])
    run([exe, "export-peft", "--from", ck, "--out", out])
    run([exe, "sample", "--from", ck, "--prompt", PROMPT.decode(), "--tokens", "0", "--logits-out", logits_file])
    weft = next(iter(load_file(logits_file).values()))
    model = PeftModel.from_pretrained(load_base(), out)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([list(PROMPT)])).logits[0]
    weft = weft.reshape(logits.shape)
    diff, scale = (logits - weft).abs().max().item(), logits.abs().max().item()
    ok = diff <= 1e-5 * scale
    print(f"{'PASS' if ok else 'FAIL'} export-peft -> PeftModel.from_pretrained: max |peft - weft| {diff:.3g}, "
          f"max |logit| {scale:.3g} (relative {diff / scale:.3g})")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    fx = sub.add_parser("fixture")
    fx.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "peft", "llama"))
    ck = sub.add_parser("check")
    ck.add_argument("--build", required=True)
    ck.add_argument("--workdir")
    args = ap.parse_args()
    return {"fixture": cmd_fixture, "check": cmd_check}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
