#include "apps/transformer/token_data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <span>
#include <tuple>
#include <vector>

#include "apps/common/host_memory.h"
#include "apps/common/progress.h"
#include "apps/transformer/file_contents.h"
#include "apps/transformer/text_data.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/sha256.h"
#include "dist/dist.h"

namespace weft::apps {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'W', 'E', 'F', 'T', 'T', 'O', 'K', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 128;

void put_le(unsigned char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = (unsigned char)(v >> (8 * i));
}
uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

void check_write(std::FILE* f, const void* p, size_t n, const std::string& path) {
  WEFT_CHECK(std::fwrite(p, 1, n, f) == n, "transformer: writing {}: {}", path, std::strerror(errno));
}

// A read-only mapping of a file truncated in place while it is mapped (`cp` over train.tokens, say) faults with
// SIGBUS at the first page past the new end. A token file's mapping is guarded: such a fault in it ends the process
// with status 1 and an error naming the file, formatted when the file was opened (the handler only writes it);
// a SIGBUS elsewhere goes to the handler that was there before. A truncation within the last page reads zeros
// there, and a file rewritten at its size reads the new bytes: neither faults. `prepare` replaces files by rename.
struct Guarded {
  std::atomic<bool> live{false};
  const char *begin = nullptr, *end = nullptr;
  char message[1024] = {};
  size_t length = 0;
};
Guarded guarded[16];
std::mutex guarded_mutex;  // taken to guard a mapping, never in the handler
struct sigaction previous_sigbus {};

void on_sigbus(int sig, siginfo_t* info, void*) {
  const char* at = static_cast<const char*>(info->si_addr);
  for (const Guarded& g : guarded)
    if (g.live.load(std::memory_order_acquire) && at >= g.begin && at < g.end) {
      [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, g.message, g.length);
      ::_exit(1);
    }
  ::sigaction(SIGBUS, &previous_sigbus, nullptr);  // not a token file: as if this handler had never been there
  if (info->si_code <= 0) ::raise(sig);            // sent rather than a fault, which repeats on return
}

// The slot guarding [begin, begin + bytes), or -1 when all are taken (the mapping then goes unguarded).
int guard_mapping(const void* begin, size_t bytes, const std::string& message) {
  [[maybe_unused]] static const bool installed = [] {
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    WEFT_CHECK(::sigaction(SIGBUS, &action, &previous_sigbus) == 0, "transformer: sigaction: {}", std::strerror(errno));
    return true;
  }();
  std::lock_guard lock(guarded_mutex);
  for (int i = 0; i < int(std::size(guarded)); ++i) {
    Guarded& g = guarded[i];
    if (g.live.load(std::memory_order_relaxed)) continue;
    g.begin = static_cast<const char*>(begin), g.end = g.begin + bytes;
    g.length = std::min(message.size(), sizeof(g.message) - 1) + 1;
    std::memcpy(g.message, message.data(), g.length - 1);
    g.message[g.length - 1] = '\n';
    g.live.store(true, std::memory_order_release);
    return i;
  }
  return -1;
}
void release_guard(int& slot) {
  if (slot >= 0) guarded[slot].live.store(false, std::memory_order_release);
  slot = -1;
}

// The index of the first id of `ids` (mapped at `map`) that is not below `vocab`, or -1: every
// id is checked once, at load, rather than when (if ever) a batch draws it. One pass, in chunks
// whose pages are dropped once read, so that the check adds nothing to the resident memory.
int64_t first_out_of_vocabulary(void* map, const TokenView& ids, int64_t vocab) {
  const int64_t chunk = int64_t(1) << 22, page = ::sysconf(_SC_PAGESIZE);
  for (int64_t lo = 0; lo < ids.size(); lo += chunk) {
    const int64_t hi = std::min(ids.size(), lo + chunk);
    for (int64_t i = lo; i < hi; ++i)
      if (int64_t(ids[i]) >= vocab) return i;
    const int64_t read = (ids.p + hi * ids.width - static_cast<const unsigned char*>(map)) / page * page;
    ::madvise(map, size_t(read), MADV_DONTNEED);  // advice only: a failure costs memory, not correctness
  }
  return -1;
}

// Appends the ids of text file `path` to `tokens`; returns its size. Read in blocks of 16 MiB, each
// encoded up to the last place the tokenizer may cut it (BpeTokenizer::split_point), so that a
// long line is never held whole with its ids (a tokenizer that cannot be cut reads the file whole).
int64_t encode_file(const BpeTokenizer& tok, const std::string& path, bool special, int64_t memory,
                    std::vector<uint32_t>& tokens) {
  constexpr size_t kBlock = size_t(16) << 20;
  std::ifstream in(path, std::ios::binary);
  WEFT_CHECK(in.good(), "transformer: cannot open {}: {}", path, std::strerror(errno));
  std::string text;
  int64_t offset = 0;  // of text[0] in the file
  if (special) tokens.insert(tokens.end(), tok.special_prefix().begin(), tok.special_prefix().end());
  for (bool end = false; !end;) {
    const size_t had = text.size();
    text.resize(had + kBlock);
    in.read(text.data() + had, std::streamsize(kBlock));
    text.resize(had + size_t(in.gcount()));
    WEFT_CHECK(!in.bad(), "transformer: error while reading {}", path);
    end = in.eof();
    const size_t last = tok.split_point(text, text.size()), cut = end ? text.size() : last;
    const double tail = double(text.size() - last);  // held since the last place to cut: encoded at once
    WEFT_CHECK(memory <= 0 || tail * kEncodeBytesPerByte <= double(memory), "transformer: {}: the {:.1f} MiB from byte "
               "{} have no place where the tokenizer may cut them (a space before a word; a line's end for a "
               "SentencePiece-style one): encoding them at once needs about {:.1f} GiB, more than the {:.1f} GiB "
               "available: split the text into smaller files", path, tail / (1 << 20), offset + int64_t(last),
               tail * kEncodeBytesPerByte / (1 << 30), double(memory) / (1 << 30));
    if (cut == 0 && !end) continue;  // no place to cut yet: read on
    try {
      for (int32_t id : tok.encode(std::string_view(text).substr(0, cut), false, offset > 0)) tokens.push_back(uint32_t(id));
    } catch (const Error& e) {
      throw Error(fmt::format("transformer: {} (the part from byte {}): {}", path, offset, e.what()));
    }
    text.erase(0, cut);
    offset += int64_t(cut);
  }
  if (special) tokens.insert(tokens.end(), tok.special_suffix().begin(), tok.special_suffix().end());
  return offset;
}

}  // namespace

