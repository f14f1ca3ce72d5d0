#include "fsdp/checkpoint_index.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "core/safetensors.h"

namespace weft::fsdp {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

std::string placement_name(int64_t dim) { return dim < 0 ? "Replicate()" : fmt::format("Shard({})", dim); }

// Reads fields of index.json, naming the file and the key of anything missing or mistyped.
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
  // An integer in [lo, hi] (one past int64's range, which get<int64_t> would wrap, is refused too).
  int64_t integer(const Json& obj, const std::string& key, const std::string& where = "",
                  int64_t lo = std::numeric_limits<int64_t>::min(), int64_t hi = std::numeric_limits<int64_t>::max()) const {
    const Json& v = at(obj, key, where);
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi)) || v.get<int64_t>() < lo ||
        v.get<int64_t>() > hi)
      fail(where.empty() ? key : where + "." + key, fmt::format("is {}, not an integer from {} to {}", v.dump(), lo, hi));
    return v.get<int64_t>();
  }
  std::string string(const Json& obj, const std::string& key, const std::string& where = "") const {
    const Json& v = at(obj, key, where);
    if (!v.is_string()) fail(where.empty() ? key : where + "." + key, "is " + v.dump() + ", not a string");
    return v.get<std::string>();
  }
  // nlohmann's get<integer type>() casts a float, undefined beyond the type's range: integers only.
  const Json& integral(const Json& v, const std::string& key) const {
    if (v.is_number_float()) fail(key, "holds " + v.dump() + ", not an integer");
    if (v.is_structured())
      for (const Json& x : v) integral(x, key);
    return v;
  }
};

// The index file's JSON object. A FIFO would block fopen for ever, a device (/dev/zero) never
// ends: only a regular file is read, and only up to a bound.
Json read_index_json(const std::string& path) {
  constexpr uintmax_t kMaxIndexBytes = uintmax_t(256) << 20;
  std::error_code ec;
  WEFT_CHECK(fs::is_regular_file(path, ec), "checkpoint: {} is not a regular file (a FIFO or device?)", path);
  const uintmax_t size = fs::file_size(path, ec);
  WEFT_CHECK(!ec && size <= kMaxIndexBytes, "checkpoint: {} is {} bytes, more than the limit of {} bytes", path, size,
             kMaxIndexBytes);
  std::string text;
  {
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    WEFT_CHECK(f, "checkpoint: cannot open {}: {}", path, std::strerror(errno));
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) text.append(buf, n);
  }
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    WEFT_ERROR("checkpoint: {} is not valid JSON: {}", path, e.what());
  }
  WEFT_CHECK(j.is_object(), "checkpoint: {} holds a JSON {}, not an object", path, j.type_name());
  return j;
}

// An entry's "split": {"dim", "chunks", "parts"}, checked against its shape.
tp::Split read_split(const IndexReader& r, const std::string& key, const Json& s, const Shape& shape) {
  tp::Split split{r.integer(s, "dim", key + ".split"), r.integer(s, "chunks", key + ".split"),
                  r.integer(s, "parts", key + ".split"), 0};
  if (split.dim < 0 || split.dim >= int64_t(shape.size()) || split.chunks < 1 || split.parts < 1 ||
      shape[size_t(split.dim)] % (split.chunks * split.parts) != 0)
    r.fail(key, "has split " + s.dump() + " for shape " + shape_str(shape));
  return split;
}

