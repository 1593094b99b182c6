// test_bpe.cc — byte-level BPE on a tiny hand-made vocabulary: GPT-2's pre-tokenization pattern,
// the byte-to-unicode map, merge order by rank, decoding, file formats and their errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "onyx/error.h"
#include "tokenizers/bpe.h"

namespace fs = std::filesystem;
using namespace onyx;
using namespace onyx::tokenizers;

namespace {

using V = std::vector<std::string>;
using I = std::vector<int64_t>;
using Merges = std::vector<std::pair<std::string, std::string>>;

// All 256 byte tokens (ids 0..255 in byte order) plus the merges' results and <|endoftext|>.
std::shared_ptr<BpeTokenizer> make(const Merges& merges, BpeConfig cfg = {},
                                   std::unordered_map<std::string, int64_t>* vocab_out = nullptr) {
  std::unordered_map<std::string, int64_t> vocab;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    unicode::append_utf8(BpeTokenizer::byte_to_unicode((uint8_t)b), s);
    vocab[s] = b;
  }
  for (auto& [a, b] : merges)
    if (!vocab.count(a + b)) vocab[a + b] = (int64_t)vocab.size();
  vocab["<|endoftext|>"] = (int64_t)vocab.size();
  if (vocab_out) *vocab_out = vocab;
  return std::make_shared<BpeTokenizer>(vocab, merges, cfg, "test BPE");
}

