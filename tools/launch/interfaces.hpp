#pragma once
/// Network interfaces as --check sees them: what this host has (getifaddrs), which one NCCL's
/// socket transport and bootstrap would pick, and which one the kernel routes through to reach
/// a given address. A mismatch between the last two is the classic cause of a multi-node job
/// that hangs at start-up; NCCL_SOCKET_IFNAME is the fix.
///
/// NCCL's choice is modelled on its documented rules: NCCL_SOCKET_IFNAME is a comma-separated
/// list of name prefixes ("eth,ib"), "=" in front means exact names ("=eth0"), "^" means
/// "all but these" ("^docker,lo"); unset, NCCL takes InfiniBand (ib*) interfaces first, then
/// any other one except docker* and lo, and falls back to docker* and then lo only when
/// nothing else exists.

#include <arpa/inet.h>   // inet_ntop, inet_pton
#include <ifaddrs.h>     // getifaddrs, freeifaddrs
#include <net/if.h>      // IFF_UP, IFF_LOOPBACK, IFF_RUNNING
#include <netinet/in.h>  // sockaddr_in, sockaddr_in6
#include <sys/socket.h>  // socket, connect, getsockname
#include <unistd.h>      // close

#include <algorithm>  // std::find
#include <optional>   // std::optional
#include <sstream>    // std::istringstream
#include <string>     // std::string
#include <vector>     // std::vector

#include "ncclkit/store/detail/socket.hpp"

namespace ncclkit::launch {

/// One address of one interface.
struct InterfaceAddress {
  std::string name;     ///< "eth0"
  std::string address;  ///< numeric, "10.0.0.5" or "fd00::5"
  int family = AF_INET;
  bool up = false;
  bool loopback = false;
};

/// Every IPv4 and IPv6 address of this host's interfaces, IPv6 link-local ones left out (they
/// need a scope to be used, and NCCL skips them too). In getifaddrs() order.
inline std::vector<InterfaceAddress> list_interfaces() {
  std::vector<InterfaceAddress> result;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return result;
  for (ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr) continue;
    const int family = entry->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char text[INET6_ADDRSTRLEN] = "";
    if (family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(entry->ifa_addr)->sin_addr, text, sizeof text);
    } else {
      const auto* v6 = reinterpret_cast<const sockaddr_in6*>(entry->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&v6->sin6_addr)) continue;
      ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
    }
    result.push_back(InterfaceAddress{entry->ifa_name, text, family, (entry->ifa_flags & IFF_UP) != 0,
                                      (entry->ifa_flags & IFF_LOOPBACK) != 0});
  }
  ::freeifaddrs(list);
  return result;
}

/// Whether interface `name` matches NCCL_SOCKET_IFNAME-style `spec` (see the header comment).
inline bool nccl_ifname_matches(const std::string& spec, const std::string& name) {
  std::string list = spec;
  bool exclude = false, exact = false;
  if (!list.empty() && list[0] == '^') {
    exclude = true;
    list.erase(0, 1);
  }
  if (!list.empty() && list[0] == '=') {
    exact = true;
    list.erase(0, 1);
  }
  bool listed = false;
  std::istringstream items(list);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    if (exact ? name == item : name.rfind(item, 0) == 0) listed = true;
  }
  return exclude ? !listed : listed;
}

