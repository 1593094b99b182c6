// test_memory_plan.cc — the arena memory plan (runtime/memory_plan.h): the packer never overlaps
// two buffers whose lifetimes intersect; on real graphs (a small MLP forward and its training
// graph, and the benchmark exports (bench/make_exports.py) when present) no two live values share
// bytes, in-place and views happen where declared, results equal the unplanned run bit for bit, the
// arena is reused across runs, and graph outputs survive the next run.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

#include "../real_exports.h"
#include "autodiff/gradient.h"
#include "ir/onnx_io.h"
#include "passes/match.h"
#include "runtime/memory_plan.h"
#include "runtime/session.h"

using namespace onyx;
using autodiff::attr_i;
using autodiff::attr_ints;

namespace {

ir::Node node(const std::string& op, std::vector<std::string> in, std::vector<std::string> out,
              std::map<std::string, ir::Attribute> attrs = {}, const std::string& domain = "") {
  std::string name = op + "_" + out[0];
  return passes::make_node(op, domain, std::move(in), std::move(out), std::move(attrs), name);
}

Tensor random_tensor(Shape s, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  Tensor t(DType::Float32, std::move(s));
  for (int64_t i = 0; i < t.numel(); i++) t.data<float>()[i] = u(rng);
  return t;
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.meta() == b.meta() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

constexpr int64_t B = 3, T = 5, C = 8, H = 16;

// x (B,T,C) -> Linear(C,H) -> decomposed GELU (Div, Erf, Add, Mul, Mul) -> Relu -> Linear(H,C)
// -> + x -> Reshape (B*T, C) -> Softmax -> Tanh -> y; loss = ReduceMean(y).
std::shared_ptr<ir::Graph> mlp_graph(bool with_y_output) {
  auto g = std::make_shared<ir::Graph>();
  g->opsets[""] = 17;
  g->opsets["onyx"] = 1;
  ir::ValueInfo x;
  x.name = "x";
  x.dtype = DType::Float32;
  g->inputs.push_back(x);
  g->add_initializer("W1", random_tensor({C, H}, 1, 0.5f));
  g->add_initializer("b1", random_tensor({H}, 2, 0.5f));
  g->add_initializer("W2", random_tensor({H, C}, 3, 0.5f));
  g->add_initializer("b2", random_tensor({C}, 4, 0.5f));
  g->add_initializer("sqrt2", Tensor::scalar_f32(1.41421356f));
  g->add_initializer("one", Tensor::scalar_f32(1.0f));
  g->add_initializer("half", Tensor::scalar_f32(0.5f));
  g->add_initializer("rows", Tensor::from_vector<int64_t>(DType::Int64, {2}, {-1, C}));
  auto& n = g->nodes;
  n.push_back(node("MatMul", {"x", "W1"}, {"h0"}));
  n.push_back(node("Add", {"h0", "b1"}, {"h1"}));
  n.push_back(node("Div", {"h1", "sqrt2"}, {"g0"}));
  n.push_back(node("Erf", {"g0"}, {"g1"}));
  n.push_back(node("Add", {"g1", "one"}, {"g2"}));
  n.push_back(node("Mul", {"h1", "g2"}, {"g3"}));
  n.push_back(node("Mul", {"g3", "half"}, {"g4"}));
  n.push_back(node("Relu", {"g4"}, {"r"}));
  n.push_back(node("MatMul", {"r", "W2"}, {"o0"}));
  n.push_back(node("Add", {"o0", "b2"}, {"o1"}));
  n.push_back(node("Add", {"o1", "x"}, {"o2"}));
  n.push_back(node("Reshape", {"o2", "rows"}, {"o3"}));
  n.push_back(node("Softmax", {"o3"}, {"p"}, {{"axis", attr_i(-1)}}));
  n.push_back(node("Tanh", {"p"}, {"y"}));
  n.push_back(node("ReduceMean", {"y"}, {"loss"}, {{"keepdims", attr_i(0)}}));
  ir::ValueInfo loss;
  loss.name = "loss";
  loss.dtype = DType::Float32;
  g->outputs.push_back(loss);
  if (with_y_output) {
    ir::ValueInfo y;
    y.name = "y";
    y.dtype = DType::Float32;
    g->outputs.push_back(y);
  }
  return g;
}

// Checks every pair of arena values: overlapping bytes only when their lifetimes are disjoint
// or one took the other's bytes (a view, or a declared in-place output). Lifetimes are
// recomputed here from the graph, independently of the planner. Returns how many pairs of
// values from different groups share bytes (at different times: the arena's reuse).
int expect_no_live_overlap(const ir::Graph& g, const runtime::Plan& plan) {
  const auto& mp = plan.memory;
  const int n = (int)plan.steps.size();
  std::map<std::string, int> def, last;
  std::set<std::string> outs;
  for (auto& o : g.outputs) outs.insert(o.name);
  for (int s = 0; s < n; s++) {
    const ir::Node& nd = g.nodes[plan.steps[s].node];
    for (auto& o : nd.outputs)
      if (!o.empty()) def[o] = s, last[o] = std::max(last[o], s);
    for (auto& i : nd.inputs)
      if (!i.empty()) last[i] = s;
  }
  for (auto& o : outs) last[o] = n;
  // Groups: a value with the values whose bytes it took (union-find over alias_of/inplace_of).
  std::map<std::string, std::string> parent;
  std::function<std::string(const std::string&)> find = [&](const std::string& v) {
    auto it = parent.find(v);
    if (it == parent.end() || it->second == v) return v;
    return it->second = find(it->second);
  };
  for (auto* m : {&mp.alias_of, &mp.inplace_of})
    for (auto& [a, b] : *m) parent[find(a)] = find(b);
  std::map<std::string, std::pair<int, int>> life;  // group -> [first, last]
  for (auto& [v, off] : mp.offset) {
    auto& l = life.try_emplace(find(v), std::pair<int, int>{n + 1, -1}).first->second;
    l.first = std::min(l.first, def.at(v));
    l.second = std::max(l.second, last.at(v));
  }
  std::vector<std::tuple<std::string, size_t, size_t>> vals;  // name, offset, bytes
  for (auto& [v, off] : mp.offset) {
    const TensorMeta& m = plan.metas.at(v);
    size_t bytes = (size_t)m.numel() * dtype_size(m.dtype);
    EXPECT_LE(off + bytes, mp.arena_bytes) << v;
    EXPECT_EQ(off % runtime::kArenaAlignment, 0u) << v;
    vals.push_back({v, off, bytes});
  }
  int pairs = 0;
  for (size_t i = 0; i < vals.size(); i++)
    for (size_t j = i + 1; j < vals.size(); j++) {
      auto& [a, oa, ba] = vals[i];
      auto& [b, ob, bb] = vals[j];
      if (!ba || !bb || oa + ba <= ob || ob + bb <= oa) continue;  // bytes disjoint
      std::string ga = find(a), gb = find(b);
      if (ga == gb) continue;  // same bytes on purpose
      auto la = life.at(ga), lb = life.at(gb);
      EXPECT_TRUE(la.second < lb.first || lb.second < la.first)
          << a << " [" << la.first << "," << la.second << "] and " << b << " [" << lb.first << ","
          << lb.second << "] share bytes while both live";
      pairs++;
    }
  EXPECT_GE(mp.arena_bytes, mp.live_peak_bytes);
  EXPECT_EQ(mp.planned_peak_bytes, mp.arena_bytes + mp.heap_output_bytes);
  return pairs;
}

}  // namespace

TEST(MemoryPlan, PackerNeverOverlapsLiveBuffers) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; trial++) {
    std::vector<runtime::BufferRequest> reqs;
    int n = 5 + trial * 2;
    for (int i = 0; i < n; i++) {
      int a = (int)(rng() % 40), len = (int)(rng() % 10);
      reqs.push_back({runtime::arena_round(1 + rng() % 5000), a, a + len});
    }
    for (auto strat :
         {runtime::PackStrategy::GreedyBySize, runtime::PackStrategy::BestFitInOrder}) {
      auto p = runtime::pack_buffers(reqs, strat);
      EXPECT_GE(p.arena_bytes, runtime::live_peak_bytes(reqs));
      for (int i = 0; i < n; i++) {
        EXPECT_LE(p.offsets[i] + reqs[i].bytes, p.arena_bytes);
        for (int j = i + 1; j < n; j++) {
          bool live = reqs[i].first <= reqs[j].last && reqs[j].first <= reqs[i].last;
          bool overlap = p.offsets[i] < p.offsets[j] + reqs[j].bytes &&
                         p.offsets[j] < p.offsets[i] + reqs[i].bytes;
          EXPECT_FALSE(live && overlap) << "trial " << trial << " buffers " << i << ", " << j;
        }
      }
    }
  }
  // Sequential buffers of one size share one slot.
  std::vector<runtime::BufferRequest> chain = {{64, 0, 1}, {64, 1, 2}, {64, 2, 3}, {64, 3, 4}};
  EXPECT_EQ(runtime::pack_buffers(chain, runtime::PackStrategy::GreedyBySize).arena_bytes, 128u);
}

