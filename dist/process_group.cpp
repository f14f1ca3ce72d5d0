// dist: the backend-independent half of ProcessGroup: argument checks, sequence numbers and
// the descriptions used in error messages.
#include "dist/process_group.h"


#include <atomic>

#include "dist/dist.h"
#include "dist/flight_recorder.h"

namespace weft::dist {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

std::string_view collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_gather: return "all_gather_into_tensor";
    case CollectiveKind::reduce_scatter: return "reduce_scatter_tensor";
    case CollectiveKind::all_reduce: return "all_reduce";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::barrier: return "barrier";
    case CollectiveKind::all_to_all: return "all_to_all_single";
  }
  return "?";
}

std::string CollectiveInfo::call() const {
  std::string what;
  switch (kind) {
    case CollectiveKind::barrier: break;
    case CollectiveKind::all_reduce:
      what = fmt::format(" ({}, {} elements, {})", dtype_name(dtype), in_numel, reduce_op_name(op));
      break;
    case CollectiveKind::broadcast:
      what = fmt::format(" ({}, {} elements, root {})", dtype_name(dtype), in_numel, root);
      break;
    case CollectiveKind::reduce_scatter:
      what = fmt::format(" ({}, in {} elements, out {}, {})", dtype_name(dtype), in_numel, out_numel,
                         reduce_op_name(op));
      break;
    default:
      what = fmt::format(" ({}, in {} elements, out {})", dtype_name(dtype), in_numel, out_numel);
  }
  if (!label.empty()) what += fmt::format(" [{}]", label);
  return fmt::format("{} #{}{}", collective_name(kind), seq, what);
}

namespace {
thread_local std::string t_label;
std::atomic<uint64_t> g_next_group_id{1};
}  // namespace

CollectiveLabel::CollectiveLabel(std::string_view label) : previous_length_(t_label.size()), owner_(t_label) {
  if (!t_label.empty()) t_label += ": ";
  t_label += label;
}
CollectiveLabel::~CollectiveLabel() { t_label.resize(previous_length_); }
const std::string& CollectiveLabel::current() { return t_label; }

std::string CollectiveInfo::str() const {
  return fmt::format("{} on group '{}' ({} ranks)", call(), group, group_size);
}

void Work::wait() { wait(collective_timeout()); }

double checked_timeout(double seconds, const char* what) {
  WEFT_CHECK(seconds > 0 && seconds <= 1e9, "{}: a timeout of {} s is not above 0 and at most 1e9 (31 years; longer "
             "would overflow the clock)", what, seconds);
  return seconds;
}

ProcessGroup::ProcessGroup(std::string name, int rank, int size, std::vector<int> world_ranks)
    : name_(std::move(name)), rank_(rank), size_(size), world_ranks_(std::move(world_ranks)),
      id_(g_next_group_id.fetch_add(1)) {}

WorkPtr ProcessGroup::issue(Collective c) {
  c.info.seq = ++seq_;
  c.info.group_id = id_;
  c.info.label = CollectiveLabel::current();
  detail::flight_issued(c.info, world_ranks_);
  return launch(std::move(c));
}

namespace {

bool is_reducible(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16 ||
         t == DType::i64 || t == DType::i32;
}

}  // namespace

