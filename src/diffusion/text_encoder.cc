// diffusion/text_encoder.cc — see text_encoder.h.
#include "diffusion/text_encoder.h"

#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>

#include "diffusion/diffusers_folder.h"
#include "io/json.h"
#include "ir/graph.h"
#include "kernels/cpu/philox.h"
#include "models/hf_weights.h"
#include "runtime/session.h"
#include "tokenizers/tokenizer.h"

namespace fs = std::filesystem;

namespace onyx::diffusion {

struct TextEncoder::Impl {
  std::string encoder_dir, tokenizer_dir;
  models::BuiltModel model;
  std::shared_ptr<tokenizers::Tokenizer> tokenizer;
  int64_t max_length = 77;
  std::unique_ptr<runtime::Session> session;
  std::mutex run_mu;  // one run at a time (the session's arena is shared)
};

int64_t model_max_length(const std::string& tokenizer_dir, int64_t positions) {
  const fs::path file = fs::path(tokenizer_dir) / "tokenizer_config.json";
  if (!fs::exists(file)) return positions;
  const nlohmann::json tc = io::read_json_file(file.string());
  if (tc.is_object() && tc.contains("model_max_length") &&
      tc["model_max_length"].is_number_integer()) {
    const int64_t n = tc["model_max_length"].get<int64_t>();
    if (n > 0 && n <= positions) return n;
  }
  return positions;
}

Tensor prompt_ids(const tokenizers::Tokenizer& tokenizer, const std::vector<std::string>& prompts,
                  int64_t max_length) {
  const int64_t L = max_length;
  Tensor ids(DType::Int64, {(int64_t)prompts.size(), L});
  tokenizers::EncodeOptions o;
  o.max_length = o.pad_to = L;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto e = tokenizer.encode(prompts[i], o);
    std::copy(e.input_ids.begin(), e.input_ids.end(), ids.data<int64_t>() + (int64_t)i * L);
  }
  return ids;
}

std::shared_ptr<TextEncoder> TextEncoder::open(const std::string& encoder_dir,
                                               const std::string& tokenizer_dir) {
  auto t = std::shared_ptr<TextEncoder>(new TextEncoder());
  t->impl_ = std::make_unique<Impl>();
  Impl& m = *t->impl_;
  m.encoder_dir = encoder_dir;
  m.tokenizer_dir = tokenizer_dir;
  const fs::path config = fs::path(encoder_dir) / "config.json";
  ONYX_CHECK(fs::exists(config), "text encoder folder '", encoder_dir,
             "' has no config.json (a CLIPTextModel folder)");
  const nlohmann::json cj = io::read_json_file(config.string());
  const bool typed = cj.is_object() && cj.contains("model_type") && cj["model_type"].is_string();
  ONYX_CHECK(typed && cj["model_type"] == "clip_text_model", "text encoder folder '", encoder_dir,
             "': config.json's model_type is ", typed ? cj["model_type"].dump() : "missing",
             "; the text encoder is a CLIPTextModel (model_type clip_text_model)");
  m.model = models::load_hf_folder(encoder_dir, models::Task::Base);
  if (!m.model.missing_keys.empty())
    throw Error(cat("text encoder folder '", encoder_dir, "' lacks ", m.model.missing_keys.size(),
                    " weights (e.g. '", m.model.missing_keys.front(),
                    "'): a frozen encoder must have them all"));
  m.tokenizer = tokenizers::load_tokenizer(tokenizer_dir);
  m.max_length = model_max_length(tokenizer_dir, m.model.config.max_position_embeddings);
  m.session = std::make_unique<runtime::Session>(m.model.model.graph);
  m.session->check_supported();
  return t;
}

std::shared_ptr<TextEncoder> TextEncoder::beside(const std::string& unet_dir) {
  const std::string root = pipeline_root(unet_dir);
  if (root.empty()) return nullptr;
  const fs::path parent(root), enc = parent / "text_encoder", tok = parent / "tokenizer";
  if (!fs::is_directory(enc) && !fs::is_directory(tok)) return nullptr;
  ONYX_CHECK(fs::is_directory(enc) && fs::is_directory(tok), "the pipeline folder '",
             parent.string(), "' has ", fs::is_directory(enc) ? "text_encoder/" : "tokenizer/",
             " but no ", fs::is_directory(enc) ? "tokenizer/" : "text_encoder/");
  return open(enc.string(), tok.string());
}

