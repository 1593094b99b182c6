// test_text_datasets.cc — CSV parsing (RFC 4180 quoting), text classification rows from CSV and
// JSONL (label mapping, pairs, bucketed padding), causal-LM blocks, and SFT rows (prompt /
// completion masking).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "data/preference_dataset.h"
#include "data/text_datasets.h"
#include "onyx/error.h"
#include "tokenizers/bpe.h"
#include "tokenizers/tokenizer.h"
#include "tokenizers/wordpiece.h"

namespace fs = std::filesystem;
using namespace onyx;
using namespace onyx::data;
using namespace onyx::tokenizers;

namespace {

using I = std::vector<int64_t>;

std::shared_ptr<WordPieceTokenizer> bert() {
  return std::make_shared<WordPieceTokenizer>(
      std::vector<std::string>{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "movie",
                               "very", ",", "\"", "it", "was", "!", "fine"},
      WordPieceConfig{}, "test vocabulary");
}

std::shared_ptr<BpeTokenizer> gpt() {
  std::unordered_map<std::string, int64_t> vocab;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    unicode::append_utf8(BpeTokenizer::byte_to_unicode((uint8_t)b), s);
    vocab[s] = b;
  }
  vocab["<|endoftext|>"] = 256;
  return std::make_shared<BpeTokenizer>(vocab, std::vector<std::pair<std::string, std::string>>{},
                                        BpeConfig{}, "test BPE");
}

struct TmpDir {
  std::string path;
  explicit TmpDir(const std::string& name) {
    path = (fs::temp_directory_path() /
            ("onyx_test_textds_" + std::to_string(::getpid()) + "_" + name))
               .string();
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    std::string p = path + "/" + name;
    std::ofstream f(p, std::ios::binary);
    f << text;
    return p;
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Csv, Rfc4180Quoting) {
  auto recs = parse_csv(
      "\xEF\xBB\xBFid,text,n\n1,\"x, y\",3\n2,\"he said "
      "\"\"hi\"\"\",4\r\n3,\"multi\nline\",5\n\n4,,\"\"\n",
      ',', "t.csv");
  ASSERT_EQ(recs.size(), 5u);
  EXPECT_EQ(recs[0].fields, (std::vector<std::string>{"id", "text", "n"}));
  EXPECT_EQ(recs[1].fields, (std::vector<std::string>{"1", "x, y", "3"}));
  EXPECT_EQ(recs[2].fields, (std::vector<std::string>{"2", "he said \"hi\"", "4"}));
  EXPECT_EQ(recs[3].fields, (std::vector<std::string>{"3", "multi\nline", "5"}));
  EXPECT_EQ(recs[3].line, 4);
  EXPECT_EQ(recs[4].fields, (std::vector<std::string>{"4", "", ""}));
  EXPECT_EQ(recs[4].line, 7);
  // no final line break; tab-separated
  auto tsv = parse_csv("a\tb\n\"x\ty\"\tz", '\t', "t.tsv");
  ASSERT_EQ(tsv.size(), 2u);
  EXPECT_EQ(tsv[1].fields, (std::vector<std::string>{"x\ty", "z"}));
  // errors name the file and line
  auto e1 = error_of([] { parse_csv("a,b\n1,\"open\n2,3\n", ',', "dataset 'bad.csv'"); });
  EXPECT_NE(e1.find("bad.csv"), std::string::npos) << e1;
  EXPECT_NE(e1.find("line 2"), std::string::npos) << e1;
  EXPECT_NE(e1.find("never closed"), std::string::npos) << e1;
  auto e2 = error_of([] { parse_csv("a,b\n\"x\"y,1\n", ',', "bad2.csv"); });
  EXPECT_NE(e2.find("line 2"), std::string::npos) << e2;
}

TEST(TextClassification, CsvStringLabelsSortedUnique) {
  TmpDir d("csv");
  auto path = d.write("train.csv",
                      "text,label\n"
                      "\"good movie, very good\",pos\n"
                      "\"it was \"\"bad\"\"\",neg\n"
                      "fine,neutral\n");
  TextClassificationDataset ds(path, bert());
  ASSERT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.id2label(), (std::vector<std::string>{"neg", "neutral", "pos"}));
  EXPECT_EQ(ds.label2id().at("pos"), 2);
  EXPECT_EQ(ds.label(0), 2);
  EXPECT_EQ(ds.label(1), 0);
  EXPECT_EQ(ds.encoding(0).input_ids, (I{2, 5, 7, 9, 8, 5, 3}));
  EXPECT_EQ(ds.encoding(1).input_ids, (I{2, 11, 12, 10, 6, 10, 3}));
  auto b = ds.batch({0, 2});
  EXPECT_EQ(b.at("input_ids").shape(), (Shape{2, 16}));
  EXPECT_EQ(b.at("token_type_ids").shape(), (Shape{2, 16}));
  EXPECT_EQ(b.at("labels").to_int64_vector(), (I{2, 1}));
  auto ids = b.at("input_ids").to_int64_vector();
  auto mask = b.at("attention_mask").to_int64_vector();
  EXPECT_EQ(ids[16 + 0], 2);
  EXPECT_EQ(ids[16 + 1], 14);
  EXPECT_EQ(ids[16 + 2], 3);
  EXPECT_EQ(ids[16 + 3], 0);  // [PAD]
  EXPECT_EQ(mask[16 + 2], 1);
  EXPECT_EQ(mask[16 + 3], 0);
  EXPECT_EQ(ds.keys(),
            (std::vector<std::string>{"attention_mask", "input_ids", "labels", "token_type_ids"}));
}

