#pragma once
// Text helpers shared by the tests (checks on error messages, program output and files written).

#include <fstream>  // std::ifstream
#include <sstream>  // std::stringstream
#include <string>   // std::string

namespace ncclkit_test {

/// Whether `text` contains `part`.
inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// The file's text; empty when it cannot be read.
inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace ncclkit_test
