// Tests of ncclkit/gloo/reduce_kernels.hpp: the vectorised loops against scalar references
// (exact: they must agree bit for bit), both instruction-set copies against each other, every
// length class (empty, tails, whole vectors) and aliasing (out == a, out == b); and which copy
// NCCLKIT_GLOO_ISA makes a fresh process pick.
#include <doctest/doctest.h>

#include <signal.h>    // kill, SIGKILL
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // fork, execve, _exit

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ncclkit/gloo/reduce_kernels.hpp"
#include "support/gloo_testing.hpp"
#include "support/temp_dir.hpp"
#include "support/text.hpp"

using ncclkit::BFloat16;
using ncclkit::data_type_v;
using ncclkit::DataType;
using ncclkit::Half;
using ncclkit::ReduceOp;
namespace kg = ncclkit::gloo;

namespace {

std::vector<kg::KernelIsa> isas() {
  std::vector<kg::KernelIsa> list{kg::KernelIsa::kGeneric};
  if (kg::isa_supported(kg::KernelIsa::kAvx2F16c)) list.push_back(kg::KernelIsa::kAvx2F16c);
  return list;
}

/// The scalar result of one element, as the loops must compute it.
template <class T>
T scalar_reduce(T a, T b, ReduceOp op) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    const float x = static_cast<float>(a), y = static_cast<float>(b);
    float r = 0;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        r = x + y;
        break;
      case ReduceOp::kProd:
        r = x * y;
        break;
      case ReduceOp::kMin:
        r = x < y ? x : y;
        break;
      case ReduceOp::kMax:
        r = x > y ? x : y;
        break;
    }
    return T(r);
  } else if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    using Wide = std::common_type_t<U, unsigned>;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return static_cast<T>(
            static_cast<U>(static_cast<Wide>(static_cast<U>(a)) + static_cast<Wide>(static_cast<U>(b))));
      case ReduceOp::kProd:
        return static_cast<T>(
            static_cast<U>(static_cast<Wide>(static_cast<U>(a)) * static_cast<Wide>(static_cast<U>(b))));
      case ReduceOp::kMin:
        return a < b ? a : b;
      case ReduceOp::kMax:
        return a > b ? a : b;
    }
    return T{};
  } else {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return a + b;
      case ReduceOp::kProd:
        return a * b;
      case ReduceOp::kMin:
        return a < b ? a : b;
      case ReduceOp::kMax:
        return a > b ? a : b;
    }
    return T{};
  }
}

/// Random bit patterns over the type's whole range (NaNs excluded for floats: NaN payloads
/// may differ between hardware and software conversion, and NaN compares unequal anyway).
template <class T>
std::vector<T> random_bits(std::size_t n, std::mt19937_64& rng) {
  std::vector<T> v(n);
  for (auto& x : v) {
    for (;;) {
      std::uint64_t bits = rng();
      std::memcpy(&x, &bits, sizeof(T));
      if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
        if (std::isnan(static_cast<float>(x))) continue;
      } else if constexpr (std::is_floating_point_v<T>) {
        if (std::isnan(x)) continue;
      }
      break;
    }
  }
  return v;
}

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

}  // namespace

TEST_CASE("every reduction equals the scalar reference bit for bit, for every length and both ISAs") {
  std::mt19937_64 rng(42);
  ncclkit::testing::for_each_type([&]<class T>() {
    for (ReduceOp op : ncclkit::testing::kAllOps) {
      for (std::size_t n : {0u, 1u, 3u, 7u, 8u, 15u, 16u, 17u, 31u, 33u, 64u, 1000u, 4099u}) {
        auto a = random_bits<T>(n, rng);
        auto b = random_bits<T>(n, rng);
        std::vector<T> want(n);
        for (std::size_t i = 0; i < n; ++i) want[i] = scalar_reduce(a[i], b[i], op);
        for (auto isa : isas()) {
          std::vector<T> out(n);
          kg::reduce_function(data_type_v<T>, op, isa)(out.data(), a.data(), b.data(), n);
          std::size_t mismatches = 0;
          for (std::size_t i = 0; i < n; ++i) mismatches += !same_bits(out[i], want[i]);
          INFO(ncclkit::name_of(data_type_v<T>), " ", ncclkit::name_of(op), " n=", n, " isa=", kg::name_of(isa));
          CHECK(mismatches == 0);
          // In place on either side: out == a, out == b.
          std::vector<T> left = a, right = b;
          kg::reduce_function(data_type_v<T>, op, isa)(left.data(), left.data(), b.data(), n);
          kg::reduce_function(data_type_v<T>, op, isa)(right.data(), a.data(), right.data(), n);
          std::size_t alias_mismatches = 0;
          for (std::size_t i = 0; i < n; ++i)
            alias_mismatches += !same_bits(left[i], want[i]) + !same_bits(right[i], want[i]);
          CHECK(alias_mismatches == 0);
        }
      }
    }
  });
}

