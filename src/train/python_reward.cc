// train/python_reward.cc — the CLI's Python reward functions ({type: python, function:
// "module.function"}): a worker process of the configured Python interpreter imports the
// function and calls it as TRL does, f(prompts=, completions=, completion_ids=, **columns,
// trainer_state=, log_extra=, log_metric=), one JSON request and answer per batch over pipes.
// A separate process rather than an embedded interpreter: the onyx binary links no Python, any
// interpreter (a venv's) works, and a call that does not answer within `timeout` seconds is
// stopped with a message instead of hanging the run.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>

#include "onyx/error.h"
#include "train/grpo.h"

namespace onyx::train {

namespace {

// The worker: reads one JSON request per line, answers one JSON line.
const char* kWorker = R"PY(
import importlib, json, math, sys, traceback, types
answers, sys.stdout = sys.stdout, sys.stderr  # what the function prints is not an answer
sys.path.insert(0, sys.argv[1])
name = sys.argv[2]
mod, _, fn = name.rpartition(":") if ":" in name else name.rpartition(".")
try:
    func = getattr(importlib.import_module(mod), fn)
except Exception:
    print(json.dumps({"error": "cannot load %s: %s" % (name, traceback.format_exc(limit=3))}), file=answers, flush=True)
    sys.exit(0)
print(json.dumps({"ready": True}), file=answers, flush=True)
for line in sys.stdin:
    req = json.loads(line)
    rows, logged = req["rows"], {}
    kwargs = {k: [r.get(k) for r in rows] for k in rows[0] if k not in ("prompt", "completion", "completion_ids")}
    kwargs["trainer_state"] = types.SimpleNamespace(global_step=req["global_step"])
    kwargs["log_extra"] = lambda column, values: None
    kwargs["log_metric"] = lambda key, value: logged.setdefault(key, []).append(float(value))
    try:
        out = func(prompts=[r["prompt"] for r in rows], completions=req["completions"],
                   completion_ids=req["completion_ids"], **kwargs)
        rewards = [None if r is None else float(r) for r in out]
        rewards = [None if r is None or math.isnan(r) else r for r in rewards]
        print(json.dumps({"rewards": rewards, "logged": logged}), file=answers, flush=True)
    except Exception:
        print(json.dumps({"error": traceback.format_exc(limit=5)}), file=answers, flush=True)
)PY";

class PythonReward : public RewardFunction {
 public:
  PythonReward(std::string name, std::string function, std::string python, std::string dir,
               double timeout)
      : name_(std::move(name)),
        function_(std::move(function)),
        python_(std::move(python)),
        dir_(std::move(dir)),
        timeout_(timeout) {}
  ~PythonReward() override { stop(); }
  std::string name() const override { return name_; }

  std::vector<double> score(const RewardBatch& b) override {
    if (pid_ <= 0) start();
    nlohmann::json req = {{"global_step", b.global_step}, {"completion_ids", b.completion_ids}};
    nlohmann::json rows = nlohmann::json::array(), completions = nlohmann::json::array();
    for (size_t c = 0; c < b.completions.size(); c++) {
      const int64_t r = b.prompt_rows[c];
      rows.push_back(b.prompts->row(r));
      if (b.prompts->conversational(r))
        completions.push_back(
            nlohmann::json::array({{{"role", "assistant"}, {"content", b.completions[c]}}}));
      else
        completions.push_back(b.completions[c]);
    }
    req["rows"] = rows;
    req["completions"] = completions;
    write_line(req.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    nlohmann::json ans = read_answer();
    ONYX_CHECK(!ans.contains("error"), "reward ", name_, " (", function_, ") raised:\n",
               ans.value("error", ""));
    ONYX_CHECK(ans.contains("rewards") && ans["rewards"].is_array(), "reward ", name_,
               ": the worker answered ", ans.dump());
    std::vector<double> out;
    for (auto& v : ans["rewards"]) out.push_back(v.is_null() ? NAN : v.get<double>());
    if (b.logged && ans.contains("logged"))
      for (auto& [k, vs] : ans["logged"].items())
        for (auto& v : vs) (*b.logged)[k].push_back(v.get<double>());
    return out;
  }

 private:
  void start() {
    int in[2], out[2];
    ONYX_CHECK(pipe(in) == 0 && pipe(out) == 0, "reward ", name_, ": pipe: ", std::strerror(errno));
    pid_ = fork();
    ONYX_CHECK(pid_ >= 0, "reward ", name_, ": fork: ", std::strerror(errno));
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[1]);
      close(out[0]);
      execlp(python_.c_str(), python_.c_str(), "-c", kWorker, dir_.c_str(), function_.c_str(),
             (char*)nullptr);
      std::fprintf(stderr, "onyx: reward %s: cannot run '%s': %s\n", name_.c_str(), python_.c_str(),
                   std::strerror(errno));
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = in[1];
    from_ = out[0];
    signal(SIGPIPE, SIG_IGN);  // a worker that died is reported from the read, not a signal
    nlohmann::json hello = read_answer();
    ONYX_CHECK(!hello.contains("error"), "reward ", name_, ": ", hello.value("error", ""));
  }

