#include "core/sha256.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"

namespace weft {
namespace {

struct CtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
struct FileClose {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

// One digest in progress; every libcrypto call is checked.
class Sha256 {
 public:
  explicit Sha256(const std::string& what) : what_(what), ctx_(EVP_MD_CTX_new()) {
    WEFT_CHECK(ctx_, "sha256: cannot allocate a digest context for {}", what_);
    WEFT_CHECK(EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) == 1, "sha256: cannot start a digest of {}", what_);
  }
  void update(const void* data, size_t n) {
    WEFT_CHECK(EVP_DigestUpdate(ctx_.get(), data, n) == 1, "sha256: digest of {} failed", what_);
  }
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    WEFT_CHECK(EVP_DigestFinal_ex(ctx_.get(), md, &len) == 1 && len == 32, "sha256: finishing the digest of {} failed",
               what_);
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (unsigned int i = 0; i < len; ++i) {
      out += digits[md[i] >> 4];
      out += digits[md[i] & 15];
    }
    return out;
  }

 private:
  std::string what_;
  std::unique_ptr<EVP_MD_CTX, CtxFree> ctx_;
};

}  // namespace

std::string sha256_file(const std::string& path) {
  std::unique_ptr<std::FILE, FileClose> f(std::fopen(path.c_str(), "rb"));
  WEFT_CHECK(f, "sha256: cannot open '{}': {}", path, std::strerror(errno));
  Sha256 digest("'" + path + "'");
  std::vector<unsigned char> block(1 << 20);
  size_t n;
  while ((n = std::fread(block.data(), 1, block.size(), f.get())) > 0) digest.update(block.data(), n);
  WEFT_CHECK(!std::ferror(f.get()), "sha256: reading '{}' failed: {}", path, std::strerror(errno));
  return digest.hex();
}

std::string sha256_hex(const void* data, size_t size) {
  Sha256 digest("a buffer");
  digest.update(data, size);
  return digest.hex();
}

}  // namespace weft
