#include "fsdp/checkpoint.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "core/atomic_file.h"
#include "core/grad_mode.h"
#include "core/copy.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "core/version.h"
#include "dist/dist.h"
#include "fsdp/state.h"

namespace weft::fsdp {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

constexpr int kFormatVersion = 1;
constexpr const char* kIndexFile = "index.json";

std::string step_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }
std::string shard_file_name(int shard) { return fmt::format("rank_{:05d}.safetensors", shard); }

// ---- the ranks a checkpoint call spans: root's mesh as (replicas x shards), or this process.

struct Scope {
  dist::ProcessGroupPtr shard_group, replicate_group;  // null when absent
  int shard = 0, num_shards = 1, replica = 0, num_replicas = 1;
  std::vector<int> mesh_shape{1};
  std::vector<std::string> dim_names{"shard"};
  int world() const { return num_shards * num_replicas; }
  int linear() const { return replica * num_shards + shard; }  // the mesh's row-major rank
  bool writer() const { return replica == 0; }                 // replicas hold equal shards
  bool lead() const { return writer() && shard == 0; }         // writes the index
};

Scope scope_of(const FSDPModule* root) {
  Scope s;
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
  return s;
}

// Every rank's `mine` (i64 [n]) as [world, n] in the mesh's rank order.
Tensor all_gather(const Scope& s, const Tensor& mine) {
  const int64_t n = mine.numel();
  if (!s.shard_group) return mine.view({1, n}).clone();
  // On the groups' device (NCCL groups take CUDA tensors only), back on the CPU at the end.
  const Device dev = s.shard_group->device();
  Tensor rows = empty({s.num_shards, n}, {.dtype = kInt64, .device = dev});
  s.shard_group->all_gather_into_tensor(rows.view({-1}), mine.to(dev))->wait();
  if (!s.replicate_group) return rows.to(kCPU);
  Tensor all = empty({s.world(), n}, {.dtype = kInt64, .device = dev});
  s.replicate_group->all_gather_into_tensor(all.view({-1}), rows.view({-1}))->wait();
  return all.to(kCPU);
}

// Rethrows this rank's error, or, when another rank failed, throws here too: no rank goes on
// to the next collective alone.
void agree(const Scope& s, std::exception_ptr error, const std::string& what) {
  if (s.world() > 1) {
    Tensor failed = from_vector({error ? 1.0 : 0.0}, {1}, {.dtype = kFloat64}).to(s.shard_group->device());
    s.shard_group->all_reduce(failed, dist::ReduceOp::max)->wait();
    if (s.replicate_group) s.replicate_group->all_reduce(failed, dist::ReduceOp::max)->wait();
    if (!error && failed.to(kCPU).item() > 0)
      WEFT_ERROR("checkpoint: {} failed on another rank (see its message); stopping here too", what);
  }
  if (error) std::rethrow_exception(error);
}

template <class Work>
void on_all_ranks(const Scope& s, const std::string& what, Work&& work) {
  std::exception_ptr error;
  try {
    work();
  } catch (...) {
    error = std::current_exception();
  }
  agree(s, error, what);
}

// ---- what each rank tells the index writer: file size, sha256, key fingerprint, RNG state.

constexpr int64_t kRecord = 17;  // bytes, fingerprint, 8 words of sha256 hex, 7 of RNG state

Tensor make_record(uint64_t bytes, uint64_t fingerprint, const std::string& sha, const Generator::State& g) {
  Tensor r = zeros({kRecord}, {.dtype = kInt64});
  int64_t* p = r.data<int64_t>();
  p[0] = int64_t(bytes);
  p[1] = int64_t(fingerprint);
  std::memcpy(p + 2, sha.data(), std::min<size_t>(sha.size(), 64));
  for (int i = 0; i < 4; ++i) p[10 + i] = int64_t(g.s[i]);
  p[14] = int64_t(g.seed);
  p[15] = g.has_spare;
  p[16] = std::bit_cast<int64_t>(g.spare);
  return r;
}

Generator::State record_rng(const int64_t* p) {
  Generator::State g{};
  for (int i = 0; i < 4; ++i) g.s[i] = uint64_t(p[10 + i]);
  g.seed = uint64_t(p[14]);
  g.has_spare = p[15] != 0;
  g.spare = std::bit_cast<double>(p[16]);
  return g;
}

