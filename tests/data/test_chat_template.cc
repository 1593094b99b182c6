// test_chat_template.cc — the chat template engine (data/chat_template.h): whitespace control and
// Transformers' trim_blocks / lstrip_blocks, loops, scoping, macros, expressions, filters and
// methods, Python's printing of values, errors naming line and column, template discovery in a
// model folder; and conversational SFT rows (messages, prompt / completion message lists,
// assistant_only_loss through {% generation %}). tests/cli/test_chat_template.py compares the same
// engine with Transformers and TRL.
#include <gtest/gtest.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>

#include "config/run_config.h"
#include "data/chat_template.h"
#include "data/text_datasets.h"
#include "onyx/error.h"
#include "tokenizers/bpe.h"

namespace fs = std::filesystem;
using namespace onyx;
using namespace onyx::data;
using namespace onyx::tokenizers;
using json = nlohmann::ordered_json;

namespace {

using I = std::vector<int64_t>;

std::string render(const std::string& tmpl, const json& vars = json::object()) {
  return ChatTemplate(tmpl, "t.jinja").render(vars).text;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}
std::string render_error(const std::string& tmpl, const json& vars = json::object()) {
  return error_of([&] { render(tmpl, vars); });
}

const json kChat = json::parse(R"([
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": "Hi"},
  {"role": "assistant", "content": "Hello."}
])");

struct TmpDir {
  std::string path;
  explicit TmpDir(const std::string& name) {
    path =
        (fs::temp_directory_path() / ("onyx_test_chat_" + std::to_string(::getpid()) + "_" + name))
            .string();
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    std::string p = path + "/" + name;
    std::ofstream f(p, std::ios::binary);
    f << text;
    return p;
  }
};

// Byte tokens 0..255, <|endoftext|> 256, <|im_start|> 257, <|im_end|> 258 (no merges: one token
// per byte, so expected ids are the rendered text's bytes).
std::shared_ptr<BpeTokenizer> chat_bpe() {
  std::unordered_map<std::string, int64_t> vocab;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    unicode::append_utf8(BpeTokenizer::byte_to_unicode((uint8_t)b), s);
    vocab[s] = b;
  }
  vocab["<|endoftext|>"] = 256;
  vocab["<|im_start|>"] = 257;
  vocab["<|im_end|>"] = 258;
  auto tok = std::make_shared<BpeTokenizer>(
      vocab, std::vector<std::pair<std::string, std::string>>{}, BpeConfig{}, "test BPE");
  tok->add_special_token("<|im_start|>", 257);
  tok->add_special_token("<|im_end|>", 258);
  return tok;
}

// The ids chat_bpe gives `text`: bytes, with the two ChatML markers as one token each.
I ids_of(const std::string& text) {
  I out;
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, 12, "<|im_start|>") == 0) {
      out.push_back(257);
      i += 12;
    } else if (text.compare(i, 10, "<|im_end|>") == 0) {
      out.push_back(258);
      i += 10;
    } else {
      out.push_back((unsigned char)text[i++]);
    }
  }
  return out;
}

const char* kChatml =
    "{%- for m in messages %}\n"
    "    {{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}\n";

const char* kChatmlGen =
    "{%- for m in messages %}\n"
    "    {%- if m.role == 'assistant' %}\n"
    "        {{- '<|im_start|>assistant\\n' }}\n"
    "        {%- generation %}{{ m.content + '<|im_end|>' }}{% endgeneration %}\n"
    "        {{- '\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n";

}  // namespace

