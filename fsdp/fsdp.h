// fsdp: fully sharded data parallelism — fully_shard, FSDPModule, options, state dicts and
// checkpoints. See docs/FSDP.md and docs/CHECKPOINTS.md.
#pragma once
#include "fsdp/fully_shard.h"
#include "fsdp/options.h"
#include "fsdp/clip_grad.h"
#include "fsdp/summon_full_params.h"
#include "fsdp/wrap.h"
#include "fsdp/memory_plan.h"
#include "fsdp/state_dict.h"
#include "fsdp/sharded_state_dict.h"
#include "fsdp/checkpoint.h"
#include "fsdp/external_checkpoint.h"
