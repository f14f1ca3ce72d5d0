// fsdp: one sharded parameter. Its global tensor is cut along `shard_dim` into world-size chunks of torch.chunk's size
// (the last ones zero-padded so every rank holds the same number of elements). The module's registered parameter is
// this rank's unpadded chunk, a leaf the optimizer steps; `unsharded` is the full parameter used in forward and
// backward, whose storage exists only between unshard and reshard.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../core/partial_reduction.h"
#include "../nn/module.h"

namespace weft::fsdp {

class FSDPParam {
 public:
  // `slots`: every module slot that holds this parameter (tied parameters have several).
  // `name`: its first dotted name under the module fully_shard was called on. It writes all
  // of its padded chunk of `shard_storage` (which may be uninitialised) once.
  FSDPParam(std::string name, std::vector<Tensor*> slots, int64_t shard_dim, int rank, int world,
            const Tensor& shard_storage, int64_t storage_offset);

  const std::string& name() const { return name_; }
  const Shape& global_shape() const { return global_shape_; }
  int64_t shard_dim() const { return shard_dim_; }
  DType dtype() const { return sharded_.dtype(); }
  bool requires_grad() const { return requires_grad_; }
  int64_t padded_numel() const { return padded_numel_; }  // per rank, incl. padding
  int64_t storage_offset() const { return offset_; }      // in the group's flat shard buffer
  // Where its padded chunk sits in the group's gradient buffers (the reduce-scatter's columns),
  // which hold only the parameters that require gradients; -1 for a frozen one.
  int64_t grad_offset() const { return grad_offset_; }
  void set_grad_offset(int64_t offset) { grad_offset_ = offset; }
  // The sharded parameter (registered in the module between steps, stepped by the optimizer).
  const Tensor& sharded() const { return sharded_; }
  // This rank's padded chunk as a flat view [padded_numel] of the group's shard buffer.
  const Tensor& padded_flat() const { return padded_flat_; }
  const Tensor& unsharded() const { return unsharded_; }
  // The PartialReduction of the parameter fully_shard was given (a tensor-parallel part's:
  // tp/split.h), which the shard's continues; null when it was held whole.
  const std::shared_ptr<const PartialReduction>& held_in_part() const { return held_in_part_; }
  void set_held_in_part(std::shared_ptr<const PartialReduction> r) { held_in_part_ = std::move(r); }

  // Copies the global values of `full` (shape global_shape) into this rank's chunk.
  void load_full(const Tensor& full);
  // Computes this rank's chunk from a meta parameter's recorded init rule (deferred
  // initialisation): only this rank's elements, never the full tensor; padding stays zero.
  void init_from_rule(const Tensor& meta);
  // Writes the full value into `dst` (global shape) from an all-gathered buffer [ranks, cols]
  // whose columns [column_offset, column_offset + padded) hold each rank's padded chunk, the
  // parameter being cut into `ranks` chunks (0: the shard group's size).
  void assemble_into(const Tensor& gathered, int64_t column_offset, const Tensor& dst, int ranks = 0) const;
  // Builds the unsharded parameter from an all-gathered buffer [ranks, cols] as above.
  void copy_out(const Tensor& gathered, DType unsharded_dtype, int64_t column_offset, int ranks = 0);
  // Elements of one padded chunk when cut into `ranks` chunks.
  int64_t padded_numel_for(int ranks) const;
  // Copies chunk `index` (of `ranks`) of the unsharded parameter into `flat` [padded_numel_for(ranks)],
  // zero padding included.
  void copy_chunk_of_unsharded(int index, int ranks, const Tensor& flat) const;
  // Packs the unsharded gradient into `send` [world, grad_numel] at this param's gradient
  // columns, zero padding included, converted to send's dtype (nothing for a frozen one, or one
  // no gradient reached: its columns stay zero for the other ranks' sums).
  void copy_in_grad(const Tensor& send);
  // Whether a gradient reached it since its last reduction (packed or still unsharded).
  bool grad_reached() const { return grad_packed_ || (requires_grad_ && has_unsharded_grad()); }
  // Adds this rank's reduced chunk (flat [padded] slice of the reduce-scatter output) into the sharded parameter's
  // .grad; nothing where no gradient reached it (its .grad stays as it was, undefined after zero_grad, so the optimizer
  // passes over it as over an unused parameter in one process). Every rank must leave the same parameters without one:
  // the reduce-scatter's label names them, so the collective check stops ranks that differ.
  void accumulate_sharded_grad(const Tensor& reduced_flat);
  // CPU offload of device parameters: new sharded gradients go to host memory pinned through `device`'s backend.
  void set_pin_grads(bool pin, Device device) { pin_grads_ = pin, pin_device_ = device; }
  void free_unsharded();  // the parameter's memory; an accumulated gradient stays
  // Gradient accumulation without sync: moves the unsharded parameter's .grad into an
  // accumulator of `dtype` (FSDP2 accumulates in the reduce dtype, not a lower param dtype).
  void accumulate_unsharded_grad(DType dtype);
  // The gradient to reduce: the accumulator if there is one, else the unsharded .grad.
  Tensor unsharded_grad() const;
  bool has_unsharded_grad() const;
  void clear_unsharded_grad();
  // Takes up a requires_grad set since on the registered parameter (FSDP2 follows it); true if it changed.
  bool follow_requires_grad();
  void use_sharded();
  void use_unsharded();

 private:
  void zero_padding() const {  // the padded chunk's rows past local_rows_
    if (local_rows_ < chunk_) chunk_view(padded_flat_).narrow(shard_dim_, local_rows_, chunk_ - local_rows_).zero_();
  }
  // View of a flat chunk as the chunk's own shape (padded extent `chunk` on shard_dim).
  Tensor chunk_view(const Tensor& flat, int64_t chunk = -1) const;
  std::vector<std::pair<Tensor, Tensor>> rank_blocks(const Tensor& full, const Tensor& buffer, int64_t offset,
                                                     int ranks) const;
  int64_t extent() const { return global_shape_.empty() ? 1 : global_shape_[size_t(shard_dim_)]; }
  std::string name_;
  std::vector<Tensor*> slots_;
  Shape global_shape_;
  int64_t shard_dim_;
  int rank_, world_;
  int64_t chunk_ = 0;       // extent of one rank's chunk along shard_dim (padded)
  int64_t local_rows_ = 0;  // real extent of this rank's chunk (<= chunk_)
  int64_t padded_numel_ = 0, offset_ = 0, grad_offset_ = -1;
  bool requires_grad_ = false;
  bool grad_packed_ = false;  // copy_in_grad packed a gradient since the last accumulate_sharded_grad
  bool pin_grads_ = false;
  Device pin_device_ = kCPU;
  Tensor padded_flat_, sharded_, unsharded_;
  Tensor accumulated_grad_;  // see accumulate_unsharded_grad
  std::shared_ptr<const PartialReduction> held_in_part_;
};

}  // namespace weft::fsdp
