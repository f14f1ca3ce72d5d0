// core: the op profiler: where a step's time goes, op by op. While it runs (start() to stop()), every kernel entry
// point (kernels/backend.h's table on the CPU) and every element copy or dtype cast (core/copy.h) adds its wall time,
// its floating-point operations and the bytes of its operands to a row named for the op (a GEMM's row also names its
// shape). A row's time is exclusive: an op that calls another (a cast inside a matmul) is charged only for what is not
// in the inner op's own row. Only the thread that called start() is timed (an op's OpenMP workers run inside its span);
// the time outside every span is the framework's own (autograd, allocation, module code), which the caller gets as step
// time minus the rows.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace weft::op_profiler {

struct Row {
  std::string name;
  int64_t calls = 0;
  double seconds = 0, flops = 0, bytes = 0;
};

void start(bool keep_rows = false);  // times the calling thread from now on; clears the rows unless keep_rows
void stop();
bool active();  // on this thread
// Whether an op should construct a Span: active(), or a step trace recording on this thread
// (core/step_trace.h), to which a Span appends its op when it ends.
bool wanted();
std::vector<Row> rows();  // by time, longest first

// Times one op from construction to destruction; construct it only when wanted().
class Span {
 public:
  Span(std::string name, double flops, double bytes);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  std::string name_;
  double flops_, bytes_, inner_seconds_ = 0;
  Span* outer_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace weft::op_profiler
