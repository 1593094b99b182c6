// wordpiece.cc — BERT's normalizer, pre-tokenizer and WordPiece model (see wordpiece.h).
#include "tokenizers/wordpiece.h"

#include <nlohmann/json.hpp>
#include <sstream>

#include "onyx/error.h"

namespace onyx::tokenizers {

WordPieceTokenizer::WordPieceTokenizer(std::vector<std::string> vocab, WordPieceConfig cfg,
                                       std::string source)
    : cfg_(std::move(cfg)), vocab_(std::move(vocab)) {
  source_ = std::move(source);
  ids_.reserve(vocab_.size());
  for (size_t i = 0; i < vocab_.size(); ++i) ids_[vocab_[i]] = (int64_t)i;
  auto unk = ids_.find(cfg_.unk_token);
  ONYX_CHECK(unk != ids_.end(), source_, ": the vocabulary has no unknown token '", cfg_.unk_token,
             "'");
  unk_id_ = unk->second;
  auto cls = token_id(cfg_.cls_token), sep = token_id(cfg_.sep_token);
  if (cls && sep) {
    const TemplatePiece c{TemplatePiece::Special, *cls, 0}, s0{TemplatePiece::Special, *sep, 0},
        s1{TemplatePiece::Special, *sep, 1};
    template_.single = {c, {TemplatePiece::SequenceA, 0, 0}, s0};
    template_.pair = {
        c, {TemplatePiece::SequenceA, 0, 0}, s0, {TemplatePiece::SequenceB, 0, 1}, s1};
  }
  if (auto pad = token_id(cfg_.pad_token)) pad_id_ = *pad;
  eos_id_ = sep;
  for (auto* t :
       {&cfg_.unk_token, &cfg_.cls_token, &cfg_.sep_token, &cfg_.pad_token, &cfg_.mask_token})
    if (auto id = token_id(*t)) add_special_token(*t, *id);
}

std::shared_ptr<WordPieceTokenizer> WordPieceTokenizer::from_vocab_txt(const std::string& path,
                                                                       WordPieceConfig cfg) {
  std::string text = read_text_file(path);
  std::vector<std::string> vocab;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    vocab.push_back(line);
  }
  ONYX_CHECK(!vocab.empty(), "WordPiece vocabulary '", path, "' is empty");
  return std::make_shared<WordPieceTokenizer>(std::move(vocab), std::move(cfg),
                                              cat("WordPiece vocabulary '", path, "'"));
}

std::shared_ptr<WordPieceTokenizer> WordPieceTokenizer::from_tokenizer_json(
    const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("tokenizer file '", path, "' is not valid JSON: ", e.what()));
  }
  return from_tokenizer_json(j, path);
}

std::shared_ptr<WordPieceTokenizer> WordPieceTokenizer::from_tokenizer_json(
    const nlohmann::json& j, const std::string& path) {
  auto where = [&](const std::string& what) { return cat("tokenizer file '", path, "': ", what); };
  ONYX_CHECK(j.contains("model") && j["model"].is_object(), where("no \"model\" object"));
  const auto& m = j["model"];
  ONYX_CHECK(m.contains("vocab") && m["vocab"].is_object(),
             where("model.vocab (token -> id) is missing"));
  WordPieceConfig cfg;
  try {
    if (m.contains("unk_token") && m["unk_token"].is_string()) cfg.unk_token = m["unk_token"];
    if (m.contains("continuing_subword_prefix") && m["continuing_subword_prefix"].is_string())
      cfg.continuing_subword_prefix = m["continuing_subword_prefix"];
    if (m.contains("max_input_chars_per_word") && m["max_input_chars_per_word"].is_number_integer())
      cfg.max_input_chars_per_word = m["max_input_chars_per_word"];

    cfg.lowercase = cfg.strip_accents = cfg.clean_text = cfg.handle_chinese_chars = false;
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      const auto& n = j["normalizer"];
      const std::string type = n.value("type", "");
      if (type != "BertNormalizer")
        ONYX_UNSUPPORTED(where(cat("normalizer type '", type,
                                   "' is not supported with WordPiece (BertNormalizer is)")));
      cfg.clean_text = n.value("clean_text", true);
      cfg.handle_chinese_chars = n.value("handle_chinese_chars", true);
      cfg.lowercase = n.value("lowercase", true);
      cfg.strip_accents = n.contains("strip_accents") && n["strip_accents"].is_boolean()
                              ? n["strip_accents"].get<bool>()
                              : cfg.lowercase;
    }
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) {
      const std::string type = j["pre_tokenizer"].value("type", "");
      if (type != "BertPreTokenizer")
        ONYX_UNSUPPORTED(where(cat("pre_tokenizer type '", type,
                                   "' is not supported with WordPiece (BertPreTokenizer is)")));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(where(cat("unexpected value: ", e.what())));
  }

  int64_t max_id = -1;
  for (auto& [tok, id] : m["vocab"].items()) {
    ONYX_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0,
               where(cat("model.vocab['", tok, "'] is not an id")));
    max_id = std::max(max_id, id.get<int64_t>());
  }
  ONYX_CHECK(max_id >= 0, where("model.vocab is empty"));
  ONYX_CHECK(max_id + 1 == (int64_t)m["vocab"].size(),
             where(cat("model.vocab's ids must be 0..", m["vocab"].size() - 1,
                       " (one per entry), but the largest is ", max_id)));
  std::vector<std::string> vocab(max_id + 1);
  std::vector<bool> seen(max_id + 1, false);
  for (auto& [tok, id] : m["vocab"].items()) {
    vocab[id.get<int64_t>()] = tok;
    seen[id.get<int64_t>()] = true;
  }
  for (int64_t i = 0; i <= max_id; ++i)
    ONYX_CHECK(seen[i], where(cat("model.vocab has no token with id ", i, " (ids must be 0..",
                                  max_id, ")")));

  auto tok = std::make_shared<WordPieceTokenizer>(std::move(vocab), cfg,
                                                  cat("tokenizer file '", path, "'"));
  tok->template_ = parse_post_processor(j, path);
  register_added_tokens(j, path, *tok);
  if (j.contains("padding") && j["padding"].is_object() && j["padding"].contains("pad_id"))
    tok->pad_id_ = checked_pad_id(j, tok->vocab_size() + (int64_t)tok->added_tokens().size(), path);
  return tok;
}

