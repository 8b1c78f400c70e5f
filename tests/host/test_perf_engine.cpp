// The perf engine (bench/perf_engine.hpp) driving several local ranks from one thread, as
// perf_nccl -g does, on an in-process backend whose collectives run when the group closes:
// results are checked, wrong results are counted, and several local ranks need group calls.
// (One rank per process through a real backend: the perf_gloo_check test.)
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/detail/cast.hpp"
#include "ncclkit/core/detail/update_on_host.hpp"
#include "ncclkit/core/error.hpp"
#include "perf_engine.hpp"

namespace {

using ncclkit::DataType;
using ncclkit::MemoryKind;
using ncclkit::ReduceOp;
using ncclkit::TensorView;

/// The ranks of one in-process world. A collective is queued per rank and runs once every
/// rank has queued it and the group is closed (or at once outside a group).
struct LoopWorld {
  enum class Kind { kAllReduce, kBroadcast, kAllGather, kReduceScatter };
  struct Op {
    Kind kind;
    TensorView in, out;
    ReduceOp op;
    int root;
  };
  explicit LoopWorld(int n) : size(n), pending(static_cast<std::size_t>(n)) {}

  int size;
  int depth = 0;                         // open groups
  std::vector<std::vector<Op>> pending;  // per rank, in issue order
  int collectives_run = 0;

  void begin() { ++depth; }
  void end() {
    if (--depth == 0) flush();
  }
  void submit(int rank, Op op) {
    pending[static_cast<std::size_t>(rank)].push_back(op);
    if (depth == 0) {
      // One thread issuing for several ranks outside a group would deadlock a real library.
      if (size > 1) throw std::logic_error("a collective of several local ranks outside a group");
      flush();
    }
  }
  void flush() {
    const std::size_t count = pending[0].size();
    for (const auto& queue : pending) {
      if (queue.size() != count) throw std::logic_error("ranks queued different numbers of collectives");
    }
    for (std::size_t i = 0; i < count; ++i) run(i);
    for (auto& queue : pending) queue.clear();
  }

  static double load(const TensorView& v, std::size_t i) {
    return ncclkit::visit_data_type(v.dtype, [&]<class T>() -> double {
      if constexpr (std::is_arithmetic_v<T>)
        return static_cast<double>(static_cast<const T*>(v.data)[i]);
      else
        throw std::logic_error("LoopWorld handles arithmetic element types only");
    });
  }
  static void store(const TensorView& v, std::size_t i, double value) {
    ncclkit::visit_data_type(v.dtype, [&]<class T>() {
      if constexpr (std::is_arithmetic_v<T>)
        static_cast<T*>(v.data)[i] = static_cast<T>(value);
      else
        throw std::logic_error("LoopWorld handles arithmetic element types only");
    });
  }
  static double combine(double a, double b, ReduceOp op) {
    switch (op) {
      case ReduceOp::kProd:
        return a * b;
      case ReduceOp::kMin:
        return a < b ? a : b;
      case ReduceOp::kMax:
        return a > b ? a : b;
      default:
        return a + b;
    }
  }
  void run(std::size_t index) {
    std::vector<Op> ops;
    for (auto& queue : pending) ops.push_back(queue[index]);
    const Op& first = ops[0];
    // Read every input before writing any output (in place, they overlap).
    std::vector<std::vector<double>> inputs;
    for (const Op& o : ops) {
      std::vector<double> values(o.in.count);
      for (std::size_t i = 0; i < o.in.count; ++i) values[i] = load(o.in, i);
      inputs.push_back(std::move(values));
    }
    auto reduced = [&](std::size_t i) {
      double acc = inputs[0][i];
      for (std::size_t r = 1; r < inputs.size(); ++r) acc = combine(acc, inputs[r][i], first.op);
      return first.op == ReduceOp::kAvg ? acc / size : acc;
    };
    for (std::size_t r = 0; r < ops.size(); ++r) {
      const Op& o = ops[r];
      switch (first.kind) {
        case Kind::kAllReduce:
          for (std::size_t i = 0; i < o.out.count; ++i) store(o.out, i, reduced(i));
          break;
        case Kind::kBroadcast:
          for (std::size_t i = 0; i < o.out.count; ++i)
            store(o.out, i, inputs[static_cast<std::size_t>(first.root)][i]);
          break;
        case Kind::kAllGather: {
          const std::size_t part = o.out.count / static_cast<std::size_t>(size);
          for (std::size_t i = 0; i < o.out.count; ++i) store(o.out, i, inputs[i / part][i % part]);
          break;
        }
        case Kind::kReduceScatter:
          for (std::size_t i = 0; i < o.out.count; ++i) store(o.out, i, reduced(r * o.out.count + i));
          break;
      }
    }
    ++collectives_run;
  }
};

/// One rank of a LoopWorld, as an ncclkit Backend over host memory.
class LoopBackend {
 public:
  using Stream = int;
  using Event = int;
  static constexpr MemoryKind memory_kind = MemoryKind::kHost;

