// text_datasets.cc — text classification rows (JSONL/JSON/CSV) and causal-LM blocks, tokenized
// once at load (see text_datasets.h).
#include "data/text_datasets.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "data/chat_template.h"
#include "data/text_rows.h"
#include "io/json.h"
#include "onyx/error.h"

namespace fs = std::filesystem;

namespace onyx::data {

using tokenizers::EncodeOptions;
using tokenizers::Encoding;
using tokenizers::read_text_file;
using tokenizers::Tokenizer;

std::vector<CsvRecord> parse_csv(const std::string& text, char delim, const std::string& what) {
  std::vector<CsvRecord> out;
  size_t i = 0;
  const size_t n = text.size();
  if (n >= 3 && text.compare(0, 3, "\xEF\xBB\xBF") == 0) i = 3;
  int64_t line = 1;
  while (i < n) {
    CsvRecord rec;
    rec.line = line;
    std::string field;
    bool end_of_record = false;
    while (!end_of_record) {
      field.clear();
      if (i < n && text[i] == '"') {  // quoted field
        const int64_t open_line = line;
        ++i;
        while (true) {
          ONYX_CHECK(i < n, what, ": line ", open_line, ": a quoted field is never closed");
          const char c = text[i];
          if (c == '"') {
            if (i + 1 < n && text[i + 1] == '"') {
              field.push_back('"');
              i += 2;
              continue;
            }
            ++i;
            break;
          }
          if (c == '\n') ++line;
          field.push_back(c);
          ++i;
        }
        ONYX_CHECK(i >= n || text[i] == delim || text[i] == '\n' || text[i] == '\r', what,
                   ": line ", line, ": unexpected character '", text[i],
                   "' after a closing quote (a quote inside a quoted "
                   "field must be doubled)");
      } else {
        while (i < n && text[i] != delim && text[i] != '\n' && text[i] != '\r')
          field.push_back(text[i++]);
      }
      rec.fields.push_back(field);
      if (i < n && text[i] == delim) {
        ++i;
      } else {
        if (i < n && text[i] == '\r') ++i;
        if (i < n && text[i] == '\n') ++i;
        ++line;
        end_of_record = true;
      }
    }
    if (rec.fields.size() == 1 && rec.fields[0].empty()) continue;  // blank line
    out.push_back(std::move(rec));
  }
  return out;
}

std::vector<Row> read_rows(const std::string& path, const TextClassificationOptions& o) {
  std::string fmt = o.format;
  if (fmt.empty()) {
    std::string ext = fs::path(path).extension().string();
    if (ext == ".gz")
      ONYX_UNSUPPORTED("dataset '", path, "': compressed text datasets are not supported");
    fmt = ext.empty() ? "" : ext.substr(1);
  }
  ONYX_CHECK(fmt == "jsonl" || fmt == "json" || fmt == "csv" || fmt == "tsv", "dataset '", path,
             "': unknown format '", fmt,
             "' (expected jsonl, json, csv or tsv; set the format explicitly)");
  const std::string text = read_text_file(path);
  std::vector<Row> rows;
  if (fmt == "csv" || fmt == "tsv") {
    const char delim = o.delimiter ? o.delimiter : (fmt == "tsv" ? '\t' : ',');
    auto recs = parse_csv(text, delim, cat("dataset '", path, "'"));
    ONYX_CHECK(!recs.empty(), "dataset '", path, "' is empty (expected a header row)");
    const auto& header = recs[0].fields;
    for (size_t r = 1; r < recs.size(); ++r) {
      ONYX_CHECK(recs[r].fields.size() == header.size(), "dataset '", path, "': line ",
                 recs[r].line, " has ", recs[r].fields.size(), " fields but the header has ",
                 header.size());
      nlohmann::json obj = nlohmann::json::object();
      for (size_t c = 0; c < header.size(); ++c) obj[header[c]] = recs[r].fields[c];
      rows.push_back({recs[r].line, std::move(obj)});
    }
  } else if (fmt == "json" && text.find_first_not_of(" \t\r\n") != std::string::npos &&
             text[text.find_first_not_of(" \t\r\n")] == '[') {
    nlohmann::json arr = io::parse_json(text, cat("dataset '", path, "'"));
    int64_t k = 0;
    for (auto& obj : arr) rows.push_back({++k, obj});
  } else {
    std::istringstream in(text);
    std::string line;
    for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      rows.push_back({lineno, io::parse_json(line, cat("dataset '", path, "': line ", lineno))});
    }
  }
  for (auto& r : rows)
    ONYX_CHECK(r.obj.is_object(), "dataset '", path, "': ", fmt == "json" ? "item " : "line ",
               r.line, " is not a JSON object");
  return rows;
}

