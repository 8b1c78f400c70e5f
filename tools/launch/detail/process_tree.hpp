#pragma once
/// The process tree under a process, read from /proc (Linux). The launcher is a child
/// subreaper (PR_SET_CHILD_SUBREAPER): processes its workers leave behind (a daemonised
/// helper, a data loader that outlived its parent) are re-parented to it rather than to
/// init, so walking the tree down from the launcher finds every one of them.

#include <dirent.h>     // opendir, readdir
#include <sys/types.h>  // pid_t

#include <cstdio>   // std::fopen, std::fgets
#include <cstring>  // std::strrchr
#include <map>      // std::multimap
#include <set>      // std::set
#include <string>   // std::string
#include <vector>   // std::vector

#include "ncclkit/core/env.hpp"

namespace ncclkit::launch::detail {

/// The parent of `pid` from /proc/<pid>/stat; -1 when it is gone or unreadable, and for a
/// zombie unless `include_zombies`. The command name (2nd field) can hold spaces and
/// parentheses, so fields are counted after the last ')'.
inline pid_t parent_of(pid_t pid, bool include_zombies = false) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  std::FILE* file = std::fopen(path.c_str(), "re");
  if (file == nullptr) return -1;
  char buffer[1024];
  const std::size_t n = std::fread(buffer, 1, sizeof buffer - 1, file);
  std::fclose(file);
  buffer[n] = '\0';
  const char* close = std::strrchr(buffer, ')');
  if (close == nullptr) return -1;
  char state = 0;
  int parent = -1;
  if (std::sscanf(close + 1, " %c %d", &state, &parent) != 2) return -1;
  if (!include_zombies && (state == 'Z' || state == 'X')) return -1;  // dead: it only needs reaping
  return parent;
}

/// Every living process below `root` (children, grandchildren, ...), except the subtrees of
/// the processes in `excluded` (e.g. children the caller had before it started workers).
/// A snapshot: processes may come and go while it is taken.
inline std::vector<pid_t> descendants_of(pid_t root, const std::set<pid_t>& excluded = {}) {
  std::multimap<pid_t, pid_t> children;
  if (DIR* proc = ::opendir("/proc")) {
    while (const dirent* entry = ::readdir(proc)) {
      auto pid = parse_int(entry->d_name);
      if (!pid || *pid <= 0) continue;
      const pid_t parent = parent_of(static_cast<pid_t>(*pid));
      if (parent > 0) children.emplace(parent, static_cast<pid_t>(*pid));
    }
    ::closedir(proc);
  }
  std::vector<pid_t> found;
  std::vector<pid_t> frontier{root};
  std::set<pid_t> seen{root};
  while (!frontier.empty()) {
    const pid_t parent = frontier.back();
    frontier.pop_back();
    auto [begin, end] = children.equal_range(parent);
    for (auto it = begin; it != end; ++it) {
      const pid_t child = it->second;
      if (excluded.count(child) != 0 || !seen.insert(child).second) continue;
      found.push_back(child);
      frontier.push_back(child);
    }
  }
  return found;
}

/// The direct children of `parent`: alive ones, and zombies too when `include_zombies`.
inline std::set<pid_t> children_of(pid_t parent, bool include_zombies = false) {
  std::set<pid_t> result;
  if (DIR* proc = ::opendir("/proc")) {
    while (const dirent* entry = ::readdir(proc)) {
      auto pid = parse_int(entry->d_name);
      if (pid && *pid > 0 && parent_of(static_cast<pid_t>(*pid), include_zombies) == parent)
        result.insert(static_cast<pid_t>(*pid));
    }
    ::closedir(proc);
  }
  return result;
}

}  // namespace ncclkit::launch::detail