  LoopBackend(LoopWorld& world, int rank) : world_(&world), rank_(rank) {}
  int rank() const { return rank_; }
  int size() const { return world_->size; }
  Stream default_stream() { return 0; }
  Stream comm_stream() { return 0; }
  Event create_event() { return 0; }
  void record(Event&, Stream) {}
  Event record(Stream) { return 0; }
  void wait(Event, Stream) {}
  void synchronize(Stream) {}
  void all_reduce(TensorView in, TensorView out, ReduceOp op, Stream) {
    throw_if_aborted();
    world_->submit(rank_, {LoopWorld::Kind::kAllReduce, in, out, op, 0});
  }
  void broadcast(TensorView in, TensorView out, int root, Stream) {
    throw_if_aborted();
    world_->submit(rank_, {LoopWorld::Kind::kBroadcast, in, out, ReduceOp::kSum, root});
  }
  void all_gather(TensorView in, TensorView out, Stream) {
    throw_if_aborted();
    world_->submit(rank_, {LoopWorld::Kind::kAllGather, in, out, ReduceOp::kSum, 0});
  }
  void reduce_scatter(TensorView in, TensorView out, ReduceOp op, Stream) {
    throw_if_aborted();
    world_->submit(rank_, {LoopWorld::Kind::kReduceScatter, in, out, op, 0});
  }
  void* allocate(std::size_t bytes) { return bytes ? ::operator new(bytes) : nullptr; }
  void deallocate(void* pointer) { ::operator delete(pointer); }
  void copy(void* to, const void* from, std::size_t bytes, Stream) { std::memcpy(to, from, bytes); }
  void scale(TensorView, double, Stream) {}
  // The rest of the Backend concept, which the perf engine does not use.
  using CopyBatch = std::vector<ncclkit::CopyItem>;
  Event create_timing_event() { return 0; }
  double elapsed_ms(const Event&, const Event&) { return 0; }
  void copy_from_host(void* to, const void* from, std::size_t bytes, Stream) { std::memcpy(to, from, bytes); }
  void copy_to_host(void* to, const void* from, std::size_t bytes, Stream) { std::memcpy(to, from, bytes); }
  void fill_zero(TensorView out, Stream) { std::memset(out.data, 0, out.bytes()); }
  void cast(TensorView in, TensorView out, double factor, std::uint64_t*, Stream) {
    ncclkit::detail::cast_on_host(in, out, factor);
  }
  CopyBatch prepare_copies(std::span<const ncclkit::CopyItem> items) { return CopyBatch(items.begin(), items.end()); }
  void copy_batch(const CopyBatch& batch, Stream) { ncclkit::detail::copy_batch_on_host(batch); }
  void update(const ncclkit::UpdateRule& rule, TensorView p, TensorView g, TensorView s0, TensorView s1, TensorView c,
              Stream) {
    ncclkit::detail::update_on_host(rule, p, g, s0, s1, c);
  }
  void sum_squares(TensorView in, double* out, Stream) { ncclkit::detail::sum_squares_on_host(in, out); }
  /// Later collectives throw CommError (the perf engine never aborts; the concept asks for it).
  void abort(std::string reason = "abort() was called") { aborted_ = std::move(reason); }

 private:
  void throw_if_aborted() const {
    if (!aborted_.empty()) throw ncclkit::CommError(aborted_);
  }

