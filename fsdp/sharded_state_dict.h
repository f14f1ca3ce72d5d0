// fsdp: sharded state dicts, as FSDP2's: each rank's own pieces of the model's and the optimizer's tensors with where
// each piece sits in the global tensor. Building one needs no communication (the model's pieces are views of the
// shards, not copies), loading one back in place needs none either, and `assemble_from_pieces` fills this rank's piece
// from pieces cut for any other number of ranks (resharding; see fsdp/checkpoint.h).
//
// Keys: the model's as Module::state_dict() (a parameter tied to another is listed once, under its first name); the
// optimizer's by parameter name, not position: "state.<parameter name>.<state>" (exp_avg, exp_avg_sq, momentum_buffer,
// ...; "step" too) and "param_groups.<g>.<option>".
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fully_shard.h"
#include "../nn/optimizer.h"
#include "../tp/split.h"

namespace weft::fsdp {

// Where a piece sits in its global tensor: indices [offset, offset + length) of `dim` and all
// of the other dims of the part `split` names (tp/split.h: a tensor-parallel part; not split:
// the global tensor itself); `dim` -1 means the whole part (held by every rank: buffers, step
// counts, options, parameters FSDP does not shard). A 0-dim tensor counts as shape [1].
struct Placement {
  Shape global_shape;
  int64_t dim = -1;
  int64_t offset = 0, length = 0;
  tp::Split split;

  bool whole() const { return dim < 0 && !split.split(); }
  Shape local_shape() const;  // the piece's own shape
  bool operator==(const Placement&) const = default;
  std::string str() const;  // "[0, 4) of dim 0 of [7, 3]", "whole [7, 3]", "[0, 2) of dim 0 of part 1 of 2 along dim 1 of [7, 4]"
  static Placement of_whole(const Shape& shape);
  static Placement of(const ShardInfo& info);
};

struct ShardedTensor {
  Tensor local;  // shaped placement.local_shape()
  Placement placement;
};
using ShardedStateDict = std::vector<std::pair<std::string, ShardedTensor>>;

// This rank's piece of every parameter and buffer. `root` null: the model is not sharded (every tensor whole).
ShardedStateDict sharded_state_dict(nn::Module& model, const FSDPModule* root = nullptr);
// The optimizer's state keyed by parameter names, per-element states placed like their
// parameter. `model` names the optimizer's parameters (see optimizer_param_names).
ShardedStateDict sharded_optimizer_state_dict(const nn::Optimizer& opt, nn::Module& model,
                                              const FSDPModule* root = nullptr);

// Loads a sharded state dict of this same layout back into place (values copied, dtypes converted): every key must be
// present with this rank's placement and no other key may be; all of it is checked before anything is written.
void load_sharded_state_dict(nn::Module& model, const ShardedStateDict& sd, const FSDPModule* root = nullptr);
void load_sharded_optimizer_state_dict(nn::Optimizer& opt, nn::Module& model, const ShardedStateDict& sd,
                                       const FSDPModule* root = nullptr);

// ---- building blocks

// The placement of this rank's piece of parameter `name` (whole unless `root` shards it).
Placement param_placement(const FSDPModule* root, const std::string& name, const Tensor& param);
// Names of the optimizer's parameters in its order (groups concatenated), found in `model`
// by identity; an optimizer parameter the model does not hold is an error.
std::vector<std::string> optimizer_param_names(const nn::Optimizer& opt, nn::Module& model);
// Parameters listed under a second name because they are tied: second name -> first name.
std::map<std::string, std::string> tied_parameter_names(nn::Module& model);
// Optimizer state dict keys between positions ("state.3.exp_avg") and names
// ("state.fc2.weight.exp_avg"); other keys pass unchanged.
nn::NamedTensorList name_optimizer_state(const nn::NamedTensorList& positional, const std::vector<std::string>& names);
nn::NamedTensorList position_optimizer_state(const nn::NamedTensorList& named, const std::vector<std::string>& names);
// "state.<name>.<state>" -> {name, state}; false for other keys.
bool split_optimizer_state_key(const std::string& key, std::string& param, std::string& state);

// A hash of the keys, global shapes and dtypes (not the placements), for checking that the
// ranks hold the same entries before they exchange them.
uint64_t keys_fingerprint(const ShardedStateDict& sd);

// A piece of a global tensor available to be read: `read` is called only when the piece
// overlaps the wanted one; `where` names its source in errors (a file, a rank).
struct Piece {
  Placement placement;
  std::function<Tensor()> read;
  std::string where;
};
// Fills `dst` (shaped want.local_shape()) from `pieces` of the same global tensor `name`, cut for any layout. Throws
// naming `name` if a piece is shaped unlike its placement or the pieces leave part of `want` uncovered.
void assemble_from_pieces(const std::string& name, const Tensor& dst, const Placement& want,
                          const std::vector<Piece>& pieces);

}  // namespace weft::fsdp
