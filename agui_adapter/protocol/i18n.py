"""Per-request translation of the adapter's user-visible messages.

The adapter serves many clients from one threaded process, each possibly wanting a
different language, so messages are translated per call from JSON catalogs
(``locales/<lang>.json``, English template → translation) and never by switching a
process-wide locale. This module also holds the language negotiation upstream uses
(``forwardedProps.iacCode.preferredLanguage`` over ``Accept-Language`` over a default),
with one deliberate difference: the fallback is the configured default language, not
the server's locale.

``python -m agui_adapter.protocol.i18n --check`` lists catalog entries that are missing, stale or
inconsistent, so whoever adds a message to ``catalog.py`` sees what to translate.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import string
import sys
from collections.abc import Mapping, Sequence
from types import MappingProxyType

SUPPORTED_LANGUAGES: tuple[str, ...] = ("en", "zh", "es", "fr", "de", "ja", "pt")
_SOURCE_LANGUAGE = "en"

_EMPTY_CATALOG: Mapping[str, str] = MappingProxyType({})


def message_languages() -> tuple[str, ...]:
    """Every language the adapter's messages exist in (for docs)."""
    return SUPPORTED_LANGUAGES


def normalize_language(value: object, fallback: str | None = None) -> str | None:
    """Reduce a language tag to a supported two-letter code, or return ``fallback``.

    ``"zh-CN"``, ``"ZH_tw"`` and ``" zh "`` all become ``"zh"``; ``"pt-BR"`` becomes
    ``"pt"``. Non-strings and unsupported languages yield ``fallback``.
    """
    if not isinstance(value, str):
        return fallback
    primary = value.strip().lower().replace("_", "-").split("-", 1)[0]
    if primary in SUPPORTED_LANGUAGES:
        return primary
    return fallback


def weighted_items(header: str) -> list[tuple[str, float]]:
    """The items of an HTTP list header with their q-values (``Accept``, ``Accept-Language``).

    q is 1.0 when absent and 0.0 when unparsable; the first ``q`` parameter counts.
    """
    items = []
    for item in header.split(","):
        value, *params = [piece.strip() for piece in item.split(";")]
        q = 1.0
        for param in params:
            name, _, raw = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(raw.strip())
                except ValueError:
                    q = 0.0
                break
        items.append((value, q))
    return items


def parse_accept_language(header: str | None, default: str) -> str:
    """Pick the best supported language from an ``Accept-Language`` header.

    The highest q-value wins and ties go to the earliest item; ``*`` stands for
    ``default``; items with an invalid q (not finite, ``<= 0`` or ``> 1``) and
    unsupported tags are ignored. If nothing usable remains, ``default`` is returned.
    """
    if not isinstance(header, str) or not header.strip():
        return default
    best: str | None = None
    best_q = 0.0
    for tag, q in weighted_items(header):
        if not math.isfinite(q) or q <= 0 or q > 1:
            continue
        language = default if tag == "*" else normalize_language(tag)
        if language is None:
            continue
        if best is None or q > best_q:
            best, best_q = language, q
    return default if best is None else best


def negotiate_language(accept_language: str | None, preferred: object, default: str = "en") -> str:
    """The language of one request.

    ``preferred`` (``forwardedProps.iacCode.preferredLanguage``) wins if it names a
    supported language, then ``Accept-Language``, then ``default`` (normalized itself;
    an unsupported default means English).
    """
    fallback = normalize_language(default, _SOURCE_LANGUAGE) or _SOURCE_LANGUAGE
    chosen = normalize_language(preferred)
    if chosen is not None:
        return chosen
    return parse_accept_language(accept_language, fallback)


def _read_catalog(language: str) -> dict[str, str]:
    """Read ``locales/<language>.json`` strictly (raises if missing or malformed)."""
    from importlib import resources  # on first use: not needed to start

    resource = resources.files("agui_adapter.protocol").joinpath("locales")
    text = resource.joinpath(f"{language}.json").read_text(encoding="utf-8")
    data = json.loads(text)
    if not isinstance(data, dict):
        raise TypeError(f"{language}.json is not a JSON object")
    return {key: value for key, value in data.items() if isinstance(value, str)}


@functools.cache
def _catalog(language: str) -> Mapping[str, str]:
    """The catalog of one language, loaded once; unreadable catalogs act as empty.

    ``functools.cache`` keeps concurrent first calls safe: at worst two threads read the
    same file, and both results are identical and read-only.
    """
    if language == _SOURCE_LANGUAGE or language not in SUPPORTED_LANGUAGES:
        return _EMPTY_CATALOG
    try:
        return MappingProxyType(_read_catalog(language))
    except (OSError, ValueError, TypeError):
        return _EMPTY_CATALOG


def translate(language: str, template: str, /, **params: object) -> str:
    """Translate an English ``template`` into ``language`` and fill in ``params``.

    Missing translations and unknown languages fall back to English. Formatting never
    raises: if the parameters do not fit the template, its text is returned unformatted.
    """
    code = normalize_language(language, _SOURCE_LANGUAGE) or _SOURCE_LANGUAGE
    text = _catalog(code).get(template) or template
    try:
        return text.format(**params)
    except Exception:  # noqa: BLE001 - a message must never turn into a crash
        return text


def _placeholders(template: str) -> set[str] | None:
    """The placeholder names of a template, or ``None`` if it does not parse."""
    try:
        return {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}
    except ValueError:
        return None


def _check_catalogs() -> list[str]:
    """Every problem of the shipped catalogs, as human-readable lines (empty if none)."""
    from agui_adapter.protocol import catalog as messages

    templates = messages.all_messages()
    by_template = {template: name for name, template in templates.items()}
    problems: list[str] = []
    for language in SUPPORTED_LANGUAGES:
        if language == _SOURCE_LANGUAGE:
            continue
        try:
            catalog = _read_catalog(language)
        except (OSError, ValueError, TypeError) as exc:
            problems.append(f"{language}: catalog unreadable: {exc}")
            continue
        for name, template in sorted(templates.items()):
            if template not in catalog:
                problems.append(f"{language}: missing {name}: {template!r}")
                continue
            translation = catalog[template]
            if not translation.strip():
                problems.append(f"{language}: empty translation for {name}")
            elif _placeholders(translation) != _placeholders(template):
                problems.append(f"{language}: placeholders differ for {name}: {translation!r}")
        for key in sorted(set(catalog) - set(by_template)):
            problems.append(f"{language}: stale entry: {key!r}")
    return problems


def _main(argv: Sequence[str] | None = None) -> int:
    """``python -m agui_adapter.protocol.i18n [--check]``."""
    parser = argparse.ArgumentParser(
        prog="python -m agui_adapter.protocol.i18n", description="Inspect the message catalogs."
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="report missing, stale or inconsistent catalog entries; exit 1 if any",
    )
    args = parser.parse_args(argv)
    if not args.check:
        print("languages: " + ", ".join(SUPPORTED_LANGUAGES))
        return 0
    problems = _check_catalogs()
    for line in problems:
        print(line)
    if problems:
        print(f"{len(problems)} problem(s) found", file=sys.stderr)
        return 1
    print("all catalogs complete")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