namespace {

bool parse_int(const std::string& s, int64_t& v) {
  if (s.empty()) return false;
  size_t pos = 0;
  try {
    v = std::stoll(s, &pos);
  } catch (...) {
    return false;
  }
  return pos == s.size();
}

std::string field_text(const Row& r, const std::string& field, const std::string& path) {
  ONYX_CHECK(r.obj.contains(field), "dataset '", path, "': line ", r.line, " has no field '", field,
             "'");
  const auto& v = r.obj[field];
  ONYX_CHECK(v.is_string(), "dataset '", path, "': line ", r.line, ": field '", field,
             "' is not a string");
  return v.get<std::string>();
}

Tensor to_tensor(const std::vector<int64_t>& v, Shape shape) {
  return Tensor::from_vector(DType::Int64, shape, v);
}

}  // namespace

TextClassificationDataset::TextClassificationDataset(const std::string& path,
                                                     std::shared_ptr<const Tokenizer> tok,
                                                     TextClassificationOptions opts)
    : tok_(std::move(tok)), opts_(std::move(opts)) {
  ONYX_CHECK(tok_, "dataset '", path, "': no tokenizer");
  ONYX_CHECK(opts_.max_length > 0, "dataset '", path, "': max_length must be positive");
  ONYX_CHECK(opts_.bucket != PadBucket::Multiple || opts_.pad_multiple > 0, "dataset '", path,
             "': pad_multiple must be positive");
  auto rows = read_rows(path, opts_);
  ONYX_CHECK(!rows.empty(), "dataset '", path, "' has no rows");

  // Labels: integers as they are, strings through label_list or their sorted unique set.
  if (!opts_.label_field.empty()) {
    std::vector<std::string> str_labels;
    std::vector<int64_t> int_labels;
    std::vector<int64_t> lines;
    for (auto& r : rows) {
      ONYX_CHECK(r.obj.contains(opts_.label_field), "dataset '", path, "': line ", r.line,
                 " has no field '", opts_.label_field, "'");
      const auto& v = r.obj[opts_.label_field];
      lines.push_back(r.line);
      if (v.is_number_integer()) {
        int_labels.push_back(v.get<int64_t>());
      } else if (v.is_number_float()) {
        const double d = v.get<double>();
        ONYX_CHECK(d == std::floor(d), "dataset '", path, "': line ", r.line, ": label ", d,
                   " is not an integer (regression labels are not supported)");
        int_labels.push_back((int64_t)d);
      } else if (v.is_string()) {
        str_labels.push_back(v.get<std::string>());
      } else {
        throw Error(cat("dataset '", path, "': line ", r.line, ": label '", v.dump(),
                        "' is neither an integer nor a string"));
      }
    }
    ONYX_CHECK(str_labels.empty() || int_labels.empty(), "dataset '", path,
               "': labels mix integers and strings (e.g. line ", lines[0], ")");
    if (!str_labels.empty() && opts_.label_list.empty()) {
      bool all_int = true;
      std::vector<int64_t> as_int;
      for (auto& s : str_labels) {
        int64_t v;
        if (!parse_int(s, v)) {
          all_int = false;
          break;
        }
        as_int.push_back(v);
      }
      if (all_int) {
        int_labels = std::move(as_int);
        str_labels.clear();
      }
    }
    if (!str_labels.empty()) {
      if (opts_.label_list.empty()) {
        std::set<std::string> uniq(str_labels.begin(), str_labels.end());
        id2label_.assign(uniq.begin(), uniq.end());
      } else {
        id2label_ = opts_.label_list;
      }
      for (size_t i = 0; i < id2label_.size(); ++i) label2id_[id2label_[i]] = (int64_t)i;
      for (size_t i = 0; i < str_labels.size(); ++i) {
        auto it = label2id_.find(str_labels[i]);
        if (it == label2id_.end()) {
          std::string known;
          for (auto& l : id2label_) known += (known.empty() ? "" : ", ") + l;
          throw Error(cat("dataset '", path, "': line ", lines[i], ": label '", str_labels[i],
                          "' is not in the label list [", known, "]"));
        }
        labels_.push_back(it->second);
      }
    } else {
      int64_t max_label = -1;
      for (size_t i = 0; i < int_labels.size(); ++i) {
        ONYX_CHECK(int_labels[i] >= 0, "dataset '", path, "': line ", lines[i], ": label ",
                   int_labels[i], " is negative");
        if (!opts_.label_list.empty())
          ONYX_CHECK(int_labels[i] < (int64_t)opts_.label_list.size(), "dataset '", path,
                     "': line ", lines[i], ": label ", int_labels[i], " is out of range for ",
                     opts_.label_list.size(), " labels");
        max_label = std::max(max_label, int_labels[i]);
      }
      if (!opts_.label_list.empty()) {
        id2label_ = opts_.label_list;
      } else {
        for (int64_t i = 0; i <= max_label; ++i) id2label_.push_back(std::to_string(i));
      }
      for (size_t i = 0; i < id2label_.size(); ++i) label2id_[id2label_[i]] = (int64_t)i;
      labels_ = std::move(int_labels);
    }
  }

  EncodeOptions eo;
  eo.max_length = opts_.max_length;
  encodings_.reserve(rows.size());
  for (auto& r : rows) {
    auto a = tok_->encode_ids(field_text(r, opts_.text_field, path));
    if (opts_.text_pair_field.empty()) {
      encodings_.push_back(tok_->assemble(std::move(a), nullptr, eo));
    } else {
      auto b = tok_->encode_ids(field_text(r, opts_.text_pair_field, path));
      encodings_.push_back(tok_->assemble(std::move(a), &b, eo));
    }
  }
}

