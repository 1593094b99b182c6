"""test_untrusted_templates.py — chat templates and conversations written by a stranger (issue 34):
`onyx chat-template T.jinja --messages M.json` on hostile input.

Each case ends within its time limit (30 s) and under an address-space limit (6 GiB), never by a
signal, and either
  - prints what jinja2 prints (transformers.utils.chat_template_utils.render_jinja_template, the
    function apply_chat_template renders with), byte for byte, or
  - exits 1 with "onyx: error:" and a message matching the case's pattern, naming the template
    and, for template errors, its line and column (TemplateLimits in data/chat_template.h are
    the bounds; where jinja2 answers with a Python big integer onyx refuses the overflow).
tokenizer_config.json's special tokens and chat_template are typed as Transformers types them.
The nesting cases crashed onyx with signal 11 before the bounds, the repetition and nested-loop
cases hung it, the doubling case ran 18 s into std::bad_alloc, and the integer cases wrapped.

Run: ONYX=build/onyx build/venv/bin/python tests/cli/test_untrusted_templates.py
Prints one line per case and ends with "N passed, M failed"; exits 1 if any case failed.
"""
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ONYX = os.environ.get("ONYX", os.path.join(REPO, "build", "onyx"))
TIME_LIMIT_S = 30
MEMORY_LIMIT = 6 << 30
MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]

INT_OVERFLOW = r"integer overflow: .* does not fit in 64 bits"
NESTING = r"line 1, column \d+: the (template nests blocks and expressions|expression nests) " \
          r"deeper than 256 levels"
RENDER_NESTING = r"nests statements, expressions and macro calls deeper than 256 levels"
TOO_MUCH = r"(made more than 1024 MiB of values|ran more than 20000000 steps)"
LONG_STRING = r"a string of \d+ bytes is longer than onyx's bound of 64 MiB"

