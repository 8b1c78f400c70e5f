#pragma once
/// Init URLs say where the processes of a job rendezvous, and make_store() turns one into a
/// Store (docs/bootstrap.md). Three forms are accepted:
///
///   env://                  a TcpStore at MASTER_ADDR:MASTER_PORT (WorldInfo::master_addr and
///                           master_port, which detect_world() reads), server inside rank 0
///   tcp://HOST:PORT         a TcpStore at HOST:PORT, server inside rank 0; IPv6 in brackets:
///                           tcp://[::1]:29500, tcp://[fe80::1%eth0]:29500
///   file:///ABSOLUTE/DIR    a FileStore in that folder (one host, or a folder on NFS shared by
///                           all hosts; no address needed)
///
/// each optionally followed by options after a `?`, joined by `&`:
///   timeout=SECONDS         the default timeout of the store's blocking calls (fractions allowed)
///   server=rank0|external   env:// and tcp:// only: who runs the TCP server. rank0 (default):
///                           rank 0 starts it inside itself. external: it already runs (in
///                           spawn()'s parent, a launcher, a standalone TcpStoreServer) and
///                           every rank, rank 0 too, only connects.
/// The scheme is case-insensitive; nothing is percent-decoded.

#include <chrono>       // std::chrono::milliseconds
#include <memory>       // std::shared_ptr, std::make_shared
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "ncclkit/bootstrap/world_info.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/knobs.hpp"
#include "ncclkit/core/time_format.hpp"
#include "ncclkit/store/file_store.hpp"
#include "ncclkit/store/store.hpp"
#include "ncclkit/store/tcp_store.hpp"

namespace ncclkit {

/// Which store an init URL names.
enum class InitUrlScheme { kEnv, kTcp, kFile };

/// An init URL, taken apart by parse_init_url().
struct InitUrl {
  InitUrlScheme scheme = InitUrlScheme::kEnv;
  std::string host{};  ///< tcp://: host name, IPv4 or IPv6 address (without the brackets)
  int port = 0;        ///< tcp://: 0 to 65535 (0: the server picks a free port; single process only)
  std::string path{};  ///< file://: the absolute folder
  std::optional<std::chrono::milliseconds> timeout{};  ///< from ?timeout=SECONDS, if given
  bool external_server = false;  ///< ?server=external: the TCP server runs elsewhere, rank 0 only connects
  std::string text{};            ///< the URL as given, for messages
};

namespace detail {

inline constexpr const char* kInitUrlForms =
    "accepted forms: env:// (the TCP store at MASTER_ADDR:MASTER_PORT), tcp://HOST:PORT (IPv6 in "
    "brackets: tcp://[::1]:29500), file:///ABSOLUTE/DIR (a folder all ranks share; note the three "
    "slashes), each optionally followed by ?timeout=SECONDS (and for TCP &server=rank0|external)";

[[noreturn]] inline void throw_init_url_error(std::string_view url, std::string_view problem) {
  throw ConfigError("invalid init URL '" + std::string(url) + "': " + std::string(problem) + "; " + kInitUrlForms);
}

inline bool is_hostname_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_';
}

inline int parse_url_port(std::string_view url, std::string_view text) {
  if (text.empty()) throw_init_url_error(url, "the port is missing (tcp://HOST:PORT)");
  for (char c : text) {
    if (c < '0' || c > '9') throw_init_url_error(url, "the port '" + std::string(text) + "' is not a number");
  }
  auto port = text.size() <= 6 ? parse_int(text) : std::nullopt;
  if (!port || *port > 65535) {
    throw_init_url_error(url, "the port " + std::string(text) + " is not in [0, 65535]");
  }
  return static_cast<int>(*port);
}

inline void parse_url_query(std::string_view url, std::string_view query, InitUrl& out) {
  bool server_seen = false;
  std::size_t start = 0;
  while (start <= query.size()) {
    std::size_t amp = query.find('&', start);
    if (amp == std::string_view::npos) amp = query.size();
    std::string_view item = query.substr(start, amp - start);
    std::size_t eq = item.find('=');
    std::string_view key = item.substr(0, eq);
    std::string_view value = eq == std::string_view::npos ? std::string_view() : item.substr(eq + 1);
    if (key == "server") {
      if (server_seen) throw_init_url_error(url, "server is given twice");
      server_seen = true;
      if (value != "rank0" && value != "external") {
        throw_init_url_error(url, "server='" + std::string(value) + "' must be rank0 or external");
      }
      out.external_server = value == "external";
      start = amp + 1;
      continue;
    }
    if (key != "timeout") {
      throw_init_url_error(url, "unknown option '" + std::string(item) +
                                    "' (the options are timeout=SECONDS and server=rank0|external)");
    }
    if (out.timeout) throw_init_url_error(url, "timeout is given twice");
    out.timeout = parse_timeout_seconds(value);
    if (!out.timeout) {
      throw_init_url_error(
          url, "timeout='" + std::string(value) + "' is not a positive number of seconds (e.g. ?timeout=30)");
    }
    start = amp + 1;
  }
}

inline void parse_tcp_authority(std::string_view url, std::string_view authority, InitUrl& out) {
  if (!authority.empty() && authority.back() == '/') authority.remove_suffix(1);  // tcp://h:1/
  if (authority.empty()) throw_init_url_error(url, "the host and port are missing (tcp://HOST:PORT)");
  if (authority.find('/') != std::string_view::npos) {
    throw_init_url_error(url, "a tcp:// URL has no path, only HOST:PORT");
  }
  if (authority.find('@') != std::string_view::npos) {
    throw_init_url_error(url,
                         "user names are not supported in a tcp:// URL (for a shared secret, "
                         "set NCCLKIT_STORE_TOKEN)");
  }
  std::string_view port_text;
  if (authority.front() == '[') {
    std::size_t close = authority.find(']');
    if (close == std::string_view::npos) throw_init_url_error(url, "'[' of an IPv6 address without ']'");
    std::string_view host = authority.substr(1, close - 1);
    if (host.empty()) throw_init_url_error(url, "the IPv6 address in brackets is empty");
    for (char c : host.substr(0, host.find('%'))) {
      const bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
      if (!hex && c != ':' && c != '.') {
        throw_init_url_error(url, "'" + std::string(host) + "' is not an IPv6 address");
      }
    }
    std::string_view rest = authority.substr(close + 1);
    if (rest.empty() || rest.front() != ':') throw_init_url_error(url, "the port is missing after the IPv6 address");
    out.host = std::string(host);
    port_text = rest.substr(1);
  } else {
    std::size_t colon = authority.rfind(':');
    if (colon == std::string_view::npos) throw_init_url_error(url, "the port is missing (tcp://HOST:PORT)");
    std::string_view host = authority.substr(0, colon);
    if (host.find(':') != std::string_view::npos) {
      throw_init_url_error(url, "an IPv6 address must be written in brackets, like tcp://[::1]:29500");
    }
    if (host.empty()) throw_init_url_error(url, "the host is missing (tcp://HOST:PORT)");
    for (char c : host) {
      if (!is_hostname_char(c)) {
        throw_init_url_error(url, "'" + std::string(host) + "' is not a host name or address");
      }
    }
    out.host = std::string(host);
    port_text = authority.substr(colon + 1);
  }
  out.port = parse_url_port(url, port_text);
}

}  // namespace detail

