// test_einsum.cc — the Einsum equation parser (numpy's rules) and the kernel against a brute-force
// sum over every label assignment, in float32, float64 and int64.
#include <gtest/gtest.h>

#include <random>

#include "autodiff/gradient.h"
#include "kernels/matmul/einsum.h"
#include "runtime/session.h"

namespace onyx {
namespace {

using kernels::EinsumSpec;
using kernels::parse_einsum;

Shape out_shape(const std::string& eq, const std::vector<Shape>& shapes) {
  return parse_einsum(eq, shapes, "test").output_shape();
}

TEST(EinsumParse, OutputShapes) {
  EXPECT_EQ(out_shape("ij,jk->ik", {{3, 4}, {4, 5}}), (Shape{3, 5}));
  EXPECT_EQ(out_shape("ij,jk", {{3, 4}, {4, 5}}), (Shape{3, 5}));  // implicit: i, k
  EXPECT_EQ(out_shape("bA", {{3, 4}}), (Shape{4, 3}));             // ASCII order: A before b
  EXPECT_EQ(out_shape("ii", {{3, 3}}), (Shape{}));                 // trace
  EXPECT_EQ(out_shape("ii->i", {{3, 3}}), (Shape{3}));
  EXPECT_EQ(out_shape("...i,...i", {{2, 3}, {3}}), (Shape{2}));  // implicit: "..." first
  EXPECT_EQ(out_shape("i...j,j", {{3, 2, 4}, {4}}), (Shape{2, 3}));
  EXPECT_EQ(out_shape("...ij,...jk->...ik", {{2, 1, 3, 4}, {5, 4, 2}}), (Shape{2, 5, 3, 2}));
  EXPECT_EQ(out_shape(" ab , bc -> ca ", {{2, 3}, {3, 4}}), (Shape{4, 2}));
  EXPECT_EQ(out_shape("...->...", {{}}), (Shape{}));
}

TEST(EinsumParse, ErrorsNameTheEquation) {
  struct Bad {
    std::string eq;
    std::vector<Shape> shapes;
    std::string says;
  };
  for (const Bad& b : std::vector<Bad>{
           {"ij,jk->ik", {{3, 4}, {5, 5}}, "letter 'j' has size 4 and 5"},
           {"...i->i", {{2, 3}}, "the output has no '...'"},
           {"ij->ii", {{3, 3}}, "output letter 'i' is repeated"},
           {"ij->k", {{3, 3}}, "output letter 'k' is in no input term"},
           {"ij", {{3, 3, 3}}, "names 2 dims"},
           {"i.j", {{3, 3}}, "unexpected character '.'"},
           {"......", {{3}}, "more than one '...'"},
           {"...i,...i", {{2, 3}, {4, 3}}, "cannot be broadcast"},
           {"ij,jk", {{3, 4}}, "2 operand term(s) for 1 input(s)"},
           {"i->i->i", {{3}}, "more than one output term"},
       }) {
    try {
      parse_einsum(b.eq, b.shapes, "node 'e'");
      ADD_FAILURE() << b.eq << ": no error";
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("node 'e': Einsum equation '" + b.eq + "'"), std::string::npos) << m;
      EXPECT_NE(m.find(b.says), std::string::npos) << m;
    }
  }
}

// sum over every assignment of the labels of prod_i x_i[its labels], a dim of 1 read at 0.
std::vector<double> brute_force(const EinsumSpec& s, const std::vector<Tensor>& xs) {
  std::vector<int> used;
  for (int l = 0; l < (int)s.size.size(); l++)
    if (s.uses(l)) used.push_back(l);
  std::vector<double> out(shape_numel(s.output_shape()), 0.0);
  for (int l : used)
    if (s.size[l] == 0) return out;  // an empty sum
  std::vector<int64_t> val(s.size.size(), 0);
  std::vector<std::vector<double>> data;
  for (auto& x : xs) data.push_back(x.to_double_vector());
  for (;;) {
    double p = 1;
    for (size_t i = 0; i < xs.size(); i++) {
      int64_t off = 0;
      for (size_t d = 0; d < s.inputs[i].size(); d++) {
        int64_t dim = xs[i].shape()[d];
        off = off * dim + (dim == 1 ? 0 : val[s.inputs[i][d]]);
      }
      p *= data[i][off];
    }
    int64_t o = 0;
    for (int l : s.output) o = o * s.size[l] + val[l];
    if (!out.empty()) out[o] += p;
    size_t k = 0;
    for (; k < used.size(); k++) {
      if (++val[used[k]] < s.size[used[k]]) break;
      val[used[k]] = 0;
    }
    if (k == used.size()) break;
  }
  return out;
}

Tensor random_of(DType dt, const Shape& s, std::mt19937& rng) {
  Tensor t(dt, s);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::uniform_int_distribution<int> ui(-4, 4);
  for (int64_t k = 0; k < t.numel(); k++) {
    if (dt == DType::Float32) t.data<float>()[k] = u(rng);
    if (dt == DType::Float64) t.data<double>()[k] = u(rng);
    if (dt == DType::Int64) t.data<int64_t>()[k] = ui(rng);
  }
  return t;
}

TEST(EinsumKernel, MatchesBruteForce) {
  struct Case {
    std::string eq;
    std::vector<Shape> shapes;
  };
  const std::vector<Case> cases = {
      {"ij,jk->ik", {{3, 4}, {4, 5}}},
      {"bij,bjk->bik", {{2, 3, 4}, {2, 4, 5}}},
      {"ij,jk->ki", {{3, 4}, {4, 2}}},
      {"bhqd,bhkd->bhqk", {{2, 2, 3, 4}, {2, 2, 5, 4}}},
      {"abc->cab", {{2, 3, 4}}},
      {"ij->i", {{3, 4}}},
      {"ij->", {{3, 4}}},
      {"i,j->ij", {{3}, {4}}},
      {"i,i", {{5}, {5}}},
      {"ab,ab->a", {{3, 4}, {3, 4}}},
      {"ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 2}}},
      {"ijk,ikl,j->li", {{2, 3, 4}, {2, 4, 5}, {3}}},
      {"abc,cd->a", {{2, 3, 4}, {4, 5}}},
      {"...ij,...jk->...ik", {{2, 1, 3, 4}, {5, 4, 2}}},
      {"...ij,...jk", {{2, 1, 3, 4}, {1, 5, 4, 2}}},
      {"i...j,j", {{3, 2, 4}, {4}}},
      {"...,...->...", {{3, 1}, {4}}},
      {"ii->i", {{3, 3}}},
      {"ii", {{3, 3}}},
      {"bii->bi", {{2, 3, 3}}},
      {"iij,jk->ik", {{3, 3, 4}, {4, 2}}},
      {"iii->i", {{3, 3, 3}}},
      {"iji->ij", {{3, 2, 3}}},
      {"Ab,bA", {{3, 4}, {4, 3}}},
      {",i->i", {{}, {4}}},
      {"ij,jk->ik", {{3, 0}, {0, 5}}},  // empty sum: zeros
  };
  std::mt19937 rng(7);
  for (DType dt : {DType::Float32, DType::Float64, DType::Int64}) {
    for (const Case& c : cases) {
      std::vector<Tensor> xs;
      for (auto& s : c.shapes) xs.push_back(random_of(dt, s, rng));
      ir::Node n;
      n.name = "e";
      n.op_type = "Einsum";
      for (size_t i = 0; i < xs.size(); i++) n.inputs.push_back("x" + std::to_string(i));
      n.outputs = {"y"};
      n.attrs["equation"] = autodiff::attr_s(c.eq);
      EinsumSpec s = parse_einsum(c.eq, c.shapes, "test");
      std::vector<double> want = brute_force(s, xs);
      Tensor y = runtime::run_node(n, 17, xs)[0];
      ASSERT_EQ(y.dtype(), dt) << c.eq;
      ASSERT_EQ(y.shape(), s.output_shape()) << c.eq;
      auto got = y.to_double_vector();
      for (size_t k = 0; k < want.size(); k++) {
        if (dt == DType::Int64)
          ASSERT_EQ(got[k], want[k]) << c.eq << " at " << k;
        else
          ASSERT_NEAR(got[k], want[k], 1e-5 * (1 + std::abs(want[k])))
              << c.eq << " " << dtype_name(dt) << " at " << k;
      }
    }
  }
}

}  // namespace
}  // namespace onyx
