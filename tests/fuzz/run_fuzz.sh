#!/usr/bin/env bash
# Builds one of weft's libFuzzer targets (tests/fuzz/fuzz_TARGET.cpp) with clang's libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer — the parser under test compiled from source
# with coverage, the rest of weft from the build's shared libraries — writes its seed corpus
# and runs it for a fixed number of inputs. Exits 77 (meson: SKIP) with the reason when
# clang++ or its fuzzer runtime is missing (Debian: clang, libclang-rt-14-dev; scripts/deps.sh
# installs both).
# Usage: run_fuzz.sh TARGET SOURCE_ROOT BUILD_ROOT [RUNS]
#   TARGET: safetensors (core/safetensors.cpp), checkpoint_index (fsdp/checkpoint_index.cpp),
#           idx (apps/mnist/idx.cpp) or tokenizer (apps/transformer/bpe_tokenizer.cpp)
# By hand, for longer: bash tests/fuzz/run_fuzz.sh idx . build 1000000, or run the built
# build/tests/fuzz/fuzz_idx with libFuzzer's own flags on build/tests/fuzz/corpus_idx.
set -euo pipefail
target=$1
src=$(cd "$2" && pwd)
build=$(cd "$3" && pwd)
runs=${4:-2000}
case "$target" in
  safetensors)      sources=(core/safetensors.cpp);      libs=(-lweft-core) ;;
  checkpoint_index) sources=(fsdp/checkpoint_index.cpp); libs=(-lweft-fsdp -lweft-dist -lweft-nn -lweft-core) ;;
  idx)              sources=(apps/mnist/idx.cpp);        libs=(-lweft-core -lz) ;;
  tokenizer)        sources=(apps/transformer/bpe_tokenizer.cpp apps/transformer/tokenizer_decoder.cpp apps/transformer/tokenizer_normalizer.cpp apps/transformer/file_contents.cpp); libs=(-lweft-core -lpcre2-8 -licuuc) ;;
  *) echo "run_fuzz.sh: unknown target '$target' (safetensors, checkpoint_index, idx or tokenizer)" >&2; exit 2 ;;
esac
for lib in "${libs[@]}"; do
  [[ "$lib" != -lweft-* ]] || [ -e "$build/lib${lib#-l}.so" ] || { echo "run_fuzz.sh: $build/lib${lib#-l}.so is not built" >&2; exit 2; }
done
clang=$(command -v clang++ || command -v clang++-14 || true)
[ -n "$clang" ] || { echo "SKIP: clang++ is not installed (Debian: clang, libclang-rt-14-dev; scripts/deps.sh)"; exit 77; }
out="$build/tests/fuzz"
corpus="$out/corpus_$target"
rm -rf "$corpus" && mkdir -p "$corpus"  # the seeds only: each run starts from the same inputs
# Does this clang link a fuzzer at all (the runtime ships in libclang-rt-<v>-dev)?
# (Every file this script writes is named for its target: the four fuzz tests run two at a time.)
probe="$out/probe_$target"
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' >"$probe.cpp"
if ! "$clang" -fsanitize=fuzzer "$probe.cpp" -o "$probe" 2>"$probe.err"; then
  echo "SKIP: $clang cannot link -fsanitize=fuzzer (Debian: libclang-rt-14-dev): $(head -c 300 "$probe.err")"
  exit 77
fi
mpi_flags=$(pkg-config --cflags ompi 2>/dev/null || echo "-I/usr/lib/x86_64-linux-gnu/openmpi/include")
# UBSan's checks are fatal (-fno-sanitize-recover), so undefined behaviour is a crash the run reports.
# shellcheck disable=SC2086
"$clang" -std=c++20 -O1 -gline-tables-only -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DOMPI_SKIP_MPICXX=1 \
  -I"$src" -I"$build" $mpi_flags "$src/tests/fuzz/fuzz_$target.cpp" "${sources[@]/#/$src/}" \
  -L"$build" "${libs[@]}" -Wl,-rpath,"$build" -lfmt -o "$out/fuzz_$target"

