// chat_template.cc — the Jinja2 subset of chat_template.h: a lexer with Jinja's whitespace rules
// (trim_blocks, lstrip_blocks, '-' / '+'), a recursive-descent parser with Jinja's precedence,
// and a tree-walking renderer over Python-like values. Behaviour follows jinja2 3.1 (read from its
// lexer.py, parser.py, runtime.py, filters.py, tests.py) and Transformers'
// chat_template_utils.py; no code is taken from either.
//
// Filters: abs attr capitalize count d default dictsort e escape first float indent int items
// join last length list lower map max min reject rejectattr replace reverse round safe select
// selectattr sort string sum title tojson trim unique upper.
// Tests: boolean callable defined divisibleby eq equalto escaped even false float ge greaterthan
// gt in integer iterable le lessthan lower lt mapping ne none number odd sameas sequence string
// true undefined upper == != < <= > >=.
#include "data/chat_template.h"

#include <locale.h>
#include <wctype.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <set>
#include <unordered_map>

#include "io/json.h"
#include "onyx/error.h"
#include "tokenizers/tokenizer.h"

namespace fs = std::filesystem;

namespace onyx::data {

namespace unicode = tokenizers::unicode;
using tokenizers::read_text_file;

namespace {

// ---------------------------------------------------------------- values

struct Value;
using ValueList = std::vector<Value>;
using ValueDict = std::vector<std::pair<std::string, Value>>;  // insertion order, as Python
using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;
struct Func;

using Limits = TemplateLimits;

// The work and the string bytes one render has spent (Renderer::run installs it for its thread;
// outside a render nothing is counted). Copying a Value copies its string, so every copy is
// charged: `[s] * n` and a loop that keeps doubling a string both stop at kMaxBytes.
struct Budget {
  int64_t steps = 0, bytes = 0;
  // Every namespace made: the only mutable values, so the only way to a cycle (ns.me = ns). The
  // render empties them when it ends, so a cycle does not outlive it.
  std::vector<std::weak_ptr<ValueDict>> namespaces;
};
thread_local Budget* t_budget = nullptr;
void charge_steps(int64_t n);
void charge_bytes(int64_t n);

struct Value {
  enum T : uint8_t { Undef, None, Bool, Int, Float, Str, List, Dict, Fn };
  T t = Undef;
  bool tuple = false;  // a List that is a Python tuple (repr, equality)
  bool ns = false;     // a Dict that is a namespace() (attribute assignment)
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // Str; for Undef, the error its use raises
  std::shared_ptr<ValueList> l;
  std::shared_ptr<ValueDict> d;
  std::shared_ptr<Func> fn;

  Value() = default;
  Value(Value&&) = default;
  Value& operator=(Value&&) = default;
  Value(const Value& o)
      : t(o.t), tuple(o.tuple), ns(o.ns), b(o.b), i(o.i), f(o.f), s(o.s), l(o.l), d(o.d), fn(o.fn) {
    charge_bytes((int64_t)s.size());
  }
  Value& operator=(const Value& o) {
    if (this != &o) *this = Value(o);
    return *this;
  }
  ~Value();

  static Value undef(std::string hint) {
    Value v;
    v.s = std::move(hint);
    return v;
  }
  static Value none() {
    Value v;
    v.t = None;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.t = Bool;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.t = Int;
    v.i = x;
    return v;
  }
  static Value flt(double x) {
    Value v;
    v.t = Float;
    v.f = x;
    return v;
  }
  static Value str(std::string x);
  static Value list(ValueList x, bool tuple = false);
  static Value dict(ValueDict x, bool ns = false);
  // A callable; `self` is the object a bound method belongs to (kept here, not in the closure,
  // so that releasing a value never recurses: see ~Value).
  static Value func(std::string name, std::function<Value(const Value&, Args&, Kwargs&)> f);
  static Value func(std::string name, std::function<Value(const Value&, Args&, Kwargs&)> f,
                    Value self);
  bool numeric() const { return t == Bool || t == Int || t == Float; }
  double num() const { return t == Float ? f : t == Int ? (double)i : (double)b; }
  int64_t as_int() const { return t == Int ? i : (int64_t)b; }
  const Value* find(const std::string& key) const {
    charge_steps(1 + (int64_t)d->size() / 16);
    for (auto& [k, v] : *d)
      if (k == key) return &v;
    return nullptr;
  }
};

struct Func {
  std::string name;
  std::function<Value(const Value& self, Args&, Kwargs&)> fn;
  Value self;
};

// Releasing a value releases what only it holds. A list nested a million deep (a template can
// build one in a loop) would recurse that deep through the destructors; instead the first
// release on a thread drains a worklist, and releases inside it only add to the list.
thread_local std::vector<Value>* t_release_queue = nullptr;
Value::~Value() {
  const bool own_list = l && l.use_count() == 1 && !l->empty();
  const bool own_dict = d && d.use_count() == 1 && !d->empty();
  const bool own_fn = fn && fn.use_count() == 1 && fn->self.t != Undef;
  if (!own_list && !own_dict && !own_fn) return;
  std::vector<Value> local;
  std::vector<Value>* queue = t_release_queue ? t_release_queue : &local;
  if (own_list)
    for (auto& x : *l) queue->push_back(std::move(x));
  if (own_dict)
    for (auto& kv : *d) queue->push_back(std::move(kv.second));
  if (own_fn) queue->push_back(std::move(fn->self));
  if (queue != &local) return;
  t_release_queue = &local;
  while (!local.empty()) {
    Value v = std::move(local.back());
    local.pop_back();
  }  // each v releases here, queueing what it alone held
  t_release_queue = nullptr;
}

// A runtime error without its place yet; the renderer adds line and column.
struct RtError {
  std::string msg;
  bool located = false;
};
[[noreturn]] void fail(std::string msg) { throw RtError{std::move(msg)}; }

void charge_steps(int64_t n) {
  if (t_budget && (t_budget->steps += n) > Limits::kMaxSteps)
    fail(cat("the template ran more than ", Limits::kMaxSteps,
             " steps (onyx's bound on one render; a loop that never ends?)"));
}
void charge_bytes(int64_t n) {
  if (t_budget && (t_budget->bytes += n) > Limits::kMaxBytes)
    fail(cat("the template made more than ", Limits::kMaxBytes >> 20,
             " MiB of values in one render (onyx's bound; a string, list or dict counts each "
             "time it is made or copied)"));
}
// A string about to be made `n` bytes long.
void check_string_size(uint64_t n) {
  if (n > (uint64_t)Limits::kMaxString)
    fail(cat("a string of ", n, " bytes is longer than onyx's bound of ", Limits::kMaxString >> 20,
             " MiB for one value"));
}
void check_items(uint64_t n) {
  if (n > (uint64_t)Limits::kMaxItems)
    fail(cat("a list or dict of ", n, " items is larger than onyx's bound of ", Limits::kMaxItems,
             " items"));
}
// Recursive walks over values (repr, ==, <, tojson) stop at kMaxValueDepth: a namespace can hold
// itself, and a loop can nest a list in itself a million times.
void check_value_depth(int depth) {
  if (depth > Limits::kMaxValueDepth)
    fail(cat("values nest deeper than ", Limits::kMaxValueDepth,
             " levels (onyx's bound; does a namespace hold itself?)"));
  charge_steps(1);
}

Value Value::str(std::string x) {
  check_string_size(x.size());
  charge_bytes((int64_t)x.size());
  Value v;
  v.t = Str;
  v.s = std::move(x);
  return v;
}
Value Value::list(ValueList x, bool tuple) {
  check_items(x.size());
  charge_bytes((int64_t)(x.size() * sizeof(Value)));
  Value v;
  v.t = List;
  v.tuple = tuple;
  v.l = std::make_shared<ValueList>(std::move(x));
  return v;
}
Value Value::dict(ValueDict x, bool ns) {
  check_items(x.size());
  charge_bytes((int64_t)(x.size() * sizeof(ValueDict::value_type)));
  Value v;
  v.t = Dict;
  v.ns = ns;
  v.d = std::make_shared<ValueDict>(std::move(x));
  if (ns && t_budget) t_budget->namespaces.push_back(v.d);
  return v;
}
Value Value::func(std::string name, std::function<Value(const Value&, Args&, Kwargs&)> f) {
  return func(std::move(name), std::move(f), Value());
}
Value Value::func(std::string name, std::function<Value(const Value&, Args&, Kwargs&)> f,
                  Value self) {
  Value v;
  v.t = Fn;
  v.fn = std::make_shared<Func>(Func{std::move(name), std::move(f), std::move(self)});
  return v;
}

const char* type_name(const Value& v) {
  switch (v.t) {
    case Value::Undef:
      return "Undefined";
    case Value::None:
      return "NoneType";
    case Value::Bool:
      return "bool";
    case Value::Int:
      return "int";
    case Value::Float:
      return "float";
    case Value::Str:
      return "str";
    case Value::List:
      return v.tuple ? "tuple" : "list";
    case Value::Dict:
      return v.ns ? "Namespace" : "dict";
    case Value::Fn:
      return "function";
  }
  return "?";
}

// Using an undefined value where Jinja's Undefined raises.
[[noreturn]] void fail_undefined(const Value& v) {
  fail(v.s.empty() ? std::string("a value is undefined") : v.s);
}

// ---------------------------------------------------------------- UTF-8 and Python strings

// One code point of UTF-8 at s[i]; a byte that does not start a complete sequence is one code
// point of its own (the template's text is checked to be UTF-8, so only a bug meets one), so that
// counting (cp_len) and decoding (to_u32) always agree.
char32_t next_cp(const std::string& s, size_t& i) {
  const unsigned char c = s[i];
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) n = 1;
  for (int k = 1; k < n; k++)
    if (((unsigned char)s[i + k] & 0xC0) != 0x80) n = 1;
  char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
  for (int k = 1; k < n; k++) cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3f);
  i += n;
  return cp;
}
std::u32string to_u32(const std::string& s) {
  charge_steps(1 + (int64_t)s.size() / 4);
  std::u32string out;
  for (size_t i = 0; i < s.size();) out.push_back(next_cp(s, i));
  return out;
}
std::string to_u8(const std::u32string& s) { return unicode::encode_utf8(s); }
std::string cp_u8(char32_t c) {
  std::string out;
  unicode::append_utf8(c, out);
  return out;
}
int64_t cp_len(const std::string& s) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size(); n++) next_cp(s, i);
  return n;
}

// Python's str.isspace (and regex \s on str).
bool py_space(char32_t c) { return unicode::is_white_space(c) || (c >= 0x1c && c <= 0x1f); }

locale_t utf8_locale() {
  static locale_t loc = [] {
    locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
    return l;
  }();
  return loc;
}
char32_t cp_upper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  return utf8_locale() ? (char32_t)towupper_l((wint_t)c, utf8_locale()) : c;
}
char32_t cp_lower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  return utf8_locale() ? (char32_t)towlower_l((wint_t)c, utf8_locale()) : c;
}
bool cp_cased(char32_t c) { return cp_upper(c) != c || cp_lower(c) != c; }
bool cp_alpha(char32_t c) {
  if (c < 0x80) return std::isalpha((int)c);
  return utf8_locale() && iswalpha_l((wint_t)c, utf8_locale());
}
bool cp_digit(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return utf8_locale() && iswdigit_l((wint_t)c, utf8_locale());
}

// Python's upper() / lower(): the C library's one-to-one mappings plus Unicode's common
// one-to-many ones (SpecialCasing.txt: sharp s, the Latin ligatures, dotted capital I).
std::string str_upper(const std::string& s) {
  std::u32string u = to_u32(s), out;
  for (char32_t c : u) {
    switch (c) {
      case 0xDF:
        out += U"SS";
        break;
      case 0xFB00:
        out += U"FF";
        break;
      case 0xFB01:
        out += U"FI";
        break;
      case 0xFB02:
        out += U"FL";
        break;
      case 0xFB03:
        out += U"FFI";
        break;
      case 0xFB04:
        out += U"FFL";
        break;
      case 0xFB05:
      case 0xFB06:
        out += U"ST";
        break;
      default:
        out.push_back(cp_upper(c));
    }
  }
  return to_u8(out);
}
std::string str_lower(const std::string& s) {
  std::u32string u = to_u32(s), out;
  for (char32_t c : u) {
    if (c == 0x130)
      out += U"i\u0307";
    else
      out.push_back(cp_lower(c));
  }
  return to_u8(out);
}
std::string str_capitalize(const std::string& s) {
  std::u32string u = to_u32(s);
  for (size_t k = 0; k < u.size(); k++) u[k] = k ? cp_lower(u[k]) : cp_upper(u[k]);
  return to_u8(u);
}
std::string str_py_title(const std::string& s) {  // Python's str.title()
  std::u32string u = to_u32(s);
  bool prev_cased = false;
  for (auto& c : u) {
    const bool cased = cp_cased(c);
    c = prev_cased ? cp_lower(c) : cp_upper(c);
    prev_cased = cased;
  }
  return to_u8(u);
}
std::string str_jinja_title(const std::string& s) {  // Jinja's title filter: words split at -\s({[<
  std::u32string u = to_u32(s), out;
  bool word_start = true;
  for (char32_t c : u) {
    const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_space(c);
    if (sep) {
      out.push_back(c);
      word_start = true;
    } else {
      out.push_back(word_start ? cp_upper(c) : cp_lower(c));
      word_start = false;
    }
  }
  return to_u8(out);
}

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::u32string u = to_u32(s);
  std::u32string set;
  const bool ws = !chars || chars->t == Value::None || chars->t == Value::Undef;
  if (!ws) {
    if (chars->t != Value::Str) fail("strip arg must be None or str");
    set = to_u32(chars->s);
  }
  auto strip_me = [&](char32_t c) {
    return ws ? py_space(c) : set.find(c) != std::u32string::npos;
  };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_me(u[b])) b++;
  if (right)
    while (e > b && strip_me(u[e - 1])) e--;
  return to_u8(u.substr(b, e - b));
}

std::string hex_escape(const char* prefix, uint32_t c, int width) {
  char buf[16];
  snprintf(buf, sizeof buf, "%s%0*x", prefix, width, c);
  return buf;
}

// Python's repr() of a str.
std::string py_repr_str(const std::string& s) {
  const bool has_sq = s.find('\'') != std::string::npos, has_dq = s.find('"') != std::string::npos;
  const char q = has_sq && !has_dq ? '"' : '\'';
  std::string out(1, q);
  for (size_t i = 0; i < s.size();) {
    const char32_t c = next_cp(s, i);
    if (c == (char32_t)q || c == '\\') {
      out += '\\';
      out += (char)c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad) {
      out += hex_escape("\\x", c, 2);
    } else if ((c >= 0x2028 && c <= 0x2029) || (c >= 0x200b && c <= 0x200f) ||
               (c >= 0x2060 && c <= 0x2064) || c == 0xfeff) {
      out += hex_escape("\\u", c, 4);
    } else {
      unicode::append_utf8(c, out);
    }
  }
  out += q;
  return out;
}

