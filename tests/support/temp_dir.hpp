#pragma once
// A fresh folder under /tmp for one test, removed at the end, and folder listings.
#include <doctest/doctest.h>

#include <stdlib.h>  // mkdtemp

#include <algorithm>   // std::sort
#include <filesystem>  // std::filesystem
#include <string>      // std::string
#include <vector>      // std::vector

namespace ncclkit_test {

/// mkdtemp("/tmp/ncclkit-<tag>-XXXXXX"), removed with everything in it on destruction.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& tag = "test") {
    std::string pattern = "/tmp/ncclkit-" + tag + "-XXXXXX";
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

/// Names in a folder, sorted.
inline std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace ncclkit_test