std::shared_ptr<TextEncoder> TextEncoder::of_model(const std::string& unet_dir) {
  const fs::path enc = fs::path(unet_dir) / "text_encoder", tok = fs::path(unet_dir) / "tokenizer";
  if (fs::is_directory(enc) && fs::is_directory(tok)) return open(enc.string(), tok.string());
  return beside(unet_dir);
}

TextEncoder::~TextEncoder() = default;

Tensor TextEncoder::input_ids(const std::vector<std::string>& prompts) const {
  return prompt_ids(*impl_->tokenizer, prompts, impl_->max_length);
}

Tensor TextEncoder::encode(const Tensor& input_ids) const {
  ONYX_CHECK(input_ids.dtype() == DType::Int64 && input_ids.rank() == 2,
             "the text encoder takes input_ids (N, length) int64, got ",
             dtype_name(input_ids.dtype()), " ", shape_str(input_ids.shape()));
  const auto& c = impl_->model.config;
  ONYX_CHECK(input_ids.dim(1) >= 1 && input_ids.dim(1) <= c.max_position_embeddings,
             "input_ids of length ", input_ids.dim(1), ": the text encoder '", impl_->encoder_dir,
             "' takes 1 to ", c.max_position_embeddings, " tokens");
  const int64_t* p = input_ids.data<int64_t>();
  for (int64_t i = 0; i < input_ids.numel(); ++i)
    ONYX_CHECK(p[i] >= 0 && p[i] < c.vocab_size, "input_ids holds ", p[i],
               ", outside the text encoder's vocabulary of ", c.vocab_size);
  Tensor mask(DType::Int64, input_ids.shape());  // no attention mask: every position attends
  std::fill(mask.data<int64_t>(), mask.data<int64_t>() + mask.numel(), (int64_t)1);
  std::lock_guard<std::mutex> lock(impl_->run_mu);
  return impl_->session->run({{"input_ids", input_ids}, {"attention_mask", mask}})
      .at("last_hidden_state");
}

int64_t TextEncoder::hidden_size() const { return impl_->model.config.hidden_size; }
int64_t TextEncoder::max_length() const { return impl_->max_length; }
const std::string& TextEncoder::encoder_dir() const { return impl_->encoder_dir; }
const std::string& TextEncoder::tokenizer_dir() const { return impl_->tokenizer_dir; }

namespace {

// Rows of input_ids (N, L) replaced by the empty prompt's with probability p each, the draw
// keyed on the seed, the row's ids and its pixels (when the batch has pixel_values).
void drop_captions(Tensor& ids, const Tensor& empty, const Tensor* pixels, double p,
                   uint64_t seed) {
  const int64_t N = ids.dim(0), L = ids.dim(1);
  const int64_t per_image = pixels ? pixels->nbytes() / N : 0;
  for (int64_t r = 0; r < N; ++r) {
    int64_t* row = ids.data<int64_t>() + r * L;
    uint64_t h = kernels::fnv1a_bytes(kernels::kFnvOffset ^ seed, row, (size_t)L * sizeof(int64_t));
    if (pixels)
      h = kernels::fnv1a_bytes(h, static_cast<const char*>(pixels->raw()) + r * per_image,
                               (size_t)per_image);
    const double u = (double)(kernels::mix_seed(h) >> 11) * 0x1.0p-53;
    if (u < p) std::copy(empty.data<int64_t>(), empty.data<int64_t>() + L, row);
  }
}

}  // namespace

