// kernels/matmul/einsum.cc — Einsum (opset 12): the equation parser of einsum.h and the kernel.
//
// The kernel works on labelled strided views. Each operand first takes its diagonals (a repeated
// label reads along the sum of its strides) and sums the labels no other operand and not the
// output uses; then the operands are contracted left to right, each pair as one batched GEMM:
// labels of both operands that are still needed become batch dims, labels of both that are not
// become the GEMM's K, labels of one operand only its M or N. The last step permutes (and sums,
// for one operand) into the output's order. An ellipsis dim of size 1 broadcast against a larger
// one is read as absent in that operand.
//
// Compute types: float32 through kernels/cpu/gemm.h, float16 / bfloat16 converted to float32
// around it; float64 in double and the integer types in (u)int64 with an exact loop.
#include "kernels/matmul/einsum.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>
#include <type_traits>

#include "kernels/cpu/gemm.h"
#include "kernels/shape/shape_common.h"

namespace onyx::kernels {

Shape EinsumSpec::output_shape() const {
  Shape s;
  for (int l : output) s.push_back(size[l]);
  return s;
}

namespace {

int letter_label(char ch) {
  if (ch >= 'a' && ch <= 'z') return ch - 'a';
  if (ch >= 'A' && ch <= 'Z') return 26 + (ch - 'A');
  return -1;
}

struct ParsedTerm {
  std::vector<int> before, after;  // letters before / after the ellipsis (all in `before` if none)
  bool ellipsis = false;
};

}  // namespace

EinsumSpec parse_einsum(const std::string& equation, const std::vector<Shape>& shapes,
                        const std::string& where) {
  auto fail = [&](const std::string& why) {
    return Error(cat(where, ": Einsum equation '", equation, "': ", why));
  };
  std::string eq;
  for (char ch : equation)
    if (!std::isspace((unsigned char)ch)) eq += ch;
  std::string lhs = eq, rhs;
  size_t arrow = eq.find("->");
  const bool explicit_out = arrow != std::string::npos;
  if (explicit_out) {
    lhs = eq.substr(0, arrow);
    rhs = eq.substr(arrow + 2);
    if (rhs.find("->") != std::string::npos || rhs.find(',') != std::string::npos)
      throw fail("more than one output term");
  }
  std::vector<std::string> terms;
  for (size_t p = 0;;) {
    size_t q = lhs.find(',', p);
    terms.push_back(lhs.substr(p, q == std::string::npos ? std::string::npos : q - p));
    if (q == std::string::npos) break;
    p = q + 1;
  }
  if (terms.size() != shapes.size())
    throw fail(cat(terms.size(), " operand term(s) for ", shapes.size(), " input(s)"));
  auto parse_term = [&](const std::string& t) {
    ParsedTerm pt;
    for (size_t i = 0; i < t.size();) {
      if (t.compare(i, 3, "...") == 0) {
        if (pt.ellipsis) throw fail(cat("more than one '...' in the term '", t, "'"));
        pt.ellipsis = true;
        i += 3;
        continue;
      }
      int l = letter_label(t[i]);
      if (l < 0) throw fail(cat("unexpected character '", t[i], "' (letters a-z, A-Z and '...')"));
      (pt.ellipsis ? pt.after : pt.before).push_back(l);
      i++;
    }
    return pt;
  };

  const size_t n = shapes.size();
  std::vector<ParsedTerm> parsed;
  std::vector<int> er(n, 0);
  int E = 0;
  for (size_t i = 0; i < n; i++) {
    parsed.push_back(parse_term(terms[i]));
    const ParsedTerm& pt = parsed.back();
    int letters = (int)(pt.before.size() + pt.after.size());
    int rank = (int)shapes[i].size();
    if (pt.ellipsis) {
      if (rank < letters)
        throw fail(cat("term '", terms[i], "' names ", letters, " dims, operand ", i, " has shape ",
                       shape_str(shapes[i])));
      er[i] = rank - letters;
    } else if (rank != letters) {
      throw fail(cat("term '", terms[i], "' names ", letters, " dims, operand ", i, " has shape ",
                     shape_str(shapes[i])));
    }
    E = std::max(E, er[i]);
  }

  EinsumSpec s;
  s.equation = equation;
  s.ellipsis_rank = E;
  s.size.assign(EinsumSpec::kLetters + E, -1);
  std::vector<int> count(EinsumSpec::kLetters, 0);
  for (size_t i = 0; i < n; i++) {
    const ParsedTerm& pt = parsed[i];
    std::vector<int> labels = pt.before;
    for (int k = 0; k < er[i]; k++) labels.push_back(EinsumSpec::kLetters + (E - er[i]) + k);
    labels.insert(labels.end(), pt.after.begin(), pt.after.end());
    for (size_t d = 0; d < labels.size(); d++) {
      int l = labels[d];
      int64_t dim = shapes[i][d];
      int64_t& sz = s.size[l];
      if (l < EinsumSpec::kLetters) {
        count[l]++;
        if (sz < 0) {
          sz = dim;
        } else if (sz != dim) {
          throw fail(cat("letter '", einsum_letter(l), "' has size ", sz, " and ", dim,
                         " (operand ", i, " of shape ", shape_str(shapes[i]), ")"));
        }
      } else if (sz < 0 || sz == 1) {
        sz = dim;
      } else if (dim != 1 && dim != sz) {
        std::string all;
        for (size_t j = 0; j < n; j++) all += (j ? ", " : "") + shape_str(shapes[j]);
        throw fail(cat("the dims '...' stands for cannot be broadcast (operand shapes ", all, ")"));
      }
    }
    s.inputs.push_back(std::move(labels));
  }

  if (explicit_out) {
    ParsedTerm pt = parse_term(rhs);
    if (!pt.ellipsis && E > 0)
      throw fail(cat("the output has no '...', but it stands for ", E, " dim(s) of the inputs"));
    std::vector<bool> seen(EinsumSpec::kLetters, false);
    for (auto* part : {&pt.before, &pt.after})
      for (int l : *part) {
        if (count[l] == 0)
          throw fail(cat("output letter '", einsum_letter(l), "' is in no input term"));
        if (seen[l]) throw fail(cat("output letter '", einsum_letter(l), "' is repeated"));
        seen[l] = true;
      }
    s.output = pt.before;
    for (int k = 0; k < E; k++) s.output.push_back(EinsumSpec::kLetters + k);
    s.output.insert(s.output.end(), pt.after.begin(), pt.after.end());
  } else {
    for (int k = 0; k < E; k++) s.output.push_back(EinsumSpec::kLetters + k);
    for (int l = 26; l < 52; l++)  // ASCII order: 'A'-'Z' before 'a'-'z'
      if (count[l] == 1) s.output.push_back(l);
    for (int l = 0; l < 26; l++)
      if (count[l] == 1) s.output.push_back(l);
  }
  return s;
}

}  // namespace onyx::kernels

