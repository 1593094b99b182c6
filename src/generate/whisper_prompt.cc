// generate/whisper_prompt.cc — see whisper_prompt.h. The language names are Whisper's tokenizer's
// (Transformers' TO_LANGUAGE_CODE): data, so that `--language german` works as there.
#include "generate/whisper_prompt.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>

#include "io/json.h"
#include "onyx/error.h"

namespace onyx::generate {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::map<std::string, std::string>& language_codes() {
  static const std::map<std::string, std::string> codes = {
      {"english", "en"},     {"chinese", "zh"},    {"german", "de"},
      {"spanish", "es"},     {"russian", "ru"},    {"korean", "ko"},
      {"french", "fr"},      {"japanese", "ja"},   {"portuguese", "pt"},
      {"turkish", "tr"},     {"polish", "pl"},     {"catalan", "ca"},
      {"dutch", "nl"},       {"arabic", "ar"},     {"swedish", "sv"},
      {"italian", "it"},     {"indonesian", "id"}, {"hindi", "hi"},
      {"finnish", "fi"},     {"vietnamese", "vi"}, {"hebrew", "he"},
      {"ukrainian", "uk"},   {"greek", "el"},      {"malay", "ms"},
      {"czech", "cs"},       {"romanian", "ro"},   {"danish", "da"},
      {"hungarian", "hu"},   {"tamil", "ta"},      {"norwegian", "no"},
      {"thai", "th"},        {"urdu", "ur"},       {"croatian", "hr"},
      {"bulgarian", "bg"},   {"lithuanian", "lt"}, {"latin", "la"},
      {"maori", "mi"},       {"malayalam", "ml"},  {"welsh", "cy"},
      {"slovak", "sk"},      {"telugu", "te"},     {"persian", "fa"},
      {"latvian", "lv"},     {"bengali", "bn"},    {"serbian", "sr"},
      {"azerbaijani", "az"}, {"slovenian", "sl"},  {"kannada", "kn"},
      {"estonian", "et"},    {"macedonian", "mk"}, {"breton", "br"},
      {"basque", "eu"},      {"icelandic", "is"},  {"armenian", "hy"},
      {"nepali", "ne"},      {"mongolian", "mn"},  {"bosnian", "bs"},
      {"kazakh", "kk"},      {"albanian", "sq"},   {"swahili", "sw"},
      {"galician", "gl"},    {"marathi", "mr"},    {"punjabi", "pa"},
      {"sinhala", "si"},     {"khmer", "km"},      {"shona", "sn"},
      {"yoruba", "yo"},      {"somali", "so"},     {"afrikaans", "af"},
      {"occitan", "oc"},     {"georgian", "ka"},   {"belarusian", "be"},
      {"tajik", "tg"},       {"sindhi", "sd"},     {"gujarati", "gu"},
      {"amharic", "am"},     {"yiddish", "yi"},    {"lao", "lo"},
      {"uzbek", "uz"},       {"faroese", "fo"},    {"haitian creole", "ht"},
      {"pashto", "ps"},      {"turkmen", "tk"},    {"nynorsk", "nn"},
      {"maltese", "mt"},     {"sanskrit", "sa"},   {"luxembourgish", "lb"},
      {"myanmar", "my"},     {"tibetan", "bo"},    {"tagalog", "tl"},
      {"malagasy", "mg"},    {"assamese", "as"},   {"tatar", "tt"},
      {"hawaiian", "haw"},   {"lingala", "ln"},    {"hausa", "ha"},
      {"bashkir", "ba"},     {"javanese", "jw"},   {"sundanese", "su"},
      {"cantonese", "yue"},  {"burmese", "my"},    {"valencian", "ca"},
      {"flemish", "nl"},     {"haitian", "ht"},    {"letzeburgesch", "lb"},
      {"pushto", "ps"},      {"panjabi", "pa"},    {"moldavian", "ro"},
      {"moldovan", "ro"},    {"sinhalese", "si"},  {"castilian", "es"},
      {"mandarin", "zh"}};
  return codes;
}

int64_t token_id(const json& v, const std::string& what) {
  ONYX_CHECK(v.is_number_integer(), what, " must be a token id (an integer), got ", v.dump());
  return v.get<int64_t>();
}

std::map<std::string, int64_t> id_map(const json& j, const std::string& what) {
  ONYX_CHECK(j.is_object(), what, " must be an object of token ids, got ", j.dump().substr(0, 80));
  std::map<std::string, int64_t> m;
  for (auto& [k, v] : j.items()) m[k] = token_id(v, what + "[\"" + k + "\"]");
  return m;
}

// [[position, token or null], ...]
std::vector<std::pair<int64_t, std::optional<int64_t>>> forced_ids(const json& j,
                                                                   const std::string& what) {
  std::vector<std::pair<int64_t, std::optional<int64_t>>> out;
  if (j.is_null()) return out;
  ONYX_CHECK(j.is_array(), what, " must be a list of [position, token id] pairs");
  for (const json& p : j) {
    ONYX_CHECK(p.is_array() && p.size() == 2, what, ": ", p.dump(),
               " is not a [position, token id]");
    std::optional<int64_t> id;
    if (!p[1].is_null()) id = token_id(p[1], what);
    out.emplace_back(token_id(p[0], what), id);
  }
  return out;
}

std::string text(const json& j, const char* key, const std::string& what) {
  if (!j.contains(key) || j[key].is_null()) return "";
  ONYX_CHECK(j[key].is_string(), what, ": ", key, " must be a string, got ", j[key].dump());
  return j[key].get<std::string>();
}

// [[layer, head], ...]: non-negative integer pairs (the model checks the ranges).
std::vector<std::pair<int64_t, int64_t>> alignment_heads(const json& j, const std::string& what) {
  ONYX_CHECK(j.is_array(), what, " must be a list of [layer, head] pairs, got ", j.dump());
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const json& p : j) {
    ONYX_CHECK(p.is_array() && p.size() == 2 && p[0].is_number_integer() &&
                   p[1].is_number_integer() && p[0].get<int64_t>() >= 0 && p[1].get<int64_t>() >= 0,
               what, ": each entry must be a pair of non-negative integers [layer, head], got ",
               p.dump());
    out.emplace_back(p[0].get<int64_t>(), p[1].get<int64_t>());
  }
  return out;
}

