#!/usr/bin/env python3
"""sizes.py — the longest functions and the largest files of onyx's own code (issue 36's size
discipline, after tinygrad's line budget): C++ under src/, tools/, python/_onyx.cc, and the
Python package (python/onyx). CI prints it (scripts/test.sh); a function over LIMIT lines is a
candidate to split where the split has a name.

C++ functions are found by a brace scanner, written here because no Debian package gives
function extents without a compile (clang's AST needs each file's flags): comments, strings and
character literals are blanked, then each `{` is classified by the text before it — a namespace,
a class (class / struct / union / enum), a function body (a `)` before it, at namespace or class
scope; constructor initializer lists' braced members skipped), or a block inside one. Lambdas
count as part of their function. Python functions come from the ast module.

  python3 scripts/sizes.py [--top N] [--limit L]
"""
import argparse
import ast
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPP_DIRS = ["src", "tools", "python"]
PY_DIRS = ["python/onyx"]


def blank(text):
    """`text` with comments, string and char literals replaced by spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000'000
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(n, j + 1)
            out.append(" " * (j - i))
            i = j
        elif c == "#" and (i == 0 or text[i - 1] == "\n"):  # preprocessor lines
            j = i
            while True:
                k = text.find("\n", j)
                if k < 0:
                    k = n
                    break
                if text[k - 1] != "\\":
                    break
                j = k + 1
            out.append(re.sub(r"[^\n]", " ", text[i:k]))
            i = k
        else:
            out.append(c)
            i += 1
    return "".join(out)


def function_name(header):
    """The qualified name in a function header: the identifier (with ::) before its parameters
    (a registration macro's body: the macro with its arguments)."""
    m = re.search(r"\b(ONYX_REGISTER_\w+\([^()]*\))\s*$", header.strip())
    if m:
        return m.group(1)
    depth, cut = 0, None
    for k, ch in enumerate(header):  # the first '(' at angle/paren depth 0
        if ch == "(" and depth == 0:
            cut = k
            break
        if ch == "<":
            depth += 1
        elif ch == ">" and depth > 0:
            depth -= 1
    before = header[:cut] if cut is not None else header
    m = re.search(r"((?:[A-Za-z_~][\w]*(?:<[^<>]*>)?::)*(?:operator\s*\S+|~?[A-Za-z_]\w*))\s*$",
                  before.strip())
    return m.group(1) if m else before.strip()[-40:]


def cpp_functions(path):
    text = blank(open(path, encoding="utf-8", errors="replace").read())
    scopes = []  # (kind, name, start line)
    header_start, line, found = 0, 1, []
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        if c not in "{};":
            continue
        in_function = any(k == "function" for k, _, _ in scopes)
        if c == ";":
            if not in_function:
                header_start = i + 1
            continue
        header = text[header_start:i]
        if c == "{":
            h = " ".join(header.split())
            if in_function:
                kind = "block"
            elif re.search(r"\)\s*:\s*[^{};]*$", h) and re.search(r"[\w>]\s*$", h) and \
                    not re.search(r"\)\s*(const|override|final|noexcept|mutable|\s)*$", h):
                kind = "init"  # a braced member in a constructor's initializer list
            elif re.match(r"^(.*\s)?(inline\s+)?namespace\b", h) or h.startswith('extern "C"') \
                    or h == "extern":
                kind = "namespace"
            elif re.search(r"\b(class|struct|union|enum)\b[^()]*$", h):
                kind = "class"
            elif ")" in h:
                kind = "function"
            else:
                kind = "block"
            name = ""
            if kind == "function":  # qualified by the classes it is defined in
                outer = [nm for k, nm, _ in scopes if k == "class" and nm]
                name = "::".join(outer + [function_name(h)])
            elif kind == "class":
                m = re.search(r"\b(?:class|struct|union|enum)\s+(?:class\s+)?(\w+)", h)
                name = m.group(1) if m else ""
            scopes.append((kind, name, line))
            if kind in ("namespace", "class", "function"):
                header_start = i + 1
        else:
            if not scopes:
                continue
            kind, name, start = scopes.pop()
            if kind == "function":
                found.append((line - start + 1, name, start))
            if kind != "init" and not any(k == "function" for k, _, _ in scopes):
                header_start = i + 1
    return found


def py_functions(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    out = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((child.end_lineno - child.lineno + 1, prefix + child.name, child.lineno))
                walk(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
    walk(tree, "")
    return out


def sources():
    for d in CPP_DIRS:
        for root, _, files in os.walk(os.path.join(REPO, d)):
            for f in files:
                if f.endswith((".cc", ".h", ".cu", ".cuh")):
                    yield os.path.join(root, f), "cpp"
    for d in PY_DIRS:
        for root, _, files in os.walk(os.path.join(REPO, d)):
            for f in files:
                if f.endswith(".py"):
                    yield os.path.join(root, f), "py"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=10, help="how many of each to print")
    ap.add_argument("--limit", type=int, default=150, help="function length to count as long")
    a = ap.parse_args()
    functions, files = [], []
    for path, kind in sources():
        rel = os.path.relpath(path, REPO)
        with open(path, encoding="utf-8", errors="replace") as f:
            files.append((sum(1 for _ in f), rel))
        for n, name, start in (cpp_functions(path) if kind == "cpp" else py_functions(path)):
            functions.append((n, name, f"{rel}:{start}"))
    functions.sort(key=lambda x: (-x[0], x[2]))
    files.sort(key=lambda x: (-x[0], x[1]))
    print(f"longest functions (of {len(functions)}; {sum(n > a.limit for n, _, _ in functions)} "
          f"over {a.limit} lines):")
    for n, name, where in functions[:a.top]:
        print(f"  {n:5d}  {name}  {where}")
    print(f"largest files (of {len(files)}, {sum(n for n, _ in files)} lines):")
    for n, rel in files[:a.top]:
        print(f"  {n:5d}  {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
