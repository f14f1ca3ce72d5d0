// cuda/: dist's NCCL process group (CUDA tensors), in the CUDA backend library
// (libweft-cuda), which registers it with dist when loaded ([Note: backend registration],
// core/device_runtime.h). One NCCL communicator per group, its unique id made on the group's
// rank 0 and sent over the group's MPI communicator. Collectives run on the group's own stream
// after the work already queued on the caller's current stream; a CUDA event per collective
// backs is_completed() and wait(), and wait() polls it so that it can time out; a collective's
// tensors stay with its Work until that event completes ([Note: stream and event lifetimes],
// core/stream.h). NCCL reduces bf16/f16 natively.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <thread>

#include "dist/backend.h"
#include "dist/check.h"
#include "dist/dist.h"
#include "dist/flight_recorder.h"
#include "core/device_runtime.h"
#include "core/stream.h"

namespace weft::dist::detail {

void throw_nccl_error(int code, const char* call, const char* file, int line) {
  ::weft::detail::throw_error(file, line, fmt::format("{} failed: {} (NCCL error {}; {})", call,
                                              ncclGetErrorString(ncclResult_t(code)), code,
                                              ncclGetLastError(nullptr)));
}

void throw_cuda_error(int code, const char* call, const char* file, int line) {
  ::weft::detail::throw_error(file, line, fmt::format("{} failed: {} ({})", call, cudaGetErrorString(cudaError_t(code)),
                                              cudaGetErrorName(cudaError_t(code))));
}

namespace {

using Clock = std::chrono::steady_clock;

cudaStream_t current_cuda_stream(int device) {
  return static_cast<cudaStream_t>(current_stream(Device::cuda(device)).handle());
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i64: return ncclInt64;
    case DType::i32: return ncclInt32;
    case DType::u8:
    case DType::bool_: return ncclUint8;
  }
  WEFT_ERROR("dist: no NCCL type for dtype {}", int(t));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

class NcclProcessGroup;

class NcclWork final : public Work {
 public:
  NcclWork(CollectiveInfo info, std::shared_ptr<const NcclProcessGroup> group, cudaEvent_t done, Tensor in, Tensor out)
      : Work(std::move(info)), group_(std::move(group)), done_(done), in_(std::move(in)), out_(std::move(out)) {}
  ~NcclWork() override {
    // The tensors' memory must outlive the kernels that use it.
    if (!completed_) cudaEventSynchronize(done_);
    cudaEventDestroy(done_);
  }
  bool is_completed() override;
  void wait(double timeout_seconds) override;
  bool wait_on_current_stream() override;

 private:
  std::shared_ptr<const NcclProcessGroup> group_;
  cudaEvent_t done_;
  Tensor in_, out_;
  bool completed_ = false;
  std::string error_;
};

class NcclProcessGroup final : public ProcessGroup, public std::enable_shared_from_this<NcclProcessGroup> {
 public:
  NcclProcessGroup(MPI_Comm comm, std::string name, int rank, int size)
      : ProcessGroup(std::move(name), rank, size, world_ranks_of(comm)), comm_(comm) {
    device_ = local_device(DeviceType::cuda).index;
    CUDA_CHECK(cudaSetDevice(device_));
    ncclUniqueId id{};
    if (rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    CollectiveInfo info{.kind = CollectiveKind::broadcast, .in_numel = int64_t(sizeof id), .group = this->name(), .group_size = size};
    MPI_Request request;
    MPI_CHECK(MPI_Ibcast(&id, int(sizeof id), MPI_BYTE, 0, comm_, &request));
    wait_request(request, info, "sending the NCCL unique id");
    NCCL_CHECK(ncclCommInitRank(&nccl_, size, id, rank));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)));
  }
  ~NcclProcessGroup() override {
    if (closed_) return;
    try {
      release();
    } catch (...) {
    }
  }
  std::string_view backend() const override { return "nccl"; }
  Device device() const override { return Device::cuda(device_); }
  void close() override {
    if (closed_) return;
    release();
  }
  ncclComm_t nccl() const { return nccl_; }

 protected:
  WorkPtr launch(Collective c) override;

 private:
  void release() {
    closed_ = true;
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    NCCL_CHECK(ncclCommDestroy(nccl_));
    CUDA_CHECK(cudaFree(barrier_buf_));
    CUDA_CHECK(cudaEventDestroy(ready_));
    CUDA_CHECK(cudaStreamDestroy(stream_));
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_CHECK(MPI_Comm_free(&comm_));
  }

  MPI_Comm comm_;
  int device_ = 0;
  ncclComm_t nccl_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  void* barrier_buf_ = nullptr;
};

bool NcclWork::is_completed() {
  if (completed_) return true;
  cudaError_t e = cudaEventQuery(done_);
  if (e == cudaErrorNotReady) return false;
  if (e != cudaSuccess)
    error_ = fmt::format("{}: the CUDA event behind it reports {} ({})", info_.str(), cudaGetErrorString(e),
                         cudaGetErrorName(e));
  completed_ = true;
  flight_stage(info_, error_.empty() ? CollectiveStage::completed : CollectiveStage::failed);
  return true;
}

