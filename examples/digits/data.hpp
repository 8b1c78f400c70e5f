#pragma once
// The 8x8 digits set (examples/data/digits.csv, see its README): read, split by seed into a
// training and a test set stratified by label, pixels scaled to [0, 1].
#include <array>      // std::array
#include <cstddef>    // std::size_t
#include <cstdint>    // std::uint64_t
#include <fstream>    // std::ifstream
#include <sstream>    // std::istringstream
#include <string>     // std::string, std::getline
#include <vector>     // std::vector

#include <ncclkit/core/error.hpp>
#include <ncclkit/trainer/sampler.hpp>  // epoch_permutation: the same split on every platform

namespace digits {

inline constexpr std::size_t kPixels = 64;
inline constexpr std::size_t kClasses = 10;

/// Samples in host memory: `features` row by row (kPixels each, in [0, 1]), `labels` 0..9.
struct Samples {
  std::vector<float> features;
  std::vector<int> labels;
  std::size_t size() const { return labels.size(); }
};

/// `path` where it exists, else examples/data/digits.csv under the working folder (a build run
/// on another machine, from the repository's root, as the GPU runs are).
inline std::string locate(const std::string& path) {
  if (std::ifstream(path).good()) return path;
  const std::string relative = "examples/data/digits.csv";
  return std::ifstream(relative).good() ? relative : path;
}

inline Samples read_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ncclkit::ConfigError("digits: cannot read " + path + "; give the data with --data PATH");
  Samples all;
  std::string line;
  std::size_t row = 0;
  while (std::getline(in, line)) {
    ++row;
    if (line.empty()) continue;
    std::istringstream fields(line);
    std::string field;
    std::vector<int> values;
    while (std::getline(fields, field, ',')) values.push_back(std::stoi(field));
    if (values.size() != kPixels + 1 || values.back() < 0 || values.back() >= static_cast<int>(kClasses)) {
      throw ncclkit::ConfigError("digits: " + path + " line " + std::to_string(row) + " is not 64 pixels and a label");
    }
    for (std::size_t i = 0; i < kPixels; ++i) all.features.push_back(static_cast<float>(values[i]) / 16.0f);
    all.labels.push_back(values.back());
  }
  return all;
}

/// A split of `all` by `seed`: of each label's samples, `test_share` (rounded) go to the test set.
inline std::array<Samples, 2> split(const Samples& all, double test_share, std::uint64_t seed) {
  std::array<std::vector<std::size_t>, kClasses> by_label;
  for (std::size_t i = 0; i < all.size(); ++i) by_label[static_cast<std::size_t>(all.labels[i])].push_back(i);
  std::array<Samples, 2> parts;  // training, test
  for (std::size_t label = 0; label < kClasses; ++label) {
    const std::vector<std::size_t> order = ncclkit::trainer::epoch_permutation(by_label[label].size(), seed, label);
    std::vector<std::size_t> indices;
    for (std::size_t k : order) indices.push_back(by_label[label][k]);
    const auto test = static_cast<std::size_t>(static_cast<double>(indices.size()) * test_share + 0.5);
    for (std::size_t k = 0; k < indices.size(); ++k) {
      Samples& to = parts[k < test ? 1 : 0];
      const std::size_t i = indices[k];
      to.features.insert(to.features.end(), all.features.begin() + static_cast<long>(i * kPixels),
                         all.features.begin() + static_cast<long>((i + 1) * kPixels));
      to.labels.push_back(all.labels[i]);
    }
  }
  return parts;
}

}  // namespace digits