// The piece of a dim-`dim` sharded tensor that shard `s` of `n` holds (torch.chunk's split).
std::pair<int64_t, int64_t> chunk_of(const Shape& shape, int64_t dim, int s, int n) {
  int64_t extent = shape.empty() ? 1 : shape[size_t(dim)];
  int64_t chunk = (extent + n - 1) / n;
  return {std::min(extent, int64_t(s) * chunk), std::clamp<int64_t>(extent - int64_t(s) * chunk, 0, chunk)};
}

std::string placement_name(int64_t dim) { return dim < 0 ? "Replicate()" : fmt::format("Shard({})", dim); }

Json index_json(const ShardedStateDict& sd, const Scope& sc, const CheckpointProgress& state,
                const std::map<std::string, std::string>& aliases, const Tensor& records) {
  Json j = Json::object();
  j["format"] = "weft-checkpoint";
  j["format_version"] = kFormatVersion;
  j["weft_version"] = WEFT_VERSION;
  j["step"] = state.step;
  j["world_size"] = sc.world();
  j["num_shards"] = sc.num_shards;
  j["mesh"] = {{"shape", sc.mesh_shape}, {"dim_names", sc.dim_names}};
  j["data"] = state.data;
  j["app"] = state.app;
  j["aliases"] = aliases;
  Json rng = Json::array();
  for (int i = 0; i < sc.world(); ++i) {
    Generator::State g = record_rng(records.data<int64_t>() + i * kRecord);
    rng.push_back({{"rank", i}, {"state", {g.s[0], g.s[1], g.s[2], g.s[3]}}, {"seed", g.seed},
                   {"has_spare", g.has_spare}, {"spare", g.spare}});
  }
  j["rng"] = rng;
  Json files = Json::array();
  for (int s = 0; s < sc.num_shards; ++s) {
    const int64_t* p = records.data<int64_t>() + s * kRecord;  // replica 0's row s
    files.push_back({{"file", shard_file_name(s)}, {"shard", s}, {"bytes", uint64_t(p[0])},
                     {"sha256", std::string(reinterpret_cast<const char*>(p + 2), 64)}});
  }
  j["files"] = files;
  Json tensors = Json::object();
  for (auto& [key, t] : sd) {
    const Placement& pl = t.placement;
    Json shards = Json::array();
    if (pl.whole()) {
      shards.push_back({{"file", shard_file_name(0)}});
    } else {
      for (int s = 0; s < sc.num_shards; ++s)
        if (auto [offset, length] = chunk_of(pl.global_shape, pl.dim, s, sc.num_shards); length > 0)
          shards.push_back({{"file", shard_file_name(s)}, {"offset", offset}, {"length", length}});
    }
    tensors[key] = {{"dtype", safetensors_dtype_name(t.local.dtype())}, {"shape", pl.global_shape},
                    {"placement", placement_name(pl.dim)}, {"shards", shards}};
  }
  j["tensors"] = tensors;
  return j;
}

// Moves a finished temp dir into place; an older checkpoint of the same step goes only after.
void publish(const fs::path& tmp, const fs::path& final_dir) {
  fsync_directory(tmp.string());
  fs::path old = final_dir.parent_path() / (".old-" + final_dir.filename().string());
  if (fs::exists(final_dir)) {
    fs::remove_all(old);
    fs::rename(final_dir, old);
  }
  fs::rename(tmp, final_dir);
  fsync_directory(final_dir.parent_path().string());
  fs::remove_all(old);
}

// Complete checkpoints under `dir` by step.
std::map<int64_t, fs::path> complete_checkpoints(const fs::path& dir) {
  std::map<int64_t, fs::path> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.size() <= 5 || name.rfind("step_", 0) != 0 ||
        name.find_first_not_of("0123456789", 5) != std::string::npos || !fs::exists(e.path() / kIndexFile))
      continue;
    out[std::stoll(name.substr(5))] = e.path();
  }
  return out;
}

void keep_newest(const fs::path& dir, int keep_last, const fs::path& just_written) {
  if (keep_last <= 0) return;
  auto all = complete_checkpoints(dir);
  int excess = int(all.size()) - keep_last;
  for (auto& [step, path] : all) {
    if (excess-- <= 0) break;
    if (path != just_written) fs::remove_all(path);
  }
}