TEST_CASE("Half and BFloat16 sums round like ncclkit::Half on edge values: subnormals, overflow, ties") {
  // Pairs whose float sum lands exactly on binary16 rounding boundaries and ranges.
  const float values[] = {0.0f,     -0.0f,       6.1035156e-05f, 5.9604645e-08f, 65504.0f, -65504.0f, 65519.0f,
                          65520.0f, 1.0f,        1.0009766f,     0.00048828125f, 3.0e-08f, 1e-07f,    -2.9802322e-08f,
                          2048.0f,  1.0f / 3.0f, 1e30f,          -1e30f,         INFINITY, -INFINITY};
  for (auto isa : isas()) {
    std::vector<Half> a, b;
    std::vector<BFloat16> c, d;
    for (float x : values) {
      for (float y : values) {
        a.push_back(Half(x));
        b.push_back(Half(y));
        c.push_back(BFloat16(x));
        d.push_back(BFloat16(y));
      }
    }
    std::vector<Half> out(a.size());
    std::vector<BFloat16> out_b(c.size());
    kg::reduce_function(DataType::kFloat16, ReduceOp::kSum, isa)(out.data(), a.data(), b.data(), a.size());
    kg::reduce_function(DataType::kBFloat16, ReduceOp::kSum, isa)(out_b.data(), c.data(), d.data(), c.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      const Half want(static_cast<float>(a[i]) + static_cast<float>(b[i]));
      const BFloat16 want_b(static_cast<float>(c[i]) + static_cast<float>(d[i]));
      INFO("isa=", kg::name_of(isa), " i=", i, " a=", static_cast<float>(a[i]), " b=", static_cast<float>(b[i]));
      // inf + -inf is NaN, whose payload may differ between conversions.
      if (std::isnan(static_cast<float>(want))) {
        CHECK(std::isnan(static_cast<float>(out[i])));
      } else {
        CHECK(out[i].bits == want.bits);
      }
      if (std::isnan(static_cast<float>(want_b))) {
        CHECK(std::isnan(static_cast<float>(out_b[i])));
      } else {
        CHECK(out_b[i].bits == want_b.bits);
      }
    }
  }
}

TEST_CASE("scaling a 16-bit value by 1 is exact for all 65536 bit patterns; NaN stays NaN") {
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<std::uint16_t>(i);
  for (auto isa : isas()) {
    for (DataType type : {DataType::kFloat16, DataType::kBFloat16}) {
      std::vector<std::uint16_t> out(all.size());
      kg::scale(type, out.data(), all.data(), all.size(), 1.0, isa);
      std::size_t mismatches = 0;
      for (std::uint32_t i = 0; i < 65536; ++i) {
        const float x = type == DataType::kFloat16 ? Half::to_float(all[i]) : BFloat16::to_float(all[i]);
        const float y = type == DataType::kFloat16 ? Half::to_float(out[i]) : BFloat16::to_float(out[i]);
        if (std::isnan(x)) {
          mismatches += !std::isnan(y);
        } else {
          mismatches += out[i] != all[i];
        }
      }
      INFO(ncclkit::name_of(type), " isa=", kg::name_of(isa));
      CHECK(mismatches == 0);
    }
  }
}

