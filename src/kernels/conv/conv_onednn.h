// kernels/conv/conv_onednn.h — float32 convolutions on oneDNN's own (blocked) layouts: the forward,
// the input gradient and the weight gradient, each a cached oneDNN primitive whose operands oneDNN
// lays out as its fastest implementation wants, with reorders from and to onyx's plain NC[D]H[W]
// tensors around it (conv_onednn.cc).
#pragma once
#include <cstdint>
#include <dnnl.hpp>
#include <vector>

namespace onyx::kernels::conv_onednn {

// X (N,C,in...) * W (M,C/group,k...) → Y (N,M,out...), 1 to 3 spatial dims; pads begin and end,
// dilations counted as ONNX does (1 = dense).
struct ConvDims {
  int64_t N = 0, C = 0, M = 0, group = 1;
  std::vector<int64_t> in, k, out, stride, dil, pad_b, pad_e;
};

// The CPU engine the convolution primitives (these and conv.cc's plain ones) are made on.
dnnl::engine& engine();

// Each pass's operands and result are float32 in onyx's tensors. With `bf16` (mixed precision, a
// CPU with AVX512_BF16 or AMX) its two inputs enter oneDNN's bf16 convolution rounded to bf16 —
// by the reorders into the blocked layouts, round to nearest even, as kernels::f32_to_bf16
// rounds — and it accumulates and writes float32; such a pass returns false, having done
// nothing, where oneDNN has only its reference implementation for the geometry.

// Y = conv(X, W) + B (B may be null).
bool forward(const ConvDims& d, const float* X, const float* W, const float* B, float* Y,
             bool bf16 = false);
// dX from dY and W.
bool grad_input(const ConvDims& d, const float* dY, const float* W, float* dX, bool bf16 = false);
// dW from dY and X.
bool grad_weight(const ConvDims& d, const float* dY, const float* X, float* dW, bool bf16 = false);

enum class Pass { Forward, GradInput, GradWeight };

// Whether oneDNN's blocked convolution runs this geometry's `pass` faster than conv.cc's plain
// paths (oneDNN's im2col convolution on plain tensors; im2col + GEMM for the gradients).
bool preferred(const ConvDims& d, Pass pass);

}  // namespace onyx::kernels::conv_onednn