// Python's repr() of a float (the shortest string that reads back as the same double).
std::string py_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  for (int p = 1; p <= 17; p++) {
    snprintf(buf, sizeof buf, "%.*e", p - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string s = buf;
  const bool neg = std::signbit(x);
  if (s[0] == '-') s = s.substr(1);
  const size_t e = s.find('e');
  const int exp = std::stoi(s.substr(e + 1));
  std::string digits;
  for (char c : s.substr(0, e))
    if (c != '.') digits += c;
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string r;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      std::string ip = digits.substr(0, std::min<size_t>(digits.size(), exp + 1));
      while ((int)ip.size() < exp + 1) ip += '0';
      std::string fp = (int)digits.size() > exp + 1 ? digits.substr(exp + 1) : "0";
      r = ip + "." + fp;
    } else {
      r = "0." + std::string(-exp - 1, '0') + digits;
    }
  } else {
    r = digits.substr(0, 1);
    if (digits.size() > 1) r += "." + digits.substr(1);
    char eb[16];
    snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    r += eb;
  }
  return neg ? "-" + r : r;
}

std::string py_repr(const Value& v, int depth = 0);

// Python's str(): what {{ }} prints.
std::string py_str(const Value& v) {
  switch (v.t) {
    case Value::Undef:
      return "";
    case Value::Str:
      return v.s;
    default:
      return py_repr(v);
  }
}