void read_keys(const json& j, const std::string& what, WhisperPromptConfig& c) {
  if (j.contains("lang_to_id") && !j["lang_to_id"].is_null()) {
    c.lang_to_id = id_map(j["lang_to_id"], what + ": lang_to_id");
    c.has_lang_to_id = true;
  }
  if (j.contains("task_to_id") && !j["task_to_id"].is_null()) {
    c.task_to_id = id_map(j["task_to_id"], what + ": task_to_id");
    c.has_task_to_id = true;
  }
  if (j.contains("is_multilingual") && !j["is_multilingual"].is_null()) {
    ONYX_CHECK(j["is_multilingual"].is_boolean(), what, ": is_multilingual must be true or false");
    c.is_multilingual = j["is_multilingual"].get<bool>();
  }
  if (j.contains("no_timestamps_token_id") && !j["no_timestamps_token_id"].is_null())
    c.no_timestamps_token_id =
        token_id(j["no_timestamps_token_id"], what + ": no_timestamps_token_id");
  if (j.contains("return_timestamps") && !j["return_timestamps"].is_null()) {
    ONYX_CHECK(j["return_timestamps"].is_boolean(), what,
               ": return_timestamps must be true or false");
    c.return_timestamps = j["return_timestamps"].get<bool>();
  }
  if (j.contains("max_initial_timestamp_index") && !j["max_initial_timestamp_index"].is_null()) {
    const json& m = j["max_initial_timestamp_index"];
    ONYX_CHECK(m.is_number_integer() && m.get<int64_t>() >= 0 && m.get<int64_t>() < (1 << 20), what,
               ": max_initial_timestamp_index must be a non-negative integer, got ", m.dump());
    c.max_initial_timestamp_index = m.get<int64_t>();
  }
  if (j.contains("prev_sot_token_id") && !j["prev_sot_token_id"].is_null())
    c.prev_sot_token_id = token_id(j["prev_sot_token_id"], what + ": prev_sot_token_id");
  if (j.contains("condition_on_prev_tokens") && !j["condition_on_prev_tokens"].is_null()) {
    ONYX_CHECK(j["condition_on_prev_tokens"].is_boolean(), what,
               ": condition_on_prev_tokens must be true or false");
    c.condition_on_prev_tokens = j["condition_on_prev_tokens"].get<bool>();
  }
  for (auto [key, value] :
       {std::pair{"compression_ratio_threshold", &c.compression_ratio_threshold},
        std::pair{"logprob_threshold", &c.logprob_threshold},
        std::pair{"no_speech_threshold", &c.no_speech_threshold}})
    if (j.contains(key) && !j[key].is_null()) {
      ONYX_CHECK(j[key].is_number(), what, ": ", key, " must be a number, got ", j[key].dump());
      *value = j[key].get<double>();
    }
  if (j.contains("forced_decoder_ids"))
    c.forced_decoder_ids = forced_ids(j["forced_decoder_ids"], what + ": forced_decoder_ids");
  if (j.contains("alignment_heads") && !j["alignment_heads"].is_null())
    c.alignment_heads = alignment_heads(j["alignment_heads"], what + ": alignment_heads");
  c.language = text(j, "language", what);
  c.task = text(j, "task", what);
}

}  // namespace