std::optional<int64_t> WordPieceTokenizer::token_id(const std::string& token) const {
  auto it = ids_.find(token);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

std::u32string WordPieceTokenizer::normalize(const std::string& text) const {
  using namespace unicode;
  std::u32string s = decode_utf8(text);
  if (cfg_.clean_text) {
    std::u32string t;
    t.reserve(s.size());
    for (char32_t c : s) {
      if (c == 0 || c == 0xFFFD || is_bert_control(c)) continue;
      t.push_back(is_white_space(c) ? U' ' : c);
    }
    s.swap(t);
  }
  if (cfg_.handle_chinese_chars) {
    std::u32string t;
    t.reserve(s.size());
    for (char32_t c : s) {
      if (is_cjk(c)) {
        t.push_back(U' ');
        t.push_back(c);
        t.push_back(U' ');
      } else {
        t.push_back(c);
      }
    }
    s.swap(t);
  }
  if (cfg_.strip_accents) {
    std::u32string t;
    t.reserve(s.size());
    for (char32_t c : s) append_strip_accents(c, t);
    s.swap(t);
  }
  if (cfg_.lowercase) {
    std::u32string t;
    t.reserve(s.size());
    for (char32_t c : s) append_lower(c, t);
    s.swap(t);
  }
  return s;
}

std::vector<std::u32string> WordPieceTokenizer::pre_tokenize(const std::u32string& s) const {
  std::vector<std::u32string> words;
  std::u32string cur;
  auto flush = [&] {
    if (!cur.empty()) words.push_back(std::move(cur));
    cur.clear();
  };
  for (char32_t c : s) {
    if (unicode::is_white_space(c)) {
      flush();
    } else if (unicode::is_bert_punctuation(c)) {
      flush();
      words.push_back(std::u32string(1, c));
    } else {
      cur.push_back(c);
    }
  }
  flush();
  return words;
}

void WordPieceTokenizer::wordpiece(const std::u32string& word, std::vector<int64_t>& ids,
                                   std::vector<std::string>* pieces) const {
  if ((int64_t)word.size() > cfg_.max_input_chars_per_word) {
    ids.push_back(unk_id_);
    if (pieces) pieces->push_back(cfg_.unk_token);
    return;
  }
  // UTF-8 of the word and the byte offset of each character.
  std::string utf8;
  std::vector<size_t> off;
  for (char32_t c : word) {
    off.push_back(utf8.size());
    unicode::append_utf8(c, utf8);
  }
  off.push_back(utf8.size());
  const size_t n = word.size();
  std::vector<std::pair<int64_t, std::string>> out;
  size_t start = 0;
  std::string key;
  while (start < n) {
    size_t end = n;
    int64_t found = -1;
    while (start < end) {
      key.clear();
      if (start > 0) key = cfg_.continuing_subword_prefix;
      key.append(utf8, off[start], off[end] - off[start]);
      auto it = ids_.find(key);
      if (it != ids_.end()) {
        found = it->second;
        break;
      }
      --end;
    }
    if (found < 0) {
      ids.push_back(unk_id_);
      if (pieces) pieces->push_back(cfg_.unk_token);
      return;
    }
    out.emplace_back(found, key);
    start = end;
  }
  for (auto& [id, piece] : out) {
    ids.push_back(id);
    if (pieces) pieces->push_back(std::move(piece));
  }
}

std::vector<int64_t> WordPieceTokenizer::encode_plain(const std::string& text) const {
  std::vector<int64_t> ids;
  for (auto& w : pre_tokenize(normalize(text))) wordpiece(w, ids, nullptr);
  return ids;
}

std::vector<std::string> WordPieceTokenizer::tokenize(const std::string& text) const {
  std::vector<int64_t> ids;
  std::vector<std::string> pieces;
  for (auto& w : pre_tokenize(normalize(text))) wordpiece(w, ids, &pieces);
  return pieces;
}

std::string WordPieceTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  const auto& pre = cfg_.continuing_subword_prefix;
  for (auto id : ids) {
    ONYX_CHECK(id >= 0 && id < (int64_t)vocab_.size(), source_, ": cannot decode id ", id,
               " (vocabulary has ", vocab_.size(), " tokens)");
    const std::string& t = vocab_[id];
    if (!pre.empty() && t.compare(0, pre.size(), pre) == 0 && !out.empty()) {
      out.append(t, pre.size(), std::string::npos);
    } else {
      if (!out.empty()) out.push_back(' ');
      out += t;
    }
  }
  return out;
}

}  // namespace onyx::tokenizers
