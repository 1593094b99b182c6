// templates/parser.cc — a template's tree from its tokens: recursive descent with Jinja's
// precedence (read from jinja2 3.1's parser.py; no code taken), nesting bounded
// (TemplateLimits::kMaxNesting), unknown filters and tests refused where they are named.
#include <algorithm>
#include <set>

#include "templates/filters.h"
#include "templates/syntax.h"
#include "tokenizers/tokenizer.h"

namespace onyx::templates {
namespace {

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
        if (!is_filter(name)) error(nt, cat("unknown filter '", name, "'"));
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
        if (nt.k == Tok::Name || (nt.k == Tok::Op && is_test(nt.s)))
          name = next().s;
        else
          error(nt, cat("expected a test name after 'is', got ", describe(nt)));
        if (!is_test(name)) error(nt, cat("unknown test '", name, "'"));
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

std::shared_ptr<const Template> parse(const std::string& source, std::string name) {
  ONYX_CHECK(source.size() <= Limits::kMaxSourceBytes, name, ": the template is ", source.size(),
             " bytes, over onyx's bound of ", Limits::kMaxSourceBytes >> 20, " MiB");
  const size_t bad = tokenizers::unicode::invalid_utf8_at(source);
  ONYX_CHECK(bad == std::string::npos, name, ": the template is not UTF-8 (byte ", bad,
             "); Transformers reads templates as UTF-8 text");
  auto out = std::make_shared<Template>();
  out->src.name = std::move(name);
  // Jinja: \r\n and \r read as \n; one trailing newline is dropped (keep_trailing_newline=False)
  std::string& t = out->src.text;
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
  out->src.line_starts.push_back(0);
  for (size_t i = 0; i < t.size(); i++)
    if (t[i] == '\n') out->src.line_starts.push_back(i + 1);
  Parser p(out->src, lex(out->src));
  out->body = p.parse_template();
  out->has_generation = p.saw_generation;
  return out;
}

}  // namespace onyx::templates