std::string py_repr(const Value& v, int depth) {
  switch (v.t) {
    case Value::Undef:
      return "";
    case Value::None:
      return "None";
    case Value::Bool:
      return v.b ? "True" : "False";
    case Value::Int:
      return std::to_string(v.i);
    case Value::Float:
      return py_float(v.f);
    case Value::Str:
      return py_repr_str(v.s);
    case Value::List: {
      check_value_depth(depth);
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.l->size(); k++) {
        out += (k ? ", " : "") + py_repr((*v.l)[k], depth + 1);
        check_string_size(out.size());
      }
      if (v.tuple && v.l->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Value::Dict: {
      check_value_depth(depth);
      std::string out = v.ns ? "<Namespace {" : "{";
      bool first = true;
      for (auto& [k, x] : *v.d) {
        out += (first ? "" : ", ") + py_repr_str(k) + ": " + py_repr(x, depth + 1);
        check_string_size(out.size());
        first = false;
      }
      return out + (v.ns ? "}>" : "}");
    }
    case Value::Fn:
      return "<function " + v.fn->name + ">";
  }
  return "";
}

bool truthy(const Value& v) {
  switch (v.t) {
    case Value::Undef:
    case Value::None:
      return false;
    case Value::Bool:
      return v.b;
    case Value::Int:
      return v.i != 0;
    case Value::Float:
      return v.f != 0;
    case Value::Str:
      return !v.s.empty();
    case Value::List:
      return !v.l->empty();
    case Value::Dict:
      return v.ns || !v.d->empty();
    case Value::Fn:
      return true;
  }
  return false;
}

bool py_eq(const Value& a, const Value& b, int depth = 0) {
  check_value_depth(depth);
  if (a.numeric() && b.numeric()) {
    if (a.t != Value::Float && b.t != Value::Float) return a.as_int() == b.as_int();
    return a.num() == b.num();
  }
  if (a.t != b.t) return false;
  switch (a.t) {
    case Value::Undef:
    case Value::None:
      return true;
    case Value::Str:
      return a.s == b.s;
    case Value::List:
      if (a.tuple != b.tuple || a.l->size() != b.l->size()) return false;
      for (size_t k = 0; k < a.l->size(); k++)
        if (!py_eq((*a.l)[k], (*b.l)[k], depth + 1)) return false;
      return true;
    case Value::Dict:
      if (a.ns || b.ns) return a.d == b.d;
      if (a.d->size() != b.d->size()) return false;
      for (auto& [k, x] : *a.d) {
        const Value* y = b.find(k);
        if (!y || !py_eq(x, *y, depth + 1)) return false;
      }
      return true;
    case Value::Fn:
      return a.fn == b.fn;
    default:
      return false;
  }
}

// Python's a < b (TypeError between kinds that do not order).
bool py_lt(const Value& a, const Value& b, const char* op = "<", int depth = 0) {
  check_value_depth(depth);
  if (a.numeric() && b.numeric()) {
    if (a.t != Value::Float && b.t != Value::Float) return a.as_int() < b.as_int();
    return a.num() < b.num();
  }
  if (a.t == Value::Str && b.t == Value::Str) return a.s < b.s;  // UTF-8 order = code point order
  if (a.t == Value::List && b.t == Value::List && a.tuple == b.tuple) {
    const size_t n = std::min(a.l->size(), b.l->size());
    for (size_t k = 0; k < n; k++) {
      if (py_eq((*a.l)[k], (*b.l)[k], depth + 1)) continue;
      return py_lt((*a.l)[k], (*b.l)[k], op, depth + 1);
    }
    return a.l->size() < b.l->size();
  }
  if (a.t == Value::Undef) fail_undefined(a);
  if (b.t == Value::Undef) fail_undefined(b);
  fail(cat("'", op, "' not supported between instances of '", type_name(a), "' and '", type_name(b),
           "'"));
}

// json.dumps(x, ensure_ascii, indent, separators, sort_keys) as Python writes it.
struct JsonStyle {
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::string indent;  // the indent unit; has_indent false: one line
  bool has_indent = false;
  std::string item_sep = ", ", key_sep = ": ";
};
std::string json_str(const std::string& s, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const char32_t c = next_cp(s, i);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c > 0x7e)) {
          if (c > 0xffff) {
            const uint32_t v = c - 0x10000;
            out += hex_escape("\\u", 0xd800 + (v >> 10), 4);
            out += hex_escape("\\u", 0xdc00 + (v & 0x3ff), 4);
          } else {
            out += hex_escape("\\u", c, 4);
          }
        } else {
          unicode::append_utf8(c, out);
        }
    }
  }
  return out + "\"";
}
void json_dump(const Value& v, const JsonStyle& st, int level, std::string& out) {
  check_value_depth(level);
  check_string_size(out.size());
  auto newline = [&](int lv) {
    out += "\n";
    for (int k = 0; k < lv; k++) {
      out += st.indent;
      check_string_size(out.size());
    }
  };
  switch (v.t) {
    case Value::Undef:
      fail_undefined(v);
    case Value::None:
      out += "null";
      return;
    case Value::Bool:
      out += v.b ? "true" : "false";
      return;
    case Value::Int:
      out += std::to_string(v.i);
      return;
    case Value::Float:
      out += std::isnan(v.f)   ? "NaN"
             : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity")
                               : py_float(v.f);
      return;
    case Value::Str:
      out += json_str(v.s, st.ensure_ascii);
      return;
    case Value::List: {
      if (v.l->empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (size_t k = 0; k < v.l->size(); k++) {
        if (k) out += st.item_sep;
        if (st.has_indent) newline(level + 1);
        json_dump((*v.l)[k], st, level + 1, out);
      }
      if (st.has_indent) newline(level);
      out += "]";
      return;
    }
    case Value::Dict: {
      if (v.ns) fail("Object of type Namespace is not JSON serializable");
      if (v.d->empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (auto& kv : *v.d) items.push_back(&kv);
      if (st.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      out += "{";
      for (size_t k = 0; k < items.size(); k++) {
        if (k) out += st.item_sep;
        if (st.has_indent) newline(level + 1);
        out += json_str(items[k]->first, st.ensure_ascii) + st.key_sep;
        json_dump(items[k]->second, st, level + 1, out);
      }
      if (st.has_indent) newline(level);
      out += "}";
      return;
    }
    case Value::Fn:
      fail("Object of type function is not JSON serializable");
  }
}

Value from_json(const nlohmann::ordered_json& j, int depth = 0) {
  check_value_depth(depth);
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      if (j.get<uint64_t>() > (uint64_t)INT64_MAX)
        fail(cat("the integer ", j.get<uint64_t>(), " in the template's variables does not fit in ",
                 "64 bits (onyx's templates have no big integers)"));
      return Value::integer((int64_t)j.get<uint64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value::flt(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList l;
      for (auto& x : j) l.push_back(from_json(x, depth + 1));
      return Value::list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict d;
      for (auto it = j.begin(); it != j.end(); ++it)
        d.emplace_back(it.key(), from_json(it.value(), depth + 1));
      return Value::dict(std::move(d));
    }
    default:
      return Value::none();
  }
}

// The items `for` walks: a list's elements, a dict's keys, a string's characters.
ValueList iterate(const Value& v) {
  charge_steps(1 + (v.t == Value::List ? (int64_t)v.l->size() : 0));
  switch (v.t) {
    case Value::Undef:
      return {};
    case Value::List:
      return *v.l;
    case Value::Dict: {
      if (v.ns) fail("'Namespace' object is not iterable");
      ValueList out;
      for (auto& [k, x] : *v.d) out.push_back(Value::str(k));
      return out;
    }
    case Value::Str: {
      ValueList out;
      for (size_t i = 0; i < v.s.size();) {
        size_t b = i;
        next_cp(v.s, i);
        out.push_back(Value::str(v.s.substr(b, i - b)));
      }
      return out;
    }
    default:
      fail(cat("'", type_name(v), "' object is not iterable"));
  }
}

int64_t py_len(const Value& v) {
  switch (v.t) {
    case Value::Undef:
      return 0;
    case Value::Str:
      return cp_len(v.s);
    case Value::List:
      return (int64_t)v.l->size();
    case Value::Dict:
      return (int64_t)v.d->size();
    default:
      fail(cat("object of type '", type_name(v), "' has no len()"));
  }
}

// Python slice indices for a sequence of n items.
std::vector<int64_t> slice_indices(int64_t n, const Value& start, const Value& stop,
                                   const Value& step) {
  auto given = [](const Value& v) { return v.t != Value::Undef && v.t != Value::None; };
  int64_t st = 1;
  if (given(step)) {
    if (step.t != Value::Int) fail("slice indices must be integers or None");
    st = step.i;
  }
  if (st == 0) fail("slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t def) {
    if (!given(v)) return def;
    if (v.t != Value::Int && v.t != Value::Bool) fail("slice indices must be integers or None");
    int64_t x = v.as_int();
    if (x < 0) x += n;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(start, st > 0 ? 0 : n - 1), e = clamp(stop, st > 0 ? n : -1);
  std::vector<int64_t> out;
  for (__int128 k = b; st > 0 ? k < e : k > e; k += st) out.push_back((int64_t)k);
  return out;
}

// ---------------------------------------------------------------- lexer

struct Tok {
  enum K { Data, VarB, VarE, BlkB, BlkE, Name, Str, Int, Float, Op, End } k;
  std::string s;
  int64_t i = 0;
  double f = 0;
  size_t off = 0;
};

struct Source {
  std::string name, text;
  std::vector<size_t> line_starts;
  std::string where(size_t off) const {
    const size_t line =
        std::upper_bound(line_starts.begin(), line_starts.end(), off) - line_starts.begin();
    const size_t col = off - line_starts[line - 1] + 1;
    return cat(name, ": line ", line, ", column ", col);
  }
  [[noreturn]] void error(size_t off, const std::string& msg) const {
    throw Error(cat(where(off), ": ", msg));
  }
};

bool name_start(char c) { return std::isalpha((unsigned char)c) || c == '_'; }
bool name_char(char c) { return std::isalnum((unsigned char)c) || c == '_'; }

// Past \s* at i.
size_t skip_ws(const std::string& s, size_t i) {
  while (i < s.size()) {
    size_t j = i;
    if (!py_space(next_cp(s, j))) break;
    i = j;
  }
  return i;
}
// The length of s without its trailing whitespace (Python's rstrip()).
size_t rstrip_len(const std::string& s) {
  size_t e = s.size();
  while (e > 0) {
    size_t b = e - 1;
    while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
    size_t j = b;
    if (!py_space(next_cp(s, j))) break;
    e = b;
  }
  return e;
}
bool all_space(const std::string& s, size_t from) {
  if (from >= s.size()) return false;  // \s+ needs one character
  return skip_ws(s, from) == s.size();
}

// Python's unicode-escape decoding of a string literal's body, as Jinja reads literals.
std::string unescape(const std::string& body, const Source& src, size_t off) {
  std::string out;
  for (size_t i = 0; i < body.size(); i++) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out += c;
      continue;
    }
    char e = body[++i];
    auto hex = [&](int n) {
      if (i + n >= body.size()) src.error(off, "truncated \\x / \\u escape in a string");
      uint32_t v = 0;
      for (int k = 1; k <= n; k++) {
        char h = body[i + k];
        if (!std::isxdigit((unsigned char)h)) src.error(off, "bad \\x / \\u escape in a string");
        v = v * 16 + (std::isdigit((unsigned char)h) ? h - '0' : (std::tolower(h) - 'a' + 10));
      }
      i += n;
      return v;
    };
    switch (e) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '\n':
        break;
      case 'x':
        unicode::append_utf8(hex(2), out);
        break;
      case 'u':
        unicode::append_utf8(hex(4), out);
        break;
      case 'U':
        unicode::append_utf8(hex(8), out);
        break;
      default:
        if (e >= '0' && e <= '7') {
          uint32_t v = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               k++)
            v = v * 8 + (body[++i] - '0');
          unicode::append_utf8(v, out);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

std::vector<Tok> lex(const Source& src) {
  const std::string& s = src.text;
  const size_t n = s.size();
  std::vector<Tok> toks;
  size_t pos = 0;
  bool line_starting = true;
  auto emit_data = [&](std::string text, size_t off) {
    if (!text.empty()) toks.push_back({Tok::Data, std::move(text), 0, 0, off});
  };
  // Jinja's OptionalLStrip: the text before a tag, stripped by its '-' or by lstrip_blocks.
  auto strip_before = [&](std::string text, char sign, bool is_var) {
    if (sign == '-') {
      text.resize(rstrip_len(text));
    } else if (sign != '+' && !is_var) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && all_space(text, l_pos)) text.resize(l_pos);
    }
    return text;
  };
  while (pos < n) {
    size_t k = pos;
    while (true) {
      k = s.find('{', k);
      if (k == std::string::npos || k + 1 >= n) {
        k = std::string::npos;
        break;
      }
      if (s[k + 1] == '{' || s[k + 1] == '%' || s[k + 1] == '#') break;
      k++;
    }
    if (k == std::string::npos) {
      emit_data(s.substr(pos), pos);
      break;
    }
    const char kind = s[k + 1];
    size_t p = k + 2;
    char sign = 0;
    if (p < n && (s[p] == '-' || s[p] == '+')) sign = s[p++];
    std::string text = s.substr(pos, k - pos);
    // {% raw %} ... {% endraw %}
    if (kind == '%') {
      size_t q = skip_ws(s, p);
      if (s.compare(q, 3, "raw") == 0 && (q + 3 >= n || !name_char(s[q + 3]))) {
        q = skip_ws(s, q + 3);
        size_t body = std::string::npos;
        if (s.compare(q, 3, "-%}") == 0)
          body = skip_ws(s, q + 3);
        else if (s.compare(q, 2, "%}") == 0)
          body = q + 2;
        if (body != std::string::npos) {
          emit_data(strip_before(text, sign, false), pos);
          line_starting = s[body - 1] == '\n';
          size_t j = body;
          while (true) {
            j = s.find("{%", j);
            if (j == std::string::npos) src.error(k, "missing end of raw directive");
            size_t r = j + 2;
            char esign = 0;
            if (r < n && (s[r] == '-' || s[r] == '+')) esign = s[r++];
            r = skip_ws(s, r);
            if (s.compare(r, 6, "endraw") == 0) {
              r = skip_ws(s, r + 6);
              size_t end = std::string::npos;
              if (s.compare(r, 3, "+%}") == 0)
                end = r + 3;
              else if (s.compare(r, 3, "-%}") == 0)
                end = skip_ws(s, r + 3);
              else if (s.compare(r, 2, "%}") == 0)
                end = r + 2 + (r + 2 < n && s[r + 2] == '\n');
              if (end != std::string::npos) {
                emit_data(strip_before(s.substr(body, j - body), esign, false), body);
                line_starting = s[end - 1] == '\n';
                pos = end;
                break;
              }
            }
            j += 2;
          }
          continue;
        }
      }
    }
    emit_data(strip_before(std::move(text), sign, kind == '{'), pos);
    if (kind == '#') {
      size_t end = std::string::npos;
      for (size_t j = p; j < n && end == std::string::npos; j++) {
        if (s[j] == '+' && s.compare(j + 1, 2, "#}") == 0)
          end = j + 3;
        else if (s[j] == '-' && s.compare(j + 1, 2, "#}") == 0)
          end = skip_ws(s, j + 3);
        else if (s.compare(j, 2, "#}") == 0)
          end = j + 2 + (j + 2 < n && s[j + 2] == '\n');
      }
      if (end == std::string::npos) src.error(k, "missing end of comment tag '#}'");
      line_starting = s[end - 1] == '\n';
      pos = end;
      continue;
    }
    toks.push_back({kind == '{' ? Tok::VarB : Tok::BlkB, kind == '{' ? "{{" : "{%", 0, 0, k});
    pos = p;
    std::vector<char> balance;
    while (true) {
      if (balance.empty()) {
        size_t end = std::string::npos;
        if (kind == '%') {
          if (s.compare(pos, 3, "+%}") == 0)
            end = pos + 3;
          else if (s.compare(pos, 3, "-%}") == 0)
            end = skip_ws(s, pos + 3);
          else if (s.compare(pos, 2, "%}") == 0)
            end = pos + 2 + (pos + 2 < n && s[pos + 2] == '\n');
        } else {
          if (s.compare(pos, 3, "-}}") == 0)
            end = skip_ws(s, pos + 3);
          else if (s.compare(pos, 2, "}}") == 0)
            end = pos + 2;
        }
        if (end != std::string::npos) {
          toks.push_back({kind == '%' ? Tok::BlkE : Tok::VarE, "", 0, 0, pos});
          line_starting = s[end - 1] == '\n';
          pos = end;
          break;
        }
      }
      if (pos >= n)
        src.error(k, cat("unexpected end of template: the tag opened here is never closed with '",
                         kind == '%' ? "%}" : "}}", "'"));
      const char c = s[pos];
      {
        size_t j = pos;
        if (py_space(next_cp(s, j))) {
          pos = j;
          continue;
        }
      }
      if (std::isdigit((unsigned char)c) && !(pos > 0 && s[pos - 1] == '.')) {
        // float: digits ( . digits [e...] | e... ); int: 0b / 0o / 0x / digits, '_' separators
        size_t j = pos;
        auto digits = [&](size_t& q, auto pred) {
          size_t b = q;
          while (q < n && (pred(s[q]) || (s[q] == '_' && q + 1 < n && pred(s[q + 1]) && q > b)))
            q++;
          return q > b;
        };
        auto dec = [](char ch) { return std::isdigit((unsigned char)ch) != 0; };
        digits(j, dec);
        size_t fe = j;
        bool is_float = false;
        if (fe < n && s[fe] == '.' && fe + 1 < n && dec(s[fe + 1])) {
          fe++;
          digits(fe, dec);
          is_float = true;
        }
        if (fe < n && (s[fe] == 'e' || s[fe] == 'E')) {
          size_t q = fe + 1;
          if (q < n && (s[q] == '+' || s[q] == '-')) q++;
          if (q < n && dec(s[q])) {
            digits(q, dec);
            fe = q;
            is_float = true;
          }
        }
        std::string lit;
        if (is_float) {
          for (size_t q = pos; q < fe; q++)
            if (s[q] != '_') lit += s[q];
          toks.push_back({Tok::Float, lit, 0, std::strtod(lit.c_str(), nullptr), pos});
          pos = fe;
          continue;
        }
        int base = 10;
        size_t q = pos;
        if (c == '0' && pos + 1 < n && std::strchr("bBoOxX", s[pos + 1])) {
          const char b = std::tolower(s[pos + 1]);
          base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
          q = pos + 2;
          auto dig = [base](char ch) {
            return base == 16 ? std::isxdigit((unsigned char)ch) != 0
                              : (ch >= '0' && ch < '0' + base);
          };
          if (q < n && s[q] == '_') q++;
          if (!digits(q, dig)) src.error(pos, "invalid integer literal");
        } else {
          q = j;
        }
        for (size_t r = base == 10 ? pos : pos + 2; r < q; r++)
          if (s[r] != '_') lit += s[r];
        Tok t{Tok::Int, s.substr(pos, q - pos), 0, 0, pos};
        errno = 0;
        t.i = std::strtoll(lit.c_str(), nullptr, base);
        if (errno == ERANGE) src.error(pos, "integer literal out of range");
        toks.push_back(t);
        pos = q;
        continue;
      }
      if (name_start(c)) {
        size_t j = pos;
        while (j < n && name_char(s[j])) j++;
        toks.push_back({Tok::Name, s.substr(pos, j - pos), 0, 0, pos});
        pos = j;
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t j = pos + 1;
        while (j < n && s[j] != c) j += s[j] == '\\' ? 2 : 1;
        if (j >= n) src.error(pos, "unterminated string literal");
        toks.push_back({Tok::Str, unescape(s.substr(pos + 1, j - pos - 1), src, pos), 0, 0, pos});
        pos = j + 1;
        continue;
      }
      static const char* two[] = {"//", "**", "==", "!=", ">=", "<="};
      std::string op;
      for (const char* t : two)
        if (s.compare(pos, 2, t) == 0) op = t;
      if (op.empty() && std::strchr("+-/*%~[](){}><=.:|,;", c)) op = std::string(1, c);
      if (op.empty()) src.error(pos, cat("unexpected character '", std::string(1, c), "'"));
      if (op == "(" || op == "[" || op == "{") {
        balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
      } else if (op == ")" || op == "]" || op == "}") {
        if (balance.empty()) src.error(pos, cat("unexpected '", op, "'"));
        if (balance.back() != op[0])
          src.error(pos,
                    cat("unexpected '", op, "', expected '", std::string(1, balance.back()), "'"));
        balance.pop_back();
      }
      toks.push_back({Tok::Op, op, 0, 0, pos});
      pos += op.size();
    }
  }
  toks.push_back({Tok::End, "", 0, 0, n});
  return toks;
}

// ---------------------------------------------------------------- syntax tree

struct Expr;
using ExprP = std::shared_ptr<Expr>;
struct Expr {
  enum K {
    Const,
    Name,
    Attr,
    Item,
    Slice,
    Call,
    Filter,
    Test,
    Neg,
    Pos,
    Not,
    Bin,
    And,
    Or,
    Cmp,
    Cond,
    ListE,
    TupleE,
    DictE
  } k;
  size_t off = 0;
  Value v;           // Const
  std::string name;  // Name, Attr, Filter, Test, Bin (the operator)
  std::vector<ExprP> a;
  std::vector<std::pair<std::string, ExprP>> kw;
  std::vector<std::string> ops;  // Cmp
  bool neg = false;              // Test: 'is not'
  int height = 1;                // of this subtree (Parser::seal bounds it)
};

struct Stmt;
using StmtP = std::shared_ptr<Stmt>;
using Body = std::vector<StmtP>;
struct Stmt {
  enum K { Text, Out, For, If, Set, SetBlock, Macro, Break, Continue, Generation } k;
  size_t off = 0;
  std::string text;  // Text; Set ns attribute; Macro name
  ExprP e;           // Out, For (iterable), Set (value)
  ExprP cond;        // For's filter
  std::vector<std::string> targets;
  std::vector<ExprP> conds;  // If: conds[i] guards bodies[i]; a last extra body is the else
  std::vector<Body> bodies;
  Body body, else_body;
  std::vector<std::pair<std::string, ExprP>> params;  // Macro (null default: required)
};

const std::set<std::string> kFilters = {
    "abs",     "attr",    "capitalize", "count",  "d",      "default",    "dictsort", "e",
    "escape",  "first",   "float",      "indent", "int",    "items",      "join",     "last",
    "length",  "list",    "lower",      "map",    "max",    "min",        "reject",   "rejectattr",
    "replace", "reverse", "round",      "safe",   "select", "selectattr", "sort",     "string",
    "sum",     "title",   "tojson",     "trim",   "unique", "upper"};
const std::set<std::string> kTests = {
    "boolean", "callable", "defined",  "divisibleby", "eq",      "equalto",   "escaped", "even",
    "false",   "float",    "ge",       "greaterthan", "gt",      "in",        "integer", "iterable",
    "le",      "lessthan", "lower",    "lt",          "mapping", "ne",        "none",    "number",
    "odd",     "sameas",   "sequence", "string",      "true",    "undefined", "upper",   "==",
    "!=",      "<",        "<=",       ">",           ">="};

class Parser {
 public:
  Parser(const Source& src, std::vector<Tok> toks) : src_(src), t_(std::move(toks)) {}

  Body parse_template() {
    std::string end;
    return parse_body({}, end, 0, "");
  }
  bool saw_generation = false;

 private:
  const Source& src_;
  std::vector<Tok> t_;
  size_t p_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;  // statements and expressions being parsed inside each other

  // One level deeper in the parser's recursion while it lives.
  struct Nested {
    Parser& p;
    explicit Nested(Parser& parser) : p(parser) {
      if (++p.depth_ > Limits::kMaxNesting) {
        --p.depth_;
        p.error(p.peek(), cat("the template nests blocks and expressions deeper than ",
                              Limits::kMaxNesting, " levels (onyx's bound)"));
      }
    }
    ~Nested() { --p.depth_; }
  };
  // A node whose operands are set: its height is bounded, so that no walk over the tree (the
  // renderer, the destructors) recurses without a bound, even through chains the parser builds
  // in loops (a.b.c..., x|f|g..., 1+1+1...).
  ExprP seal(ExprP e) {
    int h = 0;
    for (auto& c : e->a)
      if (c) h = std::max(h, c->height);
    for (auto& kv : e->kw)
      if (kv.second) h = std::max(h, kv.second->height);
    e->height = h + 1;
    if (e->height > Limits::kMaxNesting)
      src_.error(e->off, cat("the expression nests deeper than ", Limits::kMaxNesting,
                             " levels (onyx's bound)"));
    return e;
  }

  const Tok& peek(size_t ahead = 0) const { return t_[std::min(p_ + ahead, t_.size() - 1)]; }
  const Tok& next() { return t_[std::min(p_++, t_.size() - 1)]; }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).k == Tok::Op && peek(ahead).s == op;
  }
  bool is_name(const char* n, size_t ahead = 0) const {
    return peek(ahead).k == Tok::Name && peek(ahead).s == n;
  }
  static std::string describe(const Tok& t) {
    switch (t.k) {
      case Tok::End:
        return "end of template";
      case Tok::BlkE:
        return "end of statement block '%}'";
      case Tok::VarE:
        return "end of print statement '}}'";
      case Tok::Str:
        return "string";
      default:
        return "'" + t.s + "'";
    }
  }
  [[noreturn]] void error(const Tok& t, const std::string& msg) const { src_.error(t.off, msg); }
  void expect_op(const char* op) {
    if (!is_op(op)) error(peek(), cat("expected '", op, "', got ", describe(peek())));
    next();
  }
  void expect_block_end() {
    if (peek().k != Tok::BlkE) error(peek(), cat("expected '%}', got ", describe(peek())));
    next();
  }
  std::string expect_name() {
    if (peek().k != Tok::Name) error(peek(), cat("expected a name, got ", describe(peek())));
    return next().s;
  }
  ExprP node(Expr::K k, size_t off) {
    auto e = std::make_shared<Expr>();
    e->k = k;
    e->off = off;
    return e;
  }

  // Statements up to a {% NAME %} with NAME in `ends` (consumed up to the name; `end` is set).
  Body parse_body(const std::set<std::string>& ends, std::string& end, size_t opened,
                  const std::string& opener) {
    Body body;
    while (true) {
      const Tok& t = peek();
      if (t.k == Tok::End) {
        if (ends.empty()) return body;
        std::string want;
        for (auto& e : ends) want += (want.empty() ? "'" : " or '") + e + "'";
        src_.error(opened, cat("'", opener, "' block is never closed (expected ", want,
                               " before the end of the template)"));
      }
      if (t.k == Tok::Data) {
        auto s = std::make_shared<Stmt>();
        s->k = Stmt::Text;
        s->off = t.off;
        s->text = t.s;
        body.push_back(s);
        next();
      } else if (t.k == Tok::VarB) {
        next();
        auto s = std::make_shared<Stmt>();
        s->k = Stmt::Out;
        s->off = t.off;
        s->e = parse_tuple(true);
        if (peek().k != Tok::VarE) error(peek(), cat("expected '}}', got ", describe(peek())));
        next();
        body.push_back(s);
      } else if (t.k == Tok::BlkB) {
        const Tok& name = peek(1);
        if (name.k != Tok::Name) error(name, cat("expected a tag name, got ", describe(name)));
        if (ends.count(name.s)) {
          next();
          next();
          end = name.s;
          return body;
        }
        body.push_back(parse_statement());
      } else {
        error(t, cat("unexpected ", describe(t)));
      }
    }
  }

  StmtP parse_statement() {
    Nested nested(*this);
    const Tok& open = next();  // {%
    const Tok& tag = next();
    auto s = std::make_shared<Stmt>();
    s->off = open.off;
    const std::string& n = tag.s;
    std::string end;
    if (n == "for") {
      s->k = Stmt::For;
      s->targets = parse_targets();
      if (!is_name("in")) error(peek(), cat("expected 'in', got ", describe(peek())));
      next();
      s->e = parse_tuple(false);
      if (is_name("if")) {
        next();
        s->cond = parse_expression(true);
      }
      if (is_name("recursive")) error(peek(), "recursive loops are not supported");
      expect_block_end();
      loop_depth_++;
      s->body = parse_body({"endfor", "else"}, end, open.off, "for");
      loop_depth_--;
      if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endfor"}, end, open.off, "for");
      }
      expect_block_end();
    } else if (n == "if") {
      s->k = Stmt::If;
      s->conds.push_back(parse_tuple(true));
      expect_block_end();
      while (true) {
        s->bodies.push_back(parse_body({"elif", "else", "endif"}, end, open.off, "if"));
        if (end == "elif") {
          s->conds.push_back(parse_tuple(true));
          expect_block_end();
        } else if (end == "else") {
          expect_block_end();
          s->bodies.push_back(parse_body({"endif"}, end, open.off, "if"));
          expect_block_end();
          break;
        } else {
          expect_block_end();
          break;
        }
      }
    } else if (n == "set") {
      std::string first = expect_name();
      if (is_op(".")) {
        next();
        s->k = Stmt::Set;
        s->targets = {first};
        s->text = expect_name();
        expect_op("=");
        s->e = parse_tuple(true);
        expect_block_end();
      } else {
        s->targets = {first};
        while (is_op(",")) {
          next();
          s->targets.push_back(expect_name());
        }
        if (is_op("=")) {
          next();
          s->k = Stmt::Set;
          s->e = parse_tuple(true);
          expect_block_end();
        } else {
          if (s->targets.size() != 1) error(peek(), "expected '='");
          if (is_op("|")) error(peek(), "filters on a {% set %} block are not supported");
          s->k = Stmt::SetBlock;
          expect_block_end();
          s->body = parse_body({"endset"}, end, open.off, "set");
          expect_block_end();
        }
      }
    } else if (n == "macro") {
      s->k = Stmt::Macro;
      s->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        std::string pname = expect_name();
        ExprP def;
        if (is_op("=")) {
          next();
          def = parse_expression(true);
        }
        s->params.emplace_back(pname, def);
        if (!is_op(")")) expect_op(",");
      }
      next();
      expect_block_end();
      const int saved = loop_depth_;
      loop_depth_ = 0;
      s->body = parse_body({"endmacro"}, end, open.off, "macro");
      loop_depth_ = saved;
      if (peek().k == Tok::Name) next();  // {% endmacro name %}
      expect_block_end();
    } else if (n == "break" || n == "continue") {
      if (loop_depth_ == 0) error(tag, cat("'", n, "' outside of a loop"));
      s->k = n == "break" ? Stmt::Break : Stmt::Continue;
      expect_block_end();
    } else if (n == "generation") {
      s->k = Stmt::Generation;
      saw_generation = true;
      expect_block_end();
      s->body = parse_body({"endgeneration"}, end, open.off, "generation");
      expect_block_end();
    } else if (n == "extends" || n == "block" || n == "include" || n == "import" || n == "from" ||
               n == "call" || n == "filter" || n == "with" || n == "do" || n == "autoescape" ||
               n == "trans") {
      error(tag, cat("the '", n, "' tag is not supported in chat templates"));
    } else {
      error(tag, cat("unknown tag '", n, "'"));
    }
    return s;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> out;
    const bool paren = is_op("(");
    if (paren) next();
    out.push_back(expect_name());
    while (is_op(",")) {
      next();
      if (peek().k != Tok::Name) break;
      out.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return out;
  }

  // expression [',' expression ...] (a tuple when there is a comma)
  ExprP parse_tuple(bool with_condexpr) {
    const size_t off = peek().off;
    ExprP first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    auto t = node(Expr::TupleE, off);
    t->a.push_back(first);
    while (is_op(",")) {
      next();
      if (peek().k == Tok::BlkE || peek().k == Tok::VarE || is_op(")") || is_name("in")) break;
      t->a.push_back(parse_expression(with_condexpr));
    }
    return seal(t);
  }

  ExprP parse_expression(bool with_condexpr) {
    Nested nested(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }
  ExprP parse_condexpr() {
    Nested nested(*this);
    ExprP e = parse_or();
    while (is_name("if")) {
      const size_t off = next().off;
      auto c = node(Expr::Cond, off);
      c->a.push_back(e);
      c->a.push_back(parse_or());
      if (is_name("else")) {
        next();
        c->a.push_back(parse_condexpr());
      } else {
        c->a.push_back(nullptr);
      }
      e = seal(c);
    }
    return e;
  }
  ExprP parse_or() {
    ExprP e = parse_and();
    while (is_name("or")) {
      auto o = node(Expr::Or, next().off);
      o->a = {e, parse_and()};
      e = seal(o);
    }
    return e;
  }
  ExprP parse_and() {
    ExprP e = parse_not();
    while (is_name("and")) {
      auto o = node(Expr::And, next().off);
      o->a = {e, parse_not()};
      e = seal(o);
    }
    return e;
  }
  ExprP parse_not() {
    if (is_name("not")) {
      Nested nested(*this);
      auto o = node(Expr::Not, next().off);
      o->a = {parse_not()};
      return seal(o);
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    const size_t off = peek().off;
    ExprP e = parse_math1();
    std::shared_ptr<Expr> c;
    while (true) {
      std::string op;
      if (peek().k == Tok::Op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" ||
                                  peek().s == "<=" || peek().s == ">" || peek().s == ">=")) {
        op = next().s;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!c) {
        c = node(Expr::Cmp, off);
        c->a.push_back(e);
      }
      c->ops.push_back(op);
      c->a.push_back(parse_math1());
    }
    return c ? seal(c) : e;
  }
  ExprP bin(const std::string& op, size_t off, ExprP l, ExprP r) {
    auto b = node(Expr::Bin, off);
    b->name = op;
    b->a = {std::move(l), std::move(r)};
    return seal(b);
  }
  ExprP parse_math1() {
    ExprP e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Tok& t = next();
      e = bin(t.s, t.off, e, parse_concat());
    }
    return e;
  }
  ExprP parse_concat() {
    ExprP e = parse_math2();
    while (is_op("~")) {
      const Tok& t = next();
      e = bin("~", t.off, e, parse_math2());
    }
    return e;
  }
  ExprP parse_math2() {
    ExprP e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Tok& t = next();
      e = bin(t.s, t.off, e, parse_pow());
    }
    return e;
  }
  ExprP parse_pow() {
    ExprP e = parse_unary(true);
    while (is_op("**")) {
      const Tok& t = next();
      e = bin("**", t.off, e, parse_unary(true));
    }
    return e;
  }
  ExprP parse_unary(bool with_filter) {
    ExprP e;
    if (is_op("-") || is_op("+")) {
      Nested nested(*this);
      const Tok& t = next();
      e = node(t.s == "-" ? Expr::Neg : Expr::Pos, t.off);
      e->a = {parse_unary(false)};
      e = seal(e);
    } else {
      e = parse_postfix(parse_primary());
    }
    if (with_filter) e = parse_filter_expr(e);
    return e;
  }
  ExprP parse_primary() {
    const Tok& t = peek();
    if (t.k == Tok::Name) {
      next();
      auto e = node(Expr::Const, t.off);
      if (t.s == "true" || t.s == "True") {
        e->v = Value::boolean(true);
      } else if (t.s == "false" || t.s == "False") {
        e->v = Value::boolean(false);
      } else if (t.s == "none" || t.s == "None") {
        e->v = Value::none();
      } else {
        e->k = Expr::Name;
        e->name = t.s;
      }
      return e;
    }
    if (t.k == Tok::Str) {
      std::string s;
      const size_t off = t.off;
      while (peek().k == Tok::Str) s += next().s;
      auto e = node(Expr::Const, off);
      e->v = Value::str(s);
      return e;
    }
    if (t.k == Tok::Int || t.k == Tok::Float) {
      next();
      auto e = node(Expr::Const, t.off);
      e->v = t.k == Tok::Int ? Value::integer(t.i) : Value::flt(t.f);
      return e;
    }
    if (is_op("(")) {
      next();
      if (is_op(")")) {
        next();
        return node(Expr::TupleE, t.off);
      }
      ExprP e = parse_expression(true);
      if (is_op(",")) {
        auto tup = node(Expr::TupleE, t.off);
        tup->a.push_back(e);
        while (is_op(",")) {
          next();
          if (is_op(")")) break;
          tup->a.push_back(parse_expression(true));
        }
        e = seal(tup);
      }
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      next();
      auto e = node(Expr::ListE, t.off);
      while (!is_op("]")) {
        e->a.push_back(parse_expression(true));
        if (!is_op("]")) expect_op(",");
      }
      next();
      return seal(e);
    }
    if (is_op("{")) {
      next();
      auto e = node(Expr::DictE, t.off);
      while (!is_op("}")) {
        e->a.push_back(parse_expression(true));
        expect_op(":");
        e->a.push_back(parse_expression(true));
        if (!is_op("}")) expect_op(",");
      }
      next();
      return seal(e);
    }
    error(t, cat("unexpected ", describe(t)));
  }
  void parse_call_args(ExprP& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) error(peek(), "*args / **kwargs in calls are not supported");
      if (peek().k == Tok::Name && is_op("=", 1)) {
        std::string k = next().s;
        next();
        call->kw.emplace_back(k, parse_expression(true));
      } else {
        if (!call->kw.empty()) error(peek(), "a positional argument follows a keyword argument");
        call->a.push_back(parse_expression(true));
      }
      if (!is_op(")")) expect_op(",");
    }
    next();
  }
  ExprP parse_postfix(ExprP e) {
    while (true) {
      if (is_op(".")) {
        const Tok& dot = next();
        if (peek().k == Tok::Name) {
          auto a = node(Expr::Attr, dot.off);
          a->name = next().s;
          a->a = {e};
          e = seal(a);
        } else if (peek().k == Tok::Int) {
          auto a = node(Expr::Item, dot.off);
          auto idx = node(Expr::Const, peek().off);
          idx->v = Value::integer(next().i);
          a->a = {e, idx};
          e = seal(a);
        } else {
          error(peek(), cat("expected an attribute name after '.', got ", describe(peek())));
        }
      } else if (is_op("[")) {
        const Tok& br = next();
        ExprP parts[3];
        bool is_slice = false;
        for (int k = 0; k < 3; k++) {
          if (!is_op(":") && !is_op("]")) parts[k] = parse_expression(true);
          if (k < 2 && is_op(":")) {
            next();
            is_slice = true;
          } else {
            break;
          }
        }
        expect_op("]");
        auto a = node(is_slice ? Expr::Slice : Expr::Item, br.off);
        if (!is_slice && !parts[0]) error(br, "expected an index inside '[]'");
        a->a = {e, parts[0], parts[1], parts[2]};
        if (!is_slice) a->a.resize(2);
        e = seal(a);
      } else if (is_op("(")) {
        auto c = node(Expr::Call, e->off);
        c->a.push_back(e);
        parse_call_args(c);
        e = seal(c);
      } else {
        return e;
      }
    }
  }
  ExprP parse_filter_expr(ExprP e) {
    while (true) {
      if (is_op("|")) {
        next();
        const Tok& nt = peek();
        std::string name = expect_name();
        while (is_op(".")) {
          next();
          name += "." + expect_name();
        }
        if (!kFilters.count(name)) error(nt, cat("unknown filter '", name, "'"));
        auto f = node(Expr::Filter, nt.off);
        f->name = name;
        f->a.push_back(e);
        if (is_op("(")) parse_call_args(f);
        e = seal(f);
      } else if (is_name("is")) {
        next();
        auto t = node(Expr::Test, peek().off);
        if (is_name("not")) {
          next();
          t->neg = true;
        }
        const Tok& nt = peek();
        std::string name;
        if (nt.k == Tok::Name || (nt.k == Tok::Op && kTests.count(nt.s)))
          name = next().s;
        else
          error(nt, cat("expected a test name after 'is', got ", describe(nt)));
        if (!kTests.count(name)) error(nt, cat("unknown test '", name, "'"));
        t->name = name;
        t->a.push_back(e);
        if (is_op("(")) {
          parse_call_args(t);
        } else {
          const Tok& c = peek();
          const bool arg_start = c.k == Tok::Name || c.k == Tok::Str || c.k == Tok::Int ||
                                 c.k == Tok::Float ||
                                 (c.k == Tok::Op && (c.s == "(" || c.s == "[" || c.s == "{"));
          if (arg_start && !is_name("else") && !is_name("or") && !is_name("and")) {
            if (is_name("is")) error(c, "you cannot chain multiple tests with 'is'");
            t->a.push_back(parse_postfix(parse_primary()));
          }
        }
        e = seal(t);
      } else if (is_op("(")) {
        auto c = node(Expr::Call, peek().off);
        c->a.push_back(e);
        parse_call_args(c);
        e = seal(c);
      } else {
        return e;
      }
    }
  }
};

}  // namespace