# Seed corpora, written here rather than kept as binary files.
le64() {  # the 8-byte little-endian length safetensors puts before its header
  printf "$(printf '\\x%02x\\x%02x\\x00\\x00\\x00\\x00\\x00\\x00' $(($1 & 255)) $(($1 >> 8)))"
}
st_seed() {  # st_seed NAME HEADER_JSON DATA_ESCAPES
  { le64 ${#2}; printf '%s' "$2"; printf "$3"; } >"$corpus/$1"
}
be32() { printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) $(($1 >> 8 & 255)) $(($1 & 255)))"; }
idx_seed() {  # idx_seed NAME FORM(0 plain, 1 gzip) DIMS... : an IDX file of u8 counting up
  local name=$1 form=$2 n=1 d; shift 2
  { printf "$(printf '\\x%02x' "$form")"; printf '\x00\x00\x08'; printf "$(printf '\\x%02x' $#)"
    for d in "$@"; do be32 "$d"; n=$((n * d)); done
    head -c "$n" /dev/zero | tr '\0' '\7'; } >"$corpus/$name"
}
fuzz_flags=()
case "$target" in
  safetensors)
    st_seed valid '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[1,2],"data_offsets":[8,10]}}' \
      '\x00\x00\x80\x3f\x00\x00\x00\x40\x01\x02'
    st_seed empty '{}' ''
    st_seed meta '{"__metadata__":{"format":"pt"},"x":{"dtype":"BOOL","shape":[],"data_offsets":[0,1]}}' '\x01' ;;
  checkpoint_index)
    # A two-shard index as save_checkpoint writes it, a replicated-only one, and a bare minimum.
    cat >"$corpus/two_shards" <<'JSON'
{"format":"weft-checkpoint","format_version":2,"weft_version":"0.1.0","step":3,"world_size":2,"num_shards":2,
 "mesh":{"shape":[2],"dim_names":["shard"]},"data":{"epoch":1,"batch":7},"app":{"format":"mnist","model":"mlp"},
 "aliases":{"lm_head.weight":"wte.weight"},
 "rng":[{"rank":0,"seed":5,"offset":0},{"rank":1,"seed":5,"offset":1536}],
 "files":[{"file":"rank_00000.safetensors","shard":0,"bytes":120,"sha256":"00ff"},
          {"file":"rank_00001.safetensors","shard":1,"bytes":120,"sha256":"ff00"}],
 "tensors":{"model.fc.weight":{"dtype":"F32","shape":[3,2],"placement":"Shard(0)",
   "shards":[{"file":"rank_00000.safetensors","offset":0,"length":2},{"file":"rank_00001.safetensors","offset":2,"length":1}]},
  "optim.fc.weight.exp_avg":{"dtype":"BF16","shape":[3,2],"placement":"Shard(1)",
   "shards":[{"file":"rank_00001.safetensors","offset":0,"length":2}]}}}
JSON
    cat >"$corpus/replicated" <<'JSON'
{"format":"weft-checkpoint","format_version":2,"weft_version":"0.1.0","step":0,"world_size":1,"num_shards":1,
 "mesh":{"shape":[],"dim_names":[]},"data":{},"app":{},"aliases":{},"rng":[{"seed":0,"offset":0}],
 "files":[{"file":"rank_00000.safetensors","shard":0,"bytes":8,"sha256":""}],
 "tensors":{"model.step":{"dtype":"I64","shape":[],"placement":"Replicate()","shards":[{"file":"rank_00000.safetensors"}]}}}