std::string dataset_id(std::initializer_list<std::span<const uint32_t>> parts) {
  std::string digests;
  for (const auto& part : parts) digests += sha256_hex(part.data(), part.size_bytes());
  return sha256_hex(digests.data(), digests.size()).substr(0, 32);
}

void write_token_file(const std::string& path, std::span<const uint32_t> tokens, int64_t vocab_size,
                      const std::string& tokenizer_sha256, const std::string& dataset_id) {
  WEFT_CHECK(vocab_size > 0 && vocab_size <= (int64_t(1) << 32), "transformer: token file {}: vocabulary size {}",
             path, vocab_size);
  WEFT_CHECK(tokenizer_sha256.size() == 64, "transformer: token file {}: the tokenizer digest must be 64 hex "
             "characters", path);
  const int width = vocab_size <= 65536 ? 2 : 4;
  unsigned char header[kHeaderBytes] = {};
  std::memcpy(header, kMagic, 8);
  put_le(header + 8, kVersion, 4);
  put_le(header + 12, uint64_t(width), 4);
  put_le(header + 16, tokens.size(), 8);
  put_le(header + 24, uint64_t(vocab_size), 8);
  std::memcpy(header + 32, tokenizer_sha256.data(), 64);
  WEFT_CHECK(dataset_id.size() == 32, "transformer: token file {}: the dataset id must be 32 hex characters", path);
  std::memcpy(header + 96, dataset_id.data(), 32);
  write_file_atomic(path, [&](std::FILE* f) {
    check_write(f, header, kHeaderBytes, path);
    std::vector<unsigned char> block;
    for (size_t i = 0; i < tokens.size(); i += 65536) {
      const size_t n = std::min(tokens.size() - i, size_t(65536));
      block.resize(n * size_t(width));
      for (size_t k = 0; k < n; ++k) {
        WEFT_CHECK(int64_t(tokens[i + k]) < vocab_size, "transformer: token file {}: id {} at {} is outside the "
                   "vocabulary of {}", path, tokens[i + k], i + k, vocab_size);
        put_le(block.data() + k * size_t(width), tokens[i + k], width);
      }
      check_write(f, block.data(), block.size(), path);
    }
  });
}

