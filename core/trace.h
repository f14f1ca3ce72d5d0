// core: a Chrome-trace recorder (viewable in Perfetto or chrome://tracing). Enabled by the environment variable
// WEFT_TRACE=path: each process writes path.rank<R>.json (R set by dist::init; 0 otherwise) when it exits or calls
// trace::flush(). Spans are complete ("X") events; tid 0 is the main thread's compute, tid 1 the collectives in flight.
#pragma once
#include <cstdint>
#include <string>

namespace weft::trace {

bool enabled();
uint64_t now_us();
void set_rank(int rank);
// The file this process writes (path.rank<R>.json); "" when tracing is off.
std::string file();
// Throws weft::Error naming WEFT_TRACE when this process's trace file cannot be written, so a run
// fails at its start instead of losing its trace at the end (a no-op when tracing is off).
void check_writable();
// A finished span [start_us, start_us + dur_us) on lane `tid`.
void record(const std::string& name, const char* category, uint64_t start_us, uint64_t dur_us, int tid = 0);
void flush();  // writes the file (idempotent; later events are appended on the next flush)

// RAII span on lane 0.
class Span {
 public:
  Span(const char* name, const char* category) : name_(name), cat_(category), start_(enabled() ? now_us() : 0) {}
  ~Span() {
    if (start_) record(name_, cat_, start_, now_us() - start_);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  const char* name_;
  const char* cat_;
  uint64_t start_;
};

}  // namespace weft::trace
