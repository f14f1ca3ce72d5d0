#include "apps/common/output_paths.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "fsdp/checkpoint_index.h"

namespace weft::apps {

namespace fs = std::filesystem;

namespace {

// The absolute path with links resolved as far as it exists (an output may not exist yet).
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  return ec ? WEFT_FS(fs::absolute(path)).lexically_normal() : p;
}

bool inside(const fs::path& child, const fs::path& dir) {
  auto [d, c] = std::mismatch(dir.begin(), dir.end(), child.begin(), child.end());
  return d == dir.end() || (std::next(d) == dir.end() && d->empty());  // a trailing "/" of dir
}

// How `out` meets `in` ("" when apart): the same file or directory, or inside it.
std::string clash(const fs::path& out, const fs::path& in) {
  std::error_code ec;
  if (fs::equivalent(out, in, ec) || out == in) return "the same path as";
  if (fs::is_directory(in, ec) && inside(out, in)) return "inside";
  return "";
}

// Whether `dir` is a published weft checkpoint (its index.json names the format; read or damaged past that): no output
// may be one or lie inside one (its step read as the output's, or removed with it by a rotation).
bool is_checkpoint(const fs::path& dir) {
  std::ifstream in(dir / fsdp::kCheckpointIndexFile);
  std::string head(256, '\0');
  in.read(head.data(), std::streamsize(head.size()));
  return head.find("\"weft-checkpoint\"") != std::string::npos;
}

}  // namespace

// Before any work: a file output at an existing directory, or in a directory that does not
// exist, would fail only when the result is written.
void check_output_place(const PathFlag& out, const std::string& program) {
  std::error_code ec;
  fs::path at = fs::absolute(out.path, ec).lexically_normal();
  for (fs::path whole = resolved(out.path), p = whole; !p.empty() && p != p.root_path(); p = p.parent_path())
    WEFT_CHECK(!is_checkpoint(p), "{}: {} {} {} the checkpoint {}: give {} a path of its own", program, out.flag,
               out.path, p == whole ? "is" : "lies inside", p.string(), out.flag);
  const fs::file_status st = fs::status(at, ec);
  WEFT_CHECK(!ec || ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory, "{}: {} {}: {}",
             program, out.flag, out.path, ec.message());  // a loop of links (a file as a parent: named below)
  for (fs::path p = at; !p.empty() && p != p.root_path(); p = p.parent_path())  // it or a parent: a dangling link
    WEFT_CHECK(fs::exists(p, ec) || !fs::is_symlink(fs::symlink_status(p, ec)), "{}: {} {}: {} is a link to {}, which "
               "does not exist", program, out.flag, out.path, p.string(), fs::read_symlink(p, ec).string());
  if (fs::exists(st)) {
    WEFT_CHECK(out.directory ? fs::is_directory(st) : fs::is_regular_file(st), "{}: {} {} exists and is not a {}",
               program, out.flag, out.path, out.directory ? "directory" : "regular file (a directory, FIFO or device?)");
    WEFT_CHECK(!out.ours || out.ours(out.path), "{}: {} {} exists and is not {}: give {} another path", program,
               out.flag, out.path, out.what, out.flag);
    return;
  }
  if (at.filename().empty()) at = at.parent_path();  // "dir/"
  do at = at.parent_path(); while (out.directory && !at.empty() && at != at.root_path() && !fs::exists(at, ec));
  WEFT_CHECK(fs::is_directory(at, ec), "{}: {} {}: {} is {}", program, out.flag, out.path, at.string(),
             fs::exists(at, ec) ? "not a directory" : "a directory that does not exist");
}

void check_outputs_apart(const std::vector<PathFlag>& outputs, const std::vector<PathFlag>& inputs,
                         const std::string& program) {
  for (const PathFlag& out : outputs) {
    if (out.path.empty()) continue;
    const fs::path o = resolved(out.path);
    for (const PathFlag& other : outputs)  // two outputs at one path: the second would fail only once the first is made
      WEFT_CHECK(&other == &out || other.path.empty() || clash(o, resolved(other.path)) != "the same path as",
                 "{}: {} {} is the same path as {} {}: give one of them another path", program, out.flag, out.path,
                 other.flag, other.path);
    for (const PathFlag& in : inputs) {
      if (in.path.empty()) continue;
      const std::string how = clash(o, resolved(in.path));
      WEFT_CHECK(how.empty(), "{}: {} {} is {} {} {}: writing it would destroy what this command reads; give {} "
                 "another path", program, out.flag, out.path, how, in.flag, in.path, out.flag);
    }
  }
  for (const PathFlag& out : outputs)
    if (!out.path.empty()) check_output_place(out, program);
}

}  // namespace weft::apps
