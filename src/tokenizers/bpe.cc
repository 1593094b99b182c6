// bpe.cc — BPE: GPT-2's pre-tokenization pattern matched by hand (it is fixed and small, and runs
// without a regex engine on the vocab.json route), the byte-to-unicode map, rank-ordered merges
// over a heap with a word cache, and tokenizer.json's BPE model (byte fallback, unk, ignore_merges)
// behind the pipeline of hf_pipeline.h (see bpe.h).
#include "tokenizers/bpe.h"

#include <cctype>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

#include "onyx/error.h"
#include "tokenizers/hf_pipeline.h"

namespace onyx::tokenizers {

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
  ONYX_CHECK(max_id < (int64_t)vocab_.size() + kMaxIdGap, source_, ": the largest id, ", max_id,
             ", is far past the vocabulary's ", vocab_.size(), " entries (more than ", kMaxIdGap,
             " ids unused; onyx keeps ids in a table)");
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
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  std::string unk_token, suffix;
  try {
    if (m.contains("continuing_subword_prefix") && m["continuing_subword_prefix"].is_string() &&
        !m["continuing_subword_prefix"].get<std::string>().empty())
      ONYX_UNSUPPORTED(where("model.continuing_subword_prefix is set; it is not supported"));
    if (m.contains("end_of_word_suffix") && m["end_of_word_suffix"].is_string())
      suffix = m["end_of_word_suffix"].get<std::string>();
    if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
      ONYX_UNSUPPORTED(where("model.dropout (BPE dropout) is not supported"));
    auto flag = [&](const char* key) {
      return m.contains(key) && m[key].is_boolean() && m[key].get<bool>();
    };
    byte_fallback = flag("byte_fallback");  // (null: false, as tokenizers reads it)
    fuse_unk = flag("fuse_unk");
    ignore_merges = flag("ignore_merges");
    if (m.contains("unk_token") && !m["unk_token"].is_null()) {
      ONYX_CHECK(m["unk_token"].is_string(), where("model.unk_token should be a string"));
      unk_token = m["unk_token"].get<std::string>();
    }

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
  auto pipe = hf::Pipeline::parse(j, path);
  auto tok = std::make_shared<BpeTokenizer>(std::move(vocab), std::move(merges), cfg,
                                            cat("tokenizer file '", path, "'"));
  tok->pipe_ = pipe;
  tok->byte_fallback_ = byte_fallback;
  tok->fuse_unk_ = fuse_unk;
  tok->ignore_merges_ = ignore_merges;
  tok->suffix_ = suffix;
  if (!unk_token.empty()) {
    auto it = tok->vocab_.find(unk_token);
    ONYX_CHECK(it != tok->vocab_.end(),
               where(cat("model.unk_token '", unk_token, "' is not in model.vocab")));
    tok->unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto it = tok->vocab_.find(name);
    tok->fallback_id_[b] = it == tok->vocab_.end() ? -1 : it->second;
  }
  // exactly the file's added tokens (not the constructor's guess at an end-of-text token)
  tok->added_.clear();
  tok->added_match_.clear();
  register_added_tokens(j, path, *tok);
  for (auto& a : tok->added_) {
    ONYX_CHECK(a.id >= 0 && a.id < (1ll << 31),
               where(cat("added token '", a.content, "' has id ", a.id, " out of range")));
    if (a.id >= (int64_t)tok->id_to_token_.size()) tok->id_to_token_.resize(a.id + 1);
    // as tokenizers' id_to_token: a normalized token's content as the normalizer makes it
    tok->id_to_token_[a.id] = a.normalized ? tok->normalize_text(a.content) : a.content;
  }
  tok->template_ = parse_post_processor(j, path);
  if (!tok->eos_id_)
    for (const char* name : {"<|end_of_text|>", "<|endoftext|>", "</s>"})
      if ((tok->eos_id_ = tok->token_id(name))) break;
  if (j.contains("padding") && j["padding"].is_object() && j["padding"].contains("pad_id"))
    tok->pad_id_ = checked_pad_id(j, tok->vocab_size(), path);
  else if (auto pad = tok->token_id("<pad>"))
    tok->pad_id_ = *pad;
  else
    tok->pad_id_ = tok->eos_id_.value_or(0);
  return tok;
}

std::optional<int64_t> BpeTokenizer::token_id(const std::string& token) const {
  auto it = vocab_.find(token);
  if (it != vocab_.end()) return it->second;
  for (auto& a : added_)
    if (a.content == token) return a.id;
  return std::nullopt;
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
  std::vector<int32_t> id(n);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t b = (uint8_t)piece[i];
    ONYX_CHECK(byte_id_[b] >= 0, source_, ": the vocabulary has no token for byte 0x", std::hex,
               (int)b, " ('", byte_token(b), "')");
    id[i] = (int32_t)byte_id_[b];
  }
  return merge(std::move(id));
}

std::vector<int64_t> BpeTokenizer::merge(std::vector<int32_t> id) const {
  const size_t n = id.size();
  if (n == 0) return {};
  std::vector<int32_t> prev(n), next(n);
  for (size_t i = 0; i < n; ++i) {
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

bool BpeTokenizer::cached(const std::string& piece, std::vector<int64_t>& ids) const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  auto it = cache_.find(piece);
  if (it == cache_.end()) return false;
  ids.insert(ids.end(), it->second.begin(), it->second.end());
  return true;
}

void BpeTokenizer::cache_and_append(const std::string& piece, std::vector<int64_t> out,
                                    std::vector<int64_t>& ids) const {
  ids.insert(ids.end(), out.begin(), out.end());
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() >= cfg_.cache_capacity) cache_.clear();
  cache_.emplace(piece, std::move(out));
}

