#include "dist/fake_group.h"

#include <utility>

#include "core/error.h"
#include "core/step_trace.h"
#include "dist/flight_recorder.h"

namespace weft::dist {
namespace {

// A step trace (core/step_trace.h) sees each collective start at its launch and end where the step waits for it.
class FakeWork final : public Work {
 public:
  FakeWork(CollectiveInfo info, uint64_t trace_id) : Work(std::move(info)), trace_id_(trace_id) {}
  bool is_completed() override { return true; }
  void wait(double) override { step_trace::collective_wait(std::exchange(trace_id_, 0)); }

 private:
  uint64_t trace_id_;
};

class FakeProcessGroup final : public ProcessGroup {
 public:
  FakeProcessGroup(std::string name, int rank, int size) : ProcessGroup(std::move(name), rank, size, ranks(size)) {}
  std::string_view backend() const override { return "fake"; }
  Device device() const override { return Device::meta(); }
  void close() override { closed_ = true; }

 protected:
  WorkPtr launch(Collective c) override {
    WEFT_CHECK(!closed_, "{}: the group is closed", c.info.str());
    detail::flight_stage(c.info, CollectiveStage::completed);
    const double bytes = double(std::max(c.info.in_numel, c.info.out_numel)) * double(dtype_size(c.info.dtype));
    const uint64_t id = step_trace::collective_start(collective_name(c.info.kind), bytes, size(), name());
    return std::make_shared<FakeWork>(std::move(c.info), id);
  }

 private:
  static std::vector<int> ranks(int size) {
    std::vector<int> r(size_t(std::max(size, 0)));
    for (int i = 0; i < size; ++i) r[size_t(i)] = i;
    return r;
  }
};

}  // namespace

ProcessGroupPtr fake_group(int rank, int size, std::string name) {
  WEFT_CHECK(size >= 1 && rank >= 0 && rank < size, "dist::fake_group: rank {} of {} ranks is not a rank of a group",
             rank, size);
  return std::make_shared<FakeProcessGroup>(std::move(name), rank, size);
}

std::shared_ptr<DeviceMesh> fake_mesh(int rank, int size) {
  return std::make_shared<DeviceMesh>(DeviceType::meta, std::vector<int>{size}, std::vector<std::string>{"fake"},
                                      std::vector<int>{rank}, std::vector<ProcessGroupPtr>{fake_group(rank, size)});
}

}  // namespace weft::dist
