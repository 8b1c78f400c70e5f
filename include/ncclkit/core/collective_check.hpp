#pragma once
/// The opt-in check that every rank calls a collective with the same arguments
/// (NCCLKIT_CHECK_COLLECTIVES=1, or the backends' `check_collectives` option): what a rank's
/// call is summed up as (`CollectiveFingerprint`), its fixed-size wire encoding, and the
/// comparison of every rank's fingerprint into one message that names the ranks and fields
/// that differ. Backend-independent: how the fingerprints travel is each backend's business
/// (Gloo: an allgather over the communicator's own context; NCCL: the store, see
/// nccl/detail/check_exchange.hpp). Every rank compares the same fingerprints the same way, so
/// every rank raises the same `CollectiveMismatchError`, and none runs the collective.
///
/// A rank whose own arguments fail its local validation (a count that does not fit its
/// buffers, a root out of range, ...) still takes part, with a fingerprint that carries the
/// reason (`rejected`): the other ranks raise a CollectiveMismatchError naming that rank and
/// the reason, at once rather than after the timeout, and that rank raises its own ConfigError.

#include <algorithm>    // std::stable_sort, std::find_if, std::any_of, std::min
#include <array>        // std::array
#include <cstddef>      // std::size_t
#include <cstdint>      // std::uint8_t, std::uint32_t, std::uint64_t, std::int32_t
#include <optional>     // std::optional
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "ncclkit/core/detail/hex.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/detail/rank_list.hpp"

namespace ncclkit {

/// Ranks called one collective with different arguments (found by the check, before anything
/// ran). A ConfigError: nothing was run on any rank, so the communicator stays usable. Every
/// rank that took part in the comparison raises it, with the same description.
class CollectiveMismatchError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

/// What one rank's call of a collective is compared by. Fields a collective does not have keep
/// their "none" values, so that e.g. a broadcast and an all_reduce differ in op and root too.
struct CollectiveFingerprint {
  static constexpr std::size_t kNameCapacity = 23;     ///< longest collective name kept
  static constexpr std::int32_t kNone = -1;            ///< op, root or dtype a collective lacks
  static constexpr std::size_t kReasonCapacity = 191;  ///< longest rejection reason kept

  std::uint64_t sequence = 0;                        ///< the call's number on this communicator, from 1
  std::array<char, kNameCapacity + 1> collective{};  ///< "all_reduce", NUL-terminated
  std::uint64_t count = 0;                           ///< elements (the collective's own meaning: per rank, or total)
  std::int32_t dtype = kNone;                        ///< DataType's value
  std::int32_t op = kNone;                           ///< ReduceOp's value
  std::int32_t root = kNone;                         ///< root rank
  std::uint64_t counts_hash = 0;                     ///< per-rank counts of uneven gathers (hash_counts()); 0: none
  /// Why this rank's local validation rejected its arguments, NUL-terminated; empty when it
  /// did not. A rejected call compares unequal to every accepted one.
  std::array<char, kReasonCapacity + 1> rejected{};

  /// A fingerprint of a call of `name` (truncated to kNameCapacity characters) with `count`
  /// elements of `dtype`; the with_* setters add what the collective has. The backend sets
  /// the sequence number.
  static CollectiveFingerprint of(std::string_view name, std::uint64_t count, DataType dtype) {
    CollectiveFingerprint f = of(name);
    f.count = count;
    f.dtype = static_cast<std::int32_t>(dtype);
    return f;
  }
  /// A call without elements (barrier).
  static CollectiveFingerprint of(std::string_view name) {
    CollectiveFingerprint f;
    const std::size_t n = std::min(name.size(), kNameCapacity);
    for (std::size_t i = 0; i < n; ++i) f.collective[i] = name[i];
    return f;
  }
  CollectiveFingerprint& with_op(ReduceOp reduce) {
    op = static_cast<std::int32_t>(reduce);
    return *this;
  }
  CollectiveFingerprint& with_root(int root_rank) {
    root = root_rank;
    return *this;
  }
  CollectiveFingerprint& with_counts(std::span<const std::size_t> counts);
  CollectiveFingerprint& with_sequence(std::uint64_t number) {
    sequence = number;
    return *this;
  }
  /// Marks the call as rejected by this rank's own validation, for `reason` (truncated to
  /// kReasonCapacity characters; an empty reason becomes "invalid arguments").
  CollectiveFingerprint& with_rejection(std::string_view reason) {
    if (reason.empty()) reason = "invalid arguments";
    rejected.fill('\0');
    const std::size_t n = std::min(reason.size(), kReasonCapacity);
    for (std::size_t i = 0; i < n; ++i) rejected[i] = reason[i];
    return *this;
  }

