// test_llama_tokenizer_reference.cc — onyx's tokenizer.json BPE in the Llama family's styles
// against Hugging Face tokenizers: four tokenizers trained by
// tests/tokenizers/make_tokenizer_references.py on the WordNet glosses
// (BUILD/llama-family-reference or $ONYX_LLAMA_TOKENIZER_REFERENCE): llama3 (Split regex +
// ByteLevel, ignore_merges, BOS template), qwen2 (NFC, Qwen2's regex), sentencepiece (byte
// fallback, Prepend/Replace normalizer, ByteFallback/Fuse/Strip decoder) and metaspace (Metaspace
// pre-tokenizer and decoder, fused <unk>), and CLIP's (Lowercase, Split with invert, BPE with
// end_of_word_suffix; from its tokenizer.json and from vocab.json + merges.txt as Stable
// Diffusion's folders hold it). Every line must give HF's ids without and with the
// post-processor's special tokens (one text and, every 50th line, a pair with the next line), and
// HF's decode of those ids. Also the errors that unsupported parts of a file give. A missing
// reference is a failure, not a skip.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "onyx/error.h"
#include "tokenizers/bpe.h"
#include "tokenizers/hf_pipeline.h"

namespace fs = std::filesystem;
using namespace onyx;
using namespace onyx::tokenizers;

namespace {

std::string reference_dir() {
  if (const char* env = std::getenv("ONYX_LLAMA_TOKENIZER_REFERENCE")) return env;
  return std::string(ONYX_BINARY_DIR) + "/llama-family-reference";
}

struct Line {
  std::string text, decoded;
  std::vector<int64_t> ids, with_special;
  std::optional<std::string> pair_with;  // every 50th line: encoded as a pair with the next line
  std::vector<int64_t> pair_ids, pair_type_ids;
};

std::vector<Line> read_reference(const std::string& path) {
  std::vector<Line> lines;
  std::ifstream f(path);
  std::string s;
  while (std::getline(f, s)) {
    if (s.empty()) continue;
    auto j = nlohmann::json::parse(s);
    Line l{j["text"].get<std::string>(), j["decoded"].get<std::string>(),
           j["ids"].get<std::vector<int64_t>>(), j["with_special"].get<std::vector<int64_t>>()};
    if (j.contains("pair_with")) {
      l.pair_with = j["pair_with"].get<std::string>();
      l.pair_ids = j["pair_ids"].get<std::vector<int64_t>>();
      l.pair_type_ids = j["pair_type_ids"].get<std::vector<int64_t>>();
    }
    lines.push_back(std::move(l));
  }
  return lines;
}

std::string show(const std::vector<int64_t>& v) {
  std::string s;
  for (auto x : v) s += (s.empty() ? "" : " ") + std::to_string(x);
  return s;
}

// Checks one style's tokenizer.json (or `tokenizer_path`) against its reference.jsonl; returns
// the tokenizer.
std::shared_ptr<Tokenizer> check_style(const std::string& style,
                                       const std::string& tokenizer_path = "") {
  const std::string dir = reference_dir() + "/" + style;
  if (!fs::exists(dir + "/reference.jsonl")) {
    ADD_FAILURE() << "no " << style << " reference in " << dir
                  << "; make it with HF tokenizers: build/venv/bin/python "
                     "tests/tokenizers/make_tokenizer_references.py "
                  << fs::path(reference_dir()).parent_path().string();
    return nullptr;
  }
  auto lines = read_reference(dir + "/reference.jsonl");
  EXPECT_GT(lines.size(), 30000u) << style;
  auto tok = load_tokenizer(tokenizer_path.empty() ? dir + "/tokenizer.json" : tokenizer_path);
  int64_t bad = 0, bad_special = 0, bad_decode = 0, bad_pair = 0, pairs = 0, tokens = 0;
  for (auto& l : lines) {
    auto ids = tok->encode_ids(l.text);
    tokens += ids.size();
    if (ids != l.ids && ++bad <= 5)
      ADD_FAILURE() << style << ": ids differ for " << nlohmann::json(l.text).dump()
                    << "\n  onyx:          " << show(ids) << "\n  HF tokenizers: " << show(l.ids);
    auto e = tok->encode(l.text);
    if (e.input_ids != l.with_special && ++bad_special <= 5)
      ADD_FAILURE() << style << ": ids with special tokens differ for "
                    << nlohmann::json(l.text).dump() << "\n  onyx:          " << show(e.input_ids)
                    << "\n  HF tokenizers: " << show(l.with_special);
    if (l.pair_with) {
      ++pairs;
      auto p = tok->encode_pair(l.text, *l.pair_with);
      if ((p.input_ids != l.pair_ids || p.token_type_ids != l.pair_type_ids) && ++bad_pair <= 5)
        ADD_FAILURE() << style << ": pair differs for " << nlohmann::json(l.text).dump() << " + "
                      << nlohmann::json(*l.pair_with).dump()
                      << "\n  onyx:          " << show(p.input_ids) << " types "
                      << show(p.token_type_ids) << "\n  HF tokenizers: " << show(l.pair_ids)
                      << " types " << show(l.pair_type_ids);
    }
    const std::string back = tok->decode(l.ids);
    if (back != l.decoded && ++bad_decode <= 5)
      ADD_FAILURE() << style << ": decode of HF's ids of " << nlohmann::json(l.text).dump()
                    << "\n  onyx:          " << nlohmann::json(back).dump()
                    << "\n  HF tokenizers: " << nlohmann::json(l.decoded).dump();
  }
  EXPECT_EQ(bad, 0) << style << ": " << bad << " of " << lines.size() << " lines differ";
  EXPECT_EQ(bad_special, 0) << style << ": " << bad_special << " of " << lines.size()
                            << " lines differ with special tokens";
  EXPECT_EQ(bad_decode, 0) << style << ": " << bad_decode << " of " << lines.size()
                           << " lines decode differently";
  if (style != "clip") {  // (CLIP's reference has no pairs)
    EXPECT_GT(pairs, 500) << style;
  }
  EXPECT_EQ(bad_pair, 0) << style << ": " << bad_pair << " of " << pairs << " pairs differ";
  std::cout << "[ info ] " << style << ": " << lines.size() << " lines, " << tokens
            << " tokens checked against HF tokenizers\n";
  return tok;
}

}  // namespace