TEST(TextClassification, JsonlLabelMappingAndPairs) {
  TmpDir d("jsonl");
  auto path = d.write(
      "dev.jsonl",
      "{\"premise\": \"good movie\", \"hypothesis\": \"fine\", \"gold\": \"entailment\"}\n"
      "\n"
      "{\"premise\": \"bad\", \"hypothesis\": \"very bad movie\", \"gold\": \"contradiction\"}\n");
  TextClassificationOptions o;
  o.text_field = "premise";
  o.text_pair_field = "hypothesis";
  o.label_field = "gold";
  o.label_list = {"entailment", "neutral", "contradiction"};
  TextClassificationDataset ds(path, bert(), o);
  EXPECT_EQ(ds.label(0), 0);
  EXPECT_EQ(ds.label(1), 2);
  EXPECT_EQ(ds.num_labels(), 3);
  EXPECT_EQ(ds.encoding(1).input_ids, (I{2, 6, 3, 8, 6, 7, 3}));
  EXPECT_EQ(ds.encoding(1).token_type_ids, (I{0, 0, 0, 1, 1, 1, 1}));

  // integer labels are used as they are
  auto ints = d.write("ints.jsonl",
                      "{\"text\": \"good\", \"label\": 1}\n{\"text\": \"bad\", \"label\": 0}\n");
  TextClassificationDataset di(ints, bert());
  EXPECT_EQ(di.label(0), 1);
  EXPECT_EQ(di.num_labels(), 2);

  // an unknown label names the file and line; a bad line names the file and line
  auto e1 = error_of([&] {
    auto p =
        d.write("bad.jsonl", "{\"premise\": \"a\", \"hypothesis\": \"b\", \"gold\": \"maybe\"}\n");
    TextClassificationDataset bad(p, bert(), o);
  });
  EXPECT_NE(e1.find("bad.jsonl"), std::string::npos) << e1;
  EXPECT_NE(e1.find("line 1"), std::string::npos) << e1;
  EXPECT_NE(e1.find("'maybe'"), std::string::npos) << e1;
  auto e2 = error_of([&] {
    TextClassificationDataset(d.write("x.jsonl", "{\"text\": \"a\", \"label\": 0}\n{oops\n"),
                              bert());
  });
  EXPECT_NE(e2.find("x.jsonl': line 2"), std::string::npos) << e2;
  auto e3 = error_of([&] {
    TextClassificationDataset(d.write("y.jsonl", "{\"txt\": \"a\", \"label\": 0}\n"), bert());
  });
  EXPECT_NE(e3.find("no field 'text'"), std::string::npos) << e3;
}