int64_t TextClassificationDataset::bucket_length(int64_t longest) const {
  int64_t len = std::max<int64_t>(longest, 1);
  if (opts_.bucket == PadBucket::Multiple) {
    len = (len + opts_.pad_multiple - 1) / opts_.pad_multiple * opts_.pad_multiple;
  } else {
    int64_t p = 1;
    while (p < len) p *= 2;
    len = p;
  }
  return std::min(len, std::max(longest, opts_.max_length));
}

std::vector<std::string> TextClassificationDataset::keys() const {
  std::vector<std::string> k = {"attention_mask", "input_ids"};
  if (!labels_.empty()) k.push_back("labels");
  if (tok_->uses_token_type_ids()) k.push_back("token_type_ids");
  return k;
}

std::map<std::string, Tensor> TextClassificationDataset::batch(
    const std::vector<int64_t>& indices) const {
  const int64_t B = indices.size();
  int64_t longest = 0;
  for (auto i : indices) {
    ONYX_CHECK(i >= 0 && i < size(), "text classification dataset: index ", i, " out of range (",
               size(), " samples)");
    longest = std::max(longest, encodings_[i].size());
  }
  const int64_t L = bucket_length(longest);
  std::vector<int64_t> ids(B * L, tok_->pad_id()), mask(B * L, 0), types(B * L, 0), labels;
  for (int64_t b = 0; b < B; ++b) {
    const Encoding& e = encodings_[indices[b]];
    std::copy(e.input_ids.begin(), e.input_ids.end(), ids.begin() + b * L);
    std::copy(e.attention_mask.begin(), e.attention_mask.end(), mask.begin() + b * L);
    std::copy(e.token_type_ids.begin(), e.token_type_ids.end(), types.begin() + b * L);
    if (!labels_.empty()) labels.push_back(labels_[indices[b]]);
  }
  std::map<std::string, Tensor> out;
  out["input_ids"] = to_tensor(ids, {B, L});
  out["attention_mask"] = to_tensor(mask, {B, L});
  if (tok_->uses_token_type_ids()) out["token_type_ids"] = to_tensor(types, {B, L});
  if (!labels_.empty()) out["labels"] = to_tensor(labels, {B});
  return out;
}

