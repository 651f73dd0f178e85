"""``flatyaml``: upstream's flat YAML config read as PyYAML's ``safe_load`` reads it (the oracle)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agui_adapter.flatyaml import FlatYamlError, loads

yaml = pytest.importorskip("yaml")

VALUES = [
    "127.0.0.1",
    "8000",
    "0",
    "-3",
    "+4",
    "1_000",
    "010",
    "0o10",
    "0x1F",
    "0b101",
    "1:30",
    "190:20:30",
    "1.5",
    "1.",
    ".5",
    "-1.5e+3",
    "1e3",
    "1.0e3",
    "6.8523015e+5",
    "1:30.5",
    ".inf",
    "-.Inf",
    ".NaN",
    "inf",
    "true",
    "True",
    "TRUE",
    "false",
    "yes",
    "No",
    "on",
    "OFF",
    "y",
    "n",
    "~",
    "null",
    "Null",
    "",
    "http://127.0.0.1:9000/",
    "/var/lib/agui adapter",
    "a#b",
    "a # comment",
    "x  ",
    "'quoted'",
    "'it''s'",
    '"double"',
    '"tab\\there"',
    '"\\u00e9t\\u00e9"',
    '"a # not a comment"',
    "'#x' # c",
    '"" # empty',
    "''",
    "hello world",
    "-x",
    "3 apples",
    "0.0.0.0",
    "::1",
    "1.2.3",
    "12:345",
]


@pytest.mark.parametrize("value", VALUES)
def test_a_scalar_reads_as_pyyaml_reads_it(value: str) -> None:
    text = f"key: {value}\n"
    expected = yaml.safe_load(text)
    got = loads(text)
    assert got.keys() == expected.keys()
    a, b = got["key"], expected["key"]
    if isinstance(b, float) and math.isnan(b):
        assert isinstance(a, float) and math.isnan(a)
    else:
        assert (type(a), a) == (type(b), b)


def test_a_whole_document_reads_as_pyyaml_reads_it() -> None:
    text = (
        "\ufeff# comment\n---\nhost: 0.0.0.0   # all interfaces\n\nport: 8123\na2a-url: 'http://localhost:9/'\n"
        "debug: yes\nlog_stdout: off\nstate_dir: ~/agui\nidle_shutdown: 2.5\nport: 8124\n...\n# end\n"
    )
    assert loads(text) == yaml.safe_load(text)


def test_spaces_around_the_colon_and_crlf_lines_read_as_pyyaml_reads_them() -> None:
    text = "host : x\r\nport  :   8000\r\na-b_c: 1\r\n"
    assert loads(text) == yaml.safe_load(text) == {"host": "x", "port": 8000, "a-b_c": 1}


def test_the_documented_upstream_config_reads_as_pyyaml_reads_it() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "data" / "upstream" / "agui.yaml").read_text(encoding="utf-8")
    assert loads(text) == yaml.safe_load(text)


def test_empty_documents_are_empty_mappings() -> None:
    assert loads("") == {} and loads("# nothing\n\n") == {} and loads("---\n") == {}
    assert yaml.safe_load("# nothing\n") is None  # upstream maps None to {} as well


@pytest.mark.parametrize(
    "text",
    [
        "server:\n  host: x\n",  # nested
        "hosts: [a, b]\n",  # flow sequence
        "hosts: {a: 1}\n",
        "- a\n",  # a list at the top
        "key: &anchor x\n",
        "key: !!str 1\n",
        "key: |\n  text\n",
        "key: 'unterminated\n",
        "key: a: b\n",
        "key:x\n",
        "key:\tvalue\n",  # PyYAML refuses a tab there too
        "just text\n",
        "key: 'x' y\n",
        '"quoted key": 1\n',
        "a: 1\n...\nb: 2\n",  # a second document
        "yes: 1\n",  # YAML reads the key as True, not a name (found by the generated test)
        "1: a\n",
        "null: a\n",
    ],
)
def test_what_is_outside_the_subset_is_refused_naming_the_line(text: str) -> None:
    with pytest.raises(FlatYamlError, match=r"line \d"):
        loads(text)


# Generated documents: whatever flatyaml accepts, PyYAML reads the same (refusing is always allowed).
_PIECES = list("ab_-:#'\" \n\t.~1[{&!|-\\") + [
    "---",
    "...",
    "k: v\n",
    "\ufeff",
    "\r\n",
    "x: 1",
    "- ",
    "yes",
    "0x",
    ".inf",
]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


@settings(max_examples=400, deadline=None, database=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=14).map("".join))
def test_what_flatyaml_accepts_pyyaml_reads_the_same(text: str) -> None:
    try:
        got = loads(text)
    except FlatYamlError:
        return
    expected = yaml.safe_load(text) or {}
    assert isinstance(expected, dict) and expected.keys() == got.keys(), (text, expected, got)
    assert all(_same(got[k], expected[k]) for k in got), (text, expected, got)


@settings(max_examples=400, deadline=None, database=None)
@given(st.lists(st.sampled_from(_PIECES[:-6] + ["1_0", "0b", "null", "on", ".nan", "e"]), max_size=8).map("".join))
def test_a_generated_value_reads_as_pyyaml_reads_it(value: str) -> None:
    text = f"key: {value}\n"
    try:
        got = loads(text)
    except FlatYamlError:
        return
    expected = yaml.safe_load(text)
    assert isinstance(expected, dict) and _same(got["key"], expected["key"]), (value, expected, got)
