#pragma once
/// Lists of ranks as messages write them: "0-2, 5, 7-8".

#include <cstddef>  // std::size_t
#include <string>   // std::string
#include <vector>   // std::vector

namespace ncclkit::detail {

/// "0-2, 5, 7-8" for a sorted list of ranks.
inline std::string format_ranks(const std::vector<int>& ranks) {
  std::string text;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!text.empty()) text += ", ";
    text += std::to_string(ranks[i]);
    if (j > i) text += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return text;
}

/// "rank 3", "ranks 0-2, 5".
inline std::string rank_or_ranks(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + format_ranks(ranks);
}

}  // namespace ncclkit::detail
