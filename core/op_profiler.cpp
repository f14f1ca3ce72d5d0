// core: the op profiler's rows and spans (core/op_profiler.h).
#include "core/op_profiler.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>

#include "core/step_trace.h"

namespace weft::op_profiler {
namespace {

std::atomic<bool> g_on{false};
std::thread::id g_thread;               // the one thread timed; written by start() only
std::map<std::string, Row> g_rows;      // touched by that thread (and by rows() after stop())
thread_local Span* t_innermost = nullptr;

}  // namespace

void start(bool keep_rows) {
  if (!keep_rows) g_rows.clear();
  g_thread = std::this_thread::get_id();
  g_on.store(true, std::memory_order_release);
}

void stop() { g_on.store(false, std::memory_order_release); }

bool active() { return g_on.load(std::memory_order_acquire) && std::this_thread::get_id() == g_thread; }

bool wanted() { return step_trace::recording() || active(); }

std::vector<Row> rows() {
  std::vector<Row> out;
  for (auto& [name, row] : g_rows) out.push_back(row);
  std::sort(out.begin(), out.end(), [](const Row& a, const Row& b) { return a.seconds > b.seconds; });
  return out;
}

Span::Span(std::string name, double flops, double bytes)
    : name_(std::move(name)), flops_(flops), bytes_(bytes), outer_(t_innermost),
      start_(std::chrono::steady_clock::now()) {
  t_innermost = this;
}

Span::~Span() {
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  t_innermost = outer_;
  if (outer_) outer_->inner_seconds_ += total;
  step_trace::op(name_, flops_, bytes_);
  if (!active()) return;
  Row& row = g_rows[name_];
  row.name = name_;
  row.calls += 1;
  row.seconds += total - inner_seconds_;
  row.flops += flops_;
  row.bytes += bytes_;
}

}  // namespace weft::op_profiler
