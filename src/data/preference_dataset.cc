// data/preference_dataset.cc — see preference_dataset.h.
#include "data/preference_dataset.h"

#include <algorithm>

#include "data/text_rows.h"
#include "onyx/error.h"

namespace onyx::data {

using tokenizers::Tokenizer;

namespace {

// Python's s[a:b] over a sequence of n items (negative bounds count from the end).
std::pair<int64_t, int64_t> py_slice(int64_t n, int64_t a, int64_t b) {
  auto clamp = [n](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + n : i, 0, n); };
  return {clamp(a), clamp(b)};
}

// The code points of a UTF-8 string, each as its bytes (Python indexes str by code point).
std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size(); i++) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80 || out.empty()) out.emplace_back();
    out.back() += s[i];
  }
  return out;
}

// TRL's extract_prompt on a row without "prompt": the loop index where chosen and rejected first
// differ (stepped back over a space before it), or the last index of the shorter one when neither
// differs; prompt = chosen[:idx], the completions the rest (Python slices, negative idx included).
template <class Seq, class Join>
void extract_prompt_from(const Seq& c, const Seq& r, Join join, nlohmann::json& prompt,
                         nlohmann::json& chosen, nlohmann::json& rejected, bool is_text,
                         const std::string& path, int64_t line) {
  const int64_t n = (int64_t)std::min(c.size(), r.size());
  ONYX_CHECK(n > 0, "dataset '", path, "': line ", line,
             ": a row without 'prompt' needs non-empty 'chosen' and 'rejected' to extract the "
             "shared prompt from (TRL's extract_prompt)");
  int64_t idx = 0;
  for (idx = 0; idx < n; idx++) {
    if (c[idx] != r[idx]) {
      const auto& before = c[idx - 1 < 0 ? idx - 1 + c.size() : idx - 1];
      if (is_text && before == std::string(" ")) idx -= 1;
      break;
    }
  }
  if (idx == n) idx = n - 1;  // no difference: Python's loop variable keeps its last value
  auto [p0, p1] = py_slice((int64_t)c.size(), 0, idx);
  auto [c0, c1] = py_slice((int64_t)c.size(), idx, (int64_t)c.size());
  auto [r0, r1] = py_slice((int64_t)r.size(), idx, (int64_t)r.size());
  prompt = join(c, p0, p1);
  chosen = join(c, c0, c1);
  rejected = join(r, r0, r1);
}

void extract_prompt(Row& row, const std::string& path) {
  const nlohmann::json *c = row_field(row, "chosen"), *r = row_field(row, "rejected");
  ONYX_CHECK(c && r, "dataset '", path, "': line ", row.line,
             ": a preference row needs 'chosen' and 'rejected' (and 'prompt', or a prompt they "
             "share)");
  nlohmann::json prompt, chosen, rejected;
  if (c->is_string() && r->is_string()) {
    auto cs = code_points(c->get<std::string>()), rs = code_points(r->get<std::string>());
    auto join = [](const std::vector<std::string>& v, int64_t a, int64_t b) {
      std::string s;
      for (int64_t i = a; i < b; i++) s += v[i];
      return nlohmann::json(s);
    };
    extract_prompt_from(cs, rs, join, prompt, chosen, rejected, true, path, row.line);
  } else {
    ONYX_CHECK(is_messages(c) && is_messages(r), "dataset '", path, "': line ", row.line,
               ": 'chosen' and 'rejected' must both be strings or both lists of messages");
    std::vector<nlohmann::json> cm(c->begin(), c->end()), rm(r->begin(), r->end());
    auto join = [](const std::vector<nlohmann::json>& v, int64_t a, int64_t b) {
      nlohmann::json s = nlohmann::json::array();
      for (int64_t i = a; i < b; i++) s.push_back(v[i]);
      return s;
    };
    extract_prompt_from(cm, rm, join, prompt, chosen, rejected, false, path, row.line);
  }
  row.obj["prompt"] = prompt;
  row.obj["chosen"] = chosen;
  row.obj["rejected"] = rejected;
}

// The end-of-sequence text TRL appends to standard completions (the tokenizer's eos_token).
std::string eos_text(const Tokenizer& tok, const PreferenceOptions& o, const std::string& path) {
  auto it = o.special_tokens.find("eos_token");
  if (it != o.special_tokens.end() && !it->second.empty()) {
    ONYX_CHECK(tok.token_id(it->second), "dataset '", path, "': eos_token '", it->second,
               "' is not a token of the tokenizer (", tok.source(), ")");
    return it->second;
  }
  auto id = tok.eos_id();
  ONYX_CHECK(id, "dataset '", path, "': the tokenizer (", tok.source(),
             ") has no end-of-text token to end the completions with");
  return tok.token_bytes(*id);
}

