#pragma once
/// Checkpoints: where a run stood (optimizer step, sampler position, seed, world) and its
/// tensors (parameter values, optimizer state, buffers), one file per checkpoint, written so
/// that a crash at any moment leaves either the previous file or the new one whole, never a mix.
///
/// `write_checkpoint_file` writes a temp file in the destination's folder, fsyncs it, renames it
/// over the destination and fsyncs the folder (the rename is atomic; the fsyncs make file and name
/// survive a power loss). `read_checkpoint_file` refuses, with a `CheckpointError` naming the file
/// and what is wrong, anything but a whole checkpoint of this format. `CheckpointFolder` keeps the
/// last k checkpoints of a run as `step-00000120.ckpt` and finds the newest that reads back whole.
/// `first_difference` compares a checkpoint's tensors with what a model declares.
///
/// File format, version 1. Integers are little-endian and fixed-width; a *text* is a u32 byte
/// count and the bytes (UTF-8, no terminator).
///
///     prefix (28 bytes)
///       magic          8 bytes  "NCCLKCPT"
///       version        u32      1
///       table_bytes    u64      size of the table that follows
///       file_bytes     u64      size of the whole file, checksum included
///     table (table_bytes)
///       step, epoch, consumed, seed, global_batch    u64 each
///       world_size     u32
///       optimizer      text
///       tensor_count   u32
///       tensor_count entries:
///         name         text
///         dtype        u8       1 int8, 2 uint8, 3 int32, 4 uint32, 5 int64, 6 uint64,
///                               7 float16, 8 bfloat16, 9 float32, 10 float64
///         role         u8       0 values, 1 optimizer state 0, 2 optimizer state 1, 3 buffer
///         rank         u32      number of dimensions
///         dims         i64 each (two's complement), none negative
///         data_bytes   u64      product of dims × element size
///     data: each tensor's bytes in table order, back to back
///     checksum         u64      FNV-1a 64 over every byte before it
///
/// A reader checks the magic, the version, file_bytes against the file's size (a short file is
/// reported as truncated) and the checksum, and every count and size of the table against the
/// bytes that remain before it allocates anything: a corrupted or hostile file is an error, never
/// a crash or an absurd allocation. Host code only (std::filesystem and POSIX calls).

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <fcntl.h>     // O_* flags, AT_FDCWD
#include <sys/stat.h>  // fstat
#include <unistd.h>    // fsync, unlink

#include <algorithm>         // std::sort, std::min, std::max, std::equal
#include <cerrno>            // errno, ENOSPC, EINVAL
#include <cstddef>           // std::byte, std::size_t
#include <cstdint>           // fixed-width integers
#include <cstdio>            // std::rename, std::snprintf
#include <filesystem>        // std::filesystem
#include <initializer_list>  // std::initializer_list (a loop over the scalars)
#include <limits>            // std::numeric_limits
#include <optional>          // std::optional
#include <span>              // std::span
#include <string>            // std::string, std::to_string
#include <string_view>       // std::string_view
#include <system_error>      // std::error_code, std::errc
#include <utility>           // std::pair, std::move
#include <vector>            // std::vector

#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/fusion/detail/byte_codec.hpp"          // ByteWriter, ByteReader, fnv1a64
#include "ncclkit/store/detail/file_io.hpp"              // Fd, open_at, write_all, describe_errno
#include "ncclkit/trainer/detail/checkpoint_format.hpp"  // sizes, type codes, file names

namespace ncclkit::trainer {

/// A checkpoint that cannot be read (missing, not a checkpoint, another format version,
/// truncated, corrupted) or written. The message names the file and what is wrong.
class CheckpointError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

/// What a saved tensor is to the trainer.
enum class TensorRole : std::uint8_t {
  kValue,   ///< a parameter's values
  kState0,  ///< the optimizer's first state of a parameter (momentum; Adam's first moment)
  kState1,  ///< the optimizer's second state of a parameter (Adam's second moment)
  kBuffer,  ///< non-trained state of the model (running statistics)
};

/// "parameter values", "optimizer state 0", "optimizer state 1", "buffer".
constexpr std::string_view name_of(TensorRole role) {
  switch (role) {
    case TensorRole::kValue:
      return "parameter values";
    case TensorRole::kState0:
      return "optimizer state 0";
    case TensorRole::kState1:
      return "optimizer state 1";
    case TensorRole::kBuffer:
      return "buffer";
  }
  return "unknown role";
}

/// One tensor of a checkpoint: its name, shape, element type, role and bytes (as they lie in
/// memory, row-major; the product of `shape` × the element size of them).
struct SavedTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  DataType dtype = DataType::kFloat32;
  TensorRole role = TensorRole::kValue;
  std::vector<std::byte> bytes;
  friend bool operator==(const SavedTensor& a, const SavedTensor& b) {
    return a.name == b.name && a.shape == b.shape && a.dtype == b.dtype && a.role == b.role && a.bytes == b.bytes;
  }
};

