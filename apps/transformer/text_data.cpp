#include "apps/transformer/text_data.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

namespace weft::apps {

namespace fs = std::filesystem;

namespace {

void append_file(const fs::path& p, std::vector<uint8_t>& out) {
  std::error_code ec;
  // A FIFO would block open() for ever and a device (/dev/zero) never ends: only regular files.
  WEFT_CHECK(fs::is_regular_file(p, ec), "transformer: {} is not a regular file or a directory (a FIFO or device?)",
             p.string());
  const uintmax_t size = fs::file_size(p, ec);
  WEFT_CHECK(!ec && out.size() + size <= kMaxTextBytes,
             "transformer: {} is {} bytes, which takes the text past the limit of {} bytes", p.string(), size,
             kMaxTextBytes);
  std::ifstream in(p, std::ios::binary);
  WEFT_CHECK(in.good(), "transformer: cannot open {}", p.string());
  out.insert(out.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  WEFT_CHECK(!in.bad(), "transformer: error while reading {}", p.string());
}

}  // namespace

namespace {

// Said when the data is missing or the default folder holds no text: the usual cause is the
// default data not being installed (not said of a folder the user named that holds none).
std::string hint(bool said = true) {
  if (!said) return "";
  return " (the default text is Debian's `fortunes` package: apt-get install fortunes; or pass --data FILE|DIR)";
}

bool is_jsonl(const fs::path& p) {  // .jsonl or .JSONL (any case)
  std::string ext = p.extension().string();
  for (char& c : ext) c = char(std::tolower(uint8_t(c)));
  return ext == ".jsonl";
}

}  // namespace

std::vector<std::string> text_files(const std::string& path) {
  std::error_code ec;
  WEFT_CHECK(fs::exists(path, ec), "transformer: text data {} does not exist{}", path, hint());
  if (!fs::is_directory(path, ec)) return {path};
  std::vector<std::string> files, passed;  // passed over: links to other than .jsonl files, sub-folders
  for (auto& e : fs::directory_iterator(path, ec)) {
    std::error_code lec;
    const bool link = e.is_symlink(lec), regular = e.is_regular_file(lec);  // a link: its target's type
    if (e.path().extension() == ".dat" && !link) continue;  // strfile's binary index, not text
    WEFT_CHECK(!link || fs::exists(e.path(), lec), "transformer: {}: a symbolic link to {}, which does not exist (a "
               "shard missing from the data)", e.path().string(), fs::read_symlink(e.path(), lec).string());
    if (regular && (!link || is_jsonl(e.path()))) files.push_back(e.path().string());
    else if (link || e.is_directory(lec)) passed.push_back(e.path().filename().string());
  }
  WEFT_CHECK(!ec, "transformer: cannot list {}: {}", path, ec.message());
  std::sort(passed.begin(), passed.end());
  WEFT_CHECK(!files.empty(), "transformer: no text found in {}{}{}", path,
             passed.empty() ? "" : fmt::format(": it holds {} symbolic link(s) or sub-folder(s), such as {}, which are "
                                               "not read (a folder's regular files are, and its links to .jsonl files)",
                                               passed.size(), passed[0]),
             hint(path == kDefaultTextDir));
  std::sort(files.begin(), files.end());
  // A downloaded dataset's splits side by side (train.jsonl, test.jsonl): read as one text, the test split is trained on.
  static const std::regex held_out("(test|tests|valid|validation|val|eval|evaluation|dev)([^a-z].*)?", std::regex::icase);
  for (const std::string& f : files)
    WEFT_CHECK(files.size() == 1 || !std::regex_match(fs::path(f).filename().string(), held_out), "transformer: {} holds "
               "{}, named for a held-out split, beside {} other file(s): read as one text, it would be trained on; pass "
               "the training split's file", path, fs::path(f).filename().string(), files.size() - 1);
  return files;
}

TextData load_text(const std::string& path, double val_fraction) {
  TextData d;
  std::vector<uint8_t> all;
  for (const std::string& f : text_files(path)) {
    append_file(f, all);
    d.files.push_back(f);
  }
  WEFT_CHECK(!all.empty(), "transformer: no text found in {}{}", path, hint(path == kDefaultTextDir));
  WEFT_CHECK(val_fraction >= 0 && val_fraction < 1, "transformer: validation fraction {} not in [0, 1)", val_fraction);
  const size_t n_val = size_t(double(all.size()) * val_fraction);
  d.train.assign(all.begin(), all.end() - std::ptrdiff_t(n_val));
  d.val.assign(all.end() - std::ptrdiff_t(n_val), all.end());
  return d;
}

std::pair<Tensor, Tensor> text_batch(TokenView split, uint64_t seed, int64_t index, int64_t batch, int64_t ctx,
                                     int64_t row_begin, int64_t row_end) {
  const int64_t n = split.size();
  WEFT_CHECK(n > ctx + 1, "transformer: {} tokens of data are too few for a context of {} (need at least {})", n, ctx,
             ctx + 2);
  WEFT_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= batch, "text_batch: rows [{}, {}) outside [0, {})",
             row_begin, row_end, batch);
  // Every rank draws all `batch` starts so that row r is the same window at any world size.
  Generator g(seed * 1000003ull + uint64_t(index) + 1);
  std::vector<int64_t> starts(static_cast<size_t>(batch));
  for (auto& s : starts) s = int64_t(g.next_u64() % uint64_t(n - ctx - 1));
  const int64_t rows = row_end - row_begin;
  Tensor x = empty({rows, ctx}, {.dtype = kInt64}), y = empty({rows, ctx}, {.dtype = kInt64});
  int64_t* xp = x.data<int64_t>();
  int64_t* yp = y.data<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t s = starts[size_t(row_begin + r)];
    for (int64_t t = 0; t < ctx; ++t) {
      xp[r * ctx + t] = split[s + t];
      yp[r * ctx + t] = split[s + t + 1];
    }
  }
  return {x, y};
}

}  // namespace weft::apps
