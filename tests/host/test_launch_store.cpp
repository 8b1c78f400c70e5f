// The launchers' store (tools/launch/launcher_store.hpp): the warning for a store that other
// hosts can reach without a token, and that the coordinator gives it when it starts.
#include <doctest/doctest.h>

#include <memory>  // std::make_unique, std::make_shared
#include <string>  // std::string
#include <vector>  // std::vector

#include "launch/launcher_store.hpp"
#include "launch/store_coordinator.hpp"
#include "support/text.hpp"

using ncclkit::TcpStore;
using ncclkit::TcpStoreServer;
using ncclkit::launch::store_token_warning;

namespace {

using ncclkit_test::contains;

/// What a StoreCoordinator over `server` reports when it starts.
std::vector<std::string> reports_at_start(std::unique_ptr<TcpStoreServer> server, const std::string& token) {
  std::vector<std::string> messages;
  auto store = std::make_shared<TcpStore>(ncclkit::TcpStoreOptions{
      .host = "127.0.0.1", .port = server->port(), .timeout = std::chrono::seconds(5), .token = token});
  ncclkit::launch::StoreCoordinatorOptions options{.report = [&](const std::string& m) { messages.push_back(m); }};
  { ncclkit::launch::StoreCoordinator coordinator(store, options, std::move(server)); }
  return messages;
}

}  // namespace

TEST_CASE("a store on every address without a token is warned about, naming NCCLKIT_STORE_TOKEN") {
  TcpStoreServer open_server({.host = "", .token = ""});
  auto warning = store_token_warning(open_server);
  REQUIRE(warning.has_value());
  CHECK(contains(*warning, "without a token"));
  CHECK(contains(*warning, ":" + std::to_string(open_server.port()) + " (every address of this host)"));
  CHECK(contains(*warning, "Set NCCLKIT_STORE_TOKEN to the same secret on every node"));

  // A token, or loopback only: nothing to say.
  CHECK_FALSE(store_token_warning(TcpStoreServer({.host = "", .token = "secret"})).has_value());
  CHECK_FALSE(store_token_warning(TcpStoreServer({.host = "127.0.0.1", .token = ""})).has_value());
}

TEST_CASE("ncclkit-run's coordinator reports an unguarded store when it starts, and only then") {
  auto unguarded =
      reports_at_start(std::make_unique<TcpStoreServer>(ncclkit::TcpStoreServerOptions{.host = "", .token = ""}), "");
  REQUIRE_FALSE(unguarded.empty());
  CHECK(contains(unguarded.front(), "warning: the launchers' store listens on "));
  CHECK(contains(unguarded.front(), "NCCLKIT_STORE_TOKEN"));

  auto guarded = reports_at_start(
      std::make_unique<TcpStoreServer>(ncclkit::TcpStoreServerOptions{.host = "", .token = "secret"}), "secret");
  for (const auto& message : guarded) CHECK_FALSE(contains(message, "without a token"));
}
