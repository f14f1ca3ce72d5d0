// libFuzzer target for the IDX reader (apps/mnist/idx.cpp): any file, plain or gzip'd, must
// either load as a u8 tensor of its declared dims or raise weft::Error — never crash, read out
// of bounds, allocate more than the file can hold or hit undefined behaviour. The first byte of
// an input picks the form: odd, the rest is written gzip-compressed (so the fuzzer reaches the
// reader's checks through zlib), even, as it is. tests/fuzz/run_fuzz.sh builds and runs it.
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "apps/mnist/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool gzip = data[0] & 1;
  static const std::string path = "fuzz_input." + std::to_string(::getpid()) + ".idx";
  bool ok;
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    ok = f && (size == 1 || gzwrite(f, data + 1, unsigned(size - 1)) == int(size - 1));
    ok = f && gzclose(f) == Z_OK && ok;
  } else {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ok = f && std::fwrite(data + 1, 1, size - 1, f) == size - 1;
    ok = f && std::fclose(f) == 0 && ok;
  }
  if (!ok) {
    std::fprintf(stderr, "fuzz_idx: cannot write %s\n", path.c_str());
    std::abort();
  }
  try {
    weft::Tensor t = weft::apps::read_idx(path);
    // What loaded is the declared dims' worth of bytes, all readable.
    const uint8_t* p = t.data<uint8_t>();
    unsigned sum = 0;
    for (int64_t i = 0; i < t.numel(); ++i) sum += p[i];
    if (t.numel() > int64_t(size) * 1100) std::abort();  // more than gzip could have expanded
    (void)sum;
  } catch (const weft::Error&) {
  }
  return 0;
}
