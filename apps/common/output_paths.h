// apps: no output a command writes may destroy an input it reads. Before anything is written, every output path
// (--metrics, --logits-out, --save, --checkpoint-dir, --out, WEFT_TRACE's file) is checked against the inputs (--data's
// files, --from, --resume's checkpoint, --init-from, --tokenizer): an output that is an input (the same file or
// directory, under any name or link) or lies inside an input directory is an error naming both flags. And each output's
// place must take it: a file's directory must exist and the file, if it does, be a regular file; a directory output
// must be a directory or lie under one (its missing parents are made). An existing output that PathFlag::ours does not
// accept (as an earlier --logits-out's file, a dataset) is the user's.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace weft::apps {

struct PathFlag {
  std::string flag;  // "--metrics"
  std::string path;  // empty: not given (skipped)
  bool directory = false;  // an output that is a directory (--checkpoint-dir, --out)
  std::function<bool(const std::string& path)> ours = nullptr;  // set: an existing output must pass it
  std::string what;  // what `ours` accepts, for the error ("the logits an earlier --logits-out wrote")
};

// That the output's place can take it (above); "<program>: <flag> <path> ..." if not.
void check_output_place(const PathFlag& out, const std::string& program);

// Throws "<program>: <output flag> <path> is <where> <input flag> <path>: ... give it another path"
// for the first output that would write over or into an input, naming two outputs at one path,
// or naming the output whose place cannot take it.
void check_outputs_apart(const std::vector<PathFlag>& outputs, const std::vector<PathFlag>& inputs,
                         const std::string& program);

}  // namespace weft::apps
