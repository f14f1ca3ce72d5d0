// fsdp: fully sharded data parallelism — fully_shard, FSDPModule, options. See docs/FSDP.md.
#pragma once
#include "fsdp/fully_shard.h"
#include "fsdp/options.h"
