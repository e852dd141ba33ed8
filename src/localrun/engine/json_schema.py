"""JSON schema -> GBNF grammar, by the rules of llama.cpp's own converter (common/json-schema.cpp and
common/json-schema-to-grammar.cpp, MIT licence, Copyright (c) 2023-2024 The ggml authors), ported to Python.

llama-cpp-python's `json_schema_to_gbnf` is a port of an older version: it copies a pattern's escapes
(`\\.`, `\\d`) into GBNF literals, which llama.cpp's grammar parser refuses. Here a pattern is translated to
what the grammar parser knows, and a schema that cannot be expressed is refused as a schema (SchemaError names
the keyword and where it is), never as a grammar the user did not write.

Beyond llama.cpp's converter: a pattern's `\\d \\w \\s` (and negations) become character classes, an escaped
punctuation character is that character, an unanchored pattern may have text around it (as JSON schema says),
and the text a pattern allows is written as JSON (a `.` or a negated class never yields a raw quote, backslash
or control character, which would end or break the JSON string). llama.cpp falls back to 'any string' for a
pattern it cannot translate; here that is refused, since the answer would not match what was asked.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Optional

from ..errors import UsageError

INT_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

SPACE_RULE = '| " " | "\\n"{1,2} [ \\t]{0,20}'

PRIMITIVE_RULES: dict[str, tuple[str, list[str]]] = {
    "boolean": ('("true" | "false")', []),
    "decimal-part": ("[0-9]{1,16}", []),
    "integral-part": ("[0] | [1-9] [0-9]{0,15}", []),
    "number": ('("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?', ["integral-part", "decimal-part"]),
    "integer": ('("-"? integral-part)', ["integral-part"]),
    "value": ("object | array | string | number | boolean | null", ["object", "array", "string", "number", "boolean", "null"]),
    "object": ('"{" space ( string ":" space value ("," space string ":" space value)* )? space "}"', ["string", "value"]),
    "array": ('"[" space ( value ("," space value)* )? space "]"', ["value"]),
    "uuid": ('"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\\""', []),
    "char": ('[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})', []),
    "string": ('"\\"" char* "\\""', ["char"]),
    "null": ('"null"', []),
}

STRING_FORMAT_RULES: dict[str, tuple[str, list[str]]] = {
    "date": ('[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )', []),
    "time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )', []),
    "date-time": ('date "T" time', ["date", "time"]),
    "date-string": ('"\\"" date "\\""', ["date"]),
    "time-string": ('"\\"" time "\\""', ["time"]),
    "date-time-string": ('"\\"" date-time "\\""', ["date-time"]),
}

RESERVED_NAMES = {"root", *PRIMITIVE_RULES, *STRING_FORMAT_RULES}
INVALID_RULE_CHARS = re.compile(r"[^a-zA-Z0-9-]+")
LITERAL_ESCAPES = {"\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\"}

# In a pattern: the text of a JSON string, between its quotes, one decoded character at a time.
JSON_PLAIN = '"\\\\\\x7F\\x00-\\x1F'  # what a class must leave out so a character stands for itself in JSON
DOT = f"[^{JSON_PLAIN}]"
CLASS_ESCAPES = {"d": "0-9", "w": "a-zA-Z0-9_", "s": " "}  # \s: only the space (other whitespace is escaped in JSON)
CLASS_RANGES = {"d": ((48, 57),), "w": ((97, 122), (65, 90), (48, 57), (95, 95)), "s": ((32, 32),)}
CONTROL_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "v": "\v"}
JSON_SPECIALS = [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F)]  # written escaped in a JSON string
NON_LITERAL = set("|.()[]{}*+?^$")
HEX_ESCAPES = {"x": 2, "u": 4}


class SchemaError(UsageError):
    """A JSON schema that cannot become a grammar. `where` is the place in the schema ('properties.version',
    '' for the root), `keyword` the schema keyword at fault ('pattern', '$ref', ...), `reason` why."""

    def __init__(self, where: str, keyword: str, reason: str):
        self.where, self.keyword, self.reason = where, keyword, reason
        place = f" at '{where}'" if where else ""
        subject = f"the JSON schema's {keyword}{place}" if keyword else f"the JSON schema{place}"
        super().__init__(f"{subject} cannot be turned into a grammar: {reason}")


class _PatternError(Exception):
    pass


def _format_literal(text: str) -> str:
    return '"' + "".join(LITERAL_ESCAPES.get(c, c) for c in text) + '"'


def _repetition(item: str, min_items: int, max_items: int, separator: str = "") -> str:
    has_max = max_items != INT_MAX
    if max_items == 0:
        return ""
    if min_items == 0 and max_items == 1:
        return f"{item}?"
    if not separator:
        if min_items == 1 and not has_max:
            return f"{item}+"
        if min_items == 0 and not has_max:
            return f"{item}*"
        return f"{item}{{{min_items},{max_items if has_max else ''}}}"
    result = item + " " + _repetition(f"({separator} {item})", max(min_items - 1, 0), max_items - 1 if has_max else max_items)
    return f"({result})?" if min_items == 0 else result


def _min_max_int(min_value: int, max_value: int, out: list[str], decimals_left: int = 16, top_level: bool = True) -> None:
    """llama.cpp's build_min_max_int: integers in [min_value, max_value] as GBNF (INT64_MIN/MAX: unbounded)."""
    has_min, has_max = min_value != INT64_MIN, max_value != INT64_MAX

    def digit_range(lo: str, hi: str) -> None:
        out.append(f"[{lo}]" if lo == hi else f"[{lo}-{hi}]")

    def more_digits(lo: int, hi: int) -> None:
        out.append("[0-9]")
        if lo == hi == 1:
            return
        out.append("{" + str(lo) + ("" if hi == lo else "," + ("" if hi == INT_MAX else str(hi))) + "}")

    def uniform_range(frm: str, to: str) -> None:
        i = 0
        while i < len(frm) and i < len(to) and frm[i] == to[i]:
            i += 1
        if i > 0:
            out.append(f'"{frm[:i]}"')
        if i < len(frm) and i < len(to):
            if i > 0:
                out.append(" ")
            sub_len = len(frm) - i - 1
            if sub_len > 0:
                frm_sub, to_sub = frm[i + 1:], to[i + 1:]
                zeros, nines = "0" * sub_len, "9" * sub_len
                to_reached = False
                out.append("(")
                if frm_sub == zeros:
                    digit_range(frm[i], chr(ord(to[i]) - 1))
                    out.append(" ")
                    more_digits(sub_len, sub_len)
                else:
                    out.append(f"[{frm[i]}] (")
                    uniform_range(frm_sub, nines)
                    out.append(")")
                    if ord(frm[i]) < ord(to[i]) - 1:
                        out.append(" | ")
                        if to_sub == nines:
                            digit_range(chr(ord(frm[i]) + 1), to[i])
                            to_reached = True
                        else:
                            digit_range(chr(ord(frm[i]) + 1), chr(ord(to[i]) - 1))
                        out.append(" ")
                        more_digits(sub_len, sub_len)
                if not to_reached:
                    out.append(" | ")
                    digit_range(to[i], to[i])
                    out.append(" ")
                    uniform_range(zeros, to_sub)
                out.append(")")
            else:
                out.append(f"[{frm[i]}-{to[i]}]")

    if has_min and has_max:
        if min_value < 0 and max_value < 0:
            out.append('"-" (')
            _min_max_int(-max_value, -min_value, out, decimals_left, True)
            out.append(")")
            return
        if min_value < 0:
            out.append('"-" (')
            _min_max_int(0, -min_value, out, decimals_left, True)
            out.append(") | ")
            min_value = 0
        min_s, max_s = str(min_value), str(max_value)
        for digits in range(len(min_s), len(max_s)):
            uniform_range(min_s, "9" * digits)
            min_s = "1" + "0" * digits
            out.append(" | ")
        uniform_range(min_s, max_s)
        return

    less_decimals = max(decimals_left - 1, 1)
    if has_min:
        if min_value < 0:
            out.append('"-" (')
            _min_max_int(INT64_MIN, -min_value, out, decimals_left, False)
            out.append(") | [0] | [1-9] ")
            more_digits(0, decimals_left - 1)
        elif min_value == 0:
            if top_level:
                out.append("[0] | [1-9] ")
                more_digits(0, less_decimals)
            else:
                more_digits(1, decimals_left)
        elif min_value <= 9:
            c = str(min_value)
            start = "1" if top_level else "0"
            if c > start:
                digit_range(start, chr(ord(c) - 1))
                out.append(" ")
                more_digits(1, less_decimals)
                out.append(" | ")
            digit_range(c, "9")
            out.append(" ")
            more_digits(0, less_decimals)
        else:
            min_s = str(min_value)
            c = min_s[0]
            if c > "1":
                digit_range("1" if top_level else "0", chr(ord(c) - 1))
                out.append(" ")
                more_digits(len(min_s), less_decimals)
                out.append(" | ")
            digit_range(c, c)
            out.append(" (")
            _min_max_int(int(min_s[1:]), INT64_MAX, out, less_decimals, False)
            out.append(")")
            if c < "9":
                out.append(" | ")
                digit_range(chr(ord(c) + 1), "9")
                out.append(" ")
                more_digits(len(min_s) - 1, less_decimals)
        return
    if has_max:
        if max_value >= 0:
            if top_level:
                out.append('"-" [1-9] ')
                more_digits(0, less_decimals)
                out.append(" | ")
            _min_max_int(0, max_value, out, decimals_left, True)
        else:
            out.append('"-" (')
            _min_max_int(-max_value, INT64_MAX, out, decimals_left, False)
            out.append(")")
        return
    raise ValueError("at least one of min_value or max_value must be set")


