// test_bpe_reference.cc — onyx's byte-level BPE against GPT-2's real vocabulary as Hugging Face
// tokenizers encodes it: ids for every WordNet gloss and hand-written Unicode lines, made by
// tests/tokenizers/make_tokenizer_references.py into BUILD/bpe-reference (or $ONYX_BPE_REFERENCE).
// Every line must give the same ids, from tokenizer.json and from vocab.json + merges.txt, and
// decode back. A missing reference is a failure, not a skip.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tokenizers/bpe.h"

namespace fs = std::filesystem;
using namespace onyx::tokenizers;

namespace {

std::string reference_dir() {
  if (const char* env = std::getenv("ONYX_BPE_REFERENCE")) return env;
  return std::string(ONYX_BINARY_DIR) + "/bpe-reference";
}

struct Line {
  std::string text;
  std::vector<int64_t> ids;
};

std::vector<Line> read_reference(const std::string& path) {
  std::vector<Line> lines;
  std::ifstream f(path);
  std::string s;
  while (std::getline(f, s)) {
    if (s.empty()) continue;
    auto j = nlohmann::json::parse(s);
    lines.push_back({j["text"].get<std::string>(), j["ids"].get<std::vector<int64_t>>()});
  }
  return lines;
}

std::string show(const std::vector<int64_t>& v) {
  std::string s;
  for (auto x : v) s += (s.empty() ? "" : " ") + std::to_string(x);
  return s;
}

void check_all(const Tokenizer& tok, const std::vector<Line>& lines, const std::string& what) {
  int64_t bad = 0, bad_decode = 0, tokens = 0;
  for (auto& l : lines) {
    auto ids = tok.encode_ids(l.text);
    tokens += ids.size();
    if (ids != l.ids && ++bad <= 5)
      ADD_FAILURE() << what << ": ids differ for " << nlohmann::json(l.text).dump()
                    << "\n  onyx:            " << show(ids)
                    << "\n  HF tokenizers:   " << show(l.ids);
    const std::string back = tok.decode(l.ids);
    if (back != l.text && ++bad_decode <= 5)
      ADD_FAILURE() << what << ": HF tokenizers' ids of " << nlohmann::json(l.text).dump()
                    << " decode to " << nlohmann::json(back).dump();
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << lines.size()
                    << " lines differ from HF tokenizers";
  EXPECT_EQ(bad_decode, 0) << what << ": " << bad_decode << " of " << lines.size()
                           << " lines do not decode back";
  std::cout << "[ info ] " << what << ": " << lines.size() << " lines, " << tokens
            << " tokens checked against HF tokenizers\n";
}

}  // namespace

TEST(BpeReference, Gpt2IdsMatchHfTokenizersOnAllLines) {
  const std::string dir = reference_dir();
  if (!fs::exists(dir + "/reference.jsonl"))
    FAIL() << "no GPT-2 BPE reference in " << dir
           << "; make it with HF tokenizers: build/venv/bin/python "
              "tests/tokenizers/make_tokenizer_references.py "
           << fs::path(dir).parent_path().string();
  auto lines = read_reference(dir + "/reference.jsonl");
  ASSERT_GT(lines.size(), 100000u);

  auto from_json = BpeTokenizer::from_tokenizer_json(dir + "/tokenizer.json");
  EXPECT_EQ(from_json->vocab_size(), 50257);
  EXPECT_EQ(from_json->num_merges(), 50000);
  EXPECT_EQ(from_json->eos_id(), 50256);
  check_all(*from_json, lines, "tokenizer.json");

  auto from_files = BpeTokenizer::from_files(dir + "/vocab.json", dir + "/merges.txt");
  EXPECT_EQ(from_files->vocab_size(), 50257);
  EXPECT_EQ(from_files->num_merges(), 50000);
  check_all(*from_files, lines, "vocab.json + merges.txt");
}
