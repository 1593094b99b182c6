// cmd_generate.cc — `onyx generate MODEL_OR_CHECKPOINT --prompt TEXT | --prompts FILE
// [--max_new_tokens N] [--do_sample] [--temperature T --top_k K --top_p P --seed S]
// [--num_beams N --repetition_penalty P --no_repeat_ngram_size N --min_new_tokens N]`: text from a
// causal LM with a key/value cache (generate/generate.h), prompts batched with left padding.
// An encoder–decoder (Whisper, BART, T5) generates from its encoder's inputs: --encoder_inputs
// FILE.safetensors, Whisper's features of --audio WAV files, or BART's / T5's tokenized --prompt
// texts; its decoder prompt is decoder_start_token_id, then any --decoder_prompt_ids (Whisper's
// language and task tokens).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <set>

#include "commands.h"
#include "data/chat_template.h"
#include "generate/generate.h"
#include "generate/whisper_prompt.h"
#include "generate/whisper_words.h"
#include "io/safetensors.h"
#include "onyx/error.h"
#include "tokenizers/tokenizer.h"
#include "whisper_audio.h"

namespace fs = std::filesystem;

namespace onyx::cli {

namespace {

struct Prompt {
  std::string text;
  nlohmann::ordered_json messages;  // a conversation ("messages" rows, or --chat)
  std::vector<int64_t> ids;         // given as ids ("prompt_ids"), else tokenized from text
  bool as_ids = false;
};

// Prompts from a file: JSON lines with "prompt" (or "text") or token ids "prompt_ids", else one
// prompt per non-empty line.
std::vector<Prompt> read_prompts(const std::string& path) {
  std::ifstream f(path);
  ONYX_CHECK(f, path, ": cannot read the prompts file");
  std::vector<Prompt> out;
  std::string line;
  int64_t n = 0;
  const bool jsonl = path.size() > 6 && path.substr(path.size() - 6) == ".jsonl";
  while (std::getline(f, line)) {
    n++;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (!jsonl) {
      out.push_back({line, {}});
      continue;
    }
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      throw Error(cat(path, ":", n, ": not valid JSON: ", e.what()));
    }
    ONYX_CHECK(j.is_object(), path, ":", n, ": not a JSON object");
    if (j.contains("messages")) {
      ONYX_CHECK(j["messages"].is_array(), path, ":", n,
                 ": \"messages\" must be a list of {role, content}");
      Prompt p;
      p.messages = nlohmann::ordered_json::parse(j["messages"].dump());
      out.push_back(std::move(p));
      continue;
    }
    if (j.contains("prompt_ids")) {
      Prompt p;
      p.as_ids = true;
      try {
        p.ids = j["prompt_ids"].get<std::vector<int64_t>>();
      } catch (const std::exception&) {
        throw Error(cat(path, ":", n, ": \"prompt_ids\" must be a list of token ids"));
      }
      out.push_back(std::move(p));
      continue;
    }
    const char* key = j.contains("prompt") ? "prompt" : "text";
    ONYX_CHECK(j.contains(key) && j[key].is_string(), path, ":", n,
               ": needs a string \"prompt\" (or \"text\") or a list \"prompt_ids\"");
    out.push_back({j[key].get<std::string>(), {}});
  }
  ONYX_CHECK(!out.empty(), path, ": no prompts in the file");
  return out;
}

struct GenerateOpts {
  std::string model, prompts_file, tokenizer, output;
  std::vector<std::string> prompts;
  // encoder–decoders
  std::string encoder_inputs;
  std::vector<std::string> audio;
  std::vector<int64_t> decoder_prompt_ids;
  std::string language, task;       // Whisper's
  std::vector<int64_t> prompt_ids;  // Whisper's previous-text prompt (<|startofprev|> ...)
  std::string initial_prompt;       // the same from text
  // Decoding flags: set only when given (CLI11 leaves an absent optional empty), so that any
  // value given, -3 included, reaches the validation instead of reading as "absent".
  std::optional<int64_t> max_new_tokens, top_k, no_repeat_ngram_size, min_new_tokens, num_beams;
  std::optional<double> top_p, repetition_penalty;
  std::vector<double> temperature;  // one: sampling's; several: Whisper's fallback temperatures
  std::optional<double> compression_ratio_threshold, logprob_threshold, no_speech_threshold;
  int64_t batch_size = 8;
  uint64_t seed = 0;
  bool do_sample = false, greedy = false, timings = false, chat = false;
  bool return_timestamps = false;  // Whisper's
  bool return_token_timestamps = false, word_timestamps = false;
  bool condition_on_prev_tokens = false;
};

void add_decoding_options(CLI::App* cmd, GenerateOpts& o) {
  cmd->add_option("--max_new_tokens,--max-new-tokens", o.max_new_tokens,
                  "tokens to generate per prompt (default: generation_config.json, else 20)");
  cmd->add_flag("--do_sample,--do-sample", o.do_sample,
                "sample (implied by --temperature, --top_k or --top_p)");
  cmd->add_flag("--greedy", o.greedy, "greedy decoding even if generation_config.json samples");
  cmd->add_option("--temperature", o.temperature,
                  "sampling temperature (0: greedy); Whisper: several, comma-separated (0,0.2,"
                  "0.4,0.6,0.8,1), are the temperature fallback's, as generate(temperature=(...)): "
                  "a window failing a threshold below is decoded again at the next")
      ->delimiter(',');
  cmd->add_option("--top_k,--top-k", o.top_k, "keep the k most likely tokens (0: all; default 50)");
  cmd->add_option("--top_p,--top-p", o.top_p, "nucleus sampling: smallest set with this mass");
  cmd->add_option("--seed", o.seed, "sampling seed (default 0)");
  cmd->add_option("--repetition_penalty,--repetition-penalty", o.repetition_penalty,
                  "divide (multiply, when negative) the logits of tokens already in the row by "
                  "this (default: generation_config.json, else 1: off)");
  cmd->add_option("--no_repeat_ngram_size,--no-repeat-ngram-size", o.no_repeat_ngram_size,
                  "never repeat an n-gram of the row (default: generation_config.json, else 0)");
  cmd->add_option("--num_beams,--num-beams", o.num_beams,
                  "beam search with this many beams (default: generation_config.json, else 1: "
                  "greedy or sampling)");
  cmd->add_option("--min_new_tokens,--min-new-tokens", o.min_new_tokens,
                  "no end-of-sequence token before this many new tokens (default: "
                  "generation_config.json, else 0)");
}

void add_prompt_options(CLI::App* cmd, GenerateOpts& o) {
  cmd->add_option("model", o.model,
                  "a Hugging Face model folder or an onyx checkpoint of one (LoRA adapters merged)")
      ->required();
  cmd->add_option("--prompt", o.prompts, "a prompt (repeatable)");
  cmd->add_option("--prompts", o.prompts_file,
                  "a file of prompts: one per line, or JSON lines with \"prompt\"");
  cmd->add_option("--encoder_inputs,--encoder-inputs", o.encoder_inputs,
                  "an encoder–decoder's encoder inputs, one row per output (.safetensors: "
                  "input_features, or input_ids and attention_mask)");
  cmd->add_option("--audio", o.audio,
                  "Whisper: a WAV file to transcribe (resampled to 16 kHz; repeatable)");
  cmd->add_option("--decoder_prompt_ids,--decoder-prompt-ids", o.decoder_prompt_ids,
                  "an encoder–decoder's decoder prompt after decoder_start_token_id (Whisper's "
                  "language / task / no-timestamps tokens), comma-separated")
      ->delimiter(',');
  cmd->add_option("--language", o.language,
                  "Whisper: the spoken language (a code such as de, a name such as german, or "
                  "<|de|>; default: the generation config's, else detected per input)");
  cmd->add_option("--task", o.task, "Whisper: transcribe (default) or translate (into English)");
  cmd->add_option("--prompt_ids,--prompt-ids", o.prompt_ids,
                  "Whisper: a previous-text prompt's ids (<|startofprev|>, then text tokens), put "
                  "before every window's decoder prompt as generate(prompt_ids=) does; "
                  "comma-separated")
      ->delimiter(',');
  cmd->add_option("--initial_prompt,--initial-prompt", o.initial_prompt,
                  "Whisper: that prompt from text (spellings, names, style), tokenized as "
                  "WhisperProcessor.get_prompt_ids does");
  cmd->add_flag("--condition_on_prev_tokens,--condition-on-prev-tokens", o.condition_on_prev_tokens,
                "Whisper: each 30-s window decoded after <|startofprev|> and the text decoded so "
                "far (long-form audio), as generate(condition_on_prev_tokens=True)");
  cmd->add_flag("--return_timestamps,--return-timestamps", o.return_timestamps,
                "Whisper: segments with their start and end times (always for audio over 30 s)");
  cmd->add_flag(
      "--return_token_timestamps,--return-token-timestamps", o.return_token_timestamps,
      "Whisper: each token's time (\"token_timestamps\", from the cross-attention of "
      "generation_config.json's alignment_heads), as generate(return_token_timestamps=True)");
  cmd->add_flag("--word_timestamps,--word-timestamps", o.word_timestamps,
                "Whisper: each word's start and end (\"words\"), as the pipeline's "
                "return_timestamps=\"word\"; implies --return_timestamps and token timestamps");
  cmd->add_option("--compression_ratio_threshold,--compression-ratio-threshold",
                  o.compression_ratio_threshold,
                  "Whisper: a window whose tokens compress (zlib) by more than this is decoded "
                  "again at the next --temperature (1.35 is usual)");
  cmd->add_option("--logprob_threshold,--logprob-threshold", o.logprob_threshold,
                  "Whisper: a window whose tokens' average log-probability is below this is "
                  "decoded again at the next --temperature (-1.0 is usual)");
  cmd->add_option("--no_speech_threshold,--no-speech-threshold", o.no_speech_threshold,
                  "Whisper: a window below --logprob_threshold whose <|nospeech|> probability is "
                  "above this is skipped as silence (0.6 is usual)");
}

void add_output_options(CLI::App* cmd, GenerateOpts& o) {
  cmd->add_option("--batch_size,--batch-size", o.batch_size,
                  "prompts decoded together (left-padded), default 8");
  cmd->add_flag("--chat", o.chat,
                "each text prompt is a user message, rendered with the tokenizer's chat template "
                "and its generation prompt (JSON-lines rows with \"messages\" always are)");
  cmd->add_option("--tokenizer", o.tokenizer,
                  "tokenizer file or folder (default: the model folder)");
  cmd->add_option("--output", o.output,
                  "write JSON lines {prompt, completion, prompt_ids, completion_ids} here");
  cmd->add_flag("--timings", o.timings, "print prefill time and per-token decoding time to stderr");
}

// The --prompt texts, then the --prompts file's; with --chat each text becomes a user message.
std::vector<Prompt> collect_prompts(const GenerateOpts& o) {
  std::vector<Prompt> prompts;
  for (auto& t : o.prompts) prompts.push_back({t, {}});
  if (!o.prompts_file.empty()) {
    auto more = read_prompts(o.prompts_file);
    prompts.insert(prompts.end(), more.begin(), more.end());
  }
  ONYX_CHECK(std::filesystem::exists(o.model), "generate: model '", o.model, "' does not exist");
  ONYX_CHECK(!prompts.empty() || !o.encoder_inputs.empty() || !o.audio.empty(),
             "generate: give --prompt TEXT or --prompts FILE (an encoder–decoder: or "
             "--encoder_inputs FILE / --audio WAV)");
  ONYX_CHECK(o.batch_size >= 1, "generate: --batch_size must be >= 1");
  for (auto& p : prompts)
    if (o.chat && !p.as_ids && p.messages.is_null())
      p.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", p.text}}});
  return prompts;
}

// Conversations rendered as apply_chat_template(add_generation_prompt=True) renders them (then
// tokenized without added special tokens: the template writes them).
void render_conversations(const std::string& tok_path, std::vector<Prompt>& prompts) {
  data::ChatTemplateFiles ct = data::find_chat_template(tok_path);
  ONYX_CHECK(!ct.source.empty(), "generate: '", tok_path,
             "' has no chat template (chat_template.jinja or tokenizer_config.json's "
             "chat_template) for the conversation prompts");
  data::ChatTemplate tmpl(ct.source, ct.origin);
  for (auto& p : prompts)
    if (!p.messages.is_null())
      p.text = tmpl.render(data::chat_template_vars(p.messages, true, ct.special_tokens)).text;
}

// The tokenizer: needed for text prompts; without one, id prompts get ids back only.
std::shared_ptr<tokenizers::Tokenizer> prompt_tokenizer(const GenerateOpts& o,
                                                        std::vector<Prompt>& prompts) {
  bool need_tok = false, need_template = false;
  for (auto& p : prompts) {
    need_tok |= !p.as_ids;
    need_template |= !p.messages.is_null();
  }
  const std::string tok_path = o.tokenizer.empty() ? o.model : o.tokenizer;
  std::shared_ptr<tokenizers::Tokenizer> tok;
  if (need_tok || !o.tokenizer.empty()) tok = tokenizers::load_tokenizer(tok_path);
  if (need_template) render_conversations(tok_path, prompts);
  return tok;
}

// The model's generation_config.json under the flags, checked as a file's values are.
generate::GenerationConfig decoding_config(const GenerateOpts& o, const generate::Generator& gen,
                                           const tokenizers::Tokenizer* tok) {
  generate::GenerationConfig cfg = generate::read_generation_config(o.model);
  if (cfg.eos_token_ids.empty() && tok && tok->eos_id()) cfg.eos_token_ids = {*tok->eos_id()};
  if (o.max_new_tokens) cfg.max_new_tokens = *o.max_new_tokens;
  cfg.length_given |= o.max_new_tokens.has_value();
  // several temperatures are Whisper's fallback (whisper_fallback below), set per pass
  const std::optional<double> temperature =
      o.temperature.size() == 1 ? std::optional<double>(o.temperature[0]) : std::nullopt;
  ONYX_CHECK(gen.config().model_type == "whisper" ||
                 (o.temperature.size() <= 1 && !o.compression_ratio_threshold &&
                  !o.logprob_threshold && !o.no_speech_threshold),
             "generate: several --temperature values and the --compression_ratio_threshold / "
             "--logprob_threshold / --no_speech_threshold flags are Whisper's temperature "
             "fallback");
  if (o.do_sample || temperature || o.top_k || o.top_p) cfg.do_sample = true;
  if (o.greedy) cfg.do_sample = false;
  if (temperature) cfg.temperature = *temperature;
  if (temperature && *temperature == 0) cfg.do_sample = false;  // documented: greedy
  if (o.top_k) cfg.top_k = *o.top_k;
  if (o.top_p) cfg.top_p = *o.top_p;
  if (o.repetition_penalty) cfg.repetition_penalty = *o.repetition_penalty;
  if (o.no_repeat_ngram_size) cfg.no_repeat_ngram_size = *o.no_repeat_ngram_size;
  if (o.min_new_tokens) cfg.min_new_tokens = *o.min_new_tokens;
  if (o.num_beams) cfg.num_beams = *o.num_beams;
  ONYX_CHECK(cfg.num_beams == 1 || !cfg.do_sample || !o.num_beams,
             "generate: --num_beams with sampling (beam sampling) is not implemented; drop "
             "--do_sample / --temperature / --top_k / --top_p, or use --num_beams 1");
  if (cfg.num_beams > 1) cfg.do_sample = false;  // (a generation_config.json's: warned)
  cfg.seed = o.seed;
  // the same checks as a generation_config.json's values get
  generate::validate_generation_config(
      cfg, "generate (the flags over " + o.model + "'s generation_config.json)");
  generate::check_generation_token_ids(
      cfg, gen.config().vocab_size,
      "generate: the token ids of " + o.model + " (config.json, generation_config.json)");
  return cfg;
}

// Where the completions go: JSON lines written to OUTPUT.tmp and renamed at the end (nothing
// half-written), else stdout (text, or the ids without a tokenizer).
class CompletionSink {
 public:
  CompletionSink(const std::string& output, const tokenizers::Tokenizer* tok, bool separate)
      : path_(output), tmp_(output + ".tmp"), tok_(tok), separate_(separate) {
    if (path_.empty()) return;
    out_ = std::make_unique<std::ofstream>(tmp_);
    ONYX_CHECK(*out_, path_, ": cannot write");
  }
  // `whisper`: Whisper's keys (null ones left out): "segments" [{start, end, text, ...}],
  // "token_timestamps", "words" [{text, start, end}]; without --output the words, else the
  // segments, are printed one per line
  void write(const Prompt& p, const std::vector<int64_t>& prompt_ids,
             const std::vector<int64_t>& new_ids, const std::vector<int64_t>& text_ids,
             const nlohmann::json& whisper = nlohmann::json::object()) {
    const nlohmann::json& spans = whisper.contains("words")      ? whisper["words"]
                                  : whisper.contains("segments") ? whisper["segments"]
                                                                 : nlohmann::json();
    if (out_) {
      nlohmann::json j = {{"prompt_ids", prompt_ids}, {"completion_ids", new_ids}};
      if (tok_) {
        j["prompt"] = p.as_ids ? tok_->decode(p.ids) : p.text;
        j["completion"] = tok_->decode(text_ids);
      }
      for (const auto& [key, value] : whisper.items())
        if (!value.is_null()) j[key] = value;
      *out_ << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else if (tok_ && !spans.is_null()) {
      for (const auto& s : spans) {
        char span[64];
        std::snprintf(span, sizeof span, "[%.2f -> %.2f] ", s["start"].get<double>(),
                      s["end"].get<double>());
        std::cout << span << s.value("text", "") << "\n";
      }
      if (separate_) std::cout << "\n";
    } else if (tok_) {
      std::cout << (p.as_ids ? tok_->decode(p.ids) : p.text) << tok_->decode(text_ids) << "\n";
      if (separate_) std::cout << "\n";
    } else {
      std::cout << nlohmann::json(new_ids).dump() << "\n";
    }
  }
  void finish(size_t n) {
    if (!out_) return;
    out_->close();
    ONYX_CHECK(!out_->fail(), path_, ": write failed");
    fs::rename(tmp_, path_);
    std::cout << "wrote " << n << " completions to " << path_ << "\n";
  }

 private:
  std::string path_, tmp_;
  const tokenizers::Tokenizer* tok_;
  bool separate_;  // a blank line between completions on stdout
  std::unique_ptr<std::ofstream> out_;
};

struct GenerateTotals {
  generate::GenerationStats stats;
  double seconds = 0;
  int64_t generated = 0;
};

void print_timings(const GenerateTotals& t) {
  const auto& s = t.stats.step_seconds;
  double mean = s.empty() ? 0 : std::accumulate(s.begin(), s.end(), 0.0) / (double)s.size();
  std::fprintf(stderr,
               "generate: %lld tokens in %.3f s; prefill %.1f ms; %zu decoding steps, %.2f "
               "ms/step mean; %lld graph signatures optimized\n",
               (long long)t.generated, t.seconds, t.stats.prefill_seconds * 1e3, s.size(),
               mean * 1e3, (long long)t.stats.compiled_signatures);
}

// Prompts [first, last) decoded together; their completions to the sink.
void generate_batch(generate::Generator& gen, const generate::GenerationConfig& cfg,
                    const tokenizers::Tokenizer* tok, const std::vector<Prompt>& prompts,
                    size_t first, size_t last, CompletionSink& sink, GenerateTotals& total) {
  std::vector<std::vector<int64_t>> ids;
  for (size_t i = first; i < last; i++) {
    tokenizers::EncodeOptions eo;
    eo.add_special_tokens = prompts[i].messages.is_null();
    ids.push_back(prompts[i].as_ids ? prompts[i].ids : tok->encode(prompts[i].text, eo).input_ids);
    ONYX_CHECK(!ids.back().empty(), "generate: prompt ", i + 1, " has no tokens");
  }
  generate::GenerationStats st;
  auto t0 = std::chrono::steady_clock::now();
  auto res = gen.generate(ids, cfg, &st);
  total.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  total.stats.prefill_seconds += st.prefill_seconds;
  total.stats.compiled_signatures = st.compiled_signatures;
  total.stats.step_seconds.insert(total.stats.step_seconds.end(), st.step_seconds.begin(),
                                  st.step_seconds.end());
  const std::set<int64_t> eos(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end());
  for (size_t i = first; i < last; i++) {
    const auto& new_ids = res[i - first];
    total.generated += (int64_t)new_ids.size();
    std::vector<int64_t> text_ids;
    for (int64_t id : new_ids)
      if (!eos.count(id)) text_ids.push_back(id);
    sink.write(prompts[i], ids[i - first], new_ids, text_ids);
  }
}

// Rows [first, last) of every tensor (first dimension).
std::map<std::string, Tensor> row_slice(const std::map<std::string, Tensor>& all, int64_t first,
                                        int64_t last) {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : all) {
    Shape s = t.shape();
    const size_t row = t.nbytes() / (size_t)s[0];
    s[0] = last - first;
    Tensor r(t.dtype(), s);
    std::memcpy(r.raw(), (const char*)t.raw() + first * row, (size_t)(last - first) * row);
    out[name] = r;
  }
  return out;
}

// BART's and T5's encoder inputs from the prompts' texts: tokenized with special tokens, padded on
// the right with pad_token_id, attention_mask 0 there (as the tokenizer's padding side).
std::map<std::string, Tensor> tokenized_encoder_inputs(const std::vector<Prompt>& prompts,
                                                       const tokenizers::Tokenizer& tok,
                                                       int64_t pad) {
  std::vector<std::vector<int64_t>> rows;
  size_t longest = 1;
  for (auto& p : prompts) {
    rows.push_back(p.as_ids ? p.ids : tok.encode(p.text, {}).input_ids);
    longest = std::max(longest, rows.back().size());
  }
  const int64_t B = (int64_t)rows.size(), T = (int64_t)longest;
  Tensor ids(DType::Int64, {B, T}), mask = Tensor::zeros(DType::Int64, {B, T});
  std::fill(ids.data<int64_t>(), ids.data<int64_t>() + B * T, pad);
  for (int64_t r = 0; r < B; r++)
    for (size_t t = 0; t < rows[r].size(); t++) {
      ids.data<int64_t>()[r * T + (int64_t)t] = rows[r][t];
      mask.data<int64_t>()[r * T + (int64_t)t] = 1;
    }
  return {{"input_ids", ids}, {"attention_mask", mask}};
}

// Whisper's previous-text prompt: --prompt_ids, or --initial_prompt as WhisperProcessor's
// get_prompt_ids tokenizes it (<|startofprev|>, then " " + the stripped text without special
// tokens; a special token in the text is an error, as there).
std::vector<int64_t> whisper_previous_text(const GenerateOpts& o,
                                           const tokenizers::Tokenizer* tok) {
  ONYX_CHECK(o.prompt_ids.empty() || o.initial_prompt.empty(),
             "generate: give --prompt_ids or --initial_prompt, not both");
  if (o.initial_prompt.empty()) return o.prompt_ids;
  ONYX_CHECK(tok, "generate: --initial_prompt needs the model's tokenizer (--tokenizer)");
  const auto prev = tok->token_id("<|startofprev|>");
  ONYX_CHECK(prev, "generate: --initial_prompt: the tokenizer has no <|startofprev|> token");
  const auto first = o.initial_prompt.find_first_not_of(" \t\r\n");
  const auto last = o.initial_prompt.find_last_not_of(" \t\r\n");
  const std::string text =
      first == std::string::npos ? "" : o.initial_prompt.substr(first, last - first + 1);
  tokenizers::EncodeOptions plain;
  plain.add_special_tokens = false;
  std::vector<int64_t> ids = {*prev};
  const auto eos = tok->eos_id();  // <|endoftext|>: the special and timestamp tokens follow it
  for (int64_t id : tok->encode(" " + text, plain).input_ids) {
    const tokenizers::AddedToken* added = tok->added_token(id);
    ONYX_CHECK(!(eos && id >= *eos) && !(added && added->special),
               "generate: --initial_prompt contains the special token '", tok->token_bytes(id),
               "'");
    ids.push_back(id);
  }
  return ids;
}

// Each row of `enc`'s decoder prompt: `start` and --decoder_prompt_ids, or with `whisper` (a
// Whisper model's prompt keys, read once) the language / task / no-timestamps prompt Transformers
// builds, the language detected per row where neither --language nor the config gives it.
std::vector<std::vector<int64_t>> decoder_prompts(const GenerateOpts& o, generate::Generator& gen,
                                                  int64_t start,
                                                  const generate::WhisperPromptConfig* whisper,
                                                  const std::map<std::string, Tensor>& enc,
                                                  const tokenizers::Tokenizer* tok) {
  const int64_t rows = enc.begin()->second.dim(0);
  if (!whisper) {
    std::vector<int64_t> p = {start};
    p.insert(p.end(), o.decoder_prompt_ids.begin(), o.decoder_prompt_ids.end());
    return std::vector<std::vector<int64_t>>((size_t)rows, p);
  }
  auto prompts = generate::whisper_prompts(*whisper, start, o.language, o.task, false, rows, [&] {
    return generate::detect_whisper_languages(gen, *whisper, start, enc);
  });
  const std::vector<int64_t> previous = whisper_previous_text(o, tok);
  for (auto& p : prompts) p.insert(p.begin(), previous.begin(), previous.end());
  return prompts;
}

// Whisper's temperature fallback (generate/whisper_fallback.h): several --temperature values, and
// the thresholds from the flags over generation_config.json's.
generate::WhisperFallback whisper_fallback(const GenerateOpts& o,
                                           const generate::WhisperPromptConfig& w) {
  generate::WhisperFallback f;
  if (o.temperature.size() > 1) f.temperatures = o.temperature;
  f.compression_ratio_threshold =
      o.compression_ratio_threshold ? o.compression_ratio_threshold : w.compression_ratio_threshold;
  f.logprob_threshold = o.logprob_threshold ? o.logprob_threshold : w.logprob_threshold;
  f.no_speech_threshold = o.no_speech_threshold ? o.no_speech_threshold : w.no_speech_threshold;
  f.no_speech_token_id = w.no_timestamps_token_id >= 1 ? w.no_timestamps_token_id - 1 : -1;
  return f;
}

// --return_token_timestamps / --word_timestamps: the model's alignment heads (none: off); an
// error without them (as Transformers) or, for words, without a tokenizer.
generate::WhisperTokenTiming token_timing(const GenerateOpts& o,
                                          const generate::WhisperPromptConfig& whisper,
                                          const tokenizers::Tokenizer* tok) {
  if (!o.return_token_timestamps && !o.word_timestamps) return {};
  ONYX_CHECK(!whisper.alignment_heads.empty(),
             "generate: --return_token_timestamps / --word_timestamps need alignment_heads in the "
             "model's generation_config.json ([[decoder layer, head], ...]: the cross-attention "
             "heads that follow the audio)");
  ONYX_CHECK(
      tok || !o.word_timestamps,
      "generate: --word_timestamps needs the tokenizer (in the model folder or --tokenizer)");
  return {whisper.alignment_heads, whisper.median_filter_width};
}

// A file's words [{text, start, end}] (--word_timestamps), split as its language is written.
nlohmann::json words_json(const FileTranscript& f, const generate::WhisperPromptConfig& whisper,
                          const tokenizers::Tokenizer& tok) {
  std::string language;  // the prompt's language token, as "<|xx|>"
  for (int64_t id : f.prompt)
    for (const auto& [name, lid] : whisper.lang_to_id)
      if (lid == id) language = name;
  nlohmann::json words = nlohmann::json::array();
  for (const auto& w : generate::whisper_words(f.transcript.tokens, f.transcript.token_times,
                                               whisper.no_timestamps_token_id + 1, tok, language))
    words.push_back({{"text", w.text}, {"start", w.start}, {"end", w.end}});
  return words;
}

// Whisper's transcription of `audio` window by window (whisper_audio.h): each file's tokens (no
// eos, as Transformers 5 returns them), its text and, with timestamps, the temperature fallback
// or audio over 30 s, its segments [{start, end, text, temperature, avg_logprob,
// compression_ratio[, no_speech_prob]}] to the sink.
int run_whisper_transcription(const GenerateOpts& o, generate::Generator& gen,
                              const generate::GenerationConfig& cfg,
                              const generate::WhisperPromptConfig& whisper,
                              const std::vector<WhisperAudio>& audio,
                              const tokenizers::Tokenizer* tok, int64_t start) {
  ONYX_CHECK(o.decoder_prompt_ids.empty(),
             "generate: --return_timestamps, the temperature fallback and audio over 30 s decode "
             "with Whisper's own prompt (--language / --task): drop --decoder_prompt_ids");
  const TranscribeOptions opts{
      o.language,
      o.task,
      o.return_timestamps || o.word_timestamps || whisper.return_timestamps,
      o.batch_size,
      whisper_previous_text(o, tok),
      o.condition_on_prev_tokens || whisper.condition_on_prev_tokens,
      whisper_fallback(o, whisper),
      token_timing(o, whisper, tok)};
  GenerateTotals total;
  const auto t0 = std::chrono::steady_clock::now();
  const auto files = transcribe_files(gen, cfg, whisper, start, audio, opts, &total.stats);
  total.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t tb = whisper.no_timestamps_token_id + 1;  // the timestamps: not text
  auto text_ids = [&](const std::vector<int64_t>& ids) {
    std::vector<int64_t> t;
    for (int64_t id : ids)
      if (tb <= 0 || id < tb) t.push_back(id);
    return t;
  };
  auto centiseconds = [](double s) { return std::round(s * 100.0) / 100.0; };
  CompletionSink sink(o.output, tok, files.size() > 1);
  bool long_form = false;
  for (const WhisperAudio& a : audio) long_form |= a.long_form();
  const bool fallback = !opts.fallback.temperatures.empty() || opts.fallback.scores_needed();
  for (const FileTranscript& f : files) {
    nlohmann::json segments =
        opts.timestamps || long_form || fallback ? nlohmann::json::array() : nullptr;
    for (const auto& s : f.transcript.segments) {
      if (segments.is_null()) continue;
      // the window's decoding, as OpenAI's whisper reports it per segment (NaN: null)
      nlohmann::json seg = {{"start", centiseconds(s.start)},
                            {"end", centiseconds(s.end)},
                            {"text", tok ? tok->decode(text_ids(s.tokens)) : ""},
                            {"temperature", s.temperature},
                            {"avg_logprob", s.avg_logprob},
                            {"compression_ratio", s.compression_ratio}};
      if (!std::isnan(s.no_speech_prob)) seg["no_speech_prob"] = s.no_speech_prob;
      segments.push_back(std::move(seg));
    }
    total.generated += (int64_t)f.transcript.tokens.size();
    nlohmann::json extra = {{"segments", segments}};
    if (opts.token_timing.enabled()) extra["token_timestamps"] = f.transcript.token_times;
    if (o.word_timestamps) extra["words"] = words_json(f, whisper, *tok);
    sink.write(Prompt{}, f.prompt, f.transcript.tokens, text_ids(f.transcript.tokens), extra);
  }
  sink.finish(files.size());
  if (o.timings) print_timings(total);
  return 0;
}

// Whisper input features given as --encoder_inputs, one file's worth per row (all its frames).
std::vector<WhisperAudio> feature_rows(const Tensor& features, const models::HfConfig& c) {
  ONYX_CHECK(features.rank() == 3 && features.dtype() == DType::Float32 &&
                 features.dim(1) == c.s2s.num_mel_bins,
             "generate: Whisper's input_features must be float32 (N, ", c.s2s.num_mel_bins,
             ", frames)");
  std::vector<WhisperAudio> rows;
  const int64_t mel = features.dim(1), frames = features.dim(2);
  for (int64_t r = 0; r < features.dim(0); r++) {
    WhisperAudio a;
    a.features = Tensor(DType::Float32, {mel, frames});
    std::memcpy(a.features.data<float>(), features.data<float>() + r * mel * frames,
                (size_t)(mel * frames) * sizeof(float));
    a.frames = frames;
    a.window = 2 * c.s2s.max_source_positions;
    rows.push_back(std::move(a));
  }
  return rows;
}

// Whether Whisper decodes window after window (whisper_audio.h) whatever the input's length: with
// timestamps, and whenever the vocabulary has timestamp tokens — Transformers 5 splits every
// window's tokens at timestamp pairs, asked for or not, and decodes again from the last pair.
// (Audio longer than the window always does.) `w`: the model's prompt keys (empty with
// --decoder_prompt_ids).
bool whisper_windowed(const GenerateOpts& o, const models::HfConfig& c,
                      const generate::WhisperPromptConfig& w) {
  ONYX_CHECK((!o.return_timestamps && !o.return_token_timestamps && !o.word_timestamps) ||
                 c.model_type == "whisper",
             "generate: --return_timestamps, --return_token_timestamps and --word_timestamps are "
             "Whisper's");
  if (c.model_type != "whisper") return false;
  const generate::WhisperFallback f = whisper_fallback(o, w);
  return o.return_timestamps || o.return_token_timestamps || o.word_timestamps ||
         w.return_timestamps || !f.temperatures.empty() || f.scores_needed() ||
         w.timestamp_begin(c.vocab_size) >= 0;
}

// An encoder–decoder's generation: one output per encoder row, decoded from decoder_start_token_id
// (+ --decoder_prompt_ids) in batches of --batch_size.
int run_generate_seq2seq(const GenerateOpts& o, generate::Generator& gen,
                         std::vector<Prompt> prompts, const tokenizers::Tokenizer* tok) {
  const models::HfConfig& c = gen.config();
  generate::GenerationConfig cfg = decoding_config(o, gen, tok);
  if (!cfg.length_given) {  // Transformers' default: max_length 20, the start token included
    cfg.max_new_tokens = -1;
    cfg.max_length = 20;
  }
  std::map<std::string, Tensor> enc;
  ONYX_CHECK((int)!o.encoder_inputs.empty() + (int)!o.audio.empty() + (int)!prompts.empty() == 1,
             "generate: an encoder–decoder takes one of --encoder_inputs, --audio (Whisper) or "
             "text prompts (BART)");
  const int64_t start =
      cfg.decoder_start_token_id >= 0 ? cfg.decoder_start_token_id : c.s2s.decoder_start_token_id;
  const bool whisper_prompt = c.model_type == "whisper" && o.decoder_prompt_ids.empty();
  const generate::WhisperPromptConfig whisper = whisper_prompt
                                                    ? generate::read_whisper_prompt_config(o.model)
                                                    : generate::WhisperPromptConfig{};
  const bool windowed = whisper_windowed(o, c, whisper);
  if (!o.encoder_inputs.empty()) {
    enc = io::load_safetensors(o.encoder_inputs).tensors;
    if (c.model_type == "whisper" && enc.count("input_features")) {
      const Tensor& f = enc.at("input_features");
      if (windowed || (f.rank() == 3 && f.dim(2) > 2 * c.s2s.max_source_positions))
        return run_whisper_transcription(o, gen, cfg, whisper, feature_rows(f, c), tok, start);
    }
  } else if (!o.audio.empty()) {
    ONYX_CHECK(c.model_type == "whisper", "generate: --audio is for Whisper models");
    std::vector<WhisperAudio> audio;
    for (const auto& f : o.audio) audio.push_back(read_whisper_audio(f, c));
    const bool long_audio = std::any_of(audio.begin(), audio.end(),
                                        [](const WhisperAudio& a) { return a.long_form(); });
    if (windowed || long_audio)
      return run_whisper_transcription(o, gen, cfg, whisper, audio, tok, start);
    enc["input_features"] = stack_whisper_windows(audio);
  } else {
    ONYX_CHECK(c.model_type != "whisper" && tok, "generate: a ", c.model_type,
               " model generates from --encoder_inputs",
               c.model_type == "whisper" ? " or --audio" : "", " (text prompts need a tokenizer)");
    enc = tokenized_encoder_inputs(prompts, *tok, c.pad_token_id);
  }
  ONYX_CHECK(!enc.empty() && enc.begin()->second.rank() >= 1, "generate: no encoder inputs");
  const int64_t rows = enc.begin()->second.dim(0);
  ONYX_CHECK(whisper_prompt || (o.language.empty() && o.task.empty() && o.prompt_ids.empty() &&
                                o.initial_prompt.empty()),
             c.model_type == "whisper"
                 ? "generate: --decoder_prompt_ids gives the whole prompt: drop --language / "
                   "--task / --prompt_ids / --initial_prompt"
                 : "generate: --language, --task, --prompt_ids and --initial_prompt are Whisper's");
  CompletionSink sink(o.output, tok, rows > 1);
  GenerateTotals total;
  const std::set<int64_t> eos(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end());
  for (int64_t first = 0; first < rows; first += o.batch_size) {
    const int64_t last = std::min(rows, first + o.batch_size);
    const auto batch = row_slice(enc, first, last);
    const std::vector<std::vector<int64_t>> ids =
        decoder_prompts(o, gen, start, whisper_prompt ? &whisper : nullptr, batch, tok);
    auto t0 = std::chrono::steady_clock::now();
    auto res = gen.generate(ids, cfg, &total.stats, batch);
    total.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int64_t i = first; i < last; i++) {
      const auto& new_ids = res[(size_t)(i - first)];
      total.generated += (int64_t)new_ids.size();
      std::vector<int64_t> text_ids;
      for (int64_t id : new_ids)
        if (!eos.count(id)) text_ids.push_back(id);
      sink.write(Prompt{}, ids[(size_t)(i - first)], new_ids, text_ids);
    }
  }
  sink.finish((size_t)rows);
  if (o.timings) print_timings(total);
  return 0;
}

