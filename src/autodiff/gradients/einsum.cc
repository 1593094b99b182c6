// einsum.cc — the gradient of Einsum.
//
// For y = einsum(x_0, ..., x_{n-1}), the gradient of operand i is again an Einsum: of dy (with the
// output's labels) and every other operand, onto x_i's labels. The equation is parsed by the
// kernel's parser (kernels/matmul/einsum.h) and re-written with explicit letters only:
//   - the dims "..." stands for get unused letters (so the gradient equations need no
//   broadcasting);
//     an operand's ellipsis dim of size 1 broadcast against a larger one is squeezed away, and its
//     gradient summed over it (dy's dim is absent from the gradient equation's output);
//   - a label only x_i has (summed inside the forward, e.g. "ij->i" for j) cannot be an output of
//     that Einsum: it is broadcast back afterwards, by a second Einsum with a ones vector;
//   - a label x_i repeats (a diagonal, "ii->i", "bii->b") appears once in the first Einsum and is
//     put back on the diagonal by the second, with an identity matrix per extra occurrence
//     ("bi,ij->bij").
// More than 52 distinct dims cannot be written in letters; that equation is refused by name.
#include "kernels/matmul/einsum.h"

#include <algorithm>

#include "autodiff/gradient.h"

namespace onyx::autodiff {
namespace {

using kernels::EinsumSpec;

void einsum_rule(GradContext& c) {
  const std::string where = c.node().describe();
  const std::string eq = c.node().attr_string("equation", "");
  const int n = c.num_inputs();
  std::vector<std::string> in(n);  // copies: emitting may move the node
  std::vector<Shape> shapes(n);
  for (int i = 0; i < n; i++) {
    in[i] = c.I(i);
    shapes[i] = c.meta(in[i]).shape;
  }
  const EinsumSpec s = kernels::parse_einsum(eq, shapes, where);
  const std::string dy = c.GO(0);
  if (dy.empty()) return;
  const DType dt = c.meta(dy).dtype;
  const int L = (int)s.size.size();

  // One letter per label: a letter stays itself, an ellipsis dim takes an unused one.
  std::vector<bool> taken(EinsumSpec::kLetters, false);
  for (int l = 0; l < EinsumSpec::kLetters; l++) taken[l] = s.uses(l);
  auto fresh = [&](std::vector<bool>& t) {
    for (int l = 0; l < EinsumSpec::kLetters; l++)
      if (!t[l]) {
        t[l] = true;
        return kernels::einsum_letter(l);
      }
    throw Error(cat(where, ": no gradient for Einsum equation '", eq,
                    "': it needs more than 52 distinct letters once '...' is written out"));
  };
  std::vector<char> letter(L, '?');
  for (int l = 0; l < L; l++)
    if (s.uses(l)) letter[l] = l < EinsumSpec::kLetters ? kernels::einsum_letter(l) : fresh(taken);

  // Each operand's labels without its broadcast size-1 dims, and the operand reshaped to match.
  std::vector<std::vector<int>> labels(n);
  for (int i = 0; i < n; i++)
    for (size_t d = 0; d < s.inputs[i].size(); d++) {
      int l = s.inputs[i][d];
      if (!(shapes[i][d] == 1 && s.size[l] != 1)) labels[i].push_back(l);
    }
  auto letters_of = [&](const std::vector<int>& ls) {
    std::string t;
    for (int l : ls) t += letter[l];
    return t;
  };
  auto squeezed = [&](int j) {
    Shape sh;
    for (int l : labels[j]) sh.push_back(s.size[l]);
    return c.reshape(in[j], sh);
  };
  auto einsum = [&](const std::vector<std::string>& ins, const std::string& equation) {
    return c.emit1("Einsum", ins, {{"equation", attr_s(equation)}});
  };

  for (int i = 0; i < n; i++) {
    if (!c.needs(i)) continue;
    // g over x_i's distinct labels that dy or another operand has.
    std::vector<std::string> ins = {dy};
    std::string lhs = letters_of(s.output);
    std::vector<bool> present(L, false);
    for (int l : s.output) present[l] = true;
    for (int j = 0; j < n; j++) {
      if (j == i) continue;
      ins.push_back(squeezed(j));
      lhs += "," + letters_of(labels[j]);
      for (int l : labels[j]) present[l] = true;
    }
    std::vector<int> target;
    bool lone = false, repeated = false;
    for (int l : labels[i]) {
      if (std::find(target.begin(), target.end(), l) != target.end()) {
        repeated = true;
      } else if (present[l]) {
        target.push_back(l);
      } else {
        lone = true;
      }
    }
    std::string g = ins.size() == 1 && lhs == letters_of(target)
                        ? dy
                        : einsum(ins, lhs + "->" + letters_of(target));
    // Labels only x_i has: broadcast (ones); repeated labels: back onto the diagonal (identity).
    if (lone || repeated) {
      std::vector<bool> t = taken;
      std::vector<std::string> ins2 = {g};
      std::string lhs2 = letters_of(target), out2;
      std::vector<bool> seen(L, false);
      for (int l : labels[i]) {
        int64_t sz = s.size[l];
        if (!seen[l]) {
          seen[l] = true;
          out2 += letter[l];
          bool once = std::count(labels[i].begin(), labels[i].end(), l) == 1;
          if (!present[l] && once) {  // ones(sz)
            ins2.push_back(c.emit1("Expand", {c.const_scalar(1.0, dt), c.const_i64({sz})}));
            lhs2 += std::string(",") + letter[l];
          }
        } else {  // identity(sz, sz) between the first occurrence and this one
          char f = fresh(t);
          out2 += f;
          std::string zero = c.emit1("Expand", {c.const_scalar(0.0, dt), c.const_i64({sz, sz})});
          ins2.push_back(c.emit1("EyeLike", {zero}));
          lhs2 += std::string(",") + letter[l] + f;
        }
      }
      g = einsum(ins2, lhs2 + "->" + out2);
    }
    c.set(i, c.reshape(g, shapes[i]));
  }
}

}  // namespace

ONYX_REGISTER_GRADIENTS(einsum) { r.add("", "Einsum", einsum_rule); }

}  // namespace onyx::autodiff