void BpeTokenizer::encode_piece(const std::string& piece, std::vector<int64_t>& ids) const {
  if (piece.empty() || cached(piece, ids)) return;
  cache_and_append(piece, bpe(piece), ids);
}

void BpeTokenizer::encode_word(const std::string& piece, std::vector<int64_t>& ids) const {
  if (piece.empty() || cached(piece, ids)) return;
  std::vector<int64_t> out;
  auto whole = ignore_merges_ ? vocab_.find(piece) : vocab_.end();
  if (whole != vocab_.end()) {
    out.push_back(whole->second);
  } else {
    std::vector<uint8_t> blen;
    const size_t nchars = unicode::decode_utf8(piece, &blen).size();
    std::vector<int32_t> sym;
    bool unk_pending = false;  // an unknown character (or a fused run) not yet added
    size_t off = 0;
    for (size_t c = 0; c < nchars; off += blen[c], ++c) {
      const std::string ch = piece.substr(off, blen[c]);
      auto it = vocab_.find(c + 1 == nchars && !suffix_.empty() ? ch + suffix_ : ch);
      if (it != vocab_.end()) {
        if (unk_pending) sym.push_back((int32_t)unk_id_);
        unk_pending = false;
        sym.push_back((int32_t)it->second);
        continue;
      }
      if (byte_fallback_) {
        bool all = true;
        for (unsigned char b : ch) all = all && fallback_id_[b] >= 0;
        if (all) {
          for (unsigned char b : ch) sym.push_back((int32_t)fallback_id_[b]);
          continue;
        }
      }
      if (unk_id_ >= 0) {
        if (unk_pending && !fuse_unk_) sym.push_back((int32_t)unk_id_);
        unk_pending = true;
      }
      // no unk_token: tokenizers drops the character
    }
    if (unk_pending) sym.push_back((int32_t)unk_id_);
    out = merge(std::move(sym));
  }
  cache_and_append(piece, std::move(out), ids);
}

std::string BpeTokenizer::normalize_text(const std::string& text) const {
  return pipe_ ? pipe_->normalize(text) : text;
}

std::vector<int64_t> BpeTokenizer::encode_segment(const std::string& normalized,
                                                  bool at_start) const {
  if (!pipe_) return encode_plain(normalized);
  std::vector<int64_t> ids;
  for (auto& p : pipe_->pre_tokenize(normalized, at_start)) encode_word(p.text, ids);
  return ids;
}

std::vector<int64_t> BpeTokenizer::encode_plain(const std::string& text) const {
  if (pipe_) return encode_segment(text, true);
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

namespace {
// transformers' CLIPTokenizer.decode after the backend's: the suffix replaced by spaces, the
// text stripped of white space at both ends.
std::string suffix_to_spaces(const std::string& text, const std::string& suffix) {
  std::string s;
  size_t prev = 0;
  for (size_t p = text.find(suffix); p != std::string::npos; p = text.find(suffix, prev)) {
    s.append(text, prev, p - prev).push_back(' ');
    prev = p + suffix.size();
  }
  s.append(text, prev, std::string::npos);
  std::u32string u = unicode::decode_utf8(s);
  // Python's str.isspace: White_Space and the separators U+001C..U+001F
  auto space = [](char32_t c) { return unicode::is_white_space(c) || (c >= 0x1C && c <= 0x1F); };
  size_t b = 0, e = u.size();
  while (b < e && space(u[b])) ++b;
  while (e > b && space(u[e - 1])) --e;
  return unicode::encode_utf8(u.substr(b, e - b));
}
}  // namespace

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  for (auto id : ids)
    ONYX_CHECK(id >= 0 && id < (int64_t)id_to_token_.size(), source_, ": cannot decode id ", id,
               " (vocabulary has ", id_to_token_.size(), " ids)");
  if (pipe_) {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (auto id : ids) tokens.push_back(id_to_token_[id]);
    std::string text = pipe_->decode(std::move(tokens));
    return suffix_.empty() ? text : suffix_to_spaces(text, suffix_);
  }
  std::string out;
  for (auto id : ids) append_byte_level(id_to_token_[id], out);
  return out;
}

void BpeTokenizer::append_byte_level(const std::string& token, std::string& out) {
  const auto& to_byte = byte_map().to_byte;
  for (char32_t c : unicode::decode_utf8(token)) {
    auto it = to_byte.find(c);
    if (it != to_byte.end())
      out.push_back((char)it->second);
    else
      unicode::append_utf8(c, out);
  }
}

std::string BpeTokenizer::token_bytes(int64_t id) const {
  ONYX_CHECK(id >= 0 && id < (int64_t)id_to_token_.size(), source_, ": cannot decode id ", id,
             " (vocabulary has ", id_to_token_.size(), " ids)");
  const std::string& t = id_to_token_[id];
  if (const AddedToken* a = added_token(id)) return a->content;
  std::string out;
  if (!pipe_ || pipe_->byte_level()) {
    append_byte_level(t, out);
    return out;
  }
  if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
      std::isxdigit((unsigned char)t[3]) && std::isxdigit((unsigned char)t[4]))
    return std::string(1, (char)std::stoi(t.substr(3, 2), nullptr, 16));
  static const std::string kSpace = "\u2581";
  for (size_t i = 0; i < t.size();) {
    if (t.compare(i, kSpace.size(), kSpace) == 0) {
      out.push_back(' ');
      i += kSpace.size();
    } else {
      out.push_back(t[i++]);
    }
  }
  return out;
}

}  // namespace onyx::tokenizers