/// What a checkpoint holds: where training stood, and the tensors.
struct CheckpointData {
  /// Optimizer steps done; the learning-rate schedule's position too.
  std::uint64_t step = 0;
  /// The sampler's position (`SamplerPosition`): the epoch, and samples of its stream consumed.
  std::uint64_t epoch = 0;
  std::uint64_t consumed = 0;
  /// The run's seed: data order and per-step randomness derive from it and the step.
  std::uint64_t seed = 0;
  std::uint64_t global_batch = 0;
  /// The world it was written at (a resume at another size re-shards the data).
  std::uint32_t world_size = 0;
  /// A short description of the optimizer and its settings, as the trainer writes it.
  std::string optimizer;
  std::vector<SavedTensor> tensors;
  friend bool operator==(const CheckpointData& a, const CheckpointData& b) {
    return a.step == b.step && a.epoch == b.epoch && a.consumed == b.consumed && a.seed == b.seed &&
           a.global_batch == b.global_batch && a.world_size == b.world_size && a.optimizer == b.optimizer &&
           a.tensors == b.tensors;
  }
};

/// The tensors of `role`, in the checkpoint's order.
inline std::vector<const SavedTensor*> tensors_of(const CheckpointData& data, TensorRole role) {
  std::vector<const SavedTensor*> found;
  for (const auto& tensor : data.tensors) {
    if (tensor.role == role) found.push_back(&tensor);
  }
  return found;
}