namespace onyx::kernels {
namespace {

using kernels::EinsumSpec;
using shape_detail::Arith;

// A tensor over labelled dims: element m is data[sum_d m[d] * strides[d]]. Label -1 marks an
// ellipsis dim of size 1 broadcast against a larger one (read as absent).
template <class C>
struct Term {
  std::vector<int> labels;
  Shape dims;
  std::vector<int64_t> strides;
  const C* data = nullptr;
  std::shared_ptr<std::vector<C>> own;
};

template <class C>
Term<C> contiguous_term(std::vector<int> labels, Shape dims, std::shared_ptr<std::vector<C>> v) {
  Term<C> t;
  t.labels = std::move(labels);
  t.strides = shape_detail::contiguous_strides(dims);
  t.dims = std::move(dims);
  t.own = std::move(v);
  t.data = t.own->data();
  return t;
}

// t over the labels `out` (each a label of t, in that order), contiguous; t's other labels are
// summed, a repeated label is read along its diagonal.
template <class C>
Term<C> reduce_to(const Term<C>& t, const std::vector<int>& out) {
  std::vector<int> ul;
  Shape us;
  std::vector<int64_t> ust;
  for (size_t d = 0; d < t.labels.size(); d++) {
    auto it = std::find(ul.begin(), ul.end(), t.labels[d]);
    if (it != ul.end() && t.labels[d] >= 0) {
      ust[it - ul.begin()] += t.strides[d];
    } else {
      ul.push_back(t.labels[d]);
      us.push_back(t.dims[d]);
      ust.push_back(t.strides[d]);
    }
  }
  Shape od, sd;
  std::vector<int64_t> ost, sst;
  std::vector<bool> used(ul.size(), false);
  for (int l : out) {
    size_t k = std::find(ul.begin(), ul.end(), l) - ul.begin();
    ONYX_CHECK(k < ul.size(), "einsum: internal error: label ", l, " is not in the operand");
    used[k] = true;
    od.push_back(us[k]);
    ost.push_back(ust[k]);
  }
  for (size_t k = 0; k < ul.size(); k++)
    if (!used[k] && us[k] != 1) {
      sd.push_back(us[k]);
      sst.push_back(ust[k]);
    }
  const int64_t on = shape_numel(od), sn = shape_numel(sd);
  auto v = std::make_shared<std::vector<C>>(on);
  if (on > 0) {
    if (sd.empty()) {
      shape_detail::strided_copy(v->data(), t.data, od, ost, sizeof(C));
    } else if (sn > 0) {
      C* dst = v->data();
      const C* src = t.data;
      const int orank = (int)od.size(), srank = (int)sd.size();
      parallel_for(on, std::max<int64_t>(1, 4096 / sn), [&](int64_t b, int64_t e) {
        std::vector<int64_t> mi(srank);
        for (int64_t u = b; u < e; u++) {
          int64_t base = 0;
          for (int64_t d = orank - 1, r = u; d >= 0; d--) {
            base += (r % od[d]) * ost[d];
            r /= od[d];
          }
          std::fill(mi.begin(), mi.end(), 0);
          C acc = C(0);
          int64_t off = base;
          for (int64_t k = 0; k < sn; k++) {
            acc += src[off];
            for (int d = srank - 1; d >= 0; d--) {
              off += sst[d];
              if (++mi[d] < sd[d]) break;
              off -= sst[d] * sd[d];
              mi[d] = 0;
            }
          }
          dst[u] = acc;
        }
      });
    }  // else: an empty sum, zeros (the vector is value-initialized)
  }
  return contiguous_term<C>(out, od, std::move(v));
}

// C[b] (M,N) = A[b] (M,K) · B[b] (K,N), all contiguous.
template <class C>
void batched_gemm(int64_t batch, int64_t M, int64_t N, int64_t K, const C* A, const C* B, C* Cm) {
  if (K == 0) {
    std::fill(Cm, Cm + batch * M * N, C(0));
    return;
  }
  if constexpr (std::is_same_v<C, float>) {
    if (batch == 1)
      kernels::sgemm(false, false, M, N, K, 1.f, A, K, B, N, 0.f, Cm, N);
    else
      kernels::sgemm_strided_batched(false, false, M, N, K, 1.f, A, K, M * K, B, N, K * N, 0.f, Cm,
                                     N, M * N, batch);
  } else {
    parallel_for(batch * M, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, N * K)),
                 [&](int64_t r0, int64_t r1) {
                   for (int64_t r = r0; r < r1; r++) {
                     int64_t b = r / M, m = r % M;
                     const C* a = A + b * M * K + m * K;
                     const C* bm = B + b * K * N;
                     C* c = Cm + r * N;
                     std::fill(c, c + N, C(0));
                     for (int64_t k = 0; k < K; k++) {
                       C av = a[k];
                       const C* brow = bm + k * N;
                       for (int64_t n = 0; n < N; n++) c[n] += av * brow[n];
                     }
                   }
                 });
  }
}

