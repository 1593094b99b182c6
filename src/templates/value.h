// templates/value.h — the values a template computes with, as Python's: None, bool, int, float,
// str (UTF-8, indexed by code point), list / tuple, dict (insertion order) / namespace, callables;
// the bounds of one render charged as values are made (Budget), and what Python's str(), repr(),
// ==, <, truthiness, len() and json.dumps make of them. Internal to src/templates.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "onyx/error.h"
#include "templates/template.h"

namespace onyx::templates {

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
extern thread_local Budget* t_budget;  // the render running on this thread
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

// A runtime error without its place yet; the renderer adds line and column.
struct RtError {
  std::string msg;
  bool located = false;
};
[[noreturn]] void fail(std::string msg);
// A string about to be made `n` bytes long; a list or dict of `n` items; a recursive walk over
// values `depth` levels down (a namespace can hold itself): errors past TemplateLimits.
void check_string_size(uint64_t n);
void check_items(uint64_t n);
void check_value_depth(int depth);
const char* type_name(const Value& v);
// Using an undefined value where Jinja's Undefined raises.
[[noreturn]] void fail_undefined(const Value& v);

// ---- UTF-8 and Python's str
// One code point of UTF-8 at s[i] (advancing i); a byte that does not start a complete sequence
// is one code point of its own value.
char32_t next_cp(const std::string& s, size_t& i);
std::u32string to_u32(const std::string& s);
std::string to_u8(const std::u32string& s);
std::string cp_u8(char32_t c);
int64_t cp_len(const std::string& s);  // code points
bool py_space(char32_t c);             // str.isspace()
char32_t cp_upper(char32_t c);
char32_t cp_lower(char32_t c);
bool cp_cased(char32_t c);
bool cp_alpha(char32_t c);
bool cp_digit(char32_t c);
std::string str_upper(const std::string& s);
std::string str_lower(const std::string& s);
std::string str_capitalize(const std::string& s);
std::string str_py_title(const std::string& s);     // Python's str.title()
std::string str_jinja_title(const std::string& s);  // Jinja's title filter: words split at -\s({[<
// str.strip / lstrip / rstrip with `chars` (null or None: whitespace).
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right);
std::string py_float(double x);  // repr(float)

// ---- Python's semantics of values
std::string py_repr(const Value& v, int depth = 0);
std::string py_str(const Value& v);
bool truthy(const Value& v);
bool py_eq(const Value& a, const Value& b, int depth = 0);
bool py_lt(const Value& a, const Value& b, const char* op = "<", int depth = 0);

struct JsonStyle {
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::string indent;  // the indent unit; has_indent false: one line
  bool has_indent = false;
  std::string item_sep = ", ", key_sep = ": ";
};
// json.dumps(v) with `st`'s indent / separators / sort_keys / ensure_ascii, appended to `out`.
void json_dump(const Value& v, const JsonStyle& st, int level, std::string& out);
Value from_json(const nlohmann::ordered_json& j, int depth = 0);
ValueList iterate(const Value& v);  // for x in v
int64_t py_len(const Value& v);
// Python slice indices for a sequence of n items.
std::vector<int64_t> slice_indices(int64_t n, const Value& start, const Value& stop,
                                   const Value& step);

}  // namespace onyx::templates
