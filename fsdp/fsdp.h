// fsdp: fully sharded data parallelism — fully_shard, FSDPModule, options, state dicts and
// checkpoints. See docs/FSDP.md and docs/CHECKPOINTS.md.
#pragma once
#include "fully_shard.h"
#include "options.h"
#include "clip_grad.h"
#include "summon_full_params.h"
#include "wrap.h"
#include "memory_plan.h"
#include "state_dict.h"
#include "sharded_state_dict.h"
#include "checkpoint.h"
#include "external_checkpoint.h"
