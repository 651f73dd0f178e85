"""A fast path for the envelope's JSON Schema: the schema compiled into plain Python checks.

Why it exists: checking a ``RunAgentInput`` with jsonschema costs about 250 µs, most of a
request's admission, because jsonschema builds a validator object for every node it
descends into. The schemas in ``agui_adapter/protocol/schemas`` stay the single source of truth:
this module reads them (the inlined envelope schema ``validation`` builds) and compiles the
small subset of Draft 2020-12 they use into checks that only answer *where* the first
violation is, with jsonschema's semantics (strict integers, ``bool`` never equal to a
number, ``pattern`` as ``re.search``, lengths in code points).

The checks are generated Python source, one function per schema node with its keywords as
inline expressions and its named members visited in key order, compiled once with
``exec`` (as fastjsonschema does): nested closures, one call per keyword and per member,
took 14 µs on the envelope of a refused run, the generated functions take 1.1 to 1.9 µs
(the README's refusal figures). The source names only values this module put in its
namespace (the schema's nodes, compiled patterns, frozensets of names); the schema's
strings never become code.

"First" is jsonschema's order as ``validation`` sorts errors: by instance path, a node's own
errors before any error below it, object members by key, array items by index; among a
node's own errors, by keyword in ``KEYWORD_ORDER``, then the others by name (``not``,
``pattern``, ``propertyNames``). So the answer names the failing node *and* the keyword of
jsonschema's first error there, which is all ``validation`` needs to word the refusal;
neither an accepted nor a refused envelope reaches jsonschema. A schema that uses a keyword
this module does not know is not compiled at all (``Unsupported``): jsonschema then checks
every envelope. A test proves the two agree, verdict and wording, on every
envelope of the suite and on generated ones (``tests/unit/test_fastschema.py``).

Sans-I/O: pure functions over parsed JSON.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["KEYWORD_ORDER", "Failure", "Unsupported", "compile_schema"]

#: Where the first violation is: the instance path (relative to the checked node), the
#: schema that applies to the node there, and the keyword of its first error.
Failure = tuple[tuple[str | int, ...], Any, str]
#: A compiled schema: ``None`` when the instance is valid, else where it first fails.
Check = Callable[[Any], "Failure | None"]

# Keywords that only annotate (they never make an instance invalid).
_ANNOTATIONS = frozenset(("$schema", "$id", "$comment", "title", "description", "default", "examples"))

#: How jsonschema's errors on one node are ordered, most fundamental first; keywords not
#: listed come after these, by name.
KEYWORD_ORDER = (
    "type",
    "required",
    "additionalProperties",
    "const",
    "enum",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
)
_RANK = {keyword: rank for rank, keyword in enumerate(KEYWORD_ORDER)}
_KNOWN = frozenset((*KEYWORD_ORDER, "properties", "items", "propertyNames", "not", "pattern"))
_SCALARS = (str, int, float, bool, type(None))


class Unsupported(ValueError):
    """The schema uses something this compiler does not mirror exactly."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_integer(value: Any) -> bool:  # strict, as validation's type checker: 1.0 and true are not 1
    return isinstance(value, int) and not isinstance(value, bool)


#: Each type's test as a Python expression over ``v``.
_TYPE_EXPRESSIONS = {
    "string": "isinstance(v, str)",
    "object": "isinstance(v, dict)",
    "array": "isinstance(v, list)",
    "boolean": "isinstance(v, bool)",
    "null": "v is None",
    "integer": "(isinstance(v, int) and not isinstance(v, bool))",
    "number": "(isinstance(v, (int, float)) and not isinstance(v, bool))",
}
_NUMBER = _TYPE_EXPRESSIONS["number"]