def _pattern_gbnf(pattern: str, dot_rule: str) -> str:
    """A JSON-schema regular expression as GBNF over the JSON text between a string's quotes.
    Raises _PatternError with the reason where the pattern has no grammar equivalent or is not a regex."""
    if _top_level_alternation(pattern) and (pattern.startswith("^") or _ends_with_anchor(pattern)):
        raise _PatternError("anchors inside an alternation are not supported: group it as '^(a|b)$'")
    body = pattern
    prefix = suffix = ""
    if body.startswith("^"):
        body = body[1:]
    else:
        prefix = f"{dot_rule}* "  # a pattern matches anywhere in the string unless anchored
    if _ends_with_anchor(body):
        body = body[:-1]
    else:
        suffix = f" {dot_rule}*"
    i, n = 0, len(body)
    depth = 0

    def literal(c: str) -> str:
        # the JSON text for one character, as the inside of a GBNF literal
        if c == '"':
            return '\\\\\\"'
        if c == "\\":
            return "\\\\\\\\"
        if c in "\n\r\t":
            return "\\\\" + {"\n": "n", "\r": "r", "\t": "t"}[c]
        if ord(c) < 0x20 or c == "\x7f":
            return f"\\\\u{ord(c):04x}"
        return c

    def hex_escape(j: int) -> tuple[str, int]:
        width = HEX_ESCAPES[body[j + 1]]
        digits = body[j + 2 : j + 2 + width]
        if len(digits) != width or not all(h in "0123456789abcdefABCDEF" for h in digits):
            raise _PatternError(f"the escape {body[j:j + 2 + width]!r} is not valid")
        return chr(int(digits, 16)), j + 2 + width

    def class_atom(j: int) -> tuple[list[tuple[int, int]], bool, int]:
        """One member of a class at j: its code point ranges, whether it is a single character (may start or end
        a range), and the index after it."""
        c = body[j]
        if c != "\\":
            return [(ord(c), ord(c))], True, j + 1
        if j + 1 >= n:
            raise _PatternError("it ends in a lone backslash")
        e = body[j + 1]
        if e in CLASS_RANGES:
            return list(CLASS_RANGES[e]), False, j + 2
        if e in "DWS":
            raise _PatternError(f"'\\{e}' inside a character class is not supported")
        if e in CONTROL_ESCAPES:
            return [(ord(CONTROL_ESCAPES[e]),) * 2], True, j + 2
        if e in HEX_ESCAPES:
            ch, j = hex_escape(j)
            return [(ord(ch), ord(ch))], True, j
        if e.isalnum():
            raise _PatternError(f"the escape '\\{e}' in a character class is not supported")
        return [(ord(e), ord(e))], True, j + 2

    def char_class(j: int) -> tuple[str, int]:
        """[...] from index j (at '['): GBNF for one character of the class, as JSON writes it, and the index
        after ']'. A '"', a backslash or a control character the class allows is written escaped, as an
        alternative beside the class of the rest; a negated class also leaves them out (a subset: what is
        generated still matches)."""
        j += 1
        negated = j < n and body[j] == "^"
        if negated:
            j += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while j < n and (body[j] != "]" or first):
            first = False
            if body[j] == "[" and j + 1 < n and body[j + 1] == ":":
                raise _PatternError("POSIX classes like '[:alpha:]' are not supported")
            atom, single, j = class_atom(j)
            if single and j + 1 < n and body[j] == "-" and body[j + 1] != "]":
                end, single_end, j = class_atom(j + 1)
                if not single_end or end[0][0] < atom[0][0]:
                    raise _PatternError("a character class has a bad range")
                atom = [(atom[0][0], end[0][0])]
            ranges += atom
        if j >= n:
            raise _PatternError("a character class is not closed")
        if negated:
            return f"[^{''.join(_class_range(lo, hi) for lo, hi in ranges)}{JSON_PLAIN}]", j + 1
        plain, escaped = _split_json_specials(ranges)
        alternatives = ([f"[{''.join(_class_range(lo, hi) for lo, hi in plain)}]"] if plain else []) + [
            f'"{literal(chr(c))}"' for c in escaped]
        return (alternatives[0] if len(alternatives) == 1 else "(" + " | ".join(alternatives) + ")"), j + 1

    def transform() -> str:
        nonlocal i, depth
        seq: list[tuple[str, bool]] = []  # (GBNF text, is a literal's inside)

        def join() -> str:
            out: list[str] = []
            lit = ""
            for text, is_lit in seq:
                if is_lit:
                    lit += text
                else:
                    if lit:
                        out.append(f'"{lit}"')
                        lit = ""
                    out.append(text)
            if lit:
                out.append(f'"{lit}"')
            return " ".join(out)

        def last_item() -> tuple[str, bool]:
            if not seq or seq[-1][0] == "|":
                raise _PatternError("a quantifier has nothing to repeat")
            text, is_lit = seq.pop()
            return (f'"{text}"' if is_lit else text), is_lit

        def skip_lazy() -> None:
            nonlocal i
            if i < n and body[i] in "?+":  # lazy or possessive: the same strings match
                i += 1

        while i < n:
            c = body[i]
            if c == ".":
                seq.append((dot_rule, False))
                i += 1
            elif c == "(":
                i += 1
                if i < n and body[i] == "?":
                    if i + 1 < n and body[i + 1] == ":":
                        i += 2
                    else:
                        raise _PatternError("lookarounds, named groups and inline flags ('(?') are not supported")
                depth += 1
                if depth > 100:
                    raise _PatternError("groups are nested too deep")
                seq.append((f"({transform()})", False))
            elif c == ")":
                if depth == 0:
                    raise _PatternError("its parentheses are unbalanced")
                depth -= 1
                i += 1
                return join()
            elif c in "^$":
                raise _PatternError(f"the anchor '{c}' inside the pattern is not supported")
            elif c == "[":
                cls, i = char_class(i)
                seq.append((cls, False))
            elif c == "|":
                seq.append(("|", False))
                i += 1
            elif c in "*+?":
                text, _ = last_item()
                seq.append((text + c, False))
                i += 1
                skip_lazy()
            elif c == "{":
                m = re.match(r"\{(\d*)(,?)(\d*)\}", body[i:])
                if not m or not (m.group(1) or m.group(3)):
                    raise _PatternError(f"the quantifier {body[i:i + 8]!r} is not valid")
                lo = int(m.group(1) or 0)
                hi = lo if not m.group(2) else (int(m.group(3)) if m.group(3) else INT_MAX)
                if hi < lo:
                    raise _PatternError(f"the quantifier {m.group(0)!r} has its maximum below its minimum")
                text, _ = last_item()
                if text.endswith(("*", "+", "?", "}")):
                    text = f"({text})"
                seq.append((_repetition(text, lo, hi) or '""', False))
                i += m.end()
                skip_lazy()
            elif c == "\\":
                if i + 1 >= n:
                    raise _PatternError("it ends in a lone backslash")
                e = body[i + 1]
                if e in CLASS_ESCAPES:
                    seq.append((f"[{CLASS_ESCAPES[e]}]", False))
                    i += 2
                elif e in "DWS":
                    seq.append((f"[^{CLASS_ESCAPES[e.lower()]}{JSON_PLAIN}]", False))
                    i += 2
                elif e in CONTROL_ESCAPES:
                    seq.append((literal(CONTROL_ESCAPES[e]), True))
                    i += 2
                elif e in HEX_ESCAPES:
                    ch, i = hex_escape(i)
                    seq.append((literal(ch), True))
                elif e.isalnum():
                    what = "backreferences are" if e.isdigit() else f"word boundaries ('\\{e}') are" if e in "bB" else f"the escape '\\{e}' is"
                    raise _PatternError(f"{what} not supported")
                else:
                    seq.append((literal(e), True))
                    i += 2
            elif c in "]}":
                raise _PatternError(f"'{c}' is not escaped")
            else:
                seq.append((literal(c), True))
                i += 1
        return join()

    rule = transform()
    if depth != 0:
        raise _PatternError("its parentheses are unbalanced")
    return f'"\\"" {prefix}({rule or chr(34) * 2}){suffix} "\\""'