# (name, template, expected): "jinja" = jinja2's output; otherwise a regex onyx's error matches.
CASES = [
    # nesting without a bound crashed the parser / renderer (signal 11)
    ("4000 nested ifs", "{% if true %}" * 4000 + "x" + "{% endif %}" * 4000, NESTING),
    ("5000 nested fors", "{% for i in [1] %}" * 5000 + "x" + "{% endfor %}" * 5000, NESTING),
    ("10000 parentheses", "{{ " + "(" * 10000 + "1" + ")" * 10000 + " }}", NESTING),
    ("100000 list brackets", "{{ " + "[" * 100000 + "]" * 100000 + " }}", NESTING),
    ("100000 nots", "{{ " + "not " * 100000 + "true }}", NESTING),
    ("100000 unary minus", "{{ " + "-" * 100000 + "1 }}", NESTING),
    ("100000 filters", "{{ 'a'" + "|lower" * 100000 + " }}", NESTING),
    ("100000 attributes", "{{ messages" + ".x" * 100000 + " }}", NESTING),
    ("100000 subscripts", "{{ messages" + "[0]" * 100000 + " }}", NESTING),
    ("100000 additions", "{{ 1" + " + 1" * 100000 + " }}", NESTING),
    ("100000 calls", "{{ range" + "(1)" * 100000 + " }}", NESTING),
    ("50000 nested dicts", "{{ " + "{'a': " * 50000 + "1" + "}" * 50000 + " }}", NESTING),
    ("100000 conditionals", "{{ 1" + " if true else 1" * 100000 + " }}", NESTING),
    ("macro recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
     r"(macros call each other deeper than 100 levels|" + RENDER_NESTING + ")"),
    ("macro recursion through ifs",
     "{% macro f(n) %}{% if true %}{% if true %}{{ f(n + 1) }}{% endif %}{% endif %}"
     "{% endmacro %}{{ f(0) }}", RENDER_NESTING),
    ("250 ifs around 250 negations",
     "{% if true %}" * 250 + "{{ " + "-" * 250 + "1 }}" + "{% endif %}" * 250, NESTING),
    ("deep but within the bounds", "{% if true %}" * 60 + "{{ " + "-" * 60 + "1 }}" +
     "{% endif %}" * 60, "jinja"),
    # a list nested 100000 deep is built, measured and released without recursion
    ("a list nested 100000 deep",
     "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
     "{% endfor %}{{ ns.x|length }}", TOO_MUCH + "|^1$"),
    ("a list nested 5000 deep", "{% set ns = namespace(x=[]) %}{% for i in range(5000) %}"
     "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x|length }}", "jinja"),
    ("printing it", "{% set ns = namespace(x=[]) %}{% for i in range(5000) %}"
     "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}", r"values nest deeper than 512 levels"),
    ("tojson of it", "{% set ns = namespace(x=[]) %}{% for i in range(5000) %}"
     "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x|tojson }}", r"values nest deeper than 512"),
    ("a namespace holding itself", "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}",
     r"values nest deeper than 512 levels"),
    ("comparing it with itself", "{% set ns = namespace() %}{% set ns.me = [ns] %}"
     "{{ ns.me == ns.me }}", "jinja"),
    # work and memory without a bound hung onyx or ended in std::bad_alloc
    ("'ab' * (2**63 - 1)", "{{ 'ab' * 9223372036854775807 }}", LONG_STRING),
    ("[1] * (2**63 - 1)", "{{ [1] * 9223372036854775807 }}",
     r"a list or dict of \d+ items is larger than onyx's bound"),
    ("'ab' * -3", "[{{ 'ab' * -3 }}|{{ [1] * -1 }}|{{ 3 * 'ab' }}]", "jinja"),
    ("nested range(100000) loops", "{% for i in range(100000) %}{% for j in range(100000) %}"
     "{% endfor %}{% endfor %}", TOO_MUCH),
    ("nested loops counting", "{% set ns = namespace(c=0) %}{% for i in range(100000) %}"
     "{% for j in range(100000) %}{% set ns.c = ns.c + 1 %}{% endfor %}{% endfor %}{{ ns.c }}",
     TOO_MUCH),
    ("doubling a string 64 times", "{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
     "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}", LONG_STRING),
    ("doubling a list 64 times", "{% set ns = namespace(s=[1]) %}{% for i in range(64) %}"
     "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
     r"(a list or dict of \d+ items is larger|" + TOO_MUCH + ")"),
    ("a 60 MB string copied into a long list", "{% set s = 'x' * 60000000 %}"
     "{{ ([s] * 100)|length }}", TOO_MUCH),
    ("100 MB of output", "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", LONG_STRING),
    ("O(n^2) membership", "{% set l = range(100000)|list %}{% for i in range(100000) %}"
     "{{ i in l }}{% endfor %}", TOO_MUCH),
    ("indexing a 60 MB string", "{% set s = 'x' * 60000000 %}{% for i in range(100000) %}"
     "{{ s[i] }}{% endfor %}", TOO_MUCH),
    ("range over 100000 items", "{{ range(100001)|length }}", r"range too big"),
    ("range with a huge step", "{{ range(0, 10, 9223372036854775807)|list }}"
     "{{ range(9223372036854775806, 9223372036854775807, 2)|list }}", "jinja"),
    ("slices with huge steps", "{{ [1, 2, 3][::9223372036854775807] }}"
     "{{ [1, 2, 3][::-9223372036854775807] }}{{ 'abc'[-9223372036854775807:] }}", "jinja"),
    ("split with a huge maxsplit", "{{ 'a b c'.split(' ', 9223372036854775807) }}"
     "{{ 'a b c'.rsplit(None, 9223372036854775807) }}", "jinja"),
    ("indent widths", "[{{ 'x\ny'|indent(-5) }}|{{ 'x\ny'|indent(2, true) }}]", "jinja"),
    ("tojson indent -1", "{{ [1, [2]]|tojson(indent=-1) }}", "jinja"),
    ("a huge indent", "{{ 'x\ny'|indent(9223372036854775807) }}", LONG_STRING),
    # Python's integers: overflow is an error where jinja2 has a big integer, never a wrap
    ("INT64_MIN // -1", "{{ (-9223372036854775807 - 1) // -1 }}", INT_OVERFLOW),
    ("INT64_MIN % -1", "{{ (-9223372036854775807 - 1) % -1 }}", "jinja"),
    ("floor division and modulo signs", "{{ 7 // -2 }} {{ -7 // 2 }} {{ 7 % -2 }} {{ -7 % 2 }} "
     "{{ -7 % -2 }} {{ 7.5 // -2 }} {{ -7.5 % 2 }}", "jinja"),
    ("2**63 - 1 + 1", "{{ 9223372036854775807 + 1 }}", INT_OVERFLOW),
    ("-2**63 - 1", "{{ -9223372036854775807 - 2 }}", INT_OVERFLOW),
    ("2**62 * 2", "{{ 4611686018427387904 * 2 }}", INT_OVERFLOW),
    ("2 ** 64", "{{ 2 ** 64 }}", INT_OVERFLOW),
    ("2 ** (2**63 - 1)", "{{ 2 ** 9223372036854775807 }}", INT_OVERFLOW),
    ("small powers", "{{ 2 ** 62 }} {{ (-2) ** 63 }} {{ 1 ** 9223372036854775807 }} "
     "{{ (-1) ** 9223372036854775807 }} {{ 0 ** 0 }} {{ 2 ** -2 }} {{ 10 ** 18 }}", "jinja"),
    ("negating INT64_MIN", "{{ -(-9223372036854775807 - 1) }}", INT_OVERFLOW),
    ("abs of INT64_MIN", "{{ (-9223372036854775807 - 1)|abs }}", INT_OVERFLOW),
    ("divisibleby -1", "{{ (-9223372036854775807 - 1) is divisibleby(-1) }} "
     "{{ 7 is divisibleby(-7) }}", "jinja"),
    ("an integer literal past 64 bits", "{{ 9223372036854775808 }}",
     r"integer literal out of range"),
    ("round of integers", "{{ 15|round(-1) }} {{ 25|round(-1) }} {{ -25|round(-1) }} "
     "{{ 7|round(2) }} {{ 123|round(-5) }}", "jinja"),
    ("round of floats", "{{ 1.5|round(400) }} {{ 2.5|round }} {{ 1e300|round(-400) }} "
     "{{ 2.675|round(2) }} {{ 0.125|round(2) }} {{ -0.5|round }} {{ 1234.5|round(-2) }}", "jinja"),
    # float -> int as Python converts (jinja2's int filter falls back to its default)
    ("nan|int", "{{ 'nan'|float|int }} {{ 'nan'|int(7) }}", "jinja"),
    ("1e400|int", "{{ 1e400|int }}", r"cannot convert float infinity to integer"),
    ("'inf'|int", "{{ 'inf'|int }}", r"cannot convert float infinity to integer"),
    ("1e300|int", "{{ 1e300|int }}", r"does not fit in 64 bits"),
    ("'1e300'|int", "{{ '1e300'|int }}", r"does not fit in 64 bits"),
    ("int of strings", "{{ '42'|int }} {{ ' -7 '|int }} {{ '4.9'|int }} {{ 'x'|int(3) }} "
     "{{ 'ff'|int(base=16) }} {{ '1e3'|int }}", "jinja"),
    ("a 20-digit string", "{{ '99999999999999999999'|int }}", r"does not fit in 64 bits"),
    ("int of floats", "{{ 3.99|int }} {{ -3.99|int }} {{ 9.2e18|int }} {{ -9.2e18|int }}",
     "jinja"),
    # code points: indexing, slicing and measuring agree (the fuzzer found a read past a string
    # whose bytes were not UTF-8; such a template is now refused)
    ("indexing multi-byte text", "{{ 'ä€𝄞x'[-1] }}{{ 'ä€𝄞x'[2] }}|{{ 'ä€𝄞x'|length }}|"
     "{{ 'ä€𝄞x'[::-1] }}|{{ 'ä€𝄞x'[1:3] }}", "jinja"),
]
BAD_UTF8 = b"{{ '\xd7\xd7ab'[-1] }}"


def limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_onyx(template, messages_path, tmp):
    path = os.path.join(tmp, "t.jinja")
    with open(path, "w", encoding="utf-8") as f:
        f.write(template)
    t0 = time.time()
    try:
        p = subprocess.run([ONYX, "chat-template", path, "--messages", messages_path],
                           capture_output=True, text=True, timeout=TIME_LIMIT_S,
                           preexec_fn=limit_memory)
    except subprocess.TimeoutExpired:
        return None, "", "timed out after %d s" % TIME_LIMIT_S, time.time() - t0
    return p.returncode, p.stdout, p.stderr, time.time() - t0


def jinja_render(template):
    from transformers.utils.chat_template_utils import render_jinja_template
    out = render_jinja_template([MESSAGES], chat_template=template)
    return out[0][0]


def check_case(name, template, expected, messages_path, tmp):
    import re
    rc, out, err, secs = run_onyx(template, messages_path, tmp)
    if rc is None or rc < 0 or rc > 1:
        return False, "rc=%s %s" % (rc, err.strip()[-300:])
    if expected == "jinja":
        want = jinja_render(template)
        ok = rc == 0 and out == want
        return ok, "" if ok else "jinja2: %r\n    onyx (rc %d): %r" % (
            want[:300], rc, (out or err)[:300])
    if rc == 0:
        ok = re.search(expected, out) is not None
        return ok, "" if ok else "expected an error matching %r; onyx printed %r" % (
            expected, out[:200])
    ok = err.startswith("onyx: error: ") and "t.jinja" in err and re.search(expected, err)
    return bool(ok), "" if ok else "error %r does not match %r" % (err.strip()[:300], expected)