// ---- CausalLMDataset ----

CausalLMDataset::CausalLMDataset(const std::string& path, std::shared_ptr<const Tokenizer> tok,
                                 CausalLMOptions opts)
    : tok_(std::move(tok)), opts_(opts) {
  ONYX_CHECK(tok_, "dataset '", path, "': no tokenizer");
  ONYX_CHECK(opts_.block_size > 0, "dataset '", path, "': block_size must be positive");
  std::optional<int64_t> eos = tok_->eos_id();
  ONYX_CHECK(!opts_.add_eos || eos, "dataset '", path, "': the tokenizer (", tok_->source(),
             ") has no end-of-text token to put between documents (set add_eos false)");
  const std::string text = read_text_file(path);
  auto add_document = [&](const std::string& doc) {
    if (doc.find_first_not_of(" \t\r\n") == std::string::npos) return;
    auto ids = tok_->encode(doc).input_ids;
    tokens_.insert(tokens_.end(), ids.begin(), ids.end());
    if (opts_.add_eos && (ids.empty() || ids.back() != *eos)) tokens_.push_back(*eos);
  };
  std::istringstream in(text);
  std::string line, para;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!opts_.paragraphs) {
      add_document(line);
    } else if (line.find_first_not_of(" \t") == std::string::npos) {
      add_document(para);
      para.clear();
    } else {
      para += para.empty() ? line : "\n" + line;
    }
  }
  if (opts_.paragraphs) add_document(para);
  const int64_t n = tokens_.size(), bs = opts_.block_size;
  num_blocks_ = opts_.drop_remainder ? n / bs : (n + bs - 1) / bs;
  ONYX_CHECK(num_blocks_ > 0, "dataset '", path, "' has ", n, " tokens, fewer than one block of ",
             bs);
}

std::map<std::string, Tensor> CausalLMDataset::batch(const std::vector<int64_t>& indices) const {
  const int64_t B = indices.size(), T = opts_.block_size, n = tokens_.size();
  std::vector<int64_t> ids(B * T, tok_->pad_id()), mask(B * T, 0), labels(B * T, -100);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t i = indices[b];
    ONYX_CHECK(i >= 0 && i < num_blocks_, "causal LM dataset: index ", i, " out of range (",
               num_blocks_, " blocks)");
    for (int64_t t = 0; t < T && i * T + t < n; ++t) {
      ids[b * T + t] = labels[b * T + t] = tokens_[i * T + t];
      mask[b * T + t] = 1;
    }
  }
  return {{"input_ids", to_tensor(ids, {B, T})},
          {"attention_mask", to_tensor(mask, {B, T})},
          {"labels", to_tensor(labels, {B, T})}};
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// (text_rows.h) When the prompt is not a prefix (a token merging across the boundary, a template
// closing the prompt alone), TRL warns once per dataset; so does onyx.
size_t completion_start(const std::vector<int64_t>& prompt, const std::vector<int64_t>& all,
                        bool& warned, const std::string& path) {
  size_t n = 0;
  while (n < prompt.size() && n < all.size() && prompt[n] == all[n]) n++;
  if (n < prompt.size() && !warned) {
    warned = true;
    std::cerr << "Warning: dataset '" << path << "': the tokenized prompt is not a prefix of the "
              << "tokenized prompt + completion (tokens merge across the boundary, or the chat "
              << "template renders the prompt alone differently); the completion starts where "
                 "they diverge, as in TRL. Shown once for the dataset.\n";
  }
  return n;
}
const nlohmann::json* row_field(const Row& r, const char* key) {
  auto it = r.obj.find(key);
  return it == r.obj.end() || it->is_null() ? nullptr : &*it;
}

bool is_messages(const nlohmann::json* v) {
  return v && v->is_array() && !v->empty() && (*v)[0].is_object() && (*v)[0].contains("role");
}

