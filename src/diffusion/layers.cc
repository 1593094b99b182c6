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

std::string upsample_nearest2x(GraphBuilder& b, const std::string& x) {
  return b.op(
      "Resize",
      {x, "", b.const_tensor(Tensor::from_vector<float>(DType::Float32, {4}, {1, 1, 2, 2}))},
      {{"mode", Attr::of_string("nearest")},
       {"coordinate_transformation_mode", Attr::of_string("asymmetric")},
       {"nearest_mode", Attr::of_string("floor")}});
}

std::string group_norm(GraphBuilder& b, const std::string& x, const std::string& name,
                       int64_t groups, int64_t ch, double eps) {
  std::string scale = b.param(name + ".weight", {ch}, Init::ones());
  std::string bias = b.param(name + ".bias", {ch}, Init::zeros());
  b.set_scope(name);
  return b.op("GroupNormalization", {x, scale, bias},
              {{"num_groups", Attr::of_int(groups)}, {"epsilon", Attr::of_float((float)eps)}});
}

std::string resnet_block(GraphBuilder& b, const std::string& x, const std::string& p, int64_t cin,
                         int64_t cout, const ResnetOptions& o) {
  auto act = [&](const std::string& v) { return b.activation(v, o.act); };
  std::string h = torch_conv2d(b, act(group_norm(b, x, p + ".norm1", o.groups, cin, o.eps)),
                               p + ".conv1", cin, cout, 3, 1, 1);
  std::string t;
  if (!o.temb.empty()) {
    t = torch_linear(b, o.temb, p + ".time_emb_proj", o.temb_dim, o.scale_shift ? 2 * cout : cout);
    b.set_scope(p);
    t = b.op("Unsqueeze", {t, b.const_i64({2, 3})});  // (B, cout or 2 cout, 1, 1)
    if (!o.scale_shift) h = b.op("Add", {h, t});
  }
  h = group_norm(b, h, p + ".norm2", o.groups, cout, o.eps);
  if (!t.empty() && o.scale_shift) {  // h * (1 + scale) + shift
    b.set_scope(p);
    auto parts =
        b.op_n("Split", {t}, {{"axis", Attr::of_int(1)}, {"num_outputs", Attr::of_int(2)}}, 2);
    h = b.op("Add", {b.op("Mul", {h, b.op("Add", {parts[0], b.scalar_f32(1)})}), parts[1]});
  }
  h = torch_conv2d(b, b.dropout(act(h), o.dropout), p + ".conv2", cout, cout, 3, 1, 1);
  std::string skip = cin == cout ? x : torch_conv2d(b, x, p + ".conv_shortcut", cin, cout, 1, 1, 0);
  b.set_scope(p);
  std::string y = b.op("Add", {skip, h});
  return o.output_scale == 1 ? y : b.op("Div", {y, b.scalar_f32((float)o.output_scale)});
}

std::string spatial_attention(GraphBuilder& b, const std::string& x, const std::string& p,
                              int64_t ch, int64_t heads, int64_t groups, double eps,
                              double rescale) {
  std::string h = groups ? group_norm(b, x, p + ".group_norm", groups, ch, eps) : x;
  b.set_scope(p);
  h = b.op("Reshape", {h, b.const_i64({0, 0, -1})});                 // (B,ch,HW)
  h = b.op("Transpose", {h}, {{"perm", Attr::of_ints({0, 2, 1})}});  // (B,HW,ch)
  std::string q = torch_linear(b, h, p + ".to_q", ch, ch),
              k = torch_linear(b, h, p + ".to_k", ch, ch),
              v = torch_linear(b, h, p + ".to_v", ch, ch);
  b.set_scope(p);
  std::string y = attention_core(b, q, k, v, ch, heads);  // (B,HW,ch)
  y = torch_linear(b, y, p + ".to_out.0", ch, ch);
  b.set_scope(p);
  y = b.op("Transpose", {y}, {{"perm", Attr::of_ints({0, 2, 1})}});  // (B,ch,HW)
  y = b.op("Add", {b.op("Reshape", {y, b.op("Shape", {x})}), x});
  return rescale == 1 ? y : b.op("Div", {y, b.scalar_f32((float)rescale)});
}

}  // namespace onyx::diffusion