TEST(LlamaTokenizerReference, Llama3ByteLevelSplitRegex) {
  auto tok = check_style("llama3");
  ASSERT_TRUE(tok);
  // <|begin_of_text|> is an added token after the BPE vocabulary, and the template's BOS
  auto bos = tok->token_id("<|begin_of_text|>");
  ASSERT_TRUE(bos);
  EXPECT_EQ(*bos, 6002);
  EXPECT_EQ(tok->vocab_size(), 6010);  // + the two words no merge makes
  EXPECT_EQ(tok->eos_id(), tok->token_id("<|end_of_text|>"));
  EXPECT_EQ(tok->encode("").input_ids, (std::vector<int64_t>{*bos}));
  // token_bytes: each token's own bytes, which concatenate to the text (a character split across
  // byte-level tokens included), while decode makes whole characters
  const std::string text = "caf\xc3\xa9 \xf0\x9f\x98\x80 wugwug<|eot_id|>";
  std::string joined;
  for (auto id : tok->encode_ids(text)) joined += tok->token_bytes(id);
  EXPECT_EQ(joined, text);
}

TEST(LlamaTokenizerReference, Qwen2NfcByteLevel) {
  auto tok = check_style("qwen2");
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->num_special_tokens(false), 0);
  EXPECT_EQ(tok->eos_id(), tok->token_id("<|endoftext|>"));
}

TEST(LlamaTokenizerReference, SentencePieceByteFallback) {
  auto tok = check_style("sentencepiece");
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->token_id("<0x41>"), 3 + 0x41);
  EXPECT_EQ(tok->eos_id(), 2);  // </s>
  // a character no gloss has becomes its UTF-8 bytes
  auto ids = tok->encode_ids("\xe4\xb8\x80");  // U+4E00
  const std::vector<int64_t> want = {*tok->token_id("\xe2\x96\x81"), 3 + 0xE4, 3 + 0xB8, 3 + 0x80};
  EXPECT_EQ(ids, want);
  std::string joined;
  for (auto id : ids) joined += tok->token_bytes(id);
  EXPECT_EQ(joined, " \xe4\xb8\x80");  // the normalizer's "▁" is a space
}