WhisperPromptConfig read_whisper_prompt_config(const std::string& folder) {
  WhisperPromptConfig c;
  const fs::path gen = fs::path(folder) / "generation_config.json";
  if (fs::exists(gen)) read_keys(io::read_json_file(gen.string()), gen.string(), c);
  const fs::path cfg = fs::path(folder) / "config.json";
  if (!fs::exists(cfg)) return c;
  const json j = io::read_json_file(cfg.string());
  if (c.forced_decoder_ids.empty() && j.contains("forced_decoder_ids"))  // (a fallback)
    c.forced_decoder_ids =
        forced_ids(j["forced_decoder_ids"], cfg.string() + ": forced_decoder_ids");
  if (j.contains("median_filter_width") && !j["median_filter_width"].is_null()) {
    const json& w = j["median_filter_width"];
    ONYX_CHECK(w.is_number_integer() && w.get<int64_t>() > 0 && w.get<int64_t>() % 2 == 1 &&
                   w.get<int64_t>() < 1000,
               cfg.string(), ": median_filter_width must be an odd positive integer, got ",
               w.dump());
    c.median_filter_width = w.get<int64_t>();
  }
  return c;
}

int64_t whisper_language_id(const WhisperPromptConfig& c, const std::string& language) {
  std::string l = language;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char ch) { return std::tolower(ch); });
  std::string token;
  const auto& codes = language_codes();
  if (c.lang_to_id.count(l)) {
    token = l;
  } else if (codes.count(l)) {
    token = "<|" + codes.at(l) + "|>";
  } else {
    for (const auto& [name, code] : codes)
      if (code == l) token = "<|" + code + "|>";
  }
  ONYX_CHECK(!token.empty(), "unsupported language '", language,
             "': give a code (en, de, ...), an English name (english, german, ...) or a token of "
             "the generation config's lang_to_id (<|en|>, ...)");
  ONYX_CHECK(c.lang_to_id.count(token), "language '", language, "' (", token,
             ") is not in this model's generation_config.json lang_to_id");
  return c.lang_to_id.at(token);
}

