// nn: everything a model author needs — Module, layers, containers, transformer blocks,
// losses, initialisers, optimizers, learning-rate schedules and generation with a KV cache.
#pragma once
#include "nn/activation_checkpoint.h"
#include "nn/clip_grad.h"
#include "nn/containers.h"
#include "nn/generate.h"
#include "nn/init.h"
#include "nn/kv_cache.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/materialize.h"
#include "nn/module.h"
#include "nn/optimizer.h"
#include "nn/scheduler.h"
#include "nn/llama.h"
#include "nn/qwen3.h"
#include "nn/transformer.h"
#include "nn/tree_sum.h"
