// kernels/cuda/broadcast.cc — see broadcast.h.
#include "kernels/cuda/broadcast.h"

#include <vector>

namespace onyx::cuda {

Broadcast make_broadcast(const Shape& out, const Shape& a, const Shape& b, const ir::Node& node) {
  Broadcast bc;
  const int r = (int)out.size();
  auto strides_of = [&](const Shape& s) {
    std::vector<int64_t> st(r, 0);
    int64_t acc = 1;
    for (int d = r - 1, k = (int)s.size() - 1; k >= 0; d--, k--) {
      st[d] = s[k] == 1 ? 0 : acc;
      acc *= s[k];
    }
    return st;
  };
  const std::vector<int64_t> sa = strides_of(a), sb = strides_of(b);
  for (int d = 0; d < r; d++) {
    if (out[d] == 1) continue;  // contributes nothing to an index
    // Merge into the previous kept axis when both inputs step through the pair contiguously.
    if (bc.rank > 0) {
      const int p = bc.rank - 1;
      if (sa[d] * out[d] == bc.strides[0][p] && sb[d] * out[d] == bc.strides[1][p]) {
        bc.dims[p] *= out[d];
        bc.strides[0][p] = sa[d];
        bc.strides[1][p] = sb[d];
        continue;
      }
    }
    ONYX_CHECK(bc.rank < kMaxRank, node.describe(), ": broadcasting ", shape_str(a), " with ",
               shape_str(b), " needs more than ", kMaxRank, " axes on cuda");
    bc.dims[bc.rank] = out[d];
    bc.strides[0][bc.rank] = sa[d];
    bc.strides[1][bc.rank] = sb[d];
    bc.rank++;
  }
  return bc;
}

}  // namespace onyx::cuda