bool has(const std::vector<int>& v, int l) { return std::find(v.begin(), v.end(), l) != v.end(); }

// Unique labels of t (first occurrence order, no -1) that are in `needed`.
template <class C>
std::vector<int> kept_labels(const Term<C>& t, const std::vector<bool>& needed) {
  std::vector<int> out;
  for (int l : t.labels)
    if (l >= 0 && needed[l] && !has(out, l)) out.push_back(l);
  return out;
}

// a and b contiguous with unique labels; every label of one only is kept (`keep`).
template <class C>
Term<C> contract(const Term<C>& a, const Term<C>& b, const std::vector<bool>& keep) {
  std::vector<int> batch, m, n, k;
  for (int l : a.labels) (has(b.labels, l) ? (keep[l] ? batch : k) : m).push_back(l);
  for (int l : b.labels)
    if (!has(a.labels, l)) n.push_back(l);
  auto sizes = [](const Term<C>& t, const std::vector<int>& ls) {
    int64_t p = 1;
    for (int l : ls) p *= t.dims[std::find(t.labels.begin(), t.labels.end(), l) - t.labels.begin()];
    return p;
  };
  std::vector<int> ao = batch, bo = batch;
  ao.insert(ao.end(), m.begin(), m.end());
  ao.insert(ao.end(), k.begin(), k.end());
  bo.insert(bo.end(), k.begin(), k.end());
  bo.insert(bo.end(), n.begin(), n.end());
  Term<C> ap = ao == a.labels ? a : reduce_to(a, ao);
  Term<C> bp = bo == b.labels ? b : reduce_to(b, bo);
  int64_t NB = sizes(a, batch), M = sizes(a, m), K = sizes(a, k), N = sizes(b, n);
  std::vector<int> labels = batch;
  labels.insert(labels.end(), m.begin(), m.end());
  labels.insert(labels.end(), n.begin(), n.end());
  Shape dims;
  for (int l : batch) dims.push_back(ap.dims[std::find(ao.begin(), ao.end(), l) - ao.begin()]);
  for (int l : m) dims.push_back(ap.dims[std::find(ao.begin(), ao.end(), l) - ao.begin()]);
  for (int l : n) dims.push_back(bp.dims[std::find(bo.begin(), bo.end(), l) - bo.begin()]);
  auto v = std::make_shared<std::vector<C>>(NB * M * N);
  if (!v->empty()) batched_gemm<C>(NB, M, N, K, ap.data, bp.data, v->data());
  return contiguous_term<C>(labels, dims, std::move(v));
}

