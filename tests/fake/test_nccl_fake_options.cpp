// Options' ncclConfig_t knobs (CGA cluster size, min/max CTAs, network name, commName) against
// the fake CUDA runtime and NCCL of tests/support/fake_cuda_nccl.hpp: every NCCL communicator
// ncclkit makes (the control one, the working split, a user's split, a LocalGroup's members)
// gets them; values NCCL would refuse with a bare "invalid argument", or clamp silently, are
// ConfigErrors before NCCL is called. The fake checks configs as NCCL 2.28 does, so a config
// NCCL would refuse fails here too. tests/gpu/test_nccl_communicator.cu shows real NCCL
// acting on them. Also where work goes: the stream NCCL gets with and without a stream given
// (Options::stream, else CUDA's legacy default stream of the communicator's GPU), and events
// made once and recorded many times.
#include <doctest/doctest.h>

#include <climits>   // INT_MIN (NCCL_CONFIG_UNDEF_INT)
#include <memory>    // std::unique_ptr
#include <cstdlib>   // setenv, unsetenv
#include <optional>  // std::optional
#include <string>    // std::string, std::to_string
#include <utility>   // std::pair

#include "fake/fake_session.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/local_group.hpp"
#include "support/fake_cuda_nccl.hpp"

namespace {

namespace fake = ncclkit_test::fake;
using ncclkit::ConfigError;
using ncclkit::NcclError;
using ncclkit::nccl::Communicator;
using ncclkit::nccl::LocalGroup;
using ncclkit::nccl::Options;
using ncclkit_test::contains;
using ncclkit_test::FakeSession;
using ncclkit_test::message_of;
using ncclkit_test::OneRankJob;

Options tuned() {
  Options options = ncclkit_test::fake_options("tuned");
  options.cga_cluster_size = 2;
  options.min_ctas = 2;
  options.max_ctas = 4;
  options.net_name = "Socket";
  return options;
}

/// Checks that `comm` (a working communicator) and the control communicator it was split
/// from were both made with tuned()'s knobs and the name `name`.
void check_tuned(ncclComm_t comm, const std::string& name) {
  const ncclComm_t control = fake::parent_of(comm);
  REQUIRE(control != nullptr);
  for (ncclComm_t handle : {comm, control}) {
    const fake::ConfigSeen seen = fake::config_of(handle);
    CHECK(seen.cga_cluster_size == 2);
    CHECK(seen.min_ctas == 2);
    CHECK(seen.max_ctas == 4);
    CHECK(seen.has_net_name);
    CHECK(seen.net_name == "Socket");
    CHECK(seen.comm_name == name);
  }
  CHECK(fake::config_of(comm).blocking == 1);     // collectives run on a blocking one
  CHECK(fake::config_of(control).blocking == 0);  // init and split are polled through this one
}

}  // namespace

TEST_CASE("the NCCL knobs of Options reach every communicator: init, the working split, a user's split, a LocalGroup") {
  FakeSession session;
  {
    OneRankJob job;
    Communicator comm(job.store, job.world, tuned());
    check_tuned(comm.native(), "tuned");

    std::optional<Communicator> child = comm.split(0, 0);  // the parent's options
    REQUIRE(child.has_value());
    check_tuned(child->native(), "tuned.split");

    Options other = tuned();
    other.name = "other";
    other.net_name.clear();  // NCCL splits over the parent's network: empty takes the parent's
    std::optional<Communicator> inherits = comm.split(0, 0, other);
    REQUIRE(inherits.has_value());
    check_tuned(inherits->native(), "other");

    other.net_name = "sOcKeT";  // NCCL compares names case-insensitively
    CHECK(comm.split(0, 0, other).has_value());

    other.net_name = "IB";
    const std::string refused = message_of<ConfigError>([&] { (void)comm.split(0, 0, other); });
    CHECK(contains(refused, "split: Options::net_name is 'IB', but this communicator's is 'Socket'"));
    // NCCL_NET replaces both names inside NCCL: they cannot differ there.
    ::setenv("NCCL_NET", "Socket", 1);
    CHECK(comm.split(0, 0, other).has_value());
    ::unsetenv("NCCL_NET");

    // The split's own knobs are checked, and the message says it was a split.
    other.net_name.clear();
    other.max_ctas = 0;
    CHECK(contains(message_of<ConfigError>([&] { (void)comm.split(0, 0, other); }),
                   "split: Options::max_ctas 0 is out of range"));

    Communicator plain(job.store, job.world, ncclkit_test::fake_options("plain"));
    Options named = ncclkit_test::fake_options("named");
    named.net_name = "IB";
    CHECK(contains(message_of<ConfigError>([&] { (void)plain.split(0, 0, named); }),
                   "net_name is 'IB', but this communicator was made without one"));
  }
  {
    LocalGroup group({0, 1}, tuned());
    for (int i = 0; i < group.size(); ++i) check_tuned(group[i].native(), "tuned");
  }
  FakeSession::check_clean();
}

