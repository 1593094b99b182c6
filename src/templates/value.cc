// templates/value.cc — see value.h: values, the render's budget, and Python's str / repr /
// comparisons / json.dumps over them (read from CPython's and jinja2's documented behaviour).
#include "templates/value.h"

#include <locale.h>
#include <wctype.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tokenizers/tokenizer.h"

namespace onyx::templates {

namespace unicode = tokenizers::unicode;

thread_local Budget* t_budget = nullptr;

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

bool py_eq(const Value& a, const Value& b, int depth) {
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
bool py_lt(const Value& a, const Value& b, const char* op, int depth) {
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

Value from_json(const nlohmann::ordered_json& j, int depth) {
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

}  // namespace onyx::templates