// TRL's maybe_convert_to_chatml: "conversations" of {from, value} -> "messages".
void conversations_to_messages(Row& r, const std::string& path) {
  if (const nlohmann::json* conv = row_field(r, "conversations");
      conv && !row_field(r, "messages")) {
    ONYX_CHECK(conv->is_array(), "dataset '", path, "': line ", r.line,
               ": 'conversations' must be a list of messages");
    nlohmann::json msgs = nlohmann::json::array();
    for (auto m : *conv) {
      if (m.is_object() && m.contains("from")) {
        m["role"] = m["from"];
        m.erase("from");
      }
      if (m.is_object() && m.contains("value")) {
        m["content"] = m["value"];
        m.erase("value");
      }
      msgs.push_back(m);
    }
    r.obj["messages"] = msgs;
  }
}

nlohmann::ordered_json template_extras(const Row& r, const std::string& path) {
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  if (const nlohmann::json* tools = row_field(r, "tools")) {
    if (tools->is_string()) {
      extra["tools"] = io::parse_ordered_json(
          tools->get<std::string>(),
          cat("dataset '", path, "': line ", r.line, ": 'tools' (a string)"));
    } else {
      extra["tools"] = nlohmann::ordered_json::parse(tools->dump());
    }
  }
  if (const nlohmann::json* kw = row_field(r, "chat_template_kwargs")) {
    ONYX_CHECK(kw->is_object(), "dataset '", path, "': line ", r.line,
               ": 'chat_template_kwargs' must be an object");
    for (auto it = kw->begin(); it != kw->end(); ++it)
      extra[it.key()] = nlohmann::ordered_json::parse(it.value().dump());
  }
  return extra;
}

ChatTemplate::Rendered render_messages(const ChatTemplate& tmpl, const nlohmann::json& msgs,
                                       bool add_generation_prompt,
                                       const std::map<std::string, std::string>& special_tokens,
                                       const nlohmann::ordered_json& extra, const std::string& path,
                                       int64_t line) {
  try {
    return tmpl.render(chat_template_vars(nlohmann::ordered_json::parse(msgs.dump()),
                                          add_generation_prompt, special_tokens, extra));
  } catch (const Error& e) {
    throw Error(cat("dataset '", path, "': line ", line, ": ", e.what()));
  }
}

