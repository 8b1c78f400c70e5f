// Every collective of nccl::Communicator × element type × reduce op, in and out of place, for
// sizes 0, 1, odd and up to 1 MiB, against host references in higher precision; on 1, 2 and 4
// GPUs, as many as are visible, in both of ncclkit's modes: one process per GPU (through
// spawn), and one process driving every GPU through a LocalGroup. Outputs are poisoned before
// each call and checked in full.
//
// Run once more with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 (scripts/gpu-run.sh does) to go
// through NCCL's network transport, a stand-in for two nodes. tests/CMakeLists.txt builds this
// file a second time with NCCLKIT_NCCL_GROUPED_FALLBACKS (gpu_test_nccl_collectives_grouped):
// all_to_all, gather and scatter then take the grouped send/recv path of NCCL < 2.28.
// ncclkit-test: labels=nccl timeout=600
#include <doctest/doctest.h>

#include <chrono>   // std::chrono::seconds, std::chrono::minutes
#include <cmath>    // std::sqrt
#include <cstdint>  // fixed-width integers
#include <cstdio>   // std::printf, std::fflush
#include <cstdlib>  // std::getenv
#include <memory>   // std::shared_ptr
#include <span>     // std::span
#include <string>   // std::string
#include <vector>   // std::vector

#include "gpu/nccl_support.hpp"
#include "ncclkit/core/backend.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/device_buffer.hpp"
#include "ncclkit/nccl/group.hpp"
#include "ncclkit/nccl/local_group.hpp"
#include "ncclkit/nccl/stream.hpp"

namespace {

using namespace ncclkit_test;
using ncclkit::MemoryKind;
using ncclkit::Store;
using ncclkit::TensorView;
using ncclkit::WorldInfo;
using ncclkit::nccl::Communicator;
using ncclkit::nccl::DeviceBuffer;
using ncclkit::nccl::DeviceGuard;
using ncclkit::nccl::GroupGuard;
using ncclkit::nccl::LocalGroup;
using ncclkit::nccl::Options;

/// The communicators this process drives: one (a process per GPU), or every member of a
/// LocalGroup (one process, several GPUs). The matrix is written once against this.
class Ranks {
 public:
  explicit Ranks(Communicator& comm) : members_{&comm} {}
  explicit Ranks(LocalGroup& group) : single_process_(true) {
    for (int i = 0; i < group.size(); ++i) members_.push_back(&group[i]);
  }

  /// The communicators' size (the world), not the number of members in this process.
  int world() const { return members_.front()->size(); }
  std::size_t members() const { return members_.size(); }

  /// fn(comm, i) for every member i, with its GPU current: uploads, memsets, downloads and
  /// checks go to the member's own streams and memory.
  template <class Fn>
  void each(Fn&& fn) {
    for (std::size_t i = 0; i < members_.size(); ++i) {
      DeviceGuard guard(members_[i]->device());
      fn(*members_[i], i);
    }
  }
  /// Issues fn(comm, i) for every member: directly with a process per GPU; in one NCCL group
  /// for a LocalGroup, where one thread must queue every member's part of a collective before
  /// any of them can complete.
  template <class Fn>
  void issue(Fn&& fn) {
    if (!single_process_) {
      fn(*members_.front(), std::size_t{0});
      return;
    }
    grouped(fn);
  }
  /// Issues fn(comm, i) for every member inside one NCCL group, in both modes (send/recv pairs
  /// must progress together on each rank too).
  template <class Fn>
  void grouped(Fn&& fn) {
    GroupGuard group;
    for (std::size_t i = 0; i < members_.size(); ++i) fn(*members_[i], i);
    group.end();
  }