struct PairIds {
  std::vector<int64_t> prompt, prompt_chosen, prompt_rejected;
};

PairIds encode_standard(const Tokenizer& tok, const Row& row, const std::string& eos,
                        const std::string& path) {
  auto text = [&](const char* key) {
    const nlohmann::json* v = row_field(row, key);
    ONYX_CHECK(v, "dataset '", path, "': line ", row.line,
               ": a preference row needs 'prompt', 'chosen' and 'rejected'; '", key,
               "' is missing");
    ONYX_CHECK(v->is_string(), "dataset '", path, "': line ", row.line, ": '", key,
               "' must be a string (or every field a list of messages)");
    return v->get<std::string>();
  };
  auto with_eos = [&](std::string s) { return ends_with(s, eos) ? s : s + eos; };
  const std::string prompt = text("prompt");
  auto encode = [&](const std::string& s) { return tok.encode(s).input_ids; };
  return {encode(prompt), encode(prompt + with_eos(text("chosen"))),
          encode(prompt + with_eos(text("rejected")))};
}

PairIds encode_conversational(const Tokenizer& tok, const ChatTemplate* tmpl, const Row& row,
                              const PreferenceOptions& o, const std::string& path) {
  ONYX_CHECK(tmpl, "dataset '", path, "': line ", row.line,
             ": conversational rows need a chat template, and the tokenizer folder has none (no "
             "chat_template.jinja, no chat_template in tokenizer_config.json); set the dataset's "
             "chat_template");
  const nlohmann::json *p = row_field(row, "prompt"), *c = row_field(row, "chosen"),
                       *r = row_field(row, "rejected");
  ONYX_CHECK(is_messages(p) && is_messages(c) && is_messages(r), "dataset '", path, "': line ",
             row.line,
             ": 'prompt', 'chosen' and 'rejected' must all be lists of messages ({role, "
             "content}) or all strings");
  const nlohmann::ordered_json extra = template_extras(row, path);
  auto ids = [&](const nlohmann::json& msgs, bool gen) {
    return tok.encode_ids(
        render_messages(*tmpl, msgs, gen, o.special_tokens, extra, path, row.line).text);
  };
  auto joined = [&](const nlohmann::json* completion) {
    nlohmann::json all = *p;
    for (auto& m : *completion) all.push_back(m);
    return all;
  };
  return {ids(*p, true), ids(joined(c), false), ids(joined(r), false)};
}

}  // namespace

PreferenceDataset::PreferenceDataset(const std::string& path, std::shared_ptr<const Tokenizer> tok,
                                     PreferenceOptions opts)
    : tok_(std::move(tok)), opts_(std::move(opts)) {
  ONYX_CHECK(tok_, "dataset '", path, "': no tokenizer");
  ONYX_CHECK(opts_.max_length >= 0, "dataset '", path, "': max_length must be positive (0: none)");
  ONYX_CHECK(opts_.pad_multiple > 0, "dataset '", path, "': pad_multiple must be positive");
  ONYX_CHECK(opts_.truncation_mode == "keep_start" || opts_.truncation_mode == "keep_end",
             "dataset '", path, "': truncation_mode '", opts_.truncation_mode,
             "' (expected keep_start or keep_end)");
  std::unique_ptr<ChatTemplate> tmpl;
  if (!opts_.chat_template.empty())
    tmpl = std::make_unique<ChatTemplate>(opts_.chat_template, opts_.chat_template_origin.empty()
                                                                   ? "chat template"
                                                                   : opts_.chat_template_origin);
  TextClassificationOptions ro;
  ro.format = opts_.format;
  bool warned = false;
  int64_t dropped = 0;
  std::string eos;  // standard rows only; looked up on the first one
  for (Row& row : read_rows(path, ro)) {
    if (!row_field(row, "prompt")) extract_prompt(row, path);
    const bool conversational =
        is_messages(row_field(row, "prompt")) || is_messages(row_field(row, "chosen"));
    PairIds ids;
    if (conversational) {
      ids = encode_conversational(*tok_, tmpl.get(), row, opts_, path);
    } else {
      if (eos.empty()) eos = eos_text(*tok_, opts_, path);
      ids = encode_standard(*tok_, row, eos, path);
    }
    const size_t n = std::min(completion_start(ids.prompt, ids.prompt_chosen, warned, path),
                              completion_start(ids.prompt, ids.prompt_rejected, warned, path));
    // keep_start truncation would leave a prompt of max_length tokens no completion token
    if (opts_.max_length > 0 && opts_.truncation_mode == "keep_start" &&
        (int64_t)n >= opts_.max_length) {
      dropped++;
      continue;
    }
    prompt_.emplace_back(ids.prompt.begin(), ids.prompt.begin() + n);
    chosen_.emplace_back(ids.prompt_chosen.begin() + n, ids.prompt_chosen.end());
    rejected_.emplace_back(ids.prompt_rejected.begin() + n, ids.prompt_rejected.end());
  }
  ONYX_CHECK(!prompt_.empty(), "dataset '", path, "' has no preference pairs",
             dropped ? cat(" whose prompt is shorter than max_length ", opts_.max_length, " (",
                           dropped, " dropped)")
                     : std::string());
}

