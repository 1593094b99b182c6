// progress.cc — tqdm's progress bar (tqdm/std.py: format_meter, format_interval, Bar, EMA) and
// Transformers' log printing (trainer_callback.py: ProgressCallback, PrinterCallback).
#include "train/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace onyx::train {
namespace {

Progress* g_open_bar = nullptr;  // the bar on screen whose line is not ended yet

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Display width of UTF-8 text whose characters are all one column wide (ASCII, block elements).
size_t disp_len(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::string disp_trim(const std::string& s, size_t cols) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i++) {
    if (((unsigned char)s[i] & 0xC0) != 0x80 && n++ == cols) return s.substr(0, i);
  }
  return s;
}

// tqdm's Bar with the UTF charset " ▏▎▍▌▋▊▉█": full blocks, one partial block, spaces.
std::string bar(double frac, int64_t n_bars) {
  static const char* const kPartial[8] = {" ", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
  frac = std::clamp(frac, 0.0, 1.0);
  const int64_t nsyms = 8;
  int64_t cells = (int64_t)(frac * (double)n_bars * (double)nsyms);
  int64_t full = cells / nsyms, part = cells % nsyms;
  std::string res;
  for (int64_t i = 0; i < full; i++) res += "█";
  if (full < n_bars) {
    res += kPartial[part];
    res += std::string(n_bars - full - 1, ' ');
  }
  return res;
}

int rank(const std::string& k) {
  if (k == "loss") return 0;
  if (k == "grad_norm") return 1;
  if (k == "learning_rate") return 2;
  for (const char* split : {"eval_", "test_", "train_"}) {
    std::string p = split;
    if (k.rfind(p, 0) != 0) continue;
    std::string s = k.substr(p.size());
    if (s == "loss") return p == "train_" ? 24 : 10;
    if (s == "runtime") return 20;
    if (s == "samples_per_second") return 21;
    if (s == "steps_per_second") return 22;
    if (s == "tokens_per_second") return 23;
    return 11;
  }
  return 30;
}

}  // namespace

std::string format_log_dict(const std::map<std::string, double>& values,
                            std::optional<double> epoch) {
  std::vector<std::pair<std::string, double>> kv(values.begin(), values.end());
  std::stable_sort(kv.begin(), kv.end(),
                   [](auto& a, auto& b) { return rank(a.first) < rank(b.first); });
  if (epoch) kv.push_back({"epoch", *epoch});
  std::string s = "{";
  for (auto& [k, v] : kv) s += (s.size() > 1 ? ", '" : "'") + k + "': '" + fmt("%.4g", v) + "'";
  return s + "}";
}

std::string Progress::format_interval(double t) {
  const char* sign = t < 0 ? "-" : "";
  long long secs = std::llabs((long long)t);  // Python's abs(int(t))
  long long mins = secs / 60, s = secs % 60, h = mins / 60, m = mins % 60;
  char buf[48];
  if (h)
    std::snprintf(buf, sizeof buf, "%s%lld:%02lld:%02lld", sign, h, m, s);
  else
    std::snprintf(buf, sizeof buf, "%s%02lld:%02lld", sign, m, s);
  return buf;
}

std::string Progress::format_meter(int64_t n, int64_t total, double elapsed, int ncols, double rate,
                                   const std::string& postfix, int64_t initial) {
  if (total && (double)n >= (double)total + 0.5) total = 0;
  std::string elapsed_str = format_interval(elapsed);
  if (!(rate > 0) && elapsed) rate = (double)(n - initial) / elapsed;
  bool known = rate > 0 || rate < 0;  // tqdm: `if rate` (a non-zero number)
  double inv_rate = known ? 1.0 / rate : 0;
  std::string rate_fmt = known && inv_rate > 1 ? fmt("%5.2f", inv_rate) + "s/it"
                         : known               ? fmt("%5.2f", rate) + "it/s"
                                               : "?it/s";
  std::string n_fmt = std::to_string(n), total_fmt = total ? std::to_string(total) : "?";
  std::string post = postfix.empty() ? "" : ", " + postfix;
  double remaining = known && total ? (double)(total - n) / rate : 0;
  std::string remaining_str = known ? format_interval(remaining) : "?";
  std::string r_bar = "| " + n_fmt + "/" + total_fmt + " [" + elapsed_str + "<" + remaining_str +
                      ", " + rate_fmt + post + "]";
  if (!total) {  // no total: no bar and no ETA, just the stats
    std::string res = n_fmt + "it [" + elapsed_str + ", " + rate_fmt + post + "]";
    return ncols ? disp_trim(res, ncols) : res;
  }
  double frac = (double)n / (double)total;
  std::string l_bar = fmt("%3.0f", frac * 100) + "%|";
  if (ncols == 0) return l_bar.substr(0, l_bar.size() - 1) + r_bar.substr(1);
  int64_t width = ncols ? std::max<int64_t>(1, ncols - (int64_t)disp_len(l_bar + r_bar)) : 10;
  std::string res = l_bar + bar(frac, width) + r_bar;
  return ncols ? disp_trim(res, ncols) : res;
}

