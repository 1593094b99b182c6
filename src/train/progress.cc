// progress.cc — terminal progress bar and plain-line logging.
#include "train/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

namespace onyx::train {

Progress::Progress(int64_t total, bool disable_bar)
    : total_(total), bar_(!disable_bar && ::isatty(STDOUT_FILENO)) {}

void Progress::start(int64_t step) {
  step_ = start_step_ = step;
  t0_ = last_draw_ = std::chrono::steady_clock::now();
}

static std::string hms(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  int64_t t = (int64_t)s;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02lld:%02lld:%02lld", (long long)(t / 3600),
                (long long)(t / 60 % 60), (long long)(t % 60));
  return buf;
}

void Progress::draw() {
  double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  double rate = el > 0 ? (step_ - start_step_) / el : 0;
  double eta = rate > 0 ? (total_ - step_) / rate : NAN;
  int width = 30;
  int filled = total_ ? (int)(width * step_ / total_) : 0;
  std::string bar(filled, '#');
  bar += std::string(width - filled, '.');
  std::printf("\r%3d%%|%s| %lld/%lld [%s<%s, %.1f samples/s] loss %.4f lr %.2e ",
              total_ ? (int)(100 * step_ / total_) : 0, bar.c_str(), (long long)step_,
              (long long)total_, hms(el).c_str(), hms(eta).c_str(), el > 0 ? samples_ / el : 0.0,
              loss_, lr_);
  std::fflush(stdout);
  drawn_ = true;
}

void Progress::update(int64_t step, double loss, double lr, int64_t samples) {
  step_ = step;
  loss_ = loss;
  lr_ = lr;
  samples_ = samples;
  if (!bar_) return;
  auto now = std::chrono::steady_clock::now();
  if (std::chrono::duration<double>(now - last_draw_).count() > 0.1 || step == total_) {
    last_draw_ = now;
    draw();
  }
}

void Progress::log(const LogEntry& e) {
  bool bar = bar_ && drawn_ && !finished_;  // after finish() the bar's line is done
  if (bar) std::printf("\r\033[K");
  if (bar_) {
    // On a terminal, as Transformers' ProgressCallback prints it: floats with 4 significant
    // digits, epoch last. Through a pipe: one JSON line with every digit (log_history.jsonl has
    // them either way).
    std::string line = "{";
    char buf[64];
    for (auto& [k, v] : e.values) {
      std::snprintf(buf, sizeof buf, "%.4g", v);
      line += (line.size() > 1 ? ", '" : "'") + k + "': '" + buf + "'";
    }
    std::snprintf(buf, sizeof buf, "%.4g", e.epoch);
    line += (line.size() > 1 ? ", 'epoch': '" : "'epoch': '") + std::string(buf) + "'}";
    std::printf("%s\n", line.c_str());
  } else {
    std::printf("%s\n", e.to_json().c_str());
  }
  if (bar) draw();
  std::fflush(stdout);
}

void Progress::finish() {
  if (bar_ && drawn_ && !finished_) {
    draw();
    std::printf("\n");
  }
  finished_ = true;
  std::fflush(stdout);
}

}  // namespace onyx::train
