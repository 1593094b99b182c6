// tokenizer.cc — the shared half of the tokenizers: added-token matching, the special-token
// template with truncation and padding, and load_tokenizer (the UTF-8 codec and Unicode tables:
// text.cc).
#include "tokenizers/tokenizer.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "io/json.h"
#include "onyx/error.h"
#include "tokenizers/bpe.h"
#include "tokenizers/wordpiece.h"

namespace fs = std::filesystem;

namespace onyx::tokenizers {

// ---- Tokenizer: added tokens, template, truncation, padding ----

void Tokenizer::add_special_token(const std::string& text, int64_t id) {
  AddedToken t;
  t.content = text;
  t.id = id;
  add_token(t);
}

void Tokenizer::add_token(const AddedToken& t) { add_tokens({t}); }

void Tokenizer::add_tokens(const std::vector<AddedToken>& tokens) {
  std::unordered_map<std::string, size_t> at;
  for (size_t i = 0; i < added_.size(); ++i) at[added_[i].content] = i;
  for (const AddedToken& t : tokens) {
    if (t.content.empty()) continue;
    auto it = at.find(t.content);
    if (it != at.end()) {
      added_[it->second] = t;
    } else {
      at[t.content] = added_.size();
      added_.push_back(t);
    }
  }
  index_added();
}

void Tokenizer::index_added() {
  added_match_.clear();
  for (size_t i = 0; i < added_.size(); ++i)
    added_match_.emplace_back(
        added_[i].normalized ? normalize_text(added_[i].content) : added_[i].content, i);
  std::stable_sort(added_match_.begin(), added_match_.end(),
                   [](auto& x, auto& y) { return x.first.size() > y.first.size(); });
}

const AddedToken* Tokenizer::added_token(int64_t id) const {
  for (auto& a : added_)
    if (a.id == id) return &a;
  return nullptr;
}

namespace {

// The code point that ends s[0, end) / begins s[begin, ...).
char32_t last_char(const std::string& s, size_t end) {
  size_t b = end;
  while (b > 0 && ((unsigned char)s[b - 1] & 0xC0) == 0x80) --b;
  if (b > 0) --b;
  auto u = unicode::decode_utf8(s.substr(b, end - b));
  return u.empty() ? 0 : u.back();
}
char32_t first_char(const std::string& s, size_t begin, size_t* len = nullptr) {
  size_t e = begin + 1;
  while (e < s.size() && ((unsigned char)s[e] & 0xC0) == 0x80) ++e;
  if (len) *len = e - begin;
  auto u = unicode::decode_utf8(s.substr(begin, e - begin));
  return u.empty() ? 0 : u[0];
}

// Rust regex's \w: Alphabetic, marks, decimal digits, connector punctuation, Join_Control.
bool is_word_char(char32_t c) {
  return u_hasBinaryProperty((UChar32)c, UCHAR_ALPHABETIC) ||
         (U_GET_GC_MASK((UChar32)c) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) ||
         u_hasBinaryProperty((UChar32)c, UCHAR_JOIN_CONTROL);
}

}  // namespace

// As tokenizers' AddedVocabulary::find_matches: leftmost-longest matches of the added tokens of one
// kind (normalized or not); a single_word token touching a word character is passed over, lstrip
// and rstrip widen a match over the white space beside it.
std::vector<Tokenizer::Split> Tokenizer::split_added(const std::string& s, bool normalized) const {
  std::vector<Split> out;
  size_t start_offset = 0, i = 0;
  const size_t n = s.size();
  while (i < n) {
    const AddedToken* tok = nullptr;
    size_t len = 0;
    for (auto& [m, k] : added_match_) {
      if (m.empty() || m[0] != s[i] || added_[k].normalized != normalized) continue;
      if (s.compare(i, m.size(), m) == 0) {
        tok = &added_[k];
        len = m.size();
        break;
      }
    }
    if (!tok) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + len;
    if (tok->single_word) {
      const bool start_space = start == 0 || !is_word_char(last_char(s, start));
      const bool stop_space = stop == n || !is_word_char(first_char(s, stop));
      if (!start_space || !stop_space) {
        i = stop;
        continue;
      }
    }
    if (tok->lstrip) {
      size_t b = start;
      while (b > 0) {
        size_t cb = b - 1;
        while (cb > 0 && ((unsigned char)s[cb] & 0xC0) == 0x80) --cb;
        if (!unicode::is_white_space(first_char(s, cb))) break;
        b = cb;
      }
      start = std::max(b, start_offset);
    }
    if (tok->rstrip) {
      while (stop < n) {
        size_t cl = 0;
        if (!unicode::is_white_space(first_char(s, stop, &cl))) break;
        stop += cl;
      }
    }
    if (start > start_offset) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, tok->id});
    start_offset = stop;
    i = stop;
  }
  if (start_offset < n) out.push_back({start_offset, n, -1});
  return out;
}

