// cmd_plot.cc — `onyx plot OUTPUT_DIR [--output FILE.png]`: training curves from a run's
// log_history.jsonl (Transformers' keys) drawn into one PNG with Cairo: train and eval loss vs
// step, learning rate vs step, grad norm vs step, GRPO's reward (and each reward function's
// mean) vs step, and one panel per other eval_ metric. Each panel
// has a title, axes with tick labels and a legend. The PNG is written atomically; on an error
// (missing folder or log, nothing to plot) no file is written.
#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "commands.h"
#include "io/safetensors.h"
#include "onyx/error.h"

namespace fs = std::filesystem;

namespace onyx::cli {
namespace {

struct Series {
  std::string label;
  std::vector<std::pair<double, double>> pts;  // (step, value), finite values only
  double r, g, b;
  bool markers;  // eval points: few, so drawn as dots too
};

struct Panel {
  std::string title;
  std::vector<Series> series;
  bool empty() const {
    for (auto& s : series)
      if (!s.pts.empty()) return false;
    return true;
  }
};

// Timing keys are not metrics worth a panel.
bool is_timing(const std::string& k) {
  static const std::set<std::string> t = {"eval_runtime", "eval_samples_per_second",
                                          "eval_steps_per_second"};
  return t.count(k) > 0;
}

std::vector<Panel> read_panels(const std::string& log_path) {
  std::ifstream f(log_path);
  ONYX_CHECK(f.good(), "plot: cannot open '", log_path, "'");
  Series train{"train loss", {}, 0.12, 0.47, 0.71, false};
  Series eval{"eval loss", {}, 1.0, 0.5, 0.05, true};
  Series lr{"learning rate", {}, 0.17, 0.63, 0.17, false};
  Series gn{"grad norm", {}, 0.58, 0.40, 0.74, false};
  std::map<std::string, Series> metrics, rewards;
  std::string line;
  int lineno = 0;
  while (std::getline(f, line)) {
    lineno++;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(cat("plot: '", log_path, "' line ", lineno, " is not JSON: ", e.what()));
    }
    ONYX_CHECK(j.is_object(), "plot: '", log_path, "' line ", lineno, " is not a JSON object");
    if (!j.contains("step") || !j["step"].is_number()) continue;
    double step = j["step"].get<double>();
    for (auto& [k, v] : j.items()) {
      if (!v.is_number()) continue;
      double x = v.get<double>();
      if (!std::isfinite(x)) continue;
      if (k == "loss")
        train.pts.push_back({step, x});
      else if (k == "eval_loss")
        eval.pts.push_back({step, x});
      else if (k == "learning_rate")
        lr.pts.push_back({step, x});
      else if (k == "grad_norm")
        gn.pts.push_back({step, x});
      else if (k == "reward" || (k.rfind("rewards/", 0) == 0 && k.size() > 5 &&
                                 k.compare(k.size() - 5, 5, "/mean") == 0)) {
        // GRPO: the mean reward and each reward function's, in one panel
        auto it = rewards.find(k);
        if (it == rewards.end()) {
          const double shade = 0.15 + 0.2 * (double)(rewards.size() % 4);
          it = rewards.emplace(k, Series{k, {}, 0.1, 0.55 - shade / 2, 0.2 + shade, false}).first;
        }
        it->second.pts.push_back({step, x});
      } else if (k.rfind("eval_", 0) == 0 && !is_timing(k)) {
        auto it = metrics.find(k);
        if (it == metrics.end())
          it = metrics.emplace(k, Series{k, {}, 0.84, 0.15, 0.16, true}).first;
        it->second.pts.push_back({step, x});
      }
    }
  }
  std::vector<Panel> panels;
  auto add = [&](Panel p) {
    if (!p.empty()) panels.push_back(std::move(p));
  };
  add({"loss", {train, eval}});
  add({"learning rate", {lr}});
  add({"grad norm", {gn}});
  if (!rewards.empty()) {
    Panel p{"reward", {}};
    for (auto& [k, s] : rewards) p.series.push_back(s);
    add(std::move(p));
  }
  for (auto& [k, s] : metrics) add({k, {s}});
  return panels;
}

// 1-2-5 tick spacing giving about `n` ticks over [lo, hi].
double nice_step(double span, int n) {
  double raw = span / n;
  double p = std::pow(10.0, std::floor(std::log10(raw)));
  double m = raw / p;
  return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

std::string tick_label(double v, double step) {
  if (std::fabs(v) < step * 1e-6) v = 0;
  char buf[32];
  double a = std::fabs(v);
  if (a != 0 && (a < 1e-3 || a >= 1e6))
    std::snprintf(buf, sizeof buf, "%.3g", v);
  else
    std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

void expand(double& lo, double& hi) {
  if (hi > lo) return;
  double d = std::fabs(lo) > 0 ? std::fabs(lo) * 0.05 : 1.0;
  lo -= d;
  hi += d;
}

void text_at(cairo_t* cr, const std::string& s, double x, double y, double ax, double ay) {
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  cairo_move_to(cr, x - e.x_bearing - ax * e.width, y - e.y_bearing - ay * e.height);
  cairo_show_text(cr, s.c_str());
}

void draw_panel(cairo_t* cr, const Panel& p, double x0, double y0, double w, double h) {
  const double left = x0 + 78, right = x0 + w - 20, top = y0 + 40, bottom = y0 + h - 50;
  double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
  for (auto& s : p.series)
    for (auto& [x, y] : s.pts) {
      xlo = std::min(xlo, x), xhi = std::max(xhi, x);
      ylo = std::min(ylo, y), yhi = std::max(yhi, y);
    }
  expand(xlo, xhi);
  double xpad = (xhi - xlo) * 0.02, ypad = (yhi - ylo) * 0.05;  // end points and dots stay inside
  xlo -= xpad, xhi += xpad;
  ylo -= ypad, yhi += ypad;
  expand(ylo, yhi);
  auto X = [&](double v) { return left + (v - xlo) / (xhi - xlo) * (right - left); };
  auto Y = [&](double v) { return bottom - (v - ylo) / (yhi - ylo) * (bottom - top); };

  cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
  cairo_set_font_size(cr, 15);
  cairo_set_source_rgb(cr, 0, 0, 0);
  text_at(cr, p.title, (left + right) / 2, y0 + 12, 0.5, 0);

  // grid and ticks
  cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, 11);
  cairo_set_line_width(cr, 1);
  double xs = nice_step(xhi - xlo, 6), ys = nice_step(yhi - ylo, 5);
  for (double t = std::ceil(xlo / xs) * xs; t <= xhi + xs * 1e-9; t += xs) {
    double px = std::round(X(t)) + 0.5;
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, px, top), cairo_line_to(cr, px, bottom), cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_move_to(cr, px, bottom), cairo_line_to(cr, px, bottom + 5), cairo_stroke(cr);
    text_at(cr, tick_label(t, xs), px, bottom + 8, 0.5, 0);
  }
  for (double t = std::ceil(ylo / ys) * ys; t <= yhi + ys * 1e-9; t += ys) {
    double py = std::round(Y(t)) + 0.5;
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, left, py), cairo_line_to(cr, right, py), cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_move_to(cr, left - 5, py), cairo_line_to(cr, left, py), cairo_stroke(cr);
    text_at(cr, tick_label(t, ys), left - 8, py, 1, 0.5);
  }
  cairo_set_source_rgb(cr, 0, 0, 0);
  cairo_rectangle(cr, left + 0.5, top + 0.5, right - left, bottom - top);
  cairo_stroke(cr);
  cairo_set_font_size(cr, 12);
  text_at(cr, "step", (left + right) / 2, bottom + 28, 0.5, 0);