namespace {
Progress::Output& output() {
  static Progress::Output out;
  return out;
}
void emit(const std::string& text) {
  if (output().write) return output().write(text);
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}
bool output_is_tty() { return output().write ? output().is_tty : ::isatty(STDOUT_FILENO) != 0; }
}  // namespace

int Progress::terminal_columns() {
  if (output().write) return output().columns > 0 ? output().columns : 80;
  struct winsize ws {};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS")) {
    int v = std::atoi(c);
    if (v > 0) return v;
  }
  return 80;
}

void Progress::set_output(Output out) { output() = std::move(out); }

Progress::Progress(int64_t total, bool disable_bar)
    : total_(total), tty_(output_is_tty()), bar_(!disable_bar && tty_) {}

Progress::~Progress() {
  if (state_ == Bar::Live || state_ == Bar::Final) end_line();
}

// EMA's bias correction 1 / (1 - 0.7^calls) is the same for both, so it cancels in the ratio.
double Progress::smoothed_rate() const { return ema_calls_ && ema_dt_ > 0 ? ema_dn_ / ema_dt_ : 0; }

std::string Progress::line(double rate) const {
  double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  // no postfix before the first step has a loss (tqdm shows none until set_postfix)
  std::string postfix =
      step_ > start_step_ ? fmt("loss=%.4f", loss_) + ", " + fmt("lr=%.1e", lr_) : "";
  return format_meter(step_, total_, el, terminal_columns(), rate, postfix, start_step_);
}

// tqdm's status_printer: back to the line's start, the new text, spaces over any longer old one
void Progress::draw(const std::string& s) {
  size_t len = disp_len(s);
  std::string pad(last_len_ > len ? last_len_ - len : 0, ' ');
  emit("\r" + s + pad);
  last_len_ = len;
}

void Progress::end_line() {
  emit("\n");
  state_ = Bar::Closed;
  if (g_open_bar == this) g_open_bar = nullptr;
}

void Progress::start(int64_t step) {
  step_ = start_step_ = last_print_step_ = step;
  t0_ = last_print_ = std::chrono::steady_clock::now();
  if (!bar_) return;
  if (g_open_bar && g_open_bar != this) g_open_bar->end_line();
  g_open_bar = this;
  state_ = Bar::Live;
  draw(line(0));  // tqdm displays the empty bar when it is created
}

void Progress::update(int64_t step, double loss, double lr, int64_t /*samples*/) {
  step_ = step;
  loss_ = loss;
  lr_ = lr;
  if (!bar_ || state_ != Bar::Live) return;
  auto now = std::chrono::steady_clock::now();
  double dt = std::chrono::duration<double>(now - last_print_).count();
  if (dt < 0.1 && step != total_) return;  // tqdm's mininterval
  int64_t dn = step - last_print_step_;
  if (dt > 0 && dn > 0) {  // tqdm's EMA (smoothing 0.3) of the steps and time between prints
    ema_dn_ = 0.3 * (double)dn + 0.7 * ema_dn_;
    ema_dt_ = 0.3 * dt + 0.7 * ema_dt_;
    ema_calls_++;
  }
  last_print_ = now;
  last_print_step_ = step;
  draw(line(smoothed_rate()));
}

void Progress::log(const LogEntry& e) {
  if (!tty_) {  // through a pipe: every digit, one JSON line (log_history.jsonl has the same)
    emit((output().dicts_without_tty ? format_log_dict(e.values, e.epoch) : e.to_json()) + "\n");
    return;
  }
  if (!bar_) {  // disable_tqdm: PrinterCallback's print(logs)
    emit(format_log_dict(e.values, e.epoch) + "\n");
    return;
  }
  if (state_ != Bar::Live && state_ != Bar::Final) return;  // training is over
  // tqdm.write: clear the bar, print the line, redraw the bar below it
  emit("\r\033[K" + format_log_dict(e.values, e.epoch) + "\n");
  last_len_ = 0;
  if (state_ == Bar::Final) {
    draw(final_line_);
    end_line();
  } else {
    draw(line(smoothed_rate()));
  }
}

void Progress::finish() {
  if (!bar_ || state_ != Bar::Live) return;
  final_line_ = line(0);  // tqdm.close(): the overall average rate, not the smoothed one
  draw(final_line_);
  state_ = Bar::Final;
}

void Progress::close_open_bar() {
  if (g_open_bar) g_open_bar->end_line();
}

}  // namespace onyx::train
