// The knob table (ncclkit/core/knobs.hpp): every entry documented in docs/environment.md with
// its default, every NCCLKIT_ variable documented there or named in include/ and tools/
// declared in it; a bad value of each kind is a ConfigError naming the variable, the value and
// what is allowed; the environment overrides a field when set and only then. Where each knob
// is read (stores, and in child processes the knobs read once per process):
// test_knobs_readers.cpp.
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include <chrono>       // std::chrono
#include <cstdint>      // std::int64_t
#include <cstdlib>      // setenv, unsetenv, getenv
#include <filesystem>   // std::filesystem
#include <fstream>      // std::ifstream
#include <limits>       // std::numeric_limits
#include <map>          // std::map
#include <optional>     // std::optional
#include <regex>        // std::regex
#include <set>          // std::set
#include <sstream>      // std::stringstream
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "ncclkit/core/error.hpp"
#include "ncclkit/core/knobs.hpp"
#include "support/env_variable.hpp"
#include "support/text.hpp"

namespace knobs_test {

namespace fs = std::filesystem;

/// The source tree's root, from this file's place in it (tests/host/).
fs::path knob_source_root() { return fs::path(__FILE__).parent_path().parent_path().parent_path(); }

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// The rows of the "ncclkit's own" table of docs/environment.md: variable -> default column,
/// both without their backquotes.
std::map<std::string, std::string> documented_defaults() {
  const std::string doc = read_text(knob_source_root() / "docs/environment.md");
  const auto start = doc.find("## ncclkit's own");
  REQUIRE(start != std::string::npos);
  const auto end = doc.find("\n## ", start + 1);
  std::istringstream section(doc.substr(start, end - start));
  std::map<std::string, std::string> rows;
  std::string line;
  const auto unquote = [](std::string cell) {
    while (!cell.empty() && (cell.front() == ' ' || cell.front() == '`')) cell.erase(cell.begin());
    while (!cell.empty() && (cell.back() == ' ' || cell.back() == '`')) cell.pop_back();
    return cell;
  };
  while (std::getline(section, line)) {
    if (line.rfind("| `NCCLKIT_", 0) != 0) continue;
    std::vector<std::string> cells;
    std::size_t at = 1;
    for (int i = 0; i < 3; ++i) {
      const auto bar = line.find('|', at);
      cells.push_back(unquote(line.substr(at, bar - at)));
      at = bar + 1;
    }
    rows[cells[0]] = cells[2];
  }
  return rows;
}

/// A value a knob of `kind` cannot take, or "" for kText (which takes anything).
std::string bad_value_of(const ncclkit::Knob& knob) {
  switch (knob.kind) {
    case ncclkit::KnobKind::kText:
      return "";
    case ncclkit::KnobKind::kChoice:
      return "bogus";
    case ncclkit::KnobKind::kInteger:
      return knob.max == std::numeric_limits<std::int64_t>::max() ? "12x" : std::to_string(knob.max + 1);
    case ncclkit::KnobKind::kPowerOfTwo:
      return std::to_string(knob.min + 1);
    case ncclkit::KnobKind::kSwitch:
      return "yes";
    case ncclkit::KnobKind::kSeconds:
      return "0";
    case ncclkit::KnobKind::kSecondsOrZero:
      return "-1";
  }
  return "";
}

}  // namespace knobs_test

using namespace knobs_test;
using ncclkit::knob;
using ncclkit::KnobKind;
using ncclkit_test::config_error_of;
using ncclkit_test::contains;
using ncclkit_test::EnvVariable;

TEST_CASE("every knob is documented in docs/environment.md with its default, and every documented one is a knob") {
  const auto documented = documented_defaults();
  REQUIRE(documented.size() >= 20);
  std::set<std::string> declared;
  for (const ncclkit::Knob& k : ncclkit::all_knobs()) {
    CAPTURE(k.name);
    declared.insert(std::string(k.name));
    const auto row = documented.find(std::string(k.name));
    CHECK_MESSAGE(row != documented.end(), k.name << " is in core/knobs.hpp but not in docs/environment.md's table");
    if (row != documented.end()) {
      CHECK_MESSAGE(row->second == k.default_value, k.name << ": docs/environment.md says the default is '"
                                                           << row->second << "', core/knobs.hpp '" << k.default_value
                                                           << "'");
    }
    CHECK(k.name.rfind("NCCLKIT_", 0) == 0);
    CHECK_FALSE(k.doc.empty());
  }
  for (const auto& [name, default_value] : documented) {
    CHECK_MESSAGE(declared.count(name) == 1, name << " is documented in docs/environment.md but not declared in "
                                                     "core/knobs.hpp's table");
  }
  CHECK(declared.size() == ncclkit::all_knobs().size());  // no name twice
}

