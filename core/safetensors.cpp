#include "core/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "core/atomic_file.h"
#include "core/element_search.h"

namespace weft {
namespace {

// Tensor bytes go between memory and the file as they are.
static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; weft would need to byte-swap on this host");

using Json = nlohmann::ordered_json;  // keeps the header's key order

// The reference reader's limit; a larger header means a corrupt or foreign file.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

constexpr std::pair<DType, const char*> kDTypeNames[] = {
    {DType::f32, "F32"}, {DType::f64, "F64"}, {DType::bf16, "BF16"}, {DType::f16, "F16"},
    {DType::i64, "I64"}, {DType::i32, "I32"}, {DType::u8, "U8"},     {DType::bool_, "BOOL"}};

// ---- reading

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;  // byte range within the data section
};

struct Header {
  std::vector<Entry> entries;  // sorted by data offset
  Metadata metadata;
  uint64_t data_size = 0;      // bytes after the header
};

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

class InFile {
  // fopen of a FIFO blocks until a writer comes, and a device never ends: only regular files
  // (or what a symlink names) are opened.
  static std::FILE* open_regular(const std::string& path) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0)
      WEFT_CHECK(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode),
                 "safetensors: '{}' is not a regular file (a FIFO, socket or device?)", path);
    return std::fopen(path.c_str(), "rb");
  }

 public:
  explicit InFile(const std::string& path) : path_(path), f_(open_regular(path)) {
    WEFT_CHECK(f_, "safetensors: cannot open '{}': {}", path, std::strerror(errno));
    struct stat st;
    WEFT_CHECK(::fstat(::fileno(f_.get()), &st) == 0, "safetensors: cannot stat '{}': {}", path, std::strerror(errno));
    WEFT_CHECK(!S_ISDIR(st.st_mode), "safetensors: '{}' is a directory, not a file", path);
    size_ = uint64_t(st.st_size);
  }
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }

  void seek(uint64_t pos) {
    WEFT_CHECK(::fseeko(f_.get(), off_t(pos), SEEK_SET) == 0, "safetensors: seeking in '{}' failed: {}", path_,
               std::strerror(errno));
  }
  void read(void* dst, size_t n, const std::string& what) {
    if (std::fread(dst, 1, n, f_.get()) == n) return;
    WEFT_CHECK(!std::ferror(f_.get()), "safetensors: reading {} from '{}' failed: {}", what, path_,
               std::strerror(errno));
    WEFT_ERROR("safetensors: '{}' ended while reading {} (did it change while being read?)", path_, what);
  }

 private:
  std::string path_;
  std::unique_ptr<std::FILE, FileCloser> f_;
  uint64_t size_ = 0;
};

// A JSON integer >= 0 that fits in int64 (nlohmann keeps larger ones unsigned; the cast to
// int64 turns those negative, so one test covers both).
bool is_count(const Json& j) { return j.is_number_integer() && j.get<int64_t>() >= 0; }