TEST(TextClassification, BucketsTruncationAndBpe) {
  TmpDir d("buckets");
  std::string rows = "text,label\n";
  rows += "good,1\n";                                // [CLS] good [SEP]: 3
  rows += "good good good good good good good,0\n";  // 9
  rows += std::string("\"") + [] {
    std::string s;
    for (int i = 0; i < 40; ++i) s += "good ";
    return s;
  }() + "\",1\n";  // 42 -> truncated to max_length
  auto path = d.write("b.csv", rows);
  TextClassificationOptions o;
  o.max_length = 20;
  TextClassificationDataset ds(path, bert(), o);
  EXPECT_EQ(ds.label(0), 1);  // CSV integers count as integers
  EXPECT_EQ(ds.encoding(2).size(), 20);
  EXPECT_EQ(ds.encoding(2).input_ids.back(), 3);  // [SEP] survives truncation
  EXPECT_EQ(ds.batch({0}).at("input_ids").shape(), (Shape{1, 16}));
  EXPECT_EQ(ds.batch({0, 1}).at("input_ids").shape(), (Shape{2, 16}));
  EXPECT_EQ(ds.batch({0, 2}).at("input_ids").shape(), (Shape{2, 20}));  // capped at max_length
  o.bucket = PadBucket::PowerOfTwo;
  TextClassificationDataset dp(path, bert(), o);
  EXPECT_EQ(dp.batch({0}).at("input_ids").shape(), (Shape{1, 4}));
  EXPECT_EQ(dp.batch({1}).at("input_ids").shape(), (Shape{1, 16}));

  // BPE: no token_type_ids, eos pads
  TextClassificationDataset dg(path, gpt(), o);
  EXPECT_EQ(dg.keys(), (std::vector<std::string>{"attention_mask", "input_ids", "labels"}));
  auto b = dg.batch({0});
  EXPECT_EQ(b.count("token_type_ids"), 0u);
  EXPECT_EQ(b.at("input_ids").to_int64_vector(), (I{'g', 'o', 'o', 'd'}));
  auto b2 = dg.batch({0, 1}).at("input_ids").to_int64_vector();
  EXPECT_EQ(b2.size(), 2u * 20);  // 34 bytes truncated to 20, power of two 32 capped at 20
  EXPECT_EQ(b2[4], 256);          // padding is <|endoftext|>
}

TEST(CausalLM, ConcatenateWithEosAndChunk) {
  TmpDir d("clm");
  auto path = d.write("corpus.txt", "ab\n\ncd\r\nefg\n");
  CausalLMOptions o;
  o.block_size = 4;
  CausalLMDataset ds(path, gpt(), o);
  // a b <eos> c d <eos> e f g <eos> = 10 tokens -> 2 blocks of 4 (the rest dropped)
  EXPECT_EQ(ds.tokens(), (I{'a', 'b', 256, 'c', 'd', 256, 'e', 'f', 'g', 256}));
  ASSERT_EQ(ds.size(), 2);
  auto b = ds.batch({1, 0});
  EXPECT_EQ(b.at("input_ids").shape(), (Shape{2, 4}));
  EXPECT_EQ(b.at("input_ids").to_int64_vector(), (I{'d', 256, 'e', 'f', 'a', 'b', 256, 'c'}));
  EXPECT_EQ(b.at("labels").to_int64_vector(), b.at("input_ids").to_int64_vector());
  EXPECT_EQ(b.at("attention_mask").to_int64_vector(), (I(8, 1)));

  o.drop_remainder = false;
  CausalLMDataset dk(path, gpt(), o);
  ASSERT_EQ(dk.size(), 3);
  auto last = dk.batch({2});
  EXPECT_EQ(last.at("input_ids").to_int64_vector(), (I{'g', 256, 256, 256}));
  EXPECT_EQ(last.at("labels").to_int64_vector(), (I{'g', 256, -100, -100}));
  EXPECT_EQ(last.at("attention_mask").to_int64_vector(), (I{1, 1, 0, 0}));

  o.paragraphs = true;
  o.drop_remainder = true;
  CausalLMDataset dp(path, gpt(), o);
  EXPECT_EQ(dp.tokens(), (I{'a', 'b', 256, 'c', 'd', '\n', 'e', 'f', 'g', 256}));

  o.block_size = 100;
  auto e = error_of([&] { CausalLMDataset too_short(path, gpt(), o); });
  EXPECT_NE(e.find("corpus.txt"), std::string::npos) << e;
  EXPECT_NE(e.find("fewer than one block"), std::string::npos) << e;
}