std::vector<int64_t> Tokenizer::encode_ids(const std::string& text) const {
  std::vector<int64_t> ids;
  auto append = [&](const std::vector<int64_t>& part) {
    ids.insert(ids.end(), part.begin(), part.end());
  };
  // tokens matched in the raw text; then each stretch between them is normalized, and tokens with
  // `normalized` are matched in it; what is left goes to the model
  for (auto& a : split_added(text, false)) {
    if (a.id >= 0) {
      ids.push_back(a.id);
      continue;
    }
    const std::string norm = normalize_text(text.substr(a.begin, a.end - a.begin));
    for (auto& b : split_added(norm, true)) {
      if (b.id >= 0)
        ids.push_back(b.id);
      else
        append(encode_segment(norm.substr(b.begin, b.end - b.begin), a.begin == 0 && b.begin == 0));
    }
  }
  return ids;
}

int64_t Tokenizer::num_special_tokens(bool pair) const {
  int64_t n = 0;
  for (auto& p : pair ? template_.pair : template_.single) n += p.kind == TemplatePiece::Special;
  return n;
}

Encoding Tokenizer::encode(const std::string& text, const EncodeOptions& opts) const {
  return assemble(encode_ids(text), nullptr, opts);
}

Encoding Tokenizer::encode_pair(const std::string& a, const std::string& b,
                                const EncodeOptions& opts) const {
  auto ib = encode_ids(b);
  return assemble(encode_ids(a), &ib, opts);
}

Encoding Tokenizer::assemble(std::vector<int64_t> a, const std::vector<int64_t>* bp,
                             const EncodeOptions& opts) const {
  const bool pair = bp != nullptr;
  std::vector<int64_t> b = pair ? *bp : std::vector<int64_t>{};
  const int64_t nspecial = opts.add_special_tokens ? num_special_tokens(pair) : 0;
  if (opts.max_length > 0) {
    const int64_t budget = opts.max_length - nspecial;
    ONYX_CHECK(budget >= 0, source_, ": max_length ", opts.max_length, " leaves no room for the ",
               nspecial, " special tokens");
    if ((int64_t)(a.size() + b.size()) > budget) {
      if (!pair) {
        a.resize(budget);
      } else {  // longest_first, as Hugging Face tokenizers' truncate_encodings
        int64_t n1 = a.size(), n2 = b.size();
        const bool swap = n1 > n2;
        if (swap) std::swap(n1, n2);
        n2 = n1 > budget ? n1 : std::max(n1, budget - n1);
        if (n1 + n2 > budget) {
          n1 = budget / 2;
          n2 = n1 + budget % 2;
        }
        if (swap) std::swap(n1, n2);
        a.resize(std::min<int64_t>(a.size(), n1));
        b.resize(std::min<int64_t>(b.size(), n2));
      }
    }
  }
  Encoding e;
  auto put = [&](const std::vector<int64_t>& ids, int64_t type) {
    for (auto id : ids) {
      e.input_ids.push_back(id);
      e.token_type_ids.push_back(type);
    }
  };
  const auto& tpl = pair ? template_.pair : template_.single;
  int64_t type_b = 1;
  for (auto& p : tpl)
    if (p.kind == TemplatePiece::SequenceB) type_b = p.type_id;
  if (!opts.add_special_tokens || tpl.empty()) {
    put(a, 0);
    if (pair) put(b, type_b);
  } else {
    for (auto& p : tpl) {
      if (p.kind == TemplatePiece::Special)
        put({p.id}, p.type_id);
      else if (p.kind == TemplatePiece::SequenceA)
        put(a, p.type_id);
      else if (pair)
        put(b, p.type_id);
    }
  }
  e.attention_mask.assign(e.input_ids.size(), 1);
  if (opts.pad_to > 0) {
    ONYX_CHECK(e.size() <= opts.pad_to, source_, ": encoding of ", e.size(),
               " tokens is longer than pad_to ", opts.pad_to, " (set max_length to truncate)");
    e.input_ids.resize(opts.pad_to, pad_id_);
    e.attention_mask.resize(opts.pad_to, 0);
    e.token_type_ids.resize(opts.pad_to, 0);
  }
  return e;
}

