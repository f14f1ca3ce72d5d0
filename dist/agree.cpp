#include "dist/agree.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "core/tensor.h"
#include "dist/dist.h"

namespace weft::dist {
namespace {

// The failed rank's message travels in a fixed-size buffer of i64 words (longer ones are cut).
constexpr int64_t kMessageBytes = 2048;

std::string message_of(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// `t` reduced over every group in turn: over all the ranks they span (a mesh's groups).
Tensor reduce_over(const std::vector<ProcessGroupPtr>& groups, Tensor t, ReduceOp op) {
  for (auto& g : groups) {
    Tensor on = t.to(g->device());  // NCCL groups take tensors on their GPU only
    g->all_reduce(on, op)->wait();
    t = on.to(kCPU);
  }
  return t;
}

}  // namespace

void agree_on_error(std::exception_ptr error, std::string_view what, const std::vector<ProcessGroupPtr>& groups) {
  if (error) try {
      std::rethrow_exception(error);
    } catch (const AgreedError& e) {
      if (e.everywhere) throw;
    } catch (...) {
    }
  std::vector<ProcessGroupPtr> active;
  bool everywhere = false;  // an agreement over the world: every rank knows its outcome
  for (auto& g : groups)
    if (g && g->size() > 1) {
      active.push_back(g);
      everywhere |= g->size() == world_size();
    }
  int failed_rank = error ? (is_initialized() ? rank() : 0) : -1;
  std::string message = error ? message_of(error) : "";
  if (!active.empty()) {
    // The lowest failed rank: max of (world - rank) over the ranks, 0 when none failed.
    const int world = world_size();
    Tensor key = from_vector({error ? double(world - rank()) : 0.0}, {1}, {.dtype = kFloat64});
    const int highest = int(reduce_over(active, key, ReduceOp::max).item());
    if (highest == 0) return;
    failed_rank = world - highest;
    // Its message, as bytes packed in i64 words: that rank writes it, the others zeros, and a
    // sum (exact for integers) leaves its words.
    Tensor text = zeros({kMessageBytes / 8}, {.dtype = kInt64});
    if (failed_rank == rank())
      std::memcpy(text.data<int64_t>(), message.data(), std::min<size_t>(message.size(), kMessageBytes - 1));
    text = reduce_over(active, text, ReduceOp::sum);
    const char* chars = reinterpret_cast<const char*>(text.data<int64_t>());
    if (!error)
      throw AgreedError(fmt::format("{} failed on another rank (rank {}: {})", what, failed_rank,
                                    std::string(chars, strnlen(chars, kMessageBytes))),
                        failed_rank, everywhere);
  }
  if (!error) return;
  try {
    std::rethrow_exception(error);
  } catch (const AgreedError&) {
    throw;
  } catch (...) {
    throw AgreedError(message, failed_rank, everywhere);
  }
}

int run_program(std::string_view program, const std::function<int()>& body) {
  auto others = [] { return is_initialized() && world_size() > 1; };
  int rc = 1;
  try {
    rc = body();
  } catch (const AgreedError& e) {
    // Every rank failed here: each says so once and stops cleanly.
    if (others()) std::fprintf(stderr, "%.*s: error on rank %d: %s\n", int(program.size()), program.data(), rank(), e.what());
    else std::fprintf(stderr, "%.*s: error: %s\n", int(program.size()), program.data(), e.what());
  } catch (const std::exception& e) {
    // A failure the other ranks may not share (they may be waiting in a collective): end them all.
    if (others()) abort_job(fmt::format("{}: error: {}", program, e.what()));
    std::fprintf(stderr, "%.*s: error: %s\n", int(program.size()), program.data(), e.what());
  }
  try {
    if (is_initialized()) finalize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%.*s: error while shutting down: %s\n", int(program.size()), program.data(), e.what());
    rc = 1;
  }
  return rc;
}

}  // namespace weft::dist
