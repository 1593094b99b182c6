// tokenizer_schema.cc — what Hugging Face tokenizers' deserializer requires of a tokenizer.json
// before onyx reads it (tokenizer.h: check_tokenizer_json). A tokenizer.json comes from a
// downloaded folder; `tokenizers` refuses a wrong-typed field ("add_prefix_space": "yes", an id of
// -1 or 1.5, an added token without "special"), and so does onyx, naming the file and the JSON
// path, instead of reading a default or a truncated number. Written here because the rules are
// tokenizers' serde attributes (types, required fields, u32 ids), which no C++ library knows.
//
// Only the types of the fields each component has are checked (and the fields tokenizers
// requires); which components onyx implements is decided by the readers (bpe.cc, wordpiece.cc,
// hf_pipeline.cc, parse_post_processor), which refuse the others by name.
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "onyx/error.h"
#include "tokenizers/tokenizer.h"

namespace onyx::tokenizers {

namespace {

using json = nlohmann::json;

enum class Kind { Bool, Str, U32, U64, Num, Obj, Arr };
struct Field {
  const char* name;
  Kind kind;
  bool required = false;
  bool nullable = false;
};
using Schema = std::map<std::string, std::vector<Field>>;  // component type -> its fields

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Bool:
      return "true or false";
    case Kind::Str:
      return "a string";
    case Kind::U32:
      return "an integer in [0, 2^32)";
    case Kind::U64:
      return "an integer >= 0";
    case Kind::Num:
      return "a number";
    case Kind::Obj:
      return "an object";
    case Kind::Arr:
      return "a list";
  }
  return "?";
}

bool is_u32(const json& v) { return v.is_number_unsigned() && v.get<uint64_t>() <= 0xFFFFFFFFull; }

bool has_kind(const json& v, Kind k) {
  switch (k) {
    case Kind::Bool:
      return v.is_boolean();
    case Kind::Str:
      return v.is_string();
    case Kind::U32:
      return is_u32(v);
    case Kind::U64:
      return v.is_number_unsigned();
    case Kind::Num:
      return v.is_number();
    case Kind::Obj:
      return v.is_object();
    case Kind::Arr:
      return v.is_array();
  }
  return false;
}

struct Checker {
  const std::string& path;

