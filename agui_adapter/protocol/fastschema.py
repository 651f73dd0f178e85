"""A fast path for the envelope's JSON Schema: the schema compiled into plain Python checks.

Why it exists: checking a ``RunAgentInput`` with jsonschema costs about 250 µs, most of a
request's admission, because jsonschema builds a validator object for every node it
descends into. The schemas in ``agui_adapter/protocol/schemas`` stay the single source of truth:
this module reads them (the inlined envelope schema ``validation`` builds) and compiles the
small subset of Draft 2020-12 they use into nested closures that only answer *where* the
first violation is, with jsonschema's semantics (strict integers, ``bool`` never equal to a
number, ``pattern`` as ``re.search``, lengths in code points).

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


_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": _is_integer,
    "number": _is_number,
}


def _equal_to(expected: Any) -> Callable[[Any], bool]:
    """jsonschema's ``equal`` against one scalar: ``true`` is not ``1``, ``1.0`` is ``1``."""
    if not isinstance(expected, _SCALARS) or (isinstance(expected, float) and expected != expected):
        raise Unsupported(f"const/enum value {expected!r}")
    if expected is None or isinstance(expected, bool):
        return lambda v: v is expected
    if isinstance(expected, str):
        return lambda v: isinstance(v, str) and v == expected
    return lambda v: _is_number(v) and v == expected


def _type_test(spec: Any) -> Callable[[Any], bool]:
    names = spec if isinstance(spec, list) else [spec]
    if not names or any(not isinstance(n, str) or n not in _TYPES for n in names):
        raise Unsupported(f"type {spec!r}")
    tests = tuple(_TYPES[n] for n in names)
    if len(tests) == 1:
        return tests[0]
    return lambda v: any(test(v) for test in tests)


def _own_tests(schema: dict[str, Any]) -> list[tuple[str, Callable[[Any], bool]]]:
    """The keywords that report at the node itself, each with its test (True when
    satisfied), in the order jsonschema's errors are sorted (``KEYWORD_ORDER``, then by name).

    A ``propertyNames`` error is reported under the keyword of the key's own failure, but
    it only occurs on objects, whose other own keywords (``type``, ``required``,
    ``additionalProperties``) all sort before any keyword a key can fail."""
    tests: list[tuple[str, Callable[[Any], bool]]] = []
    if "type" in schema:
        tests.append(("type", _type_test(schema["type"])))
    if "const" in schema:
        tests.append(("const", _equal_to(schema["const"])))
    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list):
            raise Unsupported("enum")
        matchers = tuple(_equal_to(v) for v in values)
        tests.append(("enum", lambda v: any(match(v) for match in matchers)))
    if "minLength" in schema:
        low = _limit(schema["minLength"])
        tests.append(("minLength", lambda v: not isinstance(v, str) or len(v) >= low))
    if "maxLength" in schema:
        high = _limit(schema["maxLength"])
        tests.append(("maxLength", lambda v: not isinstance(v, str) or len(v) <= high))
    if "minimum" in schema:
        low_bound = _bound(schema["minimum"])
        tests.append(("minimum", lambda v: not _is_number(v) or not v < low_bound))
    if "maximum" in schema:
        high_bound = _bound(schema["maximum"])
        tests.append(("maximum", lambda v: not _is_number(v) or not v > high_bound))
    if "pattern" in schema:
        if not isinstance(schema["pattern"], str):
            raise Unsupported("pattern")
        search = re.compile(schema["pattern"]).search
        tests.append(("pattern", lambda v: not isinstance(v, str) or search(v) is not None))
    if "not" in schema:
        inner = _compile(schema["not"])
        tests.append(("not", lambda v: inner(v) is not None))
    if "required" in schema:
        names = schema["required"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise Unsupported("required")
        wanted = tuple(names)
        tests.append(("required", lambda v: not isinstance(v, dict) or all(n in v for n in wanted)))
    if "propertyNames" in schema:
        name_check = _compile(schema["propertyNames"])
        tests.append(("propertyNames", lambda v: not isinstance(v, dict) or all(name_check(k) is None for k in v)))
    if schema.get("additionalProperties") is False:
        known = frozenset(schema.get("properties", {}))
        tests.append(("additionalProperties", lambda v: not isinstance(v, dict) or all(k in known for k in v)))
    return sorted(tests, key=lambda item: (_RANK.get(item[0], len(_RANK)), item[0]))


def _limit(value: Any) -> int:
    if not _is_integer(value) or value < 0:
        raise Unsupported("length limit")
    return int(value)


def _bound(value: Any) -> int | float:
    if not _is_number(value):
        raise Unsupported("bound")
    return value  # type: ignore[no-any-return]


def _compile(schema: Any) -> Check:
    if schema is True:
        return lambda _v: None
    if schema is False:
        return lambda _v: ((), False, "false")
    if not isinstance(schema, dict):
        raise Unsupported(f"schema {schema!r}")
    unknown = set(schema) - _KNOWN - _ANNOTATIONS
    if unknown:
        raise Unsupported(f"keywords {sorted(unknown)}")
    own = tuple(_own_tests(schema))
    fails_here = {keyword: ((), schema, keyword) for keyword, _test in own}

    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        raise Unsupported("properties")
    members = {name: _compile(sub) for name, sub in properties.items()}
    extra_schema = schema.get("additionalProperties", True)
    extra = None if extra_schema is True or extra_schema is False else _compile(extra_schema)
    items_schema = schema.get("items", True)
    if items_schema is False:
        raise Unsupported("items: false")
    items = None if items_schema is True else _compile(items_schema)

    def check_members(value: dict[str, Any]) -> Failure | None:
        first: tuple[str, Failure] | None = None
        for key, member in value.items():
            sub = members.get(key)
            if sub is None:
                sub = extra
                if sub is None:
                    continue
            failure = sub(member)
            if failure is not None and (first is None or key < first[0]):
                first = (key, failure)
        if first is None:
            return None
        key, (path, failing, keyword) = first
        return ((key, *path), failing, keyword)

    def check_items(value: list[Any]) -> Failure | None:
        assert items is not None
        for index, item in enumerate(value):
            failure = items(item)
            if failure is not None:
                return ((index, *failure[0]), failure[1], failure[2])
        return None

    descend_members = bool(members) or extra is not None

    def check(value: Any) -> Failure | None:
        for keyword, test in own:
            if not test(value):
                return fails_here[keyword]
        if descend_members and isinstance(value, dict):
            return check_members(value)
        if items is not None and isinstance(value, list):
            return check_items(value)
        return None

    return check


def compile_schema(schema: dict[str, Any]) -> Check:
    """Compile a schema without references (``validation.inline_references``).

    Raises ``Unsupported`` when the schema uses a keyword, or a form of one, that is not
    mirrored here; the caller then keeps jsonschema for every instance.
    """
    return _compile(schema)
