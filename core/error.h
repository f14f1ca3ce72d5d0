// core: the one error type. User mistakes throw weft::Error with a message that names the
// op, shapes, dtypes and devices involved, and where in weft the check sits.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>
#include <system_error>

namespace weft {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
template <class Call>
decltype(auto) checked_call(const char* file, int line, Call&& call) try {
  return call();
} catch (const std::system_error& e) {  // std::filesystem's filesystem_error among them
  throw_error(file, line, e.what());
}
}  // namespace detail

}  // namespace weft

// WEFT_CHECK(cond, "fmt {}", args...): throws weft::Error("<msg> (at file:line)") if !cond.
#define WEFT_CHECK(cond, ...)                                                        \
  do {                                                                               \
    if (!(cond)) [[unlikely]]                                                        \
      ::weft::detail::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__));   \
  } while (0)

#define WEFT_ERROR(...) ::weft::detail::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))

// WEFT_FS(call): a std::filesystem call (or another that throws std::system_error) whose failure
// becomes weft::Error: the library's own text (with the paths) and where in weft the call sits.
#define WEFT_FS(...) ::weft::detail::checked_call(__FILE__, __LINE__, [&] { return __VA_ARGS__; })
