#pragma once
// What the tests against the fake CUDA runtime and NCCL (tests/support/fake_cuda_nccl.hpp)
// share: a fresh fake per test and its final check, a one-rank job with a store, options with a
// short timeout, and helpers for expected exceptions and polling.
#include <doctest/doctest.h>

#include <chrono>      // std::chrono
#include <exception>   // std::exception
#include <functional>  // std::function
#include <memory>      // std::shared_ptr
#include <string>      // std::string
#include <thread>      // std::this_thread::sleep_for

#include "ncclkit/bootstrap/init_url.hpp"
#include "ncclkit/bootstrap/world_info.hpp"
#include "ncclkit/nccl/options.hpp"
#include "ncclkit/store/store.hpp"
#include "support/fake_cuda_nccl.hpp"
#include "support/temp_dir.hpp"
#include "support/text.hpp"

namespace ncclkit_test {

inline constexpr std::chrono::milliseconds kFakeTimeout{1000};

/// Options named `name` with kFakeTimeout. Fields set one by one: with designated
/// initialisers, GCC 12's -Wextra warns about every member left out.
inline ncclkit::nccl::Options fake_options(const char* name) {
  ncclkit::nccl::Options result;
  result.timeout = kFakeTimeout;
  result.name = name;
  return result;
}

/// Polls `done` every millisecond until it holds (true) or `limit` passes (false).
inline bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

/// The message of the `Expected` that `call` throws; a failed check (and an empty message)
/// when it throws nothing or something else.
template <class Expected, class Call>
std::string message_of(Call&& call) {
  try {
    call();
  } catch (const Expected& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL_CHECK("the call threw another exception: " << e.what());
    return {};
  }
  FAIL_CHECK("the call did not throw the expected exception");
  return {};
}

/// Starts each test from a fresh fake; at the end, after everything the test made is gone,
/// the test calls check_clean().
struct FakeSession {
  FakeSession() { fake::reset(2); }
  static void check_clean() {
    CHECK_MESSAGE(fake::use_after_abort() == 0, "use after abort: " << fake::violations_text());
    CHECK_MESSAGE(fake::violations().empty(), "violations: " << fake::violations_text());
  }
};

/// A one-rank job with a FileStore, for the Communicator's store path (progress, announcement).
struct OneRankJob {
  TempDir dir{"fake-nccl"};
  ncclkit::WorldInfo world;
  std::shared_ptr<ncclkit::Store> store;
  OneRankJob() {
    world.init_url = "file://" + dir.path;
    store = ncclkit::make_store(world.init_url, world);
  }
};

}  // namespace ncclkit_test
