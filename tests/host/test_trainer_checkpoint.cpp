// Tests of ncclkit/trainer/checkpoint.hpp: a round trip of every field and byte; an atomic
// replace that leaves no temp file and never touches the previous file; a crash before the
// rename (a temp file left behind) that costs nothing; keep_last; every truncation and bit flip
// of a small file refused with a message saying what; a hostile table refused without a large
// allocation; load_latest falling back, loudly, past a corrupted newest checkpoint; problem()
// for unusable folders; first_difference for each kind of difference.
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include <unistd.h>  // link

#include <cstddef>     // std::byte, std::size_t
#include <cstdint>     // fixed-width integers
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream, std::ofstream
#include <iterator>    // std::istreambuf_iterator
#include <optional>    // std::optional
#include <random>      // std::mt19937_64
#include <string>      // std::string
#include <utility>     // std::pair, std::swap, std::move
#include <vector>      // std::vector

#include "ncclkit/trainer/checkpoint.hpp"
#include "support/stderr_capture.hpp"
#include "support/temp_dir.hpp"
#include "support/text.hpp"

using ncclkit::ConfigError;
using ncclkit::DataType;
using ncclkit::trainer::CheckpointData;
using ncclkit::trainer::CheckpointError;
using ncclkit::trainer::CheckpointFolder;
using ncclkit::trainer::DeclaredTensor;
using ncclkit::trainer::first_difference;
using ncclkit::trainer::read_checkpoint_file;
using ncclkit::trainer::SavedTensor;
using ncclkit::trainer::TensorRole;
using ncclkit::trainer::write_checkpoint_file;
using ncclkit_test::contains;
using ncclkit_test::entries;
using ncclkit_test::stderr_of;
using ncclkit_test::TempDir;
namespace fs = std::filesystem;