TEST(ChatTemplate, TrimBlocksAndLstripBlocksAsTransformers) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before one;
  // a {{ }} keeps both; '+' turns them off, '-' strips all whitespace on its side.
  EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\nc"), "a\n  b\nc");
  EXPECT_EQ(render("  {{ 'x' }}\n"), "  x");  // one trailing newline of the source is dropped
  EXPECT_EQ(render("  {{ 'x' }}\n\n"), "  x\n");
  EXPECT_EQ(render("a  {%- if true %}  b  {% endif -%}  c"), "a  b  c");
  EXPECT_EQ(render("x\n  {%+ if true %}y{% endif +%}\nz"), "x\n  y\nz");
  EXPECT_EQ(render("a {{- ' b ' -}} c"), "a b c");
  EXPECT_EQ(render("a\n  {# note #}\nb"), "a\nb");
  EXPECT_EQ(render("a\r\nb\rc"), "a\nb\nc");
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
  EXPECT_EQ(render("q {% if true %}x{% endif %} r"), "q x r");  // not at a line start: kept
}

TEST(ChatTemplate, LoopsScopesAndMacros) {
  json vars = {{"messages", kChat}};
  EXPECT_EQ(render("{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
                   "{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
                   vars),
            "103TrueFalse3|212FalseFalse3|321FalseTrue3|");
  EXPECT_EQ(render("{% for m in messages if m.role != 'system' %}{{ loop.index }}{{ m.role[0] }}"
                   "{% endfor %}{% for x in [] %}x{% else %}none{% endfor %}",
                   vars),
            "1u2anone");
  EXPECT_EQ(render("{% for m in messages %}{{ (loop.previtem or {'role': '-'}).role }}{% endfor %}",
                   vars),
            "-systemuser");
  EXPECT_EQ(render("{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}"
                   "{% if i == 3 %}{% break %}{% endif %}{% endfor %}"),
            "023");
  // a set inside a loop does not leave it (each iteration starts from the outer value); inside
  // an if it does; a namespace carries values out of loops
  EXPECT_EQ(render("{% set c = 0 %}{% for i in range(3) %}{% set c = c + 1 %}{{ c }}{% endfor %}"
                   "{{ c }}{% if true %}{% set d = 5 %}{% endif %}{{ d }}"),
            "11105");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}"
                   "{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(render("{% macro tag(name, v='d') %}<{{ name }}={{ v }}>{% endmacro %}"
                   "{{ tag('a') }}{{ tag('b', 'x') }}{{ tag(v='y', name='c') }}"),
            "<a=d><b=x><c=y>");
  EXPECT_EQ(render("{% set s %}in {{ 1 + 1 }}{% endset %}[{{ s }}]{% set a, b = 1, 2 %}{{ b }}"),
            "[in 2]2");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% endfor %}"), "a1b2");
}

TEST(ChatTemplate, ExpressionsPrintAsPython) {
  EXPECT_EQ(render("{{ 1 + 2 * 3 }} {{ 7 / 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 8 }} "
                   "{{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 3.0 }} {{ 'ab' * 2 }}"),
            "7 3.5 -4 2 256 0.30000000000000004 1e+20 1e-05 3.0 abab");
  EXPECT_EQ(render("{{ [1, 'a', none, true, 2.5] }} {{ {'k': [1]} }} {{ ('t',) }} {{ none }}"),
            "[1, 'a', None, True, 2.5] {'k': [1]} ('t',) None");
  EXPECT_EQ(render("{{ \"it's\" }} {{ ['it\\'s'] }} {{ 'a\\tb\\u00e9\\x41' }}"),
            "it's [\"it's\"] a\tb\xC3\xA9"
            "A");
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 'x' in 'xyz' }} {{ 3 not in [1] }} {{ 1 == 1.0 }} "
                   "{{ [] or 'e' }} {{ 'y' if 0 else 'n' }} {{ 'a' ~ 1 ~ none }}"),
            "True True True True e n a1None");
  // strings index, slice and measure by code point
  EXPECT_EQ(render("{{ s[1] }}|{{ s[1:3] }}|{{ s[::-1] }}|{{ s|length }}", {{"s", "h\u00e9llo"}}),
            "\u00e9|\u00e9l|oll\u00e9h|5");
  // undefined: prints empty, is falsy, has length 0, iterates as nothing, is not 'defined'
  EXPECT_EQ(render("[{{ x }}{{ x|length }}{{ x is defined }}{% for a in x %}z{% endfor %}"
                   "{{ x|default('d') }}{{ 'n' if not x }}]"),
            "[0Falsedn]");
}