TokenFile::TokenFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  WEFT_CHECK(fd >= 0, "transformer: cannot open token file {}: {}", path, std::strerror(errno));
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const int stat_errno = errno;
  if (!stat_ok || !S_ISREG(st.st_mode)) {
    ::close(fd);
    WEFT_CHECK(stat_ok, "transformer: cannot stat token file {}: {}", path, std::strerror(stat_errno));
    WEFT_CHECK(false, "transformer: token file {} is not a regular file", path);
  }
  map_size_ = size_t(st.st_size);
  if (map_size_ >= kHeaderBytes) {
    map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_SHARED, fd, 0);
    const int map_errno = errno;
    ::close(fd);
    if (map_ == MAP_FAILED) map_ = nullptr;
    WEFT_CHECK(map_, "transformer: cannot map token file {}: {}", path, std::strerror(map_errno));
  } else {
    ::close(fd);
    WEFT_CHECK(false, "transformer: token file {} is {} bytes, shorter than its {}-byte header", path, map_size_,
               kHeaderBytes);
  }
  const auto* h = static_cast<const unsigned char*>(map_);
  auto fail = [&](const std::string& what) {
    release_guard(guard_);
    ::munmap(map_, map_size_);
    map_ = nullptr;
    throw Error(fmt::format("transformer: token file {}: {}", path, what));
  };
  if (std::memcmp(h, kMagic, 8) != 0) fail("no WEFTTOK1 magic: not a token file of `weft-transformer prepare`");
  if (get_le(h + 8, 4) != kVersion) fail(fmt::format("format version {}, this weft reads {}", get_le(h + 8, 4), kVersion));
  header_.bytes_per_token = int64_t(get_le(h + 12, 4));
  if (header_.bytes_per_token != 2 && header_.bytes_per_token != 4)
    fail(fmt::format("{} bytes per token (2 or 4)", header_.bytes_per_token));
  const uint64_t count = get_le(h + 16, 8), vocab = get_le(h + 24, 8);
  if (vocab == 0 || vocab > (uint64_t(1) << 32) || (header_.bytes_per_token == 2 && vocab > 65536))
    fail(fmt::format("vocabulary size {} with {} bytes per token", vocab, header_.bytes_per_token));
  if (count > (map_size_ - kHeaderBytes) / uint64_t(header_.bytes_per_token) ||
      kHeaderBytes + count * uint64_t(header_.bytes_per_token) != map_size_)
    fail(fmt::format("the header counts {} tokens of {} bytes but the file holds {} bytes after the header", count,
                     header_.bytes_per_token, map_size_ - kHeaderBytes));
  header_.count = int64_t(count);
  header_.vocab_size = int64_t(vocab);
  header_.tokenizer_sha256.assign(reinterpret_cast<const char*>(h + 32), 64);
  header_.dataset_id.assign(reinterpret_cast<const char*>(h + 96), 32);
  if (header_.dataset_id.find_first_not_of('\0') == std::string::npos) header_.dataset_id.clear();
  data_ = h + kHeaderBytes;
  const bool ranks = dist::is_initialized() && dist::world_size() > 1;  // named as run_program names a rank's error
  guard_ = guard_mapping(map_, map_size_, fmt::format("{}: error{}: transformer: token file {} became shorter while "
                           "it was read (truncated or rewritten in place); stopped: replace a dataset's files by "
                           "rename, as `prepare` does", program_invocation_short_name,
                           ranks ? fmt::format(" on rank {}", dist::rank()) : "", path));
  if (const int64_t i = first_out_of_vocabulary(map_, view(), header_.vocab_size); i >= 0)
    fail(fmt::format("token {} (of {}) is id {}, outside its vocabulary of {}: the file is damaged", i, count,
                     (*this)[i], vocab));
}

