// dist: the flight recorder (see flight_recorder.h). The record is a ring of entries under one mutex; the status
// exchange uses two tags on a private duplicate of MPI_COMM_WORLD: a rank that timed out sends the name of its group to
// the group's other ranks (kQuery), and each answers with how many collectives it issued and completed on that group
// and its latest call (kReply). This path runs only when something already went wrong, so its MPI calls are not checked
// with MPI_CHECK: a failed send or receive shows up as "no answer" in the report.
#include "dist/flight_recorder.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "dist/dist.h"

namespace weft::dist {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kQuery = 1, kReply = 2;
constexpr size_t kNameBytes = 128, kTextBytes = 1008;

struct Reply {
  int64_t issued = -1, completed = -1;
  char text[kTextBytes] = {};
};

struct Entry {
  CollectiveInfo info;
  CollectiveStage stage = CollectiveStage::issued;
  Clock::time_point issued_at, changed_at;
};

struct GroupProgress {
  std::string name;
  std::vector<int> members;  // world ranks
  uint64_t issued = 0, completed = 0;
};

struct Recorder {
  std::mutex mu;
  std::vector<Entry> ring;
  size_t next = 0, count = 0;
  std::map<uint64_t, GroupProgress> groups;

  // The status exchange.
  std::mutex serve_mu;
  MPI_Comm diag = MPI_COMM_NULL;
  MPI_Request query = MPI_REQUEST_NULL;
  char query_name[kNameBytes] = {};
  std::deque<Reply> sent;  // replies in flight stay alive until the process ends
  Clock::time_point last_serve{};
  bool dumped = false;
};

Recorder& recorder() {
  static Recorder* r = [] {
    auto* rec = new Recorder;  // never destroyed: the communication thread may outlive statics
    size_t n = 256;
    if (const char* e = std::getenv("WEFT_FLIGHT_RECORDER")) {
      char* end = nullptr;
      long v = std::strtol(e, &end, 10);
      if (end != e && *end == '\0' && v >= 1 && v <= 1000000) n = size_t(v);
      else std::fprintf(stderr, "weft: WEFT_FLIGHT_RECORDER='%s' is not a count from 1 to 1000000; keeping 256\n", e);
    }
    rec->ring.resize(n);
    return rec;
  }();
  return *r;
}

Entry* find(Recorder& r, uint64_t group_id, uint64_t seq) {
  for (size_t k = 0; k < r.count; ++k) {
    Entry& e = r.ring[(r.next + r.ring.size() - 1 - k) % r.ring.size()];
    if (e.info.group_id == group_id && e.info.seq == seq) return &e;
  }
  return nullptr;
}

std::string describe(const Entry& e, Clock::time_point now) {
  auto ago = [&](Clock::time_point t) { return std::chrono::duration<double>(now - t).count(); };
  return fmt::format("{}: {} ({:.3f} s after issue, issued {:.3f} s ago)", e.info.str(),
                     collective_stage_name(e.stage), std::chrono::duration<double>(e.changed_at - e.issued_at).count(),
                     ago(e.issued_at));
}

int world_rank() { return is_initialized() ? rank() : 0; }

// Writes this rank's record to stderr and WEFT_FLIGHT_DIR, once per process.
void dump(const std::string& why) {
  Recorder& r = recorder();
  {
    std::lock_guard lock(r.mu);
    if (r.dumped) return;
    r.dumped = true;
  }
  std::string text = fmt::format("flight record of rank {} ({}), oldest first:\n{}", world_rank(), why, flight_record());
  std::fprintf(stderr, "[weft.dist rank %d] %s", world_rank(), text.c_str());
  std::fflush(stderr);
  if (const char* dir = std::getenv("WEFT_FLIGHT_DIR"); dir && *dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    auto path = std::filesystem::path(dir) / fmt::format("flight_rank{}.txt", world_rank());
    std::ofstream out(path);
    out << text;
    out.close();
    if (ec || !out) std::fprintf(stderr, "[weft.dist rank %d] could not write %s\n", world_rank(), path.c_str());
    else std::fprintf(stderr, "[weft.dist rank %d] flight record written to %s\n", world_rank(), path.c_str());
  }
}

// This rank's answer about its group named `name` that contains world rank `asker`.
Reply answer(const std::string& name, int asker) {
  Recorder& r = recorder();
  Reply reply;
  std::lock_guard lock(r.mu);
  for (auto& [id, g] : r.groups) {
    if (g.name != name || std::find(g.members.begin(), g.members.end(), asker) == g.members.end()) continue;
    reply.issued = int64_t(g.issued);
    reply.completed = int64_t(g.completed);
    if (Entry* e = find(r, id, g.issued)) {
      std::string last = describe(*e, Clock::now());
      std::strncpy(reply.text, last.c_str(), kTextBytes - 1);
    }
    break;
  }
  return reply;
}

}  // namespace

