#pragma once
/// SLURM's compact lists, as found in its environment variables:
/// - host lists (SLURM_JOB_NODELIST, SLURM_STEP_NODELIST): "gpu[01-04,07],cpu3" names gpu01,
///   gpu02, gpu03, gpu04, gpu07 and cpu3. Zero padding of a range is kept ("[08-10]" gives 08,
///   09, 10); several bracket groups in one name multiply ("a[1-2]-b[3-4]" gives a1-b3, a1-b4,
///   a2-b3, a2-b4: the last group varies fastest).
/// - task counts per node (SLURM_TASKS_PER_NODE, SLURM_STEP_TASKS_PER_NODE): "4(x2),3" means
///   4 tasks on each of the first two nodes and 3 on the third.
///
/// Both parsers are pure functions; malformed input (quotes, spaces, unbalanced or nested
/// brackets, reversed ranges) is a ConfigError that quotes the text and points at the problem.

#include <cstddef>      // std::size_t
#include <cstdint>      // std::int64_t
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "ncclkit/core/env.hpp"
#include "ncclkit/core/error.hpp"

namespace ncclkit {

namespace detail {

/// One piece of a host name pattern: literal text, or a bracket group of number ranges.
struct HostPatternPart {
  std::string literal;              ///< used when `values` is empty
  std::vector<std::string> values;  ///< the expanded bracket group, padding applied
};

[[noreturn]] inline void throw_nodelist_error(std::string_view list, std::size_t at, std::string_view what) {
  throw ConfigError("cannot parse the SLURM host list '" + std::string(list) + "' at character " + std::to_string(at) +
                    ": " + std::string(what) +
                    "; expected host names separated by commas, with ranges in brackets like "
                    "'gpu[01-04,07],cpu3'");
}

inline bool is_host_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
}

/// Expands the inside of one bracket group ("01-04,07") into its values, keeping at most `limit`
/// of them (so a typo like [1-99999999] cannot exhaust memory) but checking every item.
inline std::vector<std::string> expand_bracket_group(std::string_view list, std::size_t offset, std::string_view group,
                                                     std::size_t limit) {
  std::vector<std::string> values;
  if (group.empty()) throw_nodelist_error(list, offset, "empty brackets");
  std::size_t start = 0;
  while (start <= group.size()) {
    std::size_t comma = group.find(',', start);
    if (comma == std::string_view::npos) comma = group.size();
    std::string_view item = group.substr(start, comma - start);
    const std::size_t item_at = offset + start;
    if (item.empty()) throw_nodelist_error(list, item_at, "empty item inside brackets");
    std::size_t dash = item.find('-');
    std::string_view low_text = item.substr(0, dash);
    std::string_view high_text = dash == std::string_view::npos ? low_text : item.substr(dash + 1);
    auto all_digits = [](std::string_view s) {
      if (s.empty() || s.size() > 18) return false;
      for (char c : s)
        if (c < '0' || c > '9') return false;
      return true;
    };
    if (!all_digits(low_text) || !all_digits(high_text)) {
      throw_nodelist_error(list, item_at, "'" + std::string(item) + "' is not a number or a range like 01-04");
    }
    const std::int64_t low = *parse_int(low_text);
    const std::int64_t high = *parse_int(high_text);
    if (high < low) {
      throw_nodelist_error(list, item_at, "range '" + std::string(item) + "' runs backwards");
    }
    // SLURM pads every number of a range to the width of its first bound: [08-10] -> 08 09 10.
    const std::size_t width = low_text.size();
    for (std::int64_t n = low; n <= high && values.size() < limit; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
      values.push_back(std::move(digits));
    }
    start = comma + 1;
  }
  return values;
}

/// Appends the names of one host pattern ("a[1-2]-b[3-4]") to `out`, stopping at `limit` names.
inline void expand_host_pattern(std::string_view list, std::size_t offset, std::string_view pattern, std::size_t limit,
                                std::vector<std::string>& out) {
  if (pattern.empty()) throw_nodelist_error(list, offset, "empty host name");
  std::vector<HostPatternPart> parts;
  std::size_t i = 0;
  while (i < pattern.size()) {
    if (pattern[i] == '[') {
      std::size_t close = pattern.find(']', i);
      if (close == std::string_view::npos) throw_nodelist_error(list, offset + i, "'[' without a matching ']'");
      std::string_view inside = pattern.substr(i + 1, close - i - 1);
      if (inside.find('[') != std::string_view::npos) {
        throw_nodelist_error(list, offset + i, "nested '['");
      }
      HostPatternPart part;
      part.values = expand_bracket_group(list, offset + i + 1, inside, limit);
      parts.push_back(std::move(part));
      i = close + 1;
    } else if (pattern[i] == ']') {
      throw_nodelist_error(list, offset + i, "']' without a matching '['");
    } else {
      std::size_t end = i;
      while (end < pattern.size() && pattern[end] != '[' && pattern[end] != ']') {
        if (!is_host_char(pattern[end])) {
          const char c = pattern[end];
          std::string what = "unexpected character '" + std::string(1, c) + "'";
          if (c == '"' || c == '\'') what += " (remove the quotes around the list)";
          if (c == ' ' || c == '\t' || c == '\n') what = "unexpected white space";
          throw_nodelist_error(list, offset + end, what);
        }
        ++end;
      }
      HostPatternPart part;
      part.literal = std::string(pattern.substr(i, end - i));
      parts.push_back(std::move(part));
      i = end;
    }
  }
  // Odometer over the bracket groups, the last group varying fastest.
  std::vector<std::size_t> groups;  // indices of the parts that are bracket groups
  for (std::size_t p = 0; p < parts.size(); ++p)
    if (!parts[p].values.empty()) groups.push_back(p);
  std::vector<std::size_t> index(parts.size(), 0);
  while (out.size() < limit) {
    std::string name;
    for (std::size_t p = 0; p < parts.size(); ++p) {
      name += parts[p].values.empty() ? parts[p].literal : parts[p].values[index[p]];
    }
    out.push_back(std::move(name));
    std::size_t g = groups.size();
    for (; g > 0; --g) {
      const std::size_t p = groups[g - 1];
      if (++index[p] < parts[p].values.size()) break;
      index[p] = 0;
    }
    if (g == 0) return;  // every group wrapped around (or there is none): all names emitted
  }
}

/// Calls `fn(offset, item)` for each comma-separated item of a host list, ignoring commas
/// inside brackets.
template <class Fn>
void for_each_host_pattern(std::string_view list, Fn&& fn) {
  if (list.empty()) throw_nodelist_error(list, 0, "the list is empty");
  std::size_t start = 0;
  while (start <= list.size()) {
    std::size_t end = start;
    int depth = 0;
    while (end < list.size() && (list[end] != ',' || depth > 0)) {
      if (list[end] == '[') ++depth;
      if (list[end] == ']') --depth;
      ++end;
    }
    fn(start, list.substr(start, end - start));
    start = end + 1;
  }
}

[[noreturn]] inline void throw_tasks_per_node_error(std::string_view text, std::string_view what) {
  throw ConfigError("cannot parse the SLURM task counts '" + std::string(text) + "': " + std::string(what) +
                    "; expected counts separated by commas, a repeated count written like '4(x2)', "
                    "e.g. '4(x2),3'");
}

}  // namespace detail