TEST_CASE("scale multiplies in the element type; divide truncates integers toward zero") {
  for (auto isa : isas()) {
    std::vector<float> f{1.0f, -2.0f, 3.5f, 0.25f, 7.0f, 9.0f, -11.0f, 13.0f, 1e-3f, 4.0f};
    std::vector<float> g(f.size());
    kg::scale(DataType::kFloat32, g.data(), f.data(), f.size(), 0.5, isa);
    for (std::size_t i = 0; i < f.size(); ++i) CHECK(g[i] == f[i] * 0.5f);
    std::vector<Half> h{Half(3.0f), Half(-5.0f), Half(0.1f)};
    kg::scale(DataType::kFloat16, h.data(), h.data(), h.size(), 0.25, isa);
    CHECK(static_cast<float>(h[0]) == 0.75f);
    CHECK(static_cast<float>(h[1]) == -1.25f);
    std::vector<std::int32_t> i32{7, -7, 100, 3};
    kg::scale(DataType::kInt32, i32.data(), i32.data(), i32.size(), 0.5, isa);
    CHECK(i32 == std::vector<std::int32_t>{4, -4, 50, 2});  // round half away from zero (llround)
  }
  std::vector<std::int8_t> i8{7, -7, 100, -128, 3};
  kg::divide(DataType::kInt8, i8.data(), i8.size(), 2);
  CHECK(i8 == std::vector<std::int8_t>{3, -3, 50, -64, 1});
  std::vector<std::uint64_t> u64{9, 10, 11};
  kg::divide(DataType::kUint64, u64.data(), u64.size(), 3);
  CHECK(u64 == std::vector<std::uint64_t>{3, 3, 3});
  std::vector<double> d{3.0, -6.0};
  kg::divide(DataType::kFloat64, d.data(), d.size(), 3);
  CHECK(d == std::vector<double>{1.0, -2.0});
}

TEST_CASE("integer sums and products wrap around like two's complement") {
  for (auto isa : isas()) {
    std::vector<std::int8_t> a(40, 100), b(40, 100), out(40);
    kg::reduce_function(DataType::kInt8, ReduceOp::kSum, isa)(out.data(), a.data(), b.data(), a.size());
    for (auto v : out) CHECK(v == static_cast<std::int8_t>(-56));
    kg::reduce_function(DataType::kInt8, ReduceOp::kProd, isa)(out.data(), a.data(), b.data(), a.size());
    for (auto v : out) CHECK(v == static_cast<std::int8_t>(10000 & 0xff));
    std::vector<std::int64_t> x(9, std::numeric_limits<std::int64_t>::max()), y(9, 1), z(9);
    kg::reduce_function(DataType::kInt64, ReduceOp::kSum, isa)(z.data(), x.data(), y.data(), x.size());
    for (auto v : z) CHECK(v == std::numeric_limits<std::int64_t>::min());
  }
}

namespace {

constexpr const char* kIsaChildCase = "child process: writes which copy NCCLKIT_GLOO_ISA made default_isa() pick";

/// What a fresh process of this test program picks under NCCLKIT_GLOO_ISA=`setting` (nullptr:
/// unset), as the child test case below writes it: "generic", "avx2+f16c", or the ConfigError.
/// A child process per setting, since default_isa() decides once per process.
std::string isa_chosen_in_child(const char* setting) {
  ncclkit_test::TempDir dir("isa");
  const std::string report = dir.path + "/report";
  const std::string output = dir.path + "/output";
  const std::string program = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::vector<std::string> arguments{program, "--no-skip=true", std::string("--test-case=") + kIsaChildCase};
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string variable = *entry;
    if (variable.rfind("NCCLKIT_GLOO_ISA=", 0) != 0) environment.push_back(variable);
  }
  if (setting != nullptr) environment.push_back(std::string("NCCLKIT_GLOO_ISA=") + setting);
  environment.push_back("NCCLKIT_TEST_ISA_REPORT=" + report);
  std::vector<char*> argv, envp;
  for (const auto& a : arguments) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : environment) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (std::freopen(output.c_str(), "w", stdout) == nullptr || ::dup2(::fileno(stdout), 2) < 0) ::_exit(126);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  // The child only starts and answers: a few hundred milliseconds, far below this limit.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      FAIL("the child process did not end within 60 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::ifstream in(report);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) || text.empty()) {
    std::ifstream log(output);
    const std::string printed((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    FAIL("the child process under NCCLKIT_GLOO_ISA=", setting ? setting : "(unset)", " failed (wait status ", status,
         "):\n", printed);
  }
  return text;
}

}  // namespace

