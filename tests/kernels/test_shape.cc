// test_shape.cc — hand-checked cases for the shape family (shape.cc, transpose.cc, slice.cc,
// gather.cc): Reshape 0/-1, Slice with negative steps, uneven Split, Gather with negative and
// out-of-range indices, Transpose fast paths against a naive loop.
#include <gtest/gtest.h>

#include <cstring>

#include "runtime/session.h"

namespace onyx::runtime {
namespace {

ir::Node make_node(const std::string& op, int n_in, int n_out) {
  ir::Node n;
  n.name = "t_" + op;
  n.op_type = op;
  for (int i = 0; i < n_in; i++) n.inputs.push_back(cat("in", i));
  for (int i = 0; i < n_out; i++) n.outputs.push_back(cat("out", i));
  return n;
}

void set_int(ir::Node& n, const std::string& k, int64_t v) {
  ir::Attribute a;
  a.kind = ir::Attribute::Kind::Int;
  a.i = v;
  n.attrs[k] = a;
}

void set_ints(ir::Node& n, const std::string& k, std::vector<int64_t> v) {
  ir::Attribute a;
  a.kind = ir::Attribute::Kind::Ints;
  a.ints = std::move(v);
  n.attrs[k] = a;
}

Tensor f32(Shape s, std::vector<float> v) { return Tensor::from_vector(DType::Float32, s, v); }
Tensor i64(Shape s, std::vector<int64_t> v) { return Tensor::from_vector(DType::Int64, s, v); }
Tensor iota(Shape s) {
  std::vector<float> v(shape_numel(s));
  for (size_t i = 0; i < v.size(); i++) v[i] = (float)i;
  return f32(s, v);
}
std::vector<float> values(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

TEST(ShapeKernels, ReshapeZeroAndMinusOne) {
  auto n = make_node("Reshape", 2, 1);
  auto out = run_node(n, 14, {iota({2, 3, 4}), i64({3}, {0, -1, 2})});
  EXPECT_EQ(out[0].shape(), (Shape{2, 6, 2}));
  EXPECT_EQ(values(out[0]), values(iota({2, 3, 4})));
  // allowzero=1: a 0 is a real zero-size dim.
  set_int(n, "allowzero", 1);
  auto z = run_node(n, 14, {iota({0, 3}), i64({2}, {3, 0})});
  EXPECT_EQ(z[0].shape(), (Shape{3, 0}));
}

TEST(ShapeKernels, ReshapeBadCountNamesNodeAndShapes) {
  auto n = make_node("Reshape", 2, 1);
  try {
    run_node(n, 14, {iota({2, 3}), i64({2}, {4, 2})});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("t_Reshape"), std::string::npos) << m;
    EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
    EXPECT_NE(m.find("[4, 2]"), std::string::npos) << m;
  }
}

TEST(ShapeKernels, SliceNegativeSteps) {
  auto n = make_node("Slice", 5, 1);
  // x = [[0..4],[5..9]]; rows reversed, cols from 4 down to (but excluding) 0 step -2.
  auto out = run_node(n, 13,
                      {iota({2, 5}), i64({2}, {-1, 4}), i64({2}, {INT64_MIN, 0}), i64({2}, {0, 1}),
                       i64({2}, {-1, -2})});
  EXPECT_EQ(out[0].shape(), (Shape{2, 2}));
  EXPECT_EQ(values(out[0]), (std::vector<float>{9, 7, 4, 2}));
  // INT64_MAX end with a positive step clamps to the dim.
  auto o2 = run_node(n, 13,
                     {iota({2, 5}), i64({1}, {1}), i64({1}, {INT64_MAX}), i64({1}, {1}), Tensor()});
  EXPECT_EQ(o2[0].shape(), (Shape{2, 4}));
  EXPECT_EQ(values(o2[0]), (std::vector<float>{1, 2, 3, 4, 6, 7, 8, 9}));
}

TEST(ShapeKernels, SplitUnevenAtOpset18) {
  auto n = make_node("Split", 1, 3);
  set_int(n, "num_outputs", 3);
  auto out = run_node(n, 18, {iota({7})});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(values(out[0]), (std::vector<float>{0, 1, 2}));
  EXPECT_EQ(values(out[1]), (std::vector<float>{3, 4, 5}));
  EXPECT_EQ(values(out[2]), (std::vector<float>{6}));
  // Explicit split sizes along axis 1.
  auto m = make_node("Split", 2, 2);
  set_int(m, "axis", 1);
  auto o2 = run_node(m, 13, {iota({2, 3}), i64({2}, {1, 2})});
  EXPECT_EQ(values(o2[0]), (std::vector<float>{0, 3}));
  EXPECT_EQ(values(o2[1]), (std::vector<float>{1, 2, 4, 5}));
  // Before 18 an uneven equal split is an error.
  auto e = make_node("Split", 1, 3);
  EXPECT_THROW(run_node(e, 13, {iota({7})}), Error);
}

TEST(ShapeKernels, GatherNegativeIndexRows) {
  auto n = make_node("Gather", 2, 1);
  auto out = run_node(n, 13, {iota({4, 3}), i64({2, 2}, {-1, 0, 2, -4})});
  EXPECT_EQ(out[0].shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(values(out[0]), (std::vector<float>{9, 10, 11, 0, 1, 2, 6, 7, 8, 0, 1, 2}));
  // axis=1 with int32 indices.
  set_int(n, "axis", 1);
  auto o2 = run_node(
      n, 13, {iota({2, 3}), Tensor::from_vector(DType::Int32, {1}, std::vector<int32_t>{-1})});
  EXPECT_EQ(o2[0].shape(), (Shape{2, 1}));
  EXPECT_EQ(values(o2[0]), (std::vector<float>{2, 5}));
}

TEST(ShapeKernels, GatherOutOfRangeNamesIndex) {
  auto n = make_node("Gather", 2, 1);
  try {
    run_node(n, 13, {iota({4, 3}), i64({2}, {1, 7})});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("index 7"), std::string::npos) << m;
    EXPECT_NE(m.find("t_Gather"), std::string::npos) << m;
  }
}

TEST(ShapeKernels, TransposeMatchesNaive) {
  for (auto perm :
       std::vector<std::vector<int64_t>>{{0, 2, 1, 3}, {0, 1, 3, 2}, {0, 2, 3, 1}, {3, 1, 0, 2}}) {
    Shape s = {2, 37, 5, 41};
    Tensor x = iota(s);
    auto n = make_node("Transpose", 1, 1);
    set_ints(n, "perm", perm);
    auto y = run_node(n, 13, {x})[0];
    Shape os;
    for (auto p : perm) os.push_back(s[p]);
    ASSERT_EQ(y.shape(), os);
    std::vector<int64_t> st = {s[1] * s[2] * s[3], s[2] * s[3], s[3], 1};
    int64_t i = 0;
    bool ok = true;
    for (int64_t a = 0; a < os[0]; a++)
      for (int64_t b = 0; b < os[1]; b++)
        for (int64_t c = 0; c < os[2]; c++)
          for (int64_t d = 0; d < os[3]; d++, i++) {
            int64_t src = a * st[perm[0]] + b * st[perm[1]] + c * st[perm[2]] + d * st[perm[3]];
            ok &= y.data<float>()[i] == (float)src;
          }
    EXPECT_TRUE(ok) << "perm " << shape_str(perm);
  }
}

TEST(ShapeKernels, TransposeEveryElementSize) {
  // Element size, not dtype, drives the copy: check 1, 2, 4 and 8 bytes on the tiled paths.
  for (DType t : {DType::UInt8, DType::Float16, DType::Int32, DType::Int64}) {
    Shape s = {3, 17, 24};
    Tensor x(t, s);
    size_t es = dtype_size(t);
    for (int64_t i = 0; i < x.numel(); i++) {
      uint64_t v = (uint64_t)i * 2654435761u;
      std::memcpy((char*)x.raw() + i * es, &v, es);
    }
    auto n = make_node("Transpose", 1, 1);
    set_ints(n, "perm", {2, 0, 1});
    auto y = run_node(n, 13, {x})[0];
    ASSERT_EQ(y.shape(), (Shape{24, 3, 17}));
    bool ok = true;
    for (int64_t c = 0; c < 24; c++)
      for (int64_t a = 0; a < 3; a++)
        for (int64_t b = 0; b < 17; b++) {
          int64_t o = (c * 3 + a) * 17 + b, i = (a * 17 + b) * 24 + c;
          ok &= std::memcmp((char*)y.raw() + o * es, (char*)x.raw() + i * es, es) == 0;
        }
    EXPECT_TRUE(ok) << dtype_name(t);
  }
}

TEST(ShapeKernels, ConcatMismatchNamesShapes) {
  auto n = make_node("Concat", 2, 1);
  set_int(n, "axis", 1);
  auto ok = run_node(n, 13, {iota({2, 1}), iota({2, 2})});
  EXPECT_EQ(values(ok[0]), (std::vector<float>{0, 0, 1, 1, 2, 3}));
  try {
    run_node(n, 13, {iota({2, 1}), iota({3, 2})});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[3, 2]"), std::string::npos) << m;
  }
}

TEST(ShapeKernels, PadReflectAndEdge) {
  auto n = make_node("Pad", 2, 1);
  n.attrs["mode"].kind = ir::Attribute::Kind::String;
  n.attrs["mode"].s = "reflect";
  auto r = run_node(n, 13, {iota({3}), i64({2}, {2, 2})});
  EXPECT_EQ(values(r[0]), (std::vector<float>{2, 1, 0, 1, 2, 1, 0}));
  n.attrs["mode"].s = "edge";
  auto e = run_node(n, 13, {iota({3}), i64({2}, {1, -1})});
  EXPECT_EQ(values(e[0]), (std::vector<float>{0, 0, 1}));
}

}  // namespace
}  // namespace onyx::runtime