std::vector<std::string> PreferenceDataset::keys() const {
  if (ref_chosen_.empty()) return {"attention_mask", "input_ids", "labels"};
  return {"attention_mask", "input_ids", "labels", "ref_chosen_logps", "ref_rejected_logps"};
}

// keep_start keeps the first max_length tokens, keep_end the last.
std::vector<int64_t> PreferenceDataset::sequence(int64_t i, bool chosen,
                                                 std::vector<int64_t>* labels) const {
  const auto& p = prompt_.at(i);
  const auto& c = chosen ? chosen_.at(i) : rejected_.at(i);
  std::vector<int64_t> ids(p), lab(p.size(), -100);
  ids.insert(ids.end(), c.begin(), c.end());
  lab.insert(lab.end(), c.begin(), c.end());
  const int64_t m = opts_.max_length;
  if (m > 0 && (int64_t)ids.size() > m) {
    const int64_t from = opts_.truncation_mode == "keep_end" ? (int64_t)ids.size() - m : 0;
    ids = std::vector<int64_t>(ids.begin() + from, ids.begin() + from + m);
    lab = std::vector<int64_t>(lab.begin() + from, lab.begin() + from + m);
  }
  if (labels) *labels = std::move(lab);
  return ids;
}

std::map<std::string, Tensor> PreferenceDataset::batch(const std::vector<int64_t>& indices) const {
  const int64_t B = (int64_t)indices.size();
  std::vector<std::vector<int64_t>> ids(2 * B), labels(2 * B);
  int64_t longest = 1;
  for (int64_t b = 0; b < B; b++) {
    const int64_t i = indices[b];
    ONYX_CHECK(i >= 0 && i < size(), "preference dataset: index ", i, " out of range (", size(),
               " pairs)");
    ids[b] = sequence(i, true, &labels[b]);
    ids[B + b] = sequence(i, false, &labels[B + b]);
    longest = std::max({longest, (int64_t)ids[b].size(), (int64_t)ids[B + b].size()});
  }
  const int64_t L = (longest + opts_.pad_multiple - 1) / opts_.pad_multiple * opts_.pad_multiple;
  std::vector<int64_t> flat_ids(2 * B * L, tok_->pad_id()), mask(2 * B * L, 0),
      flat_labels(2 * B * L, -100);
  for (int64_t r = 0; r < 2 * B; r++)
    for (size_t t = 0; t < ids[r].size(); t++) {
      flat_ids[r * L + t] = ids[r][t];
      mask[r * L + t] = 1;
      flat_labels[r * L + t] = labels[r][t];
    }
  auto make = [&](const std::vector<int64_t>& v) {
    return Tensor::from_vector<int64_t>(DType::Int64, {2 * B, L}, v);
  };
  std::map<std::string, Tensor> out = {
      {"input_ids", make(flat_ids)}, {"attention_mask", make(mask)}, {"labels", make(flat_labels)}};
  if (!ref_chosen_.empty()) {
    std::vector<float> rc(B), rr(B);
    for (int64_t b = 0; b < B; b++) {
      rc[b] = ref_chosen_[indices[b]];
      rr[b] = ref_rejected_[indices[b]];
    }
    out["ref_chosen_logps"] = Tensor::from_vector<float>(DType::Float32, {B}, rc);
    out["ref_rejected_logps"] = Tensor::from_vector<float>(DType::Float32, {B}, rr);
  }
  return out;
}

std::vector<int64_t> PreferenceDataset::lengths(const std::string&) const {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < size(); i++) {
    const int64_t n =
        (int64_t)(prompt_[i].size() + std::max(chosen_[i].size(), rejected_[i].size()));
    out.push_back(opts_.max_length > 0 ? std::min(n, opts_.max_length) : n);  // as batched
  }
  return out;
}

void PreferenceDataset::set_reference_logps(std::vector<float> chosen,
                                            std::vector<float> rejected) {
  ONYX_CHECK((int64_t)chosen.size() == size() && (int64_t)rejected.size() == size(),
             "reference log-probabilities: ", chosen.size(), " chosen and ", rejected.size(),
             " rejected values for ", size(), " pairs");
  ref_chosen_ = std::move(chosen);
  ref_rejected_ = std::move(rejected);
}

}  // namespace onyx::data