  [[noreturn]] void fail(const std::string& at, const std::string& msg) const {
    throw Error(cat("tokenizer file '", path, "': ", at, " ", msg,
                    " (Hugging Face tokenizers refuses this file too)"));
  }
  void field(const json& obj, const std::string& at, const Field& f) const {
    auto it = obj.find(f.name);
    if (it == obj.end()) {
      if (f.required) fail(at, cat("has no \"", f.name, "\""));
      return;
    }
    if (it->is_null() && f.nullable) return;
    if (!has_kind(*it, f.kind))
      fail(cat(at, ".", f.name), cat("must be ", kind_name(f.kind), ", got ", it->dump()));
  }
  void fields(const json& obj, const std::string& at, const std::vector<Field>& fs) const {
    if (!obj.is_object()) fail(at, cat("must be an object, got ", obj.dump()));
    for (const Field& f : fs) field(obj, at, f);
  }
  void one_of(const json& obj, const std::string& at, const char* key,
              std::initializer_list<const char*> allowed) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return;
    for (const char* a : allowed)
      if (it->is_string() && *it == a) return;
    std::string list;
    for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
    fail(cat(at, ".", key), cat("must be one of ", list, ", got ", it->dump()));
  }
  // A normalizer / pre_tokenizer / decoder / post_processor and the ones a Sequence holds.
  void component(const json& c, const std::string& at, const Schema& schema,
                 const std::set<std::string>& types, const char* sequence_key) const {
    if (c.is_null()) return;
    if (!c.is_object()) fail(at, cat("must be an object or null, got ", c.dump()));
    auto t = c.find("type");
    if (t == c.end()) return;  // untyped (an old format): the reader decides
    if (!t->is_string()) fail(cat(at, ".type"), cat("must be a string, got ", t->dump()));
    const std::string type = t->get<std::string>();
    if (!types.count(type)) fail(cat(at, ".type"), cat("'", type, "' is not a type there"));
    if (type == "Sequence") {
      field(c, at, {sequence_key, Kind::Arr, true});
      size_t k = 0;
      for (auto& sub : c[sequence_key])
        component(sub, cat(at, ".", sequence_key, "[", k++, "]"), schema, types, sequence_key);
      return;
    }
    auto s = schema.find(type);
    if (s != schema.end()) fields(c, at, s->second);
    one_of(c, at, "prepend_scheme", {"first", "never", "always"});
    if (type == "Split")
      one_of(c, at, "behavior",
             {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"});
    if (type == "Metaspace" && c.contains("replacement") && c["replacement"].is_string() &&
        unicode::decode_utf8(c["replacement"].get<std::string>()).size() != 1)
      fail(cat(at, ".replacement"), "must be one character");
  }
};

const Schema& normalizers() {
  static const Schema s = {
      {"BertNormalizer",
       {{"clean_text", Kind::Bool},
        {"handle_chinese_chars", Kind::Bool},
        {"strip_accents", Kind::Bool, false, true},
        {"lowercase", Kind::Bool}}},
      {"Strip", {{"strip_left", Kind::Bool}, {"strip_right", Kind::Bool}}},
      {"Replace", {{"pattern", Kind::Obj, true}, {"content", Kind::Str, true}}},
      {"Prepend", {{"prepend", Kind::Str, true}}},
      {"Precompiled", {{"precompiled_charsmap", Kind::Str, false, true}}}};
  return s;
}
const Schema& pre_tokenizers() {
  static const Schema s = {
      {"ByteLevel",
       {{"add_prefix_space", Kind::Bool}, {"trim_offsets", Kind::Bool}, {"use_regex", Kind::Bool}}},
      {"Split",
       {{"pattern", Kind::Obj, true}, {"behavior", Kind::Str, true}, {"invert", Kind::Bool, true}}},
      {"Metaspace",
       {{"replacement", Kind::Str, true},
        {"split", Kind::Bool},
        {"add_prefix_space", Kind::Bool},
        {"prepend_scheme", Kind::Str}}},
      {"Digits", {{"individual_digits", Kind::Bool}}},
      {"Punctuation", {{"behavior", Kind::Str}}}};
  return s;
}
const Schema& decoders() {
  static const Schema s = {
      {"ByteLevel",
       {{"add_prefix_space", Kind::Bool}, {"trim_offsets", Kind::Bool}, {"use_regex", Kind::Bool}}},
      {"Metaspace",
       {{"replacement", Kind::Str, true},
        {"split", Kind::Bool},
        {"add_prefix_space", Kind::Bool},
        {"prepend_scheme", Kind::Str}}},
      {"Replace", {{"pattern", Kind::Obj, true}, {"content", Kind::Str, true}}},
      {"Strip", {{"content", Kind::Str}, {"start", Kind::U64}, {"stop", Kind::U64}}},
      {"WordPiece", {{"prefix", Kind::Str}, {"cleanup", Kind::Bool}}},
      {"BPEDecoder", {{"suffix", Kind::Str}}},
      {"CTC",
       {{"pad_token", Kind::Str}, {"word_delimiter_token", Kind::Str}, {"cleanup", Kind::Bool}}}};
  return s;
}
const Schema& post_processors() {
  static const Schema s = {
      {"ByteLevel",
       {{"add_prefix_space", Kind::Bool}, {"trim_offsets", Kind::Bool}, {"use_regex", Kind::Bool}}},
      {"BertProcessing", {{"sep", Kind::Arr, true}, {"cls", Kind::Arr, true}}},
      {"RobertaProcessing", {{"sep", Kind::Arr, true}, {"cls", Kind::Arr, true}}},
      {"TemplateProcessing",
       {{"single", Kind::Arr, true}, {"pair", Kind::Arr, true}, {"special_tokens", Kind::Obj}}}};
  return s;
}

// BertProcessing's and RobertaProcessing's [token, id] pairs, TemplateProcessing's pieces and
// special tokens, in any Sequence.
void check_post_processor_values(const Checker& ck, const json& pp, const std::string& at) {
  if (!pp.is_object()) return;
  const std::string type = pp.value("type", std::string());
  if (type == "Sequence" && pp.contains("processors")) {
    size_t k = 0;
    for (auto& sub : pp["processors"])
      check_post_processor_values(ck, sub, cat(at, ".processors[", k++, "]"));
    return;
  }
  for (const char* key : {"sep", "cls"})
    if ((type == "BertProcessing" || type == "RobertaProcessing") && pp.contains(key)) {
      const json& p = pp[key];
      if (!(p.size() == 2 && p[0].is_string() && has_kind(p[1], Kind::U32)))
        ck.fail(cat(at, ".", key), cat("must be [token, id], got ", p.dump()));
    }
  if (type != "TemplateProcessing") return;
  for (const char* key : {"single", "pair"}) {
    size_t k = 0;
    for (auto& piece : pp[key]) {
      const std::string pat = cat(at, ".", key, "[", k++, "]");
      if (!piece.is_object() || piece.size() != 1 ||
          !(piece.contains("Sequence") || piece.contains("SpecialToken")))
        ck.fail(pat,
                cat("must be {\"Sequence\": ...} or {\"SpecialToken\": ...}, got ", piece.dump()));
      const bool seq = piece.contains("Sequence");
      const json& body = seq ? piece["Sequence"] : piece["SpecialToken"];
      ck.fields(body, pat, {{"id", Kind::Str, true}, {"type_id", Kind::U32, true}});
      if (seq) ck.one_of(body, pat, "id", {"A", "B"});
    }
  }
  if (!pp.contains("special_tokens")) return;
  for (auto& [name, tok] : pp["special_tokens"].items()) {
    const std::string pat = cat(at, ".special_tokens['", name, "']");
    ck.fields(tok, pat,
              {{"id", Kind::Str, true}, {"ids", Kind::Arr, true}, {"tokens", Kind::Arr, true}});
    for (auto& id : tok["ids"])
      if (!has_kind(id, Kind::U32))
        ck.fail(cat(pat, ".ids"), cat("must hold integers in [0, 2^32), got ", id.dump()));
  }
}

}  // namespace

