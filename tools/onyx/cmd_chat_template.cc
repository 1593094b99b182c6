// cmd_chat_template.cc — `onyx chat-template PATH --messages FILE [--add-generation-prompt]`:
// renders a conversation with a model folder's chat template (data/chat_template.h), as
// Transformers' tokenizer.apply_chat_template(messages, tokenize=False) does. PATH is a model or
// tokenizer folder (chat_template.jinja or tokenizer_config.json) or a .jinja file. --cases FILE
// renders many: JSONL rows {"messages": [...], "add_generation_prompt": bool, "vars": {...}},
// one JSON line out per row: {"text": ..., "generation": [[begin, end], ...]} (byte ranges) or
// {"error": ...}. --sft FILE tokenizes an SFT dataset (`train_data: {type: sft}` rows) with
// PATH's tokenizer and template and prints each row's {"input_ids", "labels"}; --dpo FILE a
// preference dataset (`train_data: {type: preference}` rows: prompt / chosen / rejected) and
// prints each pair's {"prompt_ids", "chosen_ids", "rejected_ids"} and its two sequences as batched
// ({"chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels"}); --grpo FILE
// GRPO's prompts (`train_data: {type: prompts}` rows) and prints each row's {"prompt_ids"}.
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "data/chat_template.h"
#include "data/preference_dataset.h"
#include "data/prompt_dataset.h"
#include "data/text_datasets.h"
#include "io/json.h"
#include "onyx/error.h"
#include "tokenizers/tokenizer.h"

