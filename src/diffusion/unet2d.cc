// diffusion/unet2d.cc — see unet2d.h. The module structure follows diffusers 0.42's UNet2DModel
// and UNet2DConditionModel: ResnetBlock2D, Attention (the spatial self-attention of
// AttnDownBlock2D / AttnUpBlock2D / UNetMidBlock2D: group_norm, to_q/to_k/to_v, to_out.0, residual,
// rescale_output_factor), Transformer2DModel and BasicTransformerBlock (the CrossAttn blocks'
// self- and cross-attention and GEGLU feed-forward), Downsample2D (strided conv) and Upsample2D
// (nearest x2, conv). Attention is emitted as the MatMul/Softmax chain the attention fusion turns
// into onyx.Attention; GroupNorm is ONNX GroupNormalization (opset 21: per-channel scale and
// bias), so the graph is opset 21.
#include "diffusion/unet2d.h"

#include <cmath>

#include "diffusion/layers.h"
#include "models/graph_builder.h"

namespace onyx::diffusion {
namespace {

using models::Attr;
using models::GraphBuilder;
using models::Init;

struct UNet {
  GraphBuilder& b;
  const UNet2DConfig& c;
  std::string temb;  // act(time embedding) (B, TE): what every resnet's time_emb_proj reads
  std::string ctx;   // UNet2DConditionModel: encoder_hidden_states (B, S, cross_attention_dim)

  std::string act(const std::string& x) {
    return b.activation(x, c.act_fn == "swish" ? "silu" : c.act_fn);
  }

  std::string conv(const std::string& x, const std::string& name, int64_t cin, int64_t cout,
                   int64_t k, int64_t stride, int64_t pad) {
    return torch_conv2d(b, x, name, cin, cout, k, stride, pad);
  }

  std::string linear(const std::string& x, const std::string& name, int64_t in, int64_t out,
                     bool bias = true) {
    return torch_linear(b, x, name, in, out, bias);
  }

  // nn.GroupNorm(groups, ch, eps) over (B, ch, ...); eps < 0: the config's norm_eps.
  std::string group_norm(const std::string& x, const std::string& name, int64_t groups, int64_t ch,
                         double eps = -1) {
    return diffusion::group_norm(b, x, name, groups, ch, eps < 0 ? c.norm_eps : eps);
  }

  // diffusers' Attention of a BasicTransformerBlock: queries from x (B,T,C), keys and values
  // from kv (B,S,Ckv) (x itself for self-attention), no q/k/v bias, to_out.0 with one.
  std::string multi_head(const std::string& x, const std::string& kv, const std::string& p,
                         int64_t C, int64_t Ckv, int64_t heads) {
    std::string q = linear(x, p + ".to_q", C, C, false);
    std::string k = linear(kv, p + ".to_k", Ckv, C, false);
    std::string v = linear(kv, p + ".to_v", Ckv, C, false);
    b.set_scope(p);
    std::string y = attention_core(b, q, k, v, C, heads);
    return b.dropout(linear(y, p + ".to_out.0", C, C), c.dropout);
  }

  // BasicTransformerBlock (layer_norm, geglu): self-attention, cross-attention on the encoder's
  // hidden states, feed-forward, each pre-LayerNorm with a residual. x (B,T,C)
  std::string transformer_block(const std::string& x, const std::string& p, int64_t C,
                                int64_t heads) {
    auto add = [&](const std::string& a, const std::string& r) {
      b.set_scope(p);
      return b.op("Add", {a, r});
    };
    std::string n1 = b.layer_norm(x, p + ".norm1", C, 1e-5);
    std::string h = add(multi_head(n1, n1, p + ".attn1", C, C, heads), x);
    std::string n2 = b.layer_norm(h, p + ".norm2", C, 1e-5);
    h = add(multi_head(n2, ctx, p + ".attn2", C, c.cross_attention_dim, heads), h);
    std::string f = linear(b.layer_norm(h, p + ".norm3", C, 1e-5), p + ".ff.net.0.proj", C, 8 * C);
    b.set_scope(p + ".ff.net.0");
    auto parts =
        b.op_n("Split", {f}, {{"axis", Attr::of_int(-1)}, {"num_outputs", Attr::of_int(2)}}, 2);
    f = b.op("Mul", {parts[0], b.activation(parts[1], "gelu")});  // GEGLU
    f = linear(b.dropout(f, c.dropout), p + ".ff.net.2", 4 * C, C);
    return add(f, h);
  }