// run_clm.py's tokenizer(text) applies the tokenizer.json post-processor: with Llama 2's
// "<s> $A" template every document starts with <s> (then onyx's eos ends it).
TEST(CausalLM, DocumentsGetThePostProcessorsBos) {
  TmpDir d("clm_bos");
  auto added = [](const char* content, int id) {
    return nlohmann::json{{"id", id},        {"content", content}, {"single_word", false},
                          {"lstrip", false}, {"rstrip", false},    {"normalized", false},
                          {"special", true}};
  };
  nlohmann::json j = {
      {"version", "1.0"},
      {"added_tokens", nlohmann::json::array({added("<s>", 2), added("</s>", 3)})},
      {"model",
       {{"type", "BPE"},
        {"vocab", {{"a", 0}, {"b", 1}, {"<s>", 2}, {"</s>", 3}}},
        {"merges", nlohmann::json::array()}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", nlohmann::json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", nlohmann::json::array({{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                        {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {2}}, {"tokens", {"<s>"}}}}}}}}};
  auto tok = tokenizer_from_json_text(j.dump(), "llama-style.json");
  CausalLMOptions o;
  o.block_size = 2;
  CausalLMDataset ds(d.write("corpus.txt", "ab\nb\n"), tok, o);
  EXPECT_EQ(ds.tokens(), (I{2, 0, 1, 3, 2, 1, 3}));
}

TEST(Sft, PromptCompletionMasksThePromptAndPads) {
  TmpDir d("sft");
  auto path = d.write("sft.jsonl",
                      "{\"prompt\": \"ab\", \"completion\": \"cd\"}\n"
                      "{\"text\": \"xyz\"}\n"
                      "\n"
                      "{\"prompt\": \"p\", \"completion\": \"qrstuvw\"}\n");
  SftOptions o;
  o.pad_multiple = 4;
  o.max_length = 6;
  SftDataset ds(path, gpt(), o);
  ASSERT_EQ(ds.size(), 3);
  // prompt + completion + <eos>; only the completion (and the eos) carry loss
  EXPECT_EQ(ds.ids(0), (I{'a', 'b', 'c', 'd', 256}));
  EXPECT_EQ(ds.labels(0), (I{-100, -100, 'c', 'd', 256}));
  EXPECT_EQ(ds.labels(1), (I{'x', 'y', 'z', 256}));         // text: every token
  EXPECT_EQ(ds.ids(2), (I{'p', 'q', 'r', 's', 't', 'u'}));  // truncated at max_length
  auto b = ds.batch({1, 0});  // longest 5 -> rounded up to 8, capped at max_length 6
  EXPECT_EQ(b.at("input_ids").shape(), (Shape{2, 6}));
  EXPECT_EQ(b.at("input_ids").to_int64_vector(),
            (I{'x', 'y', 'z', 256, 256, 256, 'a', 'b', 'c', 'd', 256, 256}));
  EXPECT_EQ(b.at("labels").to_int64_vector(),
            (I{'x', 'y', 'z', 256, -100, -100, -100, -100, 'c', 'd', 256, -100}));
  EXPECT_EQ(b.at("attention_mask").to_int64_vector(), (I{1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0}));

  o.completion_only_loss = false;
  SftDataset all(path, gpt(), o);
  EXPECT_EQ(all.labels(0), all.ids(0));

  auto bad = d.write("bad.jsonl", "{\"messages\": []}\n");
  auto e = error_of([&] { SftDataset x(bad, gpt(), o); });
  EXPECT_NE(e.find("line 1"), std::string::npos) << e;
  EXPECT_NE(e.find("chat template"), std::string::npos) << e;
  auto none = d.write("none.jsonl", "{\"prompt\": \"a\"}\n");
  e = error_of([&] { SftDataset x(none, gpt(), o); });
  EXPECT_NE(e.find("neither 'text' nor 'prompt' and 'completion'"), std::string::npos) << e;
}

