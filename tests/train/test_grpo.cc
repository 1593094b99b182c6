// test_grpo.cc — GRPO's pieces without a model (train/grpo.h, data/prompt_dataset.h): the group
// advantages and reward metrics against values worked out by hand as TRL 1.16 computes them, the
// CLI's built-in reward functions (a pattern that backtracks without end stops with a message),
// the prompt rows, and a generation batch's padding and its rows per process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "onyx/error.h"
#include "tokenizers/bpe.h"
#include "tokenizers/tokenizer.h"
#include "train/grpo.h"

namespace fs = std::filesystem;
using namespace onyx;
using namespace onyx::train;

namespace {

const double kNaN = std::nan("");

std::shared_ptr<tokenizers::BpeTokenizer> bytes_tokenizer() {
  std::unordered_map<std::string, int64_t> vocab;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    tokenizers::unicode::append_utf8(tokenizers::BpeTokenizer::byte_to_unicode((uint8_t)b), s);
    vocab[s] = b;
  }
  vocab["<|endoftext|>"] = 256;
  return std::make_shared<tokenizers::BpeTokenizer>(
      vocab, std::vector<std::pair<std::string, std::string>>{}, tokenizers::BpeConfig{},
      "test BPE");
}

std::string write_rows(const std::string& name, const std::string& text) {
  std::string p = (fs::temp_directory_path() /
                   ("onyx_test_grpo_" + std::to_string(::getpid()) + "_" + name + ".jsonl"))
                      .string();
  std::ofstream(p) << text;
  return p;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

GrpoOptions options(int64_t generations) {
  GrpoOptions o;
  o.num_generations = generations;
  return o;
}

}  // namespace

TEST(Grpo, GroupAdvantagesAreNormalizedPerGroup) {
  // two groups of 3, one reward function: group means 2 and 5, unbiased stds 1 and 0
  GrpoOptions o = options(3);
  auto a = group_advantages({{1}, {2}, {3}, {5}, {5}, {5}}, {"f"}, o);
  ASSERT_EQ(a.advantage.size(), 6u);
  EXPECT_NEAR(a.advantage[0], -1.0 / (1.0 + 1e-4), 1e-12);
  EXPECT_NEAR(a.advantage[2], 1.0 / (1.0 + 1e-4), 1e-12);
  EXPECT_EQ(a.advantage[4], 0.0);
  EXPECT_NEAR(a.metrics.at("frac_reward_zero_std"), 0.5, 1e-12);
  EXPECT_NEAR(a.metrics.at("reward"), 3.5, 1e-12);
  EXPECT_NEAR(a.metrics.at("rewards/f/mean"), 3.5, 1e-12);
  // std of {1,2,3,5,5,5}: mean 3.5, squares 6.25+2.25+.25+3*2.25 = 15.5, /5
  EXPECT_NEAR(a.metrics.at("reward_std"), std::sqrt(15.5 / 5.0), 1e-12);
  o.scale_rewards = "none";
  EXPECT_NEAR(group_advantages({{1}, {2}, {3}, {5}, {5}, {5}}, {"f"}, o).advantage[0], -1.0, 1e-12);
  o.scale_rewards = "batch";
  EXPECT_NEAR(group_advantages({{1}, {2}, {3}, {5}, {5}, {5}}, {"f"}, o).advantage[0],
              -1.0 / (std::sqrt(15.5 / 5.0) + 1e-4), 1e-12);
}

TEST(Grpo, UnscoredRowsAndWeightsFollowTrl) {
  // weights 1 and 2; row 1 unscored by every function (NaN): left out of its group's mean and
  // std, its advantage 0; row 2 scored by the second function only (nansum)
  GrpoOptions o = options(3);
  o.reward_weights = {1.0, 2.0};
  auto a = group_advantages({{1, 1}, {kNaN, kNaN}, {kNaN, 2}}, {"a", "b"}, o);
  // totals 3, NaN, 4: mean 3.5, std sqrt(0.5)
  const double sd = std::sqrt(0.5);
  EXPECT_NEAR(a.advantage[0], -0.5 / (sd + 1e-4), 1e-12);
  EXPECT_EQ(a.advantage[1], 0.0);
  EXPECT_NEAR(a.advantage[2], 0.5 / (sd + 1e-4), 1e-12);
  EXPECT_NEAR(a.metrics.at("rewards/a/mean"), 1.0, 1e-12);
  EXPECT_TRUE(std::isnan(a.metrics.at("rewards/a/std")));  // one value: nanstd is NaN
  EXPECT_NEAR(a.metrics.at("reward"), 3.5, 1e-12);
  o.reward_weights = {1.0};
  auto e = error_of([&] { group_advantages({{1, 1}, {1, 1}, {1, 1}}, {"a", "b"}, o); });
  EXPECT_NE(e.find("1 weights for 2 reward functions"), std::string::npos) << e;
}

TEST(Grpo, NormalizeThenSum) {
  // each function normalized in its group, weighted and summed, then over the batch
  GrpoOptions o = options(2);
  o.multi_objective_aggregation = "normalize_then_sum";
  auto a = group_advantages({{0, 10}, {2, 10}}, {"a", "b"}, o);
  // a: mean 1, std sqrt(2): -1/(sqrt2+1e-4), +1/(...); b: 0 for both. Then the batch: mean 0,
  // std = sqrt(2) * v where v = 1/(sqrt2 + 1e-4)
  const double v = 1.0 / (std::sqrt(2.0) + 1e-4), sd = std::sqrt(2.0) * v;
  EXPECT_NEAR(a.advantage[0], -v / (sd + 1e-4), 1e-12);
  EXPECT_NEAR(a.advantage[1], v / (sd + 1e-4), 1e-12);
}

