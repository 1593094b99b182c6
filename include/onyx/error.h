// onyx/error.h — the one exception type onyx throws, and helpers to build messages with context.
// Every error names what and where (node, op, file, tensor); callers add context as errors travel
// up.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace onyx {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Thrown for an op, attribute value or dtype that onyx does not claim to support.
// The conformance runner counts these as "skipped" (with the reason), never as passed.
class Unsupported : public Error {
 public:
  explicit Unsupported(const std::string& what) : Error(what) {}
};

template <class... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

}  // namespace onyx

#define ONYX_CHECK(cond, ...)                                   \
  do {                                                          \
    if (!(cond)) throw ::onyx::Error(::onyx::cat(__VA_ARGS__)); \
  } while (0)

#define ONYX_UNSUPPORTED(...) throw ::onyx::Unsupported(::onyx::cat(__VA_ARGS__))