namespace {

// What encoding one SFT row reads besides the row.
struct SftRowContext {
  const Tokenizer& tok;
  const SftOptions& opts;
  const ChatTemplate* tmpl;  // null when the dataset has no chat template
  const std::string& path;
  bool& warned_prefix;  // completion_start warns once per dataset
};

// Byte offsets of each token in the text it was encoded from (token_bytes: a token's own bytes,
// also part of a UTF-8 character, where decode() of one token would give U+FFFD); the assistant
// mask marks the tokens overlapping a generation span.
std::vector<int64_t> assistant_mask(const SftRowContext& x, const std::vector<int64_t>& ids,
                                    const ChatTemplate::Rendered& r, int64_t line) {
  std::vector<size_t> ends(ids.size());
  size_t pos = 0;
  for (size_t t = 0; t < ids.size(); t++) ends[t] = pos += x.tok.token_bytes(ids[t]).size();
  ONYX_CHECK(pos == r.text.size(), "dataset '", x.path, "': line ", line,
             ": assistant_only_loss needs each token's place in the rendered text, and the "
             "tokenizer (",
             x.tok.source(), ") does not decode its tokens back to that text byte for byte");
  std::vector<int64_t> mask(ids.size(), 0);
  const auto& spans = r.generation_spans;
  size_t span = 0;
  for (size_t t = 0; t < ids.size(); t++) {
    const size_t begin = t ? ends[t - 1] : 0;
    while (span < spans.size() && begin >= spans[span].second) span++;
    if (span == spans.size()) break;
    if (ends[t] > spans[span].first) mask[t] = 1;
  }
  ONYX_CHECK(std::find(mask.begin(), mask.end(), 1) != mask.end(), "dataset '", x.path, "': line ",
             line,
             ": assistant_only_loss is set but the row has no assistant tokens (the chat "
             "template's {% generation %} blocks rendered nothing)");
  return mask;
}

// A conversational row ('messages', or 'prompt' / 'completion' as message lists) rendered with
// the chat template and tokenized as TRL does: its ids, and labels with -100 where no loss is
// taken (the prompt under completion_only_loss; outside the assistant turns under
// assistant_only_loss).
void encode_conversation(const SftRowContext& x, const Row& r, std::vector<int64_t>& ids,
                         std::vector<int64_t>& labels) {
  const nlohmann::json *messages = row_field(r, "messages"), *pj = row_field(r, "prompt"),
                       *cj = row_field(r, "completion");
  ONYX_CHECK(x.tmpl, "dataset '", x.path, "': line ", r.line,
             ": conversational rows need a chat template, and the tokenizer folder has "
             "none (no chat_template.jinja, no chat_template in tokenizer_config.json); set "
             "the dataset's chat_template to a .jinja file or a template");
  const nlohmann::ordered_json extra = template_extras(r, x.path);
  auto render = [&](const nlohmann::json& msgs, bool gen) {
    return render_messages(*x.tmpl, msgs, gen, x.opts.special_tokens, extra, x.path, r.line);
  };
  if (pj || cj) {
    ONYX_CHECK(is_messages(pj) && is_messages(cj), "dataset '", x.path, "': line ", r.line,
               ": 'prompt' and 'completion' must both be lists of messages ({role, content}) "
               "or both strings");
    ONYX_CHECK(!messages, "dataset '", x.path, "': line ", r.line,
               ": a row has either 'messages' or 'prompt' / 'completion', not both");
    const auto prompt_ids = x.tok.encode_ids(render(*pj, true).text);
    nlohmann::json all = *pj;
    for (auto& m : *cj) all.push_back(m);
    auto rendered = render(all, false);
    ids = x.tok.encode_ids(rendered.text);
    const size_t prompt_len = completion_start(prompt_ids, ids, x.warned_prefix, x.path);
    labels = ids;
    if (x.opts.completion_only_loss)
      for (size_t t = 0; t < prompt_len; t++) labels[t] = -100;
    if (x.opts.assistant_only_loss) {
      auto mask = assistant_mask(x, ids, rendered, r.line);
      for (size_t t = 0; t < ids.size(); t++)
        if (!mask[t]) labels[t] = -100;
    }
  } else {
    ONYX_CHECK(messages->is_array(), "dataset '", x.path, "': line ", r.line,
               ": 'messages' must be a list of {role, content} objects");
    auto rendered = render(*messages, false);
    ids = x.tok.encode_ids(rendered.text);
    labels = ids;
    if (x.opts.assistant_only_loss) {
      auto mask = assistant_mask(x, ids, rendered, r.line);
      for (size_t t = 0; t < ids.size(); t++)
        if (!mask[t]) labels[t] = -100;
    }
  }
}

// A text row ('text', or 'prompt' and 'completion' strings) as TRL tokenizes it: the
// end-of-sequence text appended (eos_text_of()), the prompt's tokens without loss under
// completion_only_loss.
void encode_text_row(const SftRowContext& x, const Row& r,
                     const std::function<std::string()>& eos_text_of, std::vector<int64_t>& ids,
                     std::vector<int64_t>& labels) {
  ONYX_CHECK(!x.opts.assistant_only_loss, "dataset '", x.path, "': line ", r.line,
             ": assistant_only_loss is only for conversational rows ('messages', or "
             "'prompt' / 'completion' as message lists)");
  auto text_of = [&](const char* key) -> std::optional<std::string> {
    const nlohmann::json* v = row_field(r, key);
    if (!v) return std::nullopt;
    ONYX_CHECK(v->is_string(), "dataset '", x.path, "': line ", r.line, ": '", key,
               "' must be a string");
    return v->get<std::string>();
  };
  auto text = text_of("text"), prompt = text_of("prompt"), completion = text_of("completion");
  ONYX_CHECK(text || (prompt && completion), "dataset '", x.path, "': line ", r.line,
             " has neither 'text' nor 'prompt' and 'completion'");
  // conversational rows end with the template's own end-of-turn; text rows get the eos text
  const std::string eos_text = eos_text_of();
  auto with_eos = [&](std::string s) {
    if (x.opts.add_eos && !ends_with(s, eos_text)) s += eos_text;
    return s;
  };
  auto encode = [&](const std::string& s) { return x.tok.encode(s).input_ids; };
  int64_t prompt_len = 0;
  if (text) {
    ids = encode(with_eos(*text));
  } else {
    const std::vector<int64_t> prompt_ids = encode(*prompt);
    ids = encode(*prompt + with_eos(*completion));
    prompt_len = (int64_t)completion_start(prompt_ids, ids, x.warned_prefix, x.path);
  }
  labels = ids;
  if (x.opts.completion_only_loss)
    for (int64_t i = 0; i < std::min<int64_t>(prompt_len, (int64_t)labels.size()); i++)
      labels[i] = -100;
}

}  // namespace