/// The interface addresses NCCL would consider, best first, for NCCL_SOCKET_IFNAME = `spec`
/// (nullopt: unset). Only interfaces that are up; IPv4 before IPv6 within one interface.
inline std::vector<InterfaceAddress> nccl_interface_candidates(const std::vector<InterfaceAddress>& interfaces,
                                                               const std::optional<std::string>& spec) {
  // Interfaces in order of first appearance, each one's IPv4 addresses before its IPv6 ones.
  std::vector<std::string> names;
  for (const auto& i : interfaces)
    if (i.up && std::find(names.begin(), names.end(), i.name) == names.end()) names.push_back(i.name);
  std::vector<InterfaceAddress> up;
  for (const auto& name : names) {
    for (int family : {AF_INET, AF_INET6})
      for (const auto& i : interfaces)
        if (i.up && i.name == name && i.family == family) up.push_back(i);
  }
  std::vector<InterfaceAddress> chosen;
  auto take = [&](auto&& predicate) {
    for (const auto& i : up)
      if (predicate(i)) chosen.push_back(i);
  };
  if (spec) {
    take([&](const InterfaceAddress& i) { return nccl_ifname_matches(*spec, i.name); });
    return chosen;
  }
  take([](const InterfaceAddress& i) { return i.name.rfind("ib", 0) == 0; });
  if (chosen.empty()) {
    take([](const InterfaceAddress& i) {
      return i.name.rfind("docker", 0) != 0 && i.name.rfind("lo", 0) != 0 && !i.loopback;
    });
  }
  if (chosen.empty()) take([](const InterfaceAddress& i) { return i.name.rfind("docker", 0) == 0; });
  if (chosen.empty()) take([](const InterfaceAddress& i) { return i.loopback || i.name.rfind("lo", 0) == 0; });
  return chosen;
}

/// The local address the kernel would use to reach `peer` (a numeric address), found with a
/// UDP connect (no packet is sent); nullopt when there is no route.
inline std::optional<std::string> route_source_address(const std::string& peer) {
  sockaddr_storage target{};
  socklen_t length = 0;
  int family = AF_INET;
  if (::inet_pton(AF_INET, peer.c_str(), &reinterpret_cast<sockaddr_in&>(target).sin_addr) == 1) {
    auto& v4 = reinterpret_cast<sockaddr_in&>(target);
    v4.sin_family = AF_INET;
    v4.sin_port = htons(9);
    length = sizeof(sockaddr_in);
  } else if (::inet_pton(AF_INET6, peer.c_str(), &reinterpret_cast<sockaddr_in6&>(target).sin6_addr) == 1) {
    auto& v6 = reinterpret_cast<sockaddr_in6&>(target);
    v6.sin6_family = AF_INET6;
    v6.sin6_port = htons(9);
    family = AF_INET6;
    length = sizeof(sockaddr_in6);
  } else {
    return std::nullopt;
  }
  ncclkit::detail::Socket socket(::socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!socket || ::connect(socket.get(), reinterpret_cast<const sockaddr*>(&target), length) != 0) return std::nullopt;
  sockaddr_storage local{};
  socklen_t local_length = sizeof local;
  if (::getsockname(socket.get(), reinterpret_cast<sockaddr*>(&local), &local_length) != 0) return std::nullopt;
  std::string text = ncclkit::detail::format_sockaddr(local);
  text.resize(text.rfind(':'));
  if (!text.empty() && text.front() == '[') text = text.substr(1, text.size() - 2);
  return text;
}

/// The interface that holds `address` ("" when none of this host's does).
inline std::string interface_of(const std::vector<InterfaceAddress>& interfaces, const std::string& address) {
  for (const auto& i : interfaces)
    if (i.address == address) return i.name;
  return "";
}

/// The numeric addresses `host` resolves to (host name or numeric address); empty when it
/// does not resolve.
inline std::vector<std::string> resolve_host(const std::string& host) {
  std::vector<std::string> addresses;
  try {
    for (const auto& a : ncclkit::detail::resolve_addresses(host, 1, false)) {
      const std::string text = a.numeric_host();
      if (std::find(addresses.begin(), addresses.end(), text) == addresses.end()) addresses.push_back(text);
    }
  } catch (const Error&) {
  }
  return addresses;
}

/// Whether a numeric address is a loopback one (127.0.0.0/8 or ::1).
inline bool is_loopback_address(const std::string& address) {
  return address.rfind("127.", 0) == 0 || address == "::1";
}

}  // namespace ncclkit::launch