// Parses one tensor's entry and checks it against itself and the data section's size.
Entry parse_entry(const std::string& path, const std::string& name, const Json& v,
                  uint64_t data_size) {
  WEFT_CHECK(v.is_object(), "safetensors: '{}': entry '{}' is a JSON {}, not an object with "
             "dtype, shape and data_offsets", path, name, v.type_name());
  auto field = [&](const char* key) -> const Json& {
    auto it = v.find(key);
    WEFT_CHECK(it != v.end(), "safetensors: '{}': tensor '{}' has no \"{}\"", path, name, key);
    return *it;
  };
  const Json& jdtype = field("dtype");
  const Json& jshape = field("shape");
  const Json& joffsets = field("data_offsets");

  WEFT_CHECK(jdtype.is_string(), "safetensors: '{}': tensor '{}' has dtype {}, not a string",
             path, name, jdtype.dump());
  std::optional<DType> dtype = parse_safetensors_dtype(jdtype.get<std::string>());
  WEFT_CHECK(dtype, "safetensors: '{}': tensor '{}' has unknown or unsupported dtype {} (weft "
             "reads F32 F64 BF16 F16 I64 I32 U8 BOOL)", path, name, jdtype.dump());

  bool shape_ok = jshape.is_array() && std::all_of(jshape.begin(), jshape.end(), is_count);
  WEFT_CHECK(shape_ok, "safetensors: '{}': tensor '{}' has shape {}; a shape must be a list of "
             "non-negative integers", path, name, jshape.dump());
  Shape shape;
  uint64_t nbytes = dtype_size(*dtype);
  bool overflow = false;
  for (const Json& d : jshape) {
    shape.push_back(d.get<int64_t>());
    overflow |= __builtin_mul_overflow(nbytes, uint64_t(shape.back()), &nbytes);
  }
  WEFT_CHECK(!overflow, "safetensors: '{}': tensor '{}' has shape {}, too large to address", path, name, jshape.dump());

  bool offsets_ok = joffsets.is_array() && joffsets.size() == 2 && is_count(joffsets[0]) && is_count(joffsets[1]);
  WEFT_CHECK(offsets_ok, "safetensors: '{}': tensor '{}' has data_offsets {}; they must be "
             "[begin, end], two non-negative integers", path, name, joffsets.dump());
  uint64_t begin = joffsets[0].get<uint64_t>(), end = joffsets[1].get<uint64_t>();
  WEFT_CHECK(begin <= end, "safetensors: '{}': tensor '{}' has data_offsets [{}, {}], which end "
             "before they begin", path, name, begin, end);
  WEFT_CHECK(end <= data_size, "safetensors: '{}': tensor '{}' has data_offsets [{}, {}], past the "
             "end of the data section ({} bytes; is the file truncated?)", path, name, begin, end, data_size);
  WEFT_CHECK(end - begin == nbytes, "safetensors: '{}': tensor '{}' ({} {}) needs {} bytes but "
             "its data_offsets [{}, {}] hold {}", path, name, jdtype.get<std::string>(),
             shape_str(shape), nbytes, begin, end, end - begin);
  return {name, *dtype, std::move(shape), begin, end};
}

// Reads and validates the header; leaves the file positioned at the start of the data.
Header read_header(InFile& in) {
  const std::string& path = in.path();
  WEFT_CHECK(in.size() >= 8, "safetensors: '{}' is {} bytes long, too short for the 8-byte header "
             "length; not a safetensors file", path, in.size());
  unsigned char len_bytes[8];
  in.read(len_bytes, 8, "the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | len_bytes[i];
  WEFT_CHECK(n <= kMaxHeaderBytes, "safetensors: '{}': header length {} is larger than the limit "
             "of {} bytes; not a safetensors file, or a corrupt one", path, n, kMaxHeaderBytes);
  WEFT_CHECK(n <= in.size() - 8, "safetensors: '{}': header length {} is larger than the file "
             "({} bytes); truncated or not a safetensors file", path, n, in.size());
  std::string text(n, '\0');
  in.read(text.data(), n, "the header");

  // nlohmann keeps the last of two equal keys, so a tensor named twice would hide the other: refused.
  std::vector<std::pair<std::string, std::set<std::string>>> open;  // objects being parsed: name, keys so far
  std::string key = "the header";
  auto unique_keys = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) open.push_back({open.empty() ? key : "'" + key + "'", {}});
    if (event == Json::parse_event_t::object_end) open.pop_back();
    WEFT_CHECK(event != Json::parse_event_t::key || open.back().second.insert(key = parsed.get<std::string>()).second,
               "safetensors: '{}': {} has key '{}' twice; keys must be unique", path, open.back().first, key);
    return true;
  };
  Json j;
  try {
    j = Json::parse(text, unique_keys);
  } catch (const Json::exception& e) {
    WEFT_ERROR("safetensors: '{}': header is not valid JSON: {}", path, e.what());
  }
  WEFT_CHECK(j.is_object(), "safetensors: '{}': header is a JSON {}, not an object", path, j.type_name());

  Header h;
  uint64_t data_size = h.data_size = in.size() - 8 - n;
  for (const auto& [name, v] : j.items()) {
    if (name != "__metadata__") {
      h.entries.push_back(parse_entry(path, name, v, data_size));
      continue;
    }
    if (v.is_null()) continue;
    WEFT_CHECK(v.is_object(), "safetensors: '{}': __metadata__ is a JSON {}, not an object of "
               "strings", path, v.type_name());
    for (const auto& [key, value] : v.items()) {
      WEFT_CHECK(value.is_string(), "safetensors: '{}': __metadata__ entry '{}' is {}, not a "
                 "string", path, key, value.dump());
      h.metadata[key] = value.get<std::string>();
    }
  }

  // The tensors must tile the data section exactly, as the reference reader demands: no
  // overlap (two tensors aliasing bytes), no gap, nothing after the last one.
  std::stable_sort(h.entries.begin(), h.entries.end(), [](const Entry& a, const Entry& b) {
    return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
  });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : h.entries) {
    WEFT_CHECK(e.begin >= pos, "safetensors: '{}': tensor '{}' (bytes [{}, {})) overlaps tensor "
               "'{}' (bytes [{}, {}))", path, e.name, e.begin, e.end, prev->name, prev->begin, prev->end);
    WEFT_CHECK(e.begin == pos, "safetensors: '{}': {} unused bytes before tensor '{}' (bytes "
               "[{}, {})); tensor data must be contiguous", path, e.begin - pos, e.name, e.begin, e.end);
    pos = e.end;
    prev = &e;
  }
  WEFT_CHECK(pos == data_size, "safetensors: '{}': data section is {} bytes but the tensors end "
             "at byte {}: {} trailing bytes", path, data_size, pos, data_size - pos);
  return h;
}