TEST_CASE("every NCCLKIT_ variable that include/ and tools/ name in a string is a knob, and none is read around it") {
  const fs::path root = knob_source_root();
  std::set<std::string> declared;
  for (const ncclkit::Knob& k : ncclkit::all_knobs()) declared.insert(std::string(k.name));
  const std::regex literal(R"("([^"\\\n]|\\.)*")");
  const std::regex variable(R"(NCCLKIT_[A-Z0-9_]*[A-Z0-9])");
  const std::regex around(R"((getenv|env_string|env_int|env_seconds)\(\s*"NCCLKIT_)");
  std::vector<std::string> undeclared;
  std::vector<std::string> read_around;
  std::size_t files = 0;
  for (std::string_view top : {"include", "tools"}) {
    for (const auto& entry : fs::recursive_directory_iterator(root / top)) {
      const std::string extension = entry.path().extension().string();
      if (!entry.is_regular_file() || (extension != ".hpp" && extension != ".cpp" && extension != ".cuh")) continue;
      const std::string file = fs::relative(entry.path(), root).generic_string();
      if (file == "include/ncclkit/core/knobs.hpp") continue;
      ++files;
      const std::string text = read_text(entry.path());
      if (std::regex_search(text, around)) read_around.push_back(file);
      for (auto it = std::sregex_iterator(text.begin(), text.end(), literal); it != std::sregex_iterator(); ++it) {
        const std::string quoted = it->str();
        for (auto name = std::sregex_iterator(quoted.begin(), quoted.end(), variable); name != std::sregex_iterator();
             ++name) {
          if (declared.count(name->str()) == 0) undeclared.push_back(file + ": " + name->str());
        }
      }
    }
  }
  CHECK(files > 100);
  std::string list;
  for (const auto& item : undeclared) list += "\n  " + item;
  CHECK_MESSAGE(undeclared.empty(), "not in core/knobs.hpp's table:" << list);
  list.clear();
  for (const auto& item : read_around) list += "\n  " + item;
  CHECK_MESSAGE(read_around.empty(), "reads an NCCLKIT_ variable without core/knobs.hpp:" << list);
}

TEST_CASE("a bad value of every knob is a ConfigError naming the variable, the value and what is allowed") {
  std::set<KnobKind> kinds;
  for (const ncclkit::Knob& k : ncclkit::all_knobs()) {
    const std::string bad = bad_value_of(k);
    if (bad.empty()) continue;
    CAPTURE(k.name);
    CAPTURE(bad);
    kinds.insert(k.kind);
    EnvVariable variable(k.name, bad);
    const std::string message = config_error_of([&] { ncclkit::check_knob(k); });
    CHECK(contains(message, std::string(k.name) + "='" + bad + "'"));
    CHECK(contains(message, "is not " + k.allowed()));
    CHECK(contains(message, "unset it for the default (" + std::string(k.default_value) + ")"));
  }
  CHECK(kinds.size() == 6);  // every kind but kText has a knob and a bad value

  // An empty value is unset; a good one is parsed by its kind.
  EnvVariable empty("NCCLKIT_COPY_CHUNK_KB", "");
  CHECK_FALSE(ncclkit::knob_integer(knob("NCCLKIT_COPY_CHUNK_KB")));
  EnvVariable seconds("NCCLKIT_STORE_LINGER", "0");
  CHECK(ncclkit::knob_seconds(knob("NCCLKIT_STORE_LINGER")) == std::chrono::milliseconds(0));
  EnvVariable fraction("NCCLKIT_STORE_HANDSHAKE_TIMEOUT", "2.5");
  CHECK(ncclkit::knob_seconds(knob("NCCLKIT_STORE_HANDSHAKE_TIMEOUT")) == std::chrono::milliseconds(2500));
  EnvVariable choice("NCCLKIT_GLOO_ISA", "generic");
  CHECK(ncclkit::knob_text(knob("NCCLKIT_GLOO_ISA")) == "generic");
}

TEST_CASE("the environment overrides a field when set, and only then") {
  const ncclkit::Knob& timeout = knob("NCCLKIT_STORE_TIMEOUT");
  ::unsetenv("NCCLKIT_STORE_TIMEOUT");
  CHECK(ncclkit::environment_overrides(timeout, std::chrono::milliseconds(700)) == std::chrono::milliseconds(700));
  {
    EnvVariable set("NCCLKIT_STORE_TIMEOUT", "2");
    CHECK(ncclkit::environment_overrides(timeout, std::chrono::milliseconds(700)) == std::chrono::seconds(2));
  }
  {
    EnvVariable set("NCCLKIT_GLOO_HOSTNAME", "10.0.0.1");
    CHECK(ncclkit::environment_overrides(knob("NCCLKIT_GLOO_HOSTNAME"), std::string("node7")) == "10.0.0.1");
  }
  CHECK(ncclkit::environment_overrides(knob("NCCLKIT_GLOO_HOSTNAME"), std::string("node7")) == "node7");
  {
    EnvVariable set("NCCLKIT_CHECK_POINTERS", "0");
    CHECK_FALSE(ncclkit::environment_overrides(knob("NCCLKIT_CHECK_POINTERS"), true));
  }
  {
    EnvVariable set("NCCLKIT_COPY_BLOCKS_PER_SM", "3");
    CHECK(ncclkit::environment_overrides(knob("NCCLKIT_COPY_BLOCKS_PER_SM"), 0) == 3);
  }
}
