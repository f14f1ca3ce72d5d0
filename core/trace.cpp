#include "core/trace.h"

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/error.h"

namespace weft::trace {
namespace {

struct Event {
  std::string name;
  const char* cat;
  uint64_t ts, dur;
  int tid;
};

struct Recorder {
  std::mutex mu;
  std::vector<Event> events;
  std::string path;
  int rank = 0;
  bool on = false;
};

// Never destroyed, so the exit-time flush can still use it.
Recorder& rec() {
  static Recorder* r = [] {
    auto* rr = new Recorder;
    if (const char* p = std::getenv("WEFT_TRACE"); p && *p) {
      rr->path = p;
      rr->on = true;
      std::atexit([] { flush(); });
    }
    return rr;
  }();
  return *r;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

bool enabled() { return rec().on; }

uint64_t now_us() {
  using namespace std::chrono;
  static const auto t0 = steady_clock::now();
  return uint64_t(duration_cast<microseconds>(steady_clock::now() - t0).count()) + 1;  // never 0
}

void set_rank(int rank) { rec().rank = rank; }

std::string file() {
  const Recorder& r = rec();
  return r.on ? fmt::format("{}.rank{}.json", r.path, r.rank) : std::string();
}

void check_writable() {
  Recorder& r = rec();
  if (!r.on) return;
  const std::string file = trace::file();
  std::FILE* f = std::fopen(file.c_str(), "a");
  WEFT_CHECK(f, "WEFT_TRACE={}: cannot write the trace file {}: {}", r.path, file, std::strerror(errno));
  std::fclose(f);
}

void record(const std::string& name, const char* category, uint64_t start_us, uint64_t dur_us, int tid) {
  Recorder& r = rec();
  if (!r.on) return;
  std::lock_guard lock(r.mu);
  r.events.push_back({name, category, start_us, dur_us, tid});
}

void flush() {
  Recorder& r = rec();
  if (!r.on) return;
  std::lock_guard lock(r.mu);
  const std::string file = trace::file();
  std::FILE* f = std::fopen(file.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "weft: cannot write trace %s\n", file.c_str());
    return;
  }
  std::fprintf(f, "{\"traceEvents\":[\n");
  std::fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}},\n", r.rank,
               r.rank);
  std::fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"compute\"}},\n",
               r.rank);
  std::fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":1,\"args\":{\"name\":\"collectives\"}}",
               r.rank);
  for (const Event& e : r.events)
    std::fprintf(f, ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%llu,\"dur\":%llu,\"pid\":%d,\"tid\":%d}",
                 escape(e.name).c_str(), e.cat, (unsigned long long)e.ts, (unsigned long long)e.dur, r.rank, e.tid);
  std::fprintf(f, "\n]}\n");
  std::fclose(f);
}

}  // namespace weft::trace
