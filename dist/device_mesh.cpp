#include "dist/device_mesh.h"

#include <fmt/ranges.h>

#include "dist/backend.h"
#include "dist/check.h"
#include "dist/config_check.h"
#include "dist/dist.h"

namespace weft::dist {

DeviceMesh::DeviceMesh(DeviceType device) : DeviceMesh(device, {world_size()}) {}

DeviceMesh::DeviceMesh(DeviceType device, std::vector<int> shape, std::vector<std::string> dim_names)
    : device_(device), shape_(std::move(shape)), names_(std::move(dim_names)) {
  detail::check_initialized("DeviceMesh");
  // Every check depends only on the arguments and the world size, which all ranks share, so
  // a bad mesh throws on every rank and none is left waiting in MPI_Comm_split.
  std::string shape_s = fmt::format("[{}]", fmt::join(shape_, ", "));
  WEFT_CHECK(ndim() == 1 || ndim() == 2, "DeviceMesh: shape {} has {} dims; 1-D and 2-D meshes are supported",
             shape_s, ndim());
  int64_t product = 1;
  for (int s : shape_) {
    WEFT_CHECK(s > 0, "DeviceMesh: shape {} has a dim of size {}", shape_s, s);
    product *= s;
  }
  WEFT_CHECK(product == world_size(),
             "DeviceMesh: shape {} holds {} ranks but the world has {} (mpirun -np {}); the product of the "
             "mesh's dims must equal the world size",
             shape_s, product, world_size(), world_size());
  if (names_.empty())
    for (int d = 0; d < ndim(); ++d) names_.push_back(fmt::format("dim{}", d));
  WEFT_CHECK(int(names_.size()) == ndim(), "DeviceMesh: shape {} has {} dims but {} names were given", shape_s,
             ndim(), names_.size());
  WEFT_CHECK(ndim() == 1 || names_[0] != names_[1], "DeviceMesh: both dims are named '{}'", names_[0]);

  // The same mesh on every rank, before the splits (a rank left out would wait in them for ever).
  check_same_config({{"the mesh's device", device_type_name(device)}, {"the mesh's shape", shape_s},
                     {"the mesh's dim names", fmt::format("{}", fmt::join(names_, ", "))}},
                    "DeviceMesh", world(), "every rank must build the same meshes in the same order");
  int r = rank();
  coord_.resize(size_t(ndim()));
  for (int d = ndim() - 1, rest = r; d >= 0; --d) {
    coord_[size_t(d)] = rest % shape_[size_t(d)];
    rest /= shape_[size_t(d)];
  }
  detail::QuietEngine quiet;  // MPI_Comm_split must not progress collectives outside the engine
  for (int d = 0; d < ndim(); ++d) {
    // Ranks that agree on every other coordinate form dim d's group, ordered along d.
    int color = ndim() == 1 ? 0 : coord_[size_t(1 - d)];
    MPI_Comm comm;
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, coord_[size_t(d)], &comm));
    std::string name = fmt::format("{}{}", names_[size_t(d)], detail::ranks_str(detail::world_ranks_of(comm)));
    groups_.push_back(detail::new_group(device, comm, std::move(name)));
  }
}

DeviceMesh::DeviceMesh(DeviceType device, std::vector<int> shape, std::vector<std::string> dim_names,
                       std::vector<int> coordinate, std::vector<ProcessGroupPtr> groups)
    : device_(device), shape_(std::move(shape)), names_(std::move(dim_names)), coord_(std::move(coordinate)),
      groups_(std::move(groups)) {
  WEFT_CHECK(!shape_.empty() && names_.size() == shape_.size() && coord_.size() == shape_.size() &&
                 groups_.size() == shape_.size(),
             "DeviceMesh: {} dims need as many names, coordinates and groups (got {}, {}, {})", shape_.size(),
             names_.size(), coord_.size(), groups_.size());
  for (size_t d = 0; d < shape_.size(); ++d)
    WEFT_CHECK(groups_[d] && groups_[d]->size() == shape_[d] && groups_[d]->rank() == coord_[d],
               "DeviceMesh: the group of dim {} is not rank {} of {}", d, coord_[d], shape_[d]);
}

int DeviceMesh::size(int dim) const {
  WEFT_CHECK(dim >= 0 && dim < ndim(), "DeviceMesh::size: dim {} out of range for {}", dim, str());
  return shape_[size_t(dim)];
}

int DeviceMesh::dim_index(std::string_view name) const {
  for (int d = 0; d < ndim(); ++d)
    if (names_[size_t(d)] == name) return d;
  WEFT_ERROR("DeviceMesh: no dim named '{}' in {}", name, str());
}

const ProcessGroupPtr& DeviceMesh::group(int dim) const {
  WEFT_CHECK(dim >= 0 && dim < ndim(), "DeviceMesh::group: dim {} out of range for {}", dim, str());
  return groups_[size_t(dim)];
}

const ProcessGroupPtr& DeviceMesh::group(std::string_view dim_name) const { return groups_[size_t(dim_index(dim_name))]; }

int DeviceMesh::coordinate(int dim) const {
  WEFT_CHECK(dim >= 0 && dim < ndim(), "DeviceMesh::coordinate: dim {} out of range for {}", dim, str());
  return coord_[size_t(dim)];
}

int DeviceMesh::rank_at(const std::vector<int>& coordinate) const {
  WEFT_CHECK(int(coordinate.size()) == ndim(), "DeviceMesh::rank_at: {} coordinates for {}", coordinate.size(), str());
  int r = 0;
  for (int d = 0; d < ndim(); ++d) {
    int c = coordinate[size_t(d)];
    WEFT_CHECK(c >= 0 && c < shape_[size_t(d)], "DeviceMesh::rank_at: coordinate {} out of range along '{}' in {}", c,
               names_[size_t(d)], str());
    r = r * shape_[size_t(d)] + c;
  }
  return r;
}

std::string DeviceMesh::str() const {
  std::string dims;
  for (int d = 0; d < ndim(); ++d) dims += fmt::format("{}{}={}", d ? " x " : "", names_[size_t(d)], shape_[size_t(d)]);
  return fmt::format("DeviceMesh({}, {})", device_ == DeviceType::cpu ? "cpu" : "cuda", dims);
}

}  // namespace weft::dist
