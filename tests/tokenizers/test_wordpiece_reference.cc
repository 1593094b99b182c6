// test_wordpiece_reference.cc — onyx's WordPiece against Hugging Face tokenizers with a real BERT
// vocabulary (all-MiniLM-L6-v2's uncased vocab.txt and tokenizer.json) on every WordNet gloss and
// lines in many scripts, made by tests/tokenizers/make_tokenizer_references.py into
// BUILD/wordpiece-reference (or $ONYX_WORDPIECE_REFERENCE). The reference has no special tokens
// around a line (add_special_tokens=False); special tokens written in a line ("[MASK]") are matched
// as HF tokenizers does. Every line must give the same ids, from vocab.txt and tokenizer.json. A
// missing reference is a failure, not a skip.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tokenizers/tokenizer.h"
#include "tokenizers/wordpiece.h"

namespace fs = std::filesystem;
using namespace onyx::tokenizers;

namespace {

std::string reference_dir() {
  if (const char* env = std::getenv("ONYX_WORDPIECE_REFERENCE")) return env;
  return std::string(ONYX_BINARY_DIR) + "/wordpiece-reference";
}

void check_all(const Tokenizer& tok, const std::string& reference, const std::string& what) {
  std::ifstream f(reference);
  std::string s;
  int64_t n = 0, bad = 0, tokens = 0;
  while (std::getline(f, s)) {
    if (s.empty()) continue;
    auto j = nlohmann::json::parse(s);
    ++n;
    auto ids = tok.encode_ids(j["text"].get<std::string>());
    tokens += ids.size();
    if (ids != j["ids"].get<std::vector<int64_t>>() && ++bad <= 5)
      ADD_FAILURE() << what << ": ids differ for " << j["text"].dump()
                    << "\n  onyx:          " << nlohmann::json(ids).dump()
                    << "\n  HF tokenizers: " << j["ids"].dump();
  }
  EXPECT_GT(n, 100000);
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << n << " lines differ from HF tokenizers";
  std::cout << "[ info ] " << what << ": " << n << " lines, " << tokens
            << " tokens checked against HF tokenizers\n";
}

}  // namespace

TEST(WordPieceReference, MiniLmIdsMatchHfTokenizersOnAllLines) {
  const std::string dir = reference_dir();
  if (!fs::exists(dir + "/reference.jsonl"))
    FAIL() << "no WordPiece reference in " << dir
           << "; make it with HF tokenizers: build/venv/bin/python "
              "tests/tokenizers/make_tokenizer_references.py "
           << fs::path(dir).parent_path().string();
  auto vt = WordPieceTokenizer::from_vocab_txt(dir + "/vocab.txt");
  EXPECT_EQ(vt->vocab_size(), 30522);
  check_all(*vt, dir + "/reference.jsonl", "vocab.txt");
  auto tj = load_tokenizer(dir + "/tokenizer.json");
  EXPECT_EQ(tj->kind(), "wordpiece");
  EXPECT_EQ(tj->vocab_size(), 30522);
  check_all(*tj, dir + "/reference.jsonl", "tokenizer.json");
  // The template adds [CLS] (101) ... [SEP] (102), as HF tokenizers' TemplateProcessing.
  auto e = tj->encode("hello");
  ASSERT_EQ(e.input_ids.size(), 3u);
  EXPECT_EQ(e.input_ids.front(), 101);
  EXPECT_EQ(e.input_ids.back(), 102);
}
