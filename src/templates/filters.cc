// templates/filters.cc — Jinja's filters and tests as onyx renders them (read from jinja2 3.1's
// filters.py and tests.py; no code taken): each filter a function in a name -> function table
// (the parser refuses a name the table does not have), each test a case of test_value.
#include "templates/filters.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "templates/builtins.h"

namespace onyx::templates {
namespace {

const std::set<std::string> kTests = {
    "boolean", "callable", "defined",  "divisibleby", "eq",      "equalto",   "escaped", "even",
    "false",   "float",    "ge",       "greaterthan", "gt",      "in",        "integer", "iterable",
    "le",      "lessthan", "lower",    "lt",          "mapping", "ne",        "none",    "number",
    "odd",     "sameas",   "sequence", "string",      "true",    "undefined", "upper",   "==",
    "!=",      "<",        "<=",       ">",           ">="};

// An item's attribute path "a.b.0" (as Jinja's make_attrgetter).
Value attr_path(const Value& item, const std::string& path) {
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

bool test_value(const std::string& name, const Value& v, const Args& a) {
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

// select / reject / selectattr / rejectattr: the items whose (attribute's) test result is `keep`.
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
    if (!is_test(tname)) fail(cat("no test named '", tname, "'"));
    targs.assign(a.begin() + first + 1, a.end());
  }
  for (auto& x : iterate(seq)) {
    Value v = by_attr ? attr_path(x, attr) : x;
    const bool r = tname.empty() ? truthy(v) : test_value(tname, v, targs);
    if (r == keep) out.push_back(x);
  }
  return out;
}

// ---- the filters, one function each (`name`: the name it was called by, for the aliases)

Value filter_default(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
  check_args(name, a, kw, 2, {"default_value", "boolean"});
  const Value* def = arg(a, kw, 0, "default_value");
  const Value* boolean = arg(a, kw, 1, "boolean");
  const bool use = v.t == Value::Undef || (boolean && truthy(*boolean) && !truthy(v));
  return use ? (def ? *def : Value::str("")) : v;
}

Value filter_length(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
  return Value::integer(py_len(v));
}

Value filter_string(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
  return Value::str(py_str(v));
}

Value filter_safe(const std::string& name, const Value& v, Args& a, Kwargs& kw) { return v; }

Value filter_trim(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
  check_args(name, a, kw, 1, {"chars"});
  return Value::str(py_strip(py_str(v), arg(a, kw, 0, "chars"), true, true));
}

Value filter_upper(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
  return Value::str(str_upper(py_str(v)));
}

Value filter_lower(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
  return Value::str(str_lower(py_str(v)));
}

Value filter_title(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
  return Value::str(str_jinja_title(py_str(v)));
}

Value filter_capitalize(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
  return Value::str(str_capitalize(py_str(v)));
}

Value filter_escape(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
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

Value filter_replace(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
  check_args(name, a, kw, 3, {"old", "new", "count"});
  const Value* o = arg(a, kw, 0, "old");
  const Value* n = arg(a, kw, 1, "new");
  const Value* c = arg(a, kw, 2, "count");
  if (!o || !n) fail("replace needs the old and the new string");
  return Value::str(py_replace(py_str(v), py_str(*o), py_str(*n),
                               c && c->t != Value::None ? need_int(*c, "count") : -1));
}

Value filter_join(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
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

Value filter_first(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
  ValueList items = iterate(v);  // an undefined value has no items
  if (items.empty()) return Value::undef(cat("No ", name, " item, sequence was empty."));
  return name == "first" ? items.front() : items.back();
}

Value filter_list(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
  return Value::list(iterate(v));
}

Value filter_reverse(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
  if (v.t == Value::Str) {
    std::u32string u = to_u32(v.s);
    std::reverse(u.begin(), u.end());
    return Value::str(to_u8(u));
  }
  ValueList items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value filter_items(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
  if (v.t == Value::Undef) return Value::list({});
  if (v.t != Value::Dict || v.ns)
    fail(cat("can only get item pairs from a mapping, not '", type_name(v), "'"));
  return items_of(v);
}

Value filter_dictsort(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
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

Value filter_int(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
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

Value filter_float(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
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

Value filter_abs(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
  if (v.t == Value::Undef) fail_undefined(v);
  if (!v.numeric()) fail(cat("bad operand type for abs(): '", type_name(v), "'"));
  if (v.t == Value::Float) return Value::flt(std::fabs(v.f));
  return v.as_int() < 0 ? int_arith("-", 0, v.as_int()) : Value::integer(v.as_int());
}

Value filter_round(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
  check_args(name, a, kw, 2, {"precision", "method"});
  const Value* p = arg(a, kw, 0, "precision");
  const Value* m = arg(a, kw, 1, "method");
  if (v.t == Value::Undef) fail_undefined(v);
  if (!v.numeric()) fail(cat("round needs a number, not '", type_name(v), "'"));
  const int64_t prec = p ? need_int(*p, "precision") : 0;
  const std::string method = m ? py_str(*m) : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    fail("method must be common, ceil or floor");
  if (method == "common" && v.t != Value::Float) return Value::integer(round_int(v.as_int(), prec));
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

Value filter_tojson(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
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

Value filter_indent(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
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

Value filter_attr(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
  if (a.size() != 1) fail("attr needs the attribute name");
  return get_attr(v, need_str(a[0], "the attribute name"));
}

Value filter_selectattr(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
  return Value::list(select(v, a, 1, true, name == "selectattr"));
}

Value filter_select(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
  return Value::list(select(v, a, 0, false, name == "select"));
}

Value filter_map(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
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
  if (!is_filter(f)) fail(cat("no filter named '", f, "'"));
  Args rest(a.begin() + 1, a.end());
  for (auto& x : iterate(v)) {
    Args r = rest;
    Kwargs k = kw;
    out.push_back(apply_filter(f, x, r, k));
  }
  return Value::list(std::move(out));
}

Value filter_unique(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
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

using FilterFn = Value (*)(const std::string& name, const Value& v, Args& a, Kwargs& kw);

const std::map<std::string, FilterFn>& filter_table() {
  static const std::map<std::string, FilterFn> table = {
      {"abs", filter_abs},           {"attr", filter_attr},       {"capitalize", filter_capitalize},
      {"count", filter_length},      {"d", filter_default},       {"default", filter_default},
      {"dictsort", filter_dictsort}, {"e", filter_escape},        {"escape", filter_escape},
      {"first", filter_first},       {"float", filter_float},     {"indent", filter_indent},
      {"int", filter_int},           {"items", filter_items},     {"join", filter_join},
      {"last", filter_first},        {"length", filter_length},   {"list", filter_list},
      {"lower", filter_lower},       {"map", filter_map},         {"max", filter_unique},
      {"min", filter_unique},        {"reject", filter_select},   {"rejectattr", filter_selectattr},
      {"replace", filter_replace},   {"reverse", filter_reverse}, {"round", filter_round},
      {"safe", filter_safe},         {"select", filter_select},   {"selectattr", filter_selectattr},
      {"sort", filter_unique},       {"string", filter_string},   {"sum", filter_unique},
      {"title", filter_title},       {"tojson", filter_tojson},   {"trim", filter_trim},
      {"unique", filter_unique},     {"upper", filter_upper},
  };
  return table;
}

}  // namespace

bool is_filter(const std::string& name) { return filter_table().count(name) > 0; }
bool is_test(const std::string& name) { return kTests.count(name) > 0; }

Value apply_filter(const std::string& name, const Value& v, Args& a, Kwargs& kw) {
  auto it = filter_table().find(name);
  if (it == filter_table().end()) fail(cat("unknown filter '", name, "'"));
  return it->second(name, v, a, kw);
}

bool apply_test(const std::string& name, const Value& v, const Args& a) {
  return test_value(name, v, a);
}

}  // namespace onyx::templates
