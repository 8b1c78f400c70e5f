#pragma once
/// Entry header for the data-parallel trainer template (docs/trainer.md): DataParallelTrainer,
/// the Model and Dataset concepts, DistributedSampler, Optimizer (SGD, AdamW), LrSchedule,
/// TrainerOptions and checkpoints. Generic host code: include it with <ncclkit/gloo.hpp> or
/// <ncclkit/nccl.hpp> for a backend.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include "ncclkit/compression.hpp"
#include "ncclkit/trainer/checkpoint.hpp"
#include "ncclkit/trainer/data_parallel.hpp"
#include "ncclkit/trainer/model.hpp"
#include "ncclkit/trainer/optimizer.hpp"
#include "ncclkit/trainer/options.hpp"
#include "ncclkit/trainer/progress.hpp"
#include "ncclkit/trainer/sampler.hpp"
#include "ncclkit/trainer/schedule.hpp"
