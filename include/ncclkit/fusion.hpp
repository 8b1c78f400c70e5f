#pragma once
/// Entry header for gradient fusion over any backend: FusedLayout (tensors laid out in one
/// allocation per element type), BucketPlan, ReadyTracker, FusedBuffer<Backend> (the views) and
/// GradientSync<Backend> (buckets reduced in place as they become ready), TunedGradientSync<Backend>
/// (the same, its bucket cap timed over the first steps). Generic host code:
/// include it with <ncclkit/gloo.hpp> or <ncclkit/nccl.hpp> for a backend (docs/fusion.md).

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include "ncclkit/compression/codec.hpp"
#include "ncclkit/fusion/bucket_plan.hpp"
#include "ncclkit/fusion/fused_buffer.hpp"
#include "ncclkit/fusion/gradient_sync.hpp"
#include "ncclkit/fusion/layout.hpp"
#include "ncclkit/fusion/ready_tracker.hpp"
#include "ncclkit/fusion/tuned_sync.hpp"
#include "ncclkit/fusion/timeline.hpp"
