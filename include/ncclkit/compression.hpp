#pragma once
/// Entry header for gradient compression: codecs (fp16, bf16) and `compressed(...)`, the
/// reducer that makes a GradientSync send float32 buckets in 16 bits (separate casts, one fused
/// kernel where the backend has it, or a float32 rerun of overflowing chunks). Includes the
/// fusion layer it plugs into (docs/fusion.md, "Compression").

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include "ncclkit/compression/codec.hpp"
#include "ncclkit/compression/compressed.hpp"
#include "ncclkit/fusion.hpp"