  // data
  cairo_save(cr);
  cairo_rectangle(cr, left, top, right - left, bottom - top);
  cairo_clip(cr);
  for (auto& s : p.series) {
    if (s.pts.empty()) continue;
    cairo_set_source_rgb(cr, s.r, s.g, s.b);
    cairo_set_line_width(cr, 2);
    for (size_t i = 0; i < s.pts.size(); i++) {
      if (i == 0)
        cairo_move_to(cr, X(s.pts[i].first), Y(s.pts[i].second));
      else
        cairo_line_to(cr, X(s.pts[i].first), Y(s.pts[i].second));
    }
    cairo_stroke(cr);
    if (s.markers || s.pts.size() == 1)
      for (auto& [x, y] : s.pts) {
        cairo_arc(cr, X(x), Y(y), 3.5, 0, 2 * M_PI);
        cairo_fill(cr);
      }
  }
  cairo_restore(cr);

  // legend (top right, inside the axes, on a white box over the curves)
  cairo_set_font_size(cr, 11);
  double widest = 0;
  int shown = 0;
  for (auto& s : p.series) {
    if (s.pts.empty()) continue;
    cairo_text_extents_t e;
    cairo_text_extents(cr, s.label.c_str(), &e);
    widest = std::max(widest, e.width);
    shown++;
  }
  // the corner whose box covers the fewest curve samples (top right on ties)
  const double bw = widest + 44, bh = 18.0 * shown + 6;
  const double corners[4][2] = {{right - 4 - bw, top + 4},
                                {left + 4, top + 4},
                                {right - 4 - bw, bottom - 4 - bh},
                                {left + 4, bottom - 4 - bh}};
  int best = 0;
  long best_hits = -1;
  for (int c = 0; c < 4; c++) {
    long hits = 0;
    auto inside = [&](double px, double py) {
      return px >= corners[c][0] - 4 && px <= corners[c][0] + bw + 4 && py >= corners[c][1] - 4 &&
             py <= corners[c][1] + bh + 4;
    };
    for (auto& s : p.series)
      for (size_t i = 0; i < s.pts.size(); i++) {
        double x1 = X(s.pts[i].first), y1 = Y(s.pts[i].second);
        double x0 = i ? X(s.pts[i - 1].first) : x1, y0 = i ? Y(s.pts[i - 1].second) : y1;
        for (int k = 0; k <= 16; k++)
          hits += inside(x0 + (x1 - x0) * k / 16, y0 + (y1 - y0) * k / 16);
      }
    if (best_hits < 0 || hits < best_hits) best = c, best_hits = hits;
  }
  const double bx = corners[best][0], by = corners[best][1];
  cairo_rectangle(cr, bx, by, bw, bh);
  cairo_set_source_rgba(cr, 1, 1, 1, 0.85);
  cairo_fill_preserve(cr);
  cairo_set_source_rgb(cr, 0.8, 0.8, 0.8);
  cairo_set_line_width(cr, 1);
  cairo_stroke(cr);
  double ly = by + 4;
  for (auto& s : p.series) {
    if (s.pts.empty()) continue;
    double lx = bx + 36;
    cairo_set_source_rgb(cr, s.r, s.g, s.b);
    cairo_set_line_width(cr, 2);
    cairo_move_to(cr, lx - 28, ly + 6), cairo_line_to(cr, lx - 6, ly + 6), cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    text_at(cr, s.label, lx, ly + 6, 0, 0.5);
    ly += 18;
  }
}