// ---- reading the index

struct IndexReader {
  std::string path;
  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    WEFT_ERROR("checkpoint: {}: \"{}\" {}", path, key, why);
  }
  const Json& at(const Json& obj, const std::string& key, const std::string& where = "") const {
    auto it = obj.find(key);
    if (it == obj.end()) fail(where.empty() ? key : where + "." + key, "is missing");
    return *it;
  }
  int64_t integer(const Json& obj, const std::string& key, const std::string& where = "") const {
    const Json& v = at(obj, key, where);
    if (!v.is_number_integer()) fail(where.empty() ? key : where + "." + key, "is " + v.dump() + ", not an integer");
    return v.get<int64_t>();
  }
  std::string string(const Json& obj, const std::string& key, const std::string& where = "") const {
    const Json& v = at(obj, key, where);
    if (!v.is_string()) fail(where.empty() ? key : where + "." + key, "is " + v.dump() + ", not a string");
    return v.get<std::string>();
  }
};

// Readers of the files of one checkpoint, each file checked against the index once.
class PieceSource {
 public:
  PieceSource(const CheckpointIndex& index, bool verify) : index_(index), verify_(verify) {}

  void check_file(const CheckpointIndex::File& f) {
    std::string path = index_.file_path(f.name);
    WEFT_CHECK(fs::is_regular_file(path), "checkpoint: {} is missing (listed in {}/{})", path, index_.dir, kIndexFile);
    uint64_t size = fs::file_size(path);
    WEFT_CHECK(size == f.bytes, "checkpoint: {} is {} bytes but the index records {}: the file is truncated or was "
               "changed", path, size, f.bytes);
    std::string sha = sha256_file(path);
    WEFT_CHECK(sha == f.sha256, "checkpoint: sha256 of {} is {} but the index records {}: the file is corrupt or was "
               "changed", path, sha, f.sha256);
  }

  SafetensorsReader& open(const std::string& file) {
    auto it = readers_.find(file);
    if (it != readers_.end()) return *it->second;
    if (verify_)
      for (auto& f : index_.files)
        if (f.name == file) check_file(f);
    auto reader = std::make_unique<SafetensorsReader>(index_.file_path(file));
    return *readers_.emplace(file, std::move(reader)).first->second;
  }

  Tensor read(const std::string& file, const CheckpointIndex::Entry& e) {
    std::string path = index_.file_path(file);
    try {
      SafetensorsReader& r = open(file);
      const SafetensorsEntry* se = r.find(e.key);
      WEFT_CHECK(se, "the file has no tensor \"{}\" although the index lists a piece of it there", e.key);
      WEFT_CHECK(se->dtype == e.dtype, "\"{}\" is {} in the file but {} in the index", e.key,
                 safetensors_dtype_name(se->dtype), safetensors_dtype_name(e.dtype));
      return r.read(e.key);
    } catch (const Error& err) {
      WEFT_ERROR("checkpoint: cannot read \"{}\" from {}: {}", e.key, path, err.what());
    }
  }

  std::vector<Piece> pieces(const CheckpointIndex::Entry& e) {
    std::vector<Piece> out;
    for (auto& s : e.shards) {
      Placement pl = e.shard_dim < 0 ? Placement::of_whole(e.shape) : Placement{e.shape, e.shard_dim, s.offset, s.length};
      out.push_back({pl, [this, file = s.file, &e] { return read(file, e); }, index_.file_path(s.file)});
    }
    return out;
  }

  // A tensor's full value.
  Tensor full(const CheckpointIndex::Entry& e) {
    Tensor t = empty(e.shape, {.dtype = e.dtype});
    assemble_from_pieces(e.key, t, Placement::of_whole(e.shape), pieces(e));
    return t;
  }

 private:
  const CheckpointIndex& index_;
  bool verify_;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> readers_;
};

std::string describe(const CheckpointIndex::Entry& e) {
  return fmt::format("{} {}", safetensors_dtype_name(e.dtype), shape_str(e.shape));
}

}  // namespace

const CheckpointIndex::Entry* CheckpointIndex::find(const std::string& key) const {
  for (auto& e : tensors)
    if (e.key == key) return &e;
  return nullptr;
}

