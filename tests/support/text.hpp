#pragma once
// Text helpers shared by the tests (checks on error messages and program output).

#include <string>  // std::string

namespace ncclkit_test {

/// Whether `text` contains `part`.
inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace ncclkit_test
