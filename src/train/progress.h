// train/progress.h — what a training run prints, as Transformers' Trainer does. On a terminal:
// tqdm's bar (ProgressCallback) laid out by tqdm's own rules, e.g.
//   67%|██████▋   | 1256/1876 [00:07<00:03, 171.23it/s, loss=0.4857, lr=1.3e-03]
// filling the terminal's width, with each log written above it as a dict of 4-significant-digit
// strings ({'loss': '0.4857', ..., 'epoch': '0.5'}); with disable_tqdm the same dicts without a bar
// (PrinterCallback). Through a pipe: one JSON line per log, every digit, no bar (the Python
// package: the dicts, as Transformers prints them there).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "onyx/trainer.h"

namespace onyx::train {

class Progress {
 public:
  Progress(int64_t total_steps, bool disable_bar);
  ~Progress();  // a bar still on screen gets its newline (e.g. when training threw)
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void start(int64_t step);
  void update(int64_t step, double loss, double lr, int64_t samples_seen);
  void log(const LogEntry& e);
  // Training is over: the bar shows its final state (overall rate) and stays the last line until
  // the next log (Trainer::train's summary), which is written above it, as Transformers writes
  // its train_runtime dict before closing the bar; that log ends the bar's line. Logs after that
  // are not printed on a terminal (Transformers' ProgressCallback prints only while training).
  void finish();
  // Ends the line of any bar still on screen, so that what follows starts on a line of its own.
  static void close_open_bar();

  // tqdm's pieces, exposed for tests.
  static std::string format_interval(double seconds);  // [H:]MM:SS
  // tqdm.format_meter with the default bar_format; rate <= 0 = unknown (then n/elapsed).
  static std::string format_meter(int64_t n, int64_t total, double elapsed, int ncols, double rate,
                                  const std::string& postfix, int64_t initial = 0);
  static int terminal_columns();  // stdout's width (TIOCGWINSZ), else $COLUMNS, else 80

  // Where the text goes: stdout by default. The Python package routes it to sys.stdout (so
  // Jupyter and contextlib.redirect_stdout see it), with `is_tty` from sys.stdout.isatty().
  // Process-wide; an empty `write` restores stdout.
  struct Output {
    std::function<void(const std::string&)> write;
    bool is_tty = false;
    int columns = 80;
    // Without a terminal, the logs as Transformers prints them there too (its ProgressCallback's
    // tqdm.write: 4-significant-digit dicts), not JSON lines: the Python package's notebooks,
    // pipes and redirect_stdout. The CLI keeps one JSON line per log through a pipe.
    bool dicts_without_tty = false;
  };
  static void set_output(Output out);

 private:
  enum class Bar { None, Live, Final, Closed };
  std::string line(double rate) const;  // rate <= 0: the average since start()
  double smoothed_rate() const;
  void draw(const std::string& s);
  void end_line();

  int64_t total_, step_ = 0, start_step_ = 0, last_print_step_ = 0;
  double loss_ = 0, lr_ = 0;
  bool tty_, bar_;
  Bar state_ = Bar::None;
  std::string final_line_;
  size_t last_len_ = 0;  // display width of the bar text on the line now
  // tqdm's smoothed rate: exponential moving averages (smoothing 0.3) of steps and seconds
  // between two prints.
  double ema_dn_ = 0, ema_dt_ = 0;
  int ema_calls_ = 0;
  std::chrono::steady_clock::time_point t0_, last_print_;
};

// A log as Transformers prints it on a terminal: floats as '%.4g' strings, known keys in
// Transformers' order (loss, grad_norm, learning_rate; <split>_loss, metrics, runtime, samples
// and steps per second; train_loss last), then 'epoch' when given.
std::string format_log_dict(const std::map<std::string, double>& values,
                            std::optional<double> epoch = std::nullopt);

}  // namespace onyx::train