// Preference pairs (TRL's DPO rows): the batch layout (chosen rows first, labels on the
// completion), reference values riding along once set, and bad rows named by line.
TEST(Preference, PairsBatchChosenFirstAndBadRowsAreNamed) {
  TmpDir d("pref");
  auto path = d.write("p.jsonl",
                      "{\"prompt\": \"ab\", \"chosen\": \"c\", \"rejected\": \"de\"}\n"
                      "{\"chosen\": \"xy1\", \"rejected\": \"xy22\"}\n");
  PreferenceOptions o;
  o.max_length = 5;
  PreferenceDataset ds(path, gpt(), o);
  ASSERT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.prompt_ids(0), (I{'a', 'b'}));
  EXPECT_EQ(ds.chosen_ids(0), (I{'c', 256}));  // the eos appended
  EXPECT_EQ(ds.prompt_ids(1), (I{'x', 'y'}));  // extracted: the shared prefix
  EXPECT_EQ(ds.rejected_ids(1), (I{'2', '2', 256}));
  auto b = ds.batch({0, 1});
  EXPECT_EQ(b.at("input_ids").shape(), (Shape{4, 5}));  // x y 2 2 <eos> cut to 5
  EXPECT_EQ(b.at("labels").to_int64_vector(),
            (I{-100, -100, 'c', 256, -100, -100, -100, '1', 256, -100,    // chosen rows
               -100, -100, 'd', 'e', 256,  -100, -100, '2', '2', 256}));  // rejected rows
  EXPECT_EQ(b.count("ref_chosen_logps"), 0u);
  EXPECT_EQ(ds.lengths(""), (I{5, 5}));  // the longer sequence of each pair, cut to max_length
  ds.set_reference_logps({-1.f, -2.f}, {-3.f, -4.f});
  b = ds.batch({1});
  EXPECT_EQ(b.at("ref_rejected_logps").to_double_vector(), (std::vector<double>{-4.0}));
  auto e = error_of([&] { ds.set_reference_logps({1.f}, {2.f}); });
  EXPECT_NE(e.find("for 2 pairs"), std::string::npos) << e;

  for (auto [text, want] : std::vector<std::pair<std::string, std::string>>{
           {"{\"prompt\": \"a\", \"chosen\": \"b\"}", "'rejected' is missing"},
           {"{\"prompt\": \"a\", \"chosen\": 3, \"rejected\": \"b\"}", "'chosen' must be a string"},
           {"{\"chosen\": \"\", \"rejected\": \"b\"}", "non-empty 'chosen' and 'rejected'"},
           {"{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": "
            "[{\"role\": \"assistant\", \"content\": \"a\"}], \"rejected\": []}",
            "need a chat template"}}) {
    auto bad = d.write("bad.jsonl", "\n" + text + "\n");
    e = error_of([&] { PreferenceDataset x(bad, gpt(), o); });
    EXPECT_NE(e.find("line 2"), std::string::npos) << text << ": " << e;
    EXPECT_NE(e.find(want), std::string::npos) << text << ": " << e;
  }
  o.truncation_mode = "keep_middle";
  e = error_of([&] { PreferenceDataset x(path, gpt(), o); });
  EXPECT_NE(e.find("keep_middle"), std::string::npos) << e;
}

TEST(Sft, PackingRestartsPositionsAndMasksTheFirstToken) {
  TmpDir d("sftpack");
  auto path = d.write("sft.jsonl",
                      "{\"prompt\": \"ab\", \"completion\": \"c\"}\n"  // a b c <eos>: 4 tokens
                      "{\"text\": \"xy\"}\n"                           // x y <eos>: 3
                      "{\"text\": \"pqrs\"}\n");                       // p q r s <eos>: 5
  SftOptions o;
  o.max_length = 8;
  o.pad_multiple = 4;
  o.packing = true;
  SftDataset ds(path, gpt(), o);
  ASSERT_EQ(ds.size(), 2);  // [abc<eos> xy<eos>] [pqrs<eos>]
  EXPECT_EQ(ds.ids(0), (I{'a', 'b', 'c', 256, 'x', 'y', 256}));
  EXPECT_EQ(ds.labels(0), (I{-100, -100, 'c', 256, -100, 'y', 256}));
  EXPECT_EQ(ds.positions(0), (I{0, 1, 2, 3, 0, 1, 2}));
  auto b = ds.batch({0, 1});
  EXPECT_EQ(b.at("position_ids").shape(), (Shape{2, 8}));
  EXPECT_EQ(b.at("position_ids").to_int64_vector(),
            (I{0, 1, 2, 3, 0, 1, 2, 0, 0, 1, 2, 3, 4, 0, 0, 0}));
  EXPECT_EQ(b.at("attention_mask").to_int64_vector(),
            (I{1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0}));
}
