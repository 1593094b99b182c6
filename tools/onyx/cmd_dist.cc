// cmd_dist.cc — data-parallel helpers: `onyx launch --nproc N [--hostfile F] CONFIG [...]`
// starts `onyx train` under mpirun with the settings a user would otherwise have to know (one
// thread pool per rank sized to its share of the cores, binding, running as root in a container),
// and `onyx consolidate CHECKPOINT [--output DIR]` turns a ZeRO checkpoint's per-rank optimizer
// shards into the single optimizer.safetensors of a one-process checkpoint.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>

#include "commands.h"
#include "io/safetensors.h"
#include "onyx/error.h"
#include "train/data_parallel.h"

namespace fs = std::filesystem;

namespace onyx::cli {

Action add_launch_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "launch", "train data parallel: `onyx train CONFIG` on N ranks under mpirun (OpenMPI)");
  auto nproc = std::make_shared<int>(2);
  auto hostfile = std::make_shared<std::string>();
  auto threads = std::make_shared<int>(0);
  auto dry = std::make_shared<bool>(false);
  auto config = std::make_shared<std::string>();
  cmd->add_option("--nproc", *nproc, "ranks (processes) in all")->check(CLI::PositiveNumber);
  cmd->add_option("--hostfile", *hostfile, "OpenMPI hostfile (one 'HOST slots=K' per line)");
  cmd->add_option("--threads-per-rank", *threads,
                  "kernel threads per rank (default: this host's cores / ranks on it)");
  cmd->add_flag("--dry-run", *dry, "print the mpirun command instead of running it");
  cmd->add_option("config", *config, "config file, as for `onyx train`")->required();
  cmd->allow_extras();
  cmd->footer(
      "Everything after CONFIG goes to `onyx train` (--key value overrides). Without --hostfile "
      "every rank runs on this host. Slurm: `srun -n N onyx train CONFIG` works directly (PMIx).");
  return [=]() {
    int cores = (int)std::max(1u, std::thread::hardware_concurrency());
    int per_host = hostfile->empty() ? *nproc : 1;  // a hostfile's slots place the ranks
    int t = *threads > 0 ? *threads : std::max(1, cores / std::max(1, per_host));
    std::vector<std::string> argv = {"mpirun", "-np", std::to_string(*nproc)};
    if (!hostfile->empty()) {
      ONYX_CHECK(fs::exists(*hostfile), "--hostfile '", *hostfile, "' does not exist");
      argv.insert(argv.end(), {"--hostfile", *hostfile});
    }
    // Bind each rank to its own cores when they fit on this host, else let the OS place them.
    if (hostfile->empty() && t * *nproc <= cores)
      argv.insert(argv.end(), {"--map-by", cat("slot:PE=", t), "--bind-to", "core"});
    else
      argv.insert(argv.end(), {"--bind-to", "none", "--oversubscribe"});
    argv.insert(argv.end(), {"-x", cat("OMP_NUM_THREADS=", t)});
    char self[4096];
    ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    ONYX_CHECK(n > 0, "cannot find the onyx executable (/proc/self/exe)");
    self[n] = 0;
    argv.insert(argv.end(), {self, "train", *config});
    for (auto& e : cmd->remaining()) argv.push_back(e);
    if (::geteuid() == 0) {  // OpenMPI refuses root unless told twice
      ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
      ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    }
    // Containers often forbid the cross-memory-attach single-copy path of the shared-memory BTL.
    ::setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
    if (*dry) {
      for (size_t i = 0; i < argv.size(); i++) std::cout << (i ? " " : "") << argv[i];
      std::cout << "\n";
      return 0;
    }
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    ::execvp("mpirun", cargv.data());
    throw Error(cat("cannot run mpirun (", std::strerror(errno),
                    "); install OpenMPI (Debian: openmpi-bin)"));
  };
}

Action add_consolidate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "consolidate", "merge a ZeRO checkpoint's optimizer shards into one optimizer.safetensors");
  auto ckpt = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  cmd->add_option("checkpoint", *ckpt, "a checkpoint-N folder")->required();
  cmd->add_option("--output", *output,
                  "write the single-process checkpoint here (default: in place)");
  return [=]() {
    fs::path src(*ckpt);
    ONYX_CHECK(fs::is_directory(src), "'", *ckpt, "' is not a checkpoint folder");
    std::vector<fs::path> shards;
    for (auto& e : fs::directory_iterator(src)) {
      std::string n = e.path().filename().string();
      if (n.rfind("optimizer-", 0) == 0 && e.path().extension() == ".safetensors")
        shards.push_back(e.path());
    }
    ONYX_CHECK(!shards.empty() || fs::exists(src / "optimizer.safetensors"), "'", *ckpt,
               "' has no optimizer state");
    if (shards.empty()) {
      std::cout << "'" << *ckpt << "' already holds one optimizer.safetensors\n";
      if (!output->empty() && fs::path(*output) != src)
        fs::copy(src, *output, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
      return 0;
    }
    auto first = io::load_safetensors(shards.front().string());
    auto it = first.metadata.find("numel");
    ONYX_CHECK(it != first.metadata.end(), "'", shards.front().string(),
               "' has no 'numel' metadata (not an onyx optimizer shard)");
    int64_t numel = std::stoll(it->second);
    // Everything is read (and checked) before anything is written.
    auto state = train::load_optimizer_range(src.string(), 0, numel, numel);
    std::map<std::string, std::string> meta = {
        {"begin", "0"}, {"end", std::to_string(numel)}, {"numel", std::to_string(numel)}};
    if (first.metadata.count("optimizer")) meta["optimizer"] = first.metadata.at("optimizer");
    fs::path dst = output->empty() ? src : fs::path(*output);
    if (dst != src) {
      fs::create_directories(dst);
      for (auto& e : fs::directory_iterator(src)) {
        std::string n = e.path().filename().string();
        if (n.rfind("optimizer-", 0) == 0) continue;
        fs::copy(e.path(), dst / n,
                 fs::copy_options::recursive | fs::copy_options::overwrite_existing);
      }
    }
    io::save_safetensors((dst / "optimizer.safetensors").string(), state, meta);
    if (dst == src)
      for (auto& s : shards) fs::remove(s);
    std::cout << "merged " << shards.size() << " optimizer shards (" << numel << " elements) into "
              << (dst / "optimizer.safetensors").string() << "\n";
    return 0;
  };
}

}  // namespace onyx::cli
