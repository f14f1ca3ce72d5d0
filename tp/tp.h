// tp: tensor parallelism — layers split over the ranks of a group (Megatron's column- and row-parallel Linear), their
// collectives as differentiable ops, and plans per model family. Sits beside fsdp on nn and dist (fsdp may use it).
#pragma once
#include "collectives.h"
#include "gpt2_plan.h"
#include "llama_plan.h"
#include "parallel_style.h"
#include "split.h"
#include "vocab_parallel_loss.h"