def conversation_cases(tmp):
    """Conversation files: nesting is refused at the parse, before anything recurses."""
    out = []
    tpath = os.path.join(tmp, "m.jinja")
    with open(tpath, "w") as f:
        f.write("{{ messages }}")
    for name, text, pattern in [
        ("a million nested '['", "[" * 1000000 + "]" * 1000000,
         r"JSON nests deeper than 256 levels"),
        ("a message nesting 300 objects",
         json.dumps([{"role": "user", "content": "x"}])[:-2] + ', "x": ' + "{\"a\": " * 300 +
         "1" + "}" * 300 + "}]", r"JSON nests deeper than 256 levels"),
        ("a truncated file", '[{"role": "user", "content": "x"', r"is not valid JSON: .*line 1"),
        ("not a list", '{"role": "user"}', r"chat messages must be a JSON array"),
        ("an unsigned integer past 2**63", '[{"role": "user", "content": 18446744073709551615}]',
         r"does not fit in 64 bits"),
    ]:
        mpath = os.path.join(tmp, "conv.json")
        with open(mpath, "w") as f:
            f.write(text)
        try:
            p = subprocess.run([ONYX, "chat-template", tpath, "--messages", mpath],
                               capture_output=True, text=True, timeout=TIME_LIMIT_S,
                               preexec_fn=limit_memory)
            import re
            ok = p.returncode == 1 and p.stderr.startswith("onyx: error: ") and \
                re.search(pattern, p.stderr) is not None
            detail = "rc=%d %s" % (p.returncode, p.stderr.strip()[:300])
        except subprocess.TimeoutExpired:
            ok, detail = False, "timed out"
        out.append(("conversation: " + name, ok, detail))
    return out


def invalid_utf8_case(tmp, messages_path):
    """A template whose bytes are not UTF-8: refused naming the byte (Transformers reads UTF-8)."""
    path = os.path.join(tmp, "bad.jinja")
    with open(path, "wb") as f:
        f.write(BAD_UTF8)
    p = subprocess.run([ONYX, "chat-template", path, "--messages", messages_path],
                       capture_output=True, text=True, timeout=TIME_LIMIT_S)
    ok = p.returncode == 1 and "the template is not UTF-8 (byte 4)" in p.stderr
    return [("a template that is not UTF-8", ok, "rc=%d %s" % (p.returncode, p.stderr.strip()))]


def tokenizer_config_cases(tmp):
    """tokenizer_config.json read for its chat template and special tokens: a special token that
    is neither a string nor an AddedToken (Transformers refuses it), a file that is not an
    object, a chat_template of the wrong type."""
    import re
    out = []
    for name, cfg, pattern in [
        ("eos_token 5", {"eos_token": 5, "chat_template": "x"},
         r"tokenizer_config.json: 'eos_token' must be a string or an AddedToken"),
        ("bos_token {\"content\": 7}", {"bos_token": {"content": 7}, "chat_template": "x"},
         r"'bos_token' must be a string or an AddedToken"),
        ("a list", [1, 2], r"tokenizer_config.json: expected a JSON object, got array"),
        ("chat_template 5", {"chat_template": 5}, r"chat_template must be a string or a list"),
        ("eos_token null is allowed", {"eos_token": None, "chat_template": "ok"}, None),
    ]:
        folder = os.path.join(tmp, "tc")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f)
        mpath = os.path.join(tmp, "messages.json")
        p = subprocess.run([ONYX, "chat-template", folder, "--messages", mpath],
                           capture_output=True, text=True, timeout=TIME_LIMIT_S)
        if pattern is None:
            ok, detail = p.returncode == 0 and p.stdout == "ok", "rc=%d %s" % (
                p.returncode, p.stderr.strip()[:200])
        else:
            ok = p.returncode == 1 and re.search(pattern, p.stderr) is not None
            detail = "rc=%d %s" % (p.returncode, p.stderr.strip()[:300])
        out.append(("tokenizer_config.json: " + name, ok, detail))
    return out


def main():
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        messages_path = os.path.join(tmp, "messages.json")
        with open(messages_path, "w") as f:
            json.dump(MESSAGES, f)
        for name, template, expected in CASES:
            try:
                ok, detail = check_case(name, template, expected, messages_path, tmp)
            except Exception as e:  # noqa: BLE001 — a reference that fails is a failed case
                ok, detail = False, "%s: %s" % (type(e).__name__, e)
            results.append((name, ok, detail))
        results += conversation_cases(tmp)
        results += tokenizer_config_cases(tmp)
        results += invalid_utf8_case(tmp, messages_path)
    passed = sum(ok for _, ok, _ in results)
    for name, ok, detail in results:
        print(("ok   " if ok else "FAIL ") + name + ("" if ok else "\n    " + detail))
    print(f"{passed} passed, {len(results) - passed} failed")
    sys.exit(0 if passed == len(results) else 1)


if __name__ == "__main__":
    main()