/// Largest number of host names expand_slurm_nodelist() produces before it reports an error.
inline constexpr std::size_t kMaxSlurmHosts = 1 << 20;

/// Every host named by a SLURM host list, in order. Throws ConfigError on malformed input or
/// when the list names more than kMaxSlurmHosts hosts.
inline std::vector<std::string> expand_slurm_nodelist(std::string_view list) {
  std::vector<std::string> hosts;
  detail::for_each_host_pattern(list, [&](std::size_t offset, std::string_view pattern) {
    detail::expand_host_pattern(list, offset, pattern, kMaxSlurmHosts + 1, hosts);
    if (hosts.size() > kMaxSlurmHosts) {
      throw ConfigError("the SLURM host list '" + std::string(list) + "' names more than " +
                        std::to_string(kMaxSlurmHosts) + " hosts; is a range mistyped?");
    }
  });
  return hosts;
}

/// The first host of a SLURM host list ("gpu[01-04]" -> "gpu01") without expanding the rest;
/// the whole list is still checked for syntax errors.
inline std::string first_slurm_host(std::string_view list) {
  std::string first;
  detail::for_each_host_pattern(list, [&](std::size_t offset, std::string_view pattern) {
    std::vector<std::string> names;
    detail::expand_host_pattern(list, offset, pattern, 1, names);
    if (first.empty()) first = std::move(names.front());
  });
  return first;
}

/// Task counts per node from SLURM's compressed form: "4(x2),3" -> {4, 4, 3}. Throws
/// ConfigError on malformed input, zero counts or more than kMaxSlurmHosts nodes.
inline std::vector<int> expand_slurm_tasks_per_node(std::string_view text) {
  auto fail = [&](std::string_view what) { detail::throw_tasks_per_node_error(text, what); };
  std::vector<int> counts;
  if (text.empty()) fail("the text is empty");
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(start, comma - start);
    std::string_view count_text = item;
    std::int64_t repeat = 1;
    std::size_t paren = item.find('(');
    if (paren != std::string_view::npos) {
      count_text = item.substr(0, paren);
      std::string_view rest = item.substr(paren);
      if (rest.size() < 4 || rest.substr(0, 2) != "(x" || rest.back() != ')') {
        fail("'" + std::string(item) + "' is not like '4(x2)'");
      }
      auto r = parse_int(rest.substr(2, rest.size() - 3));
      if (!r || *r < 1 || rest[2] == '+' || rest[2] == '-') fail("bad repeat count in '" + std::string(item) + "'");
      repeat = *r;
    }
    auto count = parse_int(count_text);
    if (!count || count_text[0] == '+' || count_text[0] == '-' || *count < 1 || *count > (1 << 30)) {
      fail("'" + std::string(item) + "' is not a positive count");
    }
    if (repeat > static_cast<std::int64_t>(kMaxSlurmHosts) ||
        counts.size() + static_cast<std::size_t>(repeat) > kMaxSlurmHosts) {
      fail("more than " + std::to_string(kMaxSlurmHosts) + " nodes");
    }
    counts.insert(counts.end(), static_cast<std::size_t>(repeat), static_cast<int>(*count));
    start = comma + 1;
  }
  return counts;
}

}  // namespace ncclkit