TEST(Grpo, BuiltinRewards) {
  auto tok = bytes_tokenizer();
  auto path = write_rows("rewards",
                         "{\"prompt\": \"2+2=\", \"answer\": 4}\n"
                         "{\"prompt\": \"say hi\", \"answer\": \"hi\"}\n");
  auto prompts = std::make_shared<data::PromptDataset>(path, tok);
  ASSERT_EQ(prompts->size(), 2);
  EXPECT_EQ(prompts->prompt_ids(0), (std::vector<int64_t>{'2', '+', '2', '='}));
  RewardBatch b;
  b.prompts = prompts.get();
  b.prompt_rows = {0, 0, 1};
  b.completions = {" 4\n", "5", "hi there"};
  b.completion_ids = {{' ', '4', '\n'}, {'5'}, {'h', 'i', ' ', 't', 'h', 'e', 'r', 'e'}};
  auto exact = builtin_reward({{"type", "exact_match"}, {"column", "answer"}}, "test");
  EXPECT_EQ(exact->score(b), (std::vector<double>{1, 0, 0}));
  auto regex = builtin_reward({{"type", "regex"}, {"pattern", "h.*e"}, {"name", "fmt"}}, "test");
  EXPECT_EQ(regex->name(), "fmt");
  EXPECT_EQ(regex->score(b), (std::vector<double>{0, 0, 1}));  // from the start, as re.match
  auto length = builtin_reward({{"type", "length"}, {"target", 2}}, "test");
  EXPECT_EQ(length->score(b), (std::vector<double>{-0.5, -0.5, -3.0}));
  auto e = error_of([&] { builtin_reward({{"type", "regex"}, {"pattern", "(a"}}, "cfg"); });
  EXPECT_NE(e.find("invalid pattern '(a'"), std::string::npos) << e;
  e = error_of([&] { builtin_reward({{"type", "exact_match"}, {"col", "a"}}, "cfg"); });
  EXPECT_NE(e.find("has no key 'col'"), std::string::npos) << e;
  e = error_of([&] { builtin_reward({{"type", "bleu"}}, "cfg"); });
  EXPECT_NE(e.find("unknown reward type 'bleu'"), std::string::npos) << e;
  // exponential backtracking stops at the match engine's time limit, with a message
  auto slow = builtin_reward({{"type", "regex"}, {"pattern", "(a+)+b"}}, "test");
  b.prompt_rows = {0};
  b.completions = {std::string(40, 'a')};
  b.completion_ids = {std::vector<int64_t>(40, 'a')};
  e = error_of([&] { slow->score(b); });
  EXPECT_NE(e.find("did not finish matching"), std::string::npos) << e;
  path = write_rows("noprompt", "{\"question\": \"x\"}\n");
  e = error_of([&] { data::PromptDataset(path, tok); });
  EXPECT_NE(e.find("line 1: a GRPO row needs a 'prompt'"), std::string::npos) << e;
}

TEST(Grpo, GenerationBatchRowsAndPadding) {
  auto path =
      write_rows("batch", "{\"prompt\": \"ab\"}\n{\"prompt\": \"c\"}\n{\"prompt\": \"d\"}\n");
  auto prompts = std::make_shared<data::PromptDataset>(path, bytes_tokenizer());
  GrpoOptions o = options(2);
  o.reward_specs = {{{"type", "length"}, {"target", 1}}};
  o.shuffle_dataset = false;
  GrpoRollouts r(prompts, o);
  // 2 processes × 2 micro-batches of 1: a generation batch of 4 rows (2 prompts); rank 1 trains
  // slots 1 and 3
  r.plan(1, 2, 2, 1);
  EXPECT_EQ(r.size(), 4);  // one whole generation batch per epoch (3 prompts, 2 per batch)
  EXPECT_EQ(r.chunk_prompts(0, 0, 0), (std::vector<int64_t>{0, 0, 1, 1}));
  EXPECT_EQ(r.my_rows(), (std::vector<int64_t>{1, 3}));
  std::vector<Completion> rows = {{0, {'a', 'b'}, {'x'}, true}, {1, {'c'}, {'y', 'z'}, false}};
  r.set_buffer(rows, {0.5, -0.5}, 256, 0);
  auto b = r.batch({3});  // slot 3: this rank's second row
  EXPECT_EQ(b.at("input_ids").to_int64_vector(), (std::vector<int64_t>{256, 'c', 'y', 'z'}));
  EXPECT_EQ(b.at("attention_mask").to_int64_vector(), (std::vector<int64_t>{0, 1, 1, 1}));
  EXPECT_EQ(b.at("labels").to_int64_vector(), (std::vector<int64_t>{-100, -100, 'y', 'z'}));
  EXPECT_EQ(b.at("advantages").to_double_vector(), (std::vector<double>{-0.5}));
  b = r.batch({1});
  EXPECT_EQ(b.at("input_ids").to_int64_vector(), (std::vector<int64_t>{'a', 'b', 'x', 256}));
  auto e = error_of([&] { r.batch({0}); });
  EXPECT_NE(e.find("another process's micro-batch"), std::string::npos) << e;
  e = error_of([&] { r.plan(1, 3, 1, 0); });
  EXPECT_NE(e.find("multiple of num_generations 2"), std::string::npos) << e;
  e = error_of([&] { r.plan(4, 2, 1, 0); });  // 8 rows: 4 prompts, the dataset has 3
  EXPECT_NE(e.find("has 3 prompts"), std::string::npos) << e;
}