// The pieces of `e` must tile each part (the tensor, unless split) along the shard dim, `extent` long, each starting
// where the last ended (overlaps and gaps can sum to a tiling's size), in the order of their files' shards, as
// written (pieces whose offsets were swapped tile too); a replicated tensor has one piece a part.
void check_tiling(const IndexReader& r, const CheckpointIndex::Entry& e, int64_t extent,
                  const std::map<std::string, int>& file_shards) {
  std::vector<CheckpointIndex::Shard> shards = e.shards;
  std::sort(shards.begin(), shards.end(), [](auto& a, auto& b) { return std::tie(a.part, a.offset) < std::tie(b.part, b.offset); });
  if (e.shard_dim >= 0 && extent == 0 && shards.empty()) return;  // no indices, no pieces (as written)
  auto covers = [&](int64_t end, int64_t part) {
    return fmt::format("has pieces that cover {} of the {} indices of dim {}{}", end, extent, e.shard_dim,
                       e.split.split() ? fmt::format(" of part {} of {}", part, e.split.parts) : "");
  };
  if (e.shard_dim < 0 && shards.size() != size_t(e.split.parts))
    r.fail(e.key, fmt::format("is replicated but has {} pieces for {} part(s)", shards.size(), e.split.parts));
  int64_t end = 0, part = 0, last = -1;  // last: the shard of the piece before
  for (const auto& s : shards) {
    if (s.part != part) {  // the next part begins
      if (s.part != part + 1 || (e.shard_dim >= 0 && end != extent)) r.fail(e.key, covers(end, part));
      part = s.part, end = 0, last = -1;
    }
    if (e.shard_dim >= 0 && s.offset != end)
      r.fail(e.key, fmt::format("has pieces that {} at index {} of dim {}", s.offset < end ? "overlap" : "leave a gap", end, e.shard_dim));
    if (e.shard_dim >= 0 && file_shards.at(s.file) <= last)
      r.fail(e.key, fmt::format("has its piece at index {} of dim {} in {}, a file before the previous piece's: the "
                                "pieces are out of their shards' order", s.offset, e.shard_dim, s.file));
    end = s.offset + s.length, last = file_shards.at(s.file);
  }
  if (shards.empty() || part + 1 != e.split.parts || (e.shard_dim >= 0 && end != extent)) r.fail(e.key, covers(end, part));
}

// The entry of tensor `key` in "tensors"; its shards may only name files in `file_names`.
CheckpointIndex::Entry read_entry(const IndexReader& r, const std::string& key, const Json& t,
                                  const std::map<std::string, int>& file_names) {
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
  if (t.contains("split")) e.split = read_split(r, key, r.at(t, "split", key), e.shape);
  const int64_t extent = e.shard_dim < 0 ? 0 : e.shape.empty() ? 1  // along the shard dim of one part
                         : Placement{e.shape, -1, 0, 0, e.split}.local_shape()[size_t(e.shard_dim)];
  for (const Json& s : r.at(t, "shards", key)) {
    CheckpointIndex::Shard sh{r.string(s, "file", key + ".shards"), 0, 0};
    if (!file_names.count(sh.file)) r.fail(key, "names file " + sh.file + ", which \"files\" does not list");
    if (e.split.split()) sh.part = r.integer(s, "part", key + ".shards");
    if (sh.part < 0 || sh.part >= e.split.parts) r.fail(key, fmt::format("has a piece of part {} of {}", sh.part,
                                                                         e.split.parts));
    if (e.shard_dim >= 0) {
      sh.offset = r.integer(s, "offset", key + ".shards");
      sh.length = r.integer(s, "length", key + ".shards");
      if (sh.offset < 0 || sh.length < 0 || sh.offset > extent || sh.length > extent - sh.offset)
        r.fail(key, fmt::format("has a piece of length {} at {} outside its extent {}", sh.length, sh.offset, extent));
    }
    e.shards.push_back(sh);
  }
  check_tiling(r, e, extent, file_names);
  return e;
}

}  // namespace

std::string checkpoint_shard_file(int shard) { return fmt::format("rank_{:05d}.safetensors", shard); }

std::string describe(const CheckpointIndex::Entry& e) {
  return fmt::format("{} {}", safetensors_dtype_name(e.dtype), shape_str(e.shape));
}

const CheckpointIndex::Entry* CheckpointIndex::find(const std::string& key) const {
  for (auto& e : tensors)
    if (e.key == key) return &e;
  return nullptr;
}

Placement CheckpointIndex::Entry::placement(const Shard& s) const {
  tp::Split part = split;
  part.index = s.part;
  if (shard_dim < 0) return {shape, -1, 0, 0, part};
  return {shape, shard_dim, s.offset, s.length, part};
}

std::string CheckpointIndex::file_path(const std::string& file) const { return (fs::path(dir) / file).string(); }

void check_recordable(const CheckpointProgress& state) {
  auto check = [](const std::string& what, const std::string& text) {
    try {
      (void)Json(text).dump();
    } catch (const Json::type_error&) {
      WEFT_ERROR("checkpoint: {} is not UTF-8 text ({}), and index.json records it as JSON text: rename it", what,
                 Json(text).dump(-1, ' ', true, Json::error_handler_t::replace));
    }
  };
  for (const auto& [k, v] : state.app) check("a description's key", k), check("the description's " + k, v);
  for (const auto& [k, v] : state.aliases) check("an alias", k), check("the alias " + k, v);
  for (const auto& [k, v] : state.data) check("a data position's name", k);
  check("the run", state.run);
}