  std::string_view name() const { return std::string_view(collective.data()); }
  bool is_rejected() const { return rejected[0] != '\0'; }
  std::string_view rejection() const { return std::string_view(rejected.data()); }

  friend bool operator==(const CollectiveFingerprint&, const CollectiveFingerprint&) = default;
};

/// FNV-1a over the counts (as 64-bit little-endian values): what a fingerprint keeps of the
/// per-rank counts of an uneven gather. Never 0, so that 0 can mean "none".
inline std::uint64_t hash_counts(std::span<const std::size_t> counts) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (std::size_t c : counts) {
    for (int b = 0; b < 8; ++b) {
      hash ^= (static_cast<std::uint64_t>(c) >> (8 * b)) & 0xff;
      hash *= 0x100000001b3ull;
    }
  }
  return hash == 0 ? 1 : hash;
}

inline CollectiveFingerprint& CollectiveFingerprint::with_counts(std::span<const std::size_t> counts) {
  counts_hash = hash_counts(counts);
  return *this;
}

namespace detail {

/// Size of an encoded fingerprint: a fixed size, so that ranks can allgather them.
inline constexpr std::size_t kFingerprintBytes = 256;
/// First four bytes of an encoded fingerprint: "NKC" and the encoding's version (2).
inline constexpr std::uint32_t kFingerprintMagic = 0x02434b4e;

using EncodedFingerprint = std::array<std::uint8_t, kFingerprintBytes>;

inline void put_le(std::uint8_t* at, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) at[i] = static_cast<std::uint8_t>(value >> (8 * i));
}
inline std::uint64_t get_le(const std::uint8_t* at, int bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<std::uint64_t>(at[i]) << (8 * i);
  return value;
}

/// Layout (little-endian): magic u32, sequence u64, count u64, counts_hash u64, dtype i32,
/// op i32, root i32, the collective's name in 24 bytes (NUL-padded), then the rejection
/// reason in 192 bytes (NUL-padded; empty: accepted).
inline EncodedFingerprint encode(const CollectiveFingerprint& f) {
  static_assert(40 + CollectiveFingerprint::kNameCapacity + 1 + CollectiveFingerprint::kReasonCapacity + 1 ==
                kFingerprintBytes);
  EncodedFingerprint out{};
  std::uint8_t* p = out.data();
  put_le(p + 0, kFingerprintMagic, 4);
  put_le(p + 4, f.sequence, 8);
  put_le(p + 12, f.count, 8);
  put_le(p + 20, f.counts_hash, 8);
  put_le(p + 28, static_cast<std::uint32_t>(f.dtype), 4);
  put_le(p + 32, static_cast<std::uint32_t>(f.op), 4);
  put_le(p + 36, static_cast<std::uint32_t>(f.root), 4);
  for (std::size_t i = 0; i < f.collective.size(); ++i) p[40 + i] = static_cast<std::uint8_t>(f.collective[i]);
  for (std::size_t i = 0; i < f.rejected.size(); ++i) p[64 + i] = static_cast<std::uint8_t>(f.rejected[i]);
  return out;
}