namespace {

std::vector<std::byte> random_bytes(std::size_t size, std::mt19937_64& random) {
  std::vector<std::byte> bytes(size);
  for (auto& b : bytes) b = static_cast<std::byte>(random() & 0xff);
  return bytes;
}

SavedTensor tensor_of(std::string name, std::vector<std::int64_t> shape, DataType dtype, TensorRole role,
                      std::mt19937_64& random) {
  std::size_t count = 1;
  for (auto dim : shape) count *= static_cast<std::size_t>(dim);
  SavedTensor tensor{std::move(name), std::move(shape), dtype, role, {}};
  tensor.bytes = random_bytes(count * ncclkit::size_of(dtype), random);
  return tensor;
}

// A checkpoint of every role, several types, an empty tensor and a scalar, at `step`.
CheckpointData sample_checkpoint(std::uint64_t step, std::uint64_t seed = 7) {
  std::mt19937_64 random(seed * 1000 + step);
  CheckpointData data;
  data.step = step;
  data.epoch = 3;
  data.consumed = 0xFEDCBA9876543210ull;  // all eight bytes of a u64 matter
  data.seed = 0x0123456789ABCDEFull;
  data.global_batch = 96;
  data.world_size = 4;
  data.optimizer = "adamw lr=0.001 betas=(0.9, 0.999) eps=1e-08 weight_decay=0.01";
  data.tensors.push_back(tensor_of("fc1.weight", {16, 8}, DataType::kFloat32, TensorRole::kValue, random));
  data.tensors.push_back(tensor_of("fc1.bias", {16}, DataType::kFloat32, TensorRole::kValue, random));
  data.tensors.push_back(tensor_of("embed", {5, 3}, DataType::kBFloat16, TensorRole::kValue, random));
  data.tensors.push_back(tensor_of("head", {3, 2}, DataType::kFloat16, TensorRole::kValue, random));
  data.tensors.push_back(tensor_of("unused", {0, 4}, DataType::kFloat32, TensorRole::kValue, random));
  data.tensors.push_back(tensor_of("fc1.weight", {16, 8}, DataType::kFloat32, TensorRole::kState0, random));
  data.tensors.push_back(tensor_of("fc1.weight", {16, 8}, DataType::kFloat64, TensorRole::kState1, random));
  data.tensors.push_back(tensor_of("steps_seen", {}, DataType::kInt64, TensorRole::kBuffer, random));
  data.tensors.push_back(tensor_of("mask", {7}, DataType::kUint8, TensorRole::kBuffer, random));
  return data;
}

// A small checkpoint (two tensors, about 150 bytes), for every-byte sweeps.
CheckpointData small_checkpoint() {
  std::mt19937_64 random(11);
  CheckpointData data;
  data.step = 5;
  data.world_size = 2;
  data.optimizer = "sgd";
  data.tensors.push_back(tensor_of("w", {3, 2}, DataType::kFloat32, TensorRole::kValue, random));
  data.tensors.push_back(tensor_of("b", {2}, DataType::kFloat16, TensorRole::kValue, random));
  return data;
}

std::vector<char> file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
// A new file each time: ext4 flushes a file truncated and rewritten in place on close, which
// makes sweeps over hundreds of variants slow.
void put_file(const fs::path& path, const std::vector<char>& bytes) {
  fs::remove(path);
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}
std::vector<char> with_bit_flipped(std::vector<char> bytes, std::size_t at, int bit) {
  bytes[at] = static_cast<char>(bytes[at] ^ (1 << bit));
  return bytes;
}

// The message of the CheckpointError that reading `path` throws; FAILs when it reads.
std::string refusal(const fs::path& path) {
  try {
    read_checkpoint_file(path);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  FAIL_CHECK("read_checkpoint_file accepted " << path.string());
  return {};
}

std::vector<std::string> names_of(const std::vector<fs::path>& paths) {
  std::vector<std::string> names;
  for (const auto& path : paths) names.push_back(path.filename().string());
  return names;
}

}  // namespace

TEST_CASE("a checkpoint reads back with every field and every byte, and no temp file is left") {
  TempDir dir("ckpt");
  const CheckpointData data = sample_checkpoint(120);
  const fs::path path = fs::path(dir.path) / "run.ckpt";
  write_checkpoint_file(path, data);
  const CheckpointData back = read_checkpoint_file(path);
  CHECK(back.step == 120);
  CHECK(back.epoch == 3);
  CHECK(back.consumed == 0xFEDCBA9876543210ull);
  CHECK(back.seed == 0x0123456789ABCDEFull);
  CHECK(back.global_batch == 96);
  CHECK(back.world_size == 4);
  CHECK(back.optimizer == data.optimizer);
  REQUIRE(back.tensors.size() == data.tensors.size());
  for (std::size_t i = 0; i < data.tensors.size(); ++i) {
    CAPTURE(i);
    CHECK(back.tensors[i].name == data.tensors[i].name);
    CHECK(back.tensors[i].shape == data.tensors[i].shape);
    CHECK(back.tensors[i].dtype == data.tensors[i].dtype);
    CHECK(back.tensors[i].role == data.tensors[i].role);
    CHECK(back.tensors[i].bytes == data.tensors[i].bytes);
  }
  CHECK(back.tensors[4].bytes.empty());
  CHECK(back.tensors[7].shape.empty());
  CHECK(back.tensors[7].bytes.size() == 8);
  CHECK(back == data);
  CHECK(entries(dir.path) == std::vector<std::string>{"run.ckpt"});

  CHECK(read_checkpoint_file(path) == read_checkpoint_file(path));
  CheckpointData empty;
  write_checkpoint_file(path, empty);
  CHECK(read_checkpoint_file(path) == empty);
}

TEST_CASE("a write replaces the file by a rename: the previous file is never written in place") {
  TempDir dir("ckpt");
  const fs::path path = fs::path(dir.path) / "run.ckpt";
  const CheckpointData first = sample_checkpoint(10);
  write_checkpoint_file(path, first);
  // A second name for the file as it is now: a write in place would change what it reads.
  const fs::path pinned = fs::path(dir.path) / "pinned";
  REQUIRE(::link(path.c_str(), pinned.c_str()) == 0);
  const CheckpointData second = sample_checkpoint(20, 99);
  write_checkpoint_file(path, second);
  CHECK(read_checkpoint_file(path) == second);
  CHECK(read_checkpoint_file(pinned) == first);
  CHECK(entries(dir.path) == std::vector<std::string>{"pinned", "run.ckpt"});
}

TEST_CASE("a tensor whose bytes do not match its shape is refused, naming it, and nothing is written") {
  TempDir dir("ckpt");
  CheckpointData data = sample_checkpoint(1);
  data.tensors[1].bytes.pop_back();
  const fs::path path = fs::path(dir.path) / "run.ckpt";
  try {
    write_checkpoint_file(path, data);
    FAIL("the write succeeded");
  } catch (const CheckpointError& e) {
    CHECK(contains(e.what(), "tensor \"fc1.bias\" holds 63 bytes, but shape [16] of float needs 64"));
  }
  data = sample_checkpoint(1);
  data.tensors[0].shape = {-16, 8};
  CHECK_THROWS_AS(write_checkpoint_file(path, data), CheckpointError);
  CHECK(entries(dir.path).empty());
}

TEST_CASE("a write into a folder that does not exist is an error naming the folder, and leaves nothing") {
  TempDir dir("ckpt");
  const fs::path path = fs::path(dir.path) / "missing" / "run.ckpt";
  try {
    write_checkpoint_file(path, sample_checkpoint(1));
    FAIL("the write succeeded");
  } catch (const CheckpointError& e) {
    CHECK(contains(e.what(), "cannot create a temp file in " + (fs::path(dir.path) / "missing").string()));
    CHECK(contains(e.what(), "No such file or directory"));
  }
  CHECK(entries(dir.path).empty());
}

TEST_CASE("a write that fails after its temp file was made removes the temp file") {
  TempDir dir("ckpt");
  // A folder where the checkpoint should go: the rename onto it fails, after the write.
  const fs::path path = fs::path(dir.path) / "run.ckpt";
  fs::create_directory(path);
  put_file(path / "keep", {'x'});
  try {
    write_checkpoint_file(path, sample_checkpoint(1));
    FAIL("the write succeeded");
  } catch (const CheckpointError& e) {
    CHECK(contains(e.what(), path.string() + ": cannot write"));
    CHECK(contains(e.what(), "Is a directory"));
  }
  CHECK(entries(dir.path) == std::vector<std::string>{"run.ckpt"});
}

TEST_CASE("every truncation of a checkpoint is refused as truncated, naming the file") {
  TempDir dir("ckpt");
  const fs::path whole = fs::path(dir.path) / "whole.ckpt";
  write_checkpoint_file(whole, small_checkpoint());
  const std::vector<char> bytes = file_bytes(whole);
  REQUIRE(bytes.size() < 400);
  const fs::path cut = fs::path(dir.path) / "cut.ckpt";
  for (std::size_t length = 0; length < bytes.size(); ++length) {
    CAPTURE(length);
    put_file(cut, std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(length)));
    const std::string message = refusal(cut);
    CHECK(contains(message, cut.string()));
    CHECK(contains(message, "truncated: " + std::to_string(length) + " bytes"));
  }
}