int run_generate(const GenerateOpts& o) {
  std::vector<Prompt> prompts = collect_prompts(o);
  std::shared_ptr<tokenizers::Tokenizer> tok = prompt_tokenizer(o, prompts);
  generate::Generator gen = generate::Generator::from_folder(o.model);
  if (gen.is_encoder_decoder()) {
    // the transcripts / outputs decoded by the folder's tokenizer when it has one
    if (!tok && fs::exists(fs::path(o.model) / "tokenizer.json"))
      tok = tokenizers::load_tokenizer(o.model);
    return run_generate_seq2seq(o, gen, prompts, tok.get());
  }
  ONYX_CHECK(o.encoder_inputs.empty() && o.audio.empty() && o.decoder_prompt_ids.empty(),
             "generate: --encoder_inputs, --audio and --decoder_prompt_ids are for "
             "encoder–decoder models (Whisper, BART, T5)");
  if (tok)
    ONYX_CHECK(tok->vocab_size() <= gen.config().vocab_size, tok->source(), ": the tokenizer has ",
               tok->vocab_size(), " tokens, more than the model's vocab_size ",
               gen.config().vocab_size);
  const generate::GenerationConfig cfg = decoding_config(o, gen, tok.get());
  CompletionSink sink(o.output, tok.get(), prompts.size() > 1);
  GenerateTotals total;
  for (size_t first = 0; first < prompts.size(); first += (size_t)o.batch_size)
    generate_batch(gen, cfg, tok.get(), prompts, first,
                   std::min(prompts.size(), first + (size_t)o.batch_size), sink, total);
  sink.finish(prompts.size());
  if (o.timings) print_timings(total);
  return 0;
}

}  // namespace

Action add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "generate",
      "generate text from a causal LM (GPT-2, Llama, Mistral, Qwen2) or an encoder–decoder "
      "(Whisper, BART, T5) with a KV cache");
  auto o = std::make_shared<GenerateOpts>();
  add_prompt_options(cmd, *o);
  add_decoding_options(cmd, *o);
  add_output_options(cmd, *o);
  return [o]() { return run_generate(*o); };
}

}  // namespace onyx::cli