std::string_view collective_stage_name(CollectiveStage stage) {
  switch (stage) {
    case CollectiveStage::issued: return "issued, not yet posted";
    case CollectiveStage::checking: return "fingerprint check posted, waiting for the group";
    case CollectiveStage::posted: return "posted, not completed";
    case CollectiveStage::completed: return "completed";
    case CollectiveStage::failed: return "failed";
  }
  return "?";
}

std::string flight_record() {
  Recorder& r = recorder();
  std::lock_guard lock(r.mu);
  auto now = Clock::now();
  std::string out;
  for (size_t k = r.count; k-- > 0;) out += "  " + describe(r.ring[(r.next + r.ring.size() - 1 - k) % r.ring.size()], now) + "\n";
  if (r.count == 0) out = "  (no collectives)\n";
  return out;
}

namespace detail {

void flight_issued(const CollectiveInfo& info, const std::vector<int>& world_ranks) {
  Recorder& r = recorder();
  auto now = Clock::now();
  std::lock_guard lock(r.mu);
  Entry& e = r.ring[r.next];
  e.info = info;
  e.stage = CollectiveStage::issued;
  e.issued_at = e.changed_at = now;
  r.next = (r.next + 1) % r.ring.size();
  r.count = std::min(r.count + 1, r.ring.size());
  GroupProgress& g = r.groups[info.group_id];
  if (g.members.empty()) {
    g.name = info.group;
    g.members = world_ranks;
  }
  g.issued = info.seq;
}

void flight_stage(const CollectiveInfo& info, CollectiveStage stage, Clock::time_point at) {
  Recorder& r = recorder();
  std::lock_guard lock(r.mu);
  if (Entry* e = find(r, info.group_id, info.seq)) {
    e->stage = stage;
    e->changed_at = at;
  }
  if (stage == CollectiveStage::completed || stage == CollectiveStage::failed) ++r.groups[info.group_id].completed;
}

void flight_start() {
  Recorder& r = recorder();
  std::lock_guard lock(r.serve_mu);
  if (r.diag != MPI_COMM_NULL) return;
  MPI_Comm_dup(MPI_COMM_WORLD, &r.diag);
  MPI_Comm_set_errhandler(r.diag, MPI_ERRORS_RETURN);
  MPI_Irecv(r.query_name, int(kNameBytes), MPI_CHAR, MPI_ANY_SOURCE, kQuery, r.diag, &r.query);
}

void flight_stop() {
  Recorder& r = recorder();
  std::lock_guard lock(r.serve_mu);
  if (r.diag == MPI_COMM_NULL) return;
  if (r.query != MPI_REQUEST_NULL) {
    MPI_Cancel(&r.query);
    MPI_Wait(&r.query, MPI_STATUS_IGNORE);
  }
  MPI_Comm_free(&r.diag);
  r.diag = MPI_COMM_NULL;
}

void flight_serve() {
  Recorder& r = recorder();
  std::unique_lock lock(r.serve_mu, std::try_to_lock);
  if (!lock.owns_lock() || r.diag == MPI_COMM_NULL) return;
  for (;;) {
    int arrived = 0;
    MPI_Status status;
    if (MPI_Test(&r.query, &arrived, &status) != MPI_SUCCESS || !arrived) return;
    std::string name(r.query_name, strnlen(r.query_name, kNameBytes));
    int asker = status.MPI_SOURCE;
    lock.unlock();
    dump(fmt::format("rank {} reported a collective timeout on group '{}'", asker, name));
    lock.lock();
    r.sent.push_back(answer(name, asker));
    MPI_Request send;
    if (MPI_Isend(&r.sent.back(), int(sizeof(Reply)), MPI_BYTE, asker, kReply, r.diag, &send) == MPI_SUCCESS)
      MPI_Request_free(&send);
    if (MPI_Irecv(r.query_name, int(kNameBytes), MPI_CHAR, MPI_ANY_SOURCE, kQuery, r.diag, &r.query) != MPI_SUCCESS)
      return;
  }
}

std::string flight_timeout_report(const CollectiveInfo& info, double grace_seconds) {
  Recorder& r = recorder();
  std::vector<int> members;
  {
    std::lock_guard lock(r.mu);
    if (auto it = r.groups.find(info.group_id); it != r.groups.end()) members = it->second.members;
  }
  const int me = world_rank();
  std::vector<Reply> replies(members.size());
  std::vector<MPI_Request> recvs(members.size(), MPI_REQUEST_NULL);
  {
    std::lock_guard lock(r.serve_mu);
    if (r.diag != MPI_COMM_NULL) {
      static char name[kNameBytes];  // read by the sends below after this returns
      std::memset(name, 0, kNameBytes);
      std::strncpy(name, info.group.c_str(), kNameBytes - 1);
      for (size_t i = 0; i < members.size(); ++i) {
        if (members[i] == me) continue;
        MPI_Irecv(&replies[i], int(sizeof(Reply)), MPI_BYTE, members[i], kReply, r.diag, &recvs[i]);
        MPI_Request send;
        if (MPI_Isend(name, int(kNameBytes), MPI_CHAR, members[i], kQuery, r.diag, &send) == MPI_SUCCESS)
          MPI_Request_free(&send);
      }
    }
  }
  auto deadline = Clock::now() + std::chrono::duration<double>(grace_seconds);
  for (;;) {
    flight_serve();  // another rank may be asking this one at the same time
    size_t waiting = 0;
    for (auto& q : recvs) {
      if (q == MPI_REQUEST_NULL) continue;
      int done = 0;
      if (MPI_Test(&q, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) q = MPI_REQUEST_NULL;
      else if (!done) ++waiting;
    }
    if (waiting == 0 || Clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::string lagging, silent, report;
  for (size_t i = 0; i < members.size(); ++i) {
    int w = members[i];
    if (w == me) continue;
    std::string who = w == int(i) ? fmt::format("rank {}", w) : fmt::format("rank {} (world rank {})", i, w);
    if (recvs[i] != MPI_REQUEST_NULL) {
      MPI_Cancel(&recvs[i]);
      MPI_Request_free(&recvs[i]);
      silent += (silent.empty() ? "" : ", ") + who;
      report += fmt::format("\n  {}: no answer within {:g} s (dead, or its process is stuck)", who, grace_seconds);
      continue;
    }
    const Reply& a = replies[i];
    std::string last = a.text[0] ? std::string(a.text, strnlen(a.text, kTextBytes)) : "none";
    if (a.issued < int64_t(info.seq)) {
      lagging += (lagging.empty() ? "" : ", ") + who;
      report += fmt::format("\n  {}: has not issued #{} on this group: it issued {} and completed {}; its latest: {}",
                            who, info.seq, a.issued, a.completed, last);
    } else {
      report += fmt::format("\n  {}: issued it too ({} issued, {} completed); its latest: {}", who, a.issued,
                            a.completed, last);
    }
  }
  dump(fmt::format("collective #{} on group '{}' timed out", info.seq, info.group));
  std::string head = lagging.empty() ? "No rank of the group is behind this one"
                                     : fmt::format("Lagging: {} never issued {}", lagging, info.call());
  if (!silent.empty()) head += fmt::format("; no answer from {}", silent);
  return head + "." + report;
}

}  // namespace detail
}  // namespace weft::dist