  // Transformer2DModel on x (B,ch,H,W): GroupNorm (eps 1e-6), proj_in (1x1 conv or linear), the
  // blocks over the H*W positions, proj_out, plus x.
  std::string transformer2d(const std::string& x, const std::string& p, int64_t ch, int64_t heads,
                            int64_t layers) {
    auto to_tokens = [&](const std::string& y) {  // (B,ch,H,W) -> (B,HW,ch)
      b.set_scope(p);
      std::string flat = b.op("Reshape", {y, b.const_i64({0, 0, -1})});
      return b.op("Transpose", {flat}, {{"perm", Attr::of_ints({0, 2, 1})}});
    };
    auto to_image = [&](const std::string& y) {  // (B,HW,ch) -> (B,ch,H,W)
      b.set_scope(p);
      return b.op("Reshape", {b.op("Transpose", {y}, {{"perm", Attr::of_ints({0, 2, 1})}}),
                              b.op("Shape", {x})});
    };
    std::string h = group_norm(x, p + ".norm", c.norm_num_groups, ch, 1e-6);
    h = c.use_linear_projection ? linear(to_tokens(h), p + ".proj_in", ch, ch)
                                : to_tokens(conv(h, p + ".proj_in", ch, ch, 1, 1, 0));
    for (int64_t l = 0; l < layers; l++)
      h = transformer_block(h, cat(p, ".transformer_blocks.", l), ch, heads);
    h = c.use_linear_projection ? to_image(linear(h, p + ".proj_out", ch, ch))
                                : conv(to_image(h), p + ".proj_out", ch, ch, 1, 1, 0);
    b.set_scope(p);
    return b.op("Add", {h, x});
  }

  // ResnetBlock2D with the time embedding. x (B,cin,H,W) -> (B,cout,H,W)
  std::string resnet(const std::string& x, const std::string& p, int64_t cin, int64_t cout,
                     double output_scale) {
    ResnetOptions o;
    o.groups = c.norm_num_groups;
    o.eps = c.norm_eps;
    o.act = c.act_fn == "swish" ? "silu" : c.act_fn;
    o.temb = temb;
    o.temb_dim = c.time_embed_dim();
    o.scale_shift = c.resnet_time_scale_shift == "scale_shift";
    o.dropout = c.dropout;
    o.output_scale = output_scale;
    return resnet_block(b, x, p, cin, cout, o);
  }

  // Attention over the H*W positions of x (B,ch,H,W), residual added. groups 0: no group_norm.
  std::string attention(const std::string& x, const std::string& p, int64_t ch, int64_t groups,
                        double rescale) {
    const int64_t hd = c.attention_head_dim ? c.attention_head_dim : ch;
    return spatial_attention(b, x, p, ch, ch / hd, groups, c.norm_eps, rescale);
  }

  // Timesteps (sinusoidal, diffusers' get_timestep_embedding) then TimestepEmbedding; plus the
  // class embedding. t (B) int64 -> (B, TE)
  std::string time_embedding(const std::string& t, const std::string& labels) {
    const int64_t dim = c.block_out_channels[0];
    b.set_scope("time_proj");
    std::string e = timestep_features(b, t, dim, c.flip_sin_to_cos, c.freq_shift);
    const int64_t TE = c.time_embed_dim();
    // TimestepEmbedding's activation: UNet2DModel leaves it SiLU, UNet2DConditionModel gives act_fn
    std::string e1 = linear(e, "time_embedding.linear_1", dim, TE);
    e = linear(c.conditional ? act(e1) : b.activation(e1, "silu"), "time_embedding.linear_2", TE,
               TE);
    if (c.num_class_embeds) {
      std::string table =
          b.param("class_embedding.weight", {c.num_class_embeds, TE}, Init::normal(1.0));
      b.set_scope("class_embedding");
      e = b.op("Add", {e, b.gather_rows(table, labels)});
    }
    return e;
  }