 private:
  std::vector<Communicator*> members_;
  bool single_process_ = false;
};

/// One buffer of `count` elements per member, each on its member's GPU.
template <class T>
std::vector<DeviceBuffer<T>> per_member(Ranks& ranks, std::size_t count) {
  std::vector<DeviceBuffer<T>> buffers;
  ranks.each([&](Communicator& comm, std::size_t) { buffers.emplace_back(count, comm.device()); });
  return buffers;
}

std::string label(const char* collective, const std::string& type, std::size_t count, const std::string& detail,
                  bool in_place, int rank) {
  return std::string(collective) + " " + type + " count " + std::to_string(count) + (detail.empty() ? "" : " ") +
         detail + (in_place ? " in place" : " out of place") + " (rank " + std::to_string(rank) + ")";
}

std::string root_label(int root) { return "root " + std::to_string(root); }

std::size_t at(int index) { return static_cast<std::size_t>(index); }

/// Elements [first, first + count) of `values`, for uploads of part of a rank's input.
template <class T>
std::span<const T> part(const std::vector<T>& values, std::size_t first, std::size_t count) {
  return std::span<const T>(values).subspan(first, count);
}

/// Reductions: all_reduce, reduce and reduce_scatter for every op.
template <class T>
void check_reductions(Ranks& ranks, Checker& checker, std::size_t count, std::uint64_t& seed) {
  const int n = ranks.world();
  const std::string type = type_name<T>();
  const std::size_t total = count * at(n);
  auto in = per_member<T>(ranks, count), out = per_member<T>(ranks, count);
  auto scatter_in = per_member<T>(ranks, total), scatter_out = per_member<T>(ranks, count);
  for (ReduceOp op : kAllOps) {
    ++seed;
    // Rank r's input is element range [0, total) of its sample stream: all_reduce and reduce
    // take the first `count`; reduce_scatter takes all of it and leaves rank r the reduction of
    // range [r * count, (r + 1) * count).
    std::vector<std::vector<T>> inputs(ranks.members());
    ranks.each([&](Communicator& comm, std::size_t i) { inputs[i] = make_input<T>(seed, comm.rank(), total, op); });
    const auto expected = reference_values<T>(seed, n, 0, count, op);

    for (bool in_place : {false, true}) {
      ranks.each([&](Communicator& comm, std::size_t i) {
        upload(in[i], part(inputs[i], 0, count), comm.default_stream());
        out[i].fill_bytes(poison_byte<T>(), comm.default_stream());
      });
      ranks.issue([&](Communicator& comm, std::size_t i) {
        comm.all_reduce(in[i].data(), in_place ? in[i].data() : out[i].data(), count, op);
      });
      ranks.each([&](Communicator& comm, std::size_t i) {
        check_reduction<T>(checker, download(comm, in_place ? in[i] : out[i], comm.default_stream()), expected, op,
                           label("all_reduce", type, count, op_name(op), in_place, comm.rank()));
      });
    }

    const int root = static_cast<int>(seed % static_cast<std::uint64_t>(n));
    for (bool in_place : {false, true}) {
      ranks.each([&](Communicator& comm, std::size_t i) {
        upload(in[i], part(inputs[i], 0, count), comm.default_stream());
        out[i].fill_bytes(poison_byte<T>(), comm.default_stream());
      });
      ranks.issue([&](Communicator& comm, std::size_t i) {
        comm.reduce(in[i].data(), in_place ? in[i].data() : out[i].data(), count, op, root);
      });
      ranks.each([&](Communicator& comm, std::size_t i) {
        if (comm.rank() == root) {
          check_reduction<T>(
              checker, download(comm, in_place ? in[i] : out[i], comm.default_stream()), expected, op,
              label("reduce", type, count, std::string(op_name(op)) + " " + root_label(root), in_place, comm.rank()));
        } else {
          comm.synchronize(comm.default_stream());
        }
      });
    }

    std::vector<References> slices(ranks.members());
    ranks.each([&](Communicator& comm, std::size_t i) {
      slices[i] = comm.rank() == 0 ? expected : reference_values<T>(seed, n, at(comm.rank()) * count, count, op);
    });
    for (bool in_place : {false, true}) {
      ranks.each([&](Communicator& comm, std::size_t i) {
        upload(scatter_in[i], inputs[i], comm.default_stream());
        scatter_out[i].fill_bytes(poison_byte<T>(), comm.default_stream());
      });
      ranks.issue([&](Communicator& comm, std::size_t i) {
        T* target = in_place ? scatter_in[i].data() + at(comm.rank()) * count : scatter_out[i].data();
        comm.reduce_scatter(scatter_in[i].data(), target, count, op);
      });
      ranks.each([&](Communicator& comm, std::size_t i) {
        const std::size_t first = at(comm.rank()) * count;
        const auto got = in_place ? download(comm, scatter_in[i], comm.default_stream(), first, count)
                                  : download(comm, scatter_out[i], comm.default_stream());
        check_reduction<T>(checker, got, slices[i], op,
                           label("reduce_scatter", type, count, op_name(op), in_place, comm.rank()));
      });
    }
  }
}

/// Data movement: broadcast, all_gather (even and uneven), all_to_all, gather, scatter and
/// send/recv around a ring.
template <class T>
void check_movement(Ranks& ranks, Checker& checker, std::size_t count, std::uint64_t& seed) {
  const int n = ranks.world();
  const std::string type = type_name<T>();
  const std::size_t total = count * at(n);
  ++seed;
  const int root = static_cast<int>(seed % static_cast<std::uint64_t>(n));
  // Rank j's contribution of `count` elements, and the concatenation over ranks.
  std::vector<std::vector<T>> pieces;
  std::vector<T> all;
  for (int j = 0; j < n; ++j) {
    pieces.push_back(make_input<T>(seed, j, count));
    all.insert(all.end(), pieces.back().begin(), pieces.back().end());
  }
  auto in = per_member<T>(ranks, count), out = per_member<T>(ranks, count);
  auto gathered = per_member<T>(ranks, total);

  for (bool in_place : {false, true}) {
    ranks.each([&](Communicator& comm, std::size_t i) {
      upload(in[i], pieces[at(comm.rank())], comm.default_stream());
      out[i].fill_bytes(poison_byte<T>(), comm.default_stream());
      if (in_place && comm.rank() != root) in[i].fill_bytes(poison_byte<T>(), comm.default_stream());
    });
    ranks.issue([&](Communicator& comm, std::size_t i) {
      if (in_place) {
        comm.broadcast(in[i].data(), count, root);
      } else {
        comm.broadcast(in[i].data(), out[i].data(), count, root);
      }
    });
    ranks.each([&](Communicator& comm, std::size_t i) {
      check_equal(checker, download(comm, in_place ? in[i] : out[i], comm.default_stream()), pieces[at(root)],
                  label("broadcast", type, count, root_label(root), in_place, comm.rank()));
    });
  }

  for (bool in_place : {false, true}) {
    ranks.each([&](Communicator& comm, std::size_t i) {
      const cudaStream_t s = comm.default_stream();
      gathered[i].fill_bytes(poison_byte<T>(), s);
      upload(in[i], pieces[at(comm.rank())], s);
      if (in_place) upload(gathered[i], pieces[at(comm.rank())], s, at(comm.rank()) * count);
    });
    ranks.issue([&](Communicator& comm, std::size_t i) {
      const T* source = in_place ? gathered[i].data() + at(comm.rank()) * count : in[i].data();
      comm.all_gather(source, gathered[i].data(), count);
    });
    ranks.each([&](Communicator& comm, std::size_t i) {
      check_equal(checker, download(comm, gathered[i], comm.default_stream()), all,
                  label("all_gather", type, count, "", in_place, comm.rank()));
    });
  }

  // all_gather_uneven: rank j contributes count + 3 * j elements, and (when n > 1) rank 1
  // none; in place, each rank's input is its own slice of the output.
  {
    std::vector<std::size_t> counts, offsets;
    std::size_t uneven_total = 0;
    std::vector<T> expected;
    for (int j = 0; j < n; ++j) {
      counts.push_back(n > 1 && j == 1 ? 0 : count + 3 * at(j));
      offsets.push_back(uneven_total);
      uneven_total += counts.back();
      const auto slice = make_input<T>(seed + 7, j, counts.back());
      expected.insert(expected.end(), slice.begin(), slice.end());
    }
    std::vector<DeviceBuffer<T>> mine;
    ranks.each([&](Communicator& comm, std::size_t) { mine.emplace_back(counts[at(comm.rank())], comm.device()); });
    auto uneven_out = per_member<T>(ranks, uneven_total);
    for (bool in_place : {false, true}) {
      ranks.each([&](Communicator& comm, std::size_t i) {
        const std::size_t r = at(comm.rank());
        const auto input = make_input<T>(seed + 7, comm.rank(), counts[r]);
        uneven_out[i].fill_bytes(poison_byte<T>(), comm.default_stream());
        if (in_place) {
          upload(uneven_out[i], input, comm.default_stream(), offsets[r]);
        } else {
          upload(mine[i], input, comm.default_stream());
        }
      });
      ranks.issue([&](Communicator& comm, std::size_t i) {
        const std::size_t r = at(comm.rank());
        const TensorView source =
            in_place ? TensorView::of(uneven_out[i].data() + offsets[r], counts[r], MemoryKind::kDevice)
                     : mine[i].view();
        comm.all_gather_uneven(source, uneven_out[i].view(), counts);
      });
      ranks.each([&](Communicator& comm, std::size_t i) {
        check_equal(checker, download(comm, uneven_out[i], comm.default_stream()), expected,
                    label("all_gather_uneven", type, count, "", in_place, comm.rank()));
      });
    }
  }

  // all_to_all: rank r's input is the `total` elements of stream (seed, r); slice j goes to
  // rank j, where it lands as slice r.
  {
    std::vector<std::vector<T>> streams;
    for (int j = 0; j < n; ++j) streams.push_back(make_input<T>(seed, j, total));
    auto send = per_member<T>(ranks, total), receive = per_member<T>(ranks, total);
    ranks.each([&](Communicator& comm, std::size_t i) {
      upload(send[i], streams[at(comm.rank())], comm.default_stream());
      receive[i].fill_bytes(poison_byte<T>(), comm.default_stream());
    });
    ranks.issue([&](Communicator& comm, std::size_t i) { comm.all_to_all(send[i].data(), receive[i].data(), count); });
    ranks.each([&](Communicator& comm, std::size_t i) {
      const std::size_t r = at(comm.rank());
      std::vector<T> expected;
      for (const auto& theirs : streams) {
        const auto slice = part(theirs, r * count, count);
        expected.insert(expected.end(), slice.begin(), slice.end());
      }
      check_equal(checker, download(comm, receive[i], comm.default_stream()), expected,
                  label("all_to_all", type, count, "", false, comm.rank()));
    });
  }

  // gather to root (in place: the root's input is its slice of the output).
  for (bool in_place : {false, true}) {
    ranks.each([&](Communicator& comm, std::size_t i) {
      const cudaStream_t s = comm.default_stream();
      gathered[i].fill_bytes(poison_byte<T>(), s);
      upload(in[i], pieces[at(comm.rank())], s);
      if (in_place && comm.rank() == root) upload(gathered[i], pieces[at(root)], s, at(root) * count);
    });
    ranks.issue([&](Communicator& comm, std::size_t i) {
      const T* source = in_place && comm.rank() == root ? gathered[i].data() + at(root) * count : in[i].data();
      comm.gather(source, gathered[i].data(), count, root);
    });
    ranks.each([&](Communicator& comm, std::size_t i) {
      if (comm.rank() == root) {
        check_equal(checker, download(comm, gathered[i], comm.default_stream()), all,
                    label("gather", type, count, root_label(root), in_place, comm.rank()));
      } else {
        comm.synchronize(comm.default_stream());
      }
    });
  }

  // scatter from root (in place: the root's output is its slice of the input).
  for (bool in_place : {false, true}) {
    ranks.each([&](Communicator& comm, std::size_t i) {
      out[i].fill_bytes(poison_byte<T>(), comm.default_stream());
      if (comm.rank() == root) upload(gathered[i], all, comm.default_stream());
    });
    ranks.issue([&](Communicator& comm, std::size_t i) {
      T* target = in_place && comm.rank() == root ? gathered[i].data() + at(root) * count : out[i].data();
      comm.scatter(gathered[i].data(), target, count, root);
    });
    ranks.each([&](Communicator& comm, std::size_t i) {
      const std::size_t r = at(comm.rank());
      const auto got = in_place && comm.rank() == root
                           ? download(comm, gathered[i], comm.default_stream(), r * count, count)
                           : download(comm, out[i], comm.default_stream());
      check_equal(checker, got, pieces[r], label("scatter", type, count, root_label(root), in_place, comm.rank()));
    });
  }

  // send/recv around a ring, in one group so that both directions progress (with a
  // LocalGroup, every member's pair in that one group).
  ranks.each([&](Communicator& comm, std::size_t i) {
    upload(in[i], pieces[at(comm.rank())], comm.default_stream());
    out[i].fill_bytes(poison_byte<T>(), comm.default_stream());
  });
  ranks.grouped([&](Communicator& comm, std::size_t i) {
    const int r = comm.rank();
    comm.send(in[i].data(), count, (r + 1) % n);
    comm.recv(out[i].data(), count, (r + n - 1) % n);
  });
  ranks.each([&](Communicator& comm, std::size_t i) {
    const int r = comm.rank();
    check_equal(checker, download(comm, out[i], comm.default_stream()), pieces[at((r + n - 1) % n)],
                label("send/recv ring", type, count, "", false, r));
  });
}

/// The whole matrix over the communicators of `ranks`.
void run_matrix(Ranks& ranks, Checker& checker) {
  std::uint64_t seed = 1000;
  for_each_type([&]<class T>() {
    for (std::size_t count : test_counts<T>()) {
      check_reductions<T>(ranks, checker, count, seed);
      check_movement<T>(ranks, checker, count, seed);
    }
  });
  ranks.each([&](Communicator& comm, std::size_t) {
    checker.expect(comm.completed_sequence() <= comm.issued_sequence() && comm.issued_sequence() > 0,
                   "sequence numbers advance on rank " + std::to_string(comm.rank()) + " (issued " +
                       std::to_string(comm.issued_sequence()) + ")");
  });
}

/// Checks that all_to_all, gather and scatter take the path this binary must take, and says
/// once which it is. The path that must be taken: NCCLKIT_TEST_COLLECTIVE_PATH ("native" or
/// "grouped"; scripts/gpu-run.sh names it for each binary it runs) where set, else the build's
/// intent: the grouped send/recv path with NCCLKIT_NCCL_GROUPED_FALLBACKS (tests_gpu_grouped) or
/// an NCCL older than 2.28, NCCL's native calls otherwise.
void check_path() {
  const std::string taken = NCCLKIT_NCCL_NATIVE_ALLTOALL_GATHER_SCATTER ? "native" : "grouped";
#if defined(NCCLKIT_NCCL_GROUPED_FALLBACKS) || NCCL_VERSION_CODE < NCCL_VERSION(2, 28, 0)
  std::string wanted = "grouped";
#else
  std::string wanted = "native";
#endif
  const char* named = std::getenv("NCCLKIT_TEST_COLLECTIVE_PATH");
  if (named != nullptr && *named != '\0') wanted = named;
  static bool said = false;
  if (!said) {
    said = true;
    std::printf(
        "collective matrix: all_to_all, gather and scatter take the %s path (%s); nccl.h %d.%d.%d\n", taken.c_str(),
        taken == "native" ? "ncclAlltoAll / ncclGather / ncclScatter" : "grouped send/recv, the path of NCCL < 2.28",
        NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    std::fflush(stdout);
  }
  CHECK_MESSAGE((wanted == "native" || wanted == "grouped"),
                "NCCLKIT_TEST_COLLECTIVE_PATH='" << wanted << "' is neither native nor grouped");
  CHECK_MESSAGE(taken == wanted, "all_to_all, gather and scatter take the "
                                     << taken << " path, and this binary must take the " << wanted << " path"
                                     << (named != nullptr ? " (NCCLKIT_TEST_COLLECTIVE_PATH)" : ""));
}

int matrix_worker(const WorldInfo& world, const std::shared_ptr<Store>& store) {
  Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "matrix"});
  Checker checker(world.rank);
  Ranks ranks(comm);
  run_matrix(ranks, checker);
  comm.barrier();
  return checker.finish("collective matrix on " + std::to_string(comm.size()) + " GPUs, a process per GPU");
}