cairo_status_t append_png(void* closure, const unsigned char* data, unsigned int n) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), n);
  return CAIRO_STATUS_SUCCESS;
}

std::string render_png(const std::vector<Panel>& panels) {
  const int pw = 560, ph = 380;
  const int cols = panels.size() == 1 ? 1 : 2;
  const int rows = (int)(panels.size() + cols - 1) / cols;
  cairo_surface_t* surf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, cols * pw, rows * ph);
  cairo_t* cr = cairo_create(surf);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  for (size_t i = 0; i < panels.size(); i++)
    draw_panel(cr, panels[i], (double)(i % cols) * pw, (double)(i / cols) * ph, pw, ph);
  std::string png;
  cairo_status_t st = cairo_status(cr);
  cairo_destroy(cr);
  if (st == CAIRO_STATUS_SUCCESS) st = cairo_surface_write_to_png_stream(surf, append_png, &png);
  cairo_surface_destroy(surf);
  ONYX_CHECK(st == CAIRO_STATUS_SUCCESS, "plot: cairo failed: ", cairo_status_to_string(st));
  return png;
}

}  // namespace

Action add_plot_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("plot", "draw loss, learning rate and eval metrics of a run into a PNG");
  auto dir = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  cmd->add_option("output_dir", *dir, "a training output_dir (reads its log_history.jsonl)")
      ->required();
  cmd->add_option("--output", *output, "PNG file (default: OUTPUT_DIR/training_curves.png)");
  return [dir, output]() {
    ONYX_CHECK(fs::is_directory(*dir), "plot: folder '", *dir, "' does not exist");
    std::string log = (fs::path(*dir) / "log_history.jsonl").string();
    ONYX_CHECK(fs::is_regular_file(log), "plot: '", log,
               "' does not exist (written by onyx train)");
    auto panels = read_panels(log);
    ONYX_CHECK(
        !panels.empty(), "plot: '", log,
        "' has no entries to plot (no loss, learning_rate, grad_norm or eval_ values with a step)");
    std::string out = output->empty() ? (fs::path(*dir) / "training_curves.png").string() : *output;
    fs::path parent = fs::path(out).parent_path();
    ONYX_CHECK(parent.empty() || fs::is_directory(parent), "plot: the folder of '", out,
               "' does not exist");
    io::write_file_atomic(out, render_png(panels));
    std::cout << "wrote " << out << " (" << panels.size() << " panel"
              << (panels.size() == 1 ? "" : "s") << ")\n";
    return 0;
  };
}

}  // namespace onyx::cli