void check_tokenizer_json(const nlohmann::json& j, const std::string& path) {
  const Checker ck{path};
  if (!j.is_object()) ck.fail("the file", cat("must be a JSON object, got ", j.type_name()));
  static const std::set<std::string> top_keys = {"version",      "truncation",     "padding",
                                                 "added_tokens", "normalizer",     "pre_tokenizer",
                                                 "model",        "post_processor", "decoder"};
  for (auto& [key, value] : j.items())
    if (!top_keys.count(key)) ck.fail(cat("'", key, "'"), "is not a key of a tokenizer.json");
  if (j.contains("version") && !(j["version"].is_string() && j["version"] == "1.0"))
    ck.fail("version", cat("must be \"1.0\", got ", j["version"].dump()));
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    if (!j["added_tokens"].is_array())
      ck.fail("added_tokens", cat("must be a list, got ", j["added_tokens"].dump()));
    size_t k = 0;
    for (auto& a : j["added_tokens"])
      ck.fields(a, cat("added_tokens[", k++, "]"),
                {{"id", Kind::U32, true},
                 {"content", Kind::Str, true},
                 {"single_word", Kind::Bool, true},
                 {"lstrip", Kind::Bool, true},
                 {"rstrip", Kind::Bool, true},
                 {"normalized", Kind::Bool, true},
                 {"special", Kind::Bool, true}});
  }
  if (j.contains("padding") && !j["padding"].is_null()) {
    const json& p = j["padding"];
    ck.fields(p, "padding",
              {{"pad_id", Kind::U32},
               {"pad_type_id", Kind::U32},
               {"pad_token", Kind::Str},
               {"pad_to_multiple_of", Kind::U32, false, true}});
    if (!p.contains("strategy")) ck.fail("padding", "has no \"strategy\"");
    const json& s = p["strategy"];  // the string "BatchLongest" or {"Fixed": n}
    if (!(s == "BatchLongest" || (s.is_object() && s.contains("Fixed") && is_u32(s["Fixed"]))))
      ck.fail("padding.strategy",
              cat("must be \"BatchLongest\" or {\"Fixed\": n}, got ", s.dump()));
    ck.one_of(p, "padding", "direction", {"Left", "Right"});
  }
  if (j.contains("truncation") && !j["truncation"].is_null()) {
    ck.fields(j["truncation"], "truncation",
              {{"max_length", Kind::U32}, {"stride", Kind::U32}, {"strategy", Kind::Str}});
    ck.one_of(j["truncation"], "truncation", "strategy",
              {"LongestFirst", "OnlyFirst", "OnlySecond"});
    ck.one_of(j["truncation"], "truncation", "direction", {"Left", "Right"});
  }
  if (j.contains("model")) {
    const json& m = j["model"];
    ck.fields(m, "model",
              {{"type", Kind::Str},
               {"dropout", Kind::Num, false, true},
               {"unk_token", Kind::Str, false, true},
               {"continuing_subword_prefix", Kind::Str, false, true},
               {"end_of_word_suffix", Kind::Str, false, true},
               {"fuse_unk", Kind::Bool, false, true},
               {"byte_fallback", Kind::Bool, false, true},
               {"ignore_merges", Kind::Bool, false, true},
               {"max_input_chars_per_word", Kind::U32}});
    const std::string type = m.value("type", std::string());
    if (type == "BPE" || type == "WordPiece" || type == "WordLevel")  // (Unigram's is a list)
      ck.field(m, "model", {"vocab", Kind::Obj, true});
    if (m.contains("dropout") && m["dropout"].is_number() &&
        !(m["dropout"].get<double>() >= 0 && m["dropout"].get<double>() <= 1))
      ck.fail("model.dropout", cat("must be in [0, 1], got ", m["dropout"].dump()));
  }
  // the component types tokenizers 0.23 has (onyx's readers implement a subset and name the rest)
  static const std::set<std::string> normalizer_types = {
      "BertNormalizer", "Strip",   "StripAccents", "NFC",       "NFD",
      "NFKC",           "NFKD",    "Sequence",     "Lowercase", "Nmt",
      "Precompiled",    "Replace", "Prepend",      "ByteLevel"};
  static const std::set<std::string> pre_tokenizer_types = {
      "BertPreTokenizer", "ByteLevel",  "CharDelimiterSplit", "Metaspace",       "Whitespace",
      "Sequence",         "Split",      "Punctuation",        "WhitespaceSplit", "Digits",
      "UnicodeScripts",   "FixedLength"};
  static const std::set<std::string> decoder_types = {
      "BPEDecoder", "ByteLevel", "WordPiece", "Metaspace", "CTC",
      "Sequence",   "Replace",   "Fuse",      "Strip",     "ByteFallback"};
  static const std::set<std::string> post_processor_types = {
      "RobertaProcessing", "BertProcessing", "ByteLevel", "TemplateProcessing", "Sequence"};
  ck.component(j.value("normalizer", json()), "normalizer", normalizers(), normalizer_types,
               "normalizers");
  ck.component(j.value("pre_tokenizer", json()), "pre_tokenizer", pre_tokenizers(),
               pre_tokenizer_types, "pretokenizers");
  ck.component(j.value("decoder", json()), "decoder", decoders(), decoder_types, "decoders");
  ck.component(j.value("post_processor", json()), "post_processor", post_processors(),
               post_processor_types, "processors");
  check_post_processor_values(ck, j.value("post_processor", json()), "post_processor");
}

}  // namespace onyx::tokenizers