namespace detail {

/// The table of `data`, as the format above lays it out; CheckpointError for a tensor whose
/// bytes do not match its shape and type.
inline std::vector<std::byte> encode_checkpoint_table(const CheckpointData& data, const std::string& who) {
  ncclkit::detail::ByteWriter out;
  for (std::uint64_t value : {data.step, data.epoch, data.consumed, data.seed, data.global_batch}) out.u64(value);
  out.u32(data.world_size);
  out.text(data.optimizer);
  if (data.tensors.size() > std::numeric_limits<std::uint32_t>::max()) {
    throw CheckpointError(who + std::to_string(data.tensors.size()) + " tensors, more than the format holds");
  }
  out.u32(static_cast<std::uint32_t>(data.tensors.size()));
  for (const auto& tensor : data.tensors) {
    const std::string name = "tensor \"" + tensor.name + "\"";
    const std::uint8_t code = dtype_code(tensor.dtype);
    if (code == 0) throw CheckpointError(who + name + " has an unknown element type");
    if (tensor.role > TensorRole::kBuffer) throw CheckpointError(who + name + " has an unknown role");
    const auto bytes = tensor_bytes(tensor.shape, tensor.dtype);
    if (!bytes || *bytes != tensor.bytes.size()) {
      throw CheckpointError(who + name + " holds " + std::to_string(tensor.bytes.size()) + " bytes, but shape " +
                            shape_text(tensor.shape) + " of " + std::string(name_of(tensor.dtype)) + " needs " +
                            (bytes ? std::to_string(*bytes) : std::string("an impossible size")));
    }
    out.text(tensor.name);
    out.u8(code);
    out.u8(static_cast<std::uint8_t>(tensor.role));
    out.u32(static_cast<std::uint32_t>(tensor.shape.size()));
    for (std::int64_t dim : tensor.shape) out.u64(static_cast<std::uint64_t>(dim));
    out.u64(*bytes);
  }
  return std::move(out).take();
}

/// The scalars and the tensor table, tensors without their bytes (each sized, not filled).
/// Every count and size is checked against what remains of the table, and the data sizes
/// against `data_bytes`, before anything is allocated.
inline CheckpointData decode_checkpoint_table(std::span<const std::byte> table, std::uint64_t data_bytes,
                                              const std::string& who) {
  ncclkit::detail::ByteReader in(table, who + "corrupted table");
  CheckpointData data;
  data.step = in.u64("step");
  data.epoch = in.u64("epoch");
  data.consumed = in.u64("consumed");
  data.seed = in.u64("seed");
  data.global_batch = in.u64("global_batch");
  data.world_size = in.u32("world_size");
  data.optimizer = in.text("optimizer");
  const std::uint32_t count = in.u32("tensor_count");
  if (count > in.remaining() / kCheckpointMinEntryBytes) {
    throw in.error("tensor_count", std::to_string(count) + " tensors cannot fit in the " +
                                       std::to_string(in.remaining()) + " bytes left of the table");
  }
  data.tensors.resize(count);
  std::uint64_t data_left = data_bytes;
  for (auto& tensor : data.tensors) {
    tensor.name = in.text("tensor name");
    const std::string name = "tensor \"" + tensor.name + "\"";
    const auto dtype = dtype_of_code(in.u8("dtype"));
    if (!dtype) throw in.error("dtype", name + " has an unknown element type code");
    tensor.dtype = *dtype;
    const std::uint8_t role = in.u8("role");
    if (role > static_cast<std::uint8_t>(TensorRole::kBuffer)) throw in.error("role", name + " has an unknown role");
    tensor.role = static_cast<TensorRole>(role);
    const std::uint32_t rank = in.u32("rank");
    if (rank > in.remaining() / 8) throw in.error("rank", name + " has more dimensions than the table holds");
    tensor.shape.resize(rank);
    for (auto& dim : tensor.shape) dim = static_cast<std::int64_t>(in.u64("dimension"));
    const std::uint64_t stored = in.u64("data_bytes");
    const auto expected = tensor_bytes(tensor.shape, tensor.dtype);
    if (!expected || *expected != stored) {
      throw in.error("data_bytes", name + " of shape " + shape_text(tensor.shape) + " has " + std::to_string(stored) +
                                       " bytes, which its shape and type do not give");
    }
    if (stored > data_left) {
      throw in.error("data_bytes", name + " needs " + std::to_string(stored) + " bytes, " + std::to_string(data_left) +
                                       " are left in the file");
    }
    data_left -= stored;
    tensor.bytes.resize(static_cast<std::size_t>(stored));
  }
  if (in.remaining() != 0) throw in.error("end", std::to_string(in.remaining()) + " bytes past the last tensor");
  if (data_left != 0) {
    throw CheckpointError(who + "corrupted table: its tensors leave " + std::to_string(data_left) +
                          " bytes of the data unused");
  }
  return data;
}

}  // namespace detail

