// kernels/cuda/broadcast.h: the index arithmetic the CUDA elementwise kernels run, checked on the
// host in every build against a direct numpy-style computation.
#include <gtest/gtest.h>

#include "kernels/cuda/broadcast.h"
#include "runtime/kernel.h"

using namespace onyx;

namespace {

// Offset of output index i in input shape s (right-aligned; size-1 axes repeat).
int64_t direct_offset(int64_t i, const Shape& out, const Shape& s) {
  int64_t off = 0, stride = 1;
  for (int d = (int)out.size() - 1, k = (int)s.size() - 1; d >= 0; d--, k--) {
    int64_t idx = i % out[d];
    i /= out[d];
    if (k >= 0) {
      if (s[k] != 1) off += idx * stride;
      stride *= s[k];
    }
  }
  return off;
}

ir::Node node() {
  ir::Node n;
  n.name = "add";
  n.op_type = "Add";
  return n;
}

}  // namespace

TEST(CudaBroadcast, OffsetsMatchNumpyBroadcasting) {
  const std::vector<std::pair<Shape, Shape>> pairs = {{{2, 3}, {2, 3}},
                                                      {{2, 3, 4}, {3, 1}},
                                                      {{4}, {2, 3, 4}},
                                                      {{2, 3, 4}, {1, 4}},
                                                      {{2, 1, 3}, {4, 1}},
                                                      {{3, 1}, {2, 1, 4}},
                                                      {{}, {2, 3}},
                                                      {{2, 3, 4, 5}, {2, 1, 4, 1}},
                                                      {{1, 1, 5}, {7, 1, 1}},
                                                      {{2, 2, 3, 4}, {4}},
                                                      {{6, 1, 2, 1, 3}, {2, 5, 1}},
                                                      {{0, 3}, {3}},
                                                      {{2, 1, 1, 3}, {1, 4, 5, 1}}};
  for (auto& [a, b] : pairs) {
    Shape out = runtime::broadcast_shapes(a, b);
    cuda::Broadcast bc = cuda::make_broadcast(out, a, b, node());
    EXPECT_LE(bc.rank, (int)out.size());
    for (int64_t i = 0; i < shape_numel(out); i++) {
      int64_t oa, ob;
      bc.offsets(i, oa, ob);
      ASSERT_EQ(oa, direct_offset(i, out, a))
          << shape_str(a) << " with " << shape_str(b) << " @" << i;
      ASSERT_EQ(ob, direct_offset(i, out, b))
          << shape_str(a) << " with " << shape_str(b) << " @" << i;
    }
  }
}

TEST(CudaBroadcast, ContiguousAxesMerge) {
  // (2,3,4) + (2,3,4): one axis; (2,3,4) + (4): two (the broadcast rows, the shared columns).
  EXPECT_EQ(cuda::make_broadcast({2, 3, 4}, {2, 3, 4}, {2, 3, 4}, node()).rank, 1);
  EXPECT_EQ(cuda::make_broadcast({2, 3, 4}, {2, 3, 4}, {4}, node()).rank, 2);
}

TEST(CudaBroadcast, TooManyAxesNameTheNode) {
  // Alternating broadcast axes cannot merge: 9 axes left.
  Shape a = {2, 1, 2, 1, 2, 1, 2, 1, 2}, b = {1, 2, 1, 2, 1, 2, 1, 2, 1}, out(9, 2);
  try {
    cuda::make_broadcast(out, a, b, node());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("add"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("more than 8 axes"), std::string::npos) << e.what();
  }
}
