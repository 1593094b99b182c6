// tests/kernels/test_dropout_add.cc — onyx.DropoutAdd (kernels/dropout/dropout_add.cc) and its
// gradient rule (autodiff/gradients/dropout_add.cc). Hand-written tests: the fused op must equal
// the Dropout kernel followed by Add bit for bit (output and mask; sizes that are and are not
// multiples of the 32-element Philox group; ratios 0.1 / 0.5 / absent; training and inference runs;
// training_mode absent or false), whatever the thread count; the training graph's gradients equal
// the unfused graph's bit for bit and finite differences for a fixed run seed; bad shapes name the
// node.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "autodiff/gradient.h"
#include "runtime/parallel.h"
#include "runtime/session.h"

using namespace onyx;
using onyx::runtime::run_node;

namespace {

Tensor random_tensor(const Shape& s, uint32_t seed) {
  Tensor t(DType::Float32, s);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); i++) t.data<float>()[i] = u(rng);
  return t;
}

Tensor bool_scalar(bool v) { return Tensor::from_vector<uint8_t>(DType::Bool, {}, {(uint8_t)v}); }

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

runtime::RunOptions run_opts(bool training, uint64_t seed) {
  runtime::RunOptions ro;
  ro.training = training;
  ro.seed = seed;
  return ro;
}

// Dropout named "drop" with output "d" (its rng identity), then Add(d, r); and the fused node.
std::vector<Tensor> unfused(const Tensor& y, const Tensor& r, const Tensor& ratio,
                            const Tensor& training, const runtime::RunOptions& ro) {
  ir::Node d;
  d.name = "drop";
  d.op_type = "Dropout";
  d.inputs = {"y", ratio.defined() ? "ratio" : "", training.defined() ? "training" : ""};
  d.outputs = {"d", "mask"};
  auto dm = run_node(d, 14, {y, ratio, training}, ro);
  ir::Node a;
  a.name = "add";
  a.op_type = "Add";
  a.inputs = {"d", "r"};
  a.outputs = {"out"};
  return {run_node(a, 14, {dm[0], r}, ro)[0], dm[1]};
}

ir::Node fused_node() {
  ir::Node f;
  f.name = "dropout_add";
  f.op_type = "DropoutAdd";
  f.domain = "onyx";
  f.inputs = {"y", "r", "ratio", "training"};
  f.outputs = {"out", "mask"};
  f.attrs["rng_key"] = autodiff::attr_s("d");
  return f;
}

}  // namespace

TEST(DropoutAdd, EqualsDropoutThenAddBitForBit) {
  for (Shape s : {Shape{4, 5}, Shape{3, 37, 11}, Shape{2, 64, 32}, Shape{1, 1, 1}}) {
    Tensor y = random_tensor(s, 1), r = random_tensor(s, 2);
    for (float ratio : {0.1f, 0.5f, -1.0f}) {  // -1: ratio absent (Dropout's default 0.5)
      for (int tmode : {1, 0, -1}) {           // -1: training_mode absent (inert)
        for (bool training_run : {true, false}) {
          for (uint64_t seed : {0ull, 7ull}) {
            Tensor rt = ratio >= 0 ? Tensor::scalar_f32(ratio) : Tensor();
            Tensor tt = tmode >= 0 ? bool_scalar(tmode == 1) : Tensor();
            auto ro = run_opts(training_run, seed);
            auto want = unfused(y, r, rt, tt, ro);
            auto got = run_node(fused_node(), 14, {y, r, rt, tt}, ro);
            std::string what = cat(shape_str(s), " ratio ", ratio, " training_mode ", tmode,
                                   " run ", training_run, " seed ", seed);
            EXPECT_TRUE(same_bits(got[0], want[0])) << what << ": output";
            EXPECT_TRUE(same_bits(got[1], want[1])) << what << ": mask";
          }
        }
      }
    }
  }
}

TEST(DropoutAdd, SameBitsForAnyThreadCountAndSeedsDiffer) {
  Shape s{5, 129, 67};
  Tensor y = random_tensor(s, 3), r = random_tensor(s, 4);
  Tensor rt = Tensor::scalar_f32(0.1f), tt = bool_scalar(true);
  int saved = runtime::num_threads();
  std::vector<std::vector<Tensor>> outs;
  for (int t : {1, 2, 3}) {
    runtime::set_num_threads(t);
    outs.push_back(run_node(fused_node(), 14, {y, r, rt, tt}, run_opts(true, 11)));
  }
  auto other = run_node(fused_node(), 14, {y, r, rt, tt}, run_opts(true, 12));
  runtime::set_num_threads(saved);
  for (size_t i = 1; i < outs.size(); i++) {
    EXPECT_TRUE(same_bits(outs[i][0], outs[0][0]));
    EXPECT_TRUE(same_bits(outs[i][1], outs[0][1]));
  }
  EXPECT_FALSE(same_bits(other[1], outs[0][1]));
  int64_t dropped = 0;
  for (int64_t i = 0; i < outs[0][1].numel(); i++) dropped += !outs[0][1].data<bool>()[i];
  EXPECT_NEAR((double)dropped / outs[0][1].numel(), 0.1, 0.005);
}