TEST(ChatTemplate, FiltersAndMethods) {
  json vars = {{"messages", kChat}};
  EXPECT_EQ(render("{{ messages|map(attribute='role')|join(',') }}|"
                   "{{ messages|selectattr('role', 'equalto', 'user')|list|length }}|"
                   "{{ messages|rejectattr('role', 'eq', 'user')|map(attribute='role')|first }}|"
                   "{{ messages|last|items|list|length }}",
                   vars),
            "system,user,assistant|1|system|2");
  EXPECT_EQ(
      render("{{ '  a  '|trim }}|{{ 'hi there'|title }}|{{ 'hELLO'|capitalize }}|"
             "{{ 'Ab'|upper }}{{ 'Ab'|lower }}|{{ 'aaa'|replace('a', 'b', 2) }}|"
             "{{ '42'|int + 1 }}|{{ 12|string }}|{{ [3, 1, 2]|sort }}|{{ [1, 1, 2]|unique|list }}"),
      "a|Hi There|Hello|ABab|bba|43|12|[1, 2, 3]|[1, 2]");
  EXPECT_EQ(render("{{ {'b': 'é', 'a': [1, 2.0, none]}|tojson }}|{{ {'a': 1}|tojson(indent=2) }}"),
            "{\"b\": \"\u00e9\", \"a\": [1, 2.0, null]}|{\n  \"a\": 1\n}");
  EXPECT_EQ(
      render("{{ ' x '.strip() }}|{{ 'a,b'.split(',') }}|{{ ' a  b '.split() }}|"
             "{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}|"
             "{{ {'a': 1}.get('b', 'z') }}|{{ {'a': 1}.keys()|list }}|{{ '-'.join(['p', 'q']) }}"),
      "x|['a', 'b']|['a', 'b']|TrueTrue|z|['a']|p-q");
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  EXPECT_EQ(render("{{ strftime_now('%Y') }}"), std::to_string(1900 + tm.tm_year));
}

