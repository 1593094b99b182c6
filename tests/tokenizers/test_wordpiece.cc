// test_wordpiece.cc — BERT WordPiece on a hand-made vocabulary: normalization (lower case, accents,
// controls, CJK), punctuation splitting, ## subwords, unknown words, added tokens in text, pairs
// with longest_first truncation and padding, and loading from vocab.txt / tokenizer.json / a
// folder.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "onyx/error.h"
#include "tokenizers/tokenizer.h"
#include "tokenizers/wordpiece.h"

namespace fs = std::filesystem;
using namespace onyx;
using namespace onyx::tokenizers;

namespace {

const std::vector<std::string> kVocab = {
    "[PAD]", "[UNK]", "[CLS]",  "[SEP]", "[MASK]", "the",  "quick", "brown", "fox",
    "un",    "##aff", "##able", ",",     ".",      "!",    "cafe",  "naive", "resume",
    "北",    "京",    "hello",  "world", "jump",   "##ed", "over",  "a",     "##b",
    "café",  "αβγ",   "еж",     "?",     "$",      "ᄒ",   "##ᅡ",  "##ᆫ",
};

std::shared_ptr<WordPieceTokenizer> make(WordPieceConfig cfg = {}) {
  return std::make_shared<WordPieceTokenizer>(kVocab, cfg, "test vocabulary");
}

std::string tmpdir(const std::string& name) {
  auto d = fs::temp_directory_path() /
           ("onyx_test_wordpiece_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

void write(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

using V = std::vector<std::string>;
using I = std::vector<int64_t>;

}  // namespace

TEST(WordPiece, LowercasePunctuationSubwords) {
  auto t = make();
  EXPECT_EQ(t->tokenize("The Quick, brown FOX!"), (V{"the", "quick", ",", "brown", "fox", "!"}));
  EXPECT_EQ(t->tokenize("unaffable jumped"), (V{"un", "##aff", "##able", "jump", "##ed"}));
  EXPECT_EQ(t->tokenize("ab"), (V{"a", "##b"}));
  // punctuation splits words, even ASCII symbols that are not Unicode punctuation ($)
  EXPECT_EQ(t->tokenize("fox?the$fox"), (V{"fox", "?", "the", "$", "fox"}));
}

TEST(WordPiece, UnknownWords) {
  auto t = make();
  EXPECT_EQ(t->tokenize("xyzzy fox"), (V{"[UNK]", "fox"}));
  // a word whose tail has no piece is [UNK] as a whole
  EXPECT_EQ(t->tokenize("unaffablex"), (V{"[UNK]"}));
  WordPieceConfig cfg;
  cfg.max_input_chars_per_word = 5;
  EXPECT_EQ(make(cfg)->tokenize("unaffable fox"), (V{"[UNK]", "fox"}));
}

TEST(WordPiece, AccentsAndOtherScripts) {
  auto t = make();
  EXPECT_EQ(t->tokenize("Café NAÏVE Résumé"), (V{"cafe", "naive", "resume"}));
  EXPECT_EQ(unicode::encode_utf8(t->normalize("ΆΒΓ Ёж ÅÇÑØ łŁ")), "αβγ еж acnø łł");
  EXPECT_EQ(t->tokenize("ΆΒΓ Ёж"), (V{"αβγ", "еж"}));
  // Hangul syllables decompose into jamo when accents are stripped (as NFD does)
  EXPECT_EQ(t->tokenize("한"), (V{"ᄒ", "##ᅡ", "##ᆫ"}));
  // lower case without accent stripping keeps the accent
  WordPieceConfig cfg;
  cfg.strip_accents = false;
  EXPECT_EQ(make(cfg)->tokenize("CAFÉ"), (V{"café"}));
  // cased: nothing changes case
  cfg.lowercase = false;
  EXPECT_EQ(make(cfg)->tokenize("The fox"), (V{"[UNK]", "fox"}));
}

TEST(WordPiece, CleanTextAndChineseChars) {
  auto t = make();
  EXPECT_EQ(t->tokenize("the\x01 fox\tover\u00a0a"), (V{"the", "fox", "over", "a"}));
  EXPECT_EQ(t->tokenize("北京fox"), (V{"北", "京", "fox"}));
  EXPECT_EQ(t->tokenize(""), V{});
  EXPECT_EQ(t->tokenize(" \n\t "), V{});
}

TEST(WordPiece, SpecialTokensInText) {
  auto t = make();
  EXPECT_EQ(t->encode_ids("the [MASK] fox"), (I{5, 4, 8}));
  EXPECT_EQ(t->encode_ids("the [mask] fox"),
            (I{5, 1, 1, 1, 8}));  // case matters; [ ] are punctuation
}

TEST(WordPiece, SingleAndPairTemplate) {
  auto t = make();
  auto e = t->encode("the fox");
  EXPECT_EQ(e.input_ids, (I{2, 5, 8, 3}));
  EXPECT_EQ(e.token_type_ids, (I{0, 0, 0, 0}));
  EXPECT_EQ(e.attention_mask, (I{1, 1, 1, 1}));
  e = t->encode_pair("the fox", "hello world");
  EXPECT_EQ(e.input_ids, (I{2, 5, 8, 3, 20, 21, 3}));
  EXPECT_EQ(e.token_type_ids, (I{0, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(t->num_special_tokens(false), 2);
  EXPECT_EQ(t->num_special_tokens(true), 3);
  EncodeOptions no_special;
  no_special.add_special_tokens = false;
  EXPECT_EQ(t->encode("the fox", no_special).input_ids, (I{5, 8}));
}

TEST(WordPiece, TruncationLongestFirstAndPadding) {
  auto t = make();
  EncodeOptions o;
  o.max_length = 4;
  EXPECT_EQ(t->encode("the quick brown fox", o).input_ids, (I{2, 5, 6, 3}));
  // pair 4 + 2 tokens, budget 7 - 3 = 4: only the longer shrinks, to 4 - 2
  o.max_length = 7;
  o.pad_to = 10;
  auto e = t->encode_pair("the quick brown fox", "hello world", o);
  EXPECT_EQ(e.input_ids, (I{2, 5, 6, 3, 20, 21, 3, 0, 0, 0}));
  EXPECT_EQ(e.token_type_ids, (I{0, 0, 0, 0, 1, 1, 1, 0, 0, 0}));
  EXPECT_EQ(e.attention_mask, (I{1, 1, 1, 1, 1, 1, 1, 0, 0, 0}));
  // budget 3: both must shrink; the shorter side gets floor(3/2) = 1, the longer the other 2
  o.max_length = 6;
  o.pad_to = 0;
  EXPECT_EQ(t->encode_pair("the quick brown fox", "hello world", o).input_ids,
            (I{2, 5, 6, 3, 20, 3}));
  // equal lengths 4 + 4, budget 5: first floor(5/2) = 2, second 3
  o.max_length = 8;
  EXPECT_EQ(t->encode_pair("the quick brown fox", "hello world over a", o).input_ids,
            (I{2, 5, 6, 3, 20, 21, 24, 3}));
  // padding shorter than the encoding is an error
  o.max_length = 0;
  o.pad_to = 3;
  EXPECT_THROW(t->encode("the quick brown fox", o), Error);
}

TEST(WordPiece, LoadFromFiles) {
  const std::string dir = tmpdir("load");
  std::string vocab_txt;
  for (auto& v : kVocab) vocab_txt += v + "\n";
  write(dir + "/vocab.txt", vocab_txt);
  auto t1 = WordPieceTokenizer::from_vocab_txt(dir + "/vocab.txt");
  EXPECT_EQ(t1->vocab_size(), (int64_t)kVocab.size());
  EXPECT_EQ(t1->encode_pair("Café fox", "北京").input_ids, (I{2, 15, 8, 3, 18, 19, 3}));

  // tokenizer_config.json's do_lower_case false makes a folder's vocab.txt cased
  write(dir + "/tokenizer_config.json", R"({"do_lower_case": false})");
  auto t2 = load_tokenizer(dir);
  EXPECT_EQ(t2->kind(), "wordpiece");
  EXPECT_EQ(t2->encode_ids("The fox"), (I{1, 8}));

  // tokenizer.json (preferred in a folder)
  nlohmann::json vocab = nlohmann::json::object();
  for (size_t i = 0; i < kVocab.size(); ++i) vocab[kVocab[i]] = i;
  nlohmann::json j = {
      {"version", "1.0"},
      {"added_tokens", nlohmann::json::array({{{"id", 4},
                                               {"content", "[MASK]"},
                                               {"single_word", false},
                                               {"lstrip", false},
                                               {"rstrip", false},
                                               {"normalized", false},
                                               {"special", true}}})},
      {"normalizer",
       {{"type", "BertNormalizer"},
        {"clean_text", true},
        {"handle_chinese_chars", true},
        {"strip_accents", nullptr},
        {"lowercase", true}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         nlohmann::json::parse(
             R"([{"SpecialToken":{"id":"[CLS]","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"[SEP]","type_id":0}}])")},
        {"pair",
         nlohmann::json::parse(
             R"([{"SpecialToken":{"id":"[CLS]","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"[SEP]","type_id":0}},{"Sequence":{"id":"B","type_id":1}},{"SpecialToken":{"id":"[SEP]","type_id":1}}])")},
        {"special_tokens",
         nlohmann::json::parse(
             R"({"[CLS]":{"id":"[CLS]","ids":[2],"tokens":["[CLS]"]},"[SEP]":{"id":"[SEP]","ids":[3],"tokens":["[SEP]"]}})")}}},
      {"model",
       {{"type", "WordPiece"},
        {"unk_token", "[UNK]"},
        {"continuing_subword_prefix", "##"},
        {"max_input_chars_per_word", 100},
        {"vocab", vocab}}}};
  write(dir + "/tokenizer.json", j.dump());
  auto t3 = load_tokenizer(dir);
  EXPECT_EQ(t3->kind(), "wordpiece");
  auto e = t3->encode_pair("Café [MASK] unaffable", "北京");
  EXPECT_EQ(e.input_ids, (I{2, 15, 4, 9, 10, 11, 3, 18, 19, 3}));
  EXPECT_EQ(e.token_type_ids, (I{0, 0, 0, 0, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(t3->decode(t3->encode_ids("unaffable fox")), "unaffable fox");
  fs::remove_all(dir);
}

TEST(WordPiece, ErrorsNameTheFile) {
  const std::string dir = tmpdir("errors");
  write(dir + "/vocab.txt", "the\nfox\n");
  try {
    WordPieceTokenizer::from_vocab_txt(dir + "/vocab.txt");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/vocab.txt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[UNK]"), std::string::npos) << e.what();
  }
  write(dir + "/tokenizer.json", R"({"model": {"type": "Unigram", "vocab": []}})");
  try {
    load_tokenizer(dir + "/tokenizer.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Unigram"), std::string::npos) << e.what();
  }
  write(dir + "/broken.json", "{\"model\": ");
  EXPECT_THROW(load_tokenizer(dir + "/broken.json"), Error);
  EXPECT_THROW(load_tokenizer(dir + "/missing.txt"), Error);
  fs::remove_all(dir);
}

TEST(Unicode, ClassesAndUtf8) {
  using namespace unicode;
  EXPECT_TRUE(is_letter(U'a'));
  EXPECT_TRUE(is_letter(U'é'));
  EXPECT_TRUE(is_letter(U'Ж'));
  EXPECT_TRUE(is_letter(U'λ'));
  EXPECT_TRUE(is_letter(U'中'));
  EXPECT_TRUE(is_letter(U'の'));
  EXPECT_TRUE(is_letter(U'한'));
  EXPECT_FALSE(is_letter(U'1'));
  EXPECT_TRUE(is_number(U'7'));
  EXPECT_TRUE(is_number(U'٣'));
  EXPECT_TRUE(is_number(U'⅔'));
  EXPECT_TRUE(is_number(U'²'));
  EXPECT_FALSE(is_number(U'x'));
  EXPECT_EQ(char_class(U'。'), CharClass::Punctuation);
  EXPECT_EQ(char_class(0x301), CharClass::MarkNonspacing);
  EXPECT_EQ(char_class(0x1F600), CharClass::Symbol);
  EXPECT_TRUE(is_white_space(0x3000));
  EXPECT_FALSE(is_white_space(U'x'));
  // UTF-8 round trip, and invalid bytes become U+FFFD one byte at a time
  std::string s = "aé中😀";
  std::vector<uint8_t> len;
  auto u = decode_utf8(s, &len);
  EXPECT_EQ(u, U"aé中😀");
  EXPECT_EQ(len, (std::vector<uint8_t>{1, 2, 3, 4}));
  EXPECT_EQ(encode_utf8(u), s);
  EXPECT_EQ(decode_utf8("a\xff\xc3"), (std::u32string{U'a', 0xFFFD, 0xFFFD}));
  EXPECT_EQ(decode_utf8("\xed\xa0\x80"), (std::u32string{0xFFFD, 0xFFFD, 0xFFFD}));  // surrogate
}