/// Parses an init URL (see the header comment for the forms). Pure: reads no environment.
/// Throws ConfigError quoting the URL, saying what is wrong and showing the accepted forms.
inline InitUrl parse_init_url(std::string_view url) {
  InitUrl out;
  out.text = std::string(url);
  if (url.empty()) {
    detail::throw_init_url_error(url, "the URL is empty (set NCCLKIT_INIT_URL or pass one)");
  }
  const char first = url.front();
  const char last = url.back();
  if (first == '"' || first == '\'' || last == '"' || last == '\'') {
    detail::throw_init_url_error(url, "it is quoted; remove the quotes");
  }
  for (char c : url) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      detail::throw_init_url_error(url, "it contains white space");
    }
  }
  const std::size_t separator = url.find("://");
  if (separator == std::string_view::npos) {
    detail::throw_init_url_error(url, "there is no scheme (env://, tcp:// or file://)");
  }
  std::string scheme(url.substr(0, separator));
  for (char& c : scheme) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  std::string_view rest = url.substr(separator + 3);
  if (rest.find('#') != std::string_view::npos) detail::throw_init_url_error(url, "'#' is not allowed");
  if (const std::size_t question = rest.find('?'); question != std::string_view::npos) {
    detail::parse_url_query(url, rest.substr(question + 1), out);
    rest = rest.substr(0, question);
  }

  if (scheme == "env") {
    out.scheme = InitUrlScheme::kEnv;
    if (!rest.empty()) {
      detail::throw_init_url_error(url,
                                   "env:// takes no address (it reads MASTER_ADDR and MASTER_PORT); "
                                   "for an explicit address write tcp://HOST:PORT");
    }
  } else if (scheme == "tcp") {
    out.scheme = InitUrlScheme::kTcp;
    detail::parse_tcp_authority(url, rest, out);
  } else if (scheme == "file") {
    out.scheme = InitUrlScheme::kFile;
    if (rest.empty()) detail::throw_init_url_error(url, "the folder is missing (file:///ABSOLUTE/DIR)");
    if (rest.front() != '/') {
      const std::string relative(rest);
      detail::throw_init_url_error(url,
                                   "a file:// URL needs an absolute path, written with three slashes: "
                                   "file:///" +
                                       relative + " if you meant /" + relative +
                                       " (relative paths are not accepted: ranks may start in different folders)");
    }
    out.path = std::string(rest);
    if (out.external_server) detail::throw_init_url_error(url, "server= applies to env:// and tcp:// only");
  } else {
    detail::throw_init_url_error(url, "unknown scheme '" + std::string(url.substr(0, separator)) + "'");
  }
  return out;
}

