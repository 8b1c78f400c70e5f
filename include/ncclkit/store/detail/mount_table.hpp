#pragma once
/// The mount table (/proc/self/mountinfo) as FileStore reads it: which mount holds a folder,
/// and a warning for mount options under which its guarantees do not hold across hosts (NFS
/// without network locks or without close-to-open, Lustre with local locks).

#include <filesystem>    // std::filesystem::canonical
#include <fstream>       // std::ifstream (/proc/self/mountinfo)
#include <optional>      // std::optional
#include <sstream>       // std::istringstream (mountinfo lines)
#include <string>        // std::string
#include <string_view>   // std::string_view
#include <system_error>  // std::error_code

namespace ncclkit::detail::file_store {

/// The mount that holds `path` (from /proc/self/mountinfo): file-system type and options.
struct MountInfo {
  std::string mount_point, fs_type, options;
};

inline std::string unescape_mountinfo(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 3 < text.size()) {  // octal escapes such as \040 for a space
      out.push_back(static_cast<char>((text[i + 1] - '0') * 64 + (text[i + 2] - '0') * 8 + (text[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

inline std::optional<MountInfo> find_mount(const std::string& path) {
  std::error_code ignored;
  const std::string real = std::filesystem::canonical(path, ignored).string();
  if (real.empty()) return std::nullopt;
  std::ifstream input("/proc/self/mountinfo");
  std::optional<MountInfo> best;
  std::string line;
  while (std::getline(input, line)) {
    std::istringstream fields(line);
    std::string id, parent, device, root, mount_point, mount_options, field;
    fields >> id >> parent >> device >> root >> mount_point >> mount_options;
    while (fields >> field && field != "-") {
    }
    MountInfo info;
    std::string source, super_options;
    fields >> info.fs_type >> source >> super_options;
    info.mount_point = unescape_mountinfo(mount_point);
    info.options = mount_options + "," + super_options;
    const auto& mp = info.mount_point;
    const bool contains = mp == "/" || real == mp || (real.rfind(mp, 0) == 0 && real[mp.size()] == '/');
    if (contains && (!best || mp.size() >= best->mount_point.size())) best = info;
  }
  return best;
}

inline bool has_option(const std::string& options, std::string_view option) {
  std::size_t start = 0;
  while (start <= options.size()) {
    std::size_t end = options.find(',', start);
    if (end == std::string::npos) end = options.size();
    if (std::string_view(options).substr(start, end - start) == option) return true;
    start = end + 1;
  }
  return false;
}

/// Warnings for mounts on which FileStore's guarantees do not hold across hosts.
inline std::string mount_warning(const std::string& path) {
  auto mount = find_mount(path);
  if (!mount) return {};
  const std::string where = "'" + path + "' is on " + mount->fs_type + " mount " + mount->mount_point;
  if (mount->fs_type.rfind("nfs", 0) == 0) {
    if (has_option(mount->options, "nolock") || has_option(mount->options, "local_lock=posix") ||
        has_option(mount->options, "local_lock=all")) {
      return where +
             " with local locks (nolock or local_lock=posix/all): add, compare_set and run "
             "membership are only atomic among processes of this host; remount without them "
             "(NFSv4, or NFSv3 with lockd) for several hosts";
    }
    if (has_option(mount->options, "nocto")) {
      return where + " with nocto: other hosts' keys may be seen late or stale; remount without nocto";
    }
  }
  if (mount->fs_type == "lustre" && has_option(mount->options, "localflock")) {
    return where + " with localflock: locks are local to this host; mount with -o flock for several hosts";
  }
  return {};
}

}  // namespace ncclkit::detail::file_store