def _class_range(lo: int, hi: int) -> str:
    return _class_char(chr(lo)) if lo == hi else f"{_class_char(chr(lo))}-{_class_char(chr(hi))}"


def _split_json_specials(ranges: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], list[int]]:
    """`ranges` less the characters JSON writes escaped, and those characters (each once, in order)."""
    plain: list[tuple[int, int]] = []
    escaped: set[int] = set()
    for lo, hi in ranges:
        pieces = [(lo, hi)]
        for s_lo, s_hi in JSON_SPECIALS:
            cut = []
            for a, b in pieces:
                if b < s_lo or a > s_hi:
                    cut.append((a, b))
                    continue
                escaped.update(range(max(a, s_lo), min(b, s_hi) + 1))
                if a < s_lo:
                    cut.append((a, s_lo - 1))
                if b > s_hi:
                    cut.append((s_hi + 1, b))
            pieces = cut
        plain += pieces
    return plain, sorted(escaped)


def _class_char(c: str) -> str:
    """One character inside a GBNF class (']', '[', '-', '\\' and '"' escaped, control characters as \\xHH)."""
    if c in "[]-\\\"":
        return "\\" + c
    if ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\x{ord(c):02X}"
    return c


def _ends_with_anchor(pattern: str) -> bool:
    if not pattern.endswith("$"):
        return False
    backslashes = len(pattern[:-1]) - len(pattern[:-1].rstrip("\\"))
    return backslashes % 2 == 0


