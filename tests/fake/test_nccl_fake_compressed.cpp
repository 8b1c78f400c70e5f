// Why prepare_compressed_reduce gives no fused 16-bit all-reduce, against the fake CUDA runtime
// and NCCL of tests/support/fake_cuda_nccl.hpp (one rank, no device API): each reason is said by
// compressed_reduce_unavailable(), and a reason the user can mend (the kernels not compiled in,
// a runtime NCCL of another minor version, no device API in the NCCL loaded) is a warning, once
// per communicator, while a choice (Options::compressed_reduce = false) is not.
// tests/gpu/test_nccl_fusion.cpp makes the window check fail on real GPUs.
#include <doctest/doctest.h>

#include <optional>  // std::optional
#include <string>    // std::string

#include "fake/fake_session.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/detail/kernel_hooks.hpp"
#include "ncclkit/nccl/detail/nccl_version.hpp"
#include "support/fake_cuda_nccl.hpp"
#include "support/stderr_capture.hpp"

namespace {

namespace fake = ncclkit_test::fake;
using ncclkit::DataType;
using ncclkit::nccl::Communicator;
using ncclkit::nccl::Options;
using ncclkit_test::contains;
using ncclkit_test::FakeSession;
using ncclkit_test::OneRankJob;
using ncclkit_test::stderr_of;

constexpr const char* kWarning = "the fused compressed all-reduce cannot run";

// Stands in for the kernel of kernels.cuh, which a g++-only test cannot have; never launched
// here (the fake has no device API, so no workspace is made).
cudaError_t no_kernel(const ncclkit::nccl::detail::CompressedReduceArgs&, cudaStream_t) {
  return cudaErrorNotSupported;
}

// Sets the kernel hook for one test and clears it after.
struct KernelHook {
  explicit KernelHook(bool present) {
    ncclkit::nccl::detail::compressed_reduce_launcher() = present ? &no_kernel : nullptr;
  }
  ~KernelHook() { ncclkit::nccl::detail::compressed_reduce_launcher() = nullptr; }
  KernelHook(const KernelHook&) = delete;
  KernelHook& operator=(const KernelHook&) = delete;
};

// What prepare_compressed_reduce logged, and whether it gave a workspace.
struct Prepared {
  bool workspace = false;
  std::string log;
};
Prepared prepare(Communicator& comm, const std::string& file) {
  Prepared result;
  result.log = stderr_of(file, [&] {
    std::optional<Communicator::CompressedReduce> workspace = comm.prepare_compressed_reduce(1000, DataType::kFloat16);
    result.workspace = workspace.has_value();
  });
  return result;
}

}  // namespace

TEST_CASE("prepare_compressed_reduce without the kernels: none, the reason said, one warning per communicator") {
  FakeSession session;
  {
    OneRankJob job;
    KernelHook hook(false);
    Communicator comm(job.store, job.world, ncclkit_test::fake_options("unfused"));
    const std::string file = job.dir.path + "/log";
    const Prepared first = prepare(comm, file);
    CHECK_FALSE(first.workspace);
    const std::string why = comm.compressed_reduce_unavailable();
    CHECK_MESSAGE(contains(why, "include ncclkit/nccl/kernels.cuh in a file compiled by nvcc"), why);
    CHECK_MESSAGE(contains(first.log, std::string("warn] ncclkit: nccl communicator 'unfused'")), first.log);
    CHECK_MESSAGE(contains(first.log, kWarning), first.log);
    CHECK_MESSAGE(contains(first.log, "include ncclkit/nccl/kernels.cuh"), first.log);
    const Prepared second = prepare(comm, file);
    CHECK_FALSE(second.workspace);
    CHECK_MESSAGE(!contains(second.log, kWarning), "warned twice: " << second.log);
    // Another communicator warns once of its own.
    Communicator other(job.store, job.world, ncclkit_test::fake_options("other"));
    CHECK(contains(prepare(other, file).log, kWarning));
  }
  FakeSession::check_clean();
}

TEST_CASE("prepare_compressed_reduce turned off by Options: none, said, and no warning") {
  FakeSession session;
  {
    OneRankJob job;
    KernelHook hook(true);
    Options options = ncclkit_test::fake_options("off");
    options.compressed_reduce = false;
    Communicator comm(job.store, job.world, options);
    const Prepared prepared = prepare(comm, job.dir.path + "/log");
    CHECK_FALSE(prepared.workspace);
    CHECK(contains(comm.compressed_reduce_unavailable(), "Options::compressed_reduce is false"));
    CHECK_MESSAGE(!contains(prepared.log, kWarning), prepared.log);
  }
  FakeSession::check_clean();
}

TEST_CASE("prepare_compressed_reduce with a runtime NCCL of another minor version: none, both versions named, warned") {
  FakeSession session;
  {
    OneRankJob job;
    KernelHook hook(true);
    const int running = NCCL_VERSION_CODE - 100;  // the minor version before the headers'
    fake::set_nccl_version(running);
    Communicator comm(job.store, job.world, ncclkit_test::fake_options("minor"));
    const Prepared prepared = prepare(comm, job.dir.path + "/log");
    CHECK_FALSE(prepared.workspace);
    const std::string why = comm.compressed_reduce_unavailable();
    const std::string built_text = ncclkit::nccl::detail::nccl_version_text(NCCL_VERSION_CODE);
    const std::string running_text = ncclkit::nccl::detail::nccl_version_text(running);
    CHECK_MESSAGE(contains(why, "built against NCCL " + built_text + " and runs with NCCL " + running_text), why);
    CHECK_MESSAGE(contains(why, "build ncclkit against the headers of the NCCL it runs with"), why);
    CHECK_MESSAGE(contains(prepared.log, kWarning), prepared.log);
    CHECK_MESSAGE(contains(prepared.log, running_text), prepared.log);
  }
  FakeSession::check_clean();
}

TEST_CASE("prepare_compressed_reduce with an NCCL a patch release apart: the version passes, no device API is warned") {
  FakeSession session;
  {
    OneRankJob job;
    KernelHook hook(true);
    // A patch release apart, either way, passes the version check; the fake then has no
    // ncclTeamLsa, as an NCCL library opened privately (RTLD_LOCAL) would not show it.
    const int patch = NCCL_VERSION_CODE % 100;
    for (const int running : {NCCL_VERSION_CODE + 1, patch > 0 ? NCCL_VERSION_CODE - 1 : NCCL_VERSION_CODE}) {
      CAPTURE(running);
      fake::set_nccl_version(running);
      Communicator comm(job.store, job.world, ncclkit_test::fake_options("patch"));
      const Prepared prepared = prepare(comm, job.dir.path + "/log");
      CHECK_FALSE(prepared.workspace);
      const std::string why = comm.compressed_reduce_unavailable();
      CHECK_MESSAGE(!contains(why, "major and minor version"), why);
      CHECK_MESSAGE(contains(why, "no device API (ncclTeamLsa): link libnccl 2.28 or newer"), why);
      CHECK_MESSAGE(contains(prepared.log, kWarning), prepared.log);
    }
  }
  FakeSession::check_clean();
}