// ---- tokenizer.json pieces shared by the tokenizers ----

PostTemplate parse_post_processor(const nlohmann::json& j, const std::string& path) {
  PostTemplate t;
  if (!j.contains("post_processor") || j["post_processor"].is_null()) return t;
  const auto& pp = j["post_processor"];
  const std::string type = pp.value("type", "");
  auto special = [&](const nlohmann::json& pair_json, const char* what) {
    ONYX_CHECK(pair_json.is_array() && pair_json.size() == 2 && pair_json[1].is_number_integer(),
               "tokenizer file '", path, "': post_processor.", what, " should be [token, id]");
    return TemplatePiece{TemplatePiece::Special, pair_json[1].get<int64_t>(), 0};
  };
  const TemplatePiece A{TemplatePiece::SequenceA, 0, 0};
  if (type == "BertProcessing") {
    auto cls = special(pp["cls"], "cls"), sep = special(pp["sep"], "sep");
    auto sep1 = sep;
    sep1.type_id = 1;
    t.single = {cls, A, sep};
    t.pair = {cls, A, sep, {TemplatePiece::SequenceB, 0, 1}, sep1};
  } else if (type == "RobertaProcessing") {
    auto cls = special(pp["cls"], "cls"), sep = special(pp["sep"], "sep");
    t.single = {cls, A, sep};
    t.pair = {cls, A, sep, sep, {TemplatePiece::SequenceB, 0, 0}, sep};
  } else if (type == "TemplateProcessing") {
    auto read = [&](const char* key) {
      std::vector<TemplatePiece> out;
      ONYX_CHECK(pp.contains(key) && pp[key].is_array(), "tokenizer file '", path,
                 "': post_processor.", key, " is missing");
      for (auto& item : pp[key]) {
        if (item.contains("Sequence")) {
          auto& s = item["Sequence"];
          std::string id = s.value("id", "A");
          out.push_back({id == "B" ? TemplatePiece::SequenceB : TemplatePiece::SequenceA, 0,
                         s.value("type_id", (int64_t)0)});
        } else if (item.contains("SpecialToken")) {
          auto& s = item["SpecialToken"];
          std::string name = s.value("id", "");
          const auto& specials =
              pp.contains("special_tokens") ? pp["special_tokens"] : nlohmann::json::object();
          ONYX_CHECK(specials.contains(name) && specials[name].contains("ids"), "tokenizer file '",
                     path, "': post_processor template names special token '", name,
                     "' without ids");
          for (auto& id : specials[name]["ids"])
            out.push_back(
                {TemplatePiece::Special, id.get<int64_t>(), s.value("type_id", (int64_t)0)});
        } else {
          throw Error(cat("tokenizer file '", path, "': post_processor.", key,
                          " has an item that is neither "
                          "Sequence nor SpecialToken"));
        }
      }
      return out;
    };
    t.single = read("single");
    t.pair = read("pair");
  } else if (type == "Sequence") {
    for (auto& sub : pp.value("processors", nlohmann::json::array())) {
      nlohmann::json wrapper = {{"post_processor", sub}};
      auto st = parse_post_processor(wrapper, path);
      if (!st.single.empty() || !st.pair.empty()) t = st;
    }
  } else if (type != "ByteLevel") {
    ONYX_UNSUPPORTED("tokenizer file '", path, "': post_processor type '", type,
                     "' is not supported");
  }
  return t;
}