/// Writes `data` to `path`, atomically: a temp file in the same folder (a hidden name that
/// `CheckpointFolder` ignores), written, fsynced, renamed over `path`, then the folder fsynced.
/// A reader sees the previous file or the new one, whole; a crash leaves at most a temp file.
/// CheckpointError naming the file and the OS error when it cannot be written (the temp file is
/// removed), or naming the tensor whose bytes do not match its shape and type.
inline void write_checkpoint_file(const std::filesystem::path& path, const CheckpointData& data) {
  namespace io = ncclkit::detail::file_store;
  const std::string who = "ncclkit: checkpoint " + path.string() + ": ";
  const std::vector<std::byte> table = detail::encode_checkpoint_table(data, who);
  std::uint64_t file_bytes = detail::kCheckpointPrefixBytes + table.size() + detail::kCheckpointChecksumBytes;
  for (const auto& tensor : data.tensors) file_bytes += tensor.bytes.size();

  ncclkit::detail::ByteWriter prefix_writer;
  for (char c : detail::kCheckpointMagic) prefix_writer.u8(static_cast<std::uint8_t>(c));
  prefix_writer.u32(detail::kCheckpointVersion);
  prefix_writer.u64(table.size());
  prefix_writer.u64(file_bytes);
  const std::vector<std::byte> prefix = std::move(prefix_writer).take();

  const std::filesystem::path folder = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  const std::filesystem::path temp = folder / ("." + path.filename().string() + ".tmp-" + detail::unique_suffix());
  io::Fd fd(io::open_at(AT_FDCWD, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644));
  if (!fd) {
    throw CheckpointError(who + "cannot create a temp file in " + folder.string() + ": " + io::describe_errno(errno) +
                          "; give a checkpoint folder this process can write");
  }
  std::uint64_t checksum = ncclkit::detail::kFnvOffsetBasis;
  int err = 0;
  auto put = [&](std::span<const std::byte> bytes) {
    if (err != 0) return;
    checksum = ncclkit::detail::fnv1a64(bytes, checksum);
    err = io::write_all(fd.get(), reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  };
  put(prefix);
  put(table);
  for (const auto& tensor : data.tensors) put(tensor.bytes);
  ncclkit::detail::ByteWriter tail;
  tail.u64(checksum);
  put(std::move(tail).take());
  if (err == 0 && ::fsync(fd.get()) != 0) err = errno;
  // close() is where NFS sends the data to the server (close-to-open), so its error counts.
  if (err == 0 && ::close(fd.release()) != 0 && errno != EINTR) err = errno;
  if (err == 0 && std::rename(temp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(temp.c_str());
    throw CheckpointError(who + "cannot write " + std::to_string(file_bytes) + " bytes: " + io::describe_errno(err) +
                          (err == ENOSPC ? " (the file system is full)" : ""));
  }
  // Without this fsync the rename may not survive a power loss. The file is whole either way,
  // so a failure here is a warning, not a reason to stop training.
  io::Fd dir(io::open_at(AT_FDCWD, folder.c_str(), O_RDONLY | O_DIRECTORY));
  const int flush_error = !dir ? errno : ::fsync(dir.get()) != 0 ? errno : 0;
  if (flush_error != 0 && flush_error != EINVAL) {  // EINVAL: a file system that cannot sync folders
    log_warn(who + "written, but its folder cannot be flushed (" + io::describe_errno(flush_error) +
             "): the checkpoint may not survive a power loss");
  }
}

/// Reads a checkpoint that `write_checkpoint_file` wrote. CheckpointError naming the file and
/// what is wrong: it cannot be opened or read, is not a checkpoint (magic), has another format
/// version, is truncated (shorter than its header says), or is corrupted (checksum mismatch,
/// a table that contradicts itself).
inline CheckpointData read_checkpoint_file(const std::filesystem::path& path) {
  namespace io = ncclkit::detail::file_store;
  const std::string who = "ncclkit: checkpoint " + path.string() + ": ";
  io::Fd fd(io::open_at(AT_FDCWD, path.c_str(), O_RDONLY));
  if (!fd) throw CheckpointError(who + "cannot open it: " + io::describe_errno(errno));
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) throw CheckpointError(who + "cannot stat it: " + io::describe_errno(errno));
  const auto size = static_cast<std::uint64_t>(info.st_size);
  auto read_at = [&](std::byte* out, std::size_t bytes, std::uint64_t offset) {
    const int err = detail::read_exact_at(fd.get(), out, bytes, offset);
    if (err == -1) throw CheckpointError(who + "the file shrank while it was read; another process writes it");
    if (err != 0) throw CheckpointError(who + "cannot read it: " + io::describe_errno(err));
  };

  std::byte prefix[detail::kCheckpointPrefixBytes];
  const auto prefix_size = static_cast<std::size_t>(std::min<std::uint64_t>(size, sizeof prefix));
  read_at(prefix, prefix_size, 0);
  const auto magic = reinterpret_cast<const std::byte*>(detail::kCheckpointMagic);
  if (!std::equal(prefix, prefix + std::min<std::size_t>(prefix_size, 8), magic)) {
    throw CheckpointError(who + "not an ncclkit checkpoint (it does not start with \"NCCLKCPT\")");
  }
  const std::uint64_t least = detail::kCheckpointPrefixBytes + detail::kCheckpointChecksumBytes;
  if (size < least) {
    throw CheckpointError(who + "truncated: " + std::to_string(size) + " bytes, fewer than the " +
                          std::to_string(least) + " of the smallest checkpoint");
  }
  ncclkit::detail::ByteReader fields(std::span<const std::byte>(prefix + 8, sizeof prefix - 8), who);
  const std::uint32_t version = fields.u32("version");
  if (version != detail::kCheckpointVersion) {
    throw CheckpointError(who + "format version " + std::to_string(version) + "; this build of ncclkit reads version " +
                          std::to_string(detail::kCheckpointVersion) + " only");
  }
  const std::uint64_t table_bytes = fields.u64("table_bytes");
  const std::uint64_t file_bytes = fields.u64("file_bytes");
  if (size < file_bytes) {
    throw CheckpointError(who + "truncated: " + std::to_string(size) + " bytes of the " + std::to_string(file_bytes) +
                          " its header gives (a write that did not finish, or a file cut short)");
  }
  if (size > file_bytes) {
    throw CheckpointError(who + "corrupted: " + std::to_string(size) + " bytes, more than the " +
                          std::to_string(file_bytes) + " its header gives");
  }
  const std::uint64_t checksum_at = size - detail::kCheckpointChecksumBytes;
  if (table_bytes > checksum_at - detail::kCheckpointPrefixBytes) {
    throw CheckpointError(who + "corrupted: its header gives a table of " + std::to_string(table_bytes) +
                          " bytes, more than the file holds");
  }

  // The table is at most the file's size (checked above), so this allocation is bounded.
  std::uint64_t checksum = ncclkit::detail::fnv1a64(std::span<const std::byte>(prefix));
  std::vector<std::byte> table(static_cast<std::size_t>(table_bytes));
  read_at(table.data(), table.size(), detail::kCheckpointPrefixBytes);
  checksum = ncclkit::detail::fnv1a64(table, checksum);
  const std::uint64_t data_at = detail::kCheckpointPrefixBytes + table_bytes;

  std::byte stored_bytes[8];
  read_at(stored_bytes, sizeof stored_bytes, checksum_at);
  const std::uint64_t stored = detail::load_u64(stored_bytes);
  auto mismatch = [&](std::uint64_t computed) {
    return CheckpointError(who + "checksum mismatch (stored " + detail::hex64(stored) + ", computed " +
                           detail::hex64(computed) + "): the file is corrupted");
  };

  std::optional<CheckpointData> data;
  std::string table_problem;
  try {
    data = detail::decode_checkpoint_table(table, checksum_at - data_at, who);
  } catch (const ConfigError& e) {
    table_problem = e.what();
  }
  if (!data) {
    // A table that does not parse: say "checksum mismatch" if the checksum says so, and name
    // the table's flaw only for a file whose checksum holds (a writer's bug, not corruption).
    std::vector<std::byte> chunk(1 << 20);
    for (std::uint64_t at = data_at; at < checksum_at;) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), checksum_at - at));
      read_at(chunk.data(), n, at);
      checksum = ncclkit::detail::fnv1a64(std::span<const std::byte>(chunk.data(), n), checksum);
      at += n;
    }
    if (checksum != stored) throw mismatch(checksum);
    throw CheckpointError(table_problem);
  }
  std::uint64_t at = data_at;
  for (auto& tensor : data->tensors) {
    read_at(tensor.bytes.data(), tensor.bytes.size(), at);
    checksum = ncclkit::detail::fnv1a64(tensor.bytes, checksum);
    at += tensor.bytes.size();
  }
  if (checksum != stored) throw mismatch(checksum);
  return std::move(*data);
}