TEST(ChatTemplate, ErrorsNameLineAndColumn) {
  std::string e = render_error("line one\n{{ x | nope }}");
  EXPECT_NE(e.find("t.jinja: line 2, column 8"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown filter 'nope'"), std::string::npos) << e;
  e = render_error("ok\n  {% if true %}\nnever closed");
  EXPECT_NE(e.find("line 2, column 3"), std::string::npos) << e;
  EXPECT_NE(e.find("'if' block is never closed"), std::string::npos) << e;
  EXPECT_NE(e.find("'endif'"), std::string::npos) << e;
  e = render_error("{% for m in messages %}x");
  EXPECT_NE(e.find("'for' block is never closed"), std::string::npos) << e;
  e = render_error("{{ 'open' ");
  EXPECT_NE(e.find("never closed with '}}'"), std::string::npos) << e;
  e = render_error("{% endif %}");
  EXPECT_NE(e.find("unknown tag 'endif'"), std::string::npos) << e;
  e = render_error("{% include 'x' %}");
  EXPECT_NE(e.find("'include' tag is not supported"), std::string::npos) << e;
  e = render_error("{% break %}");
  EXPECT_NE(e.find("'break' outside of a loop"), std::string::npos) << e;
  e = render_error("{{ x is fancy }}");
  EXPECT_NE(e.find("unknown test 'fancy'"), std::string::npos) << e;
  e = render_error("{# open comment");
  EXPECT_NE(e.find("missing end of comment tag"), std::string::npos) << e;
  e = render_error("{{ 'unterminated }}");
  EXPECT_NE(e.find("unterminated string"), std::string::npos) << e;
  // runtime errors: raise_exception's message, an undefined value's attribute, a type error
  e = render_error("a\n  {{ raise_exception('roles must alternate') }}");
  EXPECT_NE(e.find("line 2, column 6"), std::string::npos) << e;
  EXPECT_NE(e.find("roles must alternate"), std::string::npos) << e;
  e = render_error("{{ missing.attr }}");
  EXPECT_NE(e.find("'missing' is undefined"), std::string::npos) << e;
  e = render_error("{{ 1 + 'a' }}");
  EXPECT_NE(e.find("unsupported operand type(s) for +: 'int' and 'str'"), std::string::npos) << e;
  e = render_error("{% set ns = 1 %}{% set ns.x = 2 %}");
  EXPECT_NE(e.find("non-namespace"), std::string::npos) << e;
}

TEST(ChatTemplate, RenderChatAndGenerationSpans) {
  std::string out = render_chat(kChatml, kChat, true, "<s>", "</s>");
  EXPECT_EQ(out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render_chat("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}{{ x }}", kChat,
                        false, "<s>", "</s>", json{{"x", 7}}),
            "<s>Be brief.</s>7");
  // null-valued keys are dropped, as Transformers does before rendering
  EXPECT_EQ(render_chat("{{ messages[0].name is defined }}",
                        json::parse(R"([{"role": "user", "content": "a", "name": null}])"), false,
                        "", ""),
            "False");
  ChatTemplate t(kChatmlGen);
  EXPECT_TRUE(t.has_generation_markers());
  EXPECT_FALSE(ChatTemplate(kChatml).has_generation_markers());
  auto r = t.render(chat_template_vars(kChat, false, {}));
  ASSERT_EQ(r.generation_spans.size(), 1u);
  auto [b, e] = r.generation_spans[0];
  EXPECT_EQ(r.text.substr(b, e - b), "Hello.<|im_end|>");
  EXPECT_NE(error_of([] { render_chat(kChatml, json::array(), false, "", ""); }).find("empty"),
            std::string::npos);
}

TEST(ChatTemplate, FoundInAModelFolderAsTransformersFindsIt) {
  TmpDir d("find");
  d.write("tokenizer_config.json",
          R"({"chat_template": "from config", "bos_token": {"content": "<s>", "special": true},
              "eos_token": "</s>"})");
  auto f = find_chat_template(d.path);
  EXPECT_EQ(f.source, "from config");
  EXPECT_EQ(f.special_tokens.at("bos_token"), "<s>");
  EXPECT_EQ(f.special_tokens.at("eos_token"), "</s>");
  d.write("chat_template.jinja", "from jinja");  // Transformers 5's file wins
  EXPECT_EQ(find_chat_template(d.path).source, "from jinja");
  EXPECT_EQ(find_chat_template(d.path + "/tokenizer_config.json").source, "from jinja");
  TmpDir l("list");
  l.write("tokenizer_config.json",
          R"({"chat_template": [{"name": "tool_use", "template": "T"},
                                {"name": "default", "template": "D"}]})");
  EXPECT_EQ(find_chat_template(l.path).source, "D");
  l.write("tokenizer_config.json", R"({"chat_template": [{"name": "rag", "template": "R"}]})");
  auto e = error_of([&] { find_chat_template(l.path); });
  EXPECT_NE(e.find("none named 'default' (rag)"), std::string::npos) << e;
  d.write("special_tokens_map.json", R"({"eos_token": {"content": "<|eot|>"}})");
  EXPECT_EQ(find_chat_template(d.path).special_tokens.at("eos_token"), "<|eot|>");  // legacy map
  EXPECT_EQ(find_chat_template(d.path).special_tokens.at("bos_token"), "<s>");
  TmpDir none("none");
  none.write("tokenizer_config.json", "{}");
  EXPECT_TRUE(find_chat_template(none.path).source.empty());
}

