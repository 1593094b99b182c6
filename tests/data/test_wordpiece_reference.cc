// test_wordpiece_reference.cc — onyx's WordPiece against BERT's original Python tokenization
// (BasicTokenizer + WordpieceTokenizer over unicodedata) on WordNet glosses and lines in many
// scripts, made by tests/data/make_wordpiece_reference.py into BUILD/wordpiece-reference (or
// $ONYX_WORDPIECE_REFERENCE). Every line must give the same ids, from vocab.txt and tokenizer.json.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "data/wordpiece.h"

namespace fs = std::filesystem;
using namespace onyx::data;

namespace {

std::string reference_dir() {
  if (const char* env = std::getenv("ONYX_WORDPIECE_REFERENCE")) return env;
  return std::string(ONYX_BINARY_DIR) + "/wordpiece-reference";
}

void check_all(const Tokenizer& tok, const std::string& reference, const std::string& what) {
  std::ifstream f(reference);
  std::string s;
  int64_t n = 0, bad = 0;
  while (std::getline(f, s)) {
    auto j = nlohmann::json::parse(s);
    ++n;
    auto ids = tok.encode_ids(j["text"].get<std::string>());
    if (ids != j["ids"].get<std::vector<int64_t>>() && ++bad <= 5)
      ADD_FAILURE() << what << ": ids differ for " << j["text"].dump()
                    << "\n  onyx:   " << nlohmann::json(ids).dump()
                    << "\n  python: " << j["ids"].dump();
  }
  EXPECT_GT(n, 1000);
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << n << " lines differ";
}

}  // namespace

TEST(WordPieceReference, BertPythonIdsMatchOnAllLines) {
  const std::string dir = reference_dir();
  if (!fs::exists(dir + "/reference.jsonl"))
    GTEST_SKIP() << "no WordPiece reference in " << dir
                 << " (run python3 tests/data/make_wordpiece_reference.py " << dir << ")";
  check_all(*WordPieceTokenizer::from_vocab_txt(dir + "/vocab.txt"), dir + "/reference.jsonl",
            "vocab.txt");
  auto tj = load_tokenizer(dir + "/tokenizer.json");
  EXPECT_EQ(tj->kind(), "wordpiece");
  check_all(*tj, dir + "/reference.jsonl", "tokenizer.json");
  EXPECT_EQ(tj->encode("hello").input_ids.front(), 2);  // BertProcessing's [CLS]
}
