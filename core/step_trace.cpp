// core: the step trace's record (core/step_trace.h): one per thread, so a recording on the
// planner's thread sees nothing of the communication thread or the OpenMP workers.
#include "core/step_trace.h"

#include <utility>

namespace weft::step_trace {
namespace {

thread_local bool t_on = false;
thread_local std::vector<Event> t_events;
thread_local uint64_t t_next_id = 0;

}  // namespace

void start() {
  t_events.clear();
  t_next_id = 0;
  t_on = true;
}

std::vector<Event> stop() {
  t_on = false;
  return std::exchange(t_events, {});
}

bool recording() { return t_on; }

Pause::Pause() : was_(std::exchange(t_on, false)) {}
Pause::~Pause() { t_on = was_; }

void op(std::string_view name, double flops, double bytes) {
  if (t_on) t_events.push_back({.kind = Event::Kind::op, .name = std::string(name), .flops = flops, .bytes = bytes});
}

uint64_t collective_start(std::string_view kind, double bytes, int group_size, std::string_view group) {
  if (!t_on) return 0;
  const uint64_t id = ++t_next_id;
  t_events.push_back({.kind = Event::Kind::collective_start, .name = std::string(kind), .bytes = bytes, .id = id,
                      .group_size = group_size, .group = std::string(group)});
  return id;
}

void collective_wait(uint64_t id) {
  if (t_on && id != 0) t_events.push_back({.kind = Event::Kind::collective_wait, .id = id});
}

}  // namespace weft::step_trace
