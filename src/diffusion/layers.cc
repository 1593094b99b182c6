// diffusion/layers.cc — see layers.h.
#include "diffusion/layers.h"

#include <cmath>

namespace onyx::diffusion {

using models::Attr;
using models::GraphBuilder;
using models::Init;

std::string torch_linear(GraphBuilder& b, const std::string& x, const std::string& name, int64_t in,
                         int64_t out, bool bias) {
  return b.linear(x, name, in, out, Init::uniform(1.0 / std::sqrt((double)in)), bias);
}

std::string torch_conv2d(GraphBuilder& b, const std::string& x, const std::string& name,
                         int64_t cin, int64_t cout, int64_t k, int64_t stride, int64_t pad) {
  const Init init = Init::uniform(1.0 / std::sqrt((double)(cin * k * k)));
  std::string w = b.param(name + ".weight", {cout, cin, k, k}, init);
  std::string bias = b.param(name + ".bias", {cout}, init);
  b.set_scope(name);
  return b.op("Conv", {x, w, bias},
              {{"kernel_shape", Attr::of_ints({k, k})},
               {"strides", Attr::of_ints({stride, stride})},
               {"pads", Attr::of_ints({pad, pad, pad, pad})}});
}

std::string layer_norm_plain(GraphBuilder& b, const std::string& x, int64_t dim, double eps) {
  Tensor ones(DType::Float32, {dim});
  for (int64_t i = 0; i < dim; i++) ones.data<float>()[i] = 1.0f;
  return b.op("LayerNormalization", {x, b.const_tensor(ones)},
              {{"axis", Attr::of_int(-1)}, {"epsilon", Attr::of_float((float)eps)}});
}

std::string timestep_features(GraphBuilder& b, const std::string& t, int64_t dim,
                              bool flip_sin_to_cos, int64_t shift) {
  const int64_t half = dim / 2;
  Tensor freq(DType::Float32,
              {1, half});  // as torch: float32 arange * -ln(10000), / (half - shift)
  for (int64_t i = 0; i < half; i++)
    freq.data<float>()[i] =
        std::exp((float)(-std::log(10000.0)) * (float)i / (float)(half - shift));
  std::string tf = b.op("Cast", {t}, {{"to", Attr::of_int((int64_t)DType::Float32)}});
  std::string arg =
      b.op("Mul", {b.op("Unsqueeze", {tf, b.const_i64({1})}), b.const_tensor(freq)});  // (B,half)
  std::string sin = b.op("Sin", {arg}), cos = b.op("Cos", {arg});
  std::string e = b.op("Concat", {flip_sin_to_cos ? cos : sin, flip_sin_to_cos ? sin : cos},
                       {{"axis", Attr::of_int(1)}});
  return dim % 2 ? b.op("Pad", {e, b.const_i64({0, 0, 0, 1})}) : e;
}

std::string attention_core(GraphBuilder& b, const std::string& q, const std::string& k,
                           const std::string& v, int64_t C, int64_t heads) {
  const int64_t hd = C / heads;
  std::string s =
      b.op("MatMul", {b.split_heads(q, heads, hd), b.split_heads_transposed(k, heads, hd)});
  s = b.op("Mul", {s, b.scalar_f32((float)(1.0 / std::sqrt((double)hd)))});
  s = b.op("Softmax", {s}, {{"axis", Attr::of_int(-1)}});
  return b.merge_heads(b.op("MatMul", {s, b.split_heads(v, heads, hd)}), C);
}

}  // namespace onyx::diffusion
