"""Reads the flat ``key: value`` YAML that upstream's ``iac-code agui --config`` takes.

Why it exists: a deployment written for upstream's adapter passes a YAML file whose keys
(``host``, ``port``, ``a2a_url``, ``debug``, ``log_stdout``, ``state_dir``, ``idle_shutdown``,
``auth_token``, ``a2a_token``) are all scalars at the top level. Reading it with PyYAML
would add a runtime dependency (the project allows only werkzeug, jsonschema and requests),
and the whole language is not needed for one flat mapping. This module reads exactly that
subset: one ``key: value`` per line, ``#`` comments, blank lines, a leading ``---``, plain,
single- and double-quoted scalars, resolved the way PyYAML's ``safe_load`` resolves them
(YAML 1.1: ``yes``/``on`` are true, ``0x1f`` and ``1_000`` are integers, ``1e3`` without a
dot is a string, ``~`` and an empty value are null). Anything beyond it (nesting, lists,
flow collections, anchors, tags, block scalars, multi-line scalars) is refused with an error
naming the line, never guessed. The tests check the results against PyYAML as the oracle.
"""

from __future__ import annotations

import math
import re
from typing import Any


class FlatYamlError(ValueError):
    """The text is not a flat mapping of scalars; the message names the line."""


# PyYAML's implicit resolvers (yaml/resolver.py), for plain scalars only.
_BOOL = re.compile(r"^(?:yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$")
_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_INT = re.compile(
    r"""^(?:[-+]?0b[0-1_]+
    |[-+]?0[0-7_]+
    |[-+]?(?:0|[1-9][0-9_]*)
    |[-+]?0x[0-9a-fA-F_]+
    |[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+)$""",
    re.X,
)
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
#: A plain scalar may not start with these (they begin YAML constructs outside the subset).
_INDICATORS = tuple("[]{}&*!|>%@`,?") + ("- ",)
_ESCAPES = {
    "0": "\0",
    "a": "\a",
    "b": "\b",
    "t": "\t",
    "\t": "\t",
    "n": "\n",
    "v": "\v",
    "f": "\f",
    "r": "\r",
    "e": "\x1b",
    " ": " ",
    '"': '"',
    "/": "/",
    "\\": "\\",
    "N": "\x85",
    "_": "\xa0",
}
_HEX = {"x": 2, "u": 4, "U": 8}


def loads(text: str) -> dict[str, Any]:
    """The mapping in ``text`` (``{}`` for an empty document), keys as written."""
    result: dict[str, Any] = {}
    text = text.removeprefix("\ufeff")
    started = ended = False
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip(" \r\n")
        stripped = line.strip()
        if "\t" in line[: len(line) - len(line.lstrip(" \t"))] or (not stripped and "\t" in line):
            raise FlatYamlError(f"line {number}: tabs are not supported for indentation")
        if not stripped or stripped.startswith("#"):
            continue
        if ended:
            raise FlatYamlError(f"line {number}: only one document is supported")
        if line == "---" or line.startswith("--- #"):
            if started:
                raise FlatYamlError(f"line {number}: only one document is supported")
            started = True
            continue
        if line == "...":
            if not started:
                raise FlatYamlError(f"line {number}: a document end without a document")
            ended = True
            continue
        started = True
        if line[0] in " \t":
            raise FlatYamlError(f"line {number}: nested values are not supported (flat keys only)")
        match = _KEY.match(line)
        after = line[match.end() :].lstrip(" ") if match else ""
        if match is None or not after.startswith(":"):
            raise FlatYamlError(f"line {number}: expected 'key: value'")
        rest = after[1:]
        if rest and rest[0] != " ":
            raise FlatYamlError(f"line {number}: expected a space after ':'")
        value = rest.strip(" ")
        if "\t" in (value if value[:1] not in ("'", '"') else rest[: len(rest) - len(rest.lstrip(" \t"))]):
            raise FlatYamlError(f"line {number}: tabs are not supported outside quoted values")
        key = match.group()
        try:
            named = isinstance(_resolve(key), str)
        except ValueError:
            named = False
        if not named:  # ``yes:``, ``1:``, ``null:``: YAML reads a bool, a number or null, not a name
            raise FlatYamlError(f"line {number}: the key {key!r} is not a name (YAML reads it as a value)")
        result[key] = _scalar(value, number)
    return result


def _scalar(text: str, number: int) -> Any:
    if text.startswith("'"):
        return _quoted(text, number, single=True)
    if text.startswith('"'):
        return _quoted(text, number, single=False)
    if text.startswith("#"):
        text = ""
    comment = re.search(r"[ \t]#", text)
    if comment:
        text = text[: comment.start()].rstrip()
    if text.startswith(_INDICATORS) or text == "-" or ": " in text or text.endswith(":") or "\t#" in text:
        raise FlatYamlError(f"line {number}: only plain or quoted scalar values are supported")
    try:
        return _resolve(text)
    except ValueError:  # e.g. "0x_": an integer by YAML 1.1's pattern, without digits
        raise FlatYamlError(f"line {number}: {text!r} is not a valid number") from None


def _resolve(text: str) -> Any:
    if _NULL.match(text):
        return None
    if _BOOL.match(text):
        return text.lower() in ("yes", "true", "on")
    if _INT.match(text):
        return _integer(text)
    if _FLOAT.match(text):
        return _float(text)
    return text


def _integer(text: str) -> int:
    value = text.replace("_", "")
    sign = -1 if value.startswith("-") else 1
    value = value.lstrip("+-")
    if value == "0":
        return 0
    if value.startswith("0b"):
        return sign * int(value[2:], 2)
    if value.startswith("0x"):
        return sign * int(value[2:], 16)
    if value.startswith("0"):
        return sign * int(value, 8)
    if ":" in value:
        total = 0
        for part in value.split(":"):
            total = total * 60 + int(part)
        return sign * total
    return sign * int(value)


def _float(text: str) -> float:
    value = text.replace("_", "").lower()
    sign = -1.0 if value.startswith("-") else 1.0
    value = value.lstrip("+-")
    if value == ".inf":
        return sign * math.inf
    if value == ".nan":
        return math.nan
    if ":" in value:
        total = 0.0
        for part in value.split(":"):
            total = total * 60 + float(part)
        return sign * total
    return sign * float(value)


def _quoted(text: str, number: int, *, single: bool) -> str:
    quote = text[0]
    out: list[str] = []
    i = 1
    while True:
        if i >= len(text):
            raise FlatYamlError(f"line {number}: unterminated quoted value (multi-line values are not supported)")
        char = text[i]
        if char == quote:
            if single and text[i + 1 : i + 2] == "'":
                out.append("'")
                i += 2
                continue
            break
        if char == "\\" and not single:
            i += 1
            code = text[i : i + 1]
            if code in _ESCAPES:
                out.append(_ESCAPES[code])
                i += 1
            elif code in _HEX:
                digits = text[i + 1 : i + 1 + _HEX[code]]
                if len(digits) != _HEX[code] or not re.fullmatch(r"[0-9a-fA-F]+", digits):
                    raise FlatYamlError(f"line {number}: bad escape \\{code}{digits}")
                out.append(chr(int(digits, 16)))
                i += 1 + _HEX[code]
            else:
                raise FlatYamlError(f"line {number}: unsupported escape \\{code}")
            continue
        out.append(char)
        i += 1
    tail = text[i + 1 :].strip(" ")
    if tail and not tail.startswith("#"):
        raise FlatYamlError(f"line {number}: unexpected text after the quoted value")
    return "".join(out)
