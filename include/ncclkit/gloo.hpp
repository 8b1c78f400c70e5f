#pragma once
/// Entry header for the CPU backend: everything of <ncclkit/store.hpp>, gloo::Communicator and
/// init(). Link ncclkit::gloo (CMake), or Gloo (-lgloo) by hand. Not for .cu files: Gloo's
/// reduction loops use GCC vector extensions that nvcc's front end rejects.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include "ncclkit/bootstrap/init.hpp"
#include "ncclkit/gloo/communicator.hpp"
#include "ncclkit/store.hpp"