TEST(LlamaTokenizerReference, MetaspaceFusedUnk) { EXPECT_TRUE(check_style("metaspace")); }

// CLIP's tokenizer.json as transformers' CLIPTokenizer saves it: Lowercase, Split with invert and
// behavior Removed, BPE with end_of_word_suffix "</w>", RobertaProcessing; decode as
// CLIPTokenizer.decode (the suffix back to spaces, stripped).
TEST(LlamaTokenizerReference, ClipTokenizerJson) {
  auto tok = check_style("clip");
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->encode_ids("A photo of a Dog!"), tok->encode_ids("a   photo of\ta dog !"));
}

// Stable Diffusion's tokenizer folders: vocab.json, merges.txt and tokenizer_config.json naming
// CLIPTokenizer, no tokenizer.json — the same ids as the tokenizer.json transformers builds.
TEST(LlamaTokenizerReference, ClipFromVocabAndMerges) {
  const std::string src = reference_dir() + "/clip";
  const fs::path dir = fs::path(::testing::TempDir()) / "onyx_clip_slow_files";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json"}) {
    ASSERT_TRUE(fs::exists(src + "/" + f)) << src << "/" << f;
    fs::copy_file(src + "/" + f, dir / f);
  }
  EXPECT_TRUE(check_style("clip", dir.string()));
  // older configs give the special tokens as {"content": ...}; a token the vocabulary lacks is
  // an error naming it
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"tokenizer_class": "CLIPTokenizer", "bos_token": {"content": "<|startoftext|>"},)"
      << R"( "pad_token": "<|nothere|>"})";
  try {
    load_tokenizer(dir.string());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'<|nothere|>'"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"tokenizer_class": "CLIPTokenizer", "bos_token": 5})";
  try {
    load_tokenizer(dir.string());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("tokenizer_config.json"), std::string::npos) << w;
    EXPECT_NE(w.find("bos_token"), std::string::npos) << w;
  }
  fs::remove_all(dir);
}

namespace {

std::string tmp_json(const std::string& name, const nlohmann::json& j) {
  auto d = fs::temp_directory_path() / ("onyx_test_llama_tok_" + std::to_string(::getpid()));
  fs::create_directories(d);
  auto p = (d / (name + ".json")).string();
  std::ofstream(p) << j.dump();
  return p;
}

nlohmann::json minimal_bpe() {
  return {{"model",
           {{"type", "BPE"},
            {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}},
            {"merges", nlohmann::json::array({"a b"})}}}};
}

// Loading `j` fails naming the file and every one of `parts`.
void expect_error(const std::string& name, const nlohmann::json& j,
                  const std::vector<std::string>& parts) {
  const std::string path = tmp_json(name, j);
  try {
    load_tokenizer(path);
    ADD_FAILURE() << name << ": expected an error";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find(path), std::string::npos) << w;
    for (auto& p : parts) EXPECT_NE(w.find(p), std::string::npos) << name << ": " << w;
  }
}

}  // namespace