/// The matrix through one LocalGroup of GPUs 0 .. n-1, driven by this one thread.
int local_matrix_worker(int n) {
  std::vector<int> devices;
  for (int d = 0; d < n; ++d) devices.push_back(d);
  Checker checker(0);
  LocalGroup local(devices, Options{.timeout = std::chrono::seconds(60), .name = "local-matrix"});
  checker.expect(local.size() == n,
                 "group of " + std::to_string(local.size()) + " members, " + std::to_string(n) + " asked");
  Ranks ranks(local);
  run_matrix(ranks, checker);
  // Not barrier(): it synchronises, so one thread cannot issue it for several members. Every
  // member's work must still be complete and error-free.
  ranks.each([](Communicator& comm, std::size_t) {
    comm.synchronize(comm.default_stream());
    comm.synchronize(comm.comm_stream());
  });
  return checker.finish("collective matrix through a single-process group of " + std::to_string(n) + " GPUs");
}

/// Generic code written against the Backend concept only, as fusion and the trainer use it.
template <ncclkit::Backend B>
void backend_round_trip(B& backend, Checker& checker) {
  const int n = backend.size(), r = backend.rank();
  const std::size_t count = 4099;
  const auto input = make_input<float>(77, r, count);
  auto* device_in = static_cast<float*>(backend.allocate(count * sizeof(float)));
  auto* device_out = static_cast<float*>(backend.allocate(count * n * sizeof(float)));
  auto compute = backend.default_stream();
  auto comm = backend.comm_stream();
  NCCLKIT_CUDA_CHECK(cudaMemcpyAsync(device_in, input.data(), count * sizeof(float), cudaMemcpyHostToDevice, compute));
  NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(compute));
  // Hand over from the compute stream to the comm stream and back, by events.
  backend.scale(ncclkit::TensorView::of(device_in, count, ncclkit::MemoryKind::kDevice), 2.0, compute);
  auto ready = backend.record(compute);
  backend.wait(ready, comm);
  const auto view = ncclkit::TensorView::of(device_in, count, ncclkit::MemoryKind::kDevice);
  backend.all_reduce(view, view, ReduceOp::kSum, comm);
  backend.all_gather(view, ncclkit::TensorView::of(device_out, count * n, ncclkit::MemoryKind::kDevice), comm);
  auto done = backend.record(comm);
  backend.wait(done, compute);
  backend.copy(device_in, device_out + static_cast<std::size_t>(r) * count, count * sizeof(float), compute);
  backend.synchronize(compute);
  std::vector<float> got(count);
  NCCLKIT_CUDA_CHECK(cudaMemcpy(got.data(), device_in, count * sizeof(float), cudaMemcpyDeviceToHost));
  long double error = 0, norm = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const long double ref = 2 * reference<float>(77, n, i, ReduceOp::kSum);
    error += (got[i] - ref) * (got[i] - ref);
    norm += ref * ref;
  }
  checker.expect(std::sqrt(static_cast<double>(error / norm)) < 1e-5,
                 "Backend-generic scale + all_reduce + all_gather + copy");
  backend.deallocate(device_in);
  backend.deallocate(device_out);
}

