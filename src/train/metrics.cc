// train/metrics.cc — the built-in compute_metrics (onyx::metrics, onyx/trainer.h): accuracy and
// macro F1 over the argmax of the last axis (labels -100 ignored), mean squared error, and
// by_names, which combines them (and perplexity, exp of the evaluation loss) from config names.
#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "onyx/trainer.h"

namespace onyx {

namespace metrics {
namespace {
// (N, C) argmax over last axis vs (N) labels, skipping -100.
void pairs(const EvalPrediction& p, std::vector<int64_t>& pred, std::vector<int64_t>& gold) {
  ONYX_CHECK(p.label_ids.defined(), "metrics need labels in the evaluation dataset");
  ONYX_CHECK(p.predictions.defined(),
             "accuracy and f1 need the model's predictions (set 'predictions' in the config)");
  const Tensor& x = p.predictions;
  int64_t c = x.rank() ? x.dim(-1) : 1;
  int64_t n = x.numel() / std::max<int64_t>(c, 1);
  ONYX_CHECK(p.label_ids.numel() == n, "metrics: ", n, " predictions but ", p.label_ids.numel(),
             " labels");
  for (int64_t i = 0; i < n; i++) {
    int64_t y = (int64_t)p.label_ids.get_as_double(i);
    if (y == -100) continue;
    int64_t best = 0;
    double bv = -INFINITY;
    for (int64_t k = 0; k < c; k++) {
      double v = x.get_as_double(i * c + k);
      if (v > bv) {
        bv = v;
        best = k;
      }
    }
    pred.push_back(best);
    gold.push_back(y);
  }
}
}  // namespace

Metrics accuracy(const EvalPrediction& p) {
  std::vector<int64_t> pr, g;
  pairs(p, pr, g);
  int64_t ok = 0;
  for (size_t i = 0; i < pr.size(); i++) ok += pr[i] == g[i];
  return {{"accuracy", pr.empty() ? 0.0 : (double)ok / pr.size()}};
}

Metrics f1(const EvalPrediction& p) {
  std::vector<int64_t> pr, g;
  pairs(p, pr, g);
  std::map<int64_t, std::array<int64_t, 3>> c;  // tp, fp, fn
  for (size_t i = 0; i < pr.size(); i++) {
    if (pr[i] == g[i])
      c[g[i]][0]++;
    else {
      c[pr[i]][1]++;
      c[g[i]][2]++;
    }
  }
  double sum = 0;
  for (auto& [k, v] : c) {
    double d = 2.0 * v[0] + v[1] + v[2];
    sum += d > 0 ? 2.0 * v[0] / d : 0;
  }
  return {{"f1", c.empty() ? 0.0 : sum / c.size()}};
}

Metrics mse(const EvalPrediction& p) {
  ONYX_CHECK(p.predictions.defined(),
             "mse needs the model's predictions (set 'predictions' in the config)");
  ONYX_CHECK(p.label_ids.defined() && p.label_ids.numel() == p.predictions.numel(),
             "mse: predictions and labels must have the same number of elements");
  double s = 0;
  for (int64_t i = 0; i < p.predictions.numel(); i++) {
    double d = p.predictions.get_as_double(i) - p.label_ids.get_as_double(i);
    s += d * d;
  }
  return {{"mse", p.predictions.numel() ? s / p.predictions.numel() : 0.0}};
}

ComputeMetrics by_names(const std::vector<std::string>& names) {
  for (auto& n : names)
    ONYX_CHECK(n == "accuracy" || n == "f1" || n == "mse" || n == "perplexity", "unknown metric '",
               n, "' (accuracy, f1, mse, perplexity)");
  return [names](const EvalPrediction& p) {
    Metrics m;
    for (auto& n : names) {
      Metrics r;
      if (n == "accuracy")
        r = accuracy(p);
      else if (n == "f1")
        r = f1(p);
      else if (n == "mse")
        r = mse(p);
      else if (n == "perplexity" && std::isfinite(p.loss))
        r = {{"perplexity", std::exp(std::min(p.loss, 700.0))}};
      m.insert(r.begin(), r.end());
    }
    return m;
  };
}
}  // namespace metrics

}  // namespace onyx