int64_t checked_pad_id(const nlohmann::json& j, int64_t vocab_size, const std::string& path) {
  const int64_t id = j["padding"]["pad_id"].get<int64_t>();
  ONYX_CHECK(id >= 0 && id < vocab_size, "tokenizer file '", path, "': padding.pad_id ", id,
             " is not a token id (the vocabulary has ", vocab_size, ")");
  return id;
}

void register_added_tokens(const nlohmann::json& j, const std::string& path, Tokenizer& tok) {
  if (!j.contains("added_tokens") || !j["added_tokens"].is_array()) return;
  // Ids as tokenizers' AddedVocabulary::add_tokens gives them, entry by entry in the file's order
  // (check_tokenizer_json has typed the fields): a content already added keeps its id, one in the
  // model's vocabulary takes that id, a new one the next id past the vocabulary and the added
  // ids so far. A file whose id differs gets tokenizers' warning and tokenizers' id.
  const int64_t vocab = tok.model_vocab_entries();
  std::unordered_map<std::string, int64_t> added_ids;
  std::vector<AddedToken> tokens;
  int64_t max_added = -1;
  for (auto& a : j["added_tokens"]) {
    AddedToken t;
    t.content = a["content"].get<std::string>();
    const int64_t file_id = a["id"].get<int64_t>();
    t.special = a["special"].get<bool>();
    t.lstrip = a["lstrip"].get<bool>();
    t.rstrip = a["rstrip"].get<bool>();
    t.single_word = a["single_word"].get<bool>();
    t.normalized = a["normalized"].get<bool>();
    if (t.content.empty()) continue;
    auto seen = added_ids.find(t.content);
    std::optional<int64_t> in_vocab =
        seen == added_ids.end() ? tok.token_id(t.content) : std::optional<int64_t>();
    if (seen != added_ids.end())
      t.id = seen->second;
    else if (in_vocab)
      t.id = *in_vocab;
    else
      t.id = max_added < 0 || (max_added < vocab && vocab > 0) ? vocab : max_added + 1;
    if (t.id != file_id)
      std::cerr << "Warning: tokenizer file '" << path << "': token '" << t.content
                << "' was expected to have ID '" << file_id << "' but was given ID '" << t.id
                << "' (as Hugging Face tokenizers assigns it)\n";
    added_ids[t.content] = t.id;
    max_added = std::max(max_added, t.id);
    tokens.push_back(std::move(t));
  }
  tok.add_tokens(tokens);
}
// ---- load_tokenizer ----

namespace {
std::shared_ptr<Tokenizer> tokenizer_from_checked_json(const nlohmann::json& j,
                                                       const std::string& path);
}  // namespace

std::shared_ptr<Tokenizer> tokenizer_from_json_text(const std::string& text,
                                                    const std::string& path) {
  nlohmann::json j = io::parse_json(text, cat("tokenizer file '", path, "'"));
  check_tokenizer_json(j, path);
  try {
    return tokenizer_from_checked_json(j, path);
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("tokenizer file '", path, "': unexpected value: ", io::json_error_text(e)));
  }
}