void condition_on_text(Model& m, std::shared_ptr<const TextEncoder> encoder,
                       std::vector<std::string> captions, double proportion_empty_prompts,
                       uint64_t seed) {
  ONYX_CHECK(proportion_empty_prompts >= 0 && proportion_empty_prompts <= 1,
             "proportion_empty_prompts must be in [0, 1], got ", proportion_empty_prompts);
  const Tensor empty = encoder->input_ids({""});
  const ir::ValueInfo* in = nullptr;
  for (auto& v : m.graph->inputs)
    if (v.name == "encoder_hidden_states") in = &v;
  ONYX_CHECK(in, "a text encoder ('", encoder->encoder_dir(),
             "') conditions a UNet2DConditionModel; this model takes no encoder_hidden_states");
  if (in->has_shape && in->shape.size() == 3 && in->shape[2] > 0)
    ONYX_CHECK(in->shape[2] == encoder->hidden_size(), "the text encoder '", encoder->encoder_dir(),
               "' gives ", encoder->hidden_size(),
               "-wide hidden states; the UNet's cross_attention_dim is ", in->shape[2]);
  auto previous = m.fill_defaults;
  m.fill_defaults = [encoder, captions, previous, empty, p = proportion_empty_prompts,
                     seed](std::map<std::string, Tensor>& batch) {
    if (!batch.count("encoder_hidden_states")) {
      if (!captions.empty() && !batch.count("input_ids")) {
        auto labels = batch.find("labels");
        ONYX_CHECK(labels != batch.end(), "captions are given per class: the data needs labels");
        std::vector<std::string> prompts;
        const Tensor& l = labels->second;
        ONYX_CHECK(l.dtype() == DType::Int64 && l.rank() == 1, "labels must be (batch) int64");
        for (int64_t i = 0; i < l.numel(); ++i) {
          const int64_t k = l.data<int64_t>()[i];
          ONYX_CHECK(k >= 0 && k < (int64_t)captions.size(), "label ", k, " has no caption (",
                     captions.size(), " captions are given)");
          prompts.push_back(captions[k]);
        }
        batch["input_ids"] = encoder->input_ids(prompts);
        batch.erase("labels");
      }
      auto ids = batch.find("input_ids");
      ONYX_CHECK(ids != batch.end(),
                 "text-to-image training needs input_ids (tokenized captions), captions per "
                 "class with labels, or encoder_hidden_states in the data");
      if (p > 0) {
        ONYX_CHECK(ids->second.dtype() == DType::Int64 && ids->second.rank() == 2 &&
                       ids->second.dim(1) == empty.dim(1),
                   "input_ids must be (batch, ", empty.dim(1), ") int64 (the tokenizer's length)");
        auto px = batch.find("pixel_values");
        drop_captions(ids->second, empty, px == batch.end() ? nullptr : &px->second, p, seed);
      }
      batch["encoder_hidden_states"] = encoder->encode(ids->second);
    }
    batch.erase("input_ids");
    if (previous) previous(batch);
  };
  m.optional_inputs.insert("encoder_hidden_states");  // (made from input_ids or captions)
  m.side_folders["text_encoder"] = encoder->encoder_dir();
  m.side_folders["tokenizer"] = encoder->tokenizer_dir();
}

}  // namespace onyx::diffusion

namespace onyx::diffusion {

void encode_prompts(const std::string& model_dir, const PromptOptions& p, SampleOptions& o) {
  ONYX_CHECK(!p.prompts.empty(), "no prompt to encode");
  ONYX_CHECK(p.per_prompt >= 1 && p.per_prompt <= 10000,
             "images per prompt must be in [1, 10000], got ", p.per_prompt);
  ONYX_CHECK(p.text_encoder.empty() == p.tokenizer.empty(),
             "a text encoder folder and its tokenizer folder go together");
  auto encoder = !p.text_encoder.empty() ? TextEncoder::open(p.text_encoder, p.tokenizer)
                                         : TextEncoder::of_model(model_dir);
  ONYX_CHECK(encoder, "prompts need a text encoder: '", model_dir,
             "' has no text_encoder/ and tokenizer/ (nor does its pipeline folder); give "
             "their folders");
  std::vector<std::string> rows, negative;
  for (auto& prompt : p.prompts)
    for (int64_t k = 0; k < p.per_prompt; ++k) rows.push_back(prompt);
  o.encoder_hidden_states = encoder->encode(rows);
  if (o.guidance_scale > 1)
    o.negative_encoder_hidden_states =
        encoder->encode(std::vector<std::string>(rows.size(), p.negative_prompt));
  o.num_images = (int64_t)rows.size();
}

}  // namespace onyx::diffusion
