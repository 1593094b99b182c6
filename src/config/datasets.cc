// config/datasets.cc — a config's `train_data` / `eval_data` / `test_data` specs as datasets
// (dataset_from_spec, run_config.h): the spec's type and keys checked and handed to the dataset
// classes of src/data, the tokenizers, chat templates and caption tokenizers they need found.
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <functional>

#include "config/config_values.h"
#include "config/run_config.h"
#include "data/chat_template.h"
#include "data/dataset.h"
#include "data/idx_dataset.h"
#include "data/image_folder.h"
#include "data/preference_dataset.h"
#include "data/prompt_dataset.h"
#include "data/speech_dataset.h"
#include "data/text_datasets.h"
#include "diffusion/diffusers_folder.h"
#include "diffusion/text_encoder.h"
#include "tokenizers/tokenizer.h"
#include "train/grpo.h"

namespace fs = std::filesystem;

namespace onyx::config {

namespace {
// A text dataset's chat template: `chat_template:` (a .jinja file, a model folder, or the
// template itself; "" when not given), else the tokenizer folder's (chat_template.jinja /
// tokenizer_config.json).
data::ChatTemplateFiles chat_template_files(const std::string& tok_path, const std::string& v,
                                            const RunConfig& c, const std::string& what) {
  auto files = data::find_chat_template(tok_path);
  if (v.empty()) return files;
  const std::string file = resolve(c.dir, v);
  if (v.find("{{") == std::string::npos && v.find("{%") == std::string::npos) {
    ONYX_CHECK(fs::exists(file), what, ": chat_template '", v,
               "' is neither a file nor a template (no {{ or {%)");
    auto own = data::find_chat_template(file);
    ONYX_CHECK(!own.source.empty(), what, ": '", file, "' holds no chat template");
    files.source = own.source;
    files.origin = own.origin;
  } else {
    files.source = v;
    files.origin = cat(what, ".chat_template");
  }
  return files;
}

// A text dataset's options take the chat template found for it.
template <class Options>
void set_chat_template(Options& o, const data::ChatTemplateFiles& files) {
  o.chat_template = files.source;
  o.chat_template_origin = files.origin;
  o.special_tokens = files.special_tokens;
}

// An image folder's captions as input_ids: the dataset's `tokenizer`, else the config's, else the
// tokenizer/ of the pipeline the model folder is in; none: the captions are not read. The length
// is `max_length`, else the tokenizer's model_max_length (CLIP's 77 when it has none).
std::function<Tensor(const std::vector<std::string>&)> caption_tokenizer(std::string dir,
                                                                         int64_t max_length,
                                                                         const RunConfig& c,
                                                                         const std::string& what) {
  if (!dir.empty()) dir = resolve(c.dir, dir);
  if (dir.empty()) dir = c.diffusion.tokenizer;
  if (dir.empty() && !c.model.empty()) {
    const std::string root = diffusion::pipeline_root(c.model);
    if (!root.empty() && fs::is_directory(fs::path(root) / "tokenizer"))
      dir = (fs::path(root) / "tokenizer").string();
  }
  if (dir.empty()) return {};
  ONYX_CHECK(max_length >= 0, what, ": max_length must be positive, got ", max_length);
  if (max_length == 0) max_length = diffusion::model_max_length(dir, 77);
  std::shared_ptr<const tokenizers::Tokenizer> tok = tokenizers::load_tokenizer(dir);
  return [tok, max_length](const std::vector<std::string>& captions) {
    return diffusion::prompt_ids(*tok, captions, max_length);
  };
}
}  // namespace

std::shared_ptr<data::Dataset> dataset_from_spec(const DataSpec& d, const RunConfig& c,
                                                 const std::string& which) {
  if (d.spec.empty()) return data::TensorDataset::load(d.path);
  std::string what = cat("config '", c.path, "': '", which, "'");
  YAML::Node n = YAML::Load(d.spec);
  std::map<std::string, std::string> kv;
  for (auto x : n) {
    std::string k = x.first.as<std::string>();
    if (k == "labels" && x.second.IsSequence()) continue;  // the label list, read below
    kv[k] = scalar(x.second, which + "." + k, what);
  }
  auto take = [&](const std::string& k, const std::string& def = "") {
    auto it = kv.find(k);
    if (it == kv.end()) return def;
    std::string v = it->second;
    kv.erase(it);
    return v;
  };
  auto need = [&](const std::string& k) {
    std::string v = take(k);
    ONYX_CHECK(!v.empty(), what, ": '", k, "' is missing");
    return v;
  };
  auto to_int = [&](const std::string& k, const std::string& v) {
    size_t used = 0;
    try {
      const int64_t x = std::stoll(v, &used);
      if (used == v.size()) return x;
    } catch (...) {
    }
    throw Error(cat(what, ": '", k, "' must be an integer, got '", v, "'"));
  };
  auto to_float = [&](const std::string& k, const std::string& v) {
    return (float)finite_number(v, k, what);
  };
  auto to_bool = [&](const std::string& k) { return true_or_false(take(k), k, what); };
  std::string type = take("type", "safetensors");
  std::shared_ptr<data::Dataset> ds;
  if (type == "safetensors") {
    ds = data::TensorDataset::load(resolve(c.dir, need("path")));
  } else if (type == "idx_images") {
    data::IdxImageOptions o;
    if (kv.count("mean")) o.mean = to_float("mean", take("mean"));
    if (kv.count("std")) o.std = to_float("std", take("std"));
    if (kv.count("folder")) {
      std::string folder = resolve(c.dir, take("folder"));
      ds = data::IdxImageDataset::from_folder(
          folder, take("split", which == "train_data" ? "train" : "test"), o);
    } else {
      std::string images = resolve(c.dir, need("images"));
      ds = std::make_shared<data::IdxImageDataset>(images, resolve(c.dir, need("labels")), o);
    }
  } else if (type == "image_folder") {
    data::ImageFolderOptions o;
    o.split = take("split", which == "train_data" ? "train" : "test");
    o.training = which == "train_data";
    if (kv.count("resolution")) o.resolution = to_int("resolution", take("resolution"));
    if (kv.count("center_crop")) o.center_crop = to_bool("center_crop");
    if (kv.count("random_flip")) o.random_flip = to_bool("random_flip");
    if (kv.count("channels")) o.channels = (int)to_int("channels", take("channels"));
    o.caption_column = take("caption_column", o.caption_column);
    const int64_t max_length =
        kv.count("max_length") ? to_int("max_length", take("max_length")) : 0;
    o.tokenize = caption_tokenizer(take("tokenizer"), max_length, c, what);
    ds = std::make_shared<data::ImageFolderDataset>(resolve(c.dir, need("folder")), o);
  } else if (type == "prompts") {
    ONYX_CHECK(c.trainer == "grpo", what,
               ": type prompts is GRPO's data (set `trainer: grpo` and its reward_funcs)");
    ONYX_CHECK(which == "train_data", what,
               ": GRPO's prompts are training data (evaluation on prompts is not built)");
    const std::string tok_path = resolve(c.dir, need("tokenizer"));
    data::PromptOptions o;
    o.format = take("format");
    set_chat_template(o, chat_template_files(tok_path, take("chat_template"), c, what));
    auto prompts = std::make_shared<data::PromptDataset>(resolve(c.dir, need("path")),
                                                         tokenizers::load_tokenizer(tok_path), o);
    try {
      ds = std::make_shared<train::GrpoRollouts>(prompts, grpo_options(c));
    } catch (const Error& e) {
      throw Error(cat(what, ": ", e.what()));
    }
  } else if (type == "preference") {
    const std::string tok_path = resolve(c.dir, need("tokenizer"));
    data::PreferenceOptions o;
    o.format = take("format");
    if (kv.count("max_length")) o.max_length = to_int("max_length", take("max_length"));
    o.truncation_mode = take("truncation_mode", o.truncation_mode);
    if (kv.count("pad_multiple")) o.pad_multiple = to_int("pad_multiple", take("pad_multiple"));
    set_chat_template(o, chat_template_files(tok_path, take("chat_template"), c, what));
    ds = std::make_shared<data::PreferenceDataset>(resolve(c.dir, need("path")),
                                                   tokenizers::load_tokenizer(tok_path), o);
  } else if (type == "speech") {
    const std::string tok_path = resolve(c.dir, need("tokenizer"));
    auto tok = tokenizers::load_tokenizer(tok_path);
    data::SpeechOptions o = data::processor_speech_options(tok_path, *tok);  // then the keys here
    o.format = take("format");
    o.audio_field = take("audio_field", o.audio_field);
    o.text_field = take("text_field", o.text_field);
    for (auto [key, field] :
         {std::pair<const char*, int64_t*>{"feature_size", &o.features.feature_size},
          {"chunk_length", &o.features.chunk_length},
          {"decoder_start_token_id", &o.decoder_start_token_id},
          {"max_label_length", &o.max_label_length}})
      if (kv.count(key)) *field = to_int(key, take(key));
    ds = std::make_shared<data::SpeechDataset>(resolve(c.dir, need("path")), tok, o);
  } else if (type == "text_classification" || type == "causal_lm" || type == "sft") {
    const std::string tok_path = resolve(c.dir, need("tokenizer"));
    auto tok = tokenizers::load_tokenizer(tok_path);
    std::string path = resolve(c.dir, need("path"));
    if (type == "sft") {
      data::SftOptions o;
      o.format = take("format");
      if (kv.count("max_length")) o.max_length = to_int("max_length", take("max_length"));
      if (kv.count("pad_multiple")) o.pad_multiple = to_int("pad_multiple", take("pad_multiple"));
      if (kv.count("completion_only_loss"))
        o.completion_only_loss = to_bool("completion_only_loss");
      if (kv.count("add_eos")) o.add_eos = to_bool("add_eos");
      if (kv.count("packing")) o.packing = to_bool("packing");
      if (kv.count("assistant_only_loss")) o.assistant_only_loss = to_bool("assistant_only_loss");
      o.eos_token = take("eos_token");  // SFTConfig.eos_token
      set_chat_template(o, chat_template_files(tok_path, take("chat_template"), c, what));
      ds = std::make_shared<data::SftDataset>(path, tok, o);
    } else if (type == "causal_lm") {
      data::CausalLMOptions o;
      if (kv.count("block_size")) o.block_size = to_int("block_size", take("block_size"));
      if (kv.count("paragraphs")) o.paragraphs = to_bool("paragraphs");
      ds = std::make_shared<data::CausalLMDataset>(path, tok, o);
    } else {
      data::TextClassificationOptions o;
      o.format = take("format");
      o.text_field = take("text_field", o.text_field);
      o.text_pair_field = take("text_pair_field");
      o.label_field = take("label_field", o.label_field);
      if (kv.count("max_length")) o.max_length = to_int("max_length", take("max_length"));
      if (kv.count("pad_multiple")) o.pad_multiple = to_int("pad_multiple", take("pad_multiple"));
      if (n["labels"] && n["labels"].IsSequence())
        for (auto x : n["labels"]) o.label_list.push_back(x.as<std::string>());
      ds = std::make_shared<data::TextClassificationDataset>(path, tok, o);
    }
  } else {
    throw Error(
        cat(what, ": unknown dataset type '", type,
            "' (safetensors, idx_images, image_folder, text_classification, causal_lm, sft, "
            "preference, prompts, speech)"));
  }
  ONYX_CHECK(kv.empty(), what, ": unknown key '", kv.begin()->first, "' for a ", type, " dataset");
  return ds;
}

}  // namespace onyx::config