TEST_CASE("a bit flip anywhere in a checkpoint is refused with what it broke") {
  TempDir dir("ckpt");
  const fs::path whole = fs::path(dir.path) / "whole.ckpt";
  write_checkpoint_file(whole, small_checkpoint());
  const std::vector<char> bytes = file_bytes(whole);
  const fs::path flipped = fs::path(dir.path) / "flipped.ckpt";
  for (std::size_t at = 0; at < bytes.size(); ++at) {
    for (int bit : {0, 7, static_cast<int>(at % 8)}) {
      CAPTURE(at);
      CAPTURE(bit);
      put_file(flipped, with_bit_flipped(bytes, at, bit));
      const std::string message = refusal(flipped);
      CHECK(contains(message, flipped.string()));
      if (at < 8) {
        CHECK(contains(message, "not an ncclkit checkpoint"));
      } else if (at < 12) {
        CHECK(contains(message, "format version"));
      } else if (at < 20) {  // table_bytes
        CHECK((contains(message, "checksum mismatch") || contains(message, "corrupted: its header gives a table")));
      } else if (at < 28) {  // file_bytes
        CHECK((contains(message, "truncated") || contains(message, "corrupted: " + std::to_string(bytes.size()))));
      } else {  // the table, the tensors' bytes, the checksum itself
        CHECK(contains(message, "checksum mismatch"));
      }
    }
  }
}