def _top_level_alternation(pattern: str) -> bool:
    depth, j, in_class = 0, 0, False
    while j < len(pattern):
        c = pattern[j]
        if c == "\\":
            j += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            return True
        j += 1
    return False


class _Converter:
    def __init__(self, root: dict[str, Any]):
        self.root = root
        self.rules: dict[str, str] = {"space": SPACE_RULE}
        self.resolving: set[str] = set()

    def add_rule(self, name: str, rule: str) -> str:
        esc = INVALID_RULE_CHARS.sub("-", name)
        if esc not in self.rules or self.rules[esc] == rule:
            self.rules[esc] = rule
            return esc
        i = 0
        while f"{esc}{i}" in self.rules and self.rules[f"{esc}{i}"] != rule:
            i += 1
        self.rules[f"{esc}{i}"] = rule
        return f"{esc}{i}"

    def add_primitive(self, name: str, rule: tuple[str, list[str]]) -> str:
        key = self.add_rule(name, rule[0])
        for dep in rule[1]:
            if dep not in self.rules:
                self.add_primitive(dep, PRIMITIVE_RULES.get(dep) or STRING_FORMAT_RULES[dep])
        return key

    def grammar(self) -> str:
        return "".join(f"{name} ::= {rule}\n" for name, rule in sorted(self.rules.items()))

    # -- the schema, keyword by keyword (llama.cpp's build_node, then visit) --

    def visit(self, schema: Any, name: str, path: str) -> str:
        rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
        sub = name + "-" if name else ""
        if schema is True or schema == {}:
            return self.add_rule(rule_name, self.add_primitive("value", PRIMITIVE_RULES["value"]))
        if not isinstance(schema, dict):
            raise SchemaError(path, "", "a schema must be an object")
        if "$ref" in schema:
            return self.add_rule(rule_name, self.ref(schema["$ref"], path))
        for key in ("oneOf", "anyOf"):
            if key in schema:
                alts = self.alternatives(schema, key, path)
                return self.add_rule(rule_name, " | ".join(
                    self.visit(alt, f"{name}{'-' if name else 'alternative-'}{i}", _join(path, f"{key}.{i}"))
                    for i, alt in enumerate(alts)))
        type_ = schema.get("type")
        if isinstance(type_, list):
            if not type_:
                raise SchemaError(path, "type", "it must not be empty")
            return self.add_rule(rule_name, " | ".join(
                self.visit({**schema, "type": t}, f"{name}{'-' if name else 'alternative-'}{i}", path) for i, t in enumerate(type_)))
        if "const" in schema:
            return self.add_rule(rule_name, _format_literal(_dump(schema["const"])))
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise SchemaError(path, "enum", "it must be a non-empty array")
            return self.add_rule(rule_name, "(" + " | ".join(_format_literal(_dump(v)) for v in values) + ")")
        if type_ is not None and not isinstance(type_, str):
            raise SchemaError(path, "type", "it must be a string or an array of strings")
        has_properties = "properties" in schema or ("additionalProperties" in schema and schema["additionalProperties"] is not True)
        if type_ is None:
            if has_properties:
                return self.obj(schema, name, rule_name, path)
            if "allOf" in schema:
                return self.all_of(schema, name, rule_name, path)
            if "items" in schema or "prefixItems" in schema:
                return self.array(schema, sub, rule_name, path)
            if any(k in schema for k in ("pattern", "minLength", "maxLength")) or _format(schema) is not None:
                return self.string(schema, rule_name, path)
            return self.add_rule(rule_name, self.add_primitive("value", PRIMITIVE_RULES["value"]))
        if type_ == "object":
            if not has_properties and "allOf" in schema:
                return self.all_of(schema, name, rule_name, path)
            return self.obj(schema, name, rule_name, path)
        if type_ == "string":
            if "allOf" in schema:
                return self.all_of(schema, name, rule_name, path)
            return self.string(schema, rule_name, path)
        if type_ == "array":
            return self.array(schema, sub, rule_name, path)
        if type_ == "integer":
            return self.integer(schema, rule_name, path)
        if type_ in ("number", "boolean", "null"):
            return self.add_primitive("root" if rule_name == "root" else type_, PRIMITIVE_RULES[type_])
        raise SchemaError(path, "type", f"unknown type {type_!r} (one of object, array, string, integer, number, boolean, null)")

    def alternatives(self, schema: dict, key: str, path: str) -> list:
        alts = schema[key]
        if not isinstance(alts, list) or not alts:
            raise SchemaError(path, key, "it must be a non-empty array of schemas")
        return alts

    def ref(self, ref: Any, path: str) -> str:
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise SchemaError(path, "$ref", f"only references into the same schema ('#/$defs/name') are supported, not {ref!r}")
        name = "ref" + INVALID_RULE_CHARS.sub("-", ref[1:])
        if name in self.rules or ref in self.resolving:
            return name
        target: Any = self.root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise SchemaError(path, "$ref", f"{ref} does not resolve ({part!r} not found)")
        self.resolving.add(ref)
        try:
            return self.visit(target, name, ref[2:].replace("/", "."))
        finally:
            self.resolving.discard(ref)

    def string(self, schema: dict, rule_name: str, path: str) -> str:
        pattern = schema.get("pattern")
        if pattern is not None:
            if not isinstance(pattern, str):
                raise SchemaError(path, "pattern", "it must be a string")
            try:
                return self.add_rule(rule_name, _pattern_gbnf(pattern, self.add_rule("dot", DOT)))
            except _PatternError as exc:
                raise SchemaError(path, "pattern", f"{exc} (in {json.dumps(pattern)}, as JSON writes it)") from None
        fmt = _format(schema)
        if fmt == "uuid":
            return self.add_primitive("root" if rule_name == "root" else "uuid", PRIMITIVE_RULES["uuid"])
        if fmt is not None:
            prim = f"{fmt}-string"
            return self.add_rule(rule_name, self.add_primitive(prim, STRING_FORMAT_RULES[prim]))
        min_len = _count(schema, "minLength", path, 0)
        max_len = _count(schema, "maxLength", path, -1)
        if min_len > 0 or max_len >= 0:
            char = self.add_primitive("char", PRIMITIVE_RULES["char"])
            return self.add_rule(rule_name, '"\\"" ' + _repetition(char, min_len, INT_MAX if max_len < 0 else max_len) + ' "\\""')
        return self.add_primitive("root" if rule_name == "root" else "string", PRIMITIVE_RULES["string"])

    def integer(self, schema: dict, rule_name: str, path: str) -> str:
        lo, hi = INT64_MIN, INT64_MAX
        if "minimum" in schema:
            lo = _bound(schema, "minimum", path, math.ceil)
        elif "exclusiveMinimum" in schema:
            lo = _bound(schema, "exclusiveMinimum", path, math.floor) + 1
        if "maximum" in schema:
            hi = _bound(schema, "maximum", path, math.floor)
        elif "exclusiveMaximum" in schema:
            hi = _bound(schema, "exclusiveMaximum", path, math.ceil) - 1
        if lo == INT64_MIN and hi == INT64_MAX:
            return self.add_primitive("root" if rule_name == "root" else "integer", PRIMITIVE_RULES["integer"])
        if lo != INT64_MIN and hi != INT64_MAX and lo > hi:
            raise SchemaError(path, "minimum", f"no integer lies between {lo} and {hi}")
        out: list[str] = []
        _min_max_int(lo, hi, out)
        return self.add_rule(rule_name, "(" + "".join(out) + ")")

    def array(self, schema: dict, sub: str, rule_name: str, path: str) -> str:
        key = "items" if "items" in schema else "prefixItems" if "prefixItems" in schema else None
        items = schema.get(key) if key else {}
        if isinstance(items, list):
            parts = [self.visit(item, f"{sub}tuple-{i}", _join(path, f"{key}.{i}")) for i, item in enumerate(items)]
            return self.add_rule(rule_name, '"[" space ' + ' "," space '.join(parts) + ' space "]"')
        min_items = _count(schema, "minItems", path, 0)
        max_items = _count(schema, "maxItems", path, -1)
        if max_items >= 0 and max_items < min_items:
            raise SchemaError(path, "maxItems", f"{max_items} is below minItems {min_items}")
        if items in ({}, True) and min_items == 0 and max_items < 0:
            return self.add_primitive("root" if rule_name == "root" else "array", PRIMITIVE_RULES["array"])
        item = self.visit(items, f"{sub}item", _join(path, key or "items"))
        body = _repetition(item, min_items, INT_MAX if max_items < 0 else max_items, '"," space')
        return self.add_rule(rule_name, '"[" space ' + body + ' space "]"')

    def obj(self, schema: dict, name: str, rule_name: str, path: str) -> str:
        props = schema.get("properties", {})
        if not isinstance(props, dict):
            raise SchemaError(path, "properties", "it must be an object")
        required = {r for r in schema.get("required", []) if isinstance(r, str)} if isinstance(schema.get("required"), list) else set()
        additional: Any = None
        if "additionalProperties" in schema:
            extra = schema["additionalProperties"]
            if extra is True:
                additional = {}
            elif isinstance(extra, dict):
                additional = extra
            elif extra is not False:
                raise SchemaError(path, "additionalProperties", "it must be a boolean or a schema")
        elif "properties" not in schema:
            additional = {}
        if not props and additional == {}:
            return self.add_rule(rule_name, self.add_primitive("object", PRIMITIVE_RULES["object"]))
        return self.add_rule(rule_name, self.object_rule(list(props.items()), required, name, additional, path))

    def all_of(self, schema: dict, name: str, rule_name: str, path: str) -> str:
        parts = self.alternatives(schema, "allOf", path)
        required: set[str] = set()
        props: list[tuple[str, Any]] = []
        enums: dict[str, int] = {}

        def add(comp: Any, is_required: bool) -> None:
            if isinstance(comp, dict) and "$ref" in comp:
                ref = comp["$ref"]
                self.ref(ref, path)  # checks it resolves
                target: Any = self.root
                for part in ref[2:].split("/"):
                    target = target[int(part)] if isinstance(target, list) else target[part]
                comp = target
            if not isinstance(comp, dict):
                return
            for prop, prop_schema in (comp.get("properties") or {}).items():
                props.append((prop, prop_schema))
                if is_required:
                    required.add(prop)
            for v in comp.get("enum") or []:
                lit = _format_literal(_dump(v))
                enums[lit] = enums.get(lit, 0) + 1

        for part in parts:
            if isinstance(part, dict) and "anyOf" in part:
                for alt in part["anyOf"]:
                    add(alt, False)
            else:
                add(part, True)
        common = [lit for lit, count in enums.items() if count == len(parts)]
        if common:
            return self.add_rule(rule_name, "(" + " | ".join(sorted(common)) + ")")
        return self.add_rule(rule_name, self.object_rule(props, required, name, None, path))

    def object_rule(self, props: list[tuple[str, Any]], required: set[str], name: str, additional: Any, path: str) -> str:
        sub = name + "-" if name else ""
        kv: dict[str, str] = {}
        required_props: list[str] = []
        optional_props: list[str] = []
        for prop, prop_schema in props:
            value = self.visit(prop_schema, f"{sub}{prop}", _join(path, f"properties.{prop}"))
            kv[prop] = self.add_rule(f"{sub}{prop}-kv", f"{_format_literal(_dump(prop))} space \":\" space {value}")
            (required_props if prop in required else optional_props).append(prop)
        if additional is not None:
            sub_name = f"{sub}additional"
            value = (self.visit(additional, f"{sub_name}-value", _join(path, "additionalProperties")) if additional
                     else self.add_primitive("value", PRIMITIVE_RULES["value"]))
            names = [p for p, _ in props]
            key = self.add_rule(f"{sub_name}-k", self.not_strings(names)) if names else self.add_primitive("string", PRIMITIVE_RULES["string"])
            kv["*"] = self.add_rule(f"{sub_name}-kv", f'{key} ":" space {value}')
            optional_props.append("*")
        if not required_props and not optional_props:
            return '"{" space "}"'
        rule = '"{" space ' + ' "," space '.join(kv[k] for k in required_props)
        if optional_props:
            rule += " ("
            if required_props:
                rule += ' "," space ( '

            def rest(keys: list[str], first_is_optional: bool) -> str:
                k = keys[0]
                comma = f'( "," space {kv[k]} )'
                res = comma + ("*" if k == "*" else "?") if first_is_optional else kv[k] + (f" {comma}*" if k == "*" else "")
                if len(keys) > 1:
                    res += " " + self.add_rule(f"{sub}{k}-rest", rest(keys[1:], True))
                return res

            rule += " | ".join(rest(optional_props[i:], False) for i in range(len(optional_props)))
            if required_props:
                rule += " )"
            rule += " )?"
        return rule + ' space "}"'

    def not_strings(self, strings: list[str]) -> str:
        """A JSON string that is none of `strings` (llama.cpp's _not_strings, over a trie)."""
        char = self.add_primitive("char", PRIMITIVE_RULES["char"])
        trie: dict = {}
        for s in strings:
            node = trie
            for c in s:
                node = node.setdefault(c, {})
            node[None] = True
        out: list[str] = ['["] ( ']

        def visit(node: dict) -> None:
            children = [(c, child) for c, child in node.items() if c is not None]
            for idx, (c, child) in enumerate(children):
                if idx:
                    out.append(" | ")
                out.append(f"[{_class_char(c)}]")
                if any(k is not None for k in child):
                    out.append(" (")
                    visit(child)
                    out.append(")")
                else:
                    out.append(f" {char}+")
            if children:
                out.append(' | [^"' + "".join(_class_char(c) for c, _ in children) + f"] {char}*")

        visit(trie)
        out.append(" )")
        if None not in trie:
            out.append("?")
        out.append(' ["]')
        return "".join(out)


def _join(path: str, part: str) -> str:
    return f"{path}.{part}" if path else part


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _format(schema: dict) -> Optional[str]:
    fmt = schema.get("format")
    if fmt in ("date", "time", "date-time"):
        return fmt
    if isinstance(fmt, str) and re.fullmatch(r"uuid[1-5]?", fmt):
        return "uuid"
    return None


def _count(schema: dict, key: str, path: str, default: int) -> int:
    if key not in schema:
        return default
    value = schema[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaError(path, key, f"it must be a non-negative integer, not {value!r}")
    return min(value, INT_MAX - 1)


def _bound(schema: dict, key: str, path: str, rounding) -> int:
    value = schema[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SchemaError(path, key, f"it must be a number, not {value!r}")
    return max(INT64_MIN + 1, min(INT64_MAX - 1, int(rounding(value))))


def json_schema_to_gbnf(schema: Any) -> str:
    """The GBNF grammar (root rule 'root') for the JSON texts `schema` allows. Raises SchemaError."""
    converter = _Converter(schema if isinstance(schema, dict) else {})
    converter.visit(schema, "", "")
    return converter.grammar()