std::string CheckpointIndex::file_path(const std::string& file) const { return (fs::path(dir) / file).string(); }

std::string latest_checkpoint(const std::string& path) {
  if (fs::exists(fs::path(path) / kIndexFile)) return path;
  auto all = complete_checkpoints(path);
  return all.empty() ? std::string() : all.rbegin()->second.string();
}

std::string save_checkpoint(const std::string& dir, nn::Module& model, const nn::Optimizer* opt,
                            const FSDPModule* root, const CheckpointProgress& state, const SaveOptions& options) {
  const Scope sc = scope_of(root);
  const fs::path final_dir = fs::path(dir) / step_dir_name(state.step);
  const fs::path tmp = fs::path(dir) / (".tmp-" + step_dir_name(state.step));
  ShardedStateDict sd;
  std::map<std::string, std::string> aliases;
  on_all_ranks(sc, "saving a checkpoint", [&] {
    WEFT_CHECK(!dir.empty(), "save_checkpoint: the directory is empty");
    WEFT_CHECK(state.step >= 0, "save_checkpoint: step {} is negative", state.step);
    for (auto& [k, t] : sharded_state_dict(model, root)) sd.emplace_back("model." + k, t);
    if (opt)
      for (auto& [k, t] : sharded_optimizer_state_dict(*opt, model, root)) sd.emplace_back("optim." + k, t);
    aliases = tied_parameter_names(model);
    for (auto& [name, target] : state.aliases) {
      bool known = false;
      for (auto& [k, t] : sd) known |= k == "model." + target;
      WEFT_CHECK(known, "save_checkpoint: alias \"{}\" names \"{}\", which is not a parameter or buffer of the model",
                 name, target);
      aliases[name] = target;
    }
    if (sc.lead()) {
      fs::create_directories(dir);
      fs::remove_all(tmp);  // left by a save that crashed
      fs::create_directory(tmp);
    }
  });

  uint64_t bytes = 0;
  std::string sha(64, '0');
  on_all_ranks(sc, fmt::format("writing checkpoint {}", final_dir.string()), [&] {
    if (!sc.writer()) return;
    const std::string file = (tmp / shard_file_name(sc.shard)).string();
    NamedTensors pieces;
    for (auto& [k, t] : sd)
      if (t.placement.whole() ? sc.shard == 0 : t.placement.length > 0) pieces.emplace_back(k, t.local);
    save_safetensors(file, pieces, {{"format", "weft-checkpoint-shard"}, {"shard", std::to_string(sc.shard)},
                                    {"num_shards", std::to_string(sc.num_shards)},
                                    {"step", std::to_string(state.step)}});
    sha = sha256_file(file);
    bytes = fs::file_size(file);
  });

  Tensor records = all_gather(sc, make_record(bytes, keys_fingerprint(sd), sha, default_generator().state()));
  for (int i = 1; i < sc.world(); ++i)
    WEFT_CHECK(records.data<int64_t>()[i * kRecord + 1] == records.data<int64_t>()[1],
               "save_checkpoint: rank {} of the mesh holds other tensors than rank 0 (names, shapes or dtypes differ, "
               "e.g. optimizer state for a shard that never had a gradient); nothing was published", i);

  on_all_ranks(sc, fmt::format("publishing checkpoint {}", final_dir.string()), [&] {
    if (!sc.lead()) return;
    const std::string text = index_json(sd, sc, state, aliases, records).dump(1) + "\n";
    write_file_atomic((tmp / kIndexFile).string(), [&](std::FILE* f) {
      WEFT_CHECK(std::fwrite(text.data(), 1, text.size(), f) == text.size(), "save_checkpoint: writing {} failed",
                 (tmp / kIndexFile).string());
    });
    publish(tmp, final_dir);
    keep_newest(dir, options.keep_last, final_dir);
  });
  return final_dir.string();
}