template <class C>
std::vector<C> einsum_compute(const EinsumSpec& s, const std::vector<Term<C>>& ops) {
  const int L = (int)s.size.size();
  const size_t n = ops.size();
  // needed_after[j]: labels of the output and of operands j+1..n-1.
  std::vector<std::vector<bool>> needed_after(n, std::vector<bool>(L, false));
  std::vector<bool> acc(L, false);
  for (int l : s.output) acc[l] = true;
  for (size_t j = n; j-- > 0;) {
    needed_after[j] = acc;
    for (int l : ops[j].labels)
      if (l >= 0) acc[l] = true;
  }
  // An operand (contiguous) that keeps all its labels, each once, is used in place.
  auto restrict_to = [](const Term<C>& t, const std::vector<int>& labels) {
    return labels == t.labels ? t : reduce_to(t, labels);
  };
  Term<C> cur;
  if (n == 1) {
    cur = reduce_to(ops[0], s.output);
  } else {
    cur = restrict_to(ops[0], kept_labels(ops[0], needed_after[0]));
    for (size_t j = 1; j < n; j++) {
      // Operand j keeps what the running result, the later operands or the output use.
      std::vector<bool> need = needed_after[j];
      for (int l : cur.labels) need[l] = true;
      Term<C> b = restrict_to(ops[j], kept_labels(ops[j], need));
      // The running result drops (sums) what neither operand j nor anything later uses.
      std::vector<bool> need_cur = needed_after[j];
      for (int l : b.labels) need_cur[l] = true;
      std::vector<int> keep_cur = kept_labels(cur, need_cur);
      if (keep_cur != cur.labels) cur = reduce_to(cur, keep_cur);
      cur = contract(cur, b, needed_after[j]);
    }
    if (cur.labels != s.output) cur = reduce_to(cur, s.output);
  }
  return std::move(*cur.own);  // reduce_to and contract results own their data
}

EinsumSpec spec_of(const ir::Node& node, const std::vector<Shape>& shapes) {
  ONYX_CHECK(node.attrs.count("equation"), node.describe(), ": Einsum needs an 'equation'");
  return kernels::parse_einsum(node.attr_string("equation", ""), shapes, node.describe());
}

void einsum_infer(InferContext& ctx) {
  ONYX_CHECK(ctx.num_inputs() >= 1, ctx.node.describe(), ": Einsum needs at least one input");
  std::vector<Shape> shapes;
  for (int i = 0; i < ctx.num_inputs(); i++) {
    const auto& m = ctx.input(i);
    ONYX_CHECK(m.dtype == ctx.input(0).dtype, ctx.node.describe(), ": Einsum inputs have dtypes ",
               dtype_name(ctx.input(0).dtype), " and ", dtype_name(m.dtype));
    shapes.push_back(m.shape);
  }
  ctx.set_output(0, ctx.input(0).dtype, spec_of(ctx.node, shapes).output_shape());
}

