// weft-checkpoint: looks after checkpoint directories written by fsdp::save_checkpoint (see
// docs/CHECKPOINTS.md), in one process, at any size of the run that wrote them.
//   weft-checkpoint inspect DIR                      the index as a table
//   weft-checkpoint verify DIR                       sizes, sha256s, shapes, coverage, finite values
//   weft-checkpoint consolidate DIR OUT.safetensors  one ordinary file with the full model
// DIR is a checkpoint (holding index.json) or a directory of them (the latest is used).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <exception>

#include "apps/common/output_paths.h"
#include "apps/common/resume.h"
#include "core/safetensors.h"
#include "fsdp/checkpoint.h"

using namespace weft;

namespace {

std::string human_bytes(uint64_t n) {
  if (n >= (1ull << 30)) return fmt::format("{:.1f} GiB", double(n) / double(1ull << 30));
  if (n >= (1ull << 20)) return fmt::format("{:.1f} MiB", double(n) / double(1ull << 20));
  if (n >= (1ull << 10)) return fmt::format("{:.1f} KiB", double(n) / double(1ull << 10));
  return fmt::format("{} B", n);
}

int inspect(const std::string& dir) {
  fsdp::CheckpointIndex ix = fsdp::read_checkpoint_index(dir);
  std::printf("checkpoint  %s\n", ix.dir.c_str());
  std::printf("step        %lld\n", (long long)ix.training.step);
  std::printf("weft        %s (format %d)\n", ix.weft_version.c_str(), ix.format_version);
  std::string mesh;
  for (size_t i = 0; i < ix.mesh_shape.size(); ++i)
    mesh += fmt::format("{}{}={}", i ? " x " : "", ix.mesh_dim_names.at(i), ix.mesh_shape[i]);
  std::printf("world size  %d (mesh %s), %d shard file(s)\n", ix.world_size, mesh.c_str(), ix.num_shards);
  for (auto& [k, v] : ix.training.app) std::printf("app         %s = %s\n", k.c_str(), v.c_str());
  for (auto& [k, v] : ix.training.data) std::printf("data        %s = %lld\n", k.c_str(), (long long)v);
  for (auto& [k, v] : ix.training.aliases) std::printf("alias       %s = %s\n", k.c_str(), v.c_str());
  std::printf("rng         %zu state(s)\n\n", ix.rng.size());

  std::printf("%-24s %10s  %s\n", "file", "bytes", "sha256");
  uint64_t total = 0;
  for (auto& f : ix.files) {
    std::printf("%-24s %10llu  %s\n", f.name.c_str(), (unsigned long long)f.bytes, f.sha256.c_str());
    total += f.bytes;
  }
  std::printf("%-24s %10llu  (%s)\n\n", "total", (unsigned long long)total, human_bytes(total).c_str());

  size_t width = 6;
  for (auto& e : ix.tensors) width = std::max(width, e.key.size());
  std::printf("%-*s  %-5s  %-16s  %-11s  %s\n", int(width), "tensor", "dtype", "shape", "placement", "pieces");
  // A tensor split by tensor parallelism: its placement names the split (dim, parts), and each piece its part,
  // the piece's rows those of that part (of dim shard_dim).
  for (auto& e : ix.tensors) {
    std::string pieces;
    for (auto& s : e.shards) {
      const std::string part = e.split.split() ? fmt::format("part{}", s.part) : "";
      if (!pieces.empty()) pieces += " ";
      pieces += e.shard_dim < 0 ? s.file + (part.empty() ? "" : ":" + part)
                                : fmt::format("{}:{}[{},{})", s.file.substr(0, s.file.find('.')), part, s.offset,
                                              s.offset + s.length);
    }
    std::string placement = e.shard_dim < 0 ? "Replicate()" : fmt::format("Shard({})", e.shard_dim);
    if (e.split.split()) placement += fmt::format(" split(dim {}, {} parts)", e.split.dim, e.split.parts);
    std::printf("%-*s  %-5s  %-16s  %-11s  %s\n", int(width), e.key.c_str(), safetensors_dtype_name(e.dtype),
                shape_str(e.shape).c_str(), placement.c_str(), pieces.c_str());
  }
  return 0;
}

// A directory of checkpoints verifies its newest; one newer whose index does not read fails the verification too.
int verify(const std::string& dir) {
  std::vector<std::string> unreadable;
  const std::string latest = fsdp::latest_checkpoint(dir, &unreadable);
  fsdp::VerifyReport r = fsdp::verify_checkpoint(latest.empty() ? dir : latest);
  std::printf("%s: %s: %zu file(s), %s, %zu tensors; sizes, sha256s, shapes and coverage match the index, and "
              "every value is finite\n", unreadable.empty() ? "ok" : "ok, but it is not the newest", latest.c_str(),
              r.files, human_bytes(r.bytes).c_str(), r.tensors);
  for (const std::string& e : unreadable)
    std::fprintf(stderr, "weft-checkpoint: error: a checkpoint in the directory cannot be read: %s\n", e.c_str());
  return unreadable.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft-checkpoint: inspect, verify and consolidate weft checkpoint directories"};
  app.require_subcommand(1);
  std::string dir, out;
  bool with_optimizer = false, allow_nonfinite = false;
  auto* ins = app.add_subcommand("inspect", "print the index: step, mesh, files and every tensor's placement");
  ins->add_option("DIR", dir, "checkpoint directory (or a directory of them: the latest)")->required();
  auto* ver = app.add_subcommand("verify", "check every file's size and sha256, every tensor's pieces, and that "
                                 "every value is finite");
  ver->add_option("DIR", dir, "checkpoint directory (or a directory of them: the latest)")->required();
  auto* con = app.add_subcommand("consolidate", "write the full (unsharded) model to one safetensors file");
  con->add_option("DIR", dir, "checkpoint directory (or a directory of them: the latest)")->required();
  con->add_option("OUT", out, "output .safetensors file (loads with Python's safetensors and PyTorch)")->required();
  con->add_flag("--with-optimizer", with_optimizer, "also write the optimizer state, under \"optim.\"");
  con->add_flag("--allow-nonfinite", allow_nonfinite, "copy tensors holding NaN or infinity (refused by default)");
  app.footer("Files written by consolidate carry the model's own names (nanoGPT's for weft-transformer, with\n"
             "lm_head.weight repeated for a tied head) and the app's config in their metadata.");
  CLI11_PARSE(app, argc, argv);
  try {
    if (ver->parsed()) return verify(dir);
    if (const std::string r = apps::readable_checkpoint(dir, "checkpoint", true, ins->parsed()); !r.empty()) dir = r;
    if (ins->parsed()) return inspect(dir);
    WEFT_CHECK(!out.empty(), "checkpoint: OUT is empty: name the .safetensors file to write");
    apps::check_outputs_apart({{"OUT", out}}, {{"DIR", dir}}, "checkpoint");
    WEFT_CHECK(!WEFT_FS(std::filesystem::exists(out)), "checkpoint: OUT {} already exists: consolidate writes a new "
               "file and overwrites nothing (choose another OUT or remove it)", out);
    fsdp::consolidate_checkpoint(dir, out, with_optimizer, allow_nonfinite);
    auto entries = read_safetensors_index(out);
    std::fprintf(stderr, "wrote %s: %zu tensors from %s\n", out.c_str(), entries.size(),
                 fsdp::latest_checkpoint(dir).c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-checkpoint: error: %s\n", e.what());
    return 1;
  }
}
