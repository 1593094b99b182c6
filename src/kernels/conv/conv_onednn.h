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

// Y = conv(X, W) + B (B may be null).
void forward(const ConvDims& d, const float* X, const float* W, const float* B, float* Y);
// dX from dY and W.
void grad_input(const ConvDims& d, const float* dY, const float* W, float* dX);
// dW from dY and X.
void grad_weight(const ConvDims& d, const float* dY, const float* X, float* dW);

enum class Pass { Forward, GradInput, GradWeight };

// Whether oneDNN's blocked convolution runs this geometry's `pass` faster than conv.cc's plain
// paths (oneDNN's im2col convolution on plain tensors; im2col + GEMM for the gradients).
bool preferred(const ConvDims& d, Pass pass);

}  // namespace onyx::kernels::conv_onednn
