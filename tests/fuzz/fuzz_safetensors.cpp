// libFuzzer target for the safetensors reader (core/safetensors.cpp): any input must either
// load or raise weft::Error — never crash, hang, over-allocate or read out of bounds (built
// with AddressSanitizer). tests/fuzz/run_fuzz.sh builds and runs it; see docs/CHECKPOINTS.md.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "core/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The reader works on files: one per process in the working directory (run_fuzz.sh runs it
  // in the build tree), rewritten for each input.
  static const std::string path = "fuzz_input." + std::to_string(::getpid()) + ".safetensors";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    auto contents = weft::load_safetensors(path);
    // A file that loads must also be readable tensor by tensor.
    weft::SafetensorsReader reader(path);
    for (auto& e : reader.entries()) reader.read(e.name);
  } catch (const weft::Error&) {
  }
  return 0;
}