// ---------------------------------------------------------------- renderer

struct ChatTemplateImpl {
  Source src;
  Body body;
  bool has_generation = false;
};

namespace {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  Scope* parent = nullptr;
};

enum class Flow { Next, Break, Continue };

const Value* kwarg(const Kwargs& kw, const char* name) {
  for (auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}
// The idx-th positional argument or the keyword `name`; null when neither is given.
const Value* arg(const Args& a, const Kwargs& kw, size_t idx, const char* name) {
  if (idx < a.size()) return &a[idx];
  return kwarg(kw, name);
}
void check_args(const std::string& what, const Args& a, const Kwargs& kw, size_t max_pos,
                std::initializer_list<const char*> names) {
  if (a.size() > max_pos)
    fail(cat(what, "() takes at most ", max_pos, " positional arguments (", a.size(), " given)"));
  for (auto& [k, v] : kw) {
    bool ok = false;
    for (const char* n : names) ok |= k == n;
    if (!ok) fail(cat(what, "() got an unexpected keyword argument '", k, "'"));
  }
}
std::string need_str(const Value& v, const char* what) {
  if (v.t == Value::Undef) fail_undefined(v);
  if (v.t != Value::Str) fail(cat(what, " must be a string, not '", type_name(v), "'"));
  return v.s;
}
int64_t need_int(const Value& v, const char* what) {
  if (v.t == Value::Undef) fail_undefined(v);
  if (v.t != Value::Int && v.t != Value::Bool)
    fail(cat(what, " must be an integer, not '", type_name(v), "'"));
  return v.as_int();
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& nw,
                       int64_t count) {
  std::string out;
  if (old.empty()) {
    int64_t done = 0;
    size_t i = 0;
    if (count != 0) {
      out += nw;
      done++;
    }
    while (i < s.size()) {
      size_t b = i;
      next_cp(s, i);
      out += s.substr(b, i - b);
      if (count < 0 || done < count) {
        out += nw;
        done++;
      }
      check_string_size(out.size());
    }
    return out;
  }
  size_t i = 0;
  int64_t done = 0;
  while (true) {
    size_t j = (count >= 0 && done >= count) ? std::string::npos : s.find(old, i);
    if (j == std::string::npos) {
      out += s.substr(i);
      return out;
    }
    out += s.substr(i, j - i) + nw;
    check_string_size(out.size());
    i = j + old.size();
    done++;
  }
}

ValueList py_split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right) {
  ValueList out;
  if (!sep || sep->t == Value::None || sep->t == Value::Undef) {
    std::u32string u = to_u32(s);
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0;
    while (i < u.size()) {
      while (i < u.size() && py_space(u[i])) i++;
      if (i >= u.size()) break;
      size_t b = i;
      while (i < u.size() && !py_space(u[i])) i++;
      words.emplace_back(b, i);
    }
    if (maxsplit < 0 || (int64_t)words.size() - 1 <= maxsplit) {
      for (auto [b, e] : words) out.push_back(Value::str(to_u8(u.substr(b, e - b))));
      return out;
    }
    if (!from_right) {
      for (int64_t k = 0; k < maxsplit; k++)
        out.push_back(
            Value::str(to_u8(u.substr(words[k].first, words[k].second - words[k].first))));
      size_t e = u.size();
      while (e > 0 && py_space(u[e - 1])) e--;
      out.push_back(Value::str(to_u8(u.substr(words[maxsplit].first, e - words[maxsplit].first))));
    } else {
      const size_t keep = words.size() - maxsplit;
      size_t b = 0;
      while (b < u.size() && py_space(u[b])) b++;
      out.push_back(Value::str(to_u8(u.substr(b, words[keep - 1].second - b))));
      for (size_t k = keep; k < words.size(); k++)
        out.push_back(
            Value::str(to_u8(u.substr(words[k].first, words[k].second - words[k].first))));
    }
    return out;
  }
  const std::string d = need_str(*sep, "the separator");
  if (d.empty()) fail("empty separator");
  std::vector<std::string> parts;
  size_t i = 0;
  while (true) {
    size_t j = s.find(d, i);
    if (j == std::string::npos) break;
    parts.push_back(s.substr(i, j - i));
    i = j + d.size();
  }
  parts.push_back(s.substr(i));
  if (maxsplit >= 0 && (int64_t)parts.size() - 1 > maxsplit) {
    std::vector<std::string> merged;
    if (!from_right) {
      for (int64_t k = 0; k < maxsplit; k++) merged.push_back(parts[k]);
      std::string rest = parts[maxsplit];
      for (size_t k = maxsplit + 1; k < parts.size(); k++) rest += d + parts[k];
      merged.push_back(rest);
    } else {
      const size_t keep = parts.size() - maxsplit;
      std::string rest = parts[0];
      for (size_t k = 1; k < keep; k++) rest += d + parts[k];
      merged.push_back(rest);
      for (size_t k = keep; k < parts.size(); k++) merged.push_back(parts[k]);
    }
    parts = std::move(merged);
  }
  for (auto& p : parts) out.push_back(Value::str(p));
  return out;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == '\n' || s[i] == '\r') {
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') i++;
      out.push_back(cur);
      cur.clear();
    } else {
      cur += s[i];
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

Value str_method(const std::string& s, const std::string& m, Args& a, Kwargs& kw) {
  auto n_args = [&](size_t lo, size_t hi) {
    if (a.size() < lo || a.size() > hi)
      fail(cat("str.", m, "() takes ", lo == hi ? cat(lo) : cat(lo, " to ", hi), " arguments (",
               a.size(), " given)"));
  };
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    n_args(0, 1);
    return Value::str(py_strip(s, a.empty() ? nullptr : &a[0], m != "rstrip", m != "lstrip"));
  }
  if (m == "split" || m == "rsplit") {
    check_args("str." + m, a, kw, 2, {"sep", "maxsplit"});
    const Value* mx = arg(a, kw, 1, "maxsplit");
    return Value::list(
        py_split(s, arg(a, kw, 0, "sep"), mx ? need_int(*mx, "maxsplit") : -1, m == "rsplit"));
  }
  if (m == "startswith" || m == "endswith") {
    n_args(1, 1);
    std::vector<std::string> cands;
    if (a[0].t == Value::List)
      for (auto& x : *a[0].l) cands.push_back(need_str(x, "the prefix"));
    else
      cands.push_back(need_str(a[0], "the prefix"));
    for (auto& c : cands) {
      if (c.size() > s.size()) continue;
      if (m == "startswith" ? s.compare(0, c.size(), c) == 0
                            : s.compare(s.size() - c.size(), c.size(), c) == 0)
        return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (m == "upper") return n_args(0, 0), Value::str(str_upper(s));
  if (m == "lower") return n_args(0, 0), Value::str(str_lower(s));
  if (m == "title") return n_args(0, 0), Value::str(str_py_title(s));
  if (m == "capitalize") return n_args(0, 0), Value::str(str_capitalize(s));
  if (m == "replace") {
    n_args(2, 3);
    return Value::str(py_replace(s, need_str(a[0], "old"), need_str(a[1], "new"),
                                 a.size() > 2 ? need_int(a[2], "count") : -1));
  }
  if (m == "find" || m == "rfind" || m == "index" || m == "count") {
    n_args(1, 1);
    const std::string sub = need_str(a[0], "the substring");
    if (m == "count") {
      if (sub.empty()) return Value::integer(cp_len(s) + 1);
      int64_t c = 0;
      for (size_t i = s.find(sub); i != std::string::npos; i = s.find(sub, i + sub.size())) c++;
      return Value::integer(c);
    }
    size_t j = m == "rfind" ? s.rfind(sub) : s.find(sub);
    if (j == std::string::npos) {
      if (m == "index") fail("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(cp_len(s.substr(0, j)));
  }
  if (m == "join") {
    n_args(1, 1);
    std::string out;
    bool first = true;
    for (auto& x : iterate(a[0])) {
      if (x.t != Value::Str)
        fail(cat("sequence item: expected str instance, ", type_name(x), " found"));
      out += (first ? "" : s) + x.s;
      check_string_size(out.size());
      first = false;
    }
    return Value::str(out);
  }
  if (m == "splitlines") {
    n_args(0, 0);
    ValueList out;
    for (auto& l : split_lines(s)) out.push_back(Value::str(l));
    return Value::list(out);
  }
  if (m == "removeprefix" || m == "removesuffix") {
    n_args(1, 1);
    const std::string x = need_str(a[0], "the affix");
    if (m == "removeprefix" && s.compare(0, x.size(), x) == 0)
      return Value::str(s.substr(x.size()));
    if (m == "removesuffix" && x.size() <= s.size() && !x.empty() &&
        s.compare(s.size() - x.size(), x.size(), x) == 0)
      return Value::str(s.substr(0, s.size() - x.size()));
    return Value::str(s);
  }
  if (m == "isdigit" || m == "isalpha" || m == "isspace" || m == "isalnum" || m == "isupper" ||
      m == "islower") {
    n_args(0, 0);
    std::u32string u = to_u32(s);
    if (u.empty()) return Value::boolean(false);
    bool any_cased = false, ok = true;
    for (char32_t c : u) {
      if (m == "isdigit") ok &= cp_digit(c);
      if (m == "isalpha") ok &= cp_alpha(c);
      if (m == "isspace") ok &= py_space(c);
      if (m == "isalnum") ok &= cp_alpha(c) || cp_digit(c);
      if (m == "isupper" || m == "islower") {
        if (cp_cased(c)) {
          any_cased = true;
          ok &= m == "isupper" ? cp_upper(c) == c : cp_lower(c) == c;
        }
      }
    }
    if (m == "isupper" || m == "islower") ok &= any_cased;
    return Value::boolean(ok);
  }
  fail(cat("'str object' has no method '", m, "'"));
}

const std::set<std::string> kStrMethods = {
    "strip",   "lstrip",  "rstrip",  "split",      "rsplit",       "startswith",   "endswith",
    "upper",   "lower",   "title",   "capitalize", "replace",      "find",         "rfind",
    "index",   "count",   "join",    "splitlines", "removeprefix", "removesuffix", "isdigit",
    "isalpha", "isspace", "isalnum", "isupper",    "islower"};
const std::set<std::string> kDictMethods = {"get", "items", "keys", "values"};
const std::set<std::string> kListMethods = {"index", "count"};

Value items_of(const Value& d) {
  ValueList out;
  for (auto& [k, v] : *d.d) out.push_back(Value::list({Value::str(k), v}, true));
  return Value::list(std::move(out));
}

Value dict_method(const Value& d, const std::string& m, Args& a, Kwargs& kw) {
  if (m == "get") {
    if (a.empty() || a.size() > 2) fail("dict.get() takes 1 or 2 arguments");
    if (a[0].t == Value::Str)
      if (const Value* v = d.find(a[0].s)) return *v;
    return a.size() > 1 ? a[1] : Value::none();
  }
  if (!a.empty()) fail(cat("dict.", m, "() takes no arguments"));
  if (m == "items") return items_of(d);
  ValueList out;
  for (auto& [k, v] : *d.d) out.push_back(m == "keys" ? Value::str(k) : v);
  return Value::list(std::move(out));
}

Value bound_method(const Value& obj, const std::string& m) {
  auto call = [m](const Value& self, Args& a, Kwargs& kw) -> Value {
    if (self.t == Value::Str) return str_method(self.s, m, a, kw);
    if (self.t == Value::Dict) return dict_method(self, m, a, kw);
    if (a.size() != 1) fail(cat("list.", m, "() takes exactly one argument"));
    int64_t c = 0;
    for (size_t k = 0; k < self.l->size(); k++) {
      if (py_eq((*self.l)[k], a[0])) {
        if (m == "index") return Value::integer((int64_t)k);
        c++;
      }
    }
    if (m == "index") fail("x not in list");
    return Value::integer(c);
  };
  return Value::func(m, call, obj);
}

// obj.name: an attribute (a method) first, then an item, as Jinja's getattr.
Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.t) {
    case Value::Undef:
      fail_undefined(obj);
    case Value::Dict:
      if (!obj.ns && kDictMethods.count(name)) return bound_method(obj, name);
      if (const Value* v = obj.find(name)) return *v;
      return Value::undef(
          cat("'", obj.ns ? "Namespace" : "dict object", "' has no attribute '", name, "'"));
    case Value::Str:
      if (kStrMethods.count(name)) return bound_method(obj, name);
      break;
    case Value::List:
      if (!obj.tuple && kListMethods.count(name)) return bound_method(obj, name);
      break;
    default:
      break;
  }
  return Value::undef(cat("'", type_name(obj), " object' has no attribute '", name, "'"));
}

// obj[key]: an item first, then (for a string key) an attribute, as Jinja's getitem.
Value get_item(const Value& obj, const Value& key) {
  if (obj.t == Value::Undef) fail_undefined(obj);
  if (key.t == Value::Undef) fail_undefined(key);
  if (obj.t == Value::Dict && key.t == Value::Str) {
    if (const Value* v = obj.find(key.s)) return *v;
  } else if ((obj.t == Value::List || obj.t == Value::Str) &&
             (key.t == Value::Int || key.t == Value::Bool)) {
    int64_t n = py_len(obj), i = key.as_int();
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      if (obj.t == Value::List) return (*obj.l)[i];
      std::u32string u = to_u32(obj.s);
      return Value::str(cp_u8(u[i]));
    }
    return Value::undef(cat("'", type_name(obj), " object' has no element ", key.as_int()));
  }
  if (key.t == Value::Str) return get_attr(obj, key.s);
  return Value::undef(cat("'", type_name(obj), " object' has no element ", py_repr(key)));
}

Value get_slice(const Value& obj, const Value& b, const Value& e, const Value& st) {
  if (obj.t == Value::Undef) fail_undefined(obj);
  if (obj.t == Value::List) {
    ValueList out;
    for (int64_t k : slice_indices((int64_t)obj.l->size(), b, e, st)) out.push_back((*obj.l)[k]);
    return Value::list(std::move(out), obj.tuple);
  }
  if (obj.t == Value::Str) {
    std::u32string u = to_u32(obj.s), out;
    for (int64_t k : slice_indices((int64_t)u.size(), b, e, st)) out.push_back(u[k]);
    return Value::str(to_u8(out));
  }
  // the sandbox's getitem turns the TypeError into an undefined value
  return Value::undef(cat("'", type_name(obj), " object' has no element slice"));
}

bool py_in(const Value& x, const Value& c) {
  switch (c.t) {
    case Value::Undef:
      return false;
    case Value::Str:
      if (x.t == Value::Undef) fail_undefined(x);
      if (x.t != Value::Str)
        fail(cat("'in <string>' requires string as left operand, not ", type_name(x)));
      return c.s.find(x.s) != std::string::npos;
    case Value::List:
      for (auto& y : *c.l)
        if (py_eq(x, y)) return true;
      return false;
    case Value::Dict:
      if ((x.t == Value::List && !x.tuple) || x.t == Value::Dict)
        fail(cat("unhashable type: '", type_name(x), "'"));
      return x.t == Value::Str && c.find(x.s);
    default:
      fail(cat("argument of type '", type_name(c), "' is not iterable"));
  }
}

// seq * times, as Python repeats a str / list / tuple (times <= 0: empty).
Value repeat(const Value& seq, int64_t times) {
  if (times <= 0) return seq.t == Value::Str ? Value::str("") : Value::list({}, seq.tuple);
  if (seq.t == Value::Str) {
    if (!seq.s.empty() && (uint64_t)times > (uint64_t)Limits::kMaxString / seq.s.size())
      check_string_size(UINT64_MAX);
    std::string out;
    out.reserve(seq.s.size() * times);
    for (int64_t k = 0; k < times; k++) out += seq.s;
    return Value::str(std::move(out));
  }
  if (!seq.l->empty() && (uint64_t)times > (uint64_t)Limits::kMaxItems / seq.l->size())
    check_items(UINT64_MAX);
  ValueList out;
  for (int64_t k = 0; k < times; k++) out.insert(out.end(), seq.l->begin(), seq.l->end());
  return Value::list(std::move(out), seq.tuple);
}

[[noreturn]] void int_overflow(const std::string& op, int64_t a, int64_t b) {
  fail(cat(
      "integer overflow: ", a, " ", op, " ", b,
      " does not fit in 64 bits (Python's big integers are not supported in onyx's templates)"));
}

// Python's int ** int for b >= 0, by squaring; an overflow is an error.
int64_t int_pow(int64_t a, int64_t b) {
  int64_t out = 1, base = a;
  for (int64_t e = b; e > 0; e >>= 1) {
    if ((e & 1) && __builtin_mul_overflow(out, base, &out)) int_overflow("**", a, b);
    if (e > 1 && __builtin_mul_overflow(base, base, &base)) int_overflow("**", a, b);
  }
  return out;
}

// Python's integer + - * // % ** on 64-bit values: floor division and a modulo with the
// divisor's sign, defined for every input; a result beyond 64 bits is an error, never a wrap.
Value int_arith(const std::string& op, int64_t a, int64_t b) {
  int64_t r = 0;
  if (op == "+" || op == "-" || op == "*") {
    const bool over = op == "+"   ? __builtin_add_overflow(a, b, &r)
                      : op == "-" ? __builtin_sub_overflow(a, b, &r)
                                  : __builtin_mul_overflow(a, b, &r);
    if (over) int_overflow(op, a, b);
    return Value::integer(r);
  }
  if (op == "//" || op == "%") {
    if (b == 0) fail("integer division or modulo by zero");
    if (b == -1) {  // the one quotient that can overflow: INT64_MIN // -1
      if (op == "%") return Value::integer(0);
      if (a == INT64_MIN) int_overflow(op, a, b);
      return Value::integer(-a);
    }
    int64_t q = a / b, m = a % b;
    if (m != 0 && ((m < 0) != (b < 0))) {
      q -= 1;
      m += b;
    }
    return Value::integer(op == "//" ? q : m);
  }
  if (op == "**") {
    if (b < 0) return Value::flt(std::pow((double)a, (double)b));
    return Value::integer(int_pow(a, b));
  }
  fail(cat("unknown operator ", op));
}

Value arith(const std::string& op, const Value& l, const Value& r) {
  if (op == "~") return Value::str(py_str(l) + py_str(r));
  if (l.t == Value::Undef) fail_undefined(l);
  if (r.t == Value::Undef) fail_undefined(r);
  if (op == "+") {
    if (l.t == Value::Str && r.t == Value::Str) return Value::str(l.s + r.s);
    if (l.t == Value::List && r.t == Value::List && l.tuple == r.tuple) {
      ValueList out = *l.l;
      out.insert(out.end(), r.l->begin(), r.l->end());
      return Value::list(std::move(out), l.tuple);
    }
  }
  if (op == "*") {
    const Value *seq = nullptr, *n = nullptr;
    if ((l.t == Value::Str || l.t == Value::List) && (r.t == Value::Int || r.t == Value::Bool))
      seq = &l, n = &r;
    if ((r.t == Value::Str || r.t == Value::List) && (l.t == Value::Int || l.t == Value::Bool))
      seq = &r, n = &l;
    if (seq) return repeat(*seq, n->as_int());
  }
  if (!l.numeric() || !r.numeric())
    fail(cat("unsupported operand type(s) for ", op, ": '", type_name(l), "' and '", type_name(r),
             "'"));
  if (op == "/") {
    if (r.num() == 0) fail("division by zero");
    return Value::flt(l.num() / r.num());
  }
  if (l.t != Value::Float && r.t != Value::Float) return int_arith(op, l.as_int(), r.as_int());
  const double a = l.num(), b = r.num();
  if (op == "+") return Value::flt(a + b);
  if (op == "-") return Value::flt(a - b);
  if (op == "*") return Value::flt(a * b);
  if (op == "//" || op == "%") {
    if (b == 0) fail("float division or modulo by zero");
    double m = std::fmod(a, b);
    if (m != 0 && ((m < 0) != (b < 0))) m += b;
    return Value::flt(op == "//" ? std::floor(a / b) : m);
  }
  if (op == "**") return Value::flt(std::pow(a, b));
  fail(cat("unknown operator ", op));
}

[[noreturn]] void int_too_big(const std::string& what) {
  fail(cat("the integer ", what,
           " does not fit in 64 bits (Python's big integers are not supported in onyx's "
           "templates)"));
}

// Python's int() of a float, as jinja2's int filter sees it: NaN gives the filter's default (a
// ValueError), an infinity is an error (OverflowError), others truncate toward zero.
Value float_to_int(double x, const Value& nan_fallback) {
  if (std::isnan(x)) return nan_fallback;
  if (std::isinf(x)) fail("cannot convert float infinity to integer");
  const double t = std::trunc(x);
  if (t >= 9223372036854775808.0 || t < -9223372036854775808.0) int_too_big(py_float(x));
  return Value::integer((int64_t)t);
}

// Python's round(v, ndigits) of an int: v itself for ndigits >= 0, else to the nearest multiple
// of 10**-ndigits, halves to even.
int64_t round_int(int64_t v, int64_t ndigits) {
  if (ndigits >= 0) return v;
  if (ndigits < -38) return 0;
  __int128 pw = 1;
  for (int64_t k = 0; k < -ndigits; k++) pw *= 10;
  __int128 q = v / pw, r = v - q * pw;
  if (r < 0) q -= 1, r += pw;  // floor division
  if (2 * r > pw || (2 * r == pw && (q & 1))) q += 1;
  const __int128 out = q * pw;
  if (out > INT64_MAX || out < INT64_MIN) int_too_big(cat("round(", v, ", ", ndigits, ")"));
  return (int64_t)out;
}

// ' ' * n as Python makes it (n <= 0: empty).
std::string spaces(int64_t n) {
  if (n <= 0) return "";
  check_string_size((uint64_t)n);
  return std::string((size_t)n, ' ');
}

class Renderer {
 public:
  Renderer(const ChatTemplateImpl& t, std::string& out,
           std::vector<std::pair<size_t, size_t>>& spans)
      : t_(t), out_(&out), spans_(&spans) {}

  void run(Scope& root) {
    Budget budget;
    Installed installed(budget);
    root_ = &root;
    exec(t_.body, root);
  }

 private:
  const ChatTemplateImpl& t_;
  std::string* out_;
  std::vector<std::pair<size_t, size_t>>* spans_;
  Scope* root_ = nullptr;
  int depth_ = 0;        // statements, expressions and macro calls being evaluated
  int macro_depth_ = 0;  // macro calls being evaluated
  int capture_ = 0;      // > 0 while a macro or {% set %} block renders into its own buffer

  // One level deeper while it lives; each level is a step of the budget.
  // The budget of this thread's render while it lives; then the namespaces are emptied.
  struct Installed {
    Budget& budget;
    Budget* saved;
    explicit Installed(Budget& b) : budget(b), saved(t_budget) { t_budget = &b; }
    ~Installed() {
      t_budget = saved;
      for (auto& w : budget.namespaces)
        if (auto d = w.lock()) ValueDict().swap(*d);
    }
  };

  struct Nested {
    int& depth;
    explicit Nested(int& d) : depth(d) {
      if (++depth > Limits::kMaxRenderDepth) {
        --depth;
        fail(cat("the template nests statements, expressions and macro calls deeper than ",
                 Limits::kMaxRenderDepth, " levels (onyx's bound)"));
      }
      charge_steps(1);
    }
    ~Nested() { --depth; }
  };

  void write(const std::string& text) {
    check_string_size(out_->size() + text.size());
    *out_ += text;
  }

  [[noreturn]] void located(size_t off, RtError& e) {
    if (!e.located) {
      e.msg = t_.src.where(off) + ": " + e.msg;
      e.located = true;
    }
    throw e;
  }

  Value lookup(const std::string& name, Scope& sc) {
    for (Scope* s = &sc; s; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return it->second;
    }
    return global(name);
  }

  Value global(const std::string& name) {
    if (name == "range")
      return Value::func(name, [](const Value&, Args& a, Kwargs&) {
        if (a.empty() || a.size() > 3) fail("range() takes 1 to 3 arguments");
        int64_t b = 0, e, st = 1;
        if (a.size() == 1) {
          e = need_int(a[0], "range()'s argument");
        } else {
          b = need_int(a[0], "range()'s start");
          e = need_int(a[1], "range()'s stop");
          if (a.size() == 3) st = need_int(a[2], "range()'s step");
        }
        if (st == 0) fail("range() arg 3 must not be zero");
        ValueList out;
        for (__int128 k = b; st > 0 ? k < e : k > e; k += st) {
          out.push_back(Value::integer((int64_t)k));
          if (out.size() > 100000) fail("range too big, the sandbox allows 100000 items");
        }
        return Value::list(std::move(out));
      });
    if (name == "raise_exception")
      return Value::func(name, [](const Value&, Args& a, Kwargs&) -> Value {
        fail(cat("the template raised an exception: ", a.empty() ? "" : py_str(a[0])));
      });
    if (name == "strftime_now")
      return Value::func(name, [](const Value&, Args& a, Kwargs&) {
        if (a.size() != 1) fail("strftime_now() takes one argument (the format)");
        const std::string fmt = need_str(a[0], "strftime_now()'s format");
        std::time_t now = std::time(nullptr);
        std::tm tm{};
        localtime_r(&now, &tm);
        std::string buf(fmt.size() * 8 + 64, '\0');
        size_t n = fmt.empty() ? 0 : std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
        buf.resize(n);
        return Value::str(buf);
      });
    if (name == "namespace" || name == "dict")
      return Value::func(name, [name](const Value&, Args& a, Kwargs& kw) {
        ValueDict d;
        auto put = [&](const std::string& k, const Value& v) {
          if (name == "namespace" && !k.empty() && k[0] == '_')
            fail(
                cat("chat templates cannot store underscore-prefixed attributes on a namespace, "
                    "but got '",
                    k, "'"));
          for (auto& [dk, dv] : d)
            if (dk == k) {
              dv = v;
              return;
            }
          d.emplace_back(k, v);
        };
        if (a.size() > 1) fail(cat(name, "() takes at most one positional argument"));
        if (a.size() == 1) {
          if (a[0].t != Value::Dict) fail(cat(name, "()'s argument must be a mapping"));
          for (auto& [k, v] : *a[0].d) put(k, v);
        }
        for (auto& [k, v] : kw) put(k, v);
        return Value::dict(std::move(d), name == "namespace");
      });
    return Value::undef(cat("'", name, "' is undefined"));
  }

  Flow exec(const Body& body, Scope& sc) {
    for (auto& s : body) {
      Flow f = exec(*s, sc);
      if (f != Flow::Next) return f;
    }
    return Flow::Next;
  }

  void assign(Scope& sc, const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      sc.vars[targets[0]] = v;
      return;
    }
    if (v.t != Value::List)
      fail(cat("cannot unpack a '", type_name(v), "' into ", targets.size(), " names"));
    if (v.l->size() != targets.size())
      fail(cat("cannot unpack ", v.l->size(), " values into ", targets.size(), " names"));
    for (size_t k = 0; k < targets.size(); k++) sc.vars[targets[k]] = (*v.l)[k];
  }

  Flow exec(const Stmt& s, Scope& sc) {
    try {
      Nested nested(depth_);
      switch (s.k) {
        case Stmt::Text:
          write(s.text);
          return Flow::Next;
        case Stmt::Out:
          write(py_str(eval(*s.e, sc)));
          return Flow::Next;
        case Stmt::If:
          for (size_t k = 0; k < s.conds.size(); k++)
            if (truthy(eval(*s.conds[k], sc))) return exec(s.bodies[k], sc);
          if (s.bodies.size() > s.conds.size()) return exec(s.bodies.back(), sc);
          return Flow::Next;
        case Stmt::For:
          return exec_for(s, sc);
        case Stmt::Set: {
          Value v = eval(*s.e, sc);
          if (s.text.empty()) {
            assign(sc, s.targets, v);
          } else {
            Value ns = lookup(s.targets[0], sc);
            if (ns.t != Value::Dict || !ns.ns)
              fail(cat("cannot assign attribute on non-namespace object '", s.targets[0], "'"));
            if (!s.text.empty() && s.text[0] == '_')
              fail(
                  cat("chat templates cannot store underscore-prefixed attributes on a "
                      "namespace, but got '",
                      s.text, "'"));
            bool found = false;
            for (auto& [k, x] : *ns.d)
              if (k == s.text) {
                x = v;
                found = true;
              }
            if (!found) ns.d->emplace_back(s.text, v);
          }
          return Flow::Next;
        }
        case Stmt::SetBlock: {
          std::string buf;
          std::string* saved = out_;
          out_ = &buf;
          capture_++;
          try {
            exec(s.body, sc);
          } catch (...) {
            out_ = saved;
            capture_--;
            throw;
          }
          out_ = saved;
          capture_--;
          sc.vars[s.targets[0]] = Value::str(buf);
          return Flow::Next;
        }
        case Stmt::Macro:
          sc.vars[s.text] = make_macro(s);
          return Flow::Next;
        case Stmt::Break:
          return Flow::Break;
        case Stmt::Continue:
          return Flow::Continue;
        case Stmt::Generation: {
          const size_t begin = out_->size();
          Flow f = exec(s.body, sc);
          if (capture_ == 0) spans_->emplace_back(begin, out_->size());
          return f;
        }
      }
    } catch (RtError& e) {
      located(s.off, e);
    }
    return Flow::Next;
  }

  Flow exec_for(const Stmt& s, Scope& sc) {
    ValueList items;
    {
      Value seq = eval(*s.e, sc);
      ValueList all = iterate(seq);
      if (!s.cond) {
        items = std::move(all);
      } else {
        for (auto& x : all) {
          Scope f{{}, &sc};
          assign(f, s.targets, x);
          if (truthy(eval(*s.cond, f))) items.push_back(x);
        }
      }
    }
    const int64_t n = (int64_t)items.size();
    for (int64_t k = 0; k < n; k++) {
      Scope it{{}, &sc};
      assign(it, s.targets, items[k]);
      ValueDict loop = {
          {"index", Value::integer(k + 1)},
          {"index0", Value::integer(k)},
          {"revindex", Value::integer(n - k)},
          {"revindex0", Value::integer(n - k - 1)},
          {"first", Value::boolean(k == 0)},
          {"last", Value::boolean(k == n - 1)},
          {"length", Value::integer(n)},
          {"depth", Value::integer(1)},
          {"depth0", Value::integer(0)},
          {"previtem", k > 0 ? items[k - 1] : Value::undef("there is no previous item")},
          {"nextitem", k + 1 < n ? items[k + 1] : Value::undef("there is no next item")},
          {"cycle", Value::func("cycle", [k](const Value&, Args& a, Kwargs&) {
             if (a.empty()) fail("no items for cycling given");
             return a[k % a.size()];
           })}};
      it.vars["loop"] = Value::dict(std::move(loop));
      Flow f = exec(s.body, it);
      if (f == Flow::Break) break;
    }
    if (n == 0) return exec(s.else_body, sc);
    return Flow::Next;
  }

  Value make_macro(const Stmt& s) {
    const Stmt* m = &s;
    return Value::func(s.text, [this, m](const Value&, Args& a, Kwargs& kw) {
      if (a.size() > m->params.size())
        fail(cat("macro '", m->text, "' takes not more than ", m->params.size(), " argument(s)"));
      if (++macro_depth_ > Limits::kMaxMacroDepth) {
        macro_depth_--;
        fail(cat("macros call each other deeper than ", Limits::kMaxMacroDepth,
                 " levels (onyx's bound)"));
      }
      Scope ms{{}, root_};
      for (size_t k = 0; k < m->params.size(); k++) {
        const auto& [pname, def] = m->params[k];
        const Value* given = k < a.size() ? &a[k] : kwarg(kw, pname.c_str());
        if (given)
          ms.vars[pname] = *given;
        else if (def)
          ms.vars[pname] = eval(*def, ms);
        else
          ms.vars[pname] = Value::undef(cat("parameter '", pname, "' was not provided"));
      }
      for (auto& [k, v] : kw) {
        bool known = false;
        for (auto& p : m->params) known |= p.first == k;
        if (!known) fail(cat("macro '", m->text, "' takes no keyword argument '", k, "'"));
      }
      std::string buf;
      std::string* saved = out_;
      out_ = &buf;
      capture_++;
      try {
        exec(m->body, ms);
      } catch (...) {
        out_ = saved;
        capture_--;
        macro_depth_--;
        throw;
      }
      out_ = saved;
      capture_--;
      macro_depth_--;
      return Value::str(buf);
    });
  }

  Value eval(const Expr& e, Scope& sc) {
    try {
      Nested nested(depth_);
      return eval_inner(e, sc);
    } catch (RtError& err) {
      located(e.off, err);
    }
  }

  Value eval_inner(const Expr& e, Scope& sc) {
    switch (e.k) {
      case Expr::Const:
        return e.v;
      case Expr::Name:
        return lookup(e.name, sc);
      case Expr::Attr:
        return get_attr(eval(*e.a[0], sc), e.name);
      case Expr::Item:
        return get_item(eval(*e.a[0], sc), eval(*e.a[1], sc));
      case Expr::Slice: {
        Value obj = eval(*e.a[0], sc);
        Value parts[3];
        for (int k = 0; k < 3; k++)
          if (e.a[k + 1]) parts[k] = eval(*e.a[k + 1], sc);
        return get_slice(obj, parts[0], parts[1], parts[2]);
      }
      case Expr::Call: {
        Value f = eval(*e.a[0], sc);
        Args args;
        Kwargs kw;
        for (size_t k = 1; k < e.a.size(); k++) args.push_back(eval(*e.a[k], sc));
        for (auto& [k, x] : e.kw) kw.emplace_back(k, eval(*x, sc));
        if (f.t == Value::Undef) fail_undefined(f);
        if (f.t != Value::Fn) fail(cat("'", type_name(f), "' object is not callable"));
        return f.fn->fn(f.fn->self, args, kw);
      }
      case Expr::Filter: {
        Value v = eval(*e.a[0], sc);
        Args args;
        Kwargs kw;
        for (size_t k = 1; k < e.a.size(); k++) args.push_back(eval(*e.a[k], sc));
        for (auto& [k, x] : e.kw) kw.emplace_back(k, eval(*x, sc));
        return filter(e.name, v, args, kw);
      }
      case Expr::Test: {
        Value v = eval(*e.a[0], sc);
        Args args;
        for (size_t k = 1; k < e.a.size(); k++) args.push_back(eval(*e.a[k], sc));
        for (auto& [k, x] : e.kw) args.push_back(eval(*x, sc));
        return Value::boolean(test(e.name, v, args) != e.neg);
      }
      case Expr::Neg:
      case Expr::Pos: {
        Value v = eval(*e.a[0], sc);
        if (v.t == Value::Undef) fail_undefined(v);
        if (!v.numeric())
          fail(cat("bad operand type for unary ", e.k == Expr::Neg ? "-" : "+", ": '", type_name(v),
                   "'"));
        if (e.k == Expr::Pos) return v.t == Value::Bool ? Value::integer(v.as_int()) : v;
        if (v.t == Value::Float) return Value::flt(-v.f);
        return int_arith("-", 0, v.as_int());
      }
      case Expr::Not:
        return Value::boolean(!truthy(eval(*e.a[0], sc)));
      case Expr::And: {
        Value l = eval(*e.a[0], sc);
        return truthy(l) ? eval(*e.a[1], sc) : l;
      }
      case Expr::Or: {
        Value l = eval(*e.a[0], sc);
        return truthy(l) ? l : eval(*e.a[1], sc);
      }
      case Expr::Bin:
        return arith(e.name, eval(*e.a[0], sc), eval(*e.a[1], sc));
      case Expr::Cmp: {
        Value l = eval(*e.a[0], sc);
        for (size_t k = 0; k < e.ops.size(); k++) {
          Value r = eval(*e.a[k + 1], sc);
          const std::string& op = e.ops[k];
          bool ok;
          if (op == "==")
            ok = py_eq(l, r);
          else if (op == "!=")
            ok = !py_eq(l, r);
          else if (op == "<")
            ok = py_lt(l, r, "<");
          else if (op == ">")
            ok = py_lt(r, l, ">");
          else if (op == "<=")
            ok = py_eq(l, r) || py_lt(l, r, "<=");
          else if (op == ">=")
            ok = py_eq(l, r) || py_lt(r, l, ">=");
          else if (op == "in")
            ok = py_in(l, r);
          else
            ok = !py_in(l, r);
          if (!ok) return Value::boolean(false);
          l = r;
        }
        return Value::boolean(true);
      }
      case Expr::Cond:
        if (truthy(eval(*e.a[1], sc))) return eval(*e.a[0], sc);
        if (e.a[2]) return eval(*e.a[2], sc);
        return Value::undef("the inline if expression evaluated to false and no else section");
      case Expr::ListE:
      case Expr::TupleE: {
        ValueList l;
        for (auto& x : e.a) l.push_back(eval(*x, sc));
        return Value::list(std::move(l), e.k == Expr::TupleE);
      }
      case Expr::DictE: {
        ValueDict d;
        for (size_t k = 0; k + 1 < e.a.size(); k += 2) {
          Value key = eval(*e.a[k], sc);
          if (key.t != Value::Str)
            fail(cat("dict keys must be strings in chat templates, got '", type_name(key), "'"));
          Value v = eval(*e.a[k + 1], sc);
          bool found = false;
          for (auto& [dk, dv] : d)
            if (dk == key.s) {
              dv = v;
              found = true;
            }
          if (!found) d.emplace_back(key.s, v);
        }
        return Value::dict(std::move(d));
      }
    }
    return Value();
  }

  // An item's attribute path "a.b.0" (as Jinja's make_attrgetter).
  static Value attr_path(const Value& item, const std::string& path) {
    Value v = item;
    size_t i = 0;
    while (true) {
      size_t j = path.find('.', i);
      std::string part = path.substr(i, j == std::string::npos ? std::string::npos : j - i);
      bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
      if (digits && part.size() > 18) return Value::undef(cat("no item ", part));
      v = get_item(v, digits ? Value::integer(std::stoll(part)) : Value::str(part));
      if (j == std::string::npos) return v;
      i = j + 1;
    }
  }

  bool test(const std::string& name, const Value& v, const Args& a) {
    auto need = [&](size_t n) {
      if (a.size() < n) fail(cat("test '", name, "' needs ", n, " argument(s)"));
      return n ? a[0] : Value();
    };
    if (name == "defined") return v.t != Value::Undef;
    if (name == "undefined") return v.t == Value::Undef;
    if (name == "none") return v.t == Value::None;
    if (name == "boolean") return v.t == Value::Bool;
    if (name == "true") return v.t == Value::Bool && v.b;
    if (name == "false") return v.t == Value::Bool && !v.b;
    if (name == "integer") return v.t == Value::Int;
    if (name == "float") return v.t == Value::Float;
    if (name == "number") return v.numeric();
    if (name == "string") return v.t == Value::Str;
    if (name == "mapping") return v.t == Value::Dict && !v.ns;
    if (name == "iterable")
      return v.t == Value::Str || v.t == Value::List || v.t == Value::Undef ||
             (v.t == Value::Dict && !v.ns);
    if (name == "sequence")
      return v.t == Value::Str || v.t == Value::List || (v.t == Value::Dict && !v.ns);
    if (name == "callable") return v.t == Value::Fn;
    if (name == "escaped") return false;
    if (name == "lower" || name == "upper") {
      const std::string s = py_str(v);
      return name == "lower" ? str_lower(s) == s : str_upper(s) == s;
    }
    if (name == "odd" || name == "even" || name == "divisibleby") {
      const int64_t x = need_int(v, "the tested value");
      if (name == "odd") return ((x % 2) + 2) % 2 == 1;
      if (name == "even") return x % 2 == 0;
      const int64_t d = need_int(need(1), "divisibleby's argument");
      if (d == 0) fail("integer division or modulo by zero");
      return d == -1 || x % d == 0;
    }
    if (name == "eq" || name == "equalto" || name == "==") return py_eq(v, need(1));
    if (name == "ne" || name == "!=") return !py_eq(v, need(1));
    if (name == "lt" || name == "lessthan" || name == "<") return py_lt(v, need(1));
    if (name == "gt" || name == "greaterthan" || name == ">") return py_lt(need(1), v, ">");
    if (name == "le" || name == "<=") return py_eq(v, need(1)) || py_lt(v, need(1), "<=");
    if (name == "ge" || name == ">=") return py_eq(v, need(1)) || py_lt(need(1), v, ">=");
    if (name == "in") return py_in(v, need(1));
    if (name == "sameas") {
      const Value& o = need(1);
      if (v.t != o.t) return false;
      if (v.t == Value::None || v.t == Value::Undef) return true;
      if (v.t == Value::Bool) return v.b == o.b;
      if (v.t == Value::List) return v.l == o.l;
      if (v.t == Value::Dict) return v.d == o.d;
      return py_eq(v, o) && (v.t == Value::Int && v.i >= -5 && v.i <= 256);
    }
    fail(cat("unknown test '", name, "'"));
  }

  ValueList select(const Value& seq, const Args& a, size_t first, bool by_attr, bool keep) {
    ValueList out;
    std::string attr;
    if (by_attr) {
      if (a.size() <= first - 1) fail("selectattr / rejectattr need an attribute name");
      attr = need_str(a[first - 1], "the attribute name");
    }
    std::string tname;
    Args targs;
    if (a.size() > first) {
      tname = need_str(a[first], "the test name");
      if (!kTests.count(tname)) fail(cat("no test named '", tname, "'"));
      targs.assign(a.begin() + first + 1, a.end());
    }
    for (auto& x : iterate(seq)) {
      Value v = by_attr ? attr_path(x, attr) : x;
      const bool r = tname.empty() ? truthy(v) : test(tname, v, targs);
      if (r == keep) out.push_back(x);
    }
    return out;
  }

  Value filter(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
    if (name == "default" || name == "d") {
      check_args(name, a, kw, 2, {"default_value", "boolean"});
      const Value* def = arg(a, kw, 0, "default_value");
      const Value* boolean = arg(a, kw, 1, "boolean");
      const bool use = v.t == Value::Undef || (boolean && truthy(*boolean) && !truthy(v));
      return use ? (def ? *def : Value::str("")) : v;
    }
    if (name == "length" || name == "count") return Value::integer(py_len(v));
    if (name == "string") return Value::str(py_str(v));
    if (name == "safe") return v;
    if (name == "trim") {
      check_args(name, a, kw, 1, {"chars"});
      return Value::str(py_strip(py_str(v), arg(a, kw, 0, "chars"), true, true));
    }
    if (name == "upper") return Value::str(str_upper(py_str(v)));
    if (name == "lower") return Value::str(str_lower(py_str(v)));
    if (name == "title") return Value::str(str_jinja_title(py_str(v)));
    if (name == "capitalize") return Value::str(str_capitalize(py_str(v)));
    if (name == "escape" || name == "e") {
      std::string out;
      for (char c : py_str(v)) {
        switch (c) {
          case '&':
            out += "&amp;";
            break;
          case '<':
            out += "&lt;";
            break;
          case '>':
            out += "&gt;";
            break;
          case '"':
            out += "&#34;";
            break;
          case '\'':
            out += "&#39;";
            break;
          default:
            out += c;
        }
      }
      return Value::str(out);
    }
    if (name == "replace") {
      check_args(name, a, kw, 3, {"old", "new", "count"});
      const Value* o = arg(a, kw, 0, "old");
      const Value* n = arg(a, kw, 1, "new");
      const Value* c = arg(a, kw, 2, "count");
      if (!o || !n) fail("replace needs the old and the new string");
      return Value::str(py_replace(py_str(v), py_str(*o), py_str(*n),
                                   c && c->t != Value::None ? need_int(*c, "count") : -1));
    }
    if (name == "join") {
      check_args(name, a, kw, 2, {"d", "attribute"});
      const Value* d = arg(a, kw, 0, "d");
      const Value* attr = arg(a, kw, 1, "attribute");
      std::string sep = d ? py_str(*d) : "", out;
      bool first = true;
      for (auto& x : iterate(v)) {
        check_string_size(out.size());
        out += (first ? "" : sep) +
               py_str(attr && attr->t != Value::None ? attr_path(x, py_str(*attr)) : x);
        first = false;
      }
      return Value::str(out);
    }
    if (name == "first" || name == "last") {
      ValueList items = iterate(v);  // an undefined value has no items
      if (items.empty()) return Value::undef(cat("No ", name, " item, sequence was empty."));
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") return Value::list(iterate(v));
    if (name == "reverse") {
      if (v.t == Value::Str) {
        std::u32string u = to_u32(v.s);
        std::reverse(u.begin(), u.end());
        return Value::str(to_u8(u));
      }
      ValueList items = iterate(v);
      std::reverse(items.begin(), items.end());
      return Value::list(std::move(items));
    }
    if (name == "items") {
      if (v.t == Value::Undef) return Value::list({});
      if (v.t != Value::Dict || v.ns)
        fail(cat("can only get item pairs from a mapping, not '", type_name(v), "'"));
      return items_of(v);
    }
    if (name == "dictsort") {
      if (v.t != Value::Dict) fail("dictsort expects a mapping");
      check_args(name, a, kw, 3, {"case_sensitive", "by", "reverse"});
      const Value* cs = arg(a, kw, 0, "case_sensitive");
      const Value* by = arg(a, kw, 1, "by");
      const Value* rev = arg(a, kw, 2, "reverse");
      const bool by_value = by && py_str(*by) == "value";
      ValueList items = *items_of(v).l;
      auto key = [&](const Value& pair) {
        Value k = (*pair.l)[by_value ? 1 : 0];
        if (k.t == Value::Str && !(cs && truthy(*cs))) k.s = str_lower(k.s);
        return k;
      };
      std::stable_sort(items.begin(), items.end(),
                       [&](const Value& x, const Value& y) { return py_lt(key(x), key(y)); });
      if (rev && truthy(*rev)) std::reverse(items.begin(), items.end());
      return Value::list(std::move(items));
    }
    if (name == "int") {
      check_args(name, a, kw, 2, {"default", "base"});
      const Value* def = arg(a, kw, 0, "default");
      const Value* base = arg(a, kw, 1, "base");
      const Value fallback = def ? *def : Value::integer(0);
      if (v.t == Value::Undef) fail_undefined(v);  // int(Undefined) raises
      if (v.t == Value::Int) return v;
      if (v.t == Value::Bool) return Value::integer(v.as_int());
      // jinja2's do_int: int(value[, base]); on ValueError int(float(value)); then the default.
      // int() of an infinity is an OverflowError, which jinja2 does not catch.
      if (v.t == Value::Float) return float_to_int(v.f, fallback);
      if (v.t == Value::Str) {
        std::string s = py_strip(v.s, nullptr, true, true);
        const int64_t b = base ? need_int(*base, "base") : 10;
        char* end = nullptr;
        errno = 0;
        long long x = b >= 2 && b <= 36 ? std::strtoll(s.c_str(), &end, (int)b) : 0;
        if (!s.empty() && end && *end == 0) {
          if (errno == ERANGE) int_too_big(s);
          return Value::integer(x);
        }
        double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == 0) return float_to_int(d, fallback);
      }
      return fallback;
    }
    if (name == "float") {
      check_args(name, a, kw, 1, {"default"});
      const Value* def = arg(a, kw, 0, "default");
      if (v.t == Value::Undef) fail_undefined(v);
      if (v.numeric()) return Value::flt(v.num());
      if (v.t == Value::Str) {
        std::string s = py_strip(v.s, nullptr, true, true);
        char* end = nullptr;
        double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == 0) return Value::flt(d);
      }
      return def ? *def : Value::flt(0.0);
    }
    if (name == "abs") {
      if (v.t == Value::Undef) fail_undefined(v);
      if (!v.numeric()) fail(cat("bad operand type for abs(): '", type_name(v), "'"));
      if (v.t == Value::Float) return Value::flt(std::fabs(v.f));
      return v.as_int() < 0 ? int_arith("-", 0, v.as_int()) : Value::integer(v.as_int());
    }
    if (name == "round") {
      check_args(name, a, kw, 2, {"precision", "method"});
      const Value* p = arg(a, kw, 0, "precision");
      const Value* m = arg(a, kw, 1, "method");
      if (v.t == Value::Undef) fail_undefined(v);
      if (!v.numeric()) fail(cat("round needs a number, not '", type_name(v), "'"));
      const int64_t prec = p ? need_int(*p, "precision") : 0;
      const std::string method = m ? py_str(*m) : "common";
      if (method != "common" && method != "ceil" && method != "floor")
        fail("method must be common, ceil or floor");
      if (method == "common" && v.t != Value::Float)
        return Value::integer(round_int(v.as_int(), prec));
      // A double has at most 17 significant digits and exponents of -324..308: past those
      // precisions Python's round() returns the value itself / a signed zero.
      const double x0 = v.num();
      if (method == "common" && (prec > 330 || !std::isfinite(x0))) return Value::flt(x0);
      if (method == "common" && prec < -330) return Value::flt(std::copysign(0.0, x0));
      if (method == "common" && prec >= 0) {
        // Python rounds the double's exact value, halves to even; so does printf's %.Nf
        char buf[1024];  // 309 integer digits and 330 decimals at most
        snprintf(buf, sizeof buf, "%.*f", (int)prec, x0);
        return Value::flt(std::strtod(buf, nullptr));
      }
      const double scale = std::pow(10.0, (double)std::clamp<int64_t>(prec, -400, 400));
      const double x = x0 * scale;
      const double r = method == "common" ? std::nearbyint(x)  // half to even, as Python's
                       : method == "ceil" ? std::ceil(x)
                                          : std::floor(x);
      return Value::flt(r / scale);
    }
    if (name == "tojson") {
      check_args(name, a, kw, 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
      JsonStyle st;
      // Transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
      const Value* ea = arg(a, kw, 0, "ensure_ascii");
      const Value* ind = arg(a, kw, 1, "indent");
      const Value* seps = arg(a, kw, 2, "separators");
      const Value* sk = arg(a, kw, 3, "sort_keys");
      st.ensure_ascii = ea && truthy(*ea);
      st.sort_keys = sk && truthy(*sk);
      if (ind && ind->t != Value::None) {
        st.has_indent = true;
        st.item_sep = ",";
        st.indent = ind->t == Value::Str ? ind->s : spaces(need_int(*ind, "indent"));
      }
      if (seps && seps->t != Value::None) {
        if (seps->t != Value::List || seps->l->size() != 2)
          fail("separators must be an (item_separator, key_separator) pair");
        st.item_sep = need_str((*seps->l)[0], "the item separator");
        st.key_sep = need_str((*seps->l)[1], "the key separator");
      }
      std::string out;
      json_dump(v, st, 0, out);
      return Value::str(out);
    }
    if (name == "indent") {
      check_args(name, a, kw, 3, {"width", "first", "blank"});
      const Value* w = arg(a, kw, 0, "width");
      const Value* f = arg(a, kw, 1, "first");
      const Value* b = arg(a, kw, 2, "blank");
      std::string ind = !w ? "    " : w->t == Value::Str ? w->s : spaces(need_int(*w, "width"));
      std::string s = py_str(v) + "\n";
      std::vector<std::string> lines = split_lines(s);
      std::string rv;
      if (b && truthy(*b)) {
        for (size_t k = 0; k < lines.size(); k++) {
          rv += (k ? "\n" + ind : "") + lines[k];
          check_string_size(rv.size());
        }
      } else if (!lines.empty()) {
        rv = lines[0];
        for (size_t k = 1; k < lines.size(); k++) {
          rv += "\n" + (lines[k].empty() ? "" : ind) + lines[k];
          check_string_size(rv.size());
        }
      }
      if (f && truthy(*f)) rv = ind + rv;
      return Value::str(rv);
    }
    if (name == "attr") {
      if (a.size() != 1) fail("attr needs the attribute name");
      return get_attr(v, need_str(a[0], "the attribute name"));
    }
    if (name == "selectattr" || name == "rejectattr")
      return Value::list(select(v, a, 1, true, name == "selectattr"));
    if (name == "select" || name == "reject")
      return Value::list(select(v, a, 0, false, name == "select"));
    if (name == "map") {
      ValueList out;
      const Value* attr = kwarg(kw, "attribute");
      if (attr) {
        const Value* def = kwarg(kw, "default");
        for (auto& x : iterate(v)) {
          Value y = attr_path(x, py_str(*attr));
          out.push_back(y.t == Value::Undef && def ? *def : y);
        }
        return Value::list(std::move(out));
      }
      if (a.empty()) fail("map needs a filter name or attribute=");
      const std::string f = need_str(a[0], "the filter name");
      if (!kFilters.count(f)) fail(cat("no filter named '", f, "'"));
      Args rest(a.begin() + 1, a.end());
      for (auto& x : iterate(v)) {
        Args r = rest;
        Kwargs k = kw;
        out.push_back(filter(f, x, r, k));
      }
      return Value::list(std::move(out));
    }
    if (name == "unique" || name == "sort" || name == "min" || name == "max" || name == "sum") {
      const Value* attr = kwarg(kw, "attribute");
      const Value* cs = kwarg(kw, "case_sensitive");
      auto key = [&](const Value& x) {
        Value k = attr && attr->t != Value::None ? attr_path(x, py_str(*attr)) : x;
        if (name != "sum" && k.t == Value::Str && !(cs && truthy(*cs))) k.s = str_lower(k.s);
        return k;
      };
      ValueList items = iterate(v);
      if (name == "sum") {
        const Value* start = kwarg(kw, "start");
        Value total = start ? *start : Value::integer(0);
        for (auto& x : items) total = arith("+", total, key(x));
        return total;
      }
      if (name == "unique") {
        ValueList out;
        std::vector<Value> seen;
        for (auto& x : items) {
          Value k = key(x);
          bool dup = false;
          for (auto& s : seen) dup |= py_eq(s, k);
          if (!dup) {
            seen.push_back(k);
            out.push_back(x);
          }
        }
        return Value::list(std::move(out));
      }
      if (name == "sort") {
        const Value* rev = arg(a, kw, 0, "reverse");
        std::stable_sort(items.begin(), items.end(),
                         [&](const Value& x, const Value& y) { return py_lt(key(x), key(y)); });
        if (rev && truthy(*rev)) std::reverse(items.begin(), items.end());
        return Value::list(std::move(items));
      }
      if (items.empty()) return Value::undef(cat("No ", name, " item, sequence was empty."));
      size_t best = 0;
      for (size_t k = 1; k < items.size(); k++) {
        const bool better = name == "min" ? py_lt(key(items[k]), key(items[best]))
                                          : py_lt(key(items[best]), key(items[k]));
        if (better) best = k;
      }
      return items[best];
    }
    fail(cat("unknown filter '", name, "'"));
  }
};

}  // namespace