TEST_CASE("a file of another kind or another format version is refused as such") {
  TempDir dir("ckpt");
  const fs::path path = fs::path(dir.path) / "x.ckpt";
  const std::string text = "{\"step\": 120, \"this is\": \"a JSON file\"}\n";
  put_file(path, std::vector<char>(text.begin(), text.end()));
  CHECK(contains(refusal(path), "not an ncclkit checkpoint"));
  write_checkpoint_file(path, small_checkpoint());
  std::vector<char> bytes = file_bytes(path);
  bytes[8] = 2;  // version 2, little-endian
  put_file(path, bytes);
  CHECK(contains(refusal(path), "format version 2; this build of ncclkit reads version 1 only"));
  CHECK(contains(refusal(fs::path(dir.path) / "absent.ckpt"), "cannot open it: No such file or directory"));
}

TEST_CASE("a hostile table with a valid checksum is refused before anything large is allocated") {
  TempDir dir("ckpt");
  const fs::path path = fs::path(dir.path) / "hostile.ckpt";
  // A file laid out by the format, its checksum right, its table built by `table`.
  auto write_crafted = [&](auto table_of) {
    ncclkit::detail::ByteWriter table;
    for (int i = 0; i < 5; ++i) table.u64(0);
    table.u32(1);
    table.text("sgd");
    table_of(table);
    const std::vector<std::byte> table_bytes = std::move(table).take();
    ncclkit::detail::ByteWriter file;
    for (char c : std::string("NCCLKCPT")) file.u8(static_cast<std::uint8_t>(c));
    file.u32(1);
    file.u64(table_bytes.size());
    file.u64(28 + table_bytes.size() + 8);
    std::vector<std::byte> bytes = std::move(file).take();
    bytes.insert(bytes.end(), table_bytes.begin(), table_bytes.end());
    const std::uint64_t checksum = ncclkit::detail::fnv1a64(bytes);
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<std::byte>((checksum >> (8 * i)) & 0xff));
    std::vector<char> chars(bytes.size());
    for (std::size_t i = 0; i < bytes.size(); ++i) chars[i] = static_cast<char>(bytes[i]);
    put_file(path, chars);
  };
  write_crafted([](ncclkit::detail::ByteWriter& t) { t.u32(0xFFFFFFFFu); });
  CHECK(contains(refusal(path), "4294967295 tensors cannot fit"));
  write_crafted([](ncclkit::detail::ByteWriter& t) {
    t.u32(1);
    t.text("w");
    t.u8(9);  // float32
    t.u8(0);
    t.u32(1);
    t.u64(std::uint64_t{1} << 40);
    t.u64(std::uint64_t{1} << 42);
  });
  CHECK(contains(refusal(path), "tensor \"w\" needs 4398046511104 bytes, 0 are left in the file"));
  write_crafted([](ncclkit::detail::ByteWriter& t) {
    t.u32(1);
    t.text("w");
    t.u8(9);
    t.u8(0);
    t.u32(0x7FFFFFFFu);  // dimensions
    for (int i = 0; i < 4; ++i) t.u64(0);
  });
  CHECK(contains(refusal(path), "has more dimensions than the table holds"));
  write_crafted([](ncclkit::detail::ByteWriter& t) {
    t.u32(1);
    t.text("w");
    t.u8(42);
    for (int i = 0; i < 4; ++i) t.u64(0);
  });
  CHECK(contains(refusal(path), "tensor \"w\" has an unknown element type code"));
}

