// templates/builtins.h — what a template does to values beyond the operators of value.h: variable
// scopes, call arguments, attribute / item / slice access (the sandbox's str, dict and list
// methods as bound callables), `in`, and Python's integer arithmetic and conversions.
// Internal to src/templates.
#pragma once
#include <initializer_list>
#include <string>
#include <unordered_map>
#include <vector>

#include "templates/value.h"

namespace onyx::templates {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  Scope* parent = nullptr;
};

enum class Flow { Next, Break, Continue };

// Call arguments: the keyword `name`; the idx-th positional argument or the keyword `name` (null
// when neither is given); at most max_pos positional and only `names` as keywords (else the
// error Python gives).
const Value* kwarg(const Kwargs& kw, const char* name);
const Value* arg(const Args& a, const Kwargs& kw, size_t idx, const char* name);
void check_args(const std::string& what, const Args& a, const Kwargs& kw, size_t max_pos,
                std::initializer_list<const char*> names);
std::string need_str(const Value& v, const char* what);
int64_t need_int(const Value& v, const char* what);

// str.replace(old, new, count) (count < 0: all); str.splitlines().
std::string py_replace(const std::string& s, const std::string& old, const std::string& nw,
                       int64_t count);
std::vector<std::string> split_lines(const std::string& s);

Value items_of(const Value& d);  // dict.items() as a list of (key, value) tuples
// obj.name (methods bound to obj; an unknown name: Undefined with the error its use raises),
// obj[key], obj[b:e:st], x in c.
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
Value get_slice(const Value& obj, const Value& b, const Value& e, const Value& st);
bool py_in(const Value& x, const Value& c);

// Python's integer + - * // % ** on 64-bit values: floor division and a modulo with the
// divisor's sign; a result beyond 64 bits is an error, never a wrap. arith: any operands.
Value int_arith(const std::string& op, int64_t a, int64_t b);
Value arith(const std::string& op, const Value& l, const Value& r);
// Python's int() of a float as jinja2's int filter sees it (NaN: `nan_fallback`); round(v, n) of
// an int; ' ' * n.
Value float_to_int(double x, const Value& nan_fallback);
[[noreturn]] void int_too_big(const std::string& what);  // OverflowError: an int past 64 bits
int64_t round_int(int64_t v, int64_t ndigits);
std::string spaces(int64_t n);

}  // namespace onyx::templates
