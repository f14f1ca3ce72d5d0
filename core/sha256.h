// core: SHA-256 digests (OpenSSL's libcrypto), for checkpoint files whose integrity a reader
// checks before trusting them.
#pragma once
#include <cstddef>
#include <string>

namespace weft {

// Hex digest (64 lowercase characters) of a file's bytes, read in fixed-size blocks. Errors
// are weft::Error naming the file.
std::string sha256_file(const std::string& path);
// Hex digest of a buffer.
std::string sha256_hex(const void* data, size_t size);

}  // namespace weft