void einsum_kernel(KernelContext& ctx) {
  std::vector<Shape> shapes;
  for (int i = 0; i < ctx.num_inputs(); i++) shapes.push_back(ctx.input(i).shape());
  EinsumSpec s = spec_of(ctx.node, shapes);
  Tensor& y = ctx.output(0);
  if (y.numel() == 0) return;
  shape_detail::dispatch_dtype(ctx.input(0).dtype(), ctx.node, [&]<class S>() {
    if constexpr (std::is_same_v<S, bool>) {
      ONYX_UNSUPPORTED(ctx.node.describe(), ": Einsum of dtype bool");
    } else {
      using A = typename Arith<S>::C;
      using C = std::conditional_t<std::is_floating_point_v<A>, A,
                                   std::conditional_t<std::is_signed_v<A>, int64_t, uint64_t>>;
      std::vector<Term<C>> ops;
      for (int i = 0; i < ctx.num_inputs(); i++) {
        const Tensor& x = ctx.input(i);
        Term<C> t;
        for (size_t d = 0; d < s.inputs[i].size(); d++) {
          int l = s.inputs[i][d];
          t.labels.push_back(x.shape()[d] == 1 && s.size[l] != 1 ? -1 : l);
        }
        t.dims = x.shape();
        t.strides = shape_detail::contiguous_strides(x.shape());
        if constexpr (std::is_same_v<S, C>) {
          t.data = x.data<C>();
        } else {
          auto v = std::make_shared<std::vector<C>>(x.numel());
          const S* p = x.data<S>();
          for (int64_t k = 0; k < x.numel(); k++) (*v)[k] = (C)Arith<S>::load(p[k]);
          t.own = std::move(v);
          t.data = t.own->data();
        }
        ops.push_back(std::move(t));
      }
      std::vector<C> out = einsum_compute<C>(s, ops);
      S* dst = y.data<S>();
      for (int64_t k = 0; k < y.numel(); k++) dst[k] = Arith<S>::store((A)out[k]);
    }
  });
}

}  // namespace

// FLOPs: operands contracted left to right, 2 · Π(sizes of the pair's labels) per pair (a batched
// GEMM's multiply-adds); an intermediate keeps the labels later operands or the output use. A
// single operand (a transpose, trace or sum) counts 0, as elementwise work does.
static double einsum_flops(const ir::Node& n, const std::vector<const TensorMeta*>& in,
                           const std::vector<const TensorMeta*>&) {
  std::vector<Shape> shapes;
  for (auto* m : in) {
    if (!m) return 0;
    shapes.push_back(m->shape);
  }
  if (shapes.size() < 2) return 0;
  kernels::EinsumSpec s =
      kernels::parse_einsum(n.attr_string("equation", ""), shapes, n.describe());
  double total = 0;
  std::vector<int> acc = s.inputs[0];
  for (size_t i = 1; i < s.inputs.size(); i++) {
    std::vector<int> both = acc;
    for (int l : s.inputs[i])
      if (std::find(both.begin(), both.end(), l) == both.end()) both.push_back(l);
    double p = 2;
    for (int l : both) p *= (double)s.size[l];
    total += p;
    std::vector<int> keep;  // labels still needed after this pair
    for (int l : both) {
      bool later = std::find(s.output.begin(), s.output.end(), l) != s.output.end();
      for (size_t j = i + 1; j < s.inputs.size() && !later; j++)
        later = std::find(s.inputs[j].begin(), s.inputs[j].end(), l) != s.inputs[j].end();
      if (later) keep.push_back(l);
    }
    acc = keep;
  }
  return total;
}

ONYX_REGISTER_KERNELS(einsum, Cpu) {
  OpTraits& t = r.add("", "Einsum", OpKernel{einsum_infer, einsum_kernel, {}});
  t.precision = OpTraits::Precision::LowPrecision;  // one batched GEMM per operand pair
  t.flops = einsum_flops;
}

}  // namespace onyx::kernels