// ---------------------------------------------------------------- public API

ChatTemplate::ChatTemplate(const std::string& source, std::string name) {
  ONYX_CHECK(source.size() <= Limits::kMaxSourceBytes, name, ": the template is ", source.size(),
             " bytes, over onyx's bound of ", Limits::kMaxSourceBytes >> 20, " MiB");
  const size_t bad = unicode::invalid_utf8_at(source);
  ONYX_CHECK(bad == std::string::npos, name, ": the template is not UTF-8 (byte ", bad,
             "); Transformers reads templates as UTF-8 text");
  auto impl = std::make_shared<ChatTemplateImpl>();
  impl->src.name = std::move(name);
  // Jinja: \r\n and \r read as \n; one trailing newline is dropped (keep_trailing_newline=False)
  std::string& t = impl->src.text;
  t.reserve(source.size());
  for (size_t i = 0; i < source.size(); i++) {
    if (source[i] == '\r') {
      t += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') i++;
    } else {
      t += source[i];
    }
  }
  if (!t.empty() && t.back() == '\n') t.pop_back();
  impl->src.line_starts.push_back(0);
  for (size_t i = 0; i < t.size(); i++)
    if (t[i] == '\n') impl->src.line_starts.push_back(i + 1);
  Parser p(impl->src, lex(impl->src));
  impl->body = p.parse_template();
  impl->has_generation = p.saw_generation;
  impl_ = impl;
}