TEST_CASE("default Options leave NCCL's config undefined, so NCCL's defaults and NCCL_* variables apply") {
  FakeSession session;
  {
    OneRankJob job;
    Communicator comm(job.store, job.world, ncclkit_test::fake_options("plain"));
    const fake::ConfigSeen seen = fake::config_of(comm.native());
    CHECK(seen.cga_cluster_size == INT_MIN);
    CHECK(seen.min_ctas == INT_MIN);
    CHECK(seen.max_ctas == INT_MIN);
    CHECK_FALSE(seen.has_net_name);
    CHECK(seen.comm_name == "plain");
  }
  FakeSession::check_clean();
}

TEST_CASE("min_ctas alone makes a communicator (NCCL 2.28 refuses a minimum above an undefined maximum)") {
  FakeSession session;
  {
    OneRankJob job;
    Options options = ncclkit_test::fake_options("min-only");
    options.min_ctas = 16;
    Communicator comm(job.store, job.world, options);
    const fake::ConfigSeen seen = fake::config_of(comm.native());
    CHECK(seen.min_ctas == 16);
    CHECK(seen.max_ctas >= 64);  // above NCCL's channel limit, which NCCL caps it to

    options.min_ctas = -1;
    options.max_ctas = 3;  // a maximum alone was always accepted
    Communicator capped(job.store, job.world, options);
    CHECK(fake::config_of(capped.native()).max_ctas == 3);
    CHECK(fake::config_of(capped.native()).min_ctas == INT_MIN);
  }
  FakeSession::check_clean();
}

TEST_CASE("NCCL knobs out of range are ConfigErrors that name the field, before NCCL is called") {
  FakeSession session;
  struct Case {
    int cga, min_ctas, max_ctas;
    const char* expected;
  };
  const Case cases[] = {
      {9, -1, -1, "cga_cluster_size 9 is out of range; give 0..8"},
      {-2, -1, -1, "cga_cluster_size -2 is out of range"},
      {-1, 0, -1, "min_ctas 0 is out of range; give at least 1 CTA"},
      {-1, -7, -1, "min_ctas -7 is out of range"},
      {-1, -1, 0, "max_ctas 0 is out of range"},
      {-1, 5, 4, "min_ctas 5 is above Options::max_ctas 4"},
  };
  OneRankJob job;
  for (const Case& c : cases) {
    CAPTURE(c.expected);
    Options options = ncclkit_test::fake_options("bad");
    options.cga_cluster_size = c.cga;
    options.min_ctas = c.min_ctas;
    options.max_ctas = c.max_ctas;
    CHECK(contains(message_of<ConfigError>([&] { Communicator comm(job.store, job.world, options); }), c.expected));
    CHECK(contains(message_of<ConfigError>([&] { LocalGroup group({0}, options); }), c.expected));
  }
  Options zero_cluster = ncclkit_test::fake_options("zero-cluster");
  zero_cluster.cga_cluster_size = 0;  // 0 is valid: no clusters
  CHECK_NOTHROW(LocalGroup({0}, zero_cluster));

  Options nul = ncclkit_test::fake_options("nul");
  nul.net_name = std::string("Socket\0x", 8);
  CHECK(contains(message_of<ConfigError>([&] { LocalGroup group({0}, nul); }), "net_name contains a NUL"));
  CHECK(fake::live_comms() == 0);
  FakeSession::check_clean();
}

TEST_CASE("an init that fails as an unknown network does names the network asked for; other failures do not") {
  FakeSession session;
  {
    OneRankJob job;
    Options options = ncclkit_test::fake_options("no-net");
    options.net_name = "NoSuchNet";
    fake::fail_next_init(ncclInvalidUsage);  // NCCL: "Failed to initialize any NET plugin"
    CHECK(contains(message_of<NcclError>([&] { Communicator comm(job.store, job.world, options); }),
                   "Options::net_name is 'NoSuchNet': is it a network NCCL has here"));
    fake::fail_next_init(ncclInvalidUsage);
    CHECK(contains(message_of<NcclError>([&] { LocalGroup group({0}, options); }), "Options::net_name is 'NoSuchNet'"));

    fake::fail_next_init(ncclSystemError);  // not about the network
    CHECK_FALSE(contains(message_of<NcclError>([&] { Communicator comm(job.store, job.world, options); }), "net_name"));

    ::setenv("NCCL_NET", "Bogus", 1);  // NCCL takes the variable over the option
    fake::fail_next_init(ncclInvalidUsage);
    CHECK(contains(message_of<NcclError>([&] { Communicator comm(job.store, job.world, options); }),
                   "NCCL_NET='Bogus' chooses the network"));
    ::unsetenv("NCCL_NET");

    Options plain = ncclkit_test::fake_options("plain");
    fake::fail_next_init(ncclInvalidUsage);
    CHECK_FALSE(contains(message_of<NcclError>([&] { Communicator comm(job.store, job.world, plain); }), "net_name"));
  }
  CHECK(fake::live_comms() == 0);  // every failed init aborted what it made
  FakeSession::check_clean();
}

// ---- streams and events ------------------------------------------------------------------