// ---- writing

void write_bytes(std::FILE* f, const void* data, size_t n, const std::string& path) {
  WEFT_CHECK(std::fwrite(data, 1, n, f) == n, "save_safetensors: writing '{}' failed: {}", path, std::strerror(errno));
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  for (auto& [d, name] : kDTypeNames)
    if (d == dtype) return name;
  WEFT_ERROR("safetensors: dtype {} has no safetensors name", dtype_name(dtype));
}

std::optional<DType> parse_safetensors_dtype(const std::string& name) {
  for (auto& [d, n] : kDTypeNames)
    if (name == n) return d;
  return std::nullopt;
}

void save_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                      const std::function<Tensor(size_t)>& produce, const Metadata& metadata, bool replace) {
  // Check everything and build the header before the file is touched.
  WEFT_CHECK(produce || entries.empty(), "save_safetensors: '{}': no function to produce the tensors", path);
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const SafetensorsEntry& e = entries[i];
    WEFT_CHECK(!e.name.empty(), "save_safetensors: '{}': tensor #{} has an empty name", path, i);
    WEFT_CHECK(e.name != "__metadata__", "save_safetensors: '{}': tensor #{} is named "
               "'__metadata__', which the format reserves", path, i);
    WEFT_CHECK(seen.insert(e.name).second, "save_safetensors: '{}': tensor name '{}' appears more "
               "than once (again as #{})", path, e.name, i);
    uint64_t nbytes = uint64_t(shape_numel(e.shape)) * dtype_size(e.dtype);
    Json entry = Json::object();
    entry["dtype"] = safetensors_dtype_name(e.dtype);
    entry["shape"] = e.shape;
    entry["data_offsets"] = Json::array({offset, offset + nbytes});
    header[e.name] = std::move(entry);
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const Json::exception& e) {
    WEFT_ERROR("save_safetensors: '{}': a tensor name or metadata string is not valid UTF-8 ({})", path, e.what());
  }
  // Trailing spaces are valid JSON and make the data start 8-byte aligned, so a reader that
  // maps the file can use the tensors in place.
  text.append((8 - text.size() % 8) % 8, ' ');

  write_file_atomic(path, [&](std::FILE* f) {
    unsigned char len_bytes[8];
    for (int i = 0; i < 8; ++i) len_bytes[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
    write_bytes(f, len_bytes, 8, path);
    write_bytes(f, text.data(), text.size(), path);
    // One tensor at a time, so a GPU model needs host memory for its largest tensor only.
    for (size_t i = 0; i < entries.size(); ++i) {
      const SafetensorsEntry& e = entries[i];
      Tensor t;
      try {
        t = produce(i);
        WEFT_CHECK(t.defined() && t.dtype() == e.dtype && t.shape() == e.shape,
                   "expected {} {}, got {}", dtype_name(e.dtype), shape_str(e.shape),
                   t.defined() ? tensor_desc(t) : std::string("an undefined tensor"));
        if (t.numel() == 0) continue;
        Tensor c = t.detach();
        if (!c.device().is_cpu()) c = c.to(Device::cpu());
        c = c.contiguous();
        write_bytes(f, c.data_ptr(), c.nbytes(), path);
      } catch (const Error& err) {
        WEFT_ERROR("save_safetensors: '{}': cannot write tensor '{}'{}; the file was left as "
                   "it was: {}", path, e.name, t.defined() ? " (" + tensor_desc(t) + ")" : "", err.what());
      }
    }
  }, replace);
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const Metadata& metadata) {
  std::vector<SafetensorsEntry> entries;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    WEFT_CHECK(t.defined(), "save_safetensors: '{}': tensor '{}' is undefined", path, name);
    entries.push_back({name, t.dtype(), t.shape()});
  }
  save_safetensors(path, entries, [&](size_t i) { return tensors[i].second; }, metadata);
}

