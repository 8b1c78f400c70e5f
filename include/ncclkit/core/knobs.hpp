#pragma once
/// ncclkit's environment variables, declared once (NCCL's NCCL_PARAM is the model): one table
/// of every NCCLKIT_ variable with its kind, range, default, when it is read, the options field
/// it overrides and one line of doc; one parser (core/detail/knob_parse.hpp); and a value a
/// knob cannot take is a ConfigError naming the variable, the value and what is allowed.
///
/// The one rule of precedence: an options field comes first, and the environment only
/// overrides it. Where a knob has an options field, the variable, when set (not empty), wins
/// over the field's value; unset, the field's value holds, and the field's default is the
/// table's. Knobs without a field are read alone. Calls made at run time (set_log_level) and
/// the explicit overrides of detect_world are not fields: they win. docs/environment.md lists
/// the same table for users; tests/host/test_knobs.cpp keeps the two in step.
///
/// Library code names a knob by its variable, checked at compile time:
///   const auto blocks = knob_integer(knob("NCCLKIT_CODEC_BLOCKS_PER_SM"));  // nullopt: unset
///   options.timeout = environment_overrides(knob("NCCLKIT_TIMEOUT"), options.timeout);

#include <chrono>       // std::chrono::milliseconds
#include <cstdint>      // std::int64_t
#include <limits>       // std::numeric_limits
#include <optional>     // std::optional
#include <span>         // std::span
#include <stdexcept>    // std::logic_error
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <type_traits>  // std::is_same_v, std::is_integral_v

#include "ncclkit/core/detail/knob_parse.hpp"
#include "ncclkit/core/env.hpp"  // env_string, parse_int
#include "ncclkit/core/error.hpp"

namespace ncclkit {

/// One environment variable of ncclkit.
struct Knob {
  std::string_view name;  ///< the variable, "NCCLKIT_..."
  KnobKind kind;
  std::int64_t min = 0;  ///< kInteger, kPowerOfTwo: the range, both ends allowed
  std::int64_t max = std::numeric_limits<std::int64_t>::max();
  std::string_view choices{};  ///< kChoice: the words allowed, comma-separated
  /// The default as docs/environment.md writes it: a value of the knob's kind ("600", "16",
  /// "warn"), or words where it is no one value ("unset", "one per SM").
  std::string_view default_value{};
  KnobRead read = KnobRead::kAtCreation;
  std::string_view field{};  ///< the options field(s) it overrides; empty: none
  std::string_view doc{};    ///< one line: what it does