/// The fingerprint in `bytes`; nullopt when they are not an encoded fingerprint of this
/// version (wrong size or magic, or a name without its terminating NUL).
inline std::optional<CollectiveFingerprint> decode(std::span<const std::uint8_t> bytes) {
  if (bytes.size() != kFingerprintBytes) return std::nullopt;
  const std::uint8_t* p = bytes.data();
  if (get_le(p, 4) != kFingerprintMagic) return std::nullopt;
  CollectiveFingerprint f;
  f.sequence = get_le(p + 4, 8);
  f.count = get_le(p + 12, 8);
  f.counts_hash = get_le(p + 20, 8);
  f.dtype = static_cast<std::int32_t>(static_cast<std::uint32_t>(get_le(p + 28, 4)));
  f.op = static_cast<std::int32_t>(static_cast<std::uint32_t>(get_le(p + 32, 4)));
  f.root = static_cast<std::int32_t>(static_cast<std::uint32_t>(get_le(p + 36, 4)));
  for (std::size_t i = 0; i < f.collective.size(); ++i) f.collective[i] = static_cast<char>(p[40 + i]);
  if (f.collective.back() != '\0') return std::nullopt;
  for (std::size_t i = 0; i < f.rejected.size(); ++i) f.rejected[i] = static_cast<char>(p[64 + i]);
  if (f.rejected.back() != '\0') return std::nullopt;
  return f;
}

inline std::string dtype_text(std::int32_t dtype) {
  if (dtype >= static_cast<std::int32_t>(DataType::kInt8) && dtype <= static_cast<std::int32_t>(DataType::kFloat64)) {
    return std::string(name_of(static_cast<DataType>(dtype)));
  }
  return dtype == CollectiveFingerprint::kNone ? "none" : "type " + std::to_string(dtype);
}

inline std::string op_text(std::int32_t op) {
  if (op >= static_cast<std::int32_t>(ReduceOp::kSum) && op <= static_cast<std::int32_t>(ReduceOp::kAvg)) {
    return std::string(name_of(static_cast<ReduceOp>(op)));
  }
  return op == CollectiveFingerprint::kNone ? "none" : "op " + std::to_string(op);
}

inline std::string root_text(std::int32_t root) {
  return root == CollectiveFingerprint::kNone ? "none" : std::to_string(root);
}

/// "all_reduce(count=100, float, sum)", "broadcast(count=8, int32, root=1)", "barrier()".
inline std::string describe_call(const CollectiveFingerprint& f) {
  std::string text = std::string(f.name()) + "(";
  if (f.dtype != CollectiveFingerprint::kNone || f.count != 0) {
    text += "count=" + std::to_string(f.count);
    if (f.dtype != CollectiveFingerprint::kNone) text += ", " + dtype_text(f.dtype);
  }
  if (f.op != CollectiveFingerprint::kNone) text += ", " + op_text(f.op);
  if (f.root != CollectiveFingerprint::kNone) text += ", root=" + root_text(f.root);
  if (f.counts_hash != 0) text += ", counts #" + hex64(f.counts_hash).substr(0, 8);
  return text + ")";
}

/// "count (100 vs 120)", one entry per field in which `a` differs from `b`.
inline std::vector<std::string> differing_fields(const CollectiveFingerprint& a, const CollectiveFingerprint& b) {
  std::vector<std::string> fields;
  const auto add = [&](const char* field, const std::string& x, const std::string& y) {
    fields.push_back(std::string(field) + " (" + x + " vs " + y + ")");
  };
  if (a.name() != b.name()) add("collective", std::string(a.name()), std::string(b.name()));
  if (a.sequence != b.sequence) add("seq", std::to_string(a.sequence), std::to_string(b.sequence));
  if (a.count != b.count) add("count", std::to_string(a.count), std::to_string(b.count));
  if (a.dtype != b.dtype) add("element type", dtype_text(a.dtype), dtype_text(b.dtype));
  if (a.op != b.op) add("op", op_text(a.op), op_text(b.op));
  if (a.root != b.root) add("root", root_text(a.root), root_text(b.root));
  if (a.counts_hash != b.counts_hash) {
    add("per-rank counts", a.counts_hash ? "#" + hex64(a.counts_hash).substr(0, 8) : "none",
        b.counts_hash ? "#" + hex64(b.counts_hash).substr(0, 8) : "none");
  }
  return fields;
}

/// Most groups of ranks a mismatch message describes one by one.
inline constexpr std::size_t kMaxMismatchGroups = 8;

