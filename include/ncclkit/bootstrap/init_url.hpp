#pragma once
/// Init URLs say where the processes of a job rendezvous, and make_store() turns one into a
/// Store. Three forms are accepted:
///
///   env://                  a TcpStore at MASTER_ADDR:MASTER_PORT (WorldInfo::master_addr and
///                           master_port, which detect_world() reads), server inside rank 0
///   tcp://HOST:PORT         a TcpStore at HOST:PORT, server inside rank 0; IPv6 in brackets:
///                           tcp://[::1]:29500, tcp://[fe80::1%eth0]:29500
///   file:///ABSOLUTE/DIR    a FileStore in that folder (one host, or a folder on NFS shared by
///                           all hosts; no address needed)
///
/// each optionally followed by `?timeout=SECONDS`, the default timeout of the store's blocking
/// calls (fractions allowed). The scheme is case-insensitive; nothing is percent-decoded.

#include <chrono>       // std::chrono::milliseconds
#include <cstdint>      // std::int64_t
#include <cstdlib>      // std::strtod
#include <memory>       // std::shared_ptr, std::make_shared
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "ncclkit/bootstrap/world_info.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/error.hpp"

namespace ncclkit {

/// Which store an init URL names.
enum class InitUrlScheme { kEnv, kTcp, kFile };

/// An init URL, taken apart by parse_init_url().
struct InitUrl {
  InitUrlScheme scheme = InitUrlScheme::kEnv;
  std::string host;  ///< tcp://: host name, IPv4 or IPv6 address (without the brackets)
  int port = 0;      ///< tcp://: 0 to 65535 (0: the server picks a free port; single process only)
  std::string path;  ///< file://: the absolute folder
  std::optional<std::chrono::milliseconds> timeout;  ///< from ?timeout=SECONDS, if given
  std::string text;  ///< the URL as given, for messages
};

namespace detail {

inline constexpr const char* kInitUrlForms =
    "accepted forms: env:// (the TCP store at MASTER_ADDR:MASTER_PORT), tcp://HOST:PORT (IPv6 in "
    "brackets: tcp://[::1]:29500), file:///ABSOLUTE/DIR (a folder all ranks share; note the three "
    "slashes), each optionally followed by ?timeout=SECONDS";

[[noreturn]] inline void throw_init_url_error(std::string_view url, std::string_view problem) {
  throw ConfigError("invalid init URL '" + std::string(url) + "': " + std::string(problem) + "; " + kInitUrlForms);
}

inline bool is_hostname_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_';
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
  std::size_t start = 0;
  while (start <= query.size()) {
    std::size_t amp = query.find('&', start);
    if (amp == std::string_view::npos) amp = query.size();
    std::string_view item = query.substr(start, amp - start);
    std::size_t eq = item.find('=');
    std::string_view key = item.substr(0, eq);
    std::string_view value = eq == std::string_view::npos ? std::string_view() : item.substr(eq + 1);
    if (key != "timeout") {
      throw_init_url_error(url, "unknown option '" + std::string(item) + "' (the only option is timeout=SECONDS)");
    }
    if (out.timeout) throw_init_url_error(url, "timeout is given twice");
    std::string number(value);
    char* end = nullptr;
    const double seconds = number.empty() ? 0.0 : std::strtod(number.c_str(), &end);
    if (number.empty() || end != number.c_str() + number.size() || !(seconds > 0) || seconds > 1e9) {
      throw_init_url_error(url, "timeout='" + number + "' is not a positive number of seconds (e.g. ?timeout=30)");
    }
    out.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0));
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
    throw_init_url_error(url, "user names are not supported in a tcp:// URL (for a shared secret, set NCCLKIT_STORE_TOKEN)");
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
      detail::throw_init_url_error(url, "env:// takes no address (it reads MASTER_ADDR and MASTER_PORT); "
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
      detail::throw_init_url_error(url, "a file:// URL needs an absolute path, written with three slashes: "
                                        "file:///" + relative + " if you meant /" + relative +
                                        " (relative paths are not accepted: ranks may start in different folders)");
    }
    out.path = std::string(rest);
  } else {
    detail::throw_init_url_error(url, "unknown scheme '" + std::string(url.substr(0, separator)) + "'");
  }
  return out;
}

}  // namespace ncclkit