  void stop() {
    if (pid_ <= 0) return;
    close(to_);
    close(from_);
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  void write_line(const std::string& s) {
    std::string line = s + "\n";
    size_t done = 0;
    while (done < line.size()) {
      ssize_t n = write(to_, line.data() + done, line.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        stop();
        throw Error(cat("reward ", name_, ": the Python worker (", python_, ") is not running"));
      }
      done += (size_t)n;
    }
  }

  // One answer line, within timeout_ seconds.
  nlohmann::json read_answer() {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds((int64_t)(timeout_ * 1000));
    for (;;) {
      const size_t nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        try {
          return nlohmann::json::parse(line);  // the worker's stdout carries answers only
        } catch (const std::exception&) {
          stop();
          throw Error(cat("reward ", name_, ": the Python worker wrote '", line.substr(0, 200),
                          "', not an answer"));
        }
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) {
        stop();
        throw Error(cat("reward ", name_, " (", function_, ") did not answer within ", timeout_,
                        " s (the reward function's `timeout`); stopped it"));
      }
      pollfd p{from_, POLLIN, 0};
      const int r = poll(&p, 1, (int)std::min<int64_t>(left, 1000));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) continue;
      char chunk[65536];
      const ssize_t n = read(from_, chunk, sizeof chunk);
      if (n <= 0) {
        stop();
        throw Error(cat("reward ", name_, ": the Python worker (", python_, " ", function_,
                        ") exited without answering"));
      }
      buffer_.append(chunk, (size_t)n);
    }
  }

  std::string name_, function_, python_, dir_;
  double timeout_;
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  std::string buffer_;
};

}  // namespace

std::shared_ptr<RewardFunction> python_reward(const nlohmann::json& spec, const std::string& dir,
                                              const std::string& what) {
  ONYX_CHECK(spec.contains("function") && spec["function"].is_string(), what,
             ": reward python needs 'function' (\"module.function\" or \"module:function\", the "
             "module found beside the config)");
  const std::string function = spec["function"];
  const size_t dot = function.find_last_of(":.");
  ONYX_CHECK(dot != std::string::npos && dot > 0 && dot + 1 < function.size(), what,
             ": reward python 'function' must name a module and a function, got '", function, "'");
  const std::string python = spec.value("python", std::string("python3"));
  double timeout = 600;
  if (spec.contains("timeout")) {
    ONYX_CHECK(spec["timeout"].is_number() && spec["timeout"].get<double>() > 0, what,
               ": reward python 'timeout' must be a positive number of seconds");
    timeout = spec["timeout"].get<double>();
  }
  const std::string name = spec.value("name", function.substr(dot + 1));
  return std::make_shared<PythonReward>(name, function, python, dir, timeout);
}

}  // namespace onyx::train