/// Every std::span overload once, on float (the matrix covers types and ops through the
/// pointer overloads, which the span ones forward to).
void check_span_overloads(Communicator& comm, Checker& checker) {
  const int n = comm.size(), r = comm.rank(), device = comm.device();
  const cudaStream_t s = comm.default_stream();
  const std::size_t count = 513, total = count * at(n);
  const int root = n - 1;
  const auto input = make_input<float>(5, r, count);
  std::vector<float> all;
  for (int j = 0; j < n; ++j) {
    const auto piece = make_input<float>(5, j, count);
    all.insert(all.end(), piece.begin(), piece.end());
  }
  DeviceBuffer<float> in(count, device), out(count, device), wide(total, device), wide_out(total, device);
  const std::span<const float> in_span(in.data(), count);

  upload(in, input, s);
  out.fill_bytes(0xFF, s);
  comm.all_reduce(in_span, out.span(), ReduceOp::kMax);
  check_reduction<float>(checker, download(comm, out, s), 5, n, 0, ReduceOp::kMax, "all_reduce(span, span)");
  comm.all_reduce(in.span(), ReduceOp::kMin);
  check_reduction<float>(checker, download(comm, in, s), 5, n, 0, ReduceOp::kMin, "all_reduce(span) in place");

  upload(in, input, s);
  if (r != root) in.fill_bytes(0xFF, s);
  comm.broadcast(in.span(), root);
  check_equal(checker, download(comm, in, s), make_input<float>(5, root, count), "broadcast(span)");

  upload(in, input, s);
  wide.fill_bytes(0xFF, s);
  comm.all_gather(in_span, wide.span());
  check_equal(checker, download(comm, wide, s), all, "all_gather(span, span)");

  // reduce_scatter over the `total`-element streams (seed 6); rank r keeps slice r.
  upload(wide, make_input<float>(6, r, total, ReduceOp::kSum), s);
  out.fill_bytes(0xFF, s);
  comm.reduce_scatter(std::span<const float>(wide.data(), total), out.span(), ReduceOp::kSum);
  check_reduction<float>(checker, download(comm, out, s), 6, n, at(r) * count, ReduceOp::kSum,
                         "reduce_scatter(span, span)");

  // all_to_all over the `total`-element streams (seed 7): slice j of rank j's lands as slice j.
  upload(wide, make_input<float>(7, r, total), s);
  wide_out.fill_bytes(0xFF, s);
  comm.all_to_all(std::span<const float>(wide.data(), total), wide_out.span());
  {
    std::vector<float> expected;
    for (int j = 0; j < n; ++j) {
      const auto theirs = make_input<float>(7, j, total);
      expected.insert(expected.end(), theirs.begin() + static_cast<std::ptrdiff_t>(at(r) * count),
                      theirs.begin() + static_cast<std::ptrdiff_t>(at(r + 1) * count));
    }
    check_equal(checker, download(comm, wide_out, s), expected, "all_to_all(span, span)");
  }

  // reduce, gather and scatter: the root-only buffer is an empty span on the other ranks.
  upload(in, input, s);
  out.fill_bytes(0xFF, s);
  comm.reduce(in_span, r == root ? out.span() : std::span<float>(), ReduceOp::kSum, root);
  if (r == root) {
    check_reduction<float>(checker, download(comm, out, s), 5, n, 0, ReduceOp::kSum, "reduce(span, span)");
  } else {
    comm.synchronize(s);
  }

  wide.fill_bytes(0xFF, s);
  comm.gather(in_span, r == root ? wide.span() : std::span<float>(), root);
  if (r == root) {
    check_equal(checker, download(comm, wide, s), all, "gather(span, span)");
  } else {
    comm.synchronize(s);
  }

  if (r == root) upload(wide, all, s);
  out.fill_bytes(0xFF, s);
  comm.scatter(r == root ? std::span<const float>(wide.data(), total) : std::span<const float>(), out.span(), root);
  check_equal(checker, download(comm, out, s), input, "scatter(span, span)");

  // send(span<const T>) / recv(span<T>) around a ring.
  out.fill_bytes(0xFF, s);
  {
    GroupGuard group;
    comm.send(in_span, (r + 1) % n);
    comm.recv(out.span(), (r + n - 1) % n);
    group.end();
  }
  check_equal(checker, download(comm, out, s), make_input<float>(5, (r + n - 1) % n, count), "send(span) / recv(span)");
}

