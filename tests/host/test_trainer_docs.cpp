// docs/trainer.md's code blocks that copy a source file (a comment line
// `<!-- verbatim: examples/digits/train.hpp -->` before the block) are that file's lines,
// contiguous and unchanged: the example a user reads is the one the demo and the tests compile.
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include <filesystem>  // std::filesystem::path
#include <fstream>     // std::ifstream
#include <sstream>     // std::stringstream
#include <string>      // std::string
#include <vector>      // std::vector

namespace trainer_docs {

std::filesystem::path root() { return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path(); }

std::vector<std::string> lines_of(const std::filesystem::path& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool contains_run(const std::vector<std::string>& file, const std::vector<std::string>& block) {
  for (std::size_t i = 0; i + block.size() <= file.size(); ++i) {
    std::size_t k = 0;
    while (k < block.size() && file[i + k] == block[k]) ++k;
    if (k == block.size()) return true;
  }
  return false;
}

}  // namespace trainer_docs

TEST_CASE("docs/trainer.md's verbatim blocks are the lines of the files they name") {
  using namespace trainer_docs;
  const auto doc = lines_of(root() / "docs" / "trainer.md");
  const std::string marker = "<!-- verbatim: ";
  int blocks = 0;
  for (std::size_t i = 0; i < doc.size(); ++i) {
    if (doc[i].rfind(marker, 0) != 0) continue;
    const std::string file = doc[i].substr(marker.size(), doc[i].find(" -->") - marker.size());
    REQUIRE(i + 1 < doc.size());
    REQUIRE(doc[i + 1].rfind("```", 0) == 0);
    std::vector<std::string> block;
    for (std::size_t k = i + 2; k < doc.size() && doc[k].rfind("```", 0) != 0; ++k) block.push_back(doc[k]);
    CAPTURE(file);
    CHECK(block.size() > 5);
    CHECK(contains_run(lines_of(root() / file), block));
    ++blocks;
  }
  CHECK(blocks >= 1);
}