/// Options of make_store().
struct MakeStoreOptions {
  /// Default timeout of the store's blocking calls (and how long a TcpStore client retries
  /// connecting). Unset: the URL's ?timeout=SECONDS, else 300 s. NCCLKIT_STORE_TIMEOUT, where
  /// set, overrides all three.
  std::optional<std::chrono::milliseconds> timeout{};
  /// Shared secret of a TcpStore; unset: none. NCCLKIT_STORE_TOKEN overrides it (in TcpStore).
  std::optional<std::string> token{};
};

/// The store that `url` names, for the process described by `world` (which is validated):
/// - env:// and tcp://: a TcpStore at world.master_addr:world.master_port (env://) or at the
///   URL's HOST:PORT (tcp://); rank 0 starts the server, bound to that host, and every rank
///   (rank 0 too) connects as a client; with ?server=external the server already runs and
///   rank 0 only connects too. Port 0 (a free port the server picks) only works for a single
///   process that starts the server, since nobody else could know it. For a single process,
///   env:// without MASTER_ADDR/MASTER_PORT means 127.0.0.1 and a free port.
/// - file:///DIR: a FileStore in DIR for world.world_size processes.
/// Throws ConfigError for a bad URL or world, and whatever the store's constructor throws
/// (TimeoutError when the server cannot be reached in time, StoreError, ...).
inline std::shared_ptr<Store> make_store(const std::string& url, const WorldInfo& world,
                                         MakeStoreOptions options = {}) {
  const InitUrl parsed = parse_init_url(url);
  world.validate();
  const std::chrono::milliseconds timeout =
      environment_overrides(knob("NCCLKIT_STORE_TIMEOUT"),
                            options.timeout  ? *options.timeout
                            : parsed.timeout ? *parsed.timeout
                                             : knob_default<std::chrono::milliseconds>("NCCLKIT_STORE_TIMEOUT"));
  if (timeout.count() <= 0) {
    throw ConfigError("make_store('" + url + "'): the timeout must be positive, got " + format_seconds(timeout));
  }

  if (parsed.scheme == InitUrlScheme::kFile) {
    auto store =
        std::make_shared<FileStore>(parsed.path, FileStoreOptions{.world_size = world.world_size, .timeout = timeout});
    store->set_default_timeout(timeout);
    return store;
  }

  std::string host = parsed.host;
  int port = parsed.port;
  if (parsed.scheme == InitUrlScheme::kEnv) {
    host = world.master_addr;
    port = world.master_port;
    if (world.world_size == 1) {
      // A single process needs no address: a private server on a free loopback port.
      if (host.empty()) host = "127.0.0.1";
    } else if (host.empty() || port == 0) {
      std::string missing = host.empty() && port == 0 ? "MASTER_ADDR and MASTER_PORT"
                            : host.empty()            ? "MASTER_ADDR"
                                                      : "MASTER_PORT";
      throw ConfigError("make_store('" + url + "'): env:// needs " + missing +
                        " (the host and port of rank 0's "
                        "store server), found master_addr='" +
                        world.master_addr + "', master_port=" + std::to_string(world.master_port) + " (from " +
                        world.source + "); set " + missing +
                        " in every process's environment, or use tcp://HOST:PORT or file:///SHARED/DIR");
    }
  }
  if (port == 0 && (world.world_size > 1 || parsed.external_server)) {
    throw ConfigError("make_store('" + url + "'): port 0 lets a server pick a free port, which " +
                      (parsed.external_server ? std::string("clients of an external server")
                                              : "the other " + std::to_string(world.world_size - 1) + " ranks") +
                      " cannot know; give a fixed port, e.g. tcp://" +
                      (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":29500");
  }
  auto store = std::make_shared<TcpStore>(TcpStoreOptions{.host = host,
                                                          .port = port,
                                                          .is_server = world.rank == 0 && !parsed.external_server,
                                                          .timeout = timeout,
                                                          .token = options.token});
  store->set_default_timeout(timeout);
  return store;
}

}  // namespace ncclkit