  LoopWorld* world_;
  int rank_;
  std::string aborted_;
};
static_assert(ncclkit::Backend<LoopBackend>);

ncclkit::perf::PerfOptions small_sweep() {
  ncclkit::perf::PerfOptions options;
  options.min_bytes = 8;
  options.max_bytes = 4096;
  options.step_factor = 8;
  options.iters = 4;
  options.warmup = 1;
  options.rounds = 2;
  options.collectives = {ncclkit::perf::Collective::kAllReduce, ncclkit::perf::Collective::kBroadcast,
                         ncclkit::perf::Collective::kAllGather, ncclkit::perf::Collective::kReduceScatter};
  options.types = {DataType::kFloat32, DataType::kInt32};
  options.ops = {ReduceOp::kSum, ReduceOp::kMax};
  return options;
}

struct Local {
  LoopWorld world;
  std::vector<std::unique_ptr<LoopBackend>> owned;
  std::vector<LoopBackend*> backends;
  explicit Local(int n) : world(n) {
    for (int r = 0; r < n; ++r) {
      owned.push_back(std::make_unique<LoopBackend>(world, r));
      backends.push_back(owned.back().get());
    }
  }
  std::function<void()> begin() {
    return [this] { world.begin(); };
  }
  std::function<void()> end() {
    return [this] { world.end(); };
  }
};

/// Discards the table (the engine prints rank 0's).
struct NullFile {
  std::FILE* file = std::fopen("/dev/null", "w");
  ~NullFile() {
    if (file) std::fclose(file);
  }
};

/// Keeps the table, for its footer.
struct TableFile {
  std::FILE* file = std::tmpfile();
  ~TableFile() {
    if (file) std::fclose(file);
  }
  /// The table's line that starts with `prefix` ("" when none).
  std::string line(const std::string& prefix) const {
    std::fflush(file);
    std::rewind(file);
    char buffer[512];
    while (std::fgets(buffer, sizeof buffer, file) != nullptr) {
      std::string text(buffer);
      if (text.rfind(prefix, 0) == 0) return text;
    }
    return "";
  }
};

/// An implementation whose results on local rank 1 are off by one in the first element.
ncclkit::perf::Implementation off_by_one(const ncclkit::perf::Implementation& good) {
  auto broken = good;
  broken.name = "broken";
  auto last_out = std::make_shared<std::vector<TensorView>>(2);
  broken.issue = [issue = good.issue, last_out](int l, ncclkit::perf::Collective c, TensorView in, TensorView out,
                                                ReduceOp op, int root) {
    (*last_out)[static_cast<std::size_t>(l)] = out;
    issue(l, c, in, out, op, root);
  };
  broken.complete = [last_out] {
    const TensorView& out = (*last_out)[1];
    if (out.count > 0) LoopWorld::store(out, 0, LoopWorld::load(out, 0) + 1);
  };
  return broken;
}

}  // namespace

TEST_CASE("the perf engine checks every case when one thread drives several local ranks") {
  Local local(3);
  auto impl = ncclkit::perf::backend_implementation(local.backends, "ncclkit", local.begin(), local.end());
  NullFile null;
  const auto options = small_sweep();
  const auto summary = ncclkit::perf::run_perf(local.backends, {impl}, options, local.begin(), local.end(), null.file);
  CHECK(summary.ok());
  CHECK(summary.wrong == 0);
  // (2 reductions x 2 ops + 2 others) x 2 types x 4 sizes (8 B, 64 B, 512 B, 4 KiB), every
  // row in both placements.
  CHECK(summary.rows.size() == (2 * 2 + 2 * 1) * 2 * 4);
  for (const auto& row : summary.rows) {
    CHECK(row.out_of_place.ran);
    CHECK(row.in_place.ran);
    CHECK(row.out_of_place.wrong == 0);
    CHECK(row.in_place.wrong == 0);
  }
  CHECK(local.world.collectives_run > 0);
}