std::string checkpoint_index_json(const CheckpointIndex& ix) {
  Json j = {{"format", "weft-checkpoint"}, {"format_version", ix.format_version}, {"weft_version", ix.weft_version},
            {"step", ix.training.step}};
  // JSON has no NaN or infinity: a non-finite loss is the string "nan" (either sign), "inf" or "-inf".
  if (const auto& l = ix.training.loss)
    j["loss"] = std::isfinite(*l) ? Json(*l) : Json(std::isnan(*l) ? "nan" : *l > 0 ? "inf" : "-inf");
  if (!ix.training.run.empty()) j["run"] = ix.training.run;
  j["world_size"] = ix.world_size;
  j["num_shards"] = ix.num_shards;
  j["mesh"] = {{"shape", ix.mesh_shape}, {"dim_names", ix.mesh_dim_names}};
  j["data"] = ix.training.data;
  j["app"] = ix.training.app;
  j["aliases"] = ix.training.aliases;
  Json rng = Json::array();
  for (size_t i = 0; i < ix.rng.size(); ++i) {
    const Generator::State& g = ix.rng[i];
    rng.push_back({{"rank", i}, {"seed", g.seed}, {"offset", g.offset}});
  }
  j["rng"] = rng;
  Json files = Json::array();
  for (auto& f : ix.files)
    files.push_back({{"file", f.name}, {"shard", f.shard}, {"bytes", f.bytes}, {"sha256", f.sha256}});
  j["files"] = files;
  Json tensors = Json::object();
  for (auto& e : ix.tensors) {
    Json shards = Json::array();
    for (auto& s : e.shards) {
      Json piece = {{"file", s.file}};
      if (e.shard_dim >= 0) piece.update({{"offset", s.offset}, {"length", s.length}});
      if (e.split.split()) piece["part"] = s.part;
      shards.push_back(piece);
    }
    tensors[e.key] = {{"dtype", safetensors_dtype_name(e.dtype)}, {"shape", e.shape},
                      {"placement", placement_name(e.shard_dim)}, {"shards", shards}};
    if (e.split.split())
      tensors[e.key]["split"] = {{"dim", e.split.dim}, {"chunks", e.split.chunks}, {"parts", e.split.parts}};
  }
  j["tensors"] = tensors;
  return j.dump(1) + "\n";
}

