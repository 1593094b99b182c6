// onyx/custom_ops.h — loading custom-op libraries (the C ABI is onyx/custom_op.h).
//
// The CLI calls load_custom_op_library for `--custom-ops LIB[,LIB]` and the config key
// `custom_op_libraries`; the Python package's onyx.load_custom_ops(path) calls it too. A library's
// ops become kernels (and, when it gives one, gradient rules) of the process-wide registries, so
// every later model load, plan, run and training graph sees them. Load libraries before models
// run: the registries are not locked against lookups from a run in another thread.
#pragma once
#include <string>
#include <vector>

#include "onyx/custom_op.h"

namespace onyx {

struct CustomOpInfo {
  std::string domain, name;  // "com.example", "ScaledSwish"
  std::string library;   // the path it was loaded from (or the origin given to register_custom_ops)
  std::string gradient;  // "kernel <domain>.<op>", "rules for inputs 0, 1", or "" (none)
};

// dlopens `path`, calls its onyx_register_custom_ops and registers the ops it declares, all or
// none. Loading the same file again is a no-op (returns no ops). Throws onyx::Error naming the
// library and the problem: missing file, not a loadable library, no onyx_register_custom_ops,
// a custom-op API version this onyx does not implement, an invalid op, an op already registered.
std::vector<CustomOpInfo> load_custom_op_library(const std::string& path);

// The same for an entry point linked into the program (no dlopen); `origin` names it in messages.
std::vector<CustomOpInfo> register_custom_ops(OnyxRegisterCustomOpsFn entry,
                                              const std::string& origin);

// Every custom op registered so far, in registration order.
std::vector<CustomOpInfo> custom_ops();

}  // namespace onyx
