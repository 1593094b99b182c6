// kernels/matmul/einsum.h — Einsum's equation, parsed once against the operand shapes. Shared by
// the kernel (einsum.cc) and its gradient rule (autodiff/gradients/einsum.cc), so both read an
// equation the same way.
//
// numpy.einsum's rules (the ONNX reference implementation is numpy's): letters a-z and A-Z, at
// most one "..." per term, spaces ignored. The dims an ellipsis stands for broadcast numpy-style
// across the operands (right-aligned; a dim of 1 repeats); letter dims must agree exactly. A letter
// repeated within one term takes that operand's diagonal. Without "->" the output is the
// ellipsis dims followed by the letters that occur exactly once, in ASCII order (upper case first);
// an explicit output may not repeat a letter nor name one absent from the inputs, and must contain
// "..." when the ellipsis stands for at least one dim.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "onyx/tensor.h"

namespace onyx::kernels {

struct EinsumSpec {
  // Labels: 0-25 = 'a'-'z', 26-51 = 'A'-'Z', 52 + j = dim j of the broadcast ellipsis shape
  // (counted from its left).
  static constexpr int kLetters = 52;
  std::string equation;                  // as written
  std::vector<std::vector<int>> inputs;  // one label per dim of each operand
  std::vector<int> output;               // one label per output dim
  std::vector<int64_t> size;             // per label (broadcast size); -1 = unused
  int ellipsis_rank = 0;                 // rank of the broadcast ellipsis shape
  Shape output_shape() const;
  bool uses(int label) const { return label < (int)size.size() && size[label] >= 0; }
};

// Throws onyx::Error naming `where` (the node) and the equation when it is malformed or does not
// fit the shapes.
EinsumSpec parse_einsum(const std::string& equation, const std::vector<Shape>& shapes,
                        const std::string& where);

// The equation letter of a label < 52.
inline char einsum_letter(int label) {
  return label < 26 ? char('a' + label) : char('A' + label - 26);
}

}  // namespace onyx::kernels

namespace onyx::kernels {
class KernelRegistry;
}  // namespace onyx::kernels
