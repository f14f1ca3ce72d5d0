// DeviceMesh: 1-D and 2-D (replicate x shard) meshes over the world, their sub-groups and
// coordinates, collectives inside sub-groups, and bad shapes (an error on every rank).
#include <catch2/catch.hpp>

#include "dist/device_mesh.h"
#include "dist/dist.h"

using namespace weft;
using namespace weft::dist;
using Catch::Contains;

TEST_CASE("1-D mesh: one group over the world") {
  DeviceMesh mesh;
  CHECK(mesh.ndim() == 1);
  CHECK(mesh.size(0) == world_size());
  CHECK(mesh.coordinate(0) == rank());
  auto g = mesh.group(0);
  CHECK(g->size() == world_size());
  CHECK(g->rank() == rank());
  CHECK(mesh.group("dim0") == g);
  Tensor x = full({4}, double(rank() + 1));
  g->all_reduce(x)->wait();
  CHECK(x[0].item() == world_size() * (world_size() + 1) / 2);
}

TEST_CASE("2-D mesh: replicate x shard groups and coordinates") {
  int n = world_size();
  // 2 x (n/2) where the world is even, else n x 1.
  int replicas = n % 2 == 0 ? 2 : n, shards = n / replicas;
  DeviceMesh mesh(DeviceType::cpu, {replicas, shards}, {"replicate", "shard"});
  INFO(mesh.str() << " on rank " << rank());
  int me = rank(), rep = me / shards, sh = me % shards;
  CHECK(mesh.coordinate() == std::vector<int>{rep, sh});
  CHECK(mesh.rank_at({rep, sh}) == me);
  CHECK(mesh.str() == "DeviceMesh(cpu, replicate=" + std::to_string(replicas) + " x shard=" + std::to_string(shards) + ")");

  auto shard = mesh.group("shard"), replicate = mesh.group("replicate");
  CHECK(shard == mesh.group(1));
  CHECK(shard->size() == shards);
  CHECK(shard->rank() == sh);
  CHECK(replicate->size() == replicas);
  CHECK(replicate->rank() == rep);
  std::vector<int> shard_members, replicate_members;
  for (int s = 0; s < shards; ++s) shard_members.push_back(rep * shards + s);
  for (int r = 0; r < replicas; ++r) replicate_members.push_back(r * shards + sh);
  CHECK(shard->world_ranks() == shard_members);
  CHECK(replicate->world_ranks() == replicate_members);
  CHECK_THAT(shard->name(), Contains("shard["));

  // An all-gather inside the shard group sees only its own members, in shard order.
  Tensor in = full({2}, double(me)), out = empty({2 * shards});
  shard->all_gather_into_tensor(out, in)->wait();
  for (int s = 0; s < shards; ++s) CHECK(out[2 * s].item() == rep * shards + s);
  // HSDP's gradient path: reduce-scatter over the shard group, then average over replicas.
  Tensor grad = full({shards * 3}, double(me + 1)), part = empty({3});
  shard->reduce_scatter_tensor(part, grad)->wait();
  replicate->all_reduce(part, ReduceOp::avg)->wait();
  // sum over the shard group of (me + 1), averaged over replicas = (n + 1) * n / 2 / replicas
  CHECK(part[0].item() == Approx(double(n) * (n + 1) / 2 / replicas));
  // Collectives on different groups interleave freely as long as every rank issues them in
  // the same order.
  auto w1 = shard->barrier();
  auto w2 = replicate->barrier();
  auto w3 = world()->barrier();
  w3->wait();
  w2->wait();
  w1->wait();
}

TEST_CASE("bad meshes throw on every rank") {
  int n = world_size();
  CHECK_THROWS_WITH(DeviceMesh(DeviceType::cpu, {n + 1}),
                    Contains("holds " + std::to_string(n + 1) + " ranks but the world has " + std::to_string(n)));
  CHECK_THROWS_WITH(DeviceMesh(DeviceType::cpu, {2, n}), Contains("must equal the world size"));
  CHECK_THROWS_WITH(DeviceMesh(DeviceType::cpu, {n, 1, 1}), Contains("1-D and 2-D"));
  CHECK_THROWS_WITH(DeviceMesh(DeviceType::cpu, {n, 0}), Contains("size 0"));
  CHECK_THROWS_WITH(DeviceMesh(DeviceType::cpu, {n, 1}, {"a"}), Contains("names"));
  CHECK_THROWS_WITH(DeviceMesh(DeviceType::cpu, {n, 1}, {"a", "a"}), Contains("both dims are named 'a'"));
  DeviceMesh mesh(DeviceType::cpu, {1, n}, {"replicate", "shard"});
  CHECK_THROWS_WITH(mesh.group("tensor"), Contains("no dim named 'tensor'"));
  CHECK_THROWS_WITH(mesh.group(2), Contains("out of range"));
  CHECK(mesh.group("replicate")->size() == 1);
}

TEST_CASE("ranks that build different meshes stop on every rank, naming what differs") {
  const int n = world_size();
  if (n < 2) {
    WARN("ranks that disagree need at least 2 ranks; checked under mpirun -np 2 and 4");
    return;
  }
  // Rank 0 [1, n], the others [n, 1]: the splits had paired the wrong ranks (or waited for ever).
  const std::vector<int> shape = rank() == 0 ? std::vector<int>{1, n} : std::vector<int>{n, 1};
  CHECK_THROWS_WITH(DeviceMesh(DeviceType::cpu, shape), Contains("DeviceMesh: the ranks differ: the mesh's shape is [1, " +
                                                                  std::to_string(n) + "] on rank 0"));
  CHECK_THROWS_WITH(DeviceMesh(DeviceType::cpu, {n}, {rank() == 0 ? "shard" : "dp"}),
                    Contains("the mesh's dim names is shard on rank 0") && Contains("every rank must build the same meshes"));
  CHECK(DeviceMesh(DeviceType::cpu, {n}).group(0)->size() == n);  // the ranks are still in step
}