bool ChatTemplate::has_generation_markers() const { return impl_->has_generation; }
const std::string& ChatTemplate::name() const { return impl_->src.name; }

ChatTemplate::Rendered ChatTemplate::render(const nlohmann::ordered_json& vars) const {
  ONYX_CHECK(vars.is_object(), impl_->src.name, ": the template's variables must be a JSON object");
  Rendered r;
  Scope root;
  Renderer rd(*impl_, r.text, r.generation_spans);
  try {
    for (auto it = vars.begin(); it != vars.end(); ++it)
      root.vars[it.key()] = from_json(it.value());
    rd.run(root);
  } catch (RtError& e) {
    throw Error(e.located ? e.msg : impl_->src.name + ": " + e.msg);
  }
  return r;
}

nlohmann::ordered_json chat_template_vars(const nlohmann::ordered_json& messages,
                                          bool add_generation_prompt,
                                          const std::map<std::string, std::string>& special_tokens,
                                          const nlohmann::ordered_json& extra_vars) {
  ONYX_CHECK(messages.is_array(), "chat messages must be a JSON array, got ", messages.type_name());
  ONYX_CHECK(!messages.empty(), "cannot apply a chat template to an empty conversation");
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  for (size_t k = 0; k < messages.size(); k++) {
    const auto& m = messages[k];
    ONYX_CHECK(m.is_object(), "chat message ", k, " is not a JSON object (", m.dump(), ")");
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    for (auto it = m.begin(); it != m.end(); ++it)
      if (!it.value().is_null()) out[it.key()] = it.value();
    // Transformers' _alias_reasoning_fields: the reasoning under its older names is also given as
    // "thinking" (first, unless present) and "reasoning_content".
    const nlohmann::ordered_json* reasoning = nullptr;
    for (const char* f : {"reasoning_content", "thinking", "reasoning"})
      if (!reasoning && out.contains(f)) reasoning = &out[f];
    if (reasoning) {
      const nlohmann::ordered_json r = *reasoning;
      nlohmann::ordered_json aliased = nlohmann::ordered_json::object();
      aliased["thinking"] = r;  // {"thinking": r, **message, "reasoning_content": r}
      for (auto it = out.begin(); it != out.end(); ++it) aliased[it.key()] = it.value();
      aliased["reasoning_content"] = r;
      out = std::move(aliased);
    }
    msgs.push_back(std::move(out));
  }
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  vars["messages"] = std::move(msgs);
  vars["tools"] = nullptr;
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = add_generation_prompt;
  for (auto& [k, v] : special_tokens) vars[k] = v;
  if (extra_vars.is_object())
    for (auto it = extra_vars.begin(); it != extra_vars.end(); ++it) vars[it.key()] = it.value();
  else
    ONYX_CHECK(extra_vars.is_null(), "extra chat template variables must be a JSON object");
  return vars;
}

