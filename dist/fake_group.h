// dist: groups of ranks that do not exist, for planning. A fake group of `size` ranks lives on the meta device and
// stands for rank `rank` of it: its collectives check their tensors as any group's do, then complete at once without
// moving data (meta tensors hold none). Sharding a meta model over a fake mesh runs its training step as one rank of N
// would, in one process and without MPI (fsdp::plan_memory). Like torch.distributed's "fake" backend. A step trace
// (core/step_trace.h) records each collective's start and the wait for it.
#pragma once
#include <memory>
#include <string>

#include "device_mesh.h"
#include "process_group.h"

namespace weft::dist {

ProcessGroupPtr fake_group(int rank, int size, std::string name = "fake");
// The 1-D mesh of a fake group: rank `rank` of `size`.
std::shared_ptr<DeviceMesh> fake_mesh(int rank, int size);

}  // namespace weft::dist