TokenFile::~TokenFile() {
  release_guard(guard_);  // before the range can be mapped again
  if (map_) ::munmap(map_, map_size_);
}

bool is_token_dataset(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / "train.tokens", ec);
}

void load_training_data(const std::string& path, TrainingData& d) {
  if (!is_token_dataset(path)) {
    for (const std::string& f : text_files(path)) {  // a dataset's token file is not text (a FIFO: load_text refuses it)
      char head[8] = {};
      std::error_code ec;
      const bool tokens = fs::is_regular_file(f, ec) && std::ifstream(f, std::ios::binary).read(head, 8) &&
                          !std::memcmp(head, kMagic, 8);
      WEFT_CHECK(!tokens, "transformer: {} is a token file of `weft-transformer prepare`, not text: pass its dataset's "
                 "directory ({}) as --data", f, fs::path(f).parent_path().string());
    }
    d.text = load_text(path);
    d.train = TokenView::bytes(d.text.train), d.val = TokenView::bytes(d.text.val);
    d.files = d.text.files;
    return;
  }
  const std::string train = (fs::path(path) / "train.tokens").string(), val = (fs::path(path) / "val.tokens").string();
  d.train_file.emplace(train);
  d.val_file.emplace(val);
  const TokenFileHeader &a = d.train_file->header(), &b = d.val_file->header();
  WEFT_CHECK(a.tokenizer_sha256 == b.tokenizer_sha256,
             "transformer: {} and {} come from different tokenizers (sha256 {} and {}): prepare them together", train,
             val, a.tokenizer_sha256, b.tokenizer_sha256);
  WEFT_CHECK(a.dataset_id == b.dataset_id, "transformer: {} and {} belong to different datasets (ids {} and {}): a "
             "prepare stopped between its files, or one was copied in from another dataset: prepare the dataset again",
             train, val, a.dataset_id.empty() ? "none" : a.dataset_id, b.dataset_id.empty() ? "none" : b.dataset_id);
  WEFT_CHECK(a.vocab_size == b.vocab_size, "transformer: {} has a vocabulary of {} tokens but {} of {}, though both "
             "record tokenizer sha256 {}: one of them is damaged; prepare them again", train, a.vocab_size, val,
             b.vocab_size, a.tokenizer_sha256);
  d.train = d.train_file->view(), d.val = d.val_file->view();
  d.vocab_size = a.vocab_size;
  d.tokenizer_sha256 = a.tokenizer_sha256;
  d.files = {train, val};
  const bool train_labels = WEFT_FS(fs::exists(fs::path(path) / "train.labels"));
  WEFT_CHECK(train_labels == WEFT_FS(fs::exists(fs::path(path) / "val.labels")), "transformer: {} has {}.labels but not "
             "{}.labels: a dataset of examples has both (prepare it again)", path, train_labels ? "train" : "val", train_labels ? "val" : "train");
  if (!train_labels) return;
  for (const auto& [file, tokens, labels] : {std::tuple{train, &*d.train_file, &d.train_labels_file},
                                            std::tuple{val, &*d.val_file, &d.val_labels_file}}) {
    const std::string name = file.substr(0, file.size() - 7) + ".labels";
    const TokenFile& l = labels->emplace(name);
    std::vector<std::string> why;  // what differs, only
    if (l.size() != tokens->size()) why.push_back(fmt::format("{} labels for {} tokens", l.size(), tokens->size()));
    if (l.header().tokenizer_sha256 != a.tokenizer_sha256)
      why.push_back(fmt::format("tokenizer sha256 {}, not {}", l.header().tokenizer_sha256, a.tokenizer_sha256));
    if (l.header().dataset_id != a.dataset_id)
      why.push_back(fmt::format("dataset id {}, not {}", l.header().dataset_id, a.dataset_id));
    WEFT_CHECK(why.empty(), "transformer: {} does not belong to {} ({}): prepare the dataset again", name, file,
               fmt::join(why, "; "));
  }
  d.train_labels = d.train_labels_file->view(), d.val_labels = d.val_labels_file->view();
}