// The end-of-sequence text TRL appends: SFTConfig.eos_token, else tokenizer_config.json's, else
// (a folder without one) the token the tokenizer file names as its end of text. It must be a
// token of the tokenizer: TRL would add a new one, which the model's embedding does not have.
std::string SftDataset::sft_eos_text(const std::string& path, int64_t line) const {
  if (!opts_.add_eos) return "";
  std::string eos = opts_.eos_token;
  const char* from = "eos_token";
  if (eos.empty()) {
    auto it = opts_.special_tokens.find("eos_token");
    if (it != opts_.special_tokens.end())
      eos = it->second, from = "tokenizer_config.json's eos_token";
  }
  if (eos.empty()) {
    auto id = tok_->eos_id();
    ONYX_CHECK(id, "dataset '", path, "': line ", line, ": the tokenizer (", tok_->source(),
               ") has no end-of-text token to end this sample with (set eos_token, or add_eos "
               "false)");
    return tok_->token_bytes(*id);
  }
  ONYX_CHECK(tok_->token_id(eos), "dataset '", path, "': line ", line, ": ", from, " '", eos,
             "' is not a token of the tokenizer (", tok_->source(), ")");
  return eos;
}

SftDataset::SftDataset(const std::string& path, std::shared_ptr<const Tokenizer> tok,
                       SftOptions opts)
    : tok_(std::move(tok)), opts_(opts) {
  ONYX_CHECK(tok_, "dataset '", path, "': no tokenizer");
  ONYX_CHECK(opts_.max_length > 1, "dataset '", path, "': max_length must be at least 2");
  ONYX_CHECK(opts_.pad_multiple > 0, "dataset '", path, "': pad_multiple must be positive");
  TextClassificationOptions ro;
  ro.format = opts_.format;
  bool warned_prefix = false;
  std::unique_ptr<ChatTemplate> tmpl;
  if (!opts_.chat_template.empty())
    tmpl = std::make_unique<ChatTemplate>(opts_.chat_template, opts_.chat_template_origin.empty()
                                                                   ? "chat template"
                                                                   : opts_.chat_template_origin);
  ONYX_CHECK(!opts_.assistant_only_loss || !tmpl || tmpl->has_generation_markers(), "dataset '",
             path,
             "': assistant_only_loss needs a chat template that marks the assistant turns "
             "with {% generation %} ... {% endgeneration %}, and ",
             tmpl ? tmpl->name() : std::string("this one"),
             " has none (TRL swaps in its own training templates for some models; onyx does not)");
  int64_t dropped = 0;
  SftRowContext x{*tok_, opts_, tmpl.get(), path, warned_prefix};
  for (auto& r : read_rows(path, ro)) {
    conversations_to_messages(r, path);
    const bool conversational = row_field(r, "messages") || is_messages(row_field(r, "prompt")) ||
                                is_messages(row_field(r, "completion"));
    std::vector<int64_t> ids, labels;
    if (conversational)
      encode_conversation(x, r, ids, labels);
    else
      encode_text_row(
          x, r, [&] { return sft_eos_text(path, r.line); }, ids, labels);
    if ((int64_t)ids.size() > opts_.max_length) {
      ids.resize(opts_.max_length);
      labels.resize(opts_.max_length);
    }
    // TRL drops the rows truncation left without a token that carries loss (not when packing)
    if (!opts_.packing &&
        std::all_of(labels.begin(), labels.end(), [](int64_t l) { return l == -100; })) {
      dropped++;
      continue;
    }
    ids_.push_back(std::move(ids));
    labels_.push_back(std::move(labels));
  }
  ONYX_CHECK(!ids_.empty(), "dataset '", path, "' has no rows",
             dropped ? cat(" with a token that carries loss (", dropped,
                           " rows are all prompt within max_length ", opts_.max_length, ")")
                     : std::string());
  for (auto& row : ids_) {
    std::vector<int64_t> p(row.size());
    for (size_t t = 0; t < p.size(); t++) p[t] = (int64_t)t;
    pos_.push_back(std::move(p));
  }
  if (opts_.packing) pack_rows();
}

