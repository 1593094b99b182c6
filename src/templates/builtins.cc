// templates/builtins.cc — see builtins.h. Behaviour read from jinja2's sandbox (the str / dict
// methods a template may call) and CPython's str and int; no code taken.
#include "templates/builtins.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <set>

namespace onyx::templates {

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

}  // namespace onyx::templates