int api_worker(const WorldInfo& world, const std::shared_ptr<Store>& store) {
  Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "api"});
  Checker checker(world.rank);
  const int n = comm.size(), r = comm.rank(), device = comm.device();
  // The default stream is the legacy stream, which raw CUDA calls take as the current device's.
  DeviceGuard on_its_gpu(device);
  const cudaStream_t s = comm.default_stream();

  backend_round_trip(comm, checker);
  check_span_overloads(comm, checker);

  // Several collectives fused in one group, on two streams.
  {
    const std::size_t count = 10000;
    DeviceBuffer<double> a(count, device), b(count, device);
    upload(a, make_input<double>(11, r, count), s);
    upload(b, make_input<double>(12, r, count), s);
    const auto issued_before = comm.issued_sequence();
    {
      GroupGuard group;
      comm.all_reduce(a.data(), a.data(), count, ReduceOp::kSum);
      comm.all_reduce(b.data(), b.data(), count, ReduceOp::kMax, comm.comm_stream());
      group.end();
    }
    checker.expect(comm.issued_sequence() == issued_before + 2, "a group of 2 collectives takes 2 sequence numbers");
    check_reduction<double>(checker, download(comm, a, s), 11, n, 0, ReduceOp::kSum,
                            "grouped all_reduce (default stream)");
    check_reduction<double>(checker, download(comm, b, comm.comm_stream()), 12, n, 0, ReduceOp::kMax,
                            "grouped all_reduce (comm stream)");
  }

  comm.barrier();
  comm.barrier();
  checker.expect(comm.completed_sequence() <= comm.issued_sequence(), "completed <= issued");
  return checker.finish("API on " + std::to_string(n) + " GPUs");
}

TEST_CASE("every collective, type and op against a host reference, 1/2/4 GPUs") {
  check_path();
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(n, matrix_worker, std::chrono::minutes(8));
  }
}

TEST_CASE("single-process matrix: every collective, type and op through one LocalGroup of 1/2/4 GPUs") {
  check_path();
  for (int n : world_sizes()) {
    CAPTURE(n);
    // One worker drives all n GPUs: this test process must not initialise CUDA (it forks).
    run_workers(
        1, [n](const WorldInfo&, const std::shared_ptr<Store>&) { return local_matrix_worker(n); },
        std::chrono::minutes(8));
  }
}

TEST_CASE("span API, groups, barrier and Backend-generic use") {
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(n, api_worker);
  }
}

}  // namespace