JSON
    printf '{"format":"weft-checkpoint"}' >"$corpus/minimal"
    # Inputs that once hit undefined behaviour (floats cast to integers, offset + length past
    # 2^63), kept as regression seeds.
    small='{"format":"weft-checkpoint","format_version":2,"weft_version":"0","step":0,"world_size":1,"num_shards":1,
 "mesh":{"shape":[1],"dim_names":["x"]},"data":{},"app":{},"aliases":{},"rng":[{"seed":0,"offset":0}],
 "files":[{"file":"f","shard":0,"bytes":1,"sha256":""}],"tensors":{}}'
    printf '%s' "${small/'"shape":[1]'/'"shape":[1e300]'}" >"$corpus/float_mesh"
    printf '%s' "${small/'"data":{}'/'"data":{"epoch":-1e300}'}" >"$corpus/float_data"
    printf '%s' "${small/'"offset":0}]'/'"offset":4.5e40}]'}" \
      >"$corpus/float_rng"
    printf '%s' "${small/'"tensors":{}'/'"tensors":{"k":{"dtype":"F32","shape":[4],"placement":"Shard(0)",
 "shards":[{"file":"f","offset":3,"length":9223372036854775807}]}}'}" >"$corpus/offset_overflow"
    # Tokens the byte-level mutator would take long to find.
    printf '%s\n' '"1e300"' '"-1"' '"0.5"' '"9223372036854775807"' '"18446744073709551615"' '"-9223372036854775808"' \
      '"Shard("' '"Replicate()"' '"\"offset\""' '"\"length\""' '"\"shards\""' '"null"' '"true"' '"[]"' '"{}"' \
      >"$out/checkpoint_index.dict"
    fuzz_flags+=(-dict="$out/checkpoint_index.dict") ;;
  idx)
    idx_seed labels 0 5
    idx_seed images 0 2 3 3
    idx_seed images_gz 1 2 3 3
    idx_seed four_dims 0 1 2 1 2 ;;
  tokenizer)
    # The first byte picks the mode (fuzz_tokenizer.cpp): 0 a whole file, 1 a field's JSON
    # (the second byte picks the field), 2 text to encode, 3 ids to decode, 4 and 5 the same
    # with the SentencePiece-style fixture.
    export WEFT_FUZZ_TOKENIZER="$src/tests/data/tokenizers/gpt2/tokenizer.json"
    export WEFT_FUZZ_TOKENIZER_SP="$src/tests/data/tokenizers/llama2/tokenizer.json"
    printf '\x00{"model":{"type":"BPE","vocab":{},"merges":[]},"pre_tokenizer":{"type":"ByteLevel"}}' >"$corpus/file"
    printf '\x01\x00{"type":"BPE","vocab":{"a":0},"merges":[["a","a"]],"ignore_merges":true}' >"$corpus/model"
    printf '\x01\x01{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\\\s+|\\\\p{L}+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","use_regex":false}]}' >"$corpus/pre"
    printf '\x01\x02[{"id":5,"content":"<x>","special":true},{"id":600,"content":"yy"}]' >"$corpus/added"
    printf '\x01\x03[["a","b"],"c d",["\\u0120","t"]]' >"$corpus/merges"
    printf '\x02Hello, world! <|endoftext|> 1234 caf\xc3\xa9 \xe4\xb8\xad  \n\n x' >"$corpus/text"
    printf '\x02\xc3\x28 \xed\xa0\x80 \xf4\x90\x80\x80' >"$corpus/bad_text"
    printf '\x03\x00\x00\x00\x00\xc3\x00\x00\x00\xa9\x00\x00\x00\xff\xff\xff\xff' >"$corpus/ids"
    printf '\x01\x05{"type":"Sequence","normalizers":[{"type":"NFKC"},{"type":"Prepend","prepend":"_"},{"type":"Replace","pattern":{"String":" "},"content":"_"}]}' >"$corpus/normalizer"
    printf '\x01\x06{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<x>"}},{"Sequence":{"id":"A"}}],"special_tokens":{"<x>":{"ids":[3]}}}' >"$corpus/template"
    printf '\x04<s>Hello  world</s> \xe4\xb8\xad\xf0\x9f\x99\x82 <mask> [END] x' >"$corpus/sp_text"
    printf '\x05\x01\x00\x00\x00\xe7\x00\x00\x00\xbb\x00\x00\x00\x22\x01\x00\x00' >"$corpus/sp_ids" ;;
esac
# The target's scratch files and libFuzzer's crash-* files go to a directory of its own.
work="$out/run_$target"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
status=0
"$out/fuzz_$target" -runs="$runs" -max_len=4096 -rss_limit_mb=2048 -timeout=10 -seed=1 "${fuzz_flags[@]}" "$corpus" \
  >"$out/fuzz_$target.log" 2>&1 || status=$?
rm -rf fuzz_input.* fuzz_checkpoint.*
if [ "$status" -ne 0 ]; then
  tail -n 60 "$out/fuzz_$target.log"
  echo "fuzz_$target: failed (exit $status); the input is $work/crash-* (or oom-*, timeout-*), the log $out/fuzz_$target.log"
  exit 1
fi
grep -E '^(INFO: Seed|Done )' "$out/fuzz_$target.log" || true
echo "fuzz_$target: $runs inputs without a crash"