namespace {

struct FreeStreamTestFloats {
  void operator()(float* data) const { (void)cudaFree(data); }
};
using StreamTestFloats = std::unique_ptr<float, FreeStreamTestFloats>;
constexpr std::size_t kStreamTestCount = 256;

}  // namespace

TEST_CASE("a collective without a stream runs on stream 0 of the communicator's GPU, after the caller's kernels") {
  FakeSession session;
  {
    OneRankJob job;
    Options on_1 = ncclkit_test::fake_options("default-stream");
    on_1.device = 1;  // not the current device (0): the legacy stream must be found on GPU 1
    Communicator comm(job.store, job.world, on_1);
    StreamTestFloats buffer(static_cast<float*>(comm.allocate(kStreamTestCount * sizeof(float))));
    CHECK(comm.default_stream() == cudaStreamLegacy);
    CHECK(comm.comm_stream() != cudaStreamLegacy);

    const long events_before = fake::events_created();
    comm.all_reduce(buffer.get(), buffer.get(), kStreamTestCount, ncclkit::ReduceOp::kAvg);  // no stream named anywhere
    fake::CallSeen seen = fake::last_call(comm.native());
    // NCCL's null stream is the legacy default stream, where kernel<<<grid, block>>>(...) ran:
    // the collective is ordered after it, and work launched there next is ordered after the
    // collective. On the communicator's own non-blocking stream it would race both.
    CHECK(seen.stream == nullptr);
    CHECK(seen.device == 1);
    CHECK(fake::current_device() == 0);  // left as it was
    comm.broadcast(buffer.get(), kStreamTestCount, 0);
    seen = fake::last_call(comm.native());
    CHECK(seen.stream == nullptr);
    CHECK(seen.device == 1);
    comm.synchronize();
    CHECK(fake::events_created() == events_before);  // no event or wait of its own

    // A given stream reaches NCCL as it is, with no device switch.
    comm.all_reduce(buffer.get(), buffer.get(), kStreamTestCount, ncclkit::ReduceOp::kSum, comm.comm_stream());
    seen = fake::last_call(comm.native());
    CHECK(seen.stream == comm.comm_stream());
    CHECK(seen.device == 0);
    comm.synchronize(comm.comm_stream());
  }
  FakeSession::check_clean();
}

TEST_CASE("Options::stream is where a collective without a stream runs") {
  FakeSession session;
  {
    OneRankJob job;
    ncclkit::nccl::Stream compute(0);
    Options options = ncclkit_test::fake_options("user-stream");
    options.stream = compute;
    Communicator comm(job.store, job.world, options);
    StreamTestFloats buffer(static_cast<float*>(comm.allocate(kStreamTestCount * sizeof(float))));
    CHECK(comm.default_stream() == compute.get());
    comm.all_reduce(buffer.get(), buffer.get(), kStreamTestCount);
    CHECK(fake::last_call(comm.native()).stream == compute.get());
    comm.synchronize();
  }
  FakeSession::check_clean();
}

// The fake's range is H100's and H200's: 0 (least) to -5 (greatest).
TEST_CASE("the comm stream gets the GPU's highest priority by default; a priority asked for is clamped to the range") {
  FakeSession session;
  {
    OneRankJob job;
    const auto priority_of = [](cudaStream_t stream) {
      int priority = 1;
      REQUIRE(cudaStreamGetPriority(stream, &priority) == cudaSuccess);
      return priority;
    };
    CHECK(Options{}.stream_priority == ncclkit::nccl::kHighestStreamPriority);
    // nullopt: the default, left alone.
    for (const auto& [asked, got] : {std::pair{std::optional<int>{}, -5}, std::pair{std::optional{0}, 0},
                                     std::pair{std::optional{-2}, -2}, std::pair{std::optional{-9}, -5},
                                     std::pair{std::optional{3}, 0}}) {
      CAPTURE(asked.value_or(1));
      Options options = ncclkit_test::fake_options("priority");
      options.name = "priority" + std::to_string(asked.value_or(1));  // one store scope per communicator
      if (asked) options.stream_priority = *asked;
      Communicator comm(job.store, job.world, options);
      CHECK(priority_of(comm.comm_stream()) == got);
      CHECK(comm.options().stream_priority == got);  // what the stream got, not what was asked
    }
  }
  FakeSession::check_clean();
}

TEST_CASE("an event is made once and recorded many times") {
  FakeSession session;
  {
    OneRankJob job;
    Communicator comm(job.store, job.world, ncclkit_test::fake_options("events"));
    Communicator::Event event = comm.create_event();
    const cudaEvent_t handle = event.get();
    REQUIRE(handle != nullptr);
    const long made = fake::events_created();
    for (int step = 0; step < 5; ++step) {
      comm.record(event, comm.comm_stream());
      comm.wait(event);  // the default stream waits for the comm stream's work
      comm.record(event);
    }
    CHECK(event.get() == handle);
    CHECK(fake::events_created() == made);                       // no CUDA event per record
    Communicator::Event once = comm.record(comm.comm_stream());  // the one-off form makes one
    CHECK(once.get() != handle);
    CHECK(fake::events_created() == made + 1);
  }
  FakeSession::check_clean();
}
