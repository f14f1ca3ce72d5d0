#include "apps/common/cli.h"

#include <fmt/format.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "core/allocator.h"
#include "core/error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/threads.h"

namespace weft::apps::cli {

namespace {

std::string num_str(double v) { return fmt::format("{}", v); }

// "" and the value when `text` is a whole finite number, else the message.
std::string parse_number(const std::string& text, double& v) {
  if (text.empty()) return "not a number: (empty)";
  const char* b = text.c_str();
  char* end = nullptr;
  errno = 0;
  v = std::strtod(b, &end);
  // strtod also reads hexadecimal ("0x10" is 16): a decimal number is expected.
  if (end == b || *end != '\0' || std::isspace(static_cast<unsigned char>(text[0])) ||
      text.find_first_of("xX") != std::string::npos)
    return fmt::format("not a number: {}", text);
  if (errno == ERANGE && std::isfinite(v)) return fmt::format("too close to 0 to hold (below 2.2e-308): {}", text);
  if (!std::isfinite(v) || errno == ERANGE) return fmt::format("not a finite number: {}", text);
  return "";
}

}  // namespace

CLI::Validator bytes() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.empty()) return "expected a byte count (e.g. 900M), got an empty string";
        try {
          parse_bytes(text, "");
        } catch (const Error& e) {
          std::string m = e.what();  // ": \"TEXT\" is not ... (at FILE:LINE)": keep the middle
          return m.substr(m.find('"'), m.rfind(" (at ") - m.find('"'));
        }
        return "";
      },
      "BYTES");
}

std::string check_integer(const std::string& text, int64_t lo, int64_t hi) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  bool whole = !text.empty() && p == text.data() + text.size();
  if (ec == std::errc::result_out_of_range || (whole && (v < lo || v > hi)))
    return fmt::format("expected an integer from {} to {}, got {}", lo, hi, text);
  if (ec != std::errc() || !whole) return fmt::format("not an integer: {} (expected one from {} to {})", text, lo, hi);
  return "";
}

CLI::Validator integer(int64_t lo, int64_t hi) {
  return CLI::Validator([lo, hi](std::string& s) { return check_integer(s, lo, hi); },
                        fmt::format("INT in [{} - {}]", lo, hi));
}

std::vector<int64_t> integers_of(const std::string& list) {
  std::vector<int64_t> out;
  std::istringstream items(list);
  for (std::string item; std::getline(items, item, ',');) out.push_back(std::stoll(item));
  return out;
}

CLI::Validator integer_list(int64_t lo, int64_t hi) {
  return CLI::Validator([lo, hi](std::string& s) -> std::string {
    std::istringstream items(s + ",");  // "1," is "1" and "": an empty item is refused
    for (std::string item; std::getline(items, item, ',');) {
      const size_t a = item.find_first_not_of(' '), b = item.find_last_not_of(' ');
      if (a == std::string::npos) return fmt::format("an empty item in \"{}\"", s);
      const std::string err = check_integer(item.substr(a, b - a + 1), lo, hi);
      if (!err.empty()) return fmt::format("{} (in \"{}\")", err, s);
    }
    return "";
  }, fmt::format("INT[,INT...] in [{} - {}]", lo, hi));
}

CLI::Validator seed() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec == std::errc() && !s.empty() && p == s.data() + s.size()) return "";
        return fmt::format("expected an integer from 0 to {}, got {}", std::numeric_limits<uint64_t>::max(), s);
      },
      "UINT64");
}

CLI::Validator threads() { return integer(1, kMaxThreads); }

void use_threads(int64_t threads) {
  kernels::cpu::check_kernel_choices();
  if (threads > 0) return set_num_threads(int(threads));
  const char* env = std::getenv("OMP_NUM_THREADS");
  WEFT_CHECK(get_num_threads() <= kMaxThreads, "OMP_NUM_THREADS={} asks for {} threads, more than the {} weft runs "
             "(--threads N overrides it)", env ? env : "", get_num_threads(), kMaxThreads);
}

CLI::Validator number_above(double lo) {
  return CLI::Validator(
      [lo](std::string& s) -> std::string {
        double v = 0;
        if (auto e = parse_number(s, v); !e.empty()) return e;
        if (!(v > lo)) return fmt::format("expected a number > {}, got {}", num_str(lo), s);
        return "";
      },
      fmt::format("NUMBER > {}", num_str(lo)));
}

CLI::Validator number_from(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        double v = 0;
        if (auto e = parse_number(s, v); !e.empty()) return e;
        if (std::isinf(hi) && !(v >= lo)) return fmt::format("expected a number >= {}, got {}", num_str(lo), s);
        if (!(v >= lo && v <= hi))
          return fmt::format("expected a number from {} to {}, got {}", num_str(lo), num_str(hi), s);
        return "";
      },
      std::isinf(hi) ? fmt::format("NUMBER >= {}", num_str(lo)) : fmt::format("NUMBER in [{} - {}]", lo, hi));
}

CLI::Validator number_in_half_open(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        double v = 0;
        if (auto e = parse_number(s, v); !e.empty()) return e;
        if (!(v >= lo && v < hi))
          return fmt::format("expected a number >= {} and < {}, got {}", num_str(lo), num_str(hi), s);
        return "";
      },
      fmt::format("NUMBER in [{} - {})", lo, hi));
}

int64_t parse_integer_field(const std::string& text, int64_t lo, int64_t hi, const std::string& what) {
  std::string err = check_integer(text, lo, hi);
  WEFT_CHECK(err.empty(), "{}: {}", what, err);
  return std::stoll(text);
}

double parse_positive_field(const std::string& text, const std::string& what) {
  double v = 0;
  std::string err = parse_number(text, v);
  WEFT_CHECK(err.empty() && v > 0, "{}: {}", what, err.empty() ? fmt::format("expected a number above 0, got {}", text) : err);
  return v;
}

}  // namespace weft::apps::cli