TEST_CASE("the perf engine counts wrong results on every local rank") {
  Local local(2);
  auto good = ncclkit::perf::backend_implementation(local.backends, "ncclkit", local.begin(), local.end());
  const auto broken = off_by_one(good);
  auto options = small_sweep();
  options.collectives = {ncclkit::perf::Collective::kAllReduce};
  options.types = {DataType::kInt32};
  options.ops = {ReduceOp::kSum};
  NullFile null;
  const auto summary =
      ncclkit::perf::run_perf(local.backends, {good, broken}, options, local.begin(), local.end(), null.file);
  CHECK_FALSE(summary.ok());
  for (const auto& row : summary.rows) {
    if (row.implementation == "ncclkit") {
      CHECK(row.out_of_place.wrong == 0);
      CHECK(row.in_place.wrong == 0);
    } else {
      CHECK(row.out_of_place.wrong == 1);
      CHECK(row.in_place.wrong == 1);
    }
  }
}

TEST_CASE("several local ranks without group calls are refused before anything runs") {
  Local local(2);
  auto grouped = ncclkit::perf::backend_implementation(local.backends, "ncclkit", local.begin(), local.end());
  auto ungrouped = ncclkit::perf::backend_implementation(local.backends, "ncclkit");
  NullFile null;
  const auto options = small_sweep();
  CHECK_THROWS_WITH_AS(ncclkit::perf::run_perf(local.backends, {grouped}, options, {}, {}, null.file),
                       doctest::Contains("group calls"), ncclkit::ConfigError);
  CHECK_THROWS_WITH_AS(
      ncclkit::perf::run_perf(local.backends, {ungrouped}, options, local.begin(), local.end(), null.file),
      doctest::Contains("'ncclkit' has no group calls"), ncclkit::ConfigError);
  CHECK(local.world.collectives_run == 0);
}

TEST_CASE("one local rank needs no group calls") {
  Local local(1);
  auto impl = ncclkit::perf::backend_implementation(local.backends);
  NullFile null;
  const auto summary = ncclkit::perf::run_perf(*local.backends[0], {impl}, small_sweep(), null.file);
  CHECK(summary.ok());
  CHECK_FALSE(summary.rows.empty());
}

TEST_CASE("a wrong result makes the tools exit non-zero, and the footer says FAILED") {
  Local local(2);
  auto good = ncclkit::perf::backend_implementation(local.backends, "ncclkit", local.begin(), local.end());
  auto options = small_sweep();
  options.collectives = {ncclkit::perf::Collective::kAllReduce};
  options.types = {DataType::kInt32};
  options.ops = {ReduceOp::kSum};
  TableFile table;
  const auto summary = ncclkit::perf::run_perf(local.backends, {good, off_by_one(good)}, options, local.begin(),
                                               local.end(), table.file);
  CHECK(summary.exit_code() != 0);
  CHECK(summary.verdict() == std::to_string(summary.wrong) + " FAILED");
  CHECK(table.line("# Out of bounds values") == "# Out of bounds values : " + summary.verdict() + "\n");
}

TEST_CASE("a checked run counts every measurement it checked, and its footer says OK") {
  Local local(2);
  auto impl = ncclkit::perf::backend_implementation(local.backends, "ncclkit", local.begin(), local.end());
  TableFile table;
  const auto summary =
      ncclkit::perf::run_perf(local.backends, {impl}, small_sweep(), local.begin(), local.end(), table.file);
  CHECK(summary.exit_code() == 0);
  CHECK(summary.checked == static_cast<long long>(summary.rows.size()) * 2);  // both placements of every row
  CHECK(table.line("# Out of bounds values") == "# Out of bounds values : 0 OK\n");
}

TEST_CASE("a run with -c 0 checks nothing and says so: not checked, never 0 OK") {
  Local local(2);
  auto good = ncclkit::perf::backend_implementation(local.backends, "ncclkit", local.begin(), local.end());
  auto options = small_sweep();
  options.check = 0;
  TableFile table;
  // Wrong results go unseen without the check: the footer must not call them OK.
  const auto summary = ncclkit::perf::run_perf(local.backends, {good, off_by_one(good)}, options, local.begin(),
                                               local.end(), table.file);
  CHECK(summary.checked == 0);
  CHECK(summary.wrong == 0);
  CHECK(summary.exit_code() == 0);
  CHECK(summary.verdict() == "not checked");
  CHECK(table.line("# Out of bounds values") == "# Out of bounds values : not checked\n");
  for (const auto& row : summary.rows) {
    CHECK(row.out_of_place.wrong == -1);
    CHECK(row.in_place.wrong == -1);
  }
}