TEST(MemoryPlan, InPlaceAndViewsWhereDeclared) {
  auto g = mlp_graph(true);
  runtime::Session s(g, {});
  const auto& plan = s.plan_for({{"x", {DType::Float32, {B, T, C}}}});
  const auto& mp = plan.memory;
  // Elementwise chain: each output takes its dying input's bytes.
  EXPECT_EQ(mp.inplace_of.count("g0"), 0u);  // Div(h1, .): h1 is read again by the later Mul
  EXPECT_EQ(mp.inplace_of.at("g1"), "g0");   // Erf
  EXPECT_EQ(mp.inplace_of.at("g2"), "g1");   // Add(g1, one)
  EXPECT_EQ(mp.inplace_of.at("g4"), "g3");   // Mul(g3, half)
  EXPECT_EQ(mp.inplace_of.at("r"), "g4");    // Relu
  EXPECT_EQ(mp.inplace_of.at("p"), "o3");    // Softmax over the Reshape view of o2
  EXPECT_EQ(mp.offset.at("r"), mp.offset.at("g4"));
  EXPECT_EQ(mp.offset.at("p"), mp.offset.at("o2"));
  // Reshape is a view of its input: same offset, no kernel.
  EXPECT_EQ(mp.alias_of.at("o3"), "o2");
  EXPECT_EQ(mp.offset.at("o3"), mp.offset.at("o2"));
  int alias_steps = 0;
  for (auto& st : plan.steps) alias_steps += st.alias;
  EXPECT_EQ(alias_steps, 1);
  // Graph outputs are not in the arena.
  EXPECT_EQ(mp.offset.count("y"), 0u);
  EXPECT_EQ(mp.offset.count("loss"), 0u);
  EXPECT_EQ(mp.inplace_of.at("g3"), "h1");  // Mul(h1, g2): h1 dies here
  expect_no_live_overlap(*g, plan);
}