CheckpointIndex read_checkpoint_index(const std::string& path) {
  std::vector<std::string> unreadable;
  std::string where = latest_checkpoint(path, &unreadable);
  WEFT_CHECK(!where.empty() || unreadable.empty(), "{}", unreadable.front());  // none reads: the newest's error
  WEFT_CHECK(!where.empty(), "checkpoint: no complete checkpoint at '{}' ({})", path,
             fs::path(path).filename() == kCheckpointIndexFile ? "the index itself: pass its directory, " +
             fs::path(path).parent_path().string() : fmt::format("no {} there and no step_* directory holding one",
                                                                 kCheckpointIndexFile));
  IndexReader r{(fs::path(where) / kCheckpointIndexFile).string()};
  const Json j = read_index_json(r.path);
  WEFT_CHECK(r.string(j, "format") == "weft-checkpoint", "checkpoint: {} is a \"{}\" index, not a weft checkpoint",
             r.path, r.string(j, "format"));
  CheckpointIndex ix;
  ix.dir = where;
  constexpr int64_t kInt = std::numeric_limits<int>::max();
  ix.format_version = int(r.integer(j, "format_version", "", 0, kInt));
  WEFT_CHECK(ix.format_version == 2 || ix.format_version == kCheckpointFormatVersion, "checkpoint: {} has "
             "format_version {}; this weft reads 2 and {}", r.path, ix.format_version, kCheckpointFormatVersion);
  ix.weft_version = r.string(j, "weft_version");
  ix.training.step = r.integer(j, "step", "", 0);
  if (auto it = j.find("loss"); it != j.end()) {  // absent: no loss was recorded
    if (it->is_number()) ix.training.loss = it->get<double>();
    else if (*it == "nan" || *it == "inf" || *it == "-inf") ix.training.loss = std::stod(it->get<std::string>());
    else r.fail("loss", "is " + it->dump() + ", not a number, \"nan\", \"inf\" or \"-inf\"");
  }
  if (j.contains("run")) ix.training.run = r.string(j, "run");  // absent: written without a run identity
  ix.world_size = int(r.integer(j, "world_size", "", 1, kInt));
  ix.num_shards = int(r.integer(j, "num_shards", "", 1, kInt));
  WEFT_CHECK(ix.num_shards >= 1 && ix.world_size >= ix.num_shards, "checkpoint: {}: num_shards {} and world_size {} "
             "do not fit", r.path, ix.num_shards, ix.world_size);
  try {
    const Json& mesh = r.at(j, "mesh");
    ix.mesh_shape = r.integral(r.at(mesh, "shape", "mesh"), "mesh.shape").get<std::vector<int>>();
    ix.mesh_dim_names = r.at(mesh, "dim_names", "mesh").get<std::vector<std::string>>();
    ix.training.data = r.integral(r.at(j, "data"), "data").get<std::map<std::string, int64_t>>();
    ix.training.app = r.at(j, "app").get<std::map<std::string, std::string>>();
    ix.training.aliases = r.at(j, "aliases").get<std::map<std::string, std::string>>();
    for (const Json& g : r.at(j, "rng")) {
      if (g.contains("rank") && r.integer(g, "rank", "rng") != int64_t(ix.rng.size()))
        r.fail("rng", fmt::format("holds the state of rank {} at position {} (one a rank, in rank order)", g["rank"].dump(),
                                  ix.rng.size()));
      Generator::State st{};
      for (auto [key, field] : {std::pair{"seed", &st.seed}, {"offset", &st.offset}})  // get<uint64_t> wraps -5
        if (const Json& v = r.integral(r.at(g, key, "rng"), std::string("rng.") + key); v.is_number_unsigned()) *field = v;
        else r.fail(std::string("rng.") + key, "is " + v.dump() + ", not an integer from 0 to 2^64 - 1");
      ix.rng.push_back(st);
    }
  } catch (const Json::exception& e) {
    WEFT_ERROR("checkpoint: {}: mesh, data, app, aliases or rng is malformed: {}", r.path, e.what());
  }
  std::map<std::string, int> file_names;  // a file's shard
  for (const Json& f : r.at(j, "files")) {
    CheckpointIndex::File file{r.string(f, "file", "files"), int(r.integer(f, "shard", "files", 0, ix.num_shards - 1)),
                               uint64_t(r.integer(f, "bytes", "files", 0)), r.string(f, "sha256", "files")};
    if (size_t(file.shard) != ix.files.size())
      r.fail("files", fmt::format("lists shard {} at position {} (one file a shard, in shard order)", file.shard,
                                  ix.files.size()));
    // Only plain names: an index must not point outside its directory.
    WEFT_CHECK(!file.name.empty() && file.name.find('/') == std::string::npos && file.name[0] != '.',
               "checkpoint: {}: file name \"{}\" is not a plain name in the checkpoint directory", r.path, file.name);
    file_names.emplace(file.name, file.shard);
    ix.files.push_back(file);
  }
  if (ix.files.size() != size_t(ix.num_shards))
    r.fail("files", fmt::format("lists {} files for {} shards", ix.files.size(), ix.num_shards));
  if (ix.rng.size() != size_t(ix.world_size))  // a resumed run would draw other random numbers than the one that wrote it
    r.fail("rng", fmt::format("holds {} generator states for world_size {} (one a rank)", ix.rng.size(), ix.world_size));
  for (const auto& [key, at] : ix.training.data) if (at < 0) r.fail("data", fmt::format("{} is {}, not a count", key, at));
  const Json& tensors = r.at(j, "tensors");
  WEFT_CHECK(tensors.is_object(), "checkpoint: {}: \"tensors\" is not an object", r.path);
  for (auto& [key, t] : tensors.items()) ix.tensors.push_back(read_entry(r, key, t, file_names));
  for (const auto& [k, v] : ix.training.app)  // a NUL would cut the messages that quote the field short
    if ((k + v).find('\0') != std::string::npos) r.fail("app", fmt::format("{} holds a NUL character", Json(k).dump()));
  for (const auto& [name, target] : ix.training.aliases)  // a consolidated file holds each name once, every alias a copy
    if (!ix.find("model." + target) || ix.find("model." + name))
      r.fail("aliases", fmt::format("{} names {}: an alias names a tensor the checkpoint holds, and is not one itself",
                                    Json(name).dump(), Json(target).dump()));
  return ix;
}

}  // namespace weft::fsdp