namespace {

std::shared_ptr<Tokenizer> tokenizer_from_checked_json(const nlohmann::json& j,
                                                       const std::string& path) {
  ONYX_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(), "tokenizer file '",
             path, "' has no \"model\" object (is it a Hugging Face tokenizer.json?)");
  auto& m = j["model"];
  std::string type = m.value("type", "");
  if (type.empty())
    type = m.contains("merges")
               ? "BPE"
               : (m.contains("vocab") && m["vocab"].is_object() ? "WordPiece" : "");
  if (type == "WordPiece") return WordPieceTokenizer::from_tokenizer_json(j, path);
  if (type == "BPE") return BpeTokenizer::from_tokenizer_json(j, path);
  ONYX_UNSUPPORTED("tokenizer file '", path, "': model.type '", type,
                   "' is not supported (WordPiece and BPE are)");
}

std::shared_ptr<Tokenizer> from_tokenizer_json(const std::string& path) {
  return tokenizer_from_json_text(read_text_file(path), path);
}

// tokenizer_config.json of a folder (an empty object without one).
nlohmann::json tokenizer_config(const fs::path& dir) {
  const std::string file = (dir / "tokenizer_config.json").string();
  if (!fs::exists(file)) return nlohmann::json::object();
  auto tc = io::parse_json(read_text_file(file), cat("tokenizer config '", file, "'"));
  ONYX_CHECK(tc.is_object(), "tokenizer config '", file, "' is not a JSON object");
  return tc;
}

// A special token of tokenizer_config.json (in `dir`): a string or {"content": ...} (older files).
std::string config_token(const nlohmann::json& tc, const fs::path& dir, const char* key,
                         const std::string& fallback) {
  if (!tc.contains(key) || tc[key].is_null()) return fallback;
  const auto& v = tc[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  throw Error(cat("tokenizer config '", (dir / "tokenizer_config.json").string(), "': ", key,
                  " should be a string or {\"content\": ...}, got ", v.dump()));
}

// transformers' CLIPTokenizer from vocab.json and merges.txt (Stable Diffusion's tokenizer
// folders have no tokenizer.json): the tokenizer.json its constructor builds — NFC, white space
// runs to one space, Lowercase; CLIP's Split (Removed, invert) then ByteLevel; BPE with
// end_of_word_suffix "</w>"; RobertaProcessing with <|startoftext|> and <|endoftext|> — read
// as any tokenizer.json.
std::shared_ptr<Tokenizer> clip_from_files(const fs::path& dir, const nlohmann::json& tc) {
  const std::string vocab_file = (dir / "vocab.json").string();
  const std::string merges_file = (dir / "merges.txt").string();
  nlohmann::json vocab =
      io::parse_json(read_text_file(vocab_file), cat("CLIP vocabulary '", vocab_file, "'"));
  ONYX_CHECK(vocab.is_object(), "CLIP vocabulary '", vocab_file, "' is not a JSON object");
  nlohmann::json merges = nlohmann::json::array();
  std::istringstream lines(read_text_file(merges_file));
  std::string line;
  for (bool first = true; std::getline(lines, line); first = false) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if ((first && line.rfind("#version", 0) == 0) || line.empty()) continue;
    merges.push_back(line);
  }
  const std::string bos = config_token(tc, dir, "bos_token", "<|startoftext|>");
  const std::string eos = config_token(tc, dir, "eos_token", "<|endoftext|>");
  const std::string unk = config_token(tc, dir, "unk_token", "<|endoftext|>");
  const std::string pad = config_token(tc, dir, "pad_token", "<|endoftext|>");
  auto id_of = [&](const std::string& t) {
    ONYX_CHECK(vocab.contains(t) && vocab[t].is_number_integer(), "CLIP vocabulary '", vocab_file,
               "' has no token '", t, "' (named by tokenizer_config.json or CLIP's default)");
    return vocab[t].get<int64_t>();
  };
  nlohmann::json added = nlohmann::json::array();
  std::vector<std::string> specials;
  for (const auto& t : {bos, eos, unk, pad})
    if (std::find(specials.begin(), specials.end(), t) == specials.end()) specials.push_back(t);
  for (const auto& t : specials)
    added.push_back({{"id", id_of(t)},
                     {"content", t},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  const nlohmann::json byte_level = {{"type", "ByteLevel"},
                                     {"add_prefix_space", false},
                                     {"trim_offsets", true},
                                     {"use_regex", true}};
  nlohmann::json decoder = byte_level;
  decoder["add_prefix_space"] = true;
  nlohmann::json j = {
      {"added_tokens", added},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "NFC"}},
          {{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", " "}},
          {{"type", "Lowercase"}}}}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern",
            {{"Regex",
              "<\\|startoftext\\|>|<\\|endoftext\\|>|'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|"
              "[^\\s\\p{L}\\p{N}]+"}}},
           {"behavior", "Removed"},
           {"invert", true}},
          byte_level}}}},
      {"post_processor",
       {{"type", "RobertaProcessing"},
        {"sep", {eos, id_of(eos)}},
        {"cls", {bos, id_of(bos)}},
        {"trim_offsets", false},
        {"add_prefix_space", false}}},
      {"decoder", decoder},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", unk},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", "</w>"},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}}};
  return tokenizer_from_json_text(j.dump(), (dir / "merges.txt").string());
}

}  // namespace