TEST_CASE("CheckpointFolder saves step-NNNNNNNN.ckpt, lists them by step and keeps the last k") {
  TempDir dir("ckpt");
  CheckpointFolder folder(fs::path(dir.path) / "run" / "checkpoints", 3);
  CHECK(folder.list().empty());
  CHECK_FALSE(folder.load_latest().has_value());
  for (std::uint64_t step : {10, 20, 30, 40, 50}) {
    const fs::path path = folder.save(sample_checkpoint(step));
    CHECK(path == folder.folder() / ncclkit::trainer::checkpoint_file_name(step));
  }
  CHECK(names_of(folder.list()) ==
        std::vector<std::string>{"step-00000030.ckpt", "step-00000040.ckpt", "step-00000050.ckpt"});
  CHECK(entries(folder.folder().string()) == names_of(folder.list()));
  folder.save(sample_checkpoint(123456789));  // more than 8 digits: still sorted by step
  CHECK(names_of(folder.list()) ==
        std::vector<std::string>{"step-00000040.ckpt", "step-00000050.ckpt", "step-123456789.ckpt"});
  const auto latest = folder.load_latest();
  REQUIRE(latest.has_value());
  CHECK(latest->first.filename() == "step-123456789.ckpt");
  CHECK(latest->second == sample_checkpoint(123456789));

  CheckpointFolder one(fs::path(dir.path) / "one", 1);
  one.save(sample_checkpoint(1));
  one.save(sample_checkpoint(2));
  CHECK(names_of(one.list()) == std::vector<std::string>{"step-00000002.ckpt"});
  CHECK_THROWS_AS(CheckpointFolder(dir.path, 0), ConfigError);
}

TEST_CASE("saving a step replaces its file, and removes later checkpoints of a run this one left") {
  TempDir dir("ckpt");
  CheckpointFolder folder(dir.path, 5);
  for (std::uint64_t step : {10, 20, 30}) folder.save(sample_checkpoint(step));
  // As after a resume from step 10: saving step 20 again makes step 30 a dead end.
  const std::string log = stderr_of(dir.path + "/log.txt", [&] { folder.save(sample_checkpoint(20, 5)); });
  CHECK(read_checkpoint_file(fs::path(dir.path) / "step-00000020.ckpt") == sample_checkpoint(20, 5));
  CHECK(contains(log, "removing checkpoint " + (fs::path(dir.path) / "step-00000030.ckpt").string() +
                          ": its step 30 is later than the step 20 just saved"));
  CHECK(names_of(folder.list()) == std::vector<std::string>{"step-00000010.ckpt", "step-00000020.ckpt"});
}

TEST_CASE("a temp file left by a crash before the rename, and other files, are ignored") {
  TempDir dir("ckpt");
  CheckpointFolder folder(dir.path, 3);
  folder.save(sample_checkpoint(10));
  // What a writer leaves when it dies between its write and its rename: half a file under the
  // temp name (the same name pattern write_checkpoint_file uses).
  write_checkpoint_file(fs::path(dir.path) / "whole-20", sample_checkpoint(20));
  const std::vector<char> bytes = file_bytes(fs::path(dir.path) / "whole-20");
  fs::remove(fs::path(dir.path) / "whole-20");
  put_file(fs::path(dir.path) / ".step-00000020.ckpt.tmp-4242-0",
           std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(bytes.size() / 2)));
  put_file(fs::path(dir.path) / "notes.txt", {'h', 'i'});
  put_file(fs::path(dir.path) / "step-12x.ckpt", {'h', 'i'});
  put_file(fs::path(dir.path) / "step-.ckpt", {'h', 'i'});
  put_file(fs::path(dir.path) / "step-00000040.ckpt.bak", {'h', 'i'});
  fs::create_directory(fs::path(dir.path) / "step-00000050.ckpt");
  CHECK(names_of(folder.list()) == std::vector<std::string>{"step-00000010.ckpt"});
  std::optional<std::pair<fs::path, CheckpointData>> latest;
  const std::string log = stderr_of(dir.path + "/log.txt", [&] { latest = folder.load_latest(); });
  REQUIRE(latest.has_value());
  CHECK(latest->second == sample_checkpoint(10));
  CHECK(log.empty());
}