CheckpointIndex read_checkpoint_index(const std::string& path) {
  std::string where = latest_checkpoint(path);
  WEFT_CHECK(!where.empty(), "checkpoint: no complete checkpoint at '{}' (no {} there and no step_* directory holding "
             "one)", path, kIndexFile);
  IndexReader r{(fs::path(where) / kIndexFile).string()};
  std::string text;
  {
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(r.path.c_str(), "rb"), &std::fclose);
    WEFT_CHECK(f, "checkpoint: cannot open {}: {}", r.path, std::strerror(errno));
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) text.append(buf, n);
  }
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    WEFT_ERROR("checkpoint: {} is not valid JSON: {}", r.path, e.what());
  }
  WEFT_CHECK(j.is_object(), "checkpoint: {} holds a JSON {}, not an object", r.path, j.type_name());
  WEFT_CHECK(r.string(j, "format") == "weft-checkpoint", "checkpoint: {} is a \"{}\" index, not a weft checkpoint",
             r.path, r.string(j, "format"));
  CheckpointIndex ix;
  ix.dir = where;
  ix.format_version = int(r.integer(j, "format_version"));
  WEFT_CHECK(ix.format_version == kFormatVersion, "checkpoint: {} has format_version {}; this weft reads {}", r.path,
             ix.format_version, kFormatVersion);
  ix.weft_version = r.string(j, "weft_version");
  ix.training.step = r.integer(j, "step");
  ix.world_size = int(r.integer(j, "world_size"));
  ix.num_shards = int(r.integer(j, "num_shards"));
  WEFT_CHECK(ix.num_shards >= 1 && ix.world_size >= ix.num_shards, "checkpoint: {}: num_shards {} and world_size {} "
             "do not fit", r.path, ix.num_shards, ix.world_size);
  try {
    const Json& mesh = r.at(j, "mesh");
    ix.mesh_shape = r.at(mesh, "shape", "mesh").get<std::vector<int>>();
    ix.mesh_dim_names = r.at(mesh, "dim_names", "mesh").get<std::vector<std::string>>();
    ix.training.data = r.at(j, "data").get<std::map<std::string, int64_t>>();
    ix.training.app = r.at(j, "app").get<std::map<std::string, std::string>>();
    ix.training.aliases = r.at(j, "aliases").get<std::map<std::string, std::string>>();
    for (const Json& g : r.at(j, "rng")) {
      Generator::State st{};
      auto s = r.at(g, "state", "rng").get<std::vector<uint64_t>>();
      WEFT_CHECK(s.size() == 4, "checkpoint: {}: an rng state has {} words, not 4", r.path, s.size());
      std::copy(s.begin(), s.end(), st.s);
      st.seed = r.at(g, "seed", "rng").get<uint64_t>();
      st.has_spare = r.at(g, "has_spare", "rng").get<bool>();
      st.spare = r.at(g, "spare", "rng").get<double>();
      ix.rng.push_back(st);
    }
  } catch (const Json::exception& e) {
    WEFT_ERROR("checkpoint: {}: mesh, data, app, aliases or rng is malformed: {}", r.path, e.what());
  }
  std::set<std::string> file_names;
  for (const Json& f : r.at(j, "files")) {
    CheckpointIndex::File file{r.string(f, "file", "files"), int(r.integer(f, "shard", "files")),
                               uint64_t(r.integer(f, "bytes", "files")), r.string(f, "sha256", "files")};
    // Only plain names: an index must not point outside its directory.
    WEFT_CHECK(!file.name.empty() && file.name.find('/') == std::string::npos && file.name[0] != '.',
               "checkpoint: {}: file name \"{}\" is not a plain name in the checkpoint directory", r.path, file.name);
    file_names.insert(file.name);
    ix.files.push_back(file);
  }
  const Json& tensors = r.at(j, "tensors");
  WEFT_CHECK(tensors.is_object(), "checkpoint: {}: \"tensors\" is not an object", r.path);
  for (auto& [key, t] : tensors.items()) {
    CheckpointIndex::Entry e;
    e.key = key;
    auto dtype = parse_safetensors_dtype(r.string(t, "dtype", key));
    if (!dtype) r.fail(key, "has dtype " + t["dtype"].dump() + ", which weft does not have");
    e.dtype = *dtype;
    const Json& shape = r.at(t, "shape", key);
    if (!shape.is_array()) r.fail(key, "has shape " + shape.dump() + ", not a list");
    for (const Json& d : shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) r.fail(key, "has shape " + shape.dump());
      e.shape.push_back(d.get<int64_t>());
    }
    std::string placement = r.string(t, "placement", key);
    if (placement != "Replicate()") {
      if (placement.rfind("Shard(", 0) != 0 || placement.back() != ')') r.fail(key, "has placement " + placement);
      try {
        e.shard_dim = std::stoll(placement.substr(6, placement.size() - 7));
      } catch (const std::exception&) {
        r.fail(key, "has placement " + placement);
      }
      if (e.shard_dim < 0 || e.shard_dim >= std::max<int64_t>(1, int64_t(e.shape.size())))
        r.fail(key, "has placement " + placement + " for shape " + shape_str(e.shape));
    }
    const int64_t extent = e.shard_dim < 0 ? 0 : e.shape.empty() ? 1 : e.shape[size_t(e.shard_dim)];
    for (const Json& s : r.at(t, "shards", key)) {
      CheckpointIndex::Shard sh{r.string(s, "file", key + ".shards"), 0, 0};
      if (!file_names.count(sh.file)) r.fail(key, "names file " + sh.file + ", which \"files\" does not list");
      if (e.shard_dim >= 0) {
        sh.offset = r.integer(s, "offset", key + ".shards");
        sh.length = r.integer(s, "length", key + ".shards");
        if (sh.offset < 0 || sh.length < 0 || sh.offset + sh.length > extent)
          r.fail(key, fmt::format("has a piece [{}, {}) outside its extent {}", sh.offset, sh.offset + sh.length,
                                  extent));
      }
      e.shards.push_back(sh);
    }
    ix.tensors.push_back(std::move(e));
  }
  return ix;
}