  /// What the knob takes, in words: "an integer from 1 to 8".
  std::string allowed() const { return detail::allowed_values(kind, min, max, choices); }
};

namespace detail {
inline constexpr std::int64_t kNoLimit = std::numeric_limits<std::int64_t>::max();
}  // namespace detail

/// Every NCCLKIT_ variable ncclkit reads or sets, grouped by layer.
inline constexpr Knob kKnobs[] = {
    // ---- bootstrap and stores ----
    {.name = "NCCLKIT_INIT_URL",
     .kind = KnobKind::kText,
     .default_value = "unset",
     .doc = "where the job rendezvous (env://, tcp://HOST:PORT, file:///DIR); set by ncclkit-run; detect_world's "
            "overrides win, as over RANK"},
    {.name = "NCCLKIT_STORE_TIMEOUT",
     .kind = KnobKind::kSeconds,
     .default_value = "300",
     .field = "FileStoreOptions::timeout, TcpStoreOptions::timeout, make_store's timeout and ?timeout=",
     .doc = "default timeout of blocking store calls and of rendezvous"},
    {.name = "NCCLKIT_STORE_TOKEN",
     .kind = KnobKind::kText,
     .default_value = "none",
     .field = "TcpStoreOptions::token, TcpStoreServerOptions::token, make_store's token",
     .doc = "shared secret every TcpStore client presents; the same in every process of the job"},
    {.name = "NCCLKIT_STORE_HANDSHAKE_TIMEOUT",
     .kind = KnobKind::kSeconds,
     .default_value = "10",
     .field = "TcpStoreServerOptions::handshake_timeout",
     .doc = "a connection that has not said hello, or stalls mid-frame, this long is closed"},
    {.name = "NCCLKIT_STORE_LINGER",
     .kind = KnobKind::kSecondsOrZero,
     .default_value = "30",
     .field = "TcpStoreOptions::linger",
     .doc = "how long the process hosting the TCP store keeps serving connected ranks after it is done"},
    {.name = "NCCLKIT_RUN_ID",
     .kind = KnobKind::kText,
     .default_value = "unset",
     .doc = "the job's identity for FileStore runs, over the identity launchers give"},
    {.name = "NCCLKIT_LAUNCH_RUN_ID",
     .kind = KnobKind::kText,
     .default_value = "unset",
     .doc = "the job's id, set by ncclkit-run (32 hex digits); FileStore's identity when NCCLKIT_RUN_ID is unset"},
    // ---- both backends ----
    {.name = "NCCLKIT_TIMEOUT",
     .kind = KnobKind::kSeconds,
     .default_value = "600",
     .field = "nccl::Options::timeout, gloo::Options::timeout",
     .doc = "timeout of communicator init and of every collective"},
    {.name = "NCCLKIT_CHECK_COLLECTIVES",
     .kind = KnobKind::kSwitch,
     .default_value = "0",
     .field = "nccl::Options::check_collectives, gloo::Options::check_collectives",
     .doc = "compare every collective's arguments across ranks before it runs; alike on every rank"},
    // ---- NCCL backend ----
    {.name = "NCCLKIT_CHECK_POINTERS",
     .kind = KnobKind::kSwitch,
     .default_value = "1",
     .field = "nccl::Options::check_pointers",
     .doc = "check with cudaPointerGetAttributes that buffers are this GPU's memory"},
    {.name = "NCCLKIT_CODEC_BLOCKS_PER_SM",
     .kind = KnobKind::kInteger,
     .min = 1,
     .max = 8,
     .default_value = "4",
     .field = "nccl::Options::codec_blocks_per_sm",
     .doc = "most 256-thread blocks per SM of the cast kernels, which run beside NCCL's"},
    {.name = "NCCLKIT_COPY_BLOCKS_PER_SM",
     .kind = KnobKind::kInteger,
     .min = 0,
     .max = 8,
     .default_value = "0",
     .field = "nccl::Options::copy_blocks_per_sm",
     .doc = "0: one short-lived block per chunk of the batched copy; 1 to 8: at most this many per SM, looping"},
    {.name = "NCCLKIT_COPY_CHUNK_KB",
     .kind = KnobKind::kPowerOfTwo,
     .min = 4,
     .max = 1024,
     .default_value = "16",
     .field = "nccl::Options::copy_chunk_kb",
     .doc = "KiB one block of the batched copy moves at a time"},
    {.name = "NCCLKIT_COMPRESSED_REDUCE",
     .kind = KnobKind::kSwitch,
     .default_value = "1",
     .field = "nccl::Options::compressed_reduce",
     .doc = "0: no fused compressed all-reduce; GradientSync with a codec then casts around NCCL's"},
    {.name = "NCCLKIT_COMPRESSED_REDUCE_BLOCKS",
     .kind = KnobKind::kInteger,
     .min = 0,
     .max = 4096,
     .default_value = "0",
     .field = "nccl::Options::compressed_reduce_blocks",
     .doc = "512-thread blocks of the fused compressed all-reduce; 0: one per SM; at most 2 x SMs"},
    // ---- Gloo backend ----
    {.name = "NCCLKIT_GLOO_SOCKET_IFNAME",
     .kind = KnobKind::kText,
     .default_value = "unset",
     .field = "gloo::Options::interface",
     .doc = "network interface Gloo's TCP transport binds and advertises"},
    {.name = "NCCLKIT_GLOO_HOSTNAME",
     .kind = KnobKind::kText,
     .default_value = "unset",
     .field = "gloo::Options::hostname",
     .doc = "host name or address Gloo binds and advertises, where no interface is set"},
    {.name = "NCCLKIT_GLOO_ISA",
     .kind = KnobKind::kChoice,
     .choices = "generic,avx2",
     .default_value = "the best the CPU has",
     .read = KnobRead::kOncePerProcess,
     .doc = "which copy of the CPU reduction loops runs; avx2 on a CPU without AVX2 and F16C is an error"},
    // ---- fusion ----
    {.name = "NCCLKIT_TIMELINE",
     .kind = KnobKind::kText,
     .default_value = "unset",
     .field = "TimelineOptions::prefix (GradientSyncOptions::timeline)",
     .doc = "path prefix of the Chrome trace each rank writes of its first steps: <prefix>.rank<R>.json"},
    {.name = "NCCLKIT_TIMELINE_STEPS",
     .kind = KnobKind::kInteger,
     .min = 1,
     .max = 1'000'000'000,
     .default_value = "20",
     .field = "TimelineOptions::max_steps",
     .doc = "how many steps, from the first, the timeline records"},
    // ---- logging ----
    {.name = "NCCLKIT_LOG_LEVEL",
     .kind = KnobKind::kChoice,
     .choices = "error,warn,warning,info,debug",
     .default_value = "warn",
     .read = KnobRead::kOncePerProcess,
     .doc = "which log lines are printed (rank-prefixed, on stderr); set_log_level() overrides it"},
    // ---- set by ncclkit-run for the program ----
    {.name = "NCCLKIT_RESTART_COUNT",
     .kind = KnobKind::kInteger,
     .min = 0,
     .default_value = "0",
     .read = KnobRead::kForTheProgram,
     .doc = "this attempt of the worker group, 0 for the first"},
    {.name = "NCCLKIT_MAX_RESTARTS",
     .kind = KnobKind::kInteger,
     .min = 0,
     .default_value = "0",
     .read = KnobRead::kForTheProgram,
     .doc = "the launcher's restart budget"},
};

/// The whole table, for tools and tests.
inline constexpr std::span<const Knob> all_knobs() { return kKnobs; }

/// The knob of variable `name`; a name the table lacks does not compile.
consteval const Knob& knob(std::string_view name) {
  for (const Knob& k : kKnobs) {
    if (k.name == name) return k;
  }
  throw "ncclkit: no such knob in core/knobs.hpp; declare it in kKnobs first";
}

/// The default of the knob of variable `name` as a value: a whole number (int, unsigned,
/// std::int64_t, std::size_t), a switch (bool) or seconds (std::chrono::milliseconds).
template <class T>
consteval T knob_default(std::string_view name) {
  const Knob& k = knob(name);
  std::int64_t number = 0;
  bool negative = false;
  std::string_view text = k.default_value;
  if (!text.empty() && text[0] == '-') {
    negative = true;
    text.remove_prefix(1);
  }
  if (text.empty()) throw "ncclkit: the knob's default is not a whole number";
  for (char c : text) {
    if (c < '0' || c > '9') throw "ncclkit: the knob's default is not a whole number";
    number = number * 10 + (c - '0');
  }
  if (negative) number = -number;
  if constexpr (std::is_same_v<T, bool>) {
    if (k.kind != KnobKind::kSwitch) throw "ncclkit: a bool default needs a switch knob";
    return number != 0;
  } else if constexpr (std::is_same_v<T, std::chrono::milliseconds>) {
    if (k.kind != KnobKind::kSeconds && k.kind != KnobKind::kSecondsOrZero) {
      throw "ncclkit: a duration default needs a seconds knob";
    }
    return std::chrono::seconds(number);
  } else {
    static_assert(std::is_integral_v<T>);
    if (k.kind != KnobKind::kInteger && k.kind != KnobKind::kPowerOfTwo) {
      throw "ncclkit: an integer default needs an integer knob";
    }
    return static_cast<T>(number);
  }
}

namespace detail {

/// The knob's value from the environment, parsed; nullopt when unset or empty. ConfigError
/// naming the variable, the value and what is allowed when it cannot be parsed.
inline std::optional<KnobValue> read_knob(const Knob& knob) {
  const std::optional<std::string> text = env_string(std::string(knob.name).c_str());
  if (!text) return std::nullopt;
  std::optional<KnobValue> value = parse_knob_value(knob.kind, knob.min, knob.max, knob.choices, *text);
  if (!value) throw ConfigError(bad_knob_value(knob.name, true, *text, knob.allowed(), knob.default_value));
  return value;
}

inline void require_kind(const Knob& knob, bool matches, const char* reader) {
  if (!matches) throw std::logic_error(std::string(reader) + " cannot read " + std::string(knob.name) + "'s kind");
}

}  // namespace detail

/// A kText or kChoice knob's value; nullopt when unset.
inline std::optional<std::string> knob_text(const Knob& knob) {
  detail::require_kind(knob, knob.kind == KnobKind::kText || knob.kind == KnobKind::kChoice, "knob_text");
  auto value = detail::read_knob(knob);
  return value ? std::optional<std::string>(std::move(value->text)) : std::nullopt;
}

/// A kInteger or kPowerOfTwo knob's value, within its range; nullopt when unset.
inline std::optional<std::int64_t> knob_integer(const Knob& knob) {
  detail::require_kind(knob, knob.kind == KnobKind::kInteger || knob.kind == KnobKind::kPowerOfTwo, "knob_integer");
  const auto value = detail::read_knob(knob);
  return value ? std::optional<std::int64_t>(value->integer) : std::nullopt;
}

/// A kSwitch knob: whether it is on; nullopt when unset.
inline std::optional<bool> knob_switch(const Knob& knob) {
  detail::require_kind(knob, knob.kind == KnobKind::kSwitch, "knob_switch");
  const auto value = detail::read_knob(knob);
  return value ? std::optional<bool>(value->integer != 0) : std::nullopt;
}

/// A kSeconds or kSecondsOrZero knob's value; nullopt when unset.
inline std::optional<std::chrono::milliseconds> knob_seconds(const Knob& knob) {
  detail::require_kind(knob, knob.kind == KnobKind::kSeconds || knob.kind == KnobKind::kSecondsOrZero, "knob_seconds");
  const auto value = detail::read_knob(knob);
  return value ? std::optional<std::chrono::milliseconds>(value->duration) : std::nullopt;
}

/// Reads and checks the knob whatever its kind: ConfigError when it is set to a value it cannot
/// take. For tools and tests that check a whole environment at once.
inline void check_knob(const Knob& knob) { (void)detail::read_knob(knob); }

/// The one rule: the knob's variable, when set, overrides `field`; unset, `field` holds.
/// `T` is a whole number, bool (a switch), std::chrono::milliseconds (seconds) or std::string.
template <class T>
T environment_overrides(const Knob& knob, T field) {
  if constexpr (std::is_same_v<T, bool>) {
    return knob_switch(knob).value_or(field);
  } else if constexpr (std::is_same_v<T, std::chrono::milliseconds>) {
    return knob_seconds(knob).value_or(field);
  } else if constexpr (std::is_same_v<T, std::string>) {
    auto value = knob_text(knob);
    return value ? std::move(*value) : std::move(field);
  } else {
    static_assert(std::is_integral_v<T>);
    const auto value = knob_integer(knob);
    return value ? static_cast<T>(*value) : field;
  }
}

/// What is wrong with `value` given in the options field `field_name` for `knob`, or empty
/// when the knob takes it (the environment's values are checked when read).
inline std::string knob_field_problem(const Knob& knob, std::string_view field_name, std::int64_t value) {
  if (detail::parse_knob_value(knob.kind, knob.min, knob.max, knob.choices, std::to_string(value))) return {};
  return detail::bad_knob_value(field_name, false, std::to_string(value), knob.allowed(), knob.default_value);
}

}  // namespace ncclkit