// A broadcast operand has fewer elements than the output: writing the output over it would
// clobber elements still to be read (the expanded Softmax of the ONNX suite: x - ReduceMax(x)).
TEST(MemoryPlan, NoInPlaceOverBroadcastOperand) {
  auto g = std::make_shared<ir::Graph>();
  g->opsets[""] = 17;
  ir::ValueInfo x;
  x.name = "x";
  x.dtype = DType::Float32;
  g->inputs.push_back(x);
  ir::ValueInfo y;
  y.name = "y";
  g->outputs.push_back(y);
  g->nodes.push_back(node("ReduceMax", {"x"}, {"m"}, {{"axes", attr_ints({-1})}}));
  g->nodes.push_back(node("Sub", {"x", "m"}, {"d"}));  // (2,4) - (2,1): 32 vs 8 bytes, both < 64
  g->nodes.push_back(node("Exp", {"d"}, {"y"}));
  runtime::Session planned(g, {}), heap(g, {});
  heap.set_memory_planning(false);
  Tensor xv = random_tensor({2, 4}, 5, 50.0f);
  const auto& plan = planned.plan_for({{"x", xv.meta()}});
  EXPECT_EQ(plan.memory.inplace_of.count("d"), 0u);
  EXPECT_TRUE(bit_equal(planned.run({{"x", xv}}).at("y"), heap.run({{"x", xv}}).at("y")));
}