/// "step-00000120.ckpt": the step, zero-padded to 8 digits (more where the step needs them), so
/// that names sort as steps do.
inline std::string checkpoint_file_name(std::uint64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "step-%08llu.ckpt", static_cast<unsigned long long>(step));
  return name;
}

/// The checkpoints of one run in one folder: `save` writes `step-<step>.ckpt` and keeps the
/// newest `keep_last`; `load_latest` finds the newest that reads back whole. One writer (rank 0);
/// not thread-safe.
class CheckpointFolder {
 public:
  /// ConfigError when `keep_last` is 0. Touches nothing on disk: `problem()` checks the folder.
  CheckpointFolder(std::filesystem::path folder, std::size_t keep_last)
      : folder_(std::move(folder)), keep_last_(keep_last) {
    if (keep_last_ == 0) {
      throw ConfigError("ncclkit: CheckpointFolder " + folder_.string() +
                        ": keep_last is 0; keep at least the last checkpoint (1)");
    }
  }

  const std::filesystem::path& folder() const { return folder_; }
  std::size_t keep_last() const { return keep_last_; }

  /// Why checkpoints cannot be written here, naming the path and the OS error; empty when they
  /// can. Creates the folder (and its parents) when missing, and probes it by creating and
  /// removing a file, so that a trainer can refuse an unwritable folder before its first step.
  [[nodiscard]] std::string problem() const {
    namespace io = ncclkit::detail::file_store;
    const std::string who = "ncclkit: checkpoint folder " + folder_.string() + ": ";
    if (folder_.empty()) return "ncclkit: the checkpoint folder is an empty path; give a folder";
    std::error_code error;
    const auto status = std::filesystem::status(folder_, error);
    if (std::filesystem::exists(status) && !std::filesystem::is_directory(status)) {
      return who + "it exists and is not a folder; give another path";
    }
    std::filesystem::create_directories(folder_, error);
    if (error) return who + "cannot create it: " + io::describe_errno(error.value()) + "; give another path";
    const std::filesystem::path probe = folder_ / (".probe-" + detail::unique_suffix());
    io::Fd fd(io::open_at(AT_FDCWD, probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600));
    if (!fd) {
      return who + "cannot create a file in it: " + io::describe_errno(errno) +
             "; give a folder this process can write";
    }
    fd.reset();
    ::unlink(probe.c_str());
    return {};
  }

