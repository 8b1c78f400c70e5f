// The floors of docs/dev/architecture.md, enforced: every #include of ncclkit's own headers (and
// of tools/ or bench/ headers) in include/, bench/, tools/ and examples/ is checked against the
// table below; a break names the file, the line and the rule. The rules are the doc's, as data.
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include <algorithm>    // std::find, std::sort
#include <filesystem>   // std::filesystem::recursive_directory_iterator
#include <fstream>      // std::ifstream
#include <optional>     // std::optional
#include <regex>        // std::regex
#include <sstream>      // std::istringstream
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

namespace architecture_test {

namespace fs = std::filesystem;

/// One floor and the floors it may include (itself included where listed). "entry" is the
/// top-level entry headers (ncclkit/*.hpp but version.hpp), which only programs and other entry
/// headers may include.
struct FloorRule {
  std::string_view floor;
  std::vector<std::string_view> may_include;
  std::string_view why;
};

const std::vector<FloorRule>& floor_rules() {
  static const std::vector<FloorRule> rules{
      {"core", {"core"}, "core is the ground floor: it includes nothing of ncclkit above it"},
      {"store", {"core", "store"}, "stores stand on core alone"},
      {"bootstrap", {"core", "store", "bootstrap"}, "bootstrap stands on core and store"},
      {"nccl",
       {"core", "store", "bootstrap", "nccl"},
       "a backend never includes the other backend or the generic floors"},
      {"gloo",
       {"core", "store", "bootstrap", "gloo"},
       "a backend never includes the other backend or the generic floors"},
      {"fusion",
       {"core", "store", "bootstrap", "fusion"},
       "fusion is generic over the Backend concept: never nccl/, gloo/ or compression/"},
      {"compression",
       {"core", "store", "bootstrap", "fusion", "compression"},
       "compression reaches backend kernels through the Backend concept, never by including nccl/ or gloo/"},
      {"trainer",
       {"core", "store", "bootstrap", "fusion", "compression", "trainer"},
       "the trainer takes its backend as a template parameter: never nccl/ or gloo/"},
      {"bench",
       {"core", "store", "bootstrap", "nccl", "gloo", "fusion", "compression", "trainer", "entry", "bench"},
       "bench/ never includes tools/: what a benchmark shares with the launcher belongs in the library"},
      {"tools",
       {"core", "store", "bootstrap", "nccl", "gloo", "fusion", "compression", "trainer", "entry", "tools"},
       "tools/ may include anything in include/, never bench/"},
      {"examples",
       {"core", "store", "bootstrap", "nccl", "gloo", "fusion", "compression", "trainer", "entry", "examples"},
       "examples include public headers only: never tools/ or bench/"},
  };
  return rules;
}

/// Includes that break a rule today, each exact (file, included header) with its reason. A line
/// whose include is gone fails the test, so the list only shrinks: delete the line then.
struct KnownBreak {
  std::string_view file;
  std::string_view header;
  std::string_view reason;
};
const std::vector<KnownBreak>& known_breaks() {
  static const std::vector<KnownBreak> breaks{};
  return breaks;
}

/// The source tree's root, from this file's place in it (tests/host/).
fs::path source_root() { return fs::path(__FILE__).parent_path().parent_path().parent_path(); }

/// The floor a file of the source tree belongs to (its path relative to the root, '/'
/// separated): "entry" for the top-level entry headers, "" for files no rule covers.
std::string floor_of_file(const std::string& path) {
  for (std::string_view top : {"bench/", "tools/", "examples/"}) {
    if (path.rfind(top, 0) == 0) return std::string(top.substr(0, top.size() - 1));
  }
  const std::string prefix = "include/ncclkit/";
  if (path.rfind(prefix, 0) != 0) return "";
  const std::string rest = path.substr(prefix.size());
  const auto slash = rest.find('/');
  if (slash == std::string::npos) return rest == "version.hpp" ? "core" : "entry";
  return rest.substr(0, slash);
}

/// The floor of an included header: `header` as written, `from` the including file's path. For
/// "ncclkit/<floor>/...": that floor; for another quoted path that names a file of tools/ or
/// bench/ (not beside the including file): "tools" or "bench"; nullopt for anything else
/// (system, CUDA, Gloo, doctest, a file beside the includer).
std::optional<std::string> floor_of_header(const std::string& header, const std::string& from, const fs::path& root) {
  if (header.rfind("ncclkit/", 0) == 0) return floor_of_file("include/" + header);
  if (fs::exists(root / fs::path(from).parent_path() / header)) return std::nullopt;
  for (std::string_view top : {"tools", "bench"}) {
    if (fs::exists(root / top / header)) return std::string(top);
  }
  return std::nullopt;
}

struct Include {
  std::string file;  // relative to the root
  int line = 0;
  std::string header;
  bool angled = false;
};

/// One rule broken, or empty: `include` checked against the table.
std::string check_include(const Include& include, const fs::path& root) {
  const std::string from = floor_of_file(include.file);
  if (from.empty() || from == "entry") return "";
  const std::optional<std::string> to = include.angled && include.header.rfind("ncclkit/", 0) != 0
                                            ? std::nullopt
                                            : floor_of_header(include.header, include.file, root);
  if (!to) return "";
  const auto rule =
      std::find_if(floor_rules().begin(), floor_rules().end(), [&](const FloorRule& r) { return r.floor == from; });
  const std::string where = include.file + ":" + std::to_string(include.line) + ": includes " + include.header;
  if (rule == floor_rules().end()) {
    return where + ", but its folder '" + from +
           "' is no floor of docs/dev/architecture.md: add it there and to the table of this test";
  }
  const auto& allowed = rule->may_include;
  if (std::find(allowed.begin(), allowed.end(), *to) == allowed.end()) {
    std::string list;
    for (auto floor : allowed) list += (list.empty() ? "" : ", ") + std::string(floor);
    return where + " (floor " + *to + "), but " + from + " may include only " + list + ": " + std::string(rule->why) +
           " (docs/dev/architecture.md)";
  }
  if (from == "examples" && include.header.find("/detail/") != std::string::npos) {
    return where + ", a detail/ header: examples include public headers only (docs/dev/architecture.md)";
  }
  return "";
}

/// Every #include in `text` (the lines that start with it), with its line number.
std::vector<Include> includes_of(const std::string& file, std::istream& text) {
  static const std::regex pattern(R"(^\s*#\s*include\s*([<"])([^">]+)[">])");
  std::vector<Include> found;
  std::string line;
  for (int number = 1; std::getline(text, line); ++number) {
    std::smatch match;
    if (std::regex_search(line, match, pattern)) found.push_back({file, number, match[2], match[1] == "<"});
  }
  return found;
}

