#pragma once
/// A FileStore run's record (dir/r-<id>/record, written once when the run starts): its id,
/// world size, job tag and creator, in a small text format with a magic first line, so that a
/// folder of another version or anything else in the rendezvous folder is never taken for a run.

#include <optional>     // std::optional
#include <sstream>      // std::istringstream
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "ncclkit/core/env.hpp"                // parse_int
#include "ncclkit/store/detail/key_files.hpp"  // escape_key

namespace ncclkit::detail::file_store {

inline constexpr const char* kRecordMagic = "ncclkit-filestore 1";

/// Whether a folder entry is a run's folder: "r-" and 32 hex digits. Nothing else in the
/// rendezvous folder is ever touched.
inline bool is_run_folder_name(std::string_view name) {
  return name.size() == 34 && name.substr(0, 2) == "r-" &&
         name.find_first_not_of("0123456789abcdef", 2) == std::string_view::npos;
}

/// A run's record, dir/r-<id>/record: written once when the run starts.
struct RunRecord {
  std::string id;
  int world_size = 0;
  std::string tag;
  std::string creator;
};

inline std::string format_record(const RunRecord& record) {
  return std::string(kRecordMagic) + "\nrun " + record.id + "\nworld_size " + std::to_string(record.world_size) +
         "\ntag " + escape_key(record.tag) + "\ncreator " + record.creator + "\n";
}

/// Parses a run record; nullopt when it is not one this version wrote.
inline std::optional<RunRecord> parse_record(const std::string& text) {
  std::istringstream lines(text);
  std::string line;
  if (!std::getline(lines, line) || line != kRecordMagic) return std::nullopt;
  RunRecord record;
  bool have_world = false;
  while (std::getline(lines, line)) {
    const auto space = line.find(' ');
    const std::string field = line.substr(0, space);
    const std::string value = space == std::string::npos ? "" : line.substr(space + 1);
    if (field == "run") {
      record.id = value;
    } else if (field == "world_size") {
      auto parsed = parse_int(value);
      if (!parsed || *parsed < 0 || *parsed > (1 << 30)) return std::nullopt;
      record.world_size = static_cast<int>(*parsed);
      have_world = true;
    } else if (field == "tag") {
      record.tag = value;  // kept escaped: only compared
    } else if (field == "creator") {
      record.creator = value;
    }
  }
  if (record.id.size() != 32 || record.id.find_first_not_of("0123456789abcdef") != std::string::npos || !have_world)
    return std::nullopt;
  return record;
}

}  // namespace ncclkit::detail::file_store