// packing: consecutive rows into rows of at most max_length tokens, position_ids restarting per
// sample (the Llama-family graphs read the sample boundaries from them), each sample's first
// label dropped (it is not predicted from the previous sample's last token).
void SftDataset::pack_rows() {
  std::vector<std::vector<int64_t>> ids, labels, pos;
  for (size_t i = 0; i < ids_.size(); i++) {
    const int64_t n = (int64_t)ids_[i].size();
    if (ids.empty() || (int64_t)ids.back().size() + n > opts_.max_length) {
      ids.emplace_back();
      labels.emplace_back();
      pos.emplace_back();
    } else {
      labels_[i][0] = -100;  // not predicted from the previous sample's last token
    }
    ids.back().insert(ids.back().end(), ids_[i].begin(), ids_[i].end());
    labels.back().insert(labels.back().end(), labels_[i].begin(), labels_[i].end());
    pos.back().insert(pos.back().end(), pos_[i].begin(), pos_[i].end());
  }
  ids_ = std::move(ids);
  labels_ = std::move(labels);
  pos_ = std::move(pos);
}

std::map<std::string, Tensor> SftDataset::batch(const std::vector<int64_t>& indices) const {
  int64_t longest = 1;
  for (int64_t i : indices) {
    ONYX_CHECK(i >= 0 && i < size(), "SFT dataset: index ", i, " out of range (", size(), " rows)");
    longest = std::max<int64_t>(longest, (int64_t)ids_[i].size());
  }
  const int64_t m = opts_.pad_multiple;
  const int64_t L = std::min(opts_.max_length, (longest + m - 1) / m * m);
  const int64_t B = (int64_t)indices.size();
  std::vector<int64_t> ids(B * L, tok_->pad_id()), mask(B * L, 0), labels(B * L, -100),
      pos(B * L, 0);
  for (int64_t b = 0; b < B; ++b) {
    const auto& x = ids_[indices[b]];
    const auto& y = labels_[indices[b]];
    const auto& p = pos_[indices[b]];
    for (size_t t = 0; t < x.size(); t++) {
      ids[b * L + t] = x[t];
      mask[b * L + t] = 1;
      labels[b * L + t] = y[t];
      pos[b * L + t] = p[t];
    }
  }
  auto make = [&](const std::vector<int64_t>& v) {
    return Tensor::from_vector<int64_t>(DType::Int64, {B, L}, v);
  };
  std::map<std::string, Tensor> out = {
      {"input_ids", make(ids)}, {"attention_mask", make(mask)}, {"labels", make(labels)}};
  if (opts_.packing) out["position_ids"] = make(pos);
  return out;
}

std::vector<int64_t> TextClassificationDataset::lengths(const std::string&) const {
  std::vector<int64_t> out;
  for (const Encoding& e : encodings_) out.push_back(e.size());
  return out;
}

std::vector<int64_t> CausalLMDataset::lengths(const std::string&) const {
  const int64_t bs = opts_.block_size, n = (int64_t)tokens_.size();
  std::vector<int64_t> out(num_blocks_);
  for (int64_t b = 0; b < num_blocks_; b++) out[b] = std::min(bs, n - b * bs);
  return out;
}

std::vector<int64_t> SftDataset::lengths(const std::string&) const {
  std::vector<int64_t> out;
  for (const auto& row : ids_) out.push_back((int64_t)row.size());
  return out;
}

}  // namespace onyx::data