/// The source files of the checked folders, relative to the root, sorted.
std::vector<std::string> checked_files(const fs::path& root) {
  std::vector<std::string> files;
  for (std::string_view top : {"include", "bench", "tools", "examples"}) {
    for (const auto& entry : fs::recursive_directory_iterator(root / top)) {
      const std::string extension = entry.path().extension().string();
      if (!entry.is_regular_file()) continue;
      if (extension != ".hpp" && extension != ".cuh" && extension != ".inc" && extension != ".cpp" &&
          extension != ".cu") {
        continue;
      }
      files.push_back(fs::relative(entry.path(), root).generic_string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

/// The index of `include` in known_breaks(), or its size when it is not there.
std::size_t known_break_index(const Include& include) {
  const auto& breaks = known_breaks();
  const auto found = std::find_if(breaks.begin(), breaks.end(), [&](const KnownBreak& b) {
    return b.file == include.file && b.header == include.header;
  });
  return static_cast<std::size_t>(found - breaks.begin());
}

}  // namespace architecture_test

using namespace architecture_test;

TEST_CASE("every include in include/, bench/, tools/ and examples/ keeps to the floors of docs/dev/architecture.md") {
  const fs::path root = source_root();
  REQUIRE(fs::exists(root / "docs/dev/architecture.md"));
  const std::vector<std::string> files = checked_files(root);
  REQUIRE(files.size() > 100);
  std::vector<std::string> broken;
  std::vector<bool> known_seen(known_breaks().size(), false);
  std::size_t checked = 0;
  for (const std::string& file : files) {
    std::ifstream text(root / file);
    for (const Include& include : includes_of(file, text)) {
      ++checked;
      const std::string problem = check_include(include, root);
      if (problem.empty()) continue;
      const std::size_t known = known_break_index(include);
      if (known < known_seen.size()) {
        known_seen[known] = true;
      } else {
        broken.push_back(problem);
      }
    }
  }
  CHECK(checked > 500);
  std::string report;
  for (const auto& problem : broken) report += "\n  " + problem;
  CHECK_MESSAGE(broken.empty(), broken.size() << " include(s) break the floors:" << report);
  for (std::size_t i = 0; i < known_seen.size(); ++i) {
    const KnownBreak& known = known_breaks()[i];
    CHECK_MESSAGE(known_seen[i], "the allowlist of test_architecture.cpp names "
                                     << known.file << " -> " << known.header
                                     << ", which keeps the rules now: delete that line");
  }
}

TEST_CASE("the include check names the file, line and rule of a break, and lets the allowed through") {
  const fs::path root = source_root();
  const auto check = [&](std::string file, std::string header, bool angled = false) {
    return check_include(Include{std::move(file), 7, std::move(header), angled}, root);
  };
  // Allowed: downwards, within a floor, detail headers of a lower floor, entry headers exempt.
  CHECK(check("include/ncclkit/fusion/x.hpp", "ncclkit/core/detail/poll.hpp").empty());
  CHECK(check("include/ncclkit/nccl/x.hpp", "ncclkit/bootstrap/init_url.hpp").empty());
  CHECK(check("include/ncclkit/nccl/x.hpp", "ncclkit/version.hpp").empty());
  CHECK(check("include/ncclkit/ncclkit.hpp", "ncclkit/gloo.hpp").empty());
  CHECK(check("bench/perf_nccl.cu", "perf_engine.hpp").empty());  // beside it
  CHECK(check("tools/launch/check.hpp", "ncclkit/nccl/communicator.hpp").empty());
  CHECK(check("include/ncclkit/core/x.hpp", "gloo/context.h", true).empty());  // not ncclkit's

  // Broken: upwards, sideways between backends, a generic floor on a backend, bench on tools.
  const std::string core_up = check("include/ncclkit/core/x.hpp", "ncclkit/store/store.hpp");
  CHECK(core_up.find("include/ncclkit/core/x.hpp:7: includes ncclkit/store/store.hpp") != std::string::npos);
  CHECK(core_up.find("core may include only core") != std::string::npos);
  CHECK(check("include/ncclkit/gloo/x.hpp", "ncclkit/nccl/types.hpp").find("never includes the other backend") !=
        std::string::npos);
  CHECK(check("include/ncclkit/fusion/x.hpp", "ncclkit/nccl/communicator.hpp").find("fusion may include only") !=
        std::string::npos);
  CHECK(check("include/ncclkit/fusion/x.hpp", "ncclkit/compression/codec.hpp")
            .find("never nccl/, gloo/ or compression/") != std::string::npos);
  CHECK(check("include/ncclkit/trainer/x.hpp", "ncclkit/gloo/communicator.hpp").find("template parameter") !=
        std::string::npos);
  CHECK(check("include/ncclkit/store/x.hpp", "ncclkit/store.hpp").find("(floor entry)") != std::string::npos);
  CHECK(check("bench/x.cu", "launch/options.hpp").find("bench/ never includes tools/") != std::string::npos);
  CHECK(check("include/ncclkit/nccl/x.hpp", "launch/options.hpp").find("(floor tools)") != std::string::npos);
  CHECK(check("examples/x.cpp", "ncclkit/nccl/detail/init.hpp").find("detail/ header") != std::string::npos);
  CHECK(check("include/ncclkit/sharding/x.hpp", "ncclkit/core/error.hpp").find("no floor") != std::string::npos);
}

TEST_CASE("includes are found on their lines, quoted or angled, and only in #include lines") {
  std::istringstream text(
      "// #include \"ncclkit/nccl/x.hpp\" is a comment\n"
      "#include <ncclkit/gloo.hpp>\n"
      "  #  include \"ncclkit/core/error.hpp\"  // why\n"
      "int x;\n");
  const auto found = includes_of("examples/a.cpp", text);
  REQUIRE(found.size() == 2);
  CHECK(found[0].line == 2);
  CHECK(found[0].header == "ncclkit/gloo.hpp");
  CHECK(found[0].angled);
  CHECK(found[1].line == 3);
  CHECK(found[1].header == "ncclkit/core/error.hpp");
  CHECK_FALSE(found[1].angled);
}