TEST_CASE("load_latest falls back past corrupted and truncated checkpoints, and the warning names each") {
  TempDir dir("ckpt");
  const fs::path folder_path = fs::path(dir.path) / "ckpts";
  CheckpointFolder folder(folder_path, 5);
  for (std::uint64_t step : {10, 20, 30}) folder.save(sample_checkpoint(step));
  const fs::path newest = folder_path / "step-00000030.ckpt";
  std::vector<char> bytes = file_bytes(newest);
  put_file(newest, with_bit_flipped(bytes, bytes.size() - 100, 3));  // inside the tensors' bytes
  std::optional<std::pair<fs::path, CheckpointData>> latest;
  std::string log = stderr_of(dir.path + "/log.txt", [&] { latest = folder.load_latest(); });
  REQUIRE(latest.has_value());
  CHECK(latest->first == folder_path / "step-00000020.ckpt");
  CHECK(latest->second == sample_checkpoint(20));
  CHECK(contains(log, "[ncclkit"));
  CHECK(contains(log, "warn]"));
  CHECK(contains(log, newest.string() + ": checksum mismatch"));
  CHECK(contains(log, "using checkpoint " + (folder_path / "step-00000020.ckpt").string()));

  const fs::path middle = folder_path / "step-00000020.ckpt";
  bytes = file_bytes(middle);
  put_file(middle, std::vector<char>(bytes.begin(), bytes.end() - 1));
  log = stderr_of(dir.path + "/log.txt", [&] { latest = folder.load_latest(); });
  REQUIRE(latest.has_value());
  CHECK(latest->second == sample_checkpoint(10));
  CHECK(contains(log, newest.string() + ": checksum mismatch"));
  CHECK(contains(log, middle.string() + ": truncated"));

  // A checkpoint under another step's name is not the checkpoint of that step.
  fs::copy_file(folder_path / "step-00000010.ckpt", folder_path / "step-00000040.ckpt");
  log = stderr_of(dir.path + "/log.txt", [&] { latest = folder.load_latest(); });
  REQUIRE(latest.has_value());
  CHECK(latest->first == folder_path / "step-00000010.ckpt");
  CHECK(contains(log, "holds step 10, not the step 40 its name says"));

  fs::remove(folder_path / "step-00000010.ckpt");
  fs::remove(folder_path / "step-00000040.ckpt");
  log = stderr_of(dir.path + "/log.txt", [&] { latest = folder.load_latest(); });
  CHECK_FALSE(latest.has_value());
  CHECK(contains(log, "none of its 2 checkpoint(s) reads back whole"));
}