  /// Writes `data` as `step-<data.step>.ckpt` (creating the folder when missing; replacing a
  /// file of the same step), then removes the oldest beyond `keep_last`, and every checkpoint of
  /// a later step than this one: those belong to a trajectory this run left (it resumed from an
  /// earlier checkpoint, or started afresh in a used folder), and `load_latest` would otherwise
  /// pick them up. Removals are logged; a removal that fails is a warning. Returns the path.
  /// CheckpointError when the file cannot be written.
  std::filesystem::path save(const CheckpointData& data) {
    std::error_code error;
    std::filesystem::create_directories(folder_, error);
    const std::filesystem::path path = folder_ / checkpoint_file_name(data.step);
    write_checkpoint_file(path, data);
    std::vector<std::filesystem::path> older;
    for (const auto& file : list()) {
      const std::uint64_t step = *detail::step_of_checkpoint_name(file.filename().string());
      if (file.filename() == path.filename()) continue;
      if (step > data.step) {
        log_warn("ncclkit: removing checkpoint " + file.string() + ": its step " + std::to_string(step) +
                 " is later than the step " + std::to_string(data.step) +
                 " just saved, from a run this one does not continue");
        remove(file);
      } else {
        older.push_back(file);
      }
    }
    for (std::size_t i = 0; i + keep_last_ < older.size() + 1; ++i) {
      log_info("ncclkit: removing checkpoint " + older[i].string() + " (keeping the last " +
               std::to_string(keep_last_) + ")");
      remove(older[i]);
    }
    return path;
  }

  /// The checkpoint files, oldest first (by the step in their names). Other files, temp files
  /// included, are not listed. Empty when the folder does not exist; CheckpointError when it
  /// cannot be read.
  std::vector<std::filesystem::path> list() const {
    std::vector<std::pair<std::uint64_t, std::filesystem::path>> found;
    std::error_code error;
    std::filesystem::directory_iterator entries(folder_, error);
    if (error == std::errc::no_such_file_or_directory) return {};
    for (; !error && entries != std::filesystem::directory_iterator(); entries.increment(error)) {
      const auto step = detail::step_of_checkpoint_name(entries->path().filename().string());
      std::error_code type_error;
      if (step && entries->is_regular_file(type_error)) found.emplace_back(*step, entries->path());
    }
    if (error) {
      throw CheckpointError("ncclkit: checkpoint folder " + folder_.string() +
                            ": cannot list it: " + ncclkit::detail::file_store::describe_errno(error.value()));
    }
    std::sort(found.begin(), found.end());
    std::vector<std::filesystem::path> paths;
    for (auto& [step, path] : found) paths.push_back(std::move(path));
    return paths;
  }

  /// The newest checkpoint that reads back whole, and its path. A newer one that does not (cut
  /// short, corrupted, its step not the one its name says) is skipped with a warning naming the
  /// file and why, and the one before it is tried. nullopt when there is none, or none whole (a
  /// warning says so when files were skipped). CheckpointError when the folder cannot be listed.
  std::optional<std::pair<std::filesystem::path, CheckpointData>> load_latest() const {
    const auto files = list();
    std::size_t skipped = 0;
    for (auto file = files.rbegin(); file != files.rend(); ++file) {
      try {
        CheckpointData data = read_checkpoint_file(*file);
        const std::uint64_t named = *detail::step_of_checkpoint_name(file->filename().string());
        if (data.step != named) {
          throw CheckpointError("ncclkit: checkpoint " + file->string() + ": holds step " + std::to_string(data.step) +
                                ", not the step " + std::to_string(named) + " its name says");
        }
        if (skipped > 0) {
          log_warn("ncclkit: using checkpoint " + file->string() + " (step " + std::to_string(data.step) +
                   ") instead: the " + std::to_string(skipped) + " newer one(s) could not be read");
        }
        return std::pair{*file, std::move(data)};
      } catch (const CheckpointError& e) {
        ++skipped;
        log_warn(std::string(e.what()) + "; skipping it and trying the checkpoint before it");
      }
    }
    if (skipped > 0) {
      log_warn("ncclkit: checkpoint folder " + folder_.string() + ": none of its " + std::to_string(skipped) +
               " checkpoint(s) reads back whole");
    }
    return std::nullopt;
  }

