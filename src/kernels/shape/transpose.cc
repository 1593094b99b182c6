// kernels/shape/transpose.cc — ops that are one strided copy: Transpose, DepthToSpace,
// SpaceToDepth, Expand, Tile. Each builds (output shape, source strides) and hands them to
// strided_copy, which merges dims, copies contiguous rows with memcpy (so the attention permutation
// (0,2,1,3) is a row copy of head_dim elements) and tiles 2-D transposes (last-two-dims swap,
// NCHW<->NHWC), threaded.
#include <algorithm>

#include "kernels/shape/shape_common.h"

namespace onyx::kernels::shape_detail {
namespace {

// A strided view of an input: out[idx] = in[sum idx[d] * strides[d]].
struct View {
  Shape shape;
  std::vector<int64_t> strides;
};

// ---- Transpose ----
std::vector<int64_t> transpose_perm(const ir::Node& node, const Shape& in) {
  int64_t r = (int64_t)in.size();
  std::vector<int64_t> perm = node.attr_ints("perm");
  if (!node.has_attr("perm")) {
    perm.resize(r);
    for (int64_t i = 0; i < r; i++) perm[i] = r - 1 - i;
  }
  ONYX_CHECK((int64_t)perm.size() == r, node.describe(), ": perm ", shape_str(perm),
             " does not match input ", shape_str(in));
  std::vector<bool> seen(r, false);
  for (int64_t& p : perm) {
    ONYX_CHECK(p >= -r && p < r, node.describe(), ": perm ", shape_str(perm),
               " is not a permutation of rank ", r);
    if (p < 0) p += r;
    ONYX_CHECK(!seen[p], node.describe(), ": perm ", shape_str(perm), " repeats axis ", p);
    seen[p] = true;
  }
  return perm;
}

View permuted(const Shape& in_shape, const std::vector<int64_t>& in_strides,
              const std::vector<int64_t>& perm) {
  View v;
  for (int64_t p : perm) {
    v.shape.push_back(in_shape[p]);
    v.strides.push_back(in_strides[p]);
  }
  return v;
}

void transpose_infer(InferContext& ctx) {
  const auto& x = ctx.input(0);
  auto perm = transpose_perm(ctx.node, x.shape);
  Shape out;
  for (int64_t p : perm) out.push_back(x.shape[p]);
  ctx.set_output(0, x.dtype, out);
}

void transpose_compute(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  auto perm = transpose_perm(ctx.node, x.shape());
  View v = permuted(x.shape(), contiguous_strides(x.shape()), perm);
  strided_copy(ctx.output(0).raw(), x.raw(), v.shape, v.strides, elem_size(x.dtype(), ctx.node));
}

// ---- DepthToSpace / SpaceToDepth ----
// The ONNX definitions are reshape -> transpose -> reshape; the result is the permuted 6-D view.
View depth_space_view(const ir::Node& node, const Shape& in, bool to_space) {
  ONYX_CHECK(in.size() == 4, node.describe(), ": input must be 4-D (N,C,H,W), got ", shape_str(in));
  int64_t b = node.attr_int_required("blocksize");
  ONYX_CHECK(b > 0, node.describe(), ": blocksize must be positive, got ", b);
  int64_t N = in[0], C = in[1], H = in[2], W = in[3];
  if (to_space) {
    ONYX_CHECK(C % (b * b) == 0, node.describe(), ": channels ", C,
               " are not divisible by blocksize^2 = ", b * b, " (input ", shape_str(in), ")");
    int64_t Cp = C / (b * b);
    std::string mode = node.attr_string("mode", "DCR");
    if (mode == "DCR") {
      Shape s6 = {N, b, b, Cp, H, W};
      return permuted(s6, contiguous_strides(s6), {0, 3, 4, 1, 5, 2});
    }
    if (mode == "CRD") {
      Shape s6 = {N, Cp, b, b, H, W};
      return permuted(s6, contiguous_strides(s6), {0, 1, 4, 2, 5, 3});
    }
    ONYX_UNSUPPORTED(node.describe(), ": mode '", mode, "'");
  }
  ONYX_CHECK(H % b == 0 && W % b == 0, node.describe(), ": spatial dims of ", shape_str(in),
             " are not divisible by blocksize ", b);
  Shape s6 = {N, C, H / b, b, W / b, b};
  std::string mode = node.attr_string("mode", "DCR");
  if (mode == "DCR") return permuted(s6, contiguous_strides(s6), {0, 3, 5, 1, 2, 4});
  if (mode == "CRD") return permuted(s6, contiguous_strides(s6), {0, 1, 3, 5, 2, 4});
  ONYX_UNSUPPORTED(node.describe(), ": mode '", mode, "'");
}

Shape depth_space_out(const ir::Node& node, const Shape& in, bool to_space) {
  depth_space_view(node, in, to_space);  // validates
  int64_t b = node.attr_int_required("blocksize");
  if (to_space) return {in[0], in[1] / (b * b), in[2] * b, in[3] * b};
  return {in[0], in[1] * b * b, in[2] / b, in[3] / b};
}

template <bool ToSpace>
OpKernel depth_space_kernel() {
  return {[](InferContext& ctx) {
            const auto& x = ctx.input(0);
            ctx.set_output(0, x.dtype, depth_space_out(ctx.node, x.shape, ToSpace));
          },
          [](KernelContext& ctx) {
            const Tensor& x = ctx.input(0);
            View v = depth_space_view(ctx.node, x.shape(), ToSpace);
            strided_copy(ctx.output(0).raw(), x.raw(), v.shape, v.strides,
                         elem_size(x.dtype(), ctx.node));
          },
          {}};
}

// ---- Expand ----
Shape expand_shape(const ir::Node& node, const Shape& in, const Tensor& shape_t) {
  Shape req = shape_t.to_int64_vector();
  try {
    return broadcast_shapes(in, req);
  } catch (const Error& e) {
    throw Error(cat(node.describe(), ": cannot expand ", shape_str(in), " to ", shape_str(req),
                    ": ", e.what()));
  }
}

// Source strides that broadcast `in` to `out` (0 along broadcast dims).
std::vector<int64_t> broadcast_strides(const Shape& in, const Shape& out) {
  std::vector<int64_t> s = contiguous_strides(in), r(out.size(), 0);
  size_t off = out.size() - in.size();
  for (size_t i = 0; i < in.size(); i++) r[off + i] = (in[i] == 1 && out[off + i] != 1) ? 0 : s[i];
  return r;
}

void expand_compute(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  strided_copy(y.raw(), x.raw(), y.shape(), broadcast_strides(x.shape(), y.shape()),
               elem_size(x.dtype(), ctx.node));
}

// ---- Tile ----
std::vector<int64_t> tile_repeats(const ir::Node& node, const Shape& in, const Tensor& rep_t) {
  auto rep = rep_t.to_int64_vector();
  ONYX_CHECK(rep.size() == in.size(), node.describe(), ": repeats ", shape_str(rep),
             " must have one entry per dim of input ", shape_str(in));
  for (int64_t v : rep)
    ONYX_CHECK(v >= 0, node.describe(), ": negative repeat in ", shape_str(rep));
  return rep;
}

void tile_infer(InferContext& ctx) {
  const auto& x = ctx.input(0);
  auto rep = tile_repeats(ctx.node, x.shape, ctx.value(1));
  Shape out(x.shape.size());
  for (size_t i = 0; i < out.size(); i++) out[i] = x.shape[i] * rep[i];
  ctx.set_output(0, x.dtype, out);
}

void tile_compute(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  auto rep = tile_repeats(ctx.node, x.shape(), ctx.input(1));
  auto st = contiguous_strides(x.shape());
  // Output viewed as (rep0, d0, rep1, d1, ...): repeats read the same source (stride 0).
  Shape s2;
  std::vector<int64_t> st2;
  for (size_t i = 0; i < rep.size(); i++) {
    s2.insert(s2.end(), {rep[i], x.shape()[i]});
    st2.insert(st2.end(), {0, st[i]});
  }
  strided_copy(ctx.output(0).raw(), x.raw(), s2, st2, elem_size(x.dtype(), ctx.node));
}

}  // namespace

ONYX_REGISTER_KERNELS(transpose, Cpu) {
  r.add("", "Transpose", {transpose_infer, transpose_compute, {}});
  r.add("", "DepthToSpace", depth_space_kernel<true>());
  r.add("", "SpaceToDepth", depth_space_kernel<false>());
  r.add("", "Expand",
        {[](InferContext& ctx) {
           const auto& x = ctx.input(0);
           ctx.set_output(0, x.dtype, expand_shape(ctx.node, x.shape, ctx.value(1)));
         },
         expand_compute,
         {1}});
  r.add("", "Tile", {tile_infer, tile_compute, {1}});
}

}  // namespace onyx::kernels::shape_detail