namespace {

// [start] and what forced_decoder_ids puts at positions 1, 2, ... (-1: a null, to be detected).
std::vector<int64_t> forced_prompt(const WhisperPromptConfig& c, int64_t start) {
  std::vector<int64_t> init = {start};
  auto forced = c.forced_decoder_ids;
  if (forced.empty() || forced.front().first != 1) return init;
  int64_t i = 1;
  while (!forced.empty() && forced.front().first == i) {
    init.push_back(forced.front().second.value_or(-1));
    forced.erase(forced.begin());
    ++i;
  }
  ONYX_CHECK(forced.empty(), "generation_config.json's forced_decoder_ids skip position ", i,
             ": Whisper's prompt needs an entry for every position from 1 on");
  return init;
}

// The task token, <|notimestamps|> (with timestamps: none), and no nulls.
void finish_prompt(const WhisperPromptConfig& c, const std::string& language,
                   const std::string& task, bool timestamps, std::vector<int64_t>& p) {
  if (!task.empty()) {
    ONYX_CHECK(task == "transcribe" || task == "translate", "task '", task,
               "' is not one of transcribe, translate");
    ONYX_CHECK(c.task_to_id.count(task), "task '", task,
               "' is not in this model's generation_config.json task_to_id");
    p.push_back(c.task_to_id.at(task));
  } else if (!language.empty() && c.has_task_to_id) {  // a language alone: transcribe
    bool has_task = false;
    for (const auto& [name, id] : c.task_to_id) has_task |= std::count(p.begin(), p.end(), id) > 0;
    if (!has_task) {
      ONYX_CHECK(c.task_to_id.count("transcribe"),
                 "this model's generation_config.json task_to_id has no transcribe");
      p.push_back(c.task_to_id.at("transcribe"));
    }
  }
  if (!timestamps && c.no_timestamps_token_id >= 0 && p.back() != c.no_timestamps_token_id)
    p.push_back(c.no_timestamps_token_id);
  else if (timestamps && p.back() == c.no_timestamps_token_id)
    p.pop_back();
  p.erase(std::remove(p.begin(), p.end(), -1), p.end());
}

}  // namespace

std::vector<std::vector<int64_t>> whisper_prompts(
    const WhisperPromptConfig& c, int64_t decoder_start_token_id, const std::string& language_flag,
    const std::string& task_flag, bool timestamps, int64_t rows,
    const std::function<std::vector<int64_t>()>& detect) {
  ONYX_CHECK(!timestamps || c.no_timestamps_token_id >= 0,
             "timestamps: this model's generation_config.json has no no_timestamps_token_id "
             "(the timestamp tokens follow it)");
  ONYX_CHECK(!c.is_multilingual.has_value() || *c.is_multilingual ||
                 (language_flag.empty() && task_flag.empty()),
             "--language / --task: this is an English-only Whisper (is_multilingual false)");
  ONYX_CHECK(language_flag.empty() || c.has_lang_to_id,
             "--language: this model's generation_config.json has no lang_to_id");
  ONYX_CHECK(task_flag.empty() || c.has_task_to_id,
             "--task: this model's generation_config.json has no task_to_id");
  const std::string language = language_flag.empty() ? c.language : language_flag;
  const std::string task = task_flag.empty() ? c.task : task_flag;
  const std::vector<int64_t> init = task.empty() && language.empty()
                                        ? forced_prompt(c, decoder_start_token_id)
                                        : std::vector<int64_t>{decoder_start_token_id};
  std::vector<int64_t> lang(rows, -1);
  if (!language.empty())
    std::fill(lang.begin(), lang.end(), whisper_language_id(c, language));
  else if (c.has_lang_to_id && (init.size() <= 1 || init[1] == -1))
    lang = detect();
  ONYX_CHECK((int64_t)lang.size() == rows, "language detection gave ", lang.size(),
             " languages for ", rows, " rows");
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> p = init;
    if (lang[r] >= 0) {
      if (p.size() > 1)
        p[1] = lang[r];
      else
        p.push_back(lang[r]);
    }
    finish_prompt(c, language, task, timestamps, p);
    prompts.push_back(std::move(p));
  }
  return prompts;
}

std::vector<int64_t> detect_whisper_languages(Generator& gen, const WhisperPromptConfig& c,
                                              int64_t start,
                                              const std::map<std::string, Tensor>& encoder_inputs) {
  ONYX_CHECK(!encoder_inputs.empty(), "language detection: no encoder inputs");
  GenerationConfig one;
  one.max_new_tokens = 1;
  one.length_given = true;
  one.decoder_start_token_id = start;
  std::set<int64_t> langs;
  for (const auto& [token, id] : c.lang_to_id) langs.insert(id);
  for (int64_t t = 0; t < gen.config().vocab_size; t++)
    if (!langs.count(t)) one.suppress_tokens.push_back(t);
  const int64_t rows = encoder_inputs.begin()->second.dim(0);
  std::vector<std::vector<int64_t>> ids((size_t)rows, {start});
  std::vector<int64_t> out;
  for (const auto& row : gen.generate(ids, one, nullptr, encoder_inputs)) out.push_back(row.at(0));
  return out;
}

}  // namespace onyx::generate
