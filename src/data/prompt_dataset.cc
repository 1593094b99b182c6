// data/prompt_dataset.cc — see prompt_dataset.h.
#include "data/prompt_dataset.h"

#include "data/text_rows.h"
#include "onyx/error.h"

namespace onyx::data {

PromptDataset::PromptDataset(const std::string& path,
                             std::shared_ptr<const tokenizers::Tokenizer> tok, PromptOptions opts)
    : path_(path), tok_(std::move(tok)) {
  ONYX_CHECK(tok_, "dataset '", path, "': no tokenizer");
  std::unique_ptr<ChatTemplate> tmpl;
  if (!opts.chat_template.empty())
    tmpl = std::make_unique<ChatTemplate>(opts.chat_template, opts.chat_template_origin.empty()
                                                                  ? "chat template"
                                                                  : opts.chat_template_origin);
  TextClassificationOptions ro;
  ro.format = opts.format;
  for (Row& row : read_rows(path, ro)) {
    conversations_to_messages(row, path);
    const nlohmann::json* p = row_field(row, "prompt");
    ONYX_CHECK(p, "dataset '", path, "': line ", row.line,
               ": a GRPO row needs a 'prompt' (a string or a list of messages)");
    std::vector<int64_t> ids;
    if (is_messages(p)) {
      ONYX_CHECK(tmpl, "dataset '", path, "': line ", row.line,
                 ": conversational prompts need a chat template, and the tokenizer folder has "
                 "none (no chat_template.jinja, no chat_template in tokenizer_config.json); set "
                 "the dataset's chat_template");
      ids = tok_->encode_ids(render_messages(*tmpl, *p, true, opts.special_tokens,
                                             template_extras(row, path), path, row.line)
                                 .text);
    } else {
      ONYX_CHECK(p->is_string(), "dataset '", path, "': line ", row.line,
                 ": 'prompt' must be a string or a list of messages ({role, content})");
      ids = tok_->encode(p->get<std::string>()).input_ids;
    }
    ONYX_CHECK(!ids.empty(), "dataset '", path, "': line ", row.line,
               ": the prompt has no tokens (generation needs at least one)");
    conversational_.push_back(is_messages(p) ? 1 : 0);
    ids_.push_back(std::move(ids));
    rows_.push_back(std::move(row.obj));
    lines_.push_back(row.line);
  }
  ONYX_CHECK(!ids_.empty(), "dataset '", path, "' has no prompts");
}

}  // namespace onyx::data
