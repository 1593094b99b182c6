// templates/syntax.h — a template's tokens (lexer.cc: Jinja's whitespace rules — trim_blocks,
// lstrip_blocks, '-' / '+' — and Python's literals) and its tree (parser.cc: recursive descent with
// Jinja's precedence). Internal to src/templates.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "templates/value.h"

namespace onyx::templates {

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

std::vector<Tok> lex(const Source& src);

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

struct Template {
  Source src;
  Body body;
  bool has_generation = false;
};

}  // namespace onyx::templates