const Merges kMerges = {{"h", "e"}, {"l", "l"},   {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"},
                        {"o", "r"}, {"Ġw", "or"}, {"l", "d"},   {"Ġwor", "ld"}};

std::string tmpdir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("onyx_test_bpe_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

void write(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

}  // namespace

TEST(Bpe, PreTokenizePattern) {
  auto P = BpeTokenizer::pre_tokenize;
  EXPECT_EQ(P("Hello world's  test\n\nnew"),
            (V{"Hello", " world", "'s", " ", " test", "\n", "\n", "new"}));
  EXPECT_EQ(P("abc123 45!!  ?"), (V{"abc", "123", " 45", "!!", " ", " ?"}));
  EXPECT_EQ(P("a  "), (V{"a", "  "}));
  EXPECT_EQ(P("I'm they'll we've you're 'S"),
            (V{"I", "'m", " they", "'ll", " we", "'ve", " you", "'re", " '", "S"}));
  EXPECT_EQ(P("Привет мир, 日本語です"), (V{"Привет", " мир", ",", " 日本語です"}));
  EXPECT_EQ(P("x²³ ٣٤"), (V{"x", "²³", " ٣٤"}));
  EXPECT_EQ(P("\ta\n b"), (V{"\t", "a", "\n", " b"}));
  EXPECT_EQ(P(""), V{});
  EXPECT_EQ(P("😀😀 ok"), (V{"😀😀", " ok"}));
}

TEST(Bpe, ByteToUnicode) {
  EXPECT_EQ(BpeTokenizer::byte_to_unicode('A'), U'A');
  EXPECT_EQ(BpeTokenizer::byte_to_unicode(' '), (char32_t)0x120);   // Ġ
  EXPECT_EQ(BpeTokenizer::byte_to_unicode('\n'), (char32_t)0x10A);  // Ċ
  EXPECT_EQ(BpeTokenizer::byte_to_unicode(0), (char32_t)0x100);
  EXPECT_EQ(BpeTokenizer::byte_to_unicode(0xAD), (char32_t)0x143);
  EXPECT_EQ(BpeTokenizer::byte_to_unicode(0xFF), (char32_t)0xFF);
}

TEST(Bpe, MergesByRank) {
  auto t = make(kMerges);
  EXPECT_EQ(t->tokenize("hello world"), (V{"hello", "Ġworld"}));
  EXPECT_EQ(t->tokenize("hell"), (V{"hell"}));
  EXPECT_EQ(t->tokenize("helo"), (V{"he", "l", "o"}));
  // rank decides: "l l" before "e l" -> e + ll; the other order -> el + l
  auto a = make({{"l", "l"}, {"e", "l"}});
  auto b = make({{"e", "l"}, {"l", "l"}});
  EXPECT_EQ(a->tokenize("ell"), (V{"e", "ll"}));
  EXPECT_EQ(b->tokenize("ell"), (V{"el", "l"}));
  // leftmost first on equal ranks
  EXPECT_EQ(a->tokenize("lll"), (V{"ll", "l"}));
  // non-ASCII goes through bytes: "é" is two byte tokens
  EXPECT_EQ(t->tokenize("é").size(), 2u);
  // the cache gives the same answer the second time
  EXPECT_EQ(t->encode_ids("hello hello hello"), t->encode_ids("hello hello hello"));
  // <|endoftext|> in text is its token
  EXPECT_EQ(t->tokenize("hello<|endoftext|>hello"), (V{"hello", "<|endoftext|>", "hello"}));
  EXPECT_EQ(t->eos_id(), t->token_id("<|endoftext|>"));
  EXPECT_EQ(t->pad_id(), *t->eos_id());  // GPT-2 has no pad token: eos pads
  EXPECT_FALSE(t->uses_token_type_ids());
}

TEST(Bpe, AddPrefixSpace) {
  BpeConfig cfg;
  cfg.add_prefix_space = true;
  auto t = make(kMerges, cfg);
  EXPECT_EQ(t->tokenize("world"), (V{"Ġworld"}));
  EXPECT_EQ(t->tokenize(" world"), (V{"Ġworld"}));
}

TEST(Bpe, DecodeRoundTrip) {
  auto t = make(kMerges);
  for (const std::string& s : std::vector<std::string>{"hello world", "Grüße, мир! 日本 😀\n\t x",
                                                       std::string("\0\x01\xff bytes", 9), ""})
    EXPECT_EQ(t->decode(t->encode_ids(s)), s);
  // no special tokens around a text; a pair is A then B
  auto e = t->encode_pair("hello", " world");
  EXPECT_EQ(e.input_ids.size(), 2u);
  EncodeOptions o;
  o.pad_to = 4;
  auto p = t->encode("hello", o);
  EXPECT_EQ(p.input_ids, (I{*t->token_id("hello"), t->pad_id(), t->pad_id(), t->pad_id()}));
  EXPECT_EQ(p.attention_mask, (I{1, 0, 0, 0}));
}

TEST(Bpe, LoadFilesAndTokenizerJson) {
  const std::string dir = tmpdir("load");
  std::unordered_map<std::string, int64_t> vocab;
  make(kMerges, {}, &vocab);
  nlohmann::json v(vocab);
  write(dir + "/vocab.json", v.dump());
  std::string merges = "#version: 0.2\n";
  for (auto& [a, b] : kMerges) merges += a + " " + b + "\n";
  write(dir + "/merges.txt", merges);
  auto t1 = load_tokenizer(dir);
  EXPECT_EQ(t1->kind(), "bpe");
  const I want = {*t1->token_id("hello"), *t1->token_id("Ġworld")};
  EXPECT_EQ(t1->encode_ids("hello world"), want);

  nlohmann::json jm = nlohmann::json::array();
  for (auto& [a, b] : kMerges) jm.push_back({a, b});  // the newer [a, b] form
  nlohmann::json j = {
      {"added_tokens", nlohmann::json::array({{{"id", vocab["<|endoftext|>"]},
                                               {"content", "<|endoftext|>"},
                                               {"single_word", false},
                                               {"lstrip", false},
                                               {"rstrip", false},
                                               {"normalized", false},
                                               {"special", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", v}, {"merges", jm}}}};
  write(dir + "/tokenizer.json", j.dump());
  auto t2 = load_tokenizer(dir + "/tokenizer.json");
  EXPECT_EQ(t2->encode_ids("hello world"), want);
  // a tokenizer saved after a padded call (tokenizer(texts, padding=True)) keeps its padding,
  // serialized as the string "BatchLongest" (or {"Fixed": n}); both load
  for (const nlohmann::json& strategy :
       {nlohmann::json("BatchLongest"), nlohmann::json{{"Fixed", 8}}}) {
    nlohmann::json padded = j;
    padded["padding"] = {
        {"strategy", strategy}, {"direction", "Right"}, {"pad_to_multiple_of", nullptr},
        {"pad_id", 0},          {"pad_type_id", 0},     {"pad_token", "h"}};
    write(dir + "/padded.json", padded.dump());
    EXPECT_EQ(load_tokenizer(dir + "/padded.json")->encode_ids("hello world"), want);
  }

  // RoBERTa's post-processor: <s> A </s></s> B </s>, all type 0
  j["post_processor"] = {{"type", "RobertaProcessing"}, {"cls", {"h", 104}}, {"sep", {"e", 101}}};
  write(dir + "/roberta.json", j.dump());
  auto t3 = load_tokenizer(dir + "/roberta.json");
  auto e = t3->encode_pair("hello", "hello");
  const int64_t h = *t3->token_id("hello");
  EXPECT_EQ(e.input_ids, (I{104, h, 101, 101, h, 101}));
  fs::remove_all(dir);
}

TEST(Bpe, ErrorsNameTheFile) {
  const std::string dir = tmpdir("errors");
  std::unordered_map<std::string, int64_t> vocab;
  make(kMerges, {}, &vocab);
  write(dir + "/vocab.json", nlohmann::json(vocab).dump());
  write(dir + "/merges.txt", "#version: 0.2\nh e\nthis line is bad\n");
  try {
    BpeTokenizer::from_files(dir + "/vocab.json", dir + "/merges.txt");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("merges.txt' line 3"), std::string::npos) << e.what();
  }
  write(dir + "/merges.txt", "h e\nq z\n");  // "qz" is not in the vocabulary
  try {
    BpeTokenizer::from_files(dir + "/vocab.json", dir + "/merges.txt");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("merges.txt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'qz'"), std::string::npos) << e.what();
  }
  write(
      dir + "/tokenizer.json",
      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Punctuation"}})");
  try {
    load_tokenizer(dir + "/tokenizer.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Punctuation"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("pre_tokenizer"), std::string::npos) << e.what();
  }
  write(dir + "/vocab2.json", "[1, 2]");
  EXPECT_THROW(BpeTokenizer::from_files(dir + "/vocab2.json", dir + "/merges.txt"), Error);
  fs::remove_all(dir);
}
