// bpe.cc — GPT-2's byte-level BPE: the pre-tokenization pattern matched by hand, the
// byte-to-unicode map, and rank-ordered merges over a heap with a word cache (see bpe.h).
#include "data/bpe.h"

#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

#include "onyx/error.h"

namespace onyx::data {

namespace {

// GPT-2's bytes_to_unicode: printable bytes keep their code point; the other 68 map to 256, 257,
// ...
struct ByteMap {
  char32_t to_cp[256];
  std::unordered_map<char32_t, uint8_t> to_byte;
  ByteMap() {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? (char32_t)b : (char32_t)(256 + extra++);
      to_byte[to_cp[b]] = (uint8_t)b;
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

std::string byte_token(uint8_t b) {
  std::string s;
  unicode::append_utf8(byte_map().to_cp[b], s);
  return s;
}

}  // namespace

char32_t BpeTokenizer::byte_to_unicode(uint8_t b) { return byte_map().to_cp[b]; }

BpeTokenizer::BpeTokenizer(std::unordered_map<std::string, int64_t> vocab,
                           std::vector<std::pair<std::string, std::string>> merges, BpeConfig cfg,
                           std::string source)
    : cfg_(std::move(cfg)), vocab_(std::move(vocab)) {
  source_ = std::move(source);
  ONYX_CHECK(!vocab_.empty(), source_, ": the vocabulary is empty");
  int64_t max_id = -1;
  for (auto& [t, id] : vocab_) {
    ONYX_CHECK(id >= 0 && id < (1ll << 31), source_, ": token '", t, "' has id ", id,
               " out of range");
    max_id = std::max(max_id, id);
  }
  id_to_token_.resize(max_id + 1);
  for (auto& [t, id] : vocab_) id_to_token_[id] = t;
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(byte_token((uint8_t)b));
    byte_id_[b] = it == vocab_.end() ? -1 : it->second;
  }
  merge_rank_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    auto& [a, b] = merges[r];
    auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
    ONYX_CHECK(ia != vocab_.end() && ib != vocab_.end(), source_, ": merge ", r + 1, " ('", a,
               "' '", b, "') has a part that is not in the vocabulary");
    ONYX_CHECK(iab != vocab_.end(), source_, ": merge ", r + 1, " ('", a, "' '", b, "') makes '",
               a + b, "', which is not in the vocabulary");
    const uint64_t key = ((uint64_t)ia->second << 32) | (uint64_t)ib->second;
    merge_rank_.try_emplace(key, (int32_t)r, (int32_t)iab->second);  // the first (lowest) rank wins
  }
  eos_id_ = token_id(cfg_.eos_token);
  if (!eos_id_) eos_id_ = token_id("</s>");
  std::optional<int64_t> pad;
  if (!cfg_.pad_token.empty()) pad = token_id(cfg_.pad_token);
  if (!pad) pad = token_id("<pad>");
  if (!pad) pad = eos_id_;
  pad_id_ = pad.value_or(0);
  if (eos_id_) add_special_token(id_to_token_[*eos_id_], *eos_id_);
}

std::shared_ptr<BpeTokenizer> BpeTokenizer::from_files(const std::string& vocab_json,
                                                       const std::string& merges_txt,
                                                       BpeConfig cfg) {
  std::unordered_map<std::string, int64_t> vocab;
  try {
    auto j = nlohmann::json::parse(read_text_file(vocab_json));
    ONYX_CHECK(j.is_object(), "BPE vocabulary '", vocab_json,
               "' should be a JSON object {\"token\": id}");
    for (auto& [t, id] : j.items()) {
      ONYX_CHECK(id.is_number_integer(), "BPE vocabulary '", vocab_json, "': token '", t,
                 "' has no integer id");
      vocab[t] = id.get<int64_t>();
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("BPE vocabulary '", vocab_json, "' is not valid JSON: ", e.what()));
  }
  std::vector<std::pair<std::string, std::string>> merges;
  std::istringstream in(read_text_file(merges_txt));
  std::string line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (lineno == 1 && line.rfind("#version", 0) == 0)) continue;
    auto sp = line.find(' ');
    ONYX_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size() &&
                   line.find(' ', sp + 1) == std::string::npos,
               "BPE merges '", merges_txt, "' line ", lineno,
               ": expected two tokens separated by one space, got '", line, "'");
    merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  return std::make_shared<BpeTokenizer>(std::move(vocab), std::move(merges), std::move(cfg),
                                        cat("BPE files '", vocab_json, "' + '", merges_txt, "'"));
}

std::shared_ptr<BpeTokenizer> BpeTokenizer::from_tokenizer_json(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("tokenizer file '", path, "' is not valid JSON: ", e.what()));
  }
  return from_tokenizer_json(j, path);
}