def _equal_to(expected: Any) -> Callable[[Any], bool]:
    """jsonschema's ``equal`` against one scalar: ``true`` is not ``1``, ``1.0`` is ``1``."""
    if not isinstance(expected, _SCALARS) or (isinstance(expected, float) and expected != expected):
        raise Unsupported(f"const/enum value {expected!r}")
    if expected is None or isinstance(expected, bool):
        return lambda v: v is expected
    if isinstance(expected, str):
        return lambda v: isinstance(v, str) and v == expected
    return lambda v: _is_number(v) and v == expected


def _limit(value: Any) -> int:
    if not _is_integer(value) or value < 0:
        raise Unsupported("length limit")
    return int(value)


def _bound(value: Any) -> int | float:
    if not _is_number(value):
        raise Unsupported("bound")
    return value  # type: ignore[no-any-return]


class _Source:
    """The Python source of one schema's checks, and the values it names."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: dict[str, Any] = {"_MISSING": object()}
        self.functions = 0

    def value(self, value: Any) -> str:
        """A name the generated code reads ``value`` by."""
        name = f"_v{len(self.names)}"
        self.names[name] = value
        return name

    def check(self, schema: Any) -> str | None:
        """The name of the function checking ``schema`` (None: ``true``, nothing to check)."""
        if schema is True:
            return None
        if schema is False:
            return self._define(self._new_name(), [f"    return {self.value(((), False, 'false'))}"])
        if not isinstance(schema, dict):
            raise Unsupported(f"schema {schema!r}")
        unknown = set(schema) - _KNOWN - _ANNOTATIONS
        if unknown:
            raise Unsupported(f"keywords {sorted(unknown)}")
        body = [
            f"    if not {test}:\n        return {self.value(((), schema, keyword))}"
            for keyword, test in self._own_tests(schema)
        ]
        properties = schema.get("properties", {})
        if not isinstance(properties, dict):
            raise Unsupported("properties")
        members = {name: self.check(sub) for name, sub in properties.items()}
        extra_schema = schema.get("additionalProperties", True)
        extra = None if extra_schema is True or extra_schema is False else self.check(extra_schema)
        items_schema = schema.get("items", True)
        if items_schema is False:
            raise Unsupported("items: false")
        items = self.check(items_schema)
        name = self._new_name()  # after its members', whose names the body calls
        table = None
        if extra is not None:  # every key has a check: the first failing key is the least
            table = f"{name}_members"
            body += [
                "    if isinstance(v, dict):",
                "        first = None",
                "        for key, member in v.items():",
                f"            check = {table}.get(key, {extra})",
                "            failure = None if check is None else check(member)",
                "            if failure is not None and (first is None or key < first[0]):",
                "                first = (key, failure)",
                "        if first is None:",
                "            return None",
                "        key, (path, failing, keyword) = first",
                "        return ((key, *path), failing, keyword)",
            ]
        elif any(members.values()):  # only named members: the first failing name is the answer
            body.append("    if isinstance(v, dict):")
            for name in sorted(members):
                function = members[name]
                if function is None:
                    continue
                key = self.value(name)
                body += [
                    f"        member = v.get({key}, _MISSING)",
                    "        if member is not _MISSING:",
                    f"            failure = {function}(member)",
                    "            if failure is not None:",
                    f"                return (({key}, *failure[0]), failure[1], failure[2])",
                ]
            body.append("        return None")
        if items is not None:
            body += [
                "    if isinstance(v, list):",
                "        for index, item in enumerate(v):",
                f"            failure = {items}(item)",
                "            if failure is not None:",
                "                return ((index, *failure[0]), failure[1], failure[2])",
            ]
        body.append("    return None")
        self._define(name, body)
        if table is not None:  # after the function, whose checks are all defined by then
            entries = ", ".join(f"{self.value(key)}: {check}" for key, check in members.items())
            self.lines.append(f"{table} = {{{entries}}}")
        return name

    def _new_name(self) -> str:
        self.functions += 1
        return f"_check{self.functions - 1}"

    def _define(self, name: str, body: list[str]) -> str:
        self.lines += [f"def {name}(v):", *body, ""]
        return name

    def _own_tests(self, schema: dict[str, Any]) -> list[tuple[str, str]]:
        """The keywords that report at the node itself, each with its test (an expression
        true when satisfied), in the order jsonschema's errors are sorted (``KEYWORD_ORDER``,
        then by name).

        A ``propertyNames`` error is reported under the keyword of the key's own failure, but
        it only occurs on objects, whose other own keywords (``type``, ``required``,
        ``additionalProperties``) all sort before any keyword a key can fail."""
        tests: list[tuple[str, str]] = []
        if "type" in schema:
            spec = schema["type"]
            names = spec if isinstance(spec, list) else [spec]
            if not names or any(not isinstance(n, str) or n not in _TYPE_EXPRESSIONS for n in names):
                raise Unsupported(f"type {spec!r}")
            tests.append(("type", "(" + " or ".join(_TYPE_EXPRESSIONS[n] for n in names) + ")"))
        if "const" in schema:
            tests.append(("const", f"{self.value(_equal_to(schema['const']))}(v)"))
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list):
                raise Unsupported("enum")
            matchers = tuple(_equal_to(v) for v in values)  # also refuses a value not mirrored
            if all(isinstance(v, str) for v in values):
                tests.append(("enum", f"(isinstance(v, str) and v in {self.value(frozenset(values))})"))
            else:
                tests.append(("enum", f"any(match(v) for match in {self.value(matchers)})"))
        if "minLength" in schema:
            tests.append(("minLength", f"(not isinstance(v, str) or len(v) >= {_limit(schema['minLength'])})"))
        if "maxLength" in schema:
            tests.append(("maxLength", f"(not isinstance(v, str) or len(v) <= {_limit(schema['maxLength'])})"))
        if "minimum" in schema:
            low = self.value(_bound(schema["minimum"]))
            tests.append(("minimum", f"(not {_NUMBER} or not v < {low})"))
        if "maximum" in schema:
            high = self.value(_bound(schema["maximum"]))
            tests.append(("maximum", f"(not {_NUMBER} or not v > {high})"))
        if "pattern" in schema:
            if not isinstance(schema["pattern"], str):
                raise Unsupported("pattern")
            search = self.value(re.compile(schema["pattern"]).search)
            tests.append(("pattern", f"(not isinstance(v, str) or {search}(v) is not None)"))
        if "not" in schema:
            inner = self.check(schema["not"])
            tests.append(("not", "False" if inner is None else f"({inner}(v) is not None)"))
        if "required" in schema:
            names = schema["required"]
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise Unsupported("required")
            wanted = " and ".join(f"{self.value(n)} in v" for n in names) or "True"
            tests.append(("required", f"(not isinstance(v, dict) or ({wanted}))"))
        if "propertyNames" in schema:
            names_check = self.check(schema["propertyNames"])
            if names_check is not None:
                tests.append(
                    ("propertyNames", f"(not isinstance(v, dict) or all({names_check}(k) is None for k in v))")
                )
        if schema.get("additionalProperties") is False:
            known = self.value(frozenset(schema.get("properties", {})))
            tests.append(("additionalProperties", f"(not isinstance(v, dict) or {known}.issuperset(v))"))
        return sorted(tests, key=lambda item: (_RANK.get(item[0], len(_RANK)), item[0]))


def compile_schema(schema: dict[str, Any]) -> Check:
    """Compile a schema without references (``validation.inline_references``).

    Raises ``Unsupported`` when the schema uses a keyword, or a form of one, that is not
    mirrored here; the caller then keeps jsonschema for every instance.
    """
    source = _Source()
    top = source.check(schema)
    if top is None:
        return lambda _v: None
    namespace = dict(source.names)
    exec(compile("\n".join(source.lines), "<fastschema>", "exec"), namespace)  # noqa: S102 - our own code
    return namespace[top]  # type: ignore[no-any-return]