struct SafetensorsReader::Impl {
  Impl(const std::string& path, bool refuse) : in(path), refuse_nonfinite(refuse) {
    header = read_header(in);
    for (const Entry& e : header.entries) {
      by_name[e.name] = public_entries.size();
      public_entries.push_back({e.name, e.dtype, e.shape});
    }
  }
  InFile in;
  Header header;
  std::vector<SafetensorsEntry> public_entries;
  std::map<std::string, size_t> by_name;
  bool refuse_nonfinite;

  // `piece` holds elements [first, first + numel) (flat) of tensor `name`, as just read: a bool must be
  // 0 or 1 (another byte in a C++ bool is undefined behaviour); NaN and infinity only when refused.
  void check_values(const Tensor& piece, const std::string& name, int64_t first) const {
    if (const auto* p = piece.dtype() == DType::bool_ ? static_cast<const uint8_t*>(piece.data_ptr()) : nullptr) {
      const int64_t bad = std::find_if(p, p + piece.numel(), [](uint8_t b) { return b > 1; }) - p;
      WEFT_CHECK(bad == piece.numel(), "safetensors: '{}': bool tensor '{}' holds byte {} at index {}, not 0 or 1 "
                 "(refused)", in.path(), name, p[bad], first + bad);
    }
    if (!refuse_nonfinite) return;
    if (auto bad = find_nonfinite(piece))
      WEFT_ERROR("safetensors: '{}': tensor '{}' holds {} (not finite: refused)", in.path(), name,
                 FoundElement{first + bad->index, bad->value}.str());
  }
};

SafetensorsReader::SafetensorsReader(const std::string& path, bool refuse_nonfinite)
    : impl_(std::make_unique<Impl>(path, refuse_nonfinite)) {}
SafetensorsReader::~SafetensorsReader() = default;
SafetensorsReader::SafetensorsReader(SafetensorsReader&&) noexcept = default;
const std::string& SafetensorsReader::path() const { return impl_->in.path(); }
const Metadata& SafetensorsReader::metadata() const { return impl_->header.metadata; }
const std::vector<SafetensorsEntry>& SafetensorsReader::entries() const { return impl_->public_entries; }

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  auto it = impl_->by_name.find(name);
  return it == impl_->by_name.end() ? nullptr : &impl_->public_entries[it->second];
}

Tensor SafetensorsReader::read(const std::string& name) {
  const SafetensorsEntry* e = find(name);
  WEFT_CHECK(e != nullptr, "safetensors: '{}' has no tensor '{}'", path(), name);
  Tensor t = empty(e->shape, {.dtype = e->dtype, .device = kCPU});
  read_rows_into(name, 0, e->shape.empty() ? 1 : e->shape[0], t);
  return t;
}

Tensor SafetensorsReader::read_slice(const std::string& name, int64_t dim, int64_t offset, int64_t length) {
  auto it = impl_->by_name.find(name);
  WEFT_CHECK(it != impl_->by_name.end(), "safetensors: '{}' has no tensor '{}'", path(), name);
  const Entry& e = impl_->header.entries[it->second];
  const int64_t nd = int64_t(e.shape.size());
  WEFT_CHECK(dim >= 0 && dim < nd && offset >= 0 && length >= 0 && length <= e.shape[size_t(dim)] - offset,
             "safetensors: '{}': cannot read {} from {} of dim {} of tensor '{}' shaped {}", path(), length, offset,
             dim, name, shape_str(e.shape));
  Shape out_shape = e.shape;
  out_shape[size_t(dim)] = length;
  Tensor t = empty(out_shape, {.dtype = e.dtype, .device = kCPU});
  if (t.numel() == 0) return t;
  int64_t outer = 1, inner = int64_t(dtype_size(e.dtype));
  for (int64_t d = 0; d < dim; ++d) outer *= e.shape[size_t(d)];
  for (int64_t d = dim + 1; d < nd; ++d) inner *= e.shape[size_t(d)];
  const int64_t row = e.shape[size_t(dim)] * inner, piece = length * inner;
  const uint64_t data_start = impl_->in.size() - impl_->header.data_size + e.begin;
  auto* dst = static_cast<char*>(t.data_ptr());
  const int64_t elt = int64_t(dtype_size(e.dtype)), piece_numel = piece / elt;
  for (int64_t o = 0; o < outer; ++o) {
    impl_->in.seek(data_start + uint64_t(o * row + offset * inner));
    impl_->in.read(dst + o * piece, uint64_t(piece), fmt::format("tensor '{}'", e.name));
    impl_->check_values(t.view({-1}).narrow(0, o * piece_numel, piece_numel), e.name, (o * row + offset * inner) / elt);
  }
  return t;
}

