// tp: tensor parallelism — layers split over the ranks of a group (Megatron's column- and
// row-parallel Linear), their collectives as differentiable ops, and plans per model family.
// Sits beside fsdp on nn and dist (fsdp may use it).
#pragma once
#include "tp/collectives.h"
#include "tp/gpt2_plan.h"
#include "tp/llama_plan.h"
#include "tp/parallel_style.h"
#include "tp/split.h"
#include "tp/vocab_parallel_loss.h"