CheckpointProgress load_checkpoint(const std::string& path, nn::Module& model, nn::Optimizer* opt, const FSDPModule* root,
                              const LoadOptions& options) {
  const Scope sc = scope_of(root);
  CheckpointIndex index;
  std::vector<std::pair<Tensor, Tensor>> model_values;  // (the model's tensor, its new value)
  nn::NamedTensorList optim_state;                      // by position, for opt->load_state_dict
  bool have_optim = false;
  on_all_ranks(sc, "loading a checkpoint", [&] {
    index = read_checkpoint_index(path);
    const std::string index_path = index.file_path(kIndexFile);
    PieceSource source(index, options.verify);
    std::set<std::string> used;
    for (auto& [name, t] : sharded_state_dict(model, root)) {
      const std::string key = "model." + name;
      used.insert(key);
      const CheckpointIndex::Entry* e = index.find(key);
      WEFT_CHECK(e, "checkpoint: {} has no tensor \"{}\" ({} {}): it was saved from another model", index_path, key,
                 dtype_name(t.local.dtype()), shape_str(t.placement.global_shape));
      WEFT_CHECK(e->shape == t.placement.global_shape, "checkpoint: {}: \"{}\" is {} there but {} in this model",
                 index_path, key, describe(*e), shape_str(t.placement.global_shape));
      Tensor value = empty(t.local.shape(), {.dtype = t.local.dtype()});
      assemble_from_pieces(key, value, t.placement, source.pieces(*e));
      model_values.emplace_back(t.local, value);
    }
    auto tied = tied_parameter_names(model);
    for (auto& e : index.tensors)
      WEFT_CHECK(e.key.rfind("model.", 0) != 0 || used.count(e.key) || tied.count(e.key.substr(6)),
                 "checkpoint: {} holds \"{}\" ({}), which this model does not have: it was saved from another model",
                 index_path, e.key, describe(e));
    if (!opt) return;
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
      named.emplace_back(key, value);
    }
    have_optim = !named.empty();
    optim_state = position_optimizer_state(named, optimizer_param_names(*opt, model));
  });

  // The optimizer first: its own checks (groups, options) may still fail on some rank, and
  // then every rank puts back what it had.
  if (opt && have_optim) {
    nn::NamedTensorList before = opt->state_dict();
    std::exception_ptr error;
    try {
      opt->load_state_dict(optim_state);
    } catch (const Error& e) {
      error = std::make_exception_ptr(Error(fmt::format("checkpoint: {}: the optimizer state does not fit this "
                                                        "optimizer: {}", index.dir, e.what())));
    }
    try {
      agree(sc, error, "loading the optimizer state");
    } catch (...) {
      if (!error) opt->load_state_dict(before);
      throw;
    }
  }
  NoGradGuard no_grad;
  for (auto& [live, value] : model_values) copy_elements(live, value);
  if (options.restore_rng && !index.rng.empty())
    default_generator().set_state(index.rng[size_t(sc.linear()) < index.rng.size() ? size_t(sc.linear()) : 0]);
  return index.training;
}

