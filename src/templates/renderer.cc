// templates/renderer.cc — a parsed template rendered over values: statements (for with loop.*,
// if, set, macros, break / continue, {% generation %} spans), expressions, calls, within the
// render's bounds (TemplateLimits: depth, steps, bytes). Behaviour read from jinja2 3.1's
// runtime.py and Transformers' chat_template_utils.py; no code taken.
#include <algorithm>
#include <cmath>
#include <ctime>

#include "templates/builtins.h"
#include "templates/filters.h"
#include "templates/syntax.h"

namespace onyx::templates {
namespace {

class Renderer {
 public:
  Renderer(const Template& t, std::string& out, std::vector<std::pair<size_t, size_t>>& spans)
      : t_(t), out_(&out), spans_(&spans) {}

  void run(Scope& root) {
    Budget budget;
    Installed installed(budget);
    root_ = &root;
    exec(t_.body, root);
  }

 private:
  const Template& t_;
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

  // A call's or a filter's arguments (e.a[1..], then the keywords), evaluated in order.
  void eval_arguments(const Expr& e, Scope& sc, Args& args, Kwargs& kw) {
    for (size_t k = 1; k < e.a.size(); k++) args.push_back(eval(*e.a[k], sc));
    for (auto& [k, x] : e.kw) kw.emplace_back(k, eval(*x, sc));
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
        eval_arguments(e, sc, args, kw);
        if (f.t == Value::Undef) fail_undefined(f);
        if (f.t != Value::Fn) fail(cat("'", type_name(f), "' object is not callable"));
        return f.fn->fn(f.fn->self, args, kw);
      }
      case Expr::Filter: {
        Value v = eval(*e.a[0], sc);
        Args args;
        Kwargs kw;
        eval_arguments(e, sc, args, kw);
        return apply_filter(e.name, v, args, kw);
      }
      case Expr::Test: {
        Value v = eval(*e.a[0], sc);
        Args args;
        for (size_t k = 1; k < e.a.size(); k++) args.push_back(eval(*e.a[k], sc));
        for (auto& [k, x] : e.kw) args.push_back(eval(*x, sc));
        return Value::boolean(apply_test(e.name, v, args) != e.neg);
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
};

}  // namespace

Rendered render(const Template& t, const nlohmann::ordered_json& vars) {
  ONYX_CHECK(vars.is_object(), t.src.name, ": the template's variables must be a JSON object");
  Rendered r;
  Scope root;
  Renderer rd(t, r.text, r.generation_spans);
  try {
    for (auto it = vars.begin(); it != vars.end(); ++it)
      root.vars[it.key()] = from_json(it.value());
    rd.run(root);
  } catch (RtError& e) {
    throw Error(e.located ? e.msg : t.src.name + ": " + e.msg);
  }
  return r;
}

bool has_generation_markers(const Template& t) { return t.has_generation; }
const std::string& template_name(const Template& t) { return t.src.name; }

}  // namespace onyx::templates
