// templates/lexer.cc — a template's tokens, as jinja2 3.1's lexer makes them (read from its
// lexer.py; no code taken): data, {{ }}, {% %}, {# #} with '-' / '+' and trim_blocks /
// lstrip_blocks, {% raw %}, Python's string escapes and number literals.
#include <algorithm>
#include <cstring>

#include "templates/syntax.h"
#include "tokenizers/tokenizer.h"

namespace onyx::templates {

namespace unicode = tokenizers::unicode;

namespace {

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

// A number literal at s[pos] (Python's: float as digits ( . digits [e...] | e... ); int as
// 0b / 0o / 0x / digits, with '_' separators) appended to toks; returns the position after it.
size_t lex_number(const Source& src, size_t pos, std::vector<Tok>& toks) {
  const std::string& s = src.text;
  const size_t n = s.size();
  const char c = s[pos];
  // float: digits ( . digits [e...] | e... ); int: 0b / 0o / 0x / digits, '_' separators
  size_t j = pos;
  auto digits = [&](size_t& q, auto pred) {
    size_t b = q;
    while (q < n && (pred(s[q]) || (s[q] == '_' && q + 1 < n && pred(s[q + 1]) && q > b))) q++;
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
    return fe;
  }
  int base = 10;
  size_t q = pos;
  if (c == '0' && pos + 1 < n && std::strchr("bBoOxX", s[pos + 1])) {
    const char b = std::tolower(s[pos + 1]);
    base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
    q = pos + 2;
    auto dig = [base](char ch) {
      return base == 16 ? std::isxdigit((unsigned char)ch) != 0 : (ch >= '0' && ch < '0' + base);
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
  return q;
}

// The lexer's state while it walks one template: where it is, whether a line is starting (for
// lstrip_blocks), the tokens so far.
struct Lexer {
  const Source& src;
  const std::string& s;
  const size_t n;
  std::vector<Tok> toks;
  size_t pos = 0;
  bool line_starting = true;

  explicit Lexer(const Source& source) : src(source), s(source.text), n(source.text.size()) {}

  std::vector<Tok> run() {
    while (pos < n) {
      const size_t k = next_tag(pos);
      if (k == std::string::npos) {
        emit_data(s.substr(pos), pos);
        break;
      }
      const char kind = s[k + 1];
      size_t p = k + 2;
      char sign = 0;
      if (p < n && (s[p] == '-' || s[p] == '+')) sign = s[p++];
      std::string text = s.substr(pos, k - pos);
      if (kind == '%' && raw_block(k, p, sign, text)) continue;
      emit_data(strip_before(std::move(text), sign, kind == '{'), pos);
      if (kind == '#')
        comment(k, p);
      else
        tag(k, p, kind);
    }
    toks.push_back({Tok::End, "", 0, 0, n});
    return std::move(toks);
  }

  // Where the next "{{", "{%" or "{#" at or after `from` starts (npos: none).
  size_t next_tag(size_t from) const {
    for (size_t k = s.find('{', from); k != std::string::npos && k + 1 < n; k = s.find('{', k + 1))
      if (s[k + 1] == '{' || s[k + 1] == '%' || s[k + 1] == '#') return k;
    return std::string::npos;
  }

  void emit_data(std::string text, size_t off) {
    if (!text.empty()) toks.push_back({Tok::Data, std::move(text), 0, 0, off});
  }
  // Jinja's OptionalLStrip: the text before a tag, stripped by its '-' or by lstrip_blocks.
  std::string strip_before(std::string text, char sign, bool is_var) const {
    if (sign == '-') {
      text.resize(rstrip_len(text));
    } else if (sign != '+' && !is_var) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && all_space(text, l_pos)) text.resize(l_pos);
    }
    return text;
  }

  // {% raw %} ... {% endraw %} at the tag opened at k (its name from p): the text before it and
  // the raw body as data; false when the tag is not raw.
  bool raw_block(size_t k, size_t p, char sign, const std::string& text) {
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
        return true;
      }
    }
    return false;
  }

  // {# ... #} opened at k, its body from p: skipped.
  void comment(size_t k, size_t p) {
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
  }

  // The tokens of the {{ ... }} or {% ... %} tag opened at k (kind '{' or '%'), its body from p,
  // through its end (brackets balanced, whitespace control applied).
  void tag(size_t k, size_t p, char kind) {
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
        pos = lex_number(src, pos, toks);
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
};

}  // namespace

std::vector<Tok> lex(const Source& src) { return Lexer(src).run(); }

}  // namespace onyx::templates