  std::string forward(std::string x, const std::string& t, const std::string& labels) {
    const auto& ch = c.block_out_channels;
    const int64_t n = (int64_t)ch.size();
    const int64_t G = c.norm_num_groups;
    temb = act(time_embedding(t, labels));
    if (c.center_input_sample) {
      b.set_scope("");
      x = b.op("Sub", {b.op("Mul", {x, b.scalar_f32(2)}), b.scalar_f32(1)});
    }
    x = conv(x, "conv_in", c.in_channels, ch[0], 3, 1, 1);
    std::vector<std::pair<std::string, int64_t>> skips = {{x, ch[0]}};
    int64_t cur = ch[0];
    for (int64_t i = 0; i < n; i++) {  // down blocks
      const std::string p = cat("down_blocks.", i);
      const std::string& type = c.down_block_types[i];
      for (int64_t j = 0; j < c.layers_per_block; j++) {
        x = resnet(x, cat(p, ".resnets.", j), cur, ch[i], 1);
        cur = ch[i];
        if (type == "AttnDownBlock2D") x = attention(x, cat(p, ".attentions.", j), cur, G, 1);
        if (type == "CrossAttnDownBlock2D")
          x = transformer2d(x, cat(p, ".attentions.", j), cur, c.heads[i], c.transformer_layers[i]);
        skips.push_back({x, cur});
      }
      if (i + 1 < n) {
        if (c.downsample_padding == 0) {  // F.pad(x, (0, 1, 0, 1)) first
          b.set_scope(p + ".downsamplers.0");
          x = b.op("Pad", {x, b.const_i64({0, 0, 0, 0, 0, 0, 1, 1})});
        }
        x = conv(x, p + ".downsamplers.0.conv", cur, cur, 3, 2, c.downsample_padding);
        skips.push_back({x, cur});
      }
    }
    if (!c.mid_block_type.empty()) {  // UNetMidBlock2D
      const double s = c.mid_block_scale_factor;
      const int64_t ag = c.resnet_time_scale_shift != "default" ? 0
                         : c.attn_norm_num_groups               ? c.attn_norm_num_groups
                                                                : G;
      x = resnet(x, "mid_block.resnets.0", cur, cur, s);
      if (c.conditional)  // UNetMidBlock2DCrossAttn
        x = transformer2d(x, "mid_block.attentions.0", cur, c.heads.back(),
                          c.transformer_layers.back());
      else if (c.add_attention)
        x = attention(x, "mid_block.attentions.0", cur, ag, s);
      x = resnet(x, "mid_block.resnets.1", cur, cur, s);
    }
    for (int64_t i = 0; i < n; i++) {  // up blocks, reading the skips last first
      const std::string p = cat("up_blocks.", i);
      const int64_t out = ch[n - 1 - i];
      const std::string& type = c.up_block_types[i];
      for (int64_t j = 0; j <= c.layers_per_block; j++) {
        auto [skip, skip_ch] = skips.back();
        skips.pop_back();
        b.set_scope(cat(p, ".resnets.", j));
        x = b.op("Concat", {x, skip}, {{"axis", Attr::of_int(1)}});
        x = resnet(x, cat(p, ".resnets.", j), cur + skip_ch, out, 1);
        cur = out;
        if (type == "AttnUpBlock2D") x = attention(x, cat(p, ".attentions.", j), cur, G, 1);
        if (type == "CrossAttnUpBlock2D")
          x = transformer2d(x, cat(p, ".attentions.", j), cur, c.heads[n - 1 - i],
                            c.up_transformer_layers[i]);
      }
      if (i + 1 < n) {
        b.set_scope(p + ".upsamplers.0");
        x = upsample_nearest2x(b, x);
        x = conv(x, p + ".upsamplers.0.conv", cur, cur, 3, 1, 1);
      }
    }
    x = group_norm(x, "conv_norm_out", G, ch[0]);
    x = c.conditional ? act(x) : b.activation(x, "silu");  // conv_act (UNet2DModel: nn.SiLU)
    return conv(x, "conv_out", ch[0], c.out_channels, 3, 1, 1);
  }
};

// UNet2DConditionModel's "encoder_hidden_states" (B,S,cross_attention_dim); "" for UNet2DModel.
std::string encoder_states_input(GraphBuilder& b, const UNet2DConfig& c) {
  if (!c.conditional) return "";
  return b.input("encoder_hidden_states", DType::Float32, {-1, -1, c.cross_attention_dim},
                 {"batch_size", "sequence_length", ""});
}

GraphBuilder unet_builder(uint64_t seed) {
  GraphBuilder b("UNet2DModel", seed);
  b.graph().opsets[""] = 21;  // GroupNormalization with per-channel scale and bias
  return b;
}

}  // namespace

std::shared_ptr<ir::Graph> build_unet2d(const UNet2DConfig& c, uint64_t seed) {
  GraphBuilder b = unet_builder(seed);
  std::string x = image_input(b, "sample", c.in_channels);
  std::string t = batch_input(b, "timestep");
  std::string labels = c.num_class_embeds ? batch_input(b, "class_labels") : "";
  UNet u{b, c, "", encoder_states_input(b, c)};
  std::string y = u.forward(x, t, labels);
  b.set_scope("");
  b.op("Identity", {y}, {}, "model_output");
  b.output("model_output", DType::Float32, {-1, c.out_channels, -1, -1});
  return std::make_shared<ir::Graph>(b.take());
}

Model build_unet2d_training(const UNet2DConfig& c, const Objective& o, uint64_t seed) {
  ONYX_CHECK(c.in_channels == c.out_channels, "UNet2DModel: in_channels ", c.in_channels,
             " != out_channels ", c.out_channels,
             ": a denoiser predicts noise, velocity or the image in the input's shape");
  GraphBuilder b = unet_builder(seed);
  UNet u{b, c, "", ""};
  return diffusion_training_model(
      b, c.in_channels, o,
      [&](const std::string& x_t, const std::string& t) {
        std::string labels = c.num_class_embeds ? batch_input(b, "class_labels") : "";
        u.ctx = encoder_states_input(b, c);
        return u.forward(x_t, t, labels);
      },
      c.raw_json, c.num_class_embeds);
}

}  // namespace onyx::diffusion