 private:
  static void remove(const std::filesystem::path& file) {
    std::error_code error;
    if (!std::filesystem::remove(file, error) && error) {
      log_warn("ncclkit: cannot remove checkpoint " + file.string() + ": " +
               ncclkit::detail::file_store::describe_errno(error.value()));
    }
  }

  std::filesystem::path folder_;
  std::size_t keep_last_;
};

/// A tensor as a model declares it: name, shape, element type.
struct DeclaredTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  DataType dtype = DataType::kFloat32;
};

/// The first difference between the checkpoint's tensors of `role` and `declared` (what the
/// model declares, in its order): "" when names, shapes, types and order all match. Otherwise
/// one line, such as `tensor "fc1.weight": shape [128, 64] in the checkpoint, [64, 128] in the
/// model`, `tensor "fc3.bias" is missing from the checkpoint`, `the checkpoint has a tensor
/// "extra" the model does not`, `tensor "fc2.weight": type half in the checkpoint, float in the
/// model`, or `tensor "b" is at position 1 in the checkpoint, 0 in the model`. Roles other than
/// kValue are named after the tensor: `tensor "fc1.weight" (optimizer state 0) is missing ...`.
inline std::string first_difference(const CheckpointData& data, TensorRole role,
                                    std::span<const DeclaredTensor> declared) {
  const std::vector<const SavedTensor*> saved = tensors_of(data, role);
  const std::string of_role = role == TensorRole::kValue ? "" : " (" + std::string(name_of(role)) + ")";
  auto tensor = [&](const std::string& name) { return "tensor \"" + name + "\"" + of_role; };
  auto saved_index = [&](const std::string& name) -> std::optional<std::size_t> {
    for (std::size_t i = 0; i < saved.size(); ++i) {
      if (saved[i]->name == name) return i;
    }
    return std::nullopt;
  };
  auto declared_index = [&](const std::string& name) -> std::optional<std::size_t> {
    for (std::size_t i = 0; i < declared.size(); ++i) {
      if (declared[i].name == name) return i;
    }
    return std::nullopt;
  };
  // Position by position; at the first mismatch, a name the other side lacks is reported
  // before an order difference (a renamed tensor reads as missing, not as moved).
  for (std::size_t i = 0; i < std::max(saved.size(), declared.size()); ++i) {
    if (i < declared.size() && (i >= saved.size() || saved[i]->name != declared[i].name) &&
        !saved_index(declared[i].name)) {
      return tensor(declared[i].name) + " is missing from the checkpoint";
    }
    if (i < saved.size() && (i >= declared.size() || saved[i]->name != declared[i].name) &&
        !declared_index(saved[i]->name)) {
      return "the checkpoint has a tensor \"" + saved[i]->name + "\"" + of_role + " the model does not";
    }
    if (i >= saved.size() || i >= declared.size()) {
      // Both names exist on both sides, so one side names a tensor twice.
      const std::string& name = i < saved.size() ? saved[i]->name : declared[i].name;
      return tensor(name) + " appears " + (i < saved.size() ? "twice in the checkpoint" : "twice in the model");
    }
    const SavedTensor& have = *saved[i];
    const DeclaredTensor& want = declared[i];
    if (have.name != want.name) {
      return tensor(want.name) + " is at position " + std::to_string(*saved_index(want.name)) + " in the checkpoint, " +
             std::to_string(i) + " in the model";
    }
    if (have.shape != want.shape) {
      return tensor(want.name) + ": shape " + detail::shape_text(have.shape) + " in the checkpoint, " +
             detail::shape_text(want.shape) + " in the model";
    }
    if (have.dtype != want.dtype) {
      return tensor(want.name) + ": type " + std::string(name_of(have.dtype)) + " in the checkpoint, " +
             std::string(name_of(want.dtype)) + " in the model";
    }
  }
  return {};
}

}  // namespace ncclkit::trainer
