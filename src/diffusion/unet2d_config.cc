// diffusion/unet2d_config.cc — see unet2d_config.h. Defaults and checks follow diffusers 0.42's
// UNet2DModel.__init__ and get_down_block / get_up_block.
#include "diffusion/unet2d_config.h"

#include <nlohmann/json.hpp>

#include "diffusion/config_reader.h"
#include "onyx/error.h"

namespace onyx::diffusion {
namespace {

using json = nlohmann::json;

void check_blocks(const UNet2DConfig& c, const std::string& what) {
  const size_t n = c.block_out_channels.size();
  ONYX_CHECK(c.down_block_types.size() == n && c.up_block_types.size() == n, what,
             ": down_block_types, up_block_types and block_out_channels must have the same length "
             "(got ",
             c.down_block_types.size(), ", ", c.up_block_types.size(), ", ", n, ")");
  const std::string attn = c.conditional ? "CrossAttn" : "Attn";
  const std::string mid = c.conditional ? "UNetMidBlock2DCrossAttn" : "UNetMidBlock2D";
  for (auto& t : c.down_block_types)
    ONYX_CHECK(t == "DownBlock2D" || t == attn + "DownBlock2D", what, ": down block type '", t,
               "' is not supported (onyx builds: DownBlock2D, ", attn, "DownBlock2D)");
  for (auto& t : c.up_block_types)
    ONYX_CHECK(t == "UpBlock2D" || t == attn + "UpBlock2D", what, ": up block type '", t,
               "' is not supported (onyx builds: UpBlock2D, ", attn, "UpBlock2D)");
  ONYX_CHECK(c.mid_block_type.empty() || c.mid_block_type == mid, what, ": mid_block_type '",
             c.mid_block_type, "' is not supported (onyx builds: ", mid, ", null)");
  for (size_t i = 0; i < c.heads.size(); i++)
    ONYX_CHECK(c.heads[i] >= 1 && c.block_out_channels[i] % c.heads[i] == 0, what,
               ": block_out_channels ", c.block_out_channels[i], " is not a multiple of ",
               c.heads[i], " attention heads");
  ONYX_CHECK(c.layers_per_block >= 1, what, ": layers_per_block must be >= 1, got ",
             c.layers_per_block);
  ONYX_CHECK(c.in_channels >= 1 && c.out_channels >= 1, what,
             ": in_channels and out_channels must be >= 1");
  ONYX_CHECK(c.norm_num_groups >= 1, what, ": norm_num_groups must be >= 1");
  for (int64_t ch : c.block_out_channels) {
    ONYX_CHECK(ch >= 1 && ch % c.norm_num_groups == 0, what, ": block_out_channels ", ch,
               " is not a positive multiple of norm_num_groups ", c.norm_num_groups);
    ONYX_CHECK(c.conditional || c.attention_head_dim == 0 || ch % c.attention_head_dim == 0, what,
               ": block_out_channels ", ch, " is not a multiple of attention_head_dim ",
               c.attention_head_dim);
  }
  ONYX_CHECK(
      c.attn_norm_num_groups == 0 || c.block_out_channels.back() % c.attn_norm_num_groups == 0,
      what, ": attn_norm_num_groups ", c.attn_norm_num_groups, " does not divide ",
      c.block_out_channels.back());
  ONYX_CHECK(c.downsample_padding == 0 || c.downsample_padding == 1, what,
             ": downsample_padding must be 0 or 1, got ", c.downsample_padding);
  ONYX_CHECK(c.dropout >= 0 && c.dropout < 1, what, ": dropout must be in [0, 1)");
}

// An integer per block, given as one integer or a list of `n`.
std::vector<int64_t> per_block(const ConfigReader& r, const char* key, int64_t dflt, size_t n) {
  const json* it = r.find(key);
  if (!it) return std::vector<int64_t>(n, dflt);
  if (it->is_number_integer()) return std::vector<int64_t>(n, it->get<int64_t>());
  ONYX_CHECK(it->is_array() && it->size() == n, r.what(), ": '", key,
             "' must be an integer or a list of ", n, " (one per block), got ", it->dump());
  std::vector<int64_t> v;
  for (auto& e : *it) {
    ONYX_CHECK(e.is_number_integer() && e.get<int64_t>() >= 1, r.what(), ": '", key,
               "' has an element that is not a positive integer: ", e.dump());
    v.push_back(e.get<int64_t>());
  }
  return v;
}

// UNet2DConditionModel's keys (Stable Diffusion 1.x/2.x): the cross-attention transformers.
void read_condition_keys(const ConfigReader& r, UNet2DConfig& c) {
  const json& j = r.doc();
  const size_t n = c.block_out_channels.size();
  r.integer("cross_attention_dim", c.cross_attention_dim);
  ONYX_CHECK(c.cross_attention_dim >= 1, r.what(), ": cross_attention_dim must be >= 1");
  // diffusers' naming: num_attention_heads, else attention_head_dim (which means heads here)
  const bool named = j.contains("num_attention_heads") && !j["num_attention_heads"].is_null();
  c.heads = per_block(r, named ? "num_attention_heads" : "attention_head_dim", 8, n);
  c.transformer_layers = per_block(r, "transformer_layers_per_block", 1, n);
  c.up_transformer_layers.assign(c.transformer_layers.rbegin(), c.transformer_layers.rend());
  if (j.contains("reverse_transformer_layers_per_block") &&
      !j["reverse_transformer_layers_per_block"].is_null())
    c.up_transformer_layers = per_block(r, "reverse_transformer_layers_per_block", 1, n);
  r.boolean("use_linear_projection", c.use_linear_projection);
  bool b = false;
  for (const char* key : {"only_cross_attention", "dual_cross_attention", "resnet_skip_time_act",
                          "class_embeddings_concat"}) {
    r.boolean(key, b);
    ONYX_CHECK(!b, r.what(), ": ", key, " true is not supported");
  }
  for (const char* key :
       {"encoder_hid_dim", "encoder_hid_dim_type", "addition_embed_type", "time_cond_proj_dim",
        "timestep_post_act", "time_embedding_act_fn", "cross_attention_norm",
        "projection_class_embeddings_input_dim", "mid_block_only_cross_attention"})
    r.only(key, {"null"});
  r.only("attention_type", {"default"});
  r.only("conv_in_kernel", {"3"});
  r.only("conv_out_kernel", {"3"});
  r.only("resnet_out_scale_factor", {"1", "1.0"});
  const json* ca = r.find("cross_attention_dim");
  ONYX_CHECK(!ca || ca->is_number_integer(), r.what(),
             ": cross_attention_dim must be one integer (a list per block is not supported)");
  ONYX_CHECK(!j.contains("layers_per_block") || j["layers_per_block"].is_number_integer(), r.what(),
             ": layers_per_block must be one integer (a list per block is not supported)");
}

}  // namespace

std::string diffusers_class_name(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return "";
  auto it = j.find("_class_name");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

UNet2DConfig parse_unet2d_config(const std::string& text, const std::string& what) {
  ConfigReader r(text, what);
  const json& j = r.doc();
  std::string cls;
  r.string("_class_name", cls);
  ONYX_CHECK(cls == "UNet2DModel" || cls == "UNet2DConditionModel", what, ": _class_name '", cls,
             "' is not a model onyx builds (UNet2DModel, UNet2DConditionModel)");
  UNet2DConfig c;
  c.raw_json = text;
  c.conditional = cls == "UNet2DConditionModel";
  if (c.conditional) {
    c.in_channels = c.out_channels = 4;
    c.down_block_types = {"CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                          "DownBlock2D"};
    c.up_block_types = {"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                        "CrossAttnUpBlock2D"};
    c.mid_block_type = "UNetMidBlock2DCrossAttn";
    c.block_out_channels = {320, 640, 1280, 1280};
  } else {
    c.down_block_types = {"DownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D"};
    c.up_block_types = {"AttnUpBlock2D", "AttnUpBlock2D", "AttnUpBlock2D", "UpBlock2D"};
    c.block_out_channels = {224, 448, 672, 896};
  }
  if (const json* s = r.find("sample_size")) {
    if (s->is_array()) {
      ONYX_CHECK(s->size() == 2 && (*s)[0] == (*s)[1] && (*s)[0].is_number_integer(), what,
                 ": sample_size must be an integer or a square [h, w], got ", s->dump());
      c.sample_size = (*s)[0].get<int64_t>();
    } else {
      r.integer("sample_size", c.sample_size);
    }
  }
  r.integer("in_channels", c.in_channels);
  r.integer("out_channels", c.out_channels);
  r.boolean("center_input_sample", c.center_input_sample);
  r.only("time_embedding_type", {"positional"});
  r.integer("time_embedding_dim", c.time_embedding_dim);
  r.integer("freq_shift", c.freq_shift);
  r.boolean("flip_sin_to_cos", c.flip_sin_to_cos);
  r.strings("down_block_types", c.down_block_types);
  r.strings("up_block_types", c.up_block_types);
  c.mid_block_type =
      j.contains("mid_block_type") && j["mid_block_type"].is_null() ? "" : c.mid_block_type;
  r.string("mid_block_type", c.mid_block_type);
  r.integers("block_out_channels", c.block_out_channels);
  r.integer("layers_per_block", c.layers_per_block);
  r.number("mid_block_scale_factor", c.mid_block_scale_factor);
  r.integer("downsample_padding", c.downsample_padding);
  r.only("downsample_type", {"conv"});
  r.only("upsample_type", {"conv"});
  r.number("dropout", c.dropout);
  r.string("act_fn", c.act_fn);
  ONYX_CHECK(c.act_fn == "silu" || c.act_fn == "swish" || c.act_fn == "gelu" || c.act_fn == "relu",
             what, ": act_fn '", c.act_fn, "' is not supported (silu, swish, gelu, relu)");
  if (j.contains("attention_head_dim") && j["attention_head_dim"].is_null())
    c.attention_head_dim = 0;
  if (!c.conditional) r.integer("attention_head_dim", c.attention_head_dim);
  r.integer("norm_num_groups", c.norm_num_groups);
  r.integer("attn_norm_num_groups", c.attn_norm_num_groups);
  r.number("norm_eps", c.norm_eps);
  r.string("resnet_time_scale_shift", c.resnet_time_scale_shift);
  ONYX_CHECK(c.resnet_time_scale_shift == "default" || c.resnet_time_scale_shift == "scale_shift",
             what, ": resnet_time_scale_shift '", c.resnet_time_scale_shift,
             "' is not supported (default, scale_shift)");
  r.boolean("add_attention", c.add_attention);
  r.only("class_embed_type", {"null"});  // classes come from num_class_embeds
  r.integer("num_class_embeds", c.num_class_embeds);
  ONYX_CHECK(c.num_class_embeds >= 0, what, ": num_class_embeds must be >= 0");
  if (c.conditional) read_condition_keys(r, c);
  check_blocks(c, what);
  return c;
}

}  // namespace onyx::diffusion
