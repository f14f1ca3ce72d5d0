// libFuzzer target for the checkpoint index reader (fsdp/checkpoint_index.cpp): any index.json
// must either load or raise weft::Error — never crash, read out of bounds or hit undefined
// behaviour (built with AddressSanitizer and UndefinedBehaviorSanitizer). An index that loads
// must survive a round trip: written back with checkpoint_index_json and read again, it gives
// the same text. tests/fuzz/run_fuzz.sh builds and runs it; see docs/TESTING.md.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "fsdp/checkpoint_index.h"

namespace {

// The reader takes a checkpoint directory: one per process in the working directory
// (run_fuzz.sh runs the target in the build tree), its index.json rewritten for each input.
const std::string& checkpoint_dir() {
  static const std::string dir = [] {
    std::string d = "fuzz_checkpoint." + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

bool write_index(const std::string& text) {
  std::FILE* f = std::fopen((checkpoint_dir() + "/index.json").c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  return std::fclose(f) == 0 && ok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (!write_index(std::string(reinterpret_cast<const char*>(data), size))) {
    std::perror("fuzz_checkpoint_index: writing index.json");
    std::abort();
  }
  weft::fsdp::CheckpointIndex index;
  try {
    index = weft::fsdp::read_checkpoint_index(checkpoint_dir());
  } catch (const weft::Error&) {
    return 0;
  }
  for (auto& e : index.tensors) (void)weft::fsdp::describe(e);
  const std::string once = weft::fsdp::checkpoint_index_json(index);
  if (!write_index(once)) std::abort();
  std::string twice;
  try {
    twice = weft::fsdp::checkpoint_index_json(weft::fsdp::read_checkpoint_index(checkpoint_dir()));
  } catch (const weft::Error& e) {
    std::fprintf(stderr, "fuzz_checkpoint_index: an index that loaded does not load once written back: %s\n%s\n",
                 e.what(), once.c_str());
    std::abort();
  }
  if (twice != once) {
    std::fprintf(stderr, "fuzz_checkpoint_index: the round trip changed the index:\n%s\n---\n%s\n", once.c_str(),
                 twice.c_str());
    std::abort();
  }
  return 0;
}