/// Compares every rank's fingerprint (`all[r]` is rank r's). When they all agree: nullopt.
/// Otherwise the description every rank raises: ranks are grouped by fingerprint, the
/// largest group (ties: the one with the lowest rank) is the reference, and each other group
/// is named with its call and the fields that differ, both values given:
///   "collective argument mismatch at seq 7: rank 1 called all_reduce(count=100, float, sum) but
///    rank 0 called all_reduce(count=120, float, sum): count (100 vs 120) differs. ..."
inline std::optional<std::string> find_mismatch(std::span<const CollectiveFingerprint> all) {
  if (all.empty()) return std::nullopt;
  struct Group {
    CollectiveFingerprint fingerprint;
    std::vector<int> ranks;
  };
  std::vector<Group> groups;
  for (std::size_t r = 0; r < all.size(); ++r) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) { return g.fingerprint == all[r]; });
    if (it == groups.end()) {
      groups.push_back({all[r], {static_cast<int>(r)}});
    } else {
      it->ranks.push_back(static_cast<int>(r));
    }
  }
  const auto rejected = [](const Group& g) { return g.fingerprint.is_rejected(); };
  if (groups.size() == 1 && !rejected(groups.front())) return std::nullopt;
  constexpr const char* kNothingRan = ". Nothing was run, on any rank. ";
  if (std::any_of(groups.begin(), groups.end(), rejected)) {
    // Ranks whose own validation failed: their reasons, then what the others called.
    std::uint64_t sequence = groups.front().fingerprint.sequence;
    std::string text;
    std::size_t described = 0;
    for (const Group& g : groups) {
      if (!rejected(g) || described == kMaxMismatchGroups) continue;
      text += (described++ == 0 ? "" : "; ") + rank_or_ranks(g.ranks) +
              (g.ranks.size() == 1 ? " rejected its own arguments to " : " rejected their own arguments to ") +
              std::string(g.fingerprint.name()) + ": " + std::string(g.fingerprint.rejection());
    }
    for (const Group& g : groups) {
      if (rejected(g) || described == kMaxMismatchGroups) continue;
      sequence = g.fingerprint.sequence;
      text += "; " + rank_or_ranks(g.ranks) + " called " + describe_call(g.fingerprint);
      ++described;
    }
    return "collective argument mismatch at seq " + std::to_string(sequence) + ": " + text + kNothingRan +
           "Fix the arguments on the rank named (its own error says the same)";
  }
  // Groups are in order of their lowest rank; the stable sort keeps that order among equals.
  std::stable_sort(groups.begin(), groups.end(),
                   [](const Group& a, const Group& b) { return a.ranks.size() > b.ranks.size(); });
  const Group& reference = groups.front();
  std::string text = "collective argument mismatch at seq " + std::to_string(reference.fingerprint.sequence) + ": ";
  const std::size_t described = std::min(groups.size(), kMaxMismatchGroups + 1);
  for (std::size_t i = 1; i < described; ++i) {
    const Group& g = groups[i];
    const auto fields = differing_fields(g.fingerprint, reference.fingerprint);
    std::string list;
    for (std::size_t k = 0; k < fields.size(); ++k) list += (k == 0 ? "" : ", ") + fields[k];
    if (i > 1) text += "; ";
    text += rank_or_ranks(g.ranks) + " called " + describe_call(g.fingerprint) + " but " +
            rank_or_ranks(reference.ranks) + " called " + describe_call(reference.fingerprint) + ": " + list +
            (fields.size() == 1 ? " differs" : " differ");
  }
  if (groups.size() > described) {
    std::size_t ranks = 0;
    for (std::size_t i = described; i < groups.size(); ++i) ranks += groups[i].ranks.size();
    text += "; and " + std::to_string(groups.size() - described) + " more group(s) of ranks (" + std::to_string(ranks) +
            " rank(s)) with other arguments";
  }
  text += std::string(kNothingRan) +
          "Every rank must issue the same collectives in the same order with the "
          "same count, element type, op and root: look for a branch on the rank, or a size computed differently "
          "on some ranks, at this call";
  return text;
}

}  // namespace detail

}  // namespace ncclkit
