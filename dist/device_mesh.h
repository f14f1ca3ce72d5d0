// dist: DeviceMesh, the world's ranks laid out as a 1-D or 2-D grid (row-major: the last dim varies fastest), with one
// ProcessGroup per dim for the ranks that differ only along it. HSDP uses DeviceMesh(cpu, {replicas, shards},
// {"replicate", "shard"}): parameters are sharded over the "shard" group (neighbouring ranks, e.g. one host) and
// gradients averaged over the "replicate" group.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "../core/device.h"
#include "process_group.h"

namespace weft::dist {

class DeviceMesh {
 public:
  // A collective call on every rank. The product of `shape` must equal dist::world_size();
  // names default to "dim0", "dim1". MPI groups for cpu, NCCL groups for cuda.
  DeviceMesh(DeviceType device, std::vector<int> shape, std::vector<std::string> dim_names = {});
  // The 1-D mesh over all ranks.
  explicit DeviceMesh(DeviceType device = DeviceType::cpu);
  // A mesh over groups that exist already (one per dim; this rank at `coordinate`), e.g.
  // dist::fake_mesh's. Not collective.
  DeviceMesh(DeviceType device, std::vector<int> shape, std::vector<std::string> dim_names, std::vector<int> coordinate,
             std::vector<ProcessGroupPtr> groups);

  DeviceType device_type() const { return device_; }
  int ndim() const { return int(shape_.size()); }
  const std::vector<int>& shape() const { return shape_; }
  int size(int dim) const;
  const std::vector<std::string>& dim_names() const { return names_; }

  const ProcessGroupPtr& group(int dim = 0) const;
  const ProcessGroupPtr& group(std::string_view dim_name) const;

  const std::vector<int>& coordinate() const { return coord_; }  // of this rank
  int coordinate(int dim) const;
  int rank_at(const std::vector<int>& coordinate) const;  // world rank at a coordinate
  std::string str() const;  // "DeviceMesh(cpu, replicate=2 x shard=2)"

 private:
  int dim_index(std::string_view name) const;
  DeviceType device_;
  std::vector<int> shape_;
  std::vector<std::string> names_;
  std::vector<int> coord_;
  std::vector<ProcessGroupPtr> groups_;
};

// The shared mesh of `shape` over the world (empty: 1-D over all ranks) for `device`, e.g. fully_shard's default mesh:
// every caller asking for the same device and shape gets the same groups. Created on first use (a collective call on
// every rank); owned by dist's process state and released by dist::finalize().
std::shared_ptr<DeviceMesh> default_mesh(DeviceType device, const std::vector<int>& shape = {});

}  // namespace weft::dist
