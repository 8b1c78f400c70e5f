#pragma once
/// The one way durations appear in ncclkit's messages: seconds with three decimals, "1.234 s",
/// whatever the duration's type, so that a timeout and the time waited read alike.

#include <chrono>  // std::chrono::duration
#include <cstdio>  // std::snprintf
#include <string>  // std::string

#include "ncclkit/core/error.hpp"  // (stops a pre-C++20 build with one message)

namespace ncclkit {

/// "1.234 s", "0.000 s", "300.000 s". Negative durations keep their sign.
template <class Rep, class Period>
std::string format_seconds(std::chrono::duration<Rep, Period> duration) {
  char text[48];
  std::snprintf(text, sizeof text, "%.3f s", std::chrono::duration<double>(duration).count());
  return text;
}

}  // namespace ncclkit
