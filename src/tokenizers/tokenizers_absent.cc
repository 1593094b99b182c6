// tokenizers/tokenizers_absent.cc — the tokenizers' entry points in a build without them
// (-DONYX_MINIMAL=ON leaves out tokenizer.cc, bpe.cc, wordpiece.cc, hf_pipeline.cc and
// tokenizer_schema.cc, and with them ICU; CMakeLists.txt). load_tokenizer says so; as no Tokenizer
// can then exist, its members are never reached, and say the same if they were. Datasets given as
// token ids, and every model, train as in a full build.
#include "onyx/error.h"
#include "tokenizers/tokenizer.h"

namespace onyx::tokenizers {

namespace {
[[noreturn]] void absent(const std::string& what) {
  throw Error(cat(what,
                  ": this minimal build (-DONYX_MINIMAL=ON) has no tokenizers; give the "
                  "data as token ids (input_ids columns) or use a full build"));
}
}  // namespace

std::shared_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  absent(cat("tokenizer '", path, "'"));
}
std::shared_ptr<Tokenizer> tokenizer_from_json_text(const std::string&, const std::string& path) {
  absent(cat("tokenizer '", path, "'"));
}
std::vector<int64_t> Tokenizer::encode_ids(const std::string&) const { absent("encode"); }
Encoding Tokenizer::encode(const std::string&, const EncodeOptions&) const { absent("encode"); }
Encoding Tokenizer::encode_pair(const std::string&, const std::string&,
                                const EncodeOptions&) const {
  absent("encode");
}
Encoding Tokenizer::assemble(std::vector<int64_t>, const std::vector<int64_t>*,
                             const EncodeOptions&) const {
  absent("encode");
}
int64_t Tokenizer::num_special_tokens(bool) const { absent("encode"); }
const AddedToken* Tokenizer::added_token(int64_t) const { absent("added tokens"); }

}  // namespace onyx::tokenizers