VerifyReport verify_checkpoint(const std::string& path) {
  CheckpointIndex index = read_checkpoint_index(path);
  PieceSource source(index, false);
  VerifyReport report;
  std::map<std::string, std::set<std::string>> unlisted;  // file -> tensors no index entry claimed yet
  for (auto& f : index.files) {
    source.check_file(f);
    for (auto& e : source.open(f.name).entries()) unlisted[f.name].insert(e.name);
    ++report.files;
    report.bytes += f.bytes;
  }
  for (auto& e : index.tensors) {
    // The pieces must tile the tensor: sorted by offset, each starting where the last ended.
    std::vector<CheckpointIndex::Shard> shards = e.shards;
    std::sort(shards.begin(), shards.end(), [](auto& a, auto& b) { return a.offset < b.offset; });
    const int64_t extent = e.shard_dim < 0 ? 0 : e.shape.empty() ? 1 : e.shape[size_t(e.shard_dim)];
    int64_t end = 0;
    for (auto& s : shards) {
      WEFT_CHECK(e.shard_dim >= 0 || shards.size() == 1, "checkpoint: {}: the replicated tensor \"{}\" has {} pieces",
                 index.dir, e.key, shards.size());
      WEFT_CHECK(e.shard_dim < 0 || s.offset == end, "checkpoint: {}: the pieces of \"{}\" {} at index {} of dim {}",
                 index.dir, e.key, s.offset < end ? "overlap" : "leave a gap", end, e.shard_dim);
      end = s.offset + s.length;
      Placement pl = e.shard_dim < 0 ? Placement::of_whole(e.shape) : Placement{e.shape, e.shard_dim, s.offset, s.length};
      const SafetensorsEntry* se = source.open(s.file).find(e.key);
      WEFT_CHECK(se, "checkpoint: {} has no tensor \"{}\" although the index lists a piece of it there",
                 index.file_path(s.file), e.key);
      WEFT_CHECK(se->dtype == e.dtype && se->shape == pl.local_shape(), "checkpoint: {}: \"{}\" is {} {} but the "
                 "index needs {} {} ({})", index.file_path(s.file), e.key, safetensors_dtype_name(se->dtype),
                 shape_str(se->shape), safetensors_dtype_name(e.dtype), shape_str(pl.local_shape()), pl.str());
      unlisted[s.file].erase(e.key);
    }
    WEFT_CHECK(!shards.empty() && (e.shard_dim < 0 || end == extent), "checkpoint: {}: the pieces of \"{}\" cover {} "
               "of the {} indices of dim {}", index.dir, e.key, end, extent, e.shard_dim);
    ++report.tensors;
  }
  for (auto& [file, names] : unlisted)
    WEFT_CHECK(names.empty(), "checkpoint: {} holds \"{}\", which the index does not list", index.file_path(file),
               names.empty() ? "" : *names.begin());
  return report;
}

void consolidate_checkpoint(const std::string& path, const std::string& out, bool with_optimizer) {
  CheckpointIndex index = read_checkpoint_index(path);
  PieceSource source(index, true);
  std::vector<SafetensorsEntry> entries;
  std::vector<const CheckpointIndex::Entry*> from;
  for (auto& e : index.tensors) {
    bool model = e.key.rfind("model.", 0) == 0;
    if (!model && !with_optimizer) continue;
    entries.push_back({model ? e.key.substr(6) : e.key, e.dtype, e.shape});
    from.push_back(&e);
  }
  for (auto& [name, target] : index.training.aliases) {
    const CheckpointIndex::Entry* e = index.find("model." + target);
    WEFT_CHECK(e, "checkpoint: {}: alias \"{}\" names \"{}\", which the checkpoint does not hold", index.dir, name,
               target);
    entries.push_back({name, e->dtype, e->shape});
    from.push_back(e);
  }
  Metadata meta(index.training.app.begin(), index.training.app.end());
  meta["step"] = std::to_string(index.training.step);
  meta["weft_version"] = index.weft_version;
  save_safetensors(out, entries, [&](size_t i) { return source.full(*from[i]); }, meta);
}

}  // namespace weft::fsdp