TEST_CASE("NCCLKIT_GLOO_ISA picks the copy; the AVX2 copy is chosen where the CPU has it") {
  const bool has_avx2 = kg::isa_supported(kg::KernelIsa::kAvx2F16c);
  CHECK(isa_chosen_in_child(nullptr) == (has_avx2 ? "avx2+f16c" : "generic"));
  CHECK(isa_chosen_in_child("generic") == "generic");
  if (has_avx2) {
    CHECK(isa_chosen_in_child("avx2") == "avx2+f16c");
  } else {
    CHECK(
        ncclkit_test::contains(isa_chosen_in_child("avx2"), "ConfigError: NCCLKIT_GLOO_ISA=avx2, but this CPU lacks"));
  }
  CHECK(ncclkit_test::contains(isa_chosen_in_child("sse9"), "NCCLKIT_GLOO_ISA='sse9' is not one of: generic, avx2"));
}

// Run only by the test case above, in a child process (doctest skips it otherwise). Left as
// written: clang-format takes the name times the decorator for a pointer declaration.
// clang-format off
TEST_CASE(kIsaChildCase * doctest::skip()) {
  // clang-format on
  const char* report = std::getenv("NCCLKIT_TEST_ISA_REPORT");
  REQUIRE(report != nullptr);
  std::string text;
  try {
    const kg::KernelIsa isa = kg::default_isa();
    text = std::string(kg::name_of(isa));
    // The loops that run by default are that copy's.
    if (kg::reduce_function(DataType::kBFloat16, ReduceOp::kSum) !=
        kg::reduce_function(DataType::kBFloat16, ReduceOp::kSum, isa)) {
      text += ", but reduce_function() defaults to the other copy";
    }
  } catch (const ncclkit::ConfigError& e) {
    text = std::string("ConfigError: ") + e.what();
  }
  std::ofstream(report) << text;
}

TEST_CASE("cast between float and 16-bit types equals ncclkit's portable cast bit for bit, counts included") {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> uniform(-70000.0f, 70000.0f);
  for (std::size_t n : {0u, 1u, 7u, 8u, 17u, 4095u, 4096u, 4097u, 20001u}) {
    std::vector<float> wide(n);
    for (std::size_t i = 0; i < n; ++i) {
      wide[i] = i % 5 == 0 ? uniform(rng) : uniform(rng) * 1e-6f;
      if (i % 101 == 3) wide[i] = std::numeric_limits<float>::infinity();
      if (i % 211 == 4) wide[i] = std::numeric_limits<float>::quiet_NaN();
    }
    for (DataType narrow : {DataType::kFloat16, DataType::kBFloat16}) {
      for (double factor : {1.0, 0.25}) {
        std::vector<std::uint16_t> want(n), got(n);
        const ncclkit::TensorView from{wide.data(), n, DataType::kFloat32};
        const auto want_count =
            ncclkit::detail::cast_on_host(from, ncclkit::TensorView{want.data(), n, narrow}, factor);
        std::vector<float> back_want(n), back_got(n);
        const auto back_count = ncclkit::detail::cast_on_host(ncclkit::TensorView{want.data(), n, narrow},
                                                              ncclkit::TensorView{back_want.data(), n}, 2.0);
        for (auto isa : isas()) {
          CAPTURE(n);
          CAPTURE(static_cast<int>(narrow));
          CAPTURE(kg::name_of(isa));
          CHECK(kg::cast(from, ncclkit::TensorView{got.data(), n, narrow}, factor, isa) == want_count);
          // NaNs may differ in payload: compare their class, everything else bit for bit.
          std::size_t differ = 0;
          for (std::size_t i = 0; i < n; ++i) {
            const float a = narrow == DataType::kFloat16 ? static_cast<float>(Half::from_bits(got[i]))
                                                         : static_cast<float>(BFloat16::from_bits(got[i]));
            const bool both_nan = std::isnan(a) && (narrow == DataType::kFloat16
                                                        ? std::isnan(static_cast<float>(Half::from_bits(want[i])))
                                                        : std::isnan(static_cast<float>(BFloat16::from_bits(want[i]))));
            differ += got[i] != want[i] && !both_nan ? 1 : 0;
          }
          CHECK(differ == 0);
          CHECK(kg::cast(ncclkit::TensorView{want.data(), n, narrow}, ncclkit::TensorView{back_got.data(), n}, 2.0,
                         isa) == back_count);
          CHECK((n == 0 || std::memcmp(back_got.data(), back_want.data(), n * sizeof(float)) == 0));
        }
      }
    }
  }
}
