// generation_config.cc — generation settings from generation_config.json / config.json and the
// checks they share with the CLI's flags (generation_config.h).
#include "generate/generation_config.h"

#include <cmath>
#include <filesystem>
#include <iostream>
#include <optional>

#include "io/json.h"
#include "onyx/error.h"

namespace fs = std::filesystem;

namespace onyx::generate {

namespace {

// eos_token_id as an int or a list of ints; nullopt when absent or null.
std::optional<std::vector<int64_t>> id_list(const nlohmann::json& j, const char* key,
                                            const std::string& what) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const auto& v = j[key];
  auto id = [&](const nlohmann::json& e) {
    ONYX_CHECK(e.is_number_integer() && e.get<int64_t>() >= 0, what, ": '", key,
               "' must be a token id (an integer >= 0) or a list of them, got ", e.dump());
    return e.get<int64_t>();
  };
  std::vector<int64_t> out;
  if (v.is_array()) {
    for (auto& e : v) out.push_back(id(e));
  } else {
    out.push_back(id(v));
  }
  return out;
}

// generation_config.json's keys as Transformers types them: integers must be JSON integers (top_k
// 1.5 is an error there too: TopKLogitsWarper), floats any finite number, flags true/false.
struct ConfigReader {
  const nlohmann::json& j;
  const std::string& what;
  const nlohmann::json* find(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  void integer(const char* key, int64_t& field) const {
    if (const nlohmann::json* v = find(key)) {
      ONYX_CHECK(v->is_number_integer(), what, ": '", key, "' must be an integer, got ", v->dump());
      ONYX_CHECK(v->is_number_unsigned() || v->get<int64_t>() >= INT32_MIN, what, ": '", key,
                 "' is out of range: ", v->dump());
      field = v->is_number_unsigned() && v->get<uint64_t>() > (uint64_t)INT64_MAX
                  ? INT64_MAX
                  : v->get<int64_t>();
    }
  }
  void number(const char* key, double& field) const {
    if (const nlohmann::json* v = find(key)) {
      ONYX_CHECK(v->is_number(), what, ": '", key, "' must be a number, got ", v->dump());
      field = v->get<double>();
    }
  }
  void flag(const char* key, bool& field) const {
    if (const nlohmann::json* v = find(key)) {
      ONYX_CHECK(v->is_boolean(), what, ": '", key, "' must be true or false, got ", v->dump());
      field = v->get<bool>();
    }
  }
};

void warn_unimplemented(const nlohmann::json& j, const GenerationConfig& cfg,
                        const std::string& what) {
  // Decoding options not implemented here, with the value that means "off".
  const std::pair<const char*, nlohmann::json> off[] = {
      {"num_beam_groups", 1},
      {"num_return_sequences", 1},
      {"penalty_alpha", nullptr},
      {"typical_p", 1.0},
      {"epsilon_cutoff", 0.0},
      {"eta_cutoff", 0.0},
      {"min_p", nullptr},
      {"diversity_penalty", 0.0},
      {"guidance_scale", nullptr},
      {"bad_words_ids", nullptr},
      {"sequence_bias", nullptr},
      {"exponential_decay_length_penalty", nullptr},
      {"encoder_repetition_penalty", 1.0},
      {"renormalize_logits", false}};
  if (cfg.num_beams > 1 && cfg.do_sample)
    std::cerr << "Warning: " << what << ": beam sampling (num_beams " << cfg.num_beams
              << " with do_sample) is not implemented by onyx's generate: beam search without "
                 "sampling, so the text differs from Transformers' generate\n";
  for (auto& [key, value] : off) {
    if (!j.contains(key) || j[key] == value || j[key].is_null() ||
        (key == std::string("guidance_scale") && j[key] == 1.0))
      continue;
    std::cerr << "Warning: " << what << ": '" << key << "' " << j[key].dump()
              << " is not implemented by onyx's generate (greedy decoding or sampling, with "
                 "beam search, repetition_penalty, no_repeat_ngram_size, min_length, "
                 "min_new_tokens, forced_bos/eos_token_id and (begin_)suppress_tokens): "
                 "decoding without it, so the text differs from Transformers' generate\n";
  }
}

}  // namespace

GenerationConfig apply_generation_config_json(const nlohmann::json& j, GenerationConfig cfg,
                                              const std::string& what, bool token_ids_only) {
  ONYX_CHECK(j.is_object(), what, ": expected a JSON object, got ", j.type_name());
  if (auto eos = id_list(j, "eos_token_id", what)) cfg.eos_token_ids = *eos;
  if (auto pad = id_list(j, "pad_token_id", what); pad && !pad->empty())
    cfg.pad_token_id = (*pad)[0];
  if (auto start = id_list(j, "decoder_start_token_id", what); start && !start->empty())
    cfg.decoder_start_token_id = (*start)[0];
  // (config.json's too, as GenerationConfig.from_model_config takes them)
  if (auto bos = id_list(j, "forced_bos_token_id", what); bos && !bos->empty())
    cfg.forced_bos_token_id = (*bos)[0];
  if (auto eos = id_list(j, "forced_eos_token_id", what)) cfg.forced_eos_token_ids = *eos;
  if (auto s = id_list(j, "suppress_tokens", what)) cfg.suppress_tokens = *s;
  if (auto s = id_list(j, "begin_suppress_tokens", what)) cfg.begin_suppress_tokens = *s;
  if (token_ids_only) return cfg;
  const ConfigReader r{j, what};
  r.flag("do_sample", cfg.do_sample);
  r.number("temperature", cfg.temperature);
  r.integer("top_k", cfg.top_k);
  r.number("top_p", cfg.top_p);
  r.integer("max_new_tokens", cfg.max_new_tokens);
  cfg.length_given |= r.find("max_new_tokens") || r.find("max_length");
  if (r.find("max_new_tokens"))
    ONYX_CHECK(cfg.max_new_tokens > 0, what, ": 'max_new_tokens' must be in [1, ",
               kMaxGenerationLength, "], got ", cfg.max_new_tokens);
  r.number("repetition_penalty", cfg.repetition_penalty);
  r.integer("no_repeat_ngram_size", cfg.no_repeat_ngram_size);
  r.integer("min_length", cfg.min_length);
  r.integer("min_new_tokens", cfg.min_new_tokens);
  r.integer("num_beams", cfg.num_beams);
  r.number("length_penalty", cfg.length_penalty);
  if (const nlohmann::json* e = r.find("early_stopping")) {
    ONYX_CHECK(e->is_boolean() || (e->is_string() && e->get<std::string>() == "never"), what,
               ": 'early_stopping' must be true, false or \"never\", got ", e->dump());
    cfg.early_stopping = e->is_boolean() ? (e->get<bool>() ? "true" : "false") : "never";
  }
  // max_length counts only without max_new_tokens (which takes precedence, as in Transformers)
  if (r.find("max_length") && !r.find("max_new_tokens")) {
    r.integer("max_length", cfg.max_length);
    cfg.max_new_tokens = -1;
  }
  validate_generation_config(cfg, what);
  warn_unimplemented(j, cfg, what);
  return cfg;
}

void validate_generation_config(const GenerationConfig& cfg, const std::string& what) {
  // The checks Transformers makes when generate() builds its logits processors and warpers
  // (a NaN passes some of theirs; it is refused here), and the bounds on lengths.
  auto finite = [&](double v, const char* key) {
    ONYX_CHECK(std::isfinite(v), what, ": '", key, "' must be a finite number, got ", v);
  };
  finite(cfg.temperature, "temperature");
  finite(cfg.top_p, "top_p");
  finite(cfg.repetition_penalty, "repetition_penalty");
  finite(cfg.length_penalty, "length_penalty");
  if (cfg.do_sample)
    ONYX_CHECK(cfg.temperature > 0, what, ": 'temperature' (", cfg.temperature,
               ") has to be strictly positive when sampling (for greedy decoding set do_sample "
               "false)");
  ONYX_CHECK(cfg.temperature >= 0, what, ": 'temperature' must be >= 0, got ", cfg.temperature);
  ONYX_CHECK(cfg.top_k >= 0, what, ": 'top_k' must be >= 0 (0: off), got ", cfg.top_k);
  ONYX_CHECK(cfg.top_p >= 0 && cfg.top_p <= 1, what, ": 'top_p' must be in [0, 1], got ",
             cfg.top_p);
  ONYX_CHECK(cfg.repetition_penalty > 0, what,
             ": 'repetition_penalty' must be strictly positive, got ", cfg.repetition_penalty);
  ONYX_CHECK(cfg.no_repeat_ngram_size >= 0 && cfg.min_length >= 0 && cfg.min_new_tokens >= 0, what,
             ": 'no_repeat_ngram_size', 'min_length' and 'min_new_tokens' must be >= 0");
  ONYX_CHECK(cfg.num_beams >= 1 && cfg.num_beams <= kMaxBeams, what,
             ": 'num_beams' must be in [1, ", kMaxBeams, "], got ", cfg.num_beams);
  if (cfg.max_new_tokens != -1)  // -1: up to max_length
    ONYX_CHECK(cfg.max_new_tokens > 0 && cfg.max_new_tokens <= kMaxGenerationLength, what,
               ": 'max_new_tokens' must be in [1, ", kMaxGenerationLength, "], got ",
               cfg.max_new_tokens);
  else
    ONYX_CHECK(cfg.max_length > 0 && cfg.max_length <= kMaxGenerationLength, what,
               ": 'max_length' must be in [1, ", kMaxGenerationLength, "], got ", cfg.max_length);
  for (int64_t id : cfg.eos_token_ids)
    ONYX_CHECK(id >= 0, what, ": 'eos_token_id' must be >= 0, got ", id);
}

void check_generation_token_ids(const GenerationConfig& cfg, int64_t vocab_size,
                                const std::string& what) {
  for (int64_t id : cfg.eos_token_ids)
    ONYX_CHECK(id >= 0 && id < vocab_size, what, ": eos_token_id ", id,
               " is not a token of the model (vocab_size ", vocab_size, ")");
  ONYX_CHECK(cfg.pad_token_id < vocab_size, what, ": pad_token_id ", cfg.pad_token_id,
             " is not a token of the model (vocab_size ", vocab_size, ")");
  auto check = [&](const std::vector<int64_t>& ids, const char* key) {
    for (int64_t id : ids)
      ONYX_CHECK(id >= 0 && id < vocab_size, what, ": ", key, " ", id,
                 " is not a token of the model (vocab_size ", vocab_size, ")");
  };
  check(cfg.forced_eos_token_ids, "forced_eos_token_id");
  // (suppressed tokens outside the vocabulary are no tokens to suppress, as Transformers has it)
  ONYX_CHECK(cfg.forced_bos_token_id < vocab_size && cfg.decoder_start_token_id < vocab_size, what,
             ": forced_bos_token_id ", cfg.forced_bos_token_id, " / decoder_start_token_id ",
             cfg.decoder_start_token_id, " is not a token of the model (vocab_size ", vocab_size,
             ")");
}

GenerationConfig read_generation_config(const std::string& dir, GenerationConfig cfg) {
  fs::path d(dir);
  // config.json first, generation_config.json over it (Transformers' GenerationConfig.from_model
  // _config and from_pretrained): token ids from either, decoding options from the latter.
  for (const char* name : {"config.json", "generation_config.json"}) {
    fs::path p = d / name;
    if (!fs::exists(p)) continue;
    cfg = apply_generation_config_json(io::read_json_file(p.string()), cfg, p.string(),
                                       std::string(name) == "config.json");
  }
  return cfg;
}

}  // namespace onyx::generate