// Sum / Mean (a tied weight's gradient contributions) write over a full-size input that dies
// there, with two or three inputs, one broadcast among them; the results are the unplanned run's.
TEST(MemoryPlan, VariadicSumAndMeanWriteOverADyingInput) {
  for (const char* op : {"Sum", "Mean"}) {
    auto g = std::make_shared<ir::Graph>();
    g->opsets[""] = 17;
    for (const char* in : {"x", "z"}) {
      ir::ValueInfo v;
      v.name = in;
      v.dtype = DType::Float32;
      g->inputs.push_back(v);
    }
    ir::ValueInfo y;
    y.name = "y";
    g->outputs.push_back(y);
    g->add_initializer("row", random_tensor({C}, 7));
    g->nodes.push_back(node("Tanh", {"x"}, {"a"}));
    g->nodes.push_back(node("Exp", {"x"}, {"b"}));
    g->nodes.push_back(node(op, {"a", "b"}, {"s2"}));  // over a (or b)
    g->nodes.push_back(node("Neg", {"z"}, {"c"}));
    g->nodes.push_back(node(op, {"row", "c", "s2"}, {"s3"}));  // over c: row broadcast
    g->nodes.push_back(node("Relu", {"s3"}, {"y"}));
    runtime::Session planned(g, {}), heap(g, {});
    heap.set_memory_planning(false);
    Tensor xv = random_tensor({B, T, C}, 8), zv = random_tensor({B, T, C}, 9);
    const auto& plan = planned.plan_for({{"x", xv.meta()}, {"z", zv.meta()}});
    EXPECT_TRUE(plan.memory.inplace_of.count("s2")) << op;
    EXPECT_TRUE(plan.memory.inplace_of.count("s3")) << op;
    EXPECT_TRUE(bit_equal(planned.run({{"x", xv}, {"z", zv}}).at("y"),
                          heap.run({{"x", xv}, {"z", zv}}).at("y")))
        << op;
  }
}

TEST(MemoryPlan, ForwardEqualsUnplannedArenaReusedOutputsSurvive) {
  auto g = mlp_graph(true);
  runtime::Session planned(g, {}), heap(g, {});
  heap.set_memory_planning(false);
  Tensor x1 = random_tensor({B, T, C}, 11), x2 = random_tensor({B, T, C}, 12);
  auto r1 = planned.run({{"x", x1}});
  const void* arena = planned.arena_data();
  ASSERT_NE(arena, nullptr);
  size_t bytes = planned.arena_bytes();
  EXPECT_EQ(bytes, planned.plan_for({{"x", x1.meta()}}).memory.arena_bytes);
  Tensor y1 = r1.at("y").clone(), loss1 = r1.at("loss").clone();
  auto r2 = planned.run({{"x", x2}});
  EXPECT_EQ(planned.arena_data(), arena);  // one arena, kept across runs
  EXPECT_EQ(planned.arena_bytes(), bytes);
  // The first run's outputs were not overwritten by the second run.
  EXPECT_TRUE(bit_equal(r1.at("y"), y1));
  EXPECT_TRUE(bit_equal(r1.at("loss"), loss1));
  auto h1 = heap.run({{"x", x1}}), h2 = heap.run({{"x", x2}});
  EXPECT_EQ(heap.arena_data(), nullptr);
  for (auto& name : {"y", "loss"}) {
    EXPECT_TRUE(bit_equal(r1.at(name), h1.at(name))) << name;
    EXPECT_TRUE(bit_equal(r2.at(name), h2.at(name))) << name;
  }
}

