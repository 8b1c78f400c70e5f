#pragma once
/// Exception types. Every failure ncclkit reports is an `ncclkit::Error`; its message says
/// what failed (rank, operation, sizes, time waited where relevant) and what to do about it.
///
/// Every ncclkit header that needs C++20 includes this one first, so an older language mode
/// stops here with one message instead of hundreds of errors about std::span and std::bit_cast.

#if __cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L)
#error \
    "ncclkit needs C++20: compile with -std=c++20 (g++, clang++ and nvcc alike). In CMake, link ncclkit::ncclkit (it asks for C++20, for CUDA sources too) and do not set CMAKE_CXX_STANDARD or CMAKE_CUDA_STANDARD below 20."
// A missing header is a fatal error: the compiler stops after the message above.
#include <ncclkit-stops-here-it-needs-c++20>
#endif

#include <stdexcept>  // std::runtime_error
#include <string>     // std::string

namespace ncclkit {

/// Base of all ncclkit errors.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A blocking call ran past its timeout. The message names what was awaited and for how long.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

/// A communicator (or a peer it talks to) failed; the communicator is unusable afterwards.
class CommError : public Error {
 public:
  using Error::Error;
};

/// Wrong or contradictory configuration: arguments, environment variables, init URLs.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// A store failed for a reason other than a timeout (I/O error, protocol violation, lost server).
class StoreError : public Error {
 public:
  using Error::Error;
};

/// A CUDA runtime call failed.
class CudaError : public Error {
 public:
  using Error::Error;
};

/// An NCCL call failed.
class NcclError : public Error {
 public:
  using Error::Error;
};

}  // namespace ncclkit