namespace onyx::cli {

namespace {
nlohmann::ordered_json parse_json(const std::string& text, const std::string& what) {
  return io::parse_ordered_json(text, what);
}
}  // namespace

Action add_chat_template_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat-template",
                                 "render a conversation with a model folder's chat template, as "
                                 "Transformers' apply_chat_template(tokenize=False)");
  struct Opts {
    std::string path, messages, cases, vars, sft, dpo, grpo, eos_token,
        truncation_mode = "keep_start";
    bool gen = false, assistant_only = false, no_completion_only = false;
    int64_t max_length = 1024;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("path", o->path, "a model / tokenizer folder, or a .jinja file")->required();
  cmd->add_option("--messages", o->messages, "a JSON file holding the list of messages");
  cmd->add_flag("--add-generation-prompt", o->gen, "end with the assistant turn's header");
  cmd->add_option("--vars", o->vars, "a JSON object of extra template variables");
  cmd->add_option("--cases", o->cases, "a JSONL file of cases (see `onyx chat-template --help`)");
  cmd->add_option("--sft", o->sft, "an SFT dataset file: print each row's input_ids and labels");
  cmd->add_option("--dpo", o->dpo,
                  "a preference dataset file: print each pair's prompt / chosen / rejected ids");
  cmd->add_option("--grpo", o->grpo, "a GRPO prompt dataset file: print each row's prompt ids");
  cmd->add_option("--truncation-mode", o->truncation_mode,
                  "--dpo: keep_start (default) or keep_end");
  cmd->add_flag("--assistant-only-loss", o->assistant_only, "--sft: loss on assistant turns only");
  cmd->add_flag("--no-completion-only-loss", o->no_completion_only,
                "--sft: loss on the prompt tokens too");
  cmd->add_option("--max-length", o->max_length,
                  "--sft, --dpo: truncation length (default 1024; --dpo: 0 for none)");
  cmd->add_option("--eos-token", o->eos_token,
                  "--sft: the text ending plain-text rows (SFTConfig.eos_token; default: "
                  "tokenizer_config.json's eos_token)");
  return [o]() {
    auto files = data::find_chat_template(o->path);
    nlohmann::ordered_json vars =
        o->vars.empty() ? nlohmann::ordered_json() : parse_json(o->vars, "--vars");
    ONYX_CHECK((int)!o->messages.empty() + (int)!o->cases.empty() + (int)!o->sft.empty() +
                       (int)!o->dpo.empty() + (int)!o->grpo.empty() ==
                   1,
               "give exactly one of --messages FILE, --cases FILE, --sft FILE, --dpo FILE and "
               "--grpo FILE");
    if (!o->grpo.empty()) {
      data::PromptOptions po;
      po.chat_template = files.source;
      po.chat_template_origin = files.origin;
      po.special_tokens = files.special_tokens;
      data::PromptDataset ds(o->grpo, tokenizers::load_tokenizer(o->path), po);
      for (int64_t i = 0; i < ds.size(); i++)
        std::cout << nlohmann::json{{"prompt_ids", ds.prompt_ids(i)}}.dump() << "\n";
      return 0;
    }
    if (!o->dpo.empty()) {
      data::PreferenceOptions po;
      po.chat_template = files.source;
      po.chat_template_origin = files.origin;
      po.special_tokens = files.special_tokens;
      po.max_length = o->max_length;
      po.truncation_mode = o->truncation_mode;
      data::PreferenceDataset ds(o->dpo, tokenizers::load_tokenizer(o->path), po);
      for (int64_t i = 0; i < ds.size(); i++) {
        std::vector<int64_t> cl, rl;
        auto c = ds.sequence(i, true, &cl), r = ds.sequence(i, false, &rl);
        nlohmann::ordered_json row = {{"prompt_ids", ds.prompt_ids(i)},
                                      {"chosen_ids", ds.chosen_ids(i)},
                                      {"rejected_ids", ds.rejected_ids(i)},
                                      {"chosen_input_ids", c},
                                      {"chosen_labels", cl},
                                      {"rejected_input_ids", r},
                                      {"rejected_labels", rl}};
        std::cout << row.dump() << "\n";
      }
      return 0;
    }
    if (!o->sft.empty()) {
      data::SftOptions so;
      so.chat_template = files.source;
      so.chat_template_origin = files.origin;
      so.special_tokens = files.special_tokens;
      so.assistant_only_loss = o->assistant_only;
      so.completion_only_loss = !o->no_completion_only;
      so.max_length = o->max_length;
      so.eos_token = o->eos_token;
      data::SftDataset ds(o->sft, tokenizers::load_tokenizer(o->path), so);
      for (int64_t i = 0; i < ds.size(); i++) {
        nlohmann::json row = {{"input_ids", ds.ids(i)}, {"labels", ds.labels(i)}};
        std::cout << row.dump() << "\n";
      }
      return 0;
    }
    ONYX_CHECK(!files.source.empty(), "'", o->path,
               "' has no chat template (no chat_template.jinja, no chat_template in "
               "tokenizer_config.json)");
    data::ChatTemplate tmpl(files.source, files.origin);
    if (!o->messages.empty()) {
      auto msgs = parse_json(tokenizers::read_text_file(o->messages), "'" + o->messages + "'");
      auto r = tmpl.render(data::chat_template_vars(msgs, o->gen, files.special_tokens, vars));
      std::cout << r.text << std::flush;
      return 0;
    }
    std::ifstream in(o->cases);
    ONYX_CHECK(in, "cannot open '", o->cases, "'");
    std::string line;
    for (int64_t lineno = 1; std::getline(in, line); lineno++) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      auto c = parse_json(line, cat("'", o->cases, "' line ", lineno));
      nlohmann::ordered_json out = nlohmann::ordered_json::object();
      try {
        nlohmann::ordered_json extra = vars.is_object() ? vars : nlohmann::ordered_json::object();
        if (c.contains("vars"))
          for (auto it = c["vars"].begin(); it != c["vars"].end(); ++it)
            extra[it.key()] = it.value();
        auto r = tmpl.render(data::chat_template_vars(c.at("messages"),
                                                      c.value("add_generation_prompt", false),
                                                      files.special_tokens, extra));
        out["text"] = r.text;
        out["generation"] = r.generation_spans;
      } catch (const std::exception& e) {
        out["error"] = e.what();
      }
      std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
    return 0;
  };
}

}  // namespace onyx::cli