std::string render_chat(const std::string& template_source, const nlohmann::ordered_json& messages,
                        bool add_generation_prompt, const std::string& bos_token,
                        const std::string& eos_token, const nlohmann::ordered_json& extra_vars) {
  std::map<std::string, std::string> special;
  if (!bos_token.empty()) special["bos_token"] = bos_token;
  if (!eos_token.empty()) special["eos_token"] = eos_token;
  ChatTemplate t(template_source);
  return t.render(chat_template_vars(messages, add_generation_prompt, special, extra_vars)).text;
}

ChatTemplateFiles find_chat_template(const std::string& path) {
  ChatTemplateFiles out;
  fs::path p(path);
  ONYX_CHECK(fs::exists(p), "chat template: '", path, "' does not exist");
  if (fs::is_regular_file(p) && p.extension() == ".jinja") {
    out.source = read_text_file(path);
    out.origin = path;
    p = p.parent_path();
  } else if (fs::is_regular_file(p)) {
    p = p.parent_path();
  }
  if (p.empty()) p = ".";
  const fs::path cfg_path = p / "tokenizer_config.json";
  nlohmann::ordered_json cfg;
  if (fs::exists(cfg_path)) cfg = io::read_ordered_json_file(cfg_path.string());
  // The special tokens: tokenizer_config.json's; an older folder's special_tokens_map.json (read
  // when the config has no added_tokens_decoder, as Transformers' legacy path) overrides them.
  // (Transformers refuses a special token that is neither a string nor an AddedToken)
  auto take_tokens = [&](const nlohmann::ordered_json& j, const fs::path& file) {
    for (const char* k : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                          "cls_token", "mask_token"}) {
      auto it = j.find(k);
      if (it == j.end() || it->is_null()) continue;
      if (it->is_string())
        out.special_tokens[k] = it->get<std::string>();
      else if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
        out.special_tokens[k] = (*it)["content"].get<std::string>();
      else
        throw Error(cat(file.string(), ": '", k,
                        "' must be a string or an AddedToken {\"content\": ...}, got ",
                        it->dump()));
    }
  };
  ONYX_CHECK(cfg.is_null() || cfg.is_object(), cfg_path.string(), ": expected a JSON object, got ",
             cfg.type_name());
  if (cfg.is_object()) take_tokens(cfg, cfg_path);
  const fs::path map_path = p / "special_tokens_map.json";
  if (fs::exists(map_path) && !(cfg.is_object() && cfg.contains("added_tokens_decoder"))) {
    const nlohmann::ordered_json map = io::read_ordered_json_file(map_path.string());
    ONYX_CHECK(map.is_object(), map_path.string(), ": expected a JSON object");
    take_tokens(map, map_path);
  }
  if (!out.source.empty()) return out;
  const fs::path jinja = p / "chat_template.jinja";
  if (fs::exists(jinja)) {
    out.source = read_text_file(jinja.string());
    out.origin = jinja.string();
    return out;
  }
  if (cfg.is_object() && cfg.contains("chat_template")) {
    const auto& ct = cfg["chat_template"];
    out.origin = cfg_path.string();
    if (ct.is_string()) {
      out.source = ct.get<std::string>();
    } else if (ct.is_array()) {
      std::string names;
      for (auto& t : ct) {
        ONYX_CHECK(t.is_object() && t.contains("name") && t.contains("template") &&
                       t["name"].is_string() && t["template"].is_string(),
                   cfg_path.string(), ": chat_template entries must be {name, template} strings");
        names += (names.empty() ? "" : ", ") + t["name"].get<std::string>();
        if (t["name"] == "default") out.source = t["template"].get<std::string>();
      }
      ONYX_CHECK(!out.source.empty(), cfg_path.string(),
                 ": chat_template has several templates and none named 'default' (", names, ")");
      out.origin += " (chat_template 'default')";
    } else if (!ct.is_null()) {
      throw Error(cat(cfg_path.string(),
                      ": chat_template must be a string or a list of {name, "
                      "template}"));
    }
  }
  return out;
}

}  // namespace onyx::data