TEST(LlamaTokenizerErrors, UnsupportedPartsNameFileAndJsonPath) {
  auto split = [](const std::string& regex, const std::string& behavior, bool invert) {
    return nlohmann::json{{"type", "Split"},
                          {"pattern", {{"Regex", regex}}},
                          {"behavior", behavior},
                          {"invert", invert}};
  };
  auto seq = [](nlohmann::json first) {
    return nlohmann::json{
        {"type", "Sequence"},
        {"pretokenizers",
         nlohmann::json::array(
             {first, {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  };
  auto j = minimal_bpe();
  j["pre_tokenizer"] = seq(split("\\p{L}+", "Sideways", false));
  expect_error("behavior", j, {"pre_tokenizer.pretokenizers[0].behavior", "Sideways"});
  j["pre_tokenizer"] = seq(split("(?i:'s|[a-z]+", "Isolated", false));
  expect_error("bad_regex", j,
               {"pre_tokenizer.pretokenizers[0].pattern.Regex", "invalid regex", "(?i:'s|[a-z]+"});
  j["pre_tokenizer"] = seq(split("\\p{NoSuchClass}", "Isolated", false));
  expect_error("bad_class", j, {"pre_tokenizer.pretokenizers[0].pattern.Regex", "invalid regex"});
  j["pre_tokenizer"] = nullptr;
  j["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers", nlohmann::json::array({{{"type", "NFC"}}, {{"type", "Nmt"}}})}};
  expect_error("normalizer", j, {"normalizer.normalizers[1]", "Nmt"});
  j["normalizer"] = nullptr;
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error("decoder", j, {"decoder", "WordPiece"});
  j["decoder"] = nullptr;
  j["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "sometimes"}};
  expect_error("scheme", j, {"pre_tokenizer.prepend_scheme", "sometimes"});
  j["pre_tokenizer"] = nullptr;
  j["model"]["unk_token"] = "<unk>";
  expect_error("unk", j, {"model.unk_token", "<unk>"});
  j["model"]["unk_token"] = nullptr;
  j["model"]["dropout"] = 0.1;
  expect_error("dropout", j, {"model.dropout"});
  j["model"]["dropout"] = nullptr;
  j["post_processor"] = {{"type", "BertProcessing"}, {"sep", {"b", 1}}, {"cls", {"a"}}};
  expect_error("post", j, {"post_processor.cls"});
}

// Split's five behaviors, with and without invert, on a pattern of one character: the pieces
// tokenizers' Split(Regex("[^a-z]"), behavior, invert).pre_tokenize_str gives (by running it).
TEST(HfPipeline, SplitBehaviorsAndInvert) {
  using V = std::vector<std::string>;
  const std::string text = "ab, cd!!ef  g";
  struct Case {
    const char* behavior;
    bool invert;
    V pieces;
  };
  const std::vector<Case> cases = {
      {"Removed", false, {"ab", "cd", "ef", "g"}},
      {"Removed", true, {",", " ", "!", "!", " ", " "}},
      {"Isolated", false, {"ab", ",", " ", "cd", "!", "!", "ef", " ", " ", "g"}},
      {"Isolated", true, {"ab", ",", " ", "cd", "!", "!", "ef", " ", " ", "g"}},
      {"MergedWithPrevious", false, {"ab,", " ", "cd!", "!", "ef ", " ", "g"}},
      {"MergedWithPrevious", true, {"ab", ",", " cd", "!", "!ef", " ", " g"}},
      {"MergedWithNext", false, {"ab", ",", " cd", "!", "!ef", " ", " g"}},
      {"MergedWithNext", true, {"ab,", " ", "cd!", "!", "ef ", " ", "g"}},
      {"Contiguous", false, {"ab", ", ", "cd", "!!", "ef", "  ", "g"}},
      {"Contiguous", true, {"ab", ", ", "cd", "!!", "ef", "  ", "g"}}};
  for (const auto& c : cases) {
    nlohmann::json j = {{"pre_tokenizer",
                         {{"type", "Split"},
                          {"pattern", {{"Regex", "[^a-z]"}}},
                          {"behavior", c.behavior},
                          {"invert", c.invert}}}};
    V got;
    for (auto& p : hf::Pipeline::parse(j, "test")->pre_tokenize(text, true)) got.push_back(p.text);
    EXPECT_EQ(got, c.pieces) << c.behavior << (c.invert ? " inverted" : "");
  }
}

// The pipeline pieces on small hand-made cases whose results tokenizers gives (checked by running
// it): lossy UTF-8 as Rust's from_utf8_lossy, White_Space for \s (VT and NEL included).
TEST(HfPipeline, LossyUtf8AndWhiteSpace) {
  EXPECT_EQ(hf::utf8_lossy("a\xe9\xe4\xb8"), "a\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(hf::utf8_lossy("\xe4\xb8\x80\xff"), "\xe4\xb8\x80\xef\xbf\xbd");
  EXPECT_EQ(hf::utf8_lossy("\xf0\x9f\x98"), "\xef\xbf\xbd");
  hf::Regex re("\\s+", false, "test");
  auto m = re.find_all("a\x0b\xc2\x85 b");
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0], (std::pair<size_t, size_t>{1, 5}));
  hf::Regex lit("a.", true, "test");
  EXPECT_EQ(lit.find_all("xa.a.ab").size(), 2u);
}