TEST_CASE("problem() names a folder that cannot be made or written, and accepts one that can") {
  TempDir dir("ckpt");
  const fs::path fine = fs::path(dir.path) / "a" / "b";
  CHECK(CheckpointFolder(fine, 2).problem().empty());
  CHECK(fs::is_directory(fine));
  CHECK(entries(fine.string()).empty());  // the probe file is gone

  const fs::path file = fs::path(dir.path) / "a-file";
  put_file(file, {'x'});
  const std::string as_folder = CheckpointFolder(file, 2).problem();
  CHECK(contains(as_folder, file.string()));
  CHECK(contains(as_folder, "exists and is not a folder"));

  const fs::path under_file = file / "checkpoints";
  const std::string under = CheckpointFolder(under_file, 2).problem();
  CHECK(contains(under, under_file.string()));
  CHECK(contains(under, "cannot create it: Not a directory"));
  CheckpointFolder unusable(under_file, 2);
  CHECK_THROWS_AS(unusable.save(sample_checkpoint(1)), CheckpointError);
  CHECK(contains(CheckpointFolder("", 1).problem(), "empty path"));
}

TEST_CASE("first_difference names the first tensor missing, extra, reshaped, retyped or moved") {
  CheckpointData data;
  std::mt19937_64 random(3);
  data.tensors.push_back(tensor_of("fc1.weight", {128, 64}, DataType::kFloat32, TensorRole::kValue, random));
  data.tensors.push_back(tensor_of("fc1.bias", {128}, DataType::kFloat32, TensorRole::kValue, random));
  data.tensors.push_back(tensor_of("fc1.weight", {128, 64}, DataType::kFloat32, TensorRole::kState0, random));
  data.tensors.push_back(tensor_of("fc2.weight", {10, 128}, DataType::kFloat16, TensorRole::kValue, random));
  const std::vector<DeclaredTensor> model = {{"fc1.weight", {128, 64}, DataType::kFloat32},
                                             {"fc1.bias", {128}, DataType::kFloat32},
                                             {"fc2.weight", {10, 128}, DataType::kFloat16}};
  CHECK(first_difference(data, TensorRole::kValue, model) == "");
  CHECK(first_difference(data, TensorRole::kBuffer, {}) == "");

  auto differing = [&](auto change) {
    auto declared = model;
    change(declared);
    return first_difference(data, TensorRole::kValue, declared);
  };
  CHECK(differing([](auto& d) {
          d.push_back({"fc3.bias", {10}, DataType::kFloat32});
        }) == "tensor \"fc3.bias\" is missing from the checkpoint");
  CHECK(differing([](auto& d) { d[1].name = "fc1.b"; }) == "tensor \"fc1.b\" is missing from the checkpoint");
  CHECK(differing([](auto& d) { d.pop_back(); }) == "the checkpoint has a tensor \"fc2.weight\" the model does not");
  CHECK(differing([](auto& d) { d.erase(d.begin()); }) ==
        "the checkpoint has a tensor \"fc1.weight\" the model does not");
  CHECK(differing([](auto& d) {
          d[0].shape = {64, 128};
        }) == "tensor \"fc1.weight\": shape [128, 64] in the checkpoint, [64, 128] in the model");
  CHECK(differing([](auto& d) { d[1].shape = {}; }) ==
        "tensor \"fc1.bias\": shape [128] in the checkpoint, [] in the model");
  CHECK(differing([](auto& d) { d[2].dtype = DataType::kBFloat16; }) ==
        "tensor \"fc2.weight\": type half in the checkpoint, bfloat16 in the model");
  CHECK(differing([](auto& d) { std::swap(d[0], d[1]); }) ==
        "tensor \"fc1.bias\" is at position 1 in the checkpoint, 0 in the model");
  CHECK(differing([](auto& d) { d.push_back(d[0]); }) == "tensor \"fc1.weight\" appears twice in the model");

  const std::vector<DeclaredTensor> states = {model[0], model[2]};
  CHECK(first_difference(data, TensorRole::kState0, states) ==
        "tensor \"fc2.weight\" (optimizer state 0) is missing from the checkpoint");
  CHECK(first_difference(data, TensorRole::kState1, states) ==
        "tensor \"fc1.weight\" (optimizer state 1) is missing from the checkpoint");
  CHECK(first_difference(data, TensorRole::kState0, {}) ==
        "the checkpoint has a tensor \"fc1.weight\" (optimizer state 0) the model does not");
}
