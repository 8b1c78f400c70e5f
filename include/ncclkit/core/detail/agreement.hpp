#pragma once
/// "Every rank must agree on these words": one all_gather of a few words per rank, taken part
/// in also by a rank whose own arguments were rejected, so that a bad argument on one rank is a
/// ConfigError on every rank at once, naming that rank and why, and never a wait for the
/// timeout on the others. Setup code of the fusion layer and the trainer (plan and options of a
/// GradientSync, tuning candidates, a trainer's options) builds on it; the backends' own checks
/// of a collective's arguments use the same shape (core/collective_check.hpp).

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <algorithm>    // std::min
#include <cstddef>      // std::size_t
#include <cstdint>      // std::uint64_t
#include <cstring>      // std::memcpy
#include <span>         // std::span
#include <string>       // std::string, std::to_string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/detail/backend_memory.hpp"

namespace ncclkit::detail {

/// The longest rejection reason that travels to the other ranks (longer ones are cut, "...").
inline constexpr std::size_t kAgreementReasonBytes = 184;

/// What every rank sent: its words, by rank.
struct GatheredWords {
  std::vector<std::uint64_t> words;  ///< rank r's at [r * per_rank, (r + 1) * per_rank)
  std::size_t per_rank = 0;

  std::uint64_t at(int rank, std::size_t word) const { return words[static_cast<std::size_t>(rank) * per_rank + word]; }
  std::span<const std::uint64_t> of(int rank) const {
    return std::span<const std::uint64_t>(words).subspan(static_cast<std::size_t>(rank) * per_rank, per_rank);
  }
  /// The first rank whose words [first, first + count) differ from rank 0's, or -1.
  int first_differing(std::size_t first, std::size_t count) const {
    const int ranks = per_rank == 0 ? 0 : static_cast<int>(words.size() / per_rank);
    for (int r = 1; r < ranks; ++r) {
      for (std::size_t w = first; w < first + count; ++w) {
        if (at(r, w) != at(0, w)) return r;
      }
    }
    return -1;
  }
};

/// All-gathers `mine` (the same number of words on every rank) on `stream`, synchronising it,
/// after each rank says whether it rejected its own arguments: `problem` is empty where it did
/// not, or the message of the ConfigError it would throw. When any rank rejected, every rank
/// throws a ConfigError: a rejecting rank its own `problem`, the others one that starts with
/// `who` and names the first rejecting rank and its reason (and how many more rejected). A
/// collective every rank must enter; with one rank it only throws `problem`, if any.
template <Backend B>
GatheredWords gather_agreed(B& backend, typename B::Stream stream, std::span<const std::uint64_t> mine,
                            std::string_view problem, const std::string& who) {
  constexpr std::size_t kReasonWords = kAgreementReasonBytes / 8;
  const std::size_t per_rank = 1 + kReasonWords + mine.size();
  if (backend.size() == 1) {
    if (!problem.empty()) throw ConfigError(std::string(problem));
    return GatheredWords{std::vector<std::uint64_t>(mine.begin(), mine.end()), mine.size()};
  }
  std::vector<std::uint64_t> sent(per_rank, 0);
  if (!problem.empty()) {
    std::string reason(problem.substr(0, kAgreementReasonBytes));
    if (problem.size() > kAgreementReasonBytes) reason.replace(kAgreementReasonBytes - 3, 3, "...");
    sent[0] = 1;
    std::memcpy(&sent[1], reason.data(), reason.size());
  }
  std::copy(mine.begin(), mine.end(), sent.begin() + 1 + kReasonWords);
  const std::vector<std::uint64_t> all = all_gather_words(backend, stream, std::span<const std::uint64_t>(sent));
  const int ranks = backend.size();
  int first = -1;
  int rejected = 0;
  for (int r = 0; r < ranks; ++r) {
    if (all[static_cast<std::size_t>(r) * per_rank] == 0) continue;
    if (first < 0) first = r;
    ++rejected;
  }
  if (!problem.empty()) throw ConfigError(std::string(problem));
  if (first >= 0) {
    const char* text = reinterpret_cast<const char*>(&all[static_cast<std::size_t>(first) * per_rank + 1]);
    const std::string reason(text, strnlen(text, kAgreementReasonBytes));
    throw ConfigError(who + ": rank " + std::to_string(first) + " rejected its own arguments (" + reason + ")" +
                      (rejected > 1 ? " and " + std::to_string(rejected - 1) + " more ranks did too" : "") +
                      "; every rank stops here. Fix that rank's arguments");
  }
  GatheredWords result;
  result.per_rank = mine.size();
  for (int r = 0; r < ranks; ++r) {
    const auto from = all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * per_rank + 1 + kReasonWords);
    result.words.insert(result.words.end(), from, from + static_cast<std::ptrdiff_t>(mine.size()));
  }
  return result;
}

}  // namespace ncclkit::detail
