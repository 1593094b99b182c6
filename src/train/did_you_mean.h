// train/did_you_mean.h — " (did you mean 'eval_steps'?)" for a mistyped key: the closest known
// key by edit distance, when it is close enough to be the one meant.
#pragma once
#include <string>
#include <vector>

namespace onyx::train {

// "" when no known key is within max(1, |word| / 3) edits of `word`.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& known);

}  // namespace onyx::train
