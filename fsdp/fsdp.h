// fsdp: fully sharded data parallelism — fully_shard, FSDPModule, options. See docs/FSDP.md.
#pragma once
#include "fsdp/fully_shard.h"
#include "fsdp/options.h"
#include "fsdp/clip_grad.h"
#include "fsdp/summon_full_params.h"
#include "fsdp/wrap.h"
#include "fsdp/state_dict.h"