Collective ProcessGroup::make(CollectiveKind kind, const Tensor& out, const Tensor& in) {
  std::string_view op_name = collective_name(kind);
  auto where = [&] { return fmt::format("{} on group '{}' ({} backend)", op_name, name_, backend()); };
  auto check_tensor = [&](const Tensor& t, const char* role) {
    WEFT_CHECK(t.defined(), "{}: {} is an undefined tensor", where(), role);
    WEFT_CHECK(t.device() == device(),
               "{}: {} is {}, but this group's tensors live on {}{}", where(), role, tensor_desc(t),
               device().str(),
               backend() == "mpi" ? " (the MPI backend takes CPU tensors; use a NCCL group for CUDA "
                                    "tensors: dist::world(DeviceType::cuda) or a DeviceMesh on cuda)"
                                  : "");
    WEFT_CHECK(t.is_contiguous(),
               "{}: {} is {} with strides {}, which is not contiguous; the collective reads and "
               "writes its memory directly, so pass a contiguous tensor (t.contiguous())",
               where(), role, tensor_desc(t), shape_str(t.strides()));
  };
  WEFT_CHECK(!closed_, "{}: the group was closed (dist::finalize() or close())", where());
  Collective c;
  if (kind != CollectiveKind::barrier) {
    check_tensor(in, kind == CollectiveKind::all_reduce || kind == CollectiveKind::broadcast ? "tensor" : "in");
    if (!out.is_same(in)) {
      check_tensor(out, "out");
      WEFT_CHECK(out.dtype() == in.dtype(), "{}: dtype mismatch: out is {} but in is {}", where(),
                 tensor_desc(out), tensor_desc(in));
    }
    int64_t n = in.numel(), m = out.numel(), p = size_;
    switch (kind) {
      case CollectiveKind::all_gather:
        WEFT_CHECK(m == n * p,
                   "{}: out must hold size() x in.numel() = {} x {} = {} elements, but out is {} ({} "
                   "elements) and in is {}",
                   where(), p, n, n * p, tensor_desc(out), m, tensor_desc(in));
        break;
      case CollectiveKind::reduce_scatter:
        WEFT_CHECK(n == m * p,
                   "{}: in must hold size() x out.numel() = {} x {} = {} elements, but in is {} ({} "
                   "elements) and out is {}",
                   where(), p, m, m * p, tensor_desc(in), n, tensor_desc(out));
        break;
      case CollectiveKind::all_to_all:
        WEFT_CHECK(n == m && n % p == 0,
                   "{}: in and out must have the same number of elements, a multiple of size() = {}; "
                   "got in {} and out {}",
                   where(), p, tensor_desc(in), tensor_desc(out));
        break;
      default: break;
    }
    // Overlapping buffers would be read and written at once; the one overlap an all-gather
    // allows is `in` being out's own slice (FSDP packs its shard there to save a copy).
    if (!out.is_same(in) && n > 0 && m > 0) {
      // Addresses only (meta tensors of a fake group have addresses and no data).
      size_t es = in.element_size();
      auto* ib = static_cast<const char*>(in.storage()->data_or_null()) + size_t(in.offset()) * es;
      auto* ob = static_cast<const char*>(out.storage()->data_or_null()) + size_t(out.offset()) * es;
      c.in_place_gather = kind == CollectiveKind::all_gather && ib == ob + size_t(rank_) * size_t(n) * es;
      WEFT_CHECK(c.in_place_gather || ib + in.nbytes() <= ob || ob + out.nbytes() <= ib,
                 "{}: in ({}) and out ({}) overlap in memory{}", where(), tensor_desc(in), tensor_desc(out),
                 kind == CollectiveKind::all_gather
                     ? fmt::format("; only in = out.narrow(0, rank() * {}, {}) of a flat out may overlap", n, n)
                     : "");
    }
    c.info.dtype = in.dtype();
    c.info.in_numel = n;
    c.info.out_numel = m;
  }
  c.info.kind = kind;
  c.info.group = name_;
  c.info.group_size = size_;
  c.in = in;
  c.out = out;
  return c;
}

WorkPtr ProcessGroup::all_gather_into_tensor(const Tensor& out, const Tensor& in) {
  Collective c = make(CollectiveKind::all_gather, out, in);
  return issue(std::move(c));
}

static void check_reduce(const ProcessGroup& g, CollectiveKind kind, DType dtype, ReduceOp op) {
  WEFT_CHECK(is_reducible(dtype),
             "{} on group '{}': cannot reduce {} tensors (reductions take f32, f64, bf16, f16, i64, i32)",
             collective_name(kind), g.name(), dtype_name(dtype));
  WEFT_CHECK(op != ReduceOp::avg || is_floating(dtype),
             "{} on group '{}': ReduceOp::avg needs a floating dtype, got {} (an integer average "
             "would round; reduce with sum and divide as you see fit)",
             collective_name(kind), g.name(), dtype_name(dtype));
}

WorkPtr ProcessGroup::reduce_scatter_tensor(const Tensor& out, const Tensor& in, ReduceOp op) {
  Collective c = make(CollectiveKind::reduce_scatter, out, in);
  check_reduce(*this, c.info.kind, c.info.dtype, op);
  c.info.op = op;
  return issue(std::move(c));
}

WorkPtr ProcessGroup::all_reduce(const Tensor& tensor, ReduceOp op) {
  Collective c = make(CollectiveKind::all_reduce, tensor, tensor);
  check_reduce(*this, c.info.kind, c.info.dtype, op);
  c.info.op = op;
  return issue(std::move(c));
}

WorkPtr ProcessGroup::broadcast(const Tensor& tensor, int root) {
  WEFT_CHECK(root >= 0 && root < size_, "broadcast on group '{}': root {} is not a rank of this group (size {})",
             name_, root, size_);
  Collective c = make(CollectiveKind::broadcast, tensor, tensor);
  c.info.root = root;
  return issue(std::move(c));
}

WorkPtr ProcessGroup::barrier() {
  Collective c = make(CollectiveKind::barrier, {}, {});
  return issue(std::move(c));
}

WorkPtr ProcessGroup::all_to_all_single(const Tensor& out, const Tensor& in) {
  Collective c = make(CollectiveKind::all_to_all, out, in);
  return issue(std::move(c));
}

}  // namespace weft::dist