std::string tokenizer_digest(const std::string& path) {
  const std::string json = read_file(tokenizer_json_path(path));
  return sha256_hex(json.data(), json.size());
}

void copy_tokenizer(const std::string& tokenizer_path, const std::string& dir) {
  const std::string json = read_file(tokenizer_json_path(tokenizer_path));
  write_file_atomic(dir + "/tokenizer.json", [&](std::FILE* f) { check_write(f, json.data(), json.size(), dir); });
}

PathFlag dataset_out(const std::string& dir) {
  auto has = [](const std::string& d, const char* f) { return WEFT_FS(fs::exists(d + "/" + f)); };
  return {"--out", dir, true, [=](const std::string& d) { return !has(d, "tokenizer.json") || has(d, "train.tokens") ||
            has(d, "val.tokens"); }, "a dataset directory: it holds a tokenizer.json (a model's?) and no "
          "train.tokens or val.tokens, and prepare would replace that tokenizer.json"};
}

PreparedData prepare_tokens(const std::string& tokenizer_path, const std::string& data, const std::string& out_dir,
                            const std::string& eos, double val_fraction, bool special, int64_t memory) {
  WEFT_CHECK(val_fraction >= 0 && val_fraction < 1, "transformer: validation fraction {} not in [0, 1)", val_fraction);
  check_output_place(dataset_out(out_dir), "transformer");
  const BpeTokenizer tok(tokenizer_path);
  const std::string digest = tokenizer_digest(tokenizer_path);
  int32_t eos_id = -1;
  if (!eos.empty()) {
    eos_id = tok.id_of(eos);
    WEFT_CHECK(eos_id >= 0, "transformer: --eos \"{}\" is not a token of {} (pass --eos \"\" for none)", eos,
               tokenizer_path);
  }
  const std::vector<std::string> files = text_files(data);
  int64_t total_bytes = 0;
  for (const std::string& f : files) total_bytes += int64_t(WEFT_FS(fs::file_size(f)));
  PreparedData out;
  std::vector<uint32_t> tokens;
  try {  // no token is shorter than a byte: one allocation, its untouched tail never resident
    tokens.reserve(size_t(total_bytes) + files.size());
  } catch (const std::bad_alloc&) {  // grown as needed
  }
  Progress progress("prepare", int64_t(files.size()), "bytes");
  for (const std::string& f : files) {
    WEFT_CHECK(WEFT_FS(fs::is_regular_file(f)), "transformer: {} is not a regular file or a directory (a FIFO or device?)", f);
    const int64_t bytes = encode_file(tok, f, special, memory > 0 ? memory : host_available_bytes(), tokens);
    if (eos_id >= 0) tokens.push_back(uint32_t(eos_id));
    out.files += 1, out.bytes += bytes;
    progress.update(out.files, bytes, fmt::format("{} tokens", tokens.size()));
  }
  progress.finish(fmt::format("{} tokens from {} bytes in {} files", tokens.size(), total_bytes, files.size()));
  WEFT_CHECK(!tokens.empty(), "transformer: {} holds no text to tokenize", data);
  const size_t n_val = size_t(double(tokens.size()) * val_fraction);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  WEFT_CHECK(!ec && WEFT_FS(fs::is_directory(out_dir)), "transformer: cannot create the dataset directory {}: {}", out_dir,
             ec ? ec.message() : "not a directory");
  const std::span<const uint32_t> train(tokens.data(), tokens.size() - n_val), val(tokens.data() + train.size(), n_val);
  const std::string id = dataset_id({train, val});
  write_token_file(out_dir + "/train.tokens", train, tok.vocab_size(), digest, id);
  write_token_file(out_dir + "/val.tokens", val, tok.vocab_size(), digest, id);
  copy_tokenizer(tokenizer_path, out_dir);
  for (const char* stale : {"/train.labels", "/val.labels"}) fs::remove(out_dir + stale, ec);  // now a text dataset
  out.train_tokens = int64_t(train.size()), out.val_tokens = int64_t(val.size());
  return out;
}

}  // namespace weft::apps