TEST(DropoutAdd, BadShapesNameTheNode) {
  Tensor y = random_tensor({2, 3}, 1), r = random_tensor({3}, 2);
  try {
    run_node(fused_node(), 14, {y, r, Tensor::scalar_f32(0.1f), bool_scalar(true)});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dropout_add"), std::string::npos) << e.what();
  }
}

namespace {

// loss = ReduceSum((Dropout(y) + r) * W) as one DropoutAdd (fused) or Dropout + Add; y, r
// trainable.
std::shared_ptr<ir::Graph> loss_graph(bool fused, const Tensor& y, const Tensor& r, const Tensor& W,
                                      float ratio) {
  auto g = std::make_shared<ir::Graph>();
  g->opsets[""] = 14;
  g->add_initializer("y", y);
  g->add_initializer("r", r);
  g->add_initializer("W", W);
  g->add_initializer("ratio", Tensor::scalar_f32(ratio));
  g->add_initializer("training", bool_scalar(true));
  if (fused) {
    ir::Node f = fused_node();
    f.outputs = {"out"};
    g->nodes.push_back(f);
  } else {
    ir::Node d;
    d.name = "drop", d.op_type = "Dropout", d.inputs = {"y", "ratio", "training"},
    d.outputs = {"d"};
    ir::Node a;
    a.name = "add", a.op_type = "Add", a.inputs = {"r", "d"}, a.outputs = {"out"};
    g->nodes.push_back(d);
    g->nodes.push_back(a);
  }
  ir::Node mul, sum;
  mul.name = "mul", mul.op_type = "Mul", mul.inputs = {"out", "W"}, mul.outputs = {"ow"};
  sum.name = "sum", sum.op_type = "ReduceSum", sum.inputs = {"ow"}, sum.outputs = {"loss"};
  sum.attrs["keepdims"] = autodiff::attr_i(0);
  g->nodes.push_back(mul);
  g->nodes.push_back(sum);
  ir::ValueInfo lo;
  lo.name = "loss";
  lo.dtype = DType::Float32;
  g->outputs.push_back(lo);
  return g;
}

}  // namespace

TEST(DropoutAdd, GradientEqualsUnfusedAndFiniteDifferences) {
  Shape s{3, 7, 5};
  Tensor y = random_tensor(s, 5), r = random_tensor(s, 6), W = random_tensor(s, 7);
  auto ro = run_opts(true, 31);
  std::map<std::string, Tensor> grads[2];
  double loss[2];
  std::shared_ptr<ir::Graph> fg;
  for (int fused = 0; fused < 2; fused++) {
    auto g = loss_graph(fused, y, r, W, 0.3f);
    if (fused) fg = g;
    autodiff::GradientOptions opts;
    opts.trainable = {"y", "r"};
    auto tg = autodiff::build_training_graph(*g, {}, opts);
    if (fused) {
      int n = 0;
      for (auto& nd : tg.graph->nodes) n += nd.op_type == "DropoutGrad";
      EXPECT_EQ(n, 1) << "dy = onyx.DropoutGrad(dout, mask, ratio, training_mode)";
    }
    runtime::Session sess(tg.graph, {"y", "r"});
    auto res = sess.run({}, ro);
    loss[fused] = res.at("loss").get_as_double(0);
    for (auto& [p, gname] : tg.gradients) grads[fused][p] = res.at(gname);
  }
  EXPECT_EQ(loss[0], loss[1]);
  for (const char* p : {"y", "r"}) EXPECT_TRUE(same_bits(grads[0].at(p), grads[1].at(p))) << p;
  EXPECT_TRUE(same_bits(grads[1].at("r"), W)) << "dresidual = dout";
  // finite differences of the fused graph, mask fixed by the run seed
  runtime::Session fs(fg, {"y", "r"});
  for (const char* p : {"y", "r"}) {
    Tensor x = fg->initializers.at(p);
    for (int64_t k = 0; k < x.numel(); k += 7) {
      const float eps = 1e-2f;
      Tensor xp = x.clone(), xm = x.clone();
      xp.data<float>()[k] += eps;
      xm.data<float>()[k] -= eps;
      double numeric = (fs.run({{p, xp}}, ro).at("loss").get_as_double(0) -
                        fs.run({{p, xm}}, ro).at("loss").get_as_double(0)) /
                       (2.0 * eps);
      EXPECT_NEAR(grads[1].at(p).get_as_double(k), numeric, 2e-3 + 1e-2 * std::fabs(numeric))
          << "d loss / d " << p << "[" << k << "]";
    }
  }
}