TEST(SftChat, MessagesRowsAreRenderedAndCarryLossEverywhere) {
  TmpDir d("sftmsg");
  auto path = d.write(
      "chat.jsonl",
      R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]})"
      "\n"
      R"({"conversations": [{"from": "user", "value": "Q"}, {"from": "assistant", "value": "A"}]})"
      "\n"
      R"({"text": "plain"})"
      "\n");
  SftOptions o;
  o.chat_template = kChatml;
  SftDataset ds(path, chat_bpe(), o);
  ASSERT_EQ(ds.size(), 3);
  const I want0 = ids_of("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n");
  EXPECT_EQ(ds.ids(0), want0);  // no end-of-text appended: the template ends the turn
  EXPECT_EQ(ds.labels(0), want0);
  EXPECT_EQ(ds.ids(1),
            ids_of("<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"));
  EXPECT_EQ(ds.labels(2), (I{'p', 'l', 'a', 'i', 'n', 256}));  // text rows as before

  // a tokenizer without an end-of-text token: conversational rows need none, text rows do
  std::unordered_map<std::string, int64_t> vocab;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    unicode::append_utf8(BpeTokenizer::byte_to_unicode((uint8_t)b), s);
    vocab[s] = b;
  }
  auto no_eos = std::make_shared<BpeTokenizer>(
      vocab, std::vector<std::pair<std::string, std::string>>{}, BpeConfig{}, "no-eos BPE");
  ASSERT_FALSE(no_eos->eos_id());
  auto chat_only = d.write("chat_only.jsonl", R"({"messages": [{"role": "user", "content": "Hi"}]})"
                                              "\n");
  const std::string turn = "<|im_start|>user\nHi<|im_end|>\n";  // bytes: no special tokens here
  EXPECT_EQ(SftDataset(chat_only, no_eos, o).ids(0), I(turn.begin(), turn.end()));
  auto e = error_of([&] { SftDataset x(path, no_eos, o); });
  EXPECT_NE(e.find("line 3"), std::string::npos) << e;
  EXPECT_NE(e.find("no end-of-text token"), std::string::npos) << e;

  o.chat_template.clear();
  e = error_of([&] { SftDataset x(path, chat_bpe(), o); });
  EXPECT_NE(e.find("line 1"), std::string::npos) << e;
  EXPECT_NE(e.find("need a chat template"), std::string::npos) << e;
}

TEST(SftChat, ConversationalPromptCompletionMasksThePrompt) {
  TmpDir d("sftpc");
  auto path = d.write(
      "pc.jsonl",
      R"({"prompt": [{"role": "user", "content": "Hi"}], "completion": [{"role": "assistant", "content": "Yo"}]})"
      "\n");
  SftOptions o;
  o.chat_template = kChatml;
  SftDataset ds(path, chat_bpe(), o);
  // the prompt rendered with the generation prompt is a prefix of the whole conversation's ids;
  // the completion "Yo<|im_end|>\n" alone carries loss
  const I prompt = ids_of("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const I completion = ids_of("Yo<|im_end|>\n");
  I ids = prompt, labels(prompt.size(), -100);
  ids.insert(ids.end(), completion.begin(), completion.end());
  labels.insert(labels.end(), completion.begin(), completion.end());
  EXPECT_EQ(ds.ids(0), ids);
  EXPECT_EQ(ds.labels(0), labels);
  o.completion_only_loss = false;
  EXPECT_EQ(SftDataset(path, chat_bpe(), o).labels(0), ids);
  // truncation inside the prompt leaves nothing to learn: TRL drops the row
  o.completion_only_loss = true;
  o.max_length = (int64_t)prompt.size();
  auto e = error_of([&] { SftDataset x(path, chat_bpe(), o); });
  EXPECT_NE(e.find("no rows with a token that carries loss (1 rows are all prompt"),
            std::string::npos)
      << e;
  o.max_length = (int64_t)prompt.size() + 1;
  EXPECT_EQ(SftDataset(path, chat_bpe(), o).labels(0).back(), 'Y');
  o.max_length = 1024;
  auto bad = d.write("bad.jsonl",
                     R"({"prompt": [{"role": "user", "content": "Hi"}], "completion": "text"})"
                     "\n");
  e = error_of([&] { SftDataset x(bad, chat_bpe(), o); });
  EXPECT_NE(e.find("must both be lists of messages"), std::string::npos) << e;
}

TEST(SftChat, AssistantOnlyLossUsesGenerationSpans) {
  TmpDir d("sftaol");
  auto path = d.write(
      "chat.jsonl",
      R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}, {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]})"
      "\n");
  SftOptions o;
  o.chat_template = kChatmlGen;
  o.assistant_only_loss = true;
  SftDataset ds(path, chat_bpe(), o);
  // labels: the generation blocks "Yo<|im_end|>" and "A<|im_end|>", nothing else
  I ids, labels;
  auto add = [&](const std::string& text, bool loss) {
    for (int64_t id : ids_of(text)) {
      ids.push_back(id);
      labels.push_back(loss ? id : -100);
    }
  };
  add("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", false);
  add("Yo<|im_end|>", true);
  add("\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n", false);
  add("A<|im_end|>", true);
  add("\n", false);
  EXPECT_EQ(ds.ids(0), ids);
  EXPECT_EQ(ds.labels(0), labels);

  o.chat_template = kChatml;  // no {% generation %}: TRL would need its own training template
  auto e = error_of([&] { SftDataset x(path, chat_bpe(), o); });
  EXPECT_NE(e.find("{% generation %}"), std::string::npos) << e;
  o.chat_template = kChatmlGen;
  auto text = d.write("text.jsonl", "{\"text\": \"x\"}\n");
  e = error_of([&] { SftDataset x(text, chat_bpe(), o); });
  EXPECT_NE(e.find("only for conversational rows"), std::string::npos) << e;
}