void NcclWork::wait(double timeout_seconds) {
  auto deadline = Clock::now() + std::chrono::duration<double>(checked_timeout(timeout_seconds, "Work::wait"));
  for (int spins = 0; !is_completed(); ++spins) {
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(group_->nccl(), &async));
    if (async != ncclSuccess && async != ncclInProgress) {
      error_ = fmt::format("{}: NCCL reports {} ({})", info_.str(), ncclGetErrorString(async), ncclGetLastError(group_->nccl()));
      ncclCommAbort(group_->nccl());
      abort_job(error_);  // the communicator is unusable and the other ranks are stuck in it
    }
    if (Clock::now() > deadline) {
      ncclCommAbort(group_->nccl());
      fail_timeout(info_, timeout_seconds, "queued on the NCCL stream, not completed");
    }
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  if (!error_.empty()) throw Error(error_);
}

bool NcclWork::wait_on_current_stream() {
  ncclResult_t async = ncclSuccess;
  NCCL_CHECK(ncclCommGetAsyncError(group_->nccl(), &async));
  if (async != ncclSuccess && async != ncclInProgress)
    throw Error(fmt::format("{}: NCCL reports {} ({})", info_.str(), ncclGetErrorString(async),
                            ncclGetLastError(group_->nccl())));
  int device = group_->device().index;
  CUDA_CHECK(cudaStreamWaitEvent(current_cuda_stream(device), done_, 0));
  return true;
}

WorkPtr NcclProcessGroup::launch(Collective c) {
  const CollectiveInfo& i = c.info;
  CUDA_CHECK(cudaSetDevice(device_));
  if (debug_mode()) compare_calls(comm_, world_ranks(), i);
  // After the work queued so far on the caller's current stream (the legacy default stream
  // unless a StreamGuard chose another).
  CUDA_CHECK(cudaEventRecord(ready_, current_cuda_stream(device_)));
  CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  void* in = c.in.defined() ? c.in.data_ptr() : nullptr;
  void* out = c.out.defined() ? c.out.data_ptr() : nullptr;
  ncclDataType_t type = i.kind == CollectiveKind::barrier ? ncclFloat32 : nccl_type(i.dtype);
  // A group of one: each collective's result is its input (any reduction over one rank), so a
  // copy on the collective stream, or nothing in place. NCCL 2.28.9's one-rank f32
  // reduce-scatter with ncclAvg left the last 2 of 100,003 elements unwritten (H200).
  if (size() == 1) {
    const size_t bytes = size_t(i.out_numel) * dtype_size(i.dtype);
    if (in && out && in != out) CUDA_CHECK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice, stream_));
  } else {
    switch (i.kind) {
      case CollectiveKind::all_gather:
        NCCL_CHECK(ncclAllGather(in, out, size_t(i.in_numel), type, nccl_, stream_));
        break;
      case CollectiveKind::reduce_scatter:
        NCCL_CHECK(ncclReduceScatter(in, out, size_t(i.out_numel), type, nccl_op(i.op), nccl_, stream_));
        break;
      case CollectiveKind::all_reduce:
        NCCL_CHECK(ncclAllReduce(out, out, size_t(i.in_numel), type, nccl_op(i.op), nccl_, stream_));
        break;
      case CollectiveKind::broadcast:
        NCCL_CHECK(ncclBroadcast(out, out, size_t(i.in_numel), type, i.root, nccl_, stream_));
        break;
      case CollectiveKind::barrier:
        NCCL_CHECK(ncclAllReduce(barrier_buf_, barrier_buf_, 1, type, ncclSum, nccl_, stream_));
        break;
      case CollectiveKind::all_to_all: {
        size_t block = size_t(i.in_numel / size()), bytes = block * dtype_size(i.dtype);
        NCCL_CHECK(ncclGroupStart());
        for (int j = 0; j < size(); ++j) {
          NCCL_CHECK(ncclSend(static_cast<char*>(in) + size_t(j) * bytes, block, type, j, nccl_, stream_));
          NCCL_CHECK(ncclRecv(static_cast<char*>(out) + size_t(j) * bytes, block, type, j, nccl_, stream_));
        }
        NCCL_CHECK(ncclGroupEnd());
        break;
      }
    }
  }
  cudaEvent_t done;
  CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(done, stream_));
  flight_stage(i, CollectiveStage::posted);
  return std::make_shared<NcclWork>(c.info, shared_from_this(), done, c.in, c.out);
}

ProcessGroupPtr new_nccl_group(MPI_Comm comm, std::string name) {
  if (device_count(DeviceType::cuda) == 0) {
    MPI_Comm_free(&comm);
    WEFT_ERROR("dist: group '{}' on CUDA: no usable CUDA device on this host ({})", name,
               device_unavailable_reason(DeviceType::cuda));
  }
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  return std::make_shared<NcclProcessGroup>(comm, std::move(name), rank, size);
}

const bool g_registered = [] {
  register_device_group(DeviceType::cuda, &new_nccl_group);
  return true;
}();

}  // namespace

}  // namespace weft::dist::detail
