#pragma once
/// Entry header for gradient fusion over any backend: FusedLayout (tensors laid out in one
/// allocation per element type), BucketPlan, ReadyTracker, FusedBuffer<Backend> (the views) and
/// GradientSync<Backend> (buckets reduced in place as they become ready, the bucket cap fixed or
/// tuned over the first steps), the bucket-reducer seam and its default, the all_reduce.
/// Generic host code: include it with <ncclkit/gloo.hpp> or <ncclkit/nccl.hpp> for a backend,
/// and <ncclkit/compression.hpp> for 16-bit gradients (docs/fusion.md).

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include "ncclkit/fusion/all_reduce_reducer.hpp"
#include "ncclkit/fusion/bucket_plan.hpp"
#include "ncclkit/fusion/fused_buffer.hpp"
#include "ncclkit/fusion/gradient_sync.hpp"
#include "ncclkit/fusion/layout.hpp"
#include "ncclkit/fusion/observer.hpp"
#include "ncclkit/fusion/ready_tracker.hpp"
#include "ncclkit/fusion/reducer.hpp"
#include "ncclkit/fusion/timeline.hpp"
#include "ncclkit/fusion/tuning.hpp"