std::shared_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  ONYX_CHECK(fs::exists(path), "tokenizer path '", path, "' does not exist");
  if (fs::is_directory(path)) {
    fs::path d(path);
    if (fs::exists(d / "tokenizer.json"))
      return from_tokenizer_json((d / "tokenizer.json").string());
    if (fs::exists(d / "vocab.txt")) {
      WordPieceConfig cfg;
      if (fs::exists(d / "tokenizer_config.json")) {
        auto file = (d / "tokenizer_config.json").string();
        try {
          auto tc = nlohmann::json::parse(read_text_file(file));
          if (tc.contains("do_lower_case") && tc["do_lower_case"].is_boolean()) {
            cfg.lowercase = tc["do_lower_case"].get<bool>();
            cfg.strip_accents = cfg.lowercase;
          }
          if (tc.contains("strip_accents") && tc["strip_accents"].is_boolean())
            cfg.strip_accents = tc["strip_accents"].get<bool>();
          if (tc.contains("tokenize_chinese_chars") && tc["tokenize_chinese_chars"].is_boolean())
            cfg.handle_chinese_chars = tc["tokenize_chinese_chars"].get<bool>();
        } catch (const nlohmann::json::exception& e) {
          throw Error(cat("tokenizer config '", file, "' is not valid JSON: ", e.what()));
        }
      }
      return WordPieceTokenizer::from_vocab_txt((d / "vocab.txt").string(), cfg);
    }
    if (fs::exists(d / "vocab.json") && fs::exists(d / "merges.txt")) {
      const auto tc = tokenizer_config(d);
      const bool named = tc.contains("tokenizer_class") && tc["tokenizer_class"].is_string();
      const std::string cls = named ? tc["tokenizer_class"].get<std::string>() : "";
      if (cls == "CLIPTokenizer" || cls == "CLIPTokenizerFast") return clip_from_files(d, tc);
      return BpeTokenizer::from_files((d / "vocab.json").string(), (d / "merges.txt").string());
    }
    throw Error(cat("tokenizer folder '", path,
                    "' has no tokenizer.json, vocab.txt, or vocab.json with merges.txt"));
  }
  fs::path p(path);
  if (p.filename() == "vocab.json") {
    auto merges = p.parent_path() / "merges.txt";
    ONYX_CHECK(fs::exists(merges), "BPE vocabulary '", path, "' needs merges.txt next to it ('",
               merges.string(), "' does not exist)");
    return BpeTokenizer::from_files(path, merges.string());
  }
  if (p.extension() == ".json") return from_tokenizer_json(path);
  if (p.extension() == ".txt") return WordPieceTokenizer::from_vocab_txt(path);
  throw Error(cat("tokenizer file '", path, "': expected tokenizer.json, vocab.txt or vocab.json"));
}

}  // namespace onyx::tokenizers
