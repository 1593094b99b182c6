// main.cc — the `onyx` command line: dispatches to one file per subcommand. Every onyx::Error
// becomes "onyx: error: ..." on stderr and exit status 1; nothing is left half-written.
#include <malloc.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <new>

#include "commands.h"
#include "dist/comm.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/simd/dispatch.h"
#include "onyx/custom_ops.h"
#include "onyx/error.h"
#include "onyx_git_commit.h"  // generated at build time (cmake/git_commit.cmake)
#include "runtime/parallel.h"

#ifndef ONYX_VERSION
#define ONYX_VERSION "unknown"
#endif

// `onyx --version`: "onyx 0.1.0 (commit 1a2b3c4d5e6f, GCC 12.2.0)", then the kernels' SIMD path:
// "cpu path avx512 (compiled: avx512 avx2 portable; this CPU: ...); bf16 conversions ...".
static std::string version_text() {
  std::string s = std::string("onyx ") + ONYX_VERSION + " (";
  if (*ONYX_GIT_COMMIT) s += std::string("commit ") + ONYX_GIT_COMMIT + ", ";
#if defined(__clang__)
  s += "clang " __clang_version__;
#elif defined(__GNUC__)
  s += "GCC " __VERSION__;
#else
  s += "unknown compiler";
#endif
  return s + ")\n" + onyx::simd::describe();
}

int main(int argc, char** argv) {
  // Allocations of 2 MiB and more are mmapped and go back to the system when freed. glibc's
  // default raises that threshold after each large free (up to 32 MiB), so once the model file's
  // protobuf copy is gone every tensor below 32 MiB comes from a heap that never shrinks:
  // bert-base's peak RSS measured 2.90 GiB with the default, 2.25 GiB with a 1 MiB threshold
  // (planned 2.17). 2 MiB, not 1: oneDNN's plain-layout GEMMs (gemm:jit, e.g. onyx.MatMul4Bit's
  // tiles) malloc their 1.0-1.4 MiB packing buffers on every call, which at 1 MiB were mmapped and
  // page-faulted each time (a sixth of a QLoRA step in the kernel); and a free heap top is kept up
  // to 16 MiB (glibc trims above 128 KiB once the threshold is set) so those buffers are reused.
  // Measured (bench/train_bench.py bert-base, onyx only, 3 steps; the 1B QLoRA shape of
  // bench/qlora_bench.py, 3 steps): 1 MiB 2267 MiB peak RSS, 1.32 s/step, QLoRA 20.2 s;
  // 2 MiB + 16 MiB trim 2268 MiB, 1.24 s/step, QLoRA 18.7 s; 4 MiB + 32 MiB 2477 MiB, 1.24 s/step.
  mallopt(M_MMAP_THRESHOLD, 2 << 20);
  mallopt(M_TRIM_THRESHOLD, 16 << 20);
  CLI::App app{"onyx — a C++ training runtime for transformer models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text(),
                       "print the version, git commit, compiler and SIMD path");
  int threads = 0;
  app.add_option("--threads", threads, "threads for kernels and BLAS (default: all cores)");
  std::vector<std::string> custom_op_libs;
  app.add_option("--custom-ops", custom_op_libs,
                 "shared libraries of custom ops to load (LIB[,LIB]; include/onyx/custom_op.h)")
      ->delimiter(',');
  std::map<CLI::App*, onyx::cli::Action> actions;
  auto add = [&](onyx::cli::Action (*f)(CLI::App&)) {
    size_t before = app.get_subcommands({}).size();
    auto action = f(app);
    actions[app.get_subcommands({})[before]] = action;
  };
  add(onyx::cli::add_run_command);
  add(onyx::cli::add_info_command);
  add(onyx::cli::add_conformance_command);
  add(onyx::cli::add_grad_command);
  add(onyx::cli::add_train_command);
  add(onyx::cli::add_evaluate_command);
  add(onyx::cli::add_predict_command);
  add(onyx::cli::add_export_command);
  add(onyx::cli::add_plan_command);
  add(onyx::cli::add_ops_command);
  add(onyx::cli::add_plot_command);
  add(onyx::cli::add_check_command);
  add(onyx::cli::add_launch_command);
  add(onyx::cli::add_consolidate_command);
  add(onyx::cli::add_chat_template_command);
  add(onyx::cli::add_generate_command);
  add(onyx::cli::add_whisper_features_command);
  add(onyx::cli::add_sample_command);
  add(onyx::cli::add_batch_command);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // Under mpirun: join the job first (it sizes each rank's thread pool; --threads overrides).
  if (onyx::dist::launched_by_mpi()) {
    try {
      onyx::dist::world();
    } catch (const onyx::Error& e) {
      std::cerr << "onyx: error: " << e.what() << "\n";
      return 1;
    }
  }
  if (threads > 0) onyx::runtime::set_num_threads(threads);
  // An error on one rank of a data-parallel job ends every rank at once (naming this one).
  auto fail = [](const char* what) {
    if (onyx::dist::launched_by_mpi() && onyx::dist::world().size() > 1)
      onyx::dist::world().abort(what);
    std::cerr << "onyx: error: " << what << "\n";
    return 1;
  };
  try {
    onyx::kernels::check_gemm_environment();  // a bad ONYX_GEMM / ONYX_PREPACK: before any work
    for (auto& lib : custom_op_libs) onyx::load_custom_op_library(lib);
    for (auto& [sub, action] : actions)
      if (sub->parsed()) return action();
  } catch (const std::bad_alloc&) {
    // an allocation nothing bounded (onyx bounds what files and flags can ask for; this is the
    // model, batch or data being larger than the machine)
    return fail(
        "out of memory: an allocation failed (std::bad_alloc); lower the batch size, "
        "max_length or model size, or use a machine with more memory");
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return 0;
}
