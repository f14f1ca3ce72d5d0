#pragma once
// WEFT_ASAN / WEFT_TSAN: 1 where the including file is compiled under AddressSanitizer /
// ThreadSanitizer (g++ defines __SANITIZE_*; clang 14 answers only __has_feature).
#if defined(__has_feature)
#define WEFT_HAS_FEATURE(x) __has_feature(x)
#else
#define WEFT_HAS_FEATURE(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || WEFT_HAS_FEATURE(address_sanitizer)
#define WEFT_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__) || WEFT_HAS_FEATURE(thread_sanitizer)
#define WEFT_TSAN 1
#endif