TEST(MemoryPlan, TrainingGraphEqualsUnplanned) {
  auto g = mlp_graph(false);
  autodiff::GradientOptions opts;
  opts.trainable = {"W1", "b1", "W2", "b2"};
  std::map<std::string, TensorMeta> sig = {{"x", {DType::Float32, {B, T, C}}}};
  auto tg = autodiff::build_training_graph(*g, sig, opts);
  std::set<std::string> params(opts.trainable.begin(), opts.trainable.end());
  runtime::Session planned(tg.graph, params), heap(tg.graph, params);
  heap.set_memory_planning(false);
  const auto& plan = planned.plan_for(sig);
  EXPECT_GT(expect_no_live_overlap(*tg.graph, plan), 0);  // the arena is reused
  EXPECT_GT(plan.memory.inplace_of.size(), 0u);
  EXPECT_GT(plan.memory.kept_bytes, 0u);  // forward activations read by the backward
  // Each heap output's bytes are kept by name (what `onyx plan` leaves out when bound).
  size_t grad_bytes = 0;
  for (auto& [p, gname] : tg.gradients) {
    ASSERT_TRUE(plan.memory.heap_outputs.count(gname)) << gname;
    grad_bytes += plan.memory.heap_outputs.at(gname);
  }
  EXPECT_GT(grad_bytes, 0u);
  EXPECT_EQ(grad_bytes + plan.memory.heap_outputs.at(tg.loss), plan.memory.heap_output_bytes);
  // Gradients land in caller storage (bound outputs), accumulated over two runs.
  auto grads = [&](runtime::Session& s) {
    std::map<std::string, Tensor> bound;
    for (auto& [p, gname] : tg.gradients)
      bound[gname] = Tensor::zeros(DType::Float32, g->initializers.at(p).shape());
    std::vector<double> losses;
    for (int run = 0; run < 2; run++) {
      runtime::RunOptions ro;
      ro.bound_outputs = bound;
      ro.accumulate = run > 0;
      auto out = s.run({{"x", random_tensor({B, T, C}, 20 + run)}}, ro);
      losses.push_back(out.at(tg.loss).get_as_double(0));
    }
    bound["loss0"] = Tensor::scalar_f32((float)losses[0]);
    bound["loss1"] = Tensor::scalar_f32((float)losses[1]);
    return bound;
  };
  auto a = grads(planned), b = grads(heap);
  for (auto& [name, t] : a) EXPECT_TRUE(bit_equal(t, b.at(name))) << name;
}

// The summary line: outputs a caller binds (a training step's gradients, in the flat buffer) are
// left out of the planned peak and reported apart; without a bound set, all heap outputs count.
TEST(MemoryPlan, SummaryReportsBoundOutputsApart) {
  runtime::MemoryPlan mp;
  const size_t MiB = 1024 * 1024;
  mp.arena_bytes = 10 * MiB;
  mp.heap_outputs = {{"loss", 64}, {"grad.W", 3 * MiB}, {"grad.b", MiB}};
  mp.heap_output_bytes = 4 * MiB + 64;
  mp.planned_peak_bytes = mp.arena_bytes + mp.heap_output_bytes;
  const std::string all = mp.summary(), split = mp.summary({"grad.W", "grad.b"});
  EXPECT_NE(all.find("planned peak 14.0 MiB: arena 10.0 MiB"), std::string::npos) << all;
  EXPECT_NE(all.find("graph outputs 4.0 MiB (heap, or caller storage when bound)"),
            std::string::npos)
      << all;
  EXPECT_NE(split.find("planned peak 10.0 MiB: arena 10.0 MiB"), std::string::npos) << split;
  EXPECT_NE(split.find("graph outputs 0.0 MiB on the heap (4.0 MiB more bound to caller storage)"),
            std::string::npos)
      << split;
  // a bound name that is no heap output (a view, or absent) changes nothing
  EXPECT_EQ(mp.summary({"not.an.output"}).find("planned peak 14.0 MiB"), 0u);
}

// The real exports (bench/make_exports.py): the training graph of each plans without overlaps.
TEST(MemoryPlan, RealExportsHaveNoLiveOverlap) {
  int seen = 0;
  for (auto m : {"bert-mini", "vit-tiny"}) {
    std::string path = onyx::test_exports::real_export(m);
    if (path.empty()) continue;
    auto g = std::make_shared<ir::Graph>(ir::load_onnx(path));
    std::map<std::string, TensorMeta> sig;
    for (auto& in : g->inputs) {
      Shape s = in.shape;
      for (auto& d : s)
        if (d < 0) d = 2;
      sig[in.name] = {in.dtype, s};
    }
    // forward-only plan of the raw export (views of PyTorch's Reshape/Unsqueeze chains)
    runtime::Session s(g, {});
    const auto& plan = s.plan_for(sig);
    EXPECT_GT(expect_no_live_overlap(*g, plan), 0) << m;
    EXPECT_GT(plan.memory.alias_of.size(), 0u) << m;
    seen++;
  }
  if (!seen) GTEST_SKIP() << onyx::test_exports::real_export_missing("any benchmark model");
}
