#pragma once
// Environment variables set for a scope, and the message of a ConfigError a call throws: what
// the tests of the knobs (ncclkit/core/knobs.hpp) and of their readers share.

#include <cstdlib>      // setenv, unsetenv, getenv
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "ncclkit/core/error.hpp"

namespace ncclkit_test {

/// Sets a variable for the lifetime of the object, restoring what was there (or unsetting it).
class EnvVariable {
 public:
  EnvVariable(std::string_view name, const std::string& value) : name_(name) {
    if (const char* before = std::getenv(name_.c_str())) before_ = before;
    ::setenv(name_.c_str(), value.c_str(), 1);
  }
  ~EnvVariable() {
    if (before_) {
      ::setenv(name_.c_str(), before_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  EnvVariable(const EnvVariable&) = delete;
  EnvVariable& operator=(const EnvVariable&) = delete;

 private:
  std::string name_;
  std::optional<std::string> before_;
};

/// The message of the ConfigError `call` throws, or "" when it throws none.
template <class Call>
std::string config_error_of(Call&& call) {
  try {
    call();
  } catch (const ncclkit::ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace ncclkit_test