void SafetensorsReader::read_rows_into(const std::string& name, int64_t offset, int64_t length, Tensor& dst,
                                       int64_t buffer_bytes) {
  auto it = impl_->by_name.find(name);
  WEFT_CHECK(it != impl_->by_name.end(), "safetensors: '{}' has no tensor '{}'", path(), name);
  const Entry& e = impl_->header.entries[it->second];
  const int64_t rows = e.shape.empty() ? 1 : e.shape[0];
  WEFT_CHECK(offset >= 0 && length >= 0 && length <= rows - offset, "safetensors: '{}': cannot read {} rows from {} of "
             "tensor '{}' shaped {}", path(), length, offset, name, shape_str(e.shape));
  const int64_t row_numel = rows == 0 ? 0 : shape_numel(e.shape) / rows;
  WEFT_CHECK((dst.dtype() == e.dtype || (is_floating(e.dtype) && is_floating(dst.dtype()))) && dst.device() == kCPU &&
             dst.is_contiguous() && dst.numel() == length * row_numel, "safetensors: '{}': rows of tensor '{}' ({}, {} x {} "
             "elements) go only into a contiguous CPU tensor of as many elements, of its dtype or (a float) any float "
             "dtype, not {} {} on {}", path(), name,
             dtype_name(e.dtype), length, row_numel, dtype_name(dst.dtype()), shape_str(dst.shape()), dst.device().str());
  if (dst.numel() == 0) return;
  const uint64_t row_bytes = uint64_t(row_numel) * dtype_size(e.dtype);
  impl_->in.seek(impl_->in.size() - impl_->header.data_size + e.begin + uint64_t(offset) * row_bytes);
  const std::string what = fmt::format("tensor '{}'", e.name);
  const bool convert = dst.dtype() != e.dtype;
  if (!convert && !impl_->refuse_nonfinite && e.dtype != DType::bool_)
    return impl_->in.read(dst.data_ptr(), uint64_t(length) * row_bytes, what);
  // In pieces: each one checked (and converted) while in cache.
  const int64_t chunk = std::max<int64_t>(1, buffer_bytes / int64_t(row_bytes));  // rows per piece
  Tensor buf = convert ? empty({rows_buffer_bytes(name, length, dst.dtype(), buffer_bytes) / int64_t(dtype_size(e.dtype))},
                               {.dtype = e.dtype}) : Tensor();
  Tensor flat = dst.view({-1});
  for (int64_t r = 0; r < length; r += chunk) {
    const int64_t n = std::min(chunk, length - r);
    Tensor piece = flat.narrow(0, r * row_numel, n * row_numel);
    Tensor raw = convert ? buf.narrow(0, 0, n * row_numel) : piece;
    impl_->in.read(raw.data_ptr(), uint64_t(n) * row_bytes, what);
    impl_->check_values(raw, e.name, (offset + r) * row_numel);
    if (convert) piece.copy_(raw);
  }
}

int64_t SafetensorsReader::rows_buffer_bytes(const std::string& name, int64_t length, DType dtype,
                                             int64_t buffer_bytes) const {
  const SafetensorsEntry* e = find(name);
  WEFT_CHECK(e, "safetensors: '{}' has no tensor '{}'", path(), name);
  const int64_t rows = e->shape.empty() ? 1 : e->shape[0], numel = shape_numel(e->shape);
  if (dtype == e->dtype || numel == 0 || length == 0) return 0;
  const int64_t row_bytes = numel / rows * int64_t(dtype_size(e->dtype));
  return std::min(std::max<int64_t>(1, buffer_bytes / row_bytes), length) * row_bytes;
}

SafetensorsContents load_safetensors(const std::string& path) {
  SafetensorsReader reader(path);
  SafetensorsContents out;
  out.metadata = reader.metadata();
  for (const SafetensorsEntry& e : reader.entries()) out.tensors.emplace_back(e.name, reader.read(e.name));
  return out;
}

Metadata read_safetensors_metadata(const std::string& path) { return SafetensorsReader(path).metadata(); }

std::vector<SafetensorsEntry> read_safetensors_index(const std::string& path) {
  return SafetensorsReader(path).entries();
}

}  // namespace weft
