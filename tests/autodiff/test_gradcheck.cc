// test_gradcheck.cc — one table of finite-difference gradient checks, one row per gradient rule
// case; rows live in gradcheck_<family>.inc (one per rule family) and are all run here.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "autodiff/gradient.h"
#include "gradcheck.h"
#include "runtime/session.h"

using namespace onyx;
using namespace onyx::gradcheck;
using autodiff::attr_f;
using autodiff::attr_i;
using autodiff::attr_ints;
using autodiff::attr_s;

static const std::vector<Case>& all_cases() {
  static const std::vector<Case> cases = {
#include "gradcheck_elementwise.inc"
#include "gradcheck_matmul.inc"
#include "gradcheck_shape.inc"
#include "gradcheck_nn.inc"
#include "gradcheck_loss.inc"
#include "gradcheck_attention.inc"
  };
  return cases;
}

namespace {

struct Built {
  std::shared_ptr<ir::Graph> forward;  // node + loss, loss is the only output
  std::vector<std::string> params;     // differentiable inputs (initializers)
};

Built build(const Case& c, std::mt19937& rng) {
  auto g = std::make_shared<ir::Graph>();
  g->name = c.name;
  g->opsets[""] = c.opset;
  if (!c.domain.empty()) g->opsets[c.domain] = 1;
  Built b;
  ir::Node n;
  n.name = "op";
  n.op_type = c.op;
  n.domain = c.domain;
  n.attrs = c.attrs;
  for (size_t i = 0; i < c.inputs.size(); i++) {
    const In& in = c.inputs[i];
    if (in.absent) {
      n.inputs.push_back("");
      continue;
    }
    std::string name = cat("x", i);
    Tensor t;
    if (in.fixed.defined()) {
      t = in.fixed.clone();
    } else {
      t = Tensor(DType::Float32, in.shape);
      std::uniform_real_distribution<float> u(in.lo, in.hi);
      for (int64_t k = 0; k < t.numel(); k++) {
        float v;
        do v = u(rng);
        while (std::fabs(v) < in.min_abs);
        t.data<float>()[k] = v;
      }
    }
    g->add_initializer(name, t);
    n.inputs.push_back(name);
    if (in.diff) b.params.push_back(name);
  }
  for (int o = 0; o < c.num_outputs; o++) n.outputs.push_back(cat("y", o));
  g->nodes.push_back(n);
  // Output metas, to weight each float output.
  runtime::Session probe(std::make_shared<ir::Graph>([&] {
    ir::Graph p = *g;
    for (int o = 0; o < c.num_outputs; o++) {
      ir::ValueInfo vi;
      vi.name = cat("y", o);
      p.outputs.push_back(vi);
    }
    return p;
  }()));
  auto outs = probe.run({});
  std::vector<std::string> terms;
  for (int o = 0; o < c.num_outputs; o++) {
    bool use = c.loss_outputs.empty()
                   ? true
                   : std::find(c.loss_outputs.begin(), c.loss_outputs.end(), o) != c.loss_outputs.end();
    const Tensor& y = outs.at(cat("y", o));
    if (!use || y.dtype() != DType::Float32) continue;
    Tensor w(DType::Float32, y.shape());
    std::uniform_real_distribution<float> u(-1, 1);
    for (int64_t k = 0; k < w.numel(); k++) w.data<float>()[k] = u(rng);
    g->add_initializer(cat("w", o), w);
    ir::Node m;
    m.name = cat("mul", o);
    m.op_type = "Mul";
    m.inputs = {cat("y", o), cat("w", o)};
    m.outputs = {cat("yw", o)};
    ir::Node r;
    r.name = cat("sum", o);
    r.op_type = "ReduceSum";
    r.inputs = {cat("yw", o)};
    r.outputs = {cat("s", o)};
    r.attrs["keepdims"] = attr_i(0);
    g->nodes.push_back(m);
    g->nodes.push_back(r);
    terms.push_back(cat("s", o));
  }
  ir::Node total;
  total.name = "total";
  total.op_type = "Sum";
  total.inputs = terms;
  total.outputs = {"loss"};
  g->nodes.push_back(total);
  ir::ValueInfo lo;
  lo.name = "loss";
  lo.dtype = DType::Float32;
  g->outputs.push_back(lo);
  b.forward = g;
  return b;
}

double loss_of(const ir::Graph& g) {
  runtime::Session s(std::make_shared<ir::Graph>(g));
  return s.run({}).at("loss").get_as_double(0);
}

}  // namespace

class GradCheck : public ::testing::TestWithParam<Case> {};

TEST_P(GradCheck, MatchesFiniteDifferences) {
  const Case& c = GetParam();
  std::mt19937 rng(1234);
  Built b = build(c, rng);
  autodiff::GradientOptions opts;
  opts.trainable = b.params;
  auto tg = autodiff::build_training_graph(*b.forward, {}, opts);
  runtime::Session s(tg.graph, std::set<std::string>(b.params.begin(), b.params.end()));
  auto res = s.run({});
  ASSERT_EQ(tg.gradients.size(), b.params.size());
  for (auto& [param, gname] : tg.gradients) {
    const Tensor& grad = res.at(gname);
    Tensor& x = b.forward->initializers.at(param);
    ASSERT_EQ(grad.shape(), x.shape()) << c.name << ": gradient of " << param;
    int64_t n = x.numel();
    int64_t stride = n > 48 ? n / 48 : 1;  // check up to ~48 elements spread over the tensor
    for (int64_t k = 0; k < n; k += stride) {
      float orig = x.data<float>()[k];
      x.data<float>()[k] = orig + c.eps;
      double lp = loss_of(*b.forward);
      x.data<float>()[k] = orig - c.eps;
      double lm = loss_of(*b.forward);
      x.data<float>()[k] = orig;
      double numeric = (lp - lm) / (2.0 * c.eps);
      double analytic = grad.get_as_double(k);
      EXPECT_NEAR(analytic, numeric, c.atol + c.rtol * std::fabs(numeric))
          << c.name << ": d loss / d " << param << "[" << k << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, GradCheck, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });
