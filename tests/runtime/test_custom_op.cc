// test_custom_op.cc — custom ops through the C ABI (include/onyx/custom_op.h) registered in
// process with onyx::register_custom_ops (the same path a dlopened library takes, without the
// dlopen; tests/cli/test_custom_op.py covers loading real libraries): attributes of every kind,
// shape inference and kernel failures reported with the op and origin, gradients given as rules
// (broadcast input, attribute with a default) and as a kernel checked against finite differences,
// and the registration errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "autodiff/gradient.h"
#include "onyx/custom_ops.h"
#include "passes/match.h"
#include "runtime/session.h"

using namespace onyx;

namespace {

const OnyxCustomOpApi* g_api = nullptr;

int fail(char* error, const char* msg) {
  std::snprintf(error, ONYX_ERROR_CAPACITY, "%s", msg);
  return ONYX_FAIL;
}

// Probe(X) -> Y[8]: the attributes it reads, as floats.
int probe_infer(OnyxInferContext* c) {
  c->outputs[0].dtype = ONYX_DTYPE_FLOAT32;
  c->outputs[0].rank = 1;
  c->outputs[0].dims[0] = 8;
  return ONYX_OK;
}
int probe_compute(OnyxKernelContext* c) {
  float* y = static_cast<float*>(c->outputs[0].data);
  int64_t k = 0;
  float f = 0;
  const char* s = nullptr;
  size_t slen = 0;
  const int64_t* ints = nullptr;
  const float* floats = nullptr;
  int64_t ni = 0, nf = 0;
  g_api->attr_int(c->attrs, "k", &k);
  g_api->attr_float(c->attrs, "f", &f);
  g_api->attr_string(c->attrs, "s", &s, &slen);
  g_api->attr_ints(c->attrs, "ints", &ints, &ni);
  g_api->attr_floats(c->attrs, "floats", &floats, &nf);
  y[0] = (float)k;
  y[1] = f;
  y[2] = (float)slen + (s && std::strcmp(s, "hello") == 0 ? 100.0f : 0.0f);
  y[3] = 0;
  for (int64_t i = 0; i < ni; i++) y[3] += (float)ints[i];
  y[4] = 0;
  for (int64_t i = 0; i < nf; i++) y[4] += floats[i];
  int64_t dummy;
  y[5] = (float)g_api->attr_int(c->attrs, "missing", &dummy);  // 0: absent
  y[6] = (float)g_api->attr_int(c->attrs, "f", &dummy);        // -1: a float, not an int
  float as_float = 0;
  g_api->attr_float(c->attrs, "k", &as_float);  // an int read as a float
  y[7] = as_float;
  return ONYX_OK;
}

int fail_infer(OnyxInferContext* c) {
  int64_t v = 0;
  if (g_api->attr_int(c->attrs, "fail_infer", &v) == 1 && v) return fail(c->error, "boom");
  c->outputs[0] = c->inputs[0];
  return ONYX_OK;
}
int fail_compute(OnyxKernelContext* c) { return fail(c->error, "kaboom"); }

// ScaleAdd(A, B) -> A * c + B, B of shape [A's last dim] (broadcast).
int scale_add_compute(OnyxKernelContext* c) {
  const float* a = static_cast<const float*>(c->inputs[0].data);
  const float* b = static_cast<const float*>(c->inputs[1].data);
  float* y = static_cast<float*>(c->outputs[0].data);
  float cc = 1;
  g_api->attr_float(c->attrs, "c", &cc);
  int64_t n = c->inputs[1].numel;
  for (int64_t i = 0; i < c->inputs[0].numel; i++) y[i] = a[i] * cc + b[i % n];
  return ONYX_OK;
}

// Cube(X) = X^3, gradient kernel CubeGrad(X, Y, dY) = 3 X^2 dY; both with the default infer.
struct Span {
  const float *x, *dy;
  float* out;
};
void cube_chunk(void* p, int64_t b, int64_t e) {
  auto* s = static_cast<Span*>(p);
  for (int64_t i = b; i < e; i++) s->out[i] = s->x[i] * s->x[i] * s->x[i];
}
void cube_grad_chunk(void* p, int64_t b, int64_t e) {
  auto* s = static_cast<Span*>(p);
  for (int64_t i = b; i < e; i++) s->out[i] = 3 * s->x[i] * s->x[i] * s->dy[i];
}
int cube_compute(OnyxKernelContext* c) {
  Span s{static_cast<const float*>(c->inputs[0].data), nullptr,
         static_cast<float*>(c->outputs[0].data)};
  g_api->parallel_for(c->inputs[0].numel, 4, cube_chunk, &s);
  return ONYX_OK;
}
int cube_grad_compute(OnyxKernelContext* c) {
  Span s{static_cast<const float*>(c->inputs[0].data), static_cast<const float*>(c->inputs[2].data),
         static_cast<float*>(c->outputs[0].data)};
  g_api->parallel_for(c->inputs[0].numel, 4, cube_grad_chunk, &s);
  return ONYX_OK;
}

OnyxCustomOp make(const char* name, int inputs, OnyxInferFn infer, OnyxComputeFn compute) {
  OnyxCustomOp op;
  std::memset(&op, 0, sizeof op);
  op.api_version = ONYX_CUSTOM_OP_API_VERSION;
  op.domain = "test.custom";
  op.name = name;
  op.min_inputs = op.max_inputs = inputs;
  op.min_outputs = op.max_outputs = 1;
  op.infer = infer;
  op.compute = compute;
  return op;
}

const char* const kGradA[] = {"GO0", "attr:c=1"};
const OnyxGradNode kScaleAddA[] = {{"Mul", nullptr, kGradA, 2, "ga", nullptr, 0}};
const OnyxGradRule kScaleAddRules[] = {{0, kScaleAddA, 1, "ga"}, {1, nullptr, 0, "GO0"}};
const OnyxGradRule kOnlyInput1[] = {{1, nullptr, 0, "GO0"}};

int register_test_ops(const OnyxCustomOpApi* api) {
  if (api->version != ONYX_CUSTOM_OP_API_VERSION) return ONYX_ERR_API_VERSION;
  g_api = api;
  OnyxCustomOp ops[] = {make("Probe", 1, probe_infer, probe_compute),
                        make("Fail", 1, fail_infer, fail_compute),
                        make("ScaleAdd", 2, nullptr, scale_add_compute),
                        make("Cube", 1, nullptr, cube_compute),
                        make("CubeGrad", 3, nullptr, cube_grad_compute),
                        make("HalfGrad", 2, nullptr, scale_add_compute)};
  ops[2].grad_rules = kScaleAddRules;
  ops[2].num_grad_rules = 2;
  ops[3].grad_op = "CubeGrad";
  ops[5].grad_rules = kOnlyInput1;
  ops[5].num_grad_rules = 1;
  for (auto& op : ops)
    if (api->register_op(api->registrar, &op) != ONYX_OK) return ONYX_FAIL;
  return ONYX_OK;
}

void ensure_registered() {
  static bool done = [] {
    auto ops = register_custom_ops(register_test_ops, "test_custom_op.cc");
    EXPECT_EQ(ops.size(), 6u);
    return true;
  }();
  (void)done;
}

ir::Node node(const std::string& op, std::vector<std::string> in, std::vector<std::string> out,
              std::map<std::string, ir::Attribute> attrs = {},
              const std::string& domain = "test.custom") {
  std::string name = op + "_" + out[0];
  return passes::make_node(op, domain, std::move(in), std::move(out), std::move(attrs), name);
}

std::shared_ptr<ir::Graph> graph_with(std::vector<ir::Node> nodes, const std::string& output) {
  auto g = std::make_shared<ir::Graph>();
  g->opsets[""] = 17;
  g->opsets["test.custom"] = 1;
  g->nodes = std::move(nodes);
  ir::ValueInfo y;
  y.name = output;
  y.dtype = DType::Float32;
  g->outputs.push_back(y);
  return g;
}

Tensor randn(Shape s, std::mt19937& rng) {
  Tensor t(DType::Float32, s);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); i++) t.data<float>()[i] = u(rng);
  return t;
}

}  // namespace

TEST(CustomOp, AttributesOfEveryKind) {
  ensure_registered();
  ir::Attribute k, f, s, ints, floats;
  k.kind = ir::Attribute::Kind::Int;
  k.i = 7;
  f.kind = ir::Attribute::Kind::Float;
  f.f = 2.5f;
  s.kind = ir::Attribute::Kind::String;
  s.s = "hello";
  ints.kind = ir::Attribute::Kind::Ints;
  ints.ints = {1, 2, 3};
  floats.kind = ir::Attribute::Kind::Floats;
  floats.floats = {0.5f, 0.25f};
  auto g = graph_with({node("Probe", {"x"}, {"y"},
                            {{"k", k}, {"f", f}, {"s", s}, {"ints", ints}, {"floats", floats}})},
                      "y");
  g->add_initializer("x", Tensor::scalar_f32(0));
  runtime::Session sess(g);
  auto y = sess.run({}).at("y").to_double_vector();
  std::vector<double> want = {7, 2.5, 105, 6, 0.75, 0, -1, 7};
  EXPECT_EQ(y, want);
}

TEST(CustomOp, FailuresNameTheOpAndOrigin) {
  ensure_registered();
  ir::Attribute one;
  one.kind = ir::Attribute::Kind::Int;
  one.i = 1;
  for (bool infer : {true, false}) {
    auto g = graph_with({node("Fail", {"x"}, {"y"},
                              infer ? std::map<std::string, ir::Attribute>{{"fail_infer", one}}
                                    : std::map<std::string, ir::Attribute>{})},
                        "y");
    ir::ValueInfo x;
    x.name = "x";
    x.dtype = DType::Float32;
    x.shape = {3};
    x.has_shape = true;
    g->inputs.push_back(x);
    runtime::Session sess(g);
    try {
      sess.run({{"x", Tensor::zeros(DType::Float32, {3})}});
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("custom op 'test.custom.Fail' (library 'test_custom_op.cc')"),
                std::string::npos)
          << m;
      EXPECT_NE(m.find(infer ? "shape inference failed: boom" : "compute failed: kaboom"),
                std::string::npos)
          << m;
    }
  }
}

TEST(CustomOp, GradientsFromRulesAndKernelMatchFiniteDifferences) {
  ensure_registered();
  // loss = ReduceSum(Cube(ScaleAdd(a, b; c = 0.7)) * w); a [3, 4], b [4] broadcast.
  std::mt19937 rng(7);
  ir::Attribute c;
  c.kind = ir::Attribute::Kind::Float;
  c.f = 0.7f;
  ir::Attribute keep0;
  keep0.kind = ir::Attribute::Kind::Int;
  keep0.i = 0;
  auto g = graph_with({node("ScaleAdd", {"a", "b"}, {"s"}, {{"c", c}}), node("Cube", {"s"}, {"y"}),
                       node("Mul", {"y", "w"}, {"yw"}, {}, ""),
                       node("ReduceSum", {"yw"}, {"loss"}, {{"keepdims", keep0}}, "")},
                      "loss");
  g->add_initializer("a", randn({3, 4}, rng));
  g->add_initializer("b", randn({4}, rng));
  g->add_initializer("w", randn({3, 4}, rng));
  autodiff::GradientOptions opts;
  opts.trainable = {"a", "b"};
  auto tg = autodiff::build_training_graph(*g, {}, opts);
  ASSERT_EQ(tg.gradients.size(), 2u);
  int grad_kernels = 0;
  for (auto& n : tg.graph->nodes) grad_kernels += n.op_type == "CubeGrad";
  EXPECT_EQ(grad_kernels, 1);
  runtime::Session s(tg.graph, {"a", "b"});
  auto res = s.run({});
  auto loss_of = [&] { return runtime::Session(g).run({}).at("loss").get_as_double(0); };
  for (auto& [param, gname] : tg.gradients) {
    const Tensor& grad = res.at(gname);
    Tensor& x = g->initializers.at(param);
    ASSERT_EQ(grad.shape(), x.shape()) << param;
    for (int64_t k = 0; k < x.numel(); k++) {
      float orig = x.data<float>()[k];
      const float eps = 1e-2f;
      x.data<float>()[k] = orig + eps;
      double lp = loss_of();
      x.data<float>()[k] = orig - eps;
      double lm = loss_of();
      x.data<float>()[k] = orig;
      double numeric = (lp - lm) / (2 * eps);
      EXPECT_NEAR(grad.get_as_double(k), numeric, 2e-3 + 2e-2 * std::fabs(numeric))
          << param << "[" << k << "]";
    }
  }
}

TEST(CustomOp, InputWithoutRuleThatNeedsAGradientIsAnError) {
  ensure_registered();
  ir::Attribute keep0;
  keep0.kind = ir::Attribute::Kind::Int;
  keep0.i = 0;
  auto g = graph_with({node("HalfGrad", {"a", "b"}, {"y"}),
                       node("ReduceSum", {"y"}, {"loss"}, {{"keepdims", keep0}}, "")},
                      "loss");
  g->add_initializer("a", Tensor::zeros(DType::Float32, {2, 3}));
  g->add_initializer("b", Tensor::zeros(DType::Float32, {3}));
  autodiff::GradientOptions opts;
  opts.trainable = {"b"};
  EXPECT_NO_THROW(autodiff::build_training_graph(*g, {}, opts));  // only b: its rule exists
  opts.trainable = {"a", "b"};
  try {
    autodiff::build_training_graph(*g, {}, opts);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no gradient rule for input 0"), std::string::npos)
        << e.what();
  }
}

namespace {
int register_bad_domain(const OnyxCustomOpApi* api) {
  OnyxCustomOp op = make("Add", 2, nullptr, scale_add_compute);
  op.domain = "onyx";
  return api->register_op(api->registrar, &op);
}
int register_twice(const OnyxCustomOpApi* api) {
  OnyxCustomOp op = make("Twice", 1, nullptr, cube_compute);
  op.domain = "test.twice";
  api->register_op(api->registrar, &op);
  return api->register_op(api->registrar, &op);
}
int register_missing_grad_op(const OnyxCustomOpApi* api) {
  OnyxCustomOp op = make("Lonely", 1, nullptr, cube_compute);
  op.domain = "test.lonely";
  op.grad_op = "LonelyGrad";
  return api->register_op(api->registrar, &op);
}
int register_nothing(const OnyxCustomOpApi*) { return ONYX_OK; }
int register_failing(const OnyxCustomOpApi* api) {
  api->set_error(api->registrar, "no licence");
  return 42;
}

std::string error_of(OnyxRegisterCustomOpsFn f, const std::string& origin) {
  try {
    register_custom_ops(f, origin);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST(CustomOp, RegistrationErrors) {
  ensure_registered();
  EXPECT_NE(error_of(register_bad_domain, "bad").find("the domain must be the library's own"),
            std::string::npos);
  EXPECT_NE(error_of(register_twice, "twice").find("registers op 'test.twice.Twice' twice"),
            std::string::npos);
  EXPECT_NE(error_of(register_missing_grad_op, "lonely").find("names grad_op 'LonelyGrad'"),
            std::string::npos);
  EXPECT_NE(error_of(register_nothing, "empty").find("registered no ops"), std::string::npos);
  std::string m = error_of(register_failing, "failing");
  EXPECT_NE(
      m.find(
          "custom-op library 'failing': onyx_register_custom_ops failed (returned 42): no licence"),
      std::string::npos)
      << m;
  // The same op from a second origin; and nothing of a failed library was registered.
  EXPECT_NE(error_of(register_test_ops, "again")
                .find("'test.custom.Probe' is already registered (by "
                      "library 'test_custom_op.cc')"),
            std::string::npos);
  EXPECT_EQ(runtime::KernelRegistry::instance().find("test.twice", "Twice"), nullptr);
  EXPECT_EQ(runtime::KernelRegistry::instance().find("test.lonely", "Lonely"), nullptr);
  try {
    load_custom_op_library("/nonexistent/libx.so");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "custom-op library '/nonexistent/libx.so' does not exist");
  }
}
