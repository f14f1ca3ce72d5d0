// apps: weft's own CLI11 validators, with plain ranges in their messages ("--threads: expected an integer from 1 to
// 1024, got 100000", "--lr: expected a number > 0, got -1", "--lr: not a number: abc"). Both weft-mnist and
// weft-transformer use them, so every count has an upper bound and no flag wraps, overflows or prints DBL_MAX.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace weft::apps::cli {

// The most CPU threads --threads accepts.
constexpr int64_t kMaxThreads = 1024;

// A decimal integer in [lo, hi] (no sign wrap, no overflow, no trailing text).
CLI::Validator integer(int64_t lo, int64_t hi);
// Such integers, comma-separated (spaces around each allowed), at least one; integers_of reads a list it passed.
CLI::Validator integer_list(int64_t lo, int64_t hi);
std::vector<int64_t> integers_of(const std::string& list);
// A decimal integer in [0, UINT64_MAX] for seeds: "-1" is refused rather than wrapped.
CLI::Validator seed();
// --threads: an integer from 1 to kMaxThreads.
CLI::Validator threads();
// --threads when given (> 0); else OpenMP's default (OMP_NUM_THREADS or the cores), held to the
// same limit (an OpenMP team of 100,000 threads crashes inside libgomp); first checks WEFT_CPU_(BF16_)GEMM.
void use_threads(int64_t threads);
// A finite number > lo (lo_open) or >= lo, and <= hi when hi is finite.
CLI::Validator number_above(double lo);           // > lo
CLI::Validator number_from(double lo, double hi);  // lo <= x <= hi
CLI::Validator number_in_half_open(double lo, double hi);  // lo <= x < hi

// A byte count as weft::parse_bytes reads it (e.g. 900M, up to 2^63-1 bytes); "" is refused.
CLI::Validator bytes();

// The same checks as functions: "" when `text` is fine, otherwise the message.
std::string check_integer(const std::string& text, int64_t lo, int64_t hi);

// Parses a decimal integer stored in a file (a checkpoint's description, say) and checks it is
// in [lo, hi]; throws weft::Error naming `what` (e.g. "checkpoint x: n_layer") and the text.
int64_t parse_integer_field(const std::string& text, int64_t lo, int64_t hi, const std::string& what);
// The same for a finite decimal number above 0.
double parse_positive_field(const std::string& text, const std::string& what);

}  // namespace weft::apps::cli