TEST(SftChat, RunConfigTakesTheTokenizerFoldersTemplateOrItsOwn) {
  TmpDir d("sftcfg");
  // a byte-level BPE folder (vocab.json + merges.txt, no merges) with a chat template in
  // tokenizer_config.json
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    unicode::append_utf8(BpeTokenizer::byte_to_unicode((uint8_t)b), s);
    vocab[s] = b;
  }
  vocab["<|endoftext|>"] = 256;
  fs::create_directories(d.path + "/tok");
  d.write("tok/vocab.json", vocab.dump());
  d.write("tok/merges.txt", "#version: 0.2\n");
  d.write("tok/tokenizer_config.json",
          R"({"chat_template": "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}",
              "eos_token": "<|endoftext|>"})");
  d.write("chat.jsonl", R"({"messages": [{"role": "user", "content": "hi"}]})"
                        "\n");
  d.write("own.jinja", "{{ messages[0].content|upper }}{{ eos_token }}");
  config::RunConfig c;
  c.path = d.path + "/config.yaml";
  c.dir = d.path;
  auto ids_of_spec = [&](const std::string& extra) {
    config::DataSpec spec;
    spec.spec = "{type: sft, path: chat.jsonl, tokenizer: tok" + extra + "}";
    auto ds = config::dataset_from_spec(spec, c, "train_data");
    auto* sft = dynamic_cast<SftDataset*>(ds.get());
    EXPECT_NE(sft, nullptr);
    return sft ? sft->ids(0) : I{};
  };
  auto bytes = [](const std::string& s) { return I(s.begin(), s.end()); };
  EXPECT_EQ(ids_of_spec(""), bytes("[user:hi]"));
  I own = bytes("HI");
  own.push_back(256);  // eos_token from tokenizer_config.json, an added token
  EXPECT_EQ(ids_of_spec(", chat_template: own.jinja"), own);
  EXPECT_EQ(ids_of_spec(", chat_template: '{{ messages|length }}'"), bytes("1"));
  auto e = error_of([&] { ids_of_spec(", chat_template: nowhere.jinja"); });
  EXPECT_NE(e.find("neither a file nor a template"), std::string::npos) << e;
  e = error_of([&] { ids_of_spec(", assistant_only_loss: true"); });
  EXPECT_NE(e.find("{% generation %}"), std::string::npos) << e;
}