std::shared_ptr<BpeTokenizer> BpeTokenizer::from_tokenizer_json(const nlohmann::json& j,
                                                                const std::string& path) {
  auto where = [&](const std::string& what) { return cat("tokenizer file '", path, "': ", what); };
  ONYX_CHECK(j.contains("model") && j["model"].is_object(), where("no \"model\" object"));
  const auto& m = j["model"];
  ONYX_CHECK(m.contains("vocab") && m["vocab"].is_object(),
             where("model.vocab (token -> id) is missing"));
  ONYX_CHECK(m.contains("merges") && m["merges"].is_array(), where("model.merges is missing"));
  BpeConfig cfg;
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  try {
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(k) && m[k].is_string() && !m[k].get<std::string>().empty())
        ONYX_UNSUPPORTED(
            where(cat("model.", k, " is set; only GPT-2-style byte-level BPE is supported")));
    if (m.value("byte_fallback", false))
      ONYX_UNSUPPORTED(where("model.byte_fallback (SentencePiece-style BPE) is not supported"));
    if (j.contains("normalizer") && !j["normalizer"].is_null())
      ONYX_UNSUPPORTED(where(cat("normalizer '", j["normalizer"].value("type", ""),
                                 "' is not supported with BPE (GPT-2's byte-level BPE has none)")));
    const nlohmann::json* pre = j.contains("pre_tokenizer") ? &j["pre_tokenizer"] : nullptr;
    if (pre && pre->value("type", "") == "Sequence" && pre->contains("pretokenizers") &&
        (*pre)["pretokenizers"].size() == 1)
      pre = &(*pre)["pretokenizers"][0];
    ONYX_CHECK(pre && pre->is_object() && pre->value("type", "") == "ByteLevel",
               where(cat("the BPE model needs a ByteLevel pre_tokenizer (GPT-2 style); found '",
                         pre && pre->is_object() ? pre->value("type", "") : "none", "'")));
    if (!pre->value("use_regex", true))
      ONYX_UNSUPPORTED(where("ByteLevel pre_tokenizer with use_regex false is not supported"));
    cfg.add_prefix_space = pre->value("add_prefix_space", false);

    for (auto& [t, id] : m["vocab"].items()) {
      ONYX_CHECK(id.is_number_integer(), where(cat("model.vocab['", t, "'] is not an integer id")));
      vocab[t] = id.get<int64_t>();
    }
    int64_t r = 0;
    for (auto& mj : m["merges"]) {
      ++r;
      if (mj.is_string()) {
        const std::string s = mj.get<std::string>();
        auto sp = s.find(' ');
        ONYX_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() &&
                       s.find(' ', sp + 1) == std::string::npos,
                   where(cat("model.merges[", r - 1, "] '", s,
                             "' is not two tokens separated by one space")));
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else {
        ONYX_CHECK(mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string(),
                   where(cat("model.merges[", r - 1, "] is neither \"a b\" nor [a, b]")));
        merges.emplace_back(mj[0].get<std::string>(), mj[1].get<std::string>());
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(where(cat("unexpected value: ", e.what())));
  }
  auto tok = std::make_shared<BpeTokenizer>(std::move(vocab), std::move(merges), cfg,
                                            cat("tokenizer file '", path, "'"));
  tok->template_ = parse_post_processor(j, path);
  if (j.contains("padding") && j["padding"].is_object() && j["padding"].contains("pad_id"))
    tok->pad_id_ = j["padding"]["pad_id"].get<int64_t>();
  register_added_tokens(j, path, *tok);
  return tok;
}

std::optional<int64_t> BpeTokenizer::token_id(const std::string& token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

// Matches GPT-2's pattern at each position, alternatives in order (the first that matches wins):
//   's|'t|'re|'ve|'m|'ll|'d  | ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+ | \s+(?!\S) | \s+
std::vector<std::string> BpeTokenizer::pre_tokenize(const std::string& text) {
  using namespace unicode;
  std::vector<uint8_t> blen;
  const std::u32string cp = decode_utf8(text, &blen);
  const size_t n = cp.size();
  std::vector<size_t> off(n + 1, 0);
  for (size_t i = 0; i < n; ++i) off[i + 1] = off[i] + blen[i];
  // 0 = \s, 1 = \p{L}, 2 = \p{N}, 3 = anything else
  std::vector<uint8_t> k(n);
  for (size_t i = 0; i < n; ++i) {
    const char32_t c = cp[i];
    const CharClass cc = char_class(c);
    k[i] = is_white_space(c) ? 0 : cc == CharClass::Letter ? 1 : cc == CharClass::Number ? 2 : 3;
  }
  auto run = [&](size_t j, uint8_t kind) {
    while (j < n && k[j] == kind) ++j;
    return j;
  };
  std::vector<std::string> pieces;
  size_t i = 0;
  while (i < n) {
    const char32_t c = cp[i];
    size_t j = 0;
    if (c == U'\'' && i + 1 < n) {
      const char32_t c1 = cp[i + 1], c2 = i + 2 < n ? cp[i + 2] : 0;
      if (c1 == U's' || c1 == U't' || c1 == U'm' || c1 == U'd')
        j = i + 2;
      else if ((c1 == U'r' && c2 == U'e') || (c1 == U'v' && c2 == U'e') ||
               (c1 == U'l' && c2 == U'l'))
        j = i + 3;
    }
    if (!j) {
      if (k[i] != 0) {
        j = run(i, k[i]);  // \p{L}+, \p{N}+ or [^\s\p{L}\p{N}]+ without the optional space
      } else if (c == U' ' && i + 1 < n && k[i + 1] != 0) {
        j = run(i + 1, k[i + 1]);  // " " then a run of one kind
      } else {
        const size_t e = run(i, 0);
        j = (e < n && e - i >= 2) ? e - 1 : e;  // \s+(?!\S) leaves the last space for the next word
      }
    }
    pieces.push_back(text.substr(off[i], off[j] - off[i]));
    i = j;
  }
  return pieces;
}

std::vector<int64_t> BpeTokenizer::bpe(const std::string& piece) const {
  const size_t n = piece.size();
  std::vector<int32_t> id(n), prev(n), next(n);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t b = (uint8_t)piece[i];
    ONYX_CHECK(byte_id_[b] >= 0, source_, ": the vocabulary has no token for byte 0x", std::hex,
               (int)b, " ('", byte_token(b), "')");
    id[i] = (int32_t)byte_id_[b];
    prev[i] = (int32_t)i - 1;
    next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
  }
  struct Cand {
    int32_t rank, pos, left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto consider = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    const int32_t nx = next[pos];
    auto it = merge_rank_.find(((uint64_t)id[pos] << 32) | (uint64_t)id[nx]);
    if (it != merge_rank_.end()) heap.push({it->second.first, pos, id[pos], id[nx]});
  };
  for (size_t i = 0; i + 1 < n; ++i) consider((int32_t)i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    const int32_t nx = next[c.pos];
    if (id[c.pos] != c.left || nx < 0 || id[nx] != c.right) continue;  // stale
    id[c.pos] = merge_rank_.at(((uint64_t)c.left << 32) | (uint64_t)c.right).second;
    id[nx] = -1;
    next[c.pos] = next[nx];
    if (next[nx] >= 0) prev[next[nx]] = c.pos;
    if (prev[c.pos] >= 0) consider(prev[c.pos]);
    consider(c.pos);
  }
  std::vector<int64_t> out;
  for (int32_t p = 0; p >= 0; p = next[p]) out.push_back(id[p]);
  return out;
}

void BpeTokenizer::encode_piece(const std::string& piece, std::vector<int64_t>& ids) const {
  if (piece.empty()) return;
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(piece);
    if (it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  auto out = bpe(piece);
  ids.insert(ids.end(), out.begin(), out.end());
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() >= cfg_.cache_capacity) cache_.clear();
  cache_.emplace(piece, std::move(out));
}

std::vector<int64_t> BpeTokenizer::encode_plain(const std::string& text) const {
  std::vector<int64_t> ids;
  if (cfg_.add_prefix_space && !text.empty() && text[0] != ' ') {
    for (auto& p : pre_tokenize(" " + text)) encode_piece(p, ids);
  } else {
    for (auto& p : pre_tokenize(text)) encode_piece(p, ids);
  }
  return ids;
}

std::vector<std::string> BpeTokenizer::tokenize(const std::string& text) const {
  std::vector<std::string> out;
  for (auto id : encode_ids(text))
    out.push_back(id >= 0 && id < (int64_t)id_to_token_.size() ? id_to_token_[id] : std::string());
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  const auto& to_byte = byte_map().to_byte;
  for (auto id : ids) {
    ONYX_CHECK(id >= 0 && id < (int64_t)id_to_token_.size(), source_, ": cannot decode id ", id,
               " (vocabulary has ", id_to_token_.size(), " ids)");
    for (char32_t c : unicode::decode_utf8(id_to_token_[id])) {
      auto it = to_byte.find(c);
      if (it != to_byte.end())
        out.push_back((char)it->second);
      else
        unicode::append_utf8(c, out);
    }
  }
  return out;
}

}  // namespace onyx::data
