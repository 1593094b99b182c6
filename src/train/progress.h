// train/progress.h — what a training run prints: a progress bar on a terminal (steps, loss, lr,
// samples/s, ETA), or plain lines when stdout is not a terminal or with disable_tqdm. Log entries
// are printed as one JSON-like line each, as Transformers does.
#pragma once
#include <chrono>
#include <cstdint>

#include "onyx/trainer.h"

namespace onyx::train {

class Progress {
 public:
  Progress(int64_t total_steps, bool disable_bar);
  void start(int64_t step);
  void update(int64_t step, double loss, double lr, int64_t samples_seen);
  void log(const LogEntry& e);
  void finish();

 private:
  void draw();
  int64_t total_, step_ = 0, start_step_ = 0, samples_ = 0;
  double loss_ = 0, lr_ = 0;
  bool bar_;
  bool drawn_ = false;
  bool finished_ = false;  // finish() ran: later log lines print without redrawing the bar
  std::chrono::steady_clock::time_point t0_, last_draw_;
};

}  // namespace onyx::train
