// train/regex_reward.cc — GRPO's `regex` reward (see grpo.h) on ICU's matcher (already onyx's for
// tokenizer patterns) with a time limit, so a pattern that backtracks without end stops with a
// message. A build without ICU (-DONYX_MINIMAL=ON) has regex_reward_absent.cc instead.
#include <unicode/regex.h>
#include <unicode/utext.h>

#include "onyx/error.h"
#include "train/grpo.h"

namespace onyx::train {

namespace {

class RegexMatch : public RewardFunction {
 public:
  RegexMatch(std::string name, const std::string& pattern, bool dotall, const std::string& what)
      : name_(std::move(name)) {
    UErrorCode status = U_ZERO_ERROR;
    UParseError pe{};
    pattern_.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(pattern),
                                              dotall ? UREGEX_DOTALL : 0, pe, status));
    if (U_FAILURE(status))
      throw Error(cat(what, ": invalid pattern '", pattern, "': ", u_errorName(status),
                      " (ICU regex, near character ", pe.offset, ")"));
  }
  std::string name() const override { return name_; }
  std::vector<double> score(const RewardBatch& b) override {
    std::vector<double> out;
    for (const std::string& text : b.completions) {
      UErrorCode status = U_ZERO_ERROR;
      UText* ut = utext_openUTF8(nullptr, text.data(), (int64_t)text.size(), &status);
      std::unique_ptr<icu::RegexMatcher> m(pattern_->matcher(status));
      ONYX_CHECK(U_SUCCESS(status), "reward ", name_, ": ICU regex matcher: ", u_errorName(status));
      m->setTimeLimit(2000, status);  // in steps of ICU's match engine (about a second)
      m->reset(ut);
      const bool hit = m->lookingAt(status);
      utext_close(ut);
      ONYX_CHECK(U_SUCCESS(status), "reward ", name_, ": the pattern did not finish matching a ",
                 text.size(), "-byte completion (", u_errorName(status), "); simplify the pattern");
      out.push_back(hit ? 1.0 : 0.0);
    }
    return out;
  }

 private:
  std::string name_;
  std::unique_ptr<icu::RegexPattern> pattern_;
};

}  // namespace

std::shared_ptr<RewardFunction> regex_reward(const std::string& name, const std::string& pattern,
                                             bool dotall, const std::string& what) {
  return std::make_shared<RegexMatch>(name, pattern, dotall, what);
}

}  // namespace onyx::train
