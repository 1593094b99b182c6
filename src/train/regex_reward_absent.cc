// train/regex_reward_absent.cc — GRPO's `regex` reward in a build without ICU (-DONYX_MINIMAL=ON,
// CMakeLists.txt): naming a regex reward is an error that says so; the other rewards work.
#include "onyx/error.h"
#include "train/grpo.h"

namespace onyx::train {

std::shared_ptr<RewardFunction> regex_reward(const std::string&, const std::string&, bool,
                                             const std::string& what) {
  throw Error(cat(what,
                  ": this minimal build (-DONYX_MINIMAL=ON) has no regular expressions (ICU); ",
                  "use an exact_match, length or python reward, or a full build"));
}

}  // namespace onyx::train
