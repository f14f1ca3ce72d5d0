// fsdp: saving and loading checkpoint directories (fsdp/checkpoint.h). The pieces live beside this file: the index
// format in checkpoint_index.cpp, publishing and rotating directories in checkpoint_dir.cpp, reading pieces in
// checkpoint_pieces.cpp, and the tools that need no model (verify, consolidate) in checkpoint_verify.cpp. Keeping the
// ranks in step when one fails is dist::agree's.
#include "fsdp/checkpoint.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>
#include <set>

#include "core/allocator.h"
#include "core/atomic_file.h"
#include "core/element_search.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "core/version.h"
#include "dist/agree.h"
#include "dist/config_check.h"
#include "dist/dist.h"
#include "fsdp/checkpoint_dir.h"
#include "fsdp/checkpoint_index.h"
#include "fsdp/checkpoint_pieces.h"
#include "fsdp/state.h"

namespace weft::fsdp {
namespace {

namespace fs = std::filesystem;

// ---- the ranks a checkpoint call spans: root's mesh as (replicas x shards), or this process,
// times the tensor-parallel parts of the model's split parameters (tp/split.h), if any.

struct Scope {
  dist::ProcessGroupPtr shard_group, replicate_group, part_group;  // null when absent
  int shard = 0, num_shards = 1, replica = 0, num_replicas = 1, part = 0, num_parts = 1;
  std::vector<int> mesh_shape{1};
  std::vector<std::string> dim_names{"shard"};
  int files() const { return num_shards * num_parts; }
  int file_of(int s, int p) const { return s * num_parts + p; }  // the file shard s of part p writes
  int world() const { return files() * num_replicas; }
  int linear() const { return replica * files() + file_of(shard, part); }  // row-major rank
  bool writer() const { return replica == 0; }                             // replicas hold equal shards
  bool lead() const { return writer() && shard == 0 && part == 0; }        // writes the index
  // What a dist::agree over every rank reduces over (none: this process alone).
  std::vector<dist::ProcessGroupPtr> groups() const { return {shard_group, replicate_group, part_group}; }
  // The same settings on every rank the call spans (dist::check_same_config over each group).
  void check_same(const dist::ConfigSettings& settings, std::string_view program, std::string_view rule) const {
    for (const dist::ProcessGroupPtr& g : groups()) if (g) dist::check_same_config(settings, program, g, rule);
  }
  // Whether this rank writes its piece `p`: split pieces by every part, the others by part 0.
  bool writes(const Placement& p) const {
    return writer() && (p.split.split() || part == 0) && (p.dim < 0 ? shard == 0 : p.length > 0);
  }
};

// The group holding the other tensor-parallel parts of the model's split parameters (one for all).
dist::ProcessGroupPtr part_group_of(nn::Module& model, const FSDPModule* root) {
  dist::ProcessGroupPtr group;
  for (auto& [name, p] : model.named_parameters()) {
    dist::ProcessGroupPtr g = root && root->shards(name) ? root->shard_info(name).split_group
                                                         : tp::split_group(partial_reduction(p));
    WEFT_CHECK(!g || !group || g == group, "checkpoint: parameter \"{}\" is split over another tensor-parallel group "
               "than the parameters before it", name);
    if (g) group = g;
  }
  return group;
}

Scope scope_of(const FSDPModule* root, nn::Module& model) {
  Scope s;
  if (dist::ProcessGroupPtr g = part_group_of(model, root)) {
    s.part_group = g, s.part = g->rank(), s.num_parts = g->size();
    s.mesh_shape = {1, s.num_parts}, s.dim_names = {"shard", "tp"};
  }
  if (!root) return s;
  auto& mesh = root->state()->mesh;
  s.shard_group = mesh->group(mesh->ndim() - 1);
  s.shard = s.shard_group->rank();
  s.num_shards = s.shard_group->size();
  if (mesh->ndim() == 2) {
    s.replicate_group = mesh->group(0);
    s.replica = s.replicate_group->rank();
    s.num_replicas = s.replicate_group->size();
  }
  s.mesh_shape = mesh->shape();
  s.dim_names = mesh->dim_names();
  if (s.part_group) s.mesh_shape.push_back(s.num_parts), s.dim_names.push_back("tp");
  return s;
}

// Every rank's `mine` (i64 [n]) as [world, n] in the row-major rank order (parts innermost).
Tensor all_gather(const Scope& s, const Tensor& mine) {
  Tensor rows = mine.view({1, mine.numel()}).clone();
  for (const dist::ProcessGroupPtr& g : {s.part_group, s.shard_group, s.replicate_group}) {
    if (!g) continue;
    // On the group's device (NCCL groups take CUDA tensors only), back on the CPU at the end.
    Tensor all = empty({g->size() * rows.size(0), rows.size(1)}, {.dtype = kInt64, .device = g->device()});
    g->all_gather_into_tensor(all.view({-1}), rows.to(g->device()).contiguous().view({-1}))->wait();
    rows = all.to(kCPU);
  }
  return rows;
}

// ---- what each rank tells the index writer: file size, sha256, key fingerprint, RNG state.

constexpr int64_t kRecord = 12;  // bytes, fingerprint, 8 words of sha256 hex, RNG seed and offset

Tensor make_record(uint64_t bytes, uint64_t fingerprint, const std::string& sha, const Generator::State& g) {
  Tensor r = zeros({kRecord}, {.dtype = kInt64});
  int64_t* p = r.data<int64_t>();
  p[0] = int64_t(bytes), p[1] = int64_t(fingerprint), p[10] = int64_t(g.seed), p[11] = int64_t(g.offset);
  std::memcpy(p + 2, sha.data(), std::min<size_t>(sha.size(), 64));
  return r;
}

Generator::State record_rng(const int64_t* p) { return {uint64_t(p[10]), uint64_t(p[11])}; }

// The piece of a dim-`dim` sharded tensor that shard `s` of `n` holds (torch.chunk's split).
std::pair<int64_t, int64_t> chunk_of(const Shape& shape, int64_t dim, int s, int n) {
  int64_t extent = shape.empty() ? 1 : shape[size_t(dim)];
  int64_t chunk = (extent + n - 1) / n;
  return {std::min(extent, int64_t(s) * chunk), std::clamp<int64_t>(extent - int64_t(s) * chunk, 0, chunk)};
}

// The index rank 0 writes: every rank's record (file, RNG) and where each tensor's pieces are.
CheckpointIndex index_of(const ShardedStateDict& sd, const Scope& sc, const CheckpointProgress& state,
                         const std::map<std::string, std::string>& aliases, const Tensor& records) {
  CheckpointIndex ix;
  ix.format_version = sc.part_group ? kCheckpointFormatVersion : 2;  // 2: no tensor-parallel parts
  ix.weft_version = WEFT_VERSION;
  ix.world_size = sc.world();
  ix.num_shards = sc.files();
  ix.mesh_shape = sc.mesh_shape;
  ix.mesh_dim_names = sc.dim_names;
  ix.training = state;
  ix.training.aliases = aliases;
  for (int i = 0; i < sc.world(); ++i) ix.rng.push_back(record_rng(records.data<int64_t>() + i * kRecord));
  for (int f = 0; f < sc.files(); ++f) {
    const int64_t* p = records.data<int64_t>() + f * kRecord;  // replica 0's row f
    ix.files.push_back({checkpoint_shard_file(f), f, uint64_t(p[0]), std::string(reinterpret_cast<const char*>(p + 2), 64)});
  }
  for (auto& [key, t] : sd) {
    const Placement& pl = t.placement;
    CheckpointIndex::Entry e{key, pl.global_shape, t.local.dtype(), pl.dim, pl.split, {}};
    e.split.index = 0;
    const Shape part_shape = Placement{pl.global_shape, -1, 0, 0, pl.split}.local_shape();  // FSDP shards a part
    for (int64_t part = 0; part < pl.split.parts; ++part) {
      if (pl.dim < 0) e.shards.push_back({checkpoint_shard_file(sc.file_of(0, int(part))), 0, 0, part});
      for (int s = 0; pl.dim >= 0 && s < sc.num_shards; ++s)
        if (auto [offset, length] = chunk_of(part_shape, pl.dim, s, sc.num_shards); length > 0)
          e.shards.push_back({checkpoint_shard_file(sc.file_of(s, int(part))), offset, length, part});
    }
    ix.tensors.push_back(std::move(e));
  }
  return ix;
}

// The names of the model's parameters that require no gradient.
std::set<std::string> frozen_parameters(nn::Module& model) {
  std::set<std::string> out;
  for (auto& [name, p] : model.named_parameters()) if (!p.requires_grad()) out.insert(name);
  return out;
}

struct TempDirRemover { fs::path dir; ~TempDirRemover() { if (std::error_code ec; !dir.empty()) fs::remove_all(dir, ec); } };

// A model tensor and where the checkpoint holds its value.
struct ModelEntry { std::string key; Tensor live; Placement placement; const CheckpointIndex::Entry* entry; };

// The model's tensors and their entries, checked against the index; nothing is read.
std::vector<ModelEntry> model_entries(const CheckpointIndex& index, nn::Module& model, const FSDPModule* root,
                                      const LoadOptions& options) {
  const std::string index_path = index.file_path(kCheckpointIndexFile);
  std::vector<ModelEntry> out;
  std::set<std::string> used;
  const std::set<std::string> frozen = options.frozen_elsewhere ? frozen_parameters(model) : std::set<std::string>{};
  for (auto& [name, t] : sharded_state_dict(model, root)) {
    const std::string key = "model." + name;
    used.insert(key);
    const CheckpointIndex::Entry* e = index.find(key);
    if (!e && frozen.count(name)) continue;  // kept elsewhere (a LoRA run's base)
    WEFT_CHECK(e, "checkpoint: {} has no tensor \"{}\" ({} {}): it was saved from another model", index_path, key,
               dtype_name(t.local.dtype()), shape_str(t.placement.global_shape));
    WEFT_CHECK(e->shape == t.placement.global_shape && is_floating(e->dtype) == is_floating(t.local.dtype()),
               "checkpoint: {}: \"{}\" is {} there but {} {} in this model", index_path, key, describe(*e),
               dtype_name(t.local.dtype()), shape_str(t.placement.global_shape));
    out.push_back({key, t.local, t.placement, e});
  }
  auto tied = tied_parameter_names(model);
  for (auto& e : index.tensors)
    WEFT_CHECK(e.key.rfind("model.", 0) != 0 || used.count(e.key) || tied.count(e.key.substr(6)),
               "checkpoint: {} holds \"{}\" ({}), which this model does not have: it was saved from another model",
               index_path, e.key, describe(e));
  return out;
}

// Reads this rank's part of `m` into `dst` (the model's tensor, or one shaped like it) and refuses a value that is
// not finite.
void read_model_value(PieceSource& source, const CheckpointIndex& index, const ModelEntry& m, const Tensor& dst) {
  assemble_from_pieces(m.key, dst, m.placement, source.pieces(*m.entry));
  if (auto bad = find_nonfinite(dst))
    WEFT_ERROR("checkpoint: {}: \"{}\" holds {} (of this rank's part): the checkpoint was written from state that "
               "is not finite; resume from an earlier one", index.file_path(kCheckpointIndexFile), m.key, bad->str());
}

// The optimizer state the checkpoint holds, read and checked, by position (for opt.load_state_dict).
nn::NamedTensorList read_optimizer_state(PieceSource& source, const CheckpointIndex& index, nn::Module& model,
                                         nn::Optimizer& opt, const FSDPModule* root) {
  const std::string index_path = index.file_path(kCheckpointIndexFile);
  std::map<std::string, Tensor> params;
  for (auto& [name, t] : model.named_parameters()) params.emplace(name, t);
  nn::NamedTensorList named;
  for (auto& e : index.tensors) {
    if (e.key.rfind("optim.", 0) != 0) continue;
    const std::string key = e.key.substr(6);
    std::string param, state;
    Placement want = Placement::of_whole(e.shape);
    if (split_optimizer_state_key(key, param, state)) {
      auto it = params.find(param);
      WEFT_CHECK(it != params.end(), "checkpoint: {}: \"{}\" is optimizer state of parameter \"{}\", which this "
                 "model does not have", index_path, e.key, param);
      if (state != "step") {
        want = param_placement(root, param, it->second);
        WEFT_CHECK(e.shape == want.global_shape, "checkpoint: {}: \"{}\" is {} but parameter {} is {}", index_path,
                   e.key, describe(e), param, shape_str(want.global_shape));
      }
    }
    Tensor value = empty(want.local_shape(), {.dtype = e.dtype});
    assemble_from_pieces(e.key, value, want, source.pieces(e));
    try {
      opt.check_state(e.key, state.empty() ? key : state, value);
    } catch (const Error& err) {
      WEFT_ERROR("checkpoint: {}: {}; resume from an earlier checkpoint", index_path, err.what());
    }
    named.emplace_back(key, std::move(value));
  }
  return position_optimizer_state(named, optimizer_param_names(opt, model));
}

// Gives the optimizer `state` (it keeps the tensors: no second copy) on every rank, or on none: when one rank's
// optimizer refuses it, each puts back what it had.
void load_optimizer_state(nn::Optimizer& opt, nn::NamedTensorList state, const Scope& sc, const std::string& dir) {
  nn::NamedTensorList before = opt.state_dict();
  std::exception_ptr error;
  try {
    opt.load_state_dict(std::move(state));
  } catch (const OutOfMemoryError&) {
    error = std::current_exception();  // not a mismatch: said as it is
  } catch (const Error& e) {
    error = std::make_exception_ptr(Error(fmt::format("checkpoint: {}: the optimizer state does not fit this "
                                                      "optimizer: {}", dir, e.what())));
  }
  try {
    dist::agree_on_error(error, "checkpoint: loading the optimizer state", sc.groups());
  } catch (...) {
    if (!error) opt.load_state_dict(before);
    throw;
  }
}

}  // namespace

std::string save_checkpoint(const std::string& dir, nn::Module& model, const nn::Optimizer* opt,
                            const FSDPModule* root, const CheckpointProgress& state, const SaveOptions& options) {
  const Scope sc = scope_of(root, model);
  const fs::path final_dir = fs::path(dir) / checkpoint_step_dir(state.step);
  const fs::path tmp = fs::path(dir) / checkpoint_temp_dir(state.step);
  ShardedStateDict sd;
  std::map<std::string, std::string> aliases;
  // A refused save (a rank's write failed, the ranks' tensors differ) leaves no temporary directory: the ranks are
  // past their writes when a collective check throws. A published one was renamed away.
  const TempDirRemover remover{sc.lead() ? tmp : fs::path()};
  // One directory, step and progress (each entry on its own, a difference named by its key): another directory
  // per rank had published a checkpoint without some ranks' files, and only rank 0's progress is recorded.
  dist::ConfigSettings same = {{"the checkpoint directory", fs::absolute(dir).lexically_normal().string()}, {"the step", std::to_string(state.step)}};
  for (const auto& [k, v] : state.data) same.emplace_back("the data position's " + k, std::to_string(v));
  for (const auto& [k, v] : state.app) same.emplace_back("the description's " + k, v);
  sc.check_same(same, "save_checkpoint", "every rank must save the same checkpoint");
  dist::agree(sc.groups(), "checkpoint: saving a checkpoint", [&] {
    WEFT_CHECK(!dir.empty(), "save_checkpoint: the directory is empty");
    WEFT_CHECK(state.step >= 0, "save_checkpoint: step {} is negative", state.step);
    check_recordable(state);
    for (const auto& [k, v] : state.data) WEFT_CHECK(v >= 0, "save_checkpoint: data position {} is {}, not a count", k, v);
    const std::set<std::string> frozen = options.frozen_elsewhere ? frozen_parameters(model) : std::set<std::string>{};
    for (auto& [k, t] : sharded_state_dict(model, root))
      if (!frozen.count(k)) sd.emplace_back("model." + k, t);
    if (opt)
      for (auto& [k, t] : sharded_optimizer_state_dict(*opt, model, root)) sd.emplace_back("optim." + k, t);
    aliases = tied_parameter_names(model);
    for (auto& [name, target] : state.aliases) {
      bool known = frozen.count(target) > 0;  // kept elsewhere, with its aliases (erased below)
      for (auto& [k, t] : sd) known |= k == "model." + target;
      WEFT_CHECK(known, "save_checkpoint: alias \"{}\" names \"{}\", which is not a parameter or buffer of the model",
                 name, target);
      aliases[name] = target;
    }
    std::erase_if(aliases, [&](const auto& alias) { return frozen.count(alias.second) > 0; });
    if (sc.lead()) {
      WEFT_CHECK(!WEFT_FS(fs::exists(final_dir)) || WEFT_FS(fs::exists(final_dir / kCheckpointIndexFile)),
                 "save_checkpoint: {} exists and is not a checkpoint (it has no {}): it is left as it is (move it "
                 "away, or save elsewhere)", final_dir.string(), kCheckpointIndexFile);
      WEFT_FS(fs::create_directories(dir));
      WEFT_FS(fs::remove_all(tmp));  // left by a save that crashed
      WEFT_FS(fs::create_directory(tmp));
    }
  });

  uint64_t bytes = 0;
  std::string sha(64, '0');
  dist::agree(sc.groups(), fmt::format("checkpoint: writing checkpoint {}", final_dir.string()), [&] {
    if (!sc.writer()) return;
    WEFT_CHECK(WEFT_FS(fs::is_directory(tmp)), "save_checkpoint: {}, which rank 0 made, is not there on this rank: every "
               "rank must see the same checkpoint directory (a directory local to each host is not)", tmp.string());
    const int index = sc.file_of(sc.shard, sc.part);
    const std::string file = (tmp / checkpoint_shard_file(index)).string();
    NamedTensors pieces;
    for (auto& [k, t] : sd)
      if (sc.writes(t.placement)) pieces.emplace_back(k, t.local);
    save_safetensors(file, pieces, {{"format", "weft-checkpoint-shard"}, {"shard", std::to_string(index)},
                                    {"num_shards", std::to_string(sc.files())}, {"step", std::to_string(state.step)}});
    sha = sha256_file(file);
    bytes = WEFT_FS(fs::file_size(file));
  });

  Tensor records = all_gather(sc, make_record(bytes, keys_fingerprint(sd), sha, default_generator().state()));
  for (int i = 1; i < sc.world(); ++i)
    WEFT_CHECK(records.data<int64_t>()[i * kRecord + 1] == records.data<int64_t>()[1],
               "save_checkpoint: rank {} of the mesh holds other tensors than rank 0 (names, shapes or dtypes differ, "
               "e.g. optimizer state for a shard that never had a gradient); nothing was published", i);

  dist::agree(sc.groups(), fmt::format("checkpoint: publishing checkpoint {}", final_dir.string()), [&] {
    if (!sc.lead()) return;
    const CheckpointIndex ix = index_of(sd, sc, state, aliases, records);
    for (const auto& f : ix.files) {  // a rank that wrote into another directory (one not shared with this rank)
      std::error_code ec;
      const uintmax_t size = fs::file_size(tmp / f.name, ec);
      WEFT_CHECK(!ec && size == f.bytes, "save_checkpoint: {} is {} in {} ({} bytes written): every rank must see the "
                 "same checkpoint directory (a directory local to each host is not); nothing was published", f.name,
                 ec ? "missing" : fmt::format("{} bytes", size), tmp.string(), f.bytes);
    }
    const std::string text = checkpoint_index_json(ix);
    const std::string index_path = (tmp / kCheckpointIndexFile).string();
    write_file_atomic(index_path, [&](std::FILE* f) {
      WEFT_CHECK(std::fwrite(text.data(), 1, text.size(), f) == text.size(), "save_checkpoint: writing {} failed: {}",
                 index_path, std::strerror(errno));
    });
    publish_checkpoint(tmp, final_dir, options, state.run);
  });
  return final_dir.string();
}

// Each model value is read and checked one at a time, then read again into the model once all ranks read everything;
// the optimizer keeps the state tensors read: no second copy of the model or of the state (docs/CHECKPOINTS.md).
CheckpointProgress load_checkpoint(const std::string& path, nn::Module& model, nn::Optimizer* opt, const FSDPModule* root,
                              const LoadOptions& options) {
  const Scope sc = scope_of(root, model);
  CheckpointIndex index;
  std::optional<PieceSource> source;
  std::vector<ModelEntry> entries;
  nn::NamedTensorList optim_state;  // by position, for opt->load_state_dict
  std::string read;  // which checkpoint this rank read: every rank must read the same one
  dist::agree(sc.groups(), "checkpoint: loading a checkpoint", [&] {
    index = read_checkpoint_index(path);
    read = fmt::format("step {}, index.json sha256 {}", index.training.step,
                       sha256_file(index.file_path(kCheckpointIndexFile)).substr(0, 16));
    source.emplace(index, options.verify);
    entries = model_entries(index, model, root, options);
    for (const ModelEntry& m : entries)
      read_model_value(*source, index, m, empty(m.live.shape(), {.dtype = m.live.dtype()}));
    if (opt) optim_state = read_optimizer_state(*source, index, model, *opt, root);
  });

  // A path that holds other checkpoints on other hosts (node-local disks) would load a mix of them.
  sc.check_same({{"the checkpoint read", read}}, "checkpoint", "every rank must read the same checkpoint: the path "
                "holds another one on some rank's host");
  // The optimizer first: its own checks (groups, options) may still fail on some rank, and
  // then every rank puts back what it had.
  if (opt && !optim_state.empty()) load_optimizer_state(*opt, std::move(optim_state), sc, index.dir);
  dist::agree(sc.groups(), "checkpoint: reading the model's values", [&] {
    for (const ModelEntry& m : entries) read_model_value(*source, index, m, m.live);
  });
  if (options.restore_rng)
    default_generator().set_state(index.rng[size_t(sc.linear()) < index.rng.size() ? size_t(sc.linear()) : 0]);
  return index.training;
}

}  // namespace weft::fsdp
