"""Tests for the message catalogs and per-request language handling (``agui_adapter.protocol.i18n``).

They prove that every adapter message exists in every supported language with the same
placeholders, that language negotiation follows upstream's rules (with a configured
default instead of the server locale), and that translation is per call and never raises.
"""

from __future__ import annotations

import json
import string
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agui_adapter.protocol import catalog as messages
from agui_adapter.protocol import i18n

LOCALES = Path(i18n.__file__).parent / "locales"
TRANSLATED = [language for language in i18n.SUPPORTED_LANGUAGES if language != "en"]
TECHNICAL_TOKENS = (
    "AG-UI",
    "A2A",
    "iac-code",
    "JSON",
    "Content-Type",
    "application/json",
    "text/event-stream",
    "threadId",
    "rosInvocationId",
    "RunAgentInput",
    "MiB",
    "PNG",
    "JPEG",
    "GIF",
    "WebP",
    "Pillow",
    "'images'",
)


def _load(language: str) -> dict[str, str]:
    return json.loads((LOCALES / f"{language}.json").read_text(encoding="utf-8"))


def _placeholders(template: str) -> set[str]:
    return {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}


# --- catalogs ------------------------------------------------------------------------


def test_supported_languages() -> None:
    assert i18n.SUPPORTED_LANGUAGES == ("en", "zh", "es", "fr", "de", "ja", "pt")
    assert i18n.message_languages() == i18n.SUPPORTED_LANGUAGES


@pytest.mark.parametrize("language", TRANSLATED)
def test_catalog_covers_every_message(language: str) -> None:
    catalog = _load(language)
    missing = {name: template for name, template in messages.all_messages().items() if template not in catalog}
    assert not missing, f"{language} lacks translations for {sorted(missing)}"


@pytest.mark.parametrize("language", TRANSLATED)
def test_catalog_has_no_stale_entries(language: str) -> None:
    stale = set(_load(language)) - set(messages.all_messages().values())
    assert not stale, f"{language} has entries for no message: {sorted(stale)}"


@pytest.mark.parametrize("language", TRANSLATED)
def test_translations_keep_placeholders_and_are_not_empty(language: str) -> None:
    for template, translation in _load(language).items():
        assert isinstance(translation, str)
        assert translation.strip(), f"{language}: empty translation of {template!r}"
        assert _placeholders(translation) == _placeholders(template), (
            language,
            translation,
        )


@pytest.mark.parametrize("language", TRANSLATED)
def test_translations_keep_technical_tokens(language: str) -> None:
    for template, translation in _load(language).items():
        for token in TECHNICAL_TOKENS:
            if token in template:
                assert token in translation, (language, token, translation)


@pytest.mark.parametrize("language", TRANSLATED)
def test_catalog_file_is_canonical_json(language: str) -> None:
    text = (LOCALES / f"{language}.json").read_text(encoding="utf-8")
    canonical = json.dumps(json.loads(text), ensure_ascii=False, indent=2, sort_keys=True)
    assert text.rstrip("\n") == canonical


def test_check_command_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert i18n._main(["--check"]) == 0
    assert "all catalogs complete" in capsys.readouterr().out


def test_check_command_reports_new_message(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(messages, "BRAND_NEW_MESSAGE", "Brand new {thing}.", raising=False)
    assert i18n._main(["--check"]) == 1
    out = capsys.readouterr().out
    for language in TRANSLATED:
        assert f"{language}: missing BRAND_NEW_MESSAGE" in out


# --- normalization -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("zh", "zh"),
        ("zh-CN", "zh"),
        ("ZH_tw", "zh"),
        (" zh ", "zh"),
        ("pt-BR", "pt"),
        ("EN-us", "en"),
        ("de-DE-1996", "de"),
        ("ja", "ja"),
        ("it", None),
        ("", None),
        ("-zh", None),
        (None, None),
        (42, None),
        (["zh"], None),
    ],
)
def test_normalize_language(value: object, expected: str | None) -> None:
    assert i18n.normalize_language(value) == expected


def test_normalize_language_fallback() -> None:
    assert i18n.normalize_language("klingon", "fr") == "fr"
    assert i18n.normalize_language(None, "de") == "de"
    assert i18n.normalize_language("es-MX", "fr") == "es"


# --- Accept-Language -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "default", "expected"),
    [
        (None, "en", "en"),
        ("", "de", "de"),
        ("   ", "ja", "ja"),
        ("fr", "en", "fr"),
        ("zh-CN,zh;q=0.9,en;q=0.8", "en", "zh"),
        ("en;q=0.5, de;q=0.9", "en", "de"),
        ("en;q=0.5, de", "en", "de"),
        # ties go to the earliest item
        ("es;q=0.8, fr;q=0.8", "en", "es"),
        ("ja, pt", "en", "ja"),
        # "*" stands for the configured default
        ("*", "de", "de"),
        ("it, *;q=0.5, fr;q=0.4", "ja", "ja"),
        ("*;q=0.3, fr;q=0.4", "ja", "fr"),
        # invalid, zero and out-of-range q values drop the item
        ("fr;q=abc, de;q=0.1", "en", "de"),
        ("fr;q=0, de;q=0.1", "en", "de"),
        ("fr;q=-1, de;q=0.1", "en", "de"),
        ("fr;q=1.5, de;q=0.1", "en", "de"),
        ("fr;q=nan, de;q=0.1", "en", "de"),
        ("fr;q=inf, de;q=0.1", "en", "de"),
        ("fr;q=0", "pt", "pt"),
        ("fr;q", "pt", "pt"),
        # q is matched case-insensitively, the first q counts, other params are ignored
        ("fr;Q=0.2, de;q=0.1", "en", "fr"),
        ("fr;q=0.2;q=0.9, de;q=0.5", "en", "de"),
        ("fr;level=1;q=0.7, de;q=0.5", "en", "fr"),
        ("fr ; q = 0.7 , de;q=0.5", "en", "fr"),
        # unsupported tags are dropped
        ("it, ru;q=0.9", "es", "es"),
        ("it, ru;q=0.9, pt-BR;q=0.1", "es", "pt"),
        (",,;q=1,", "zh", "zh"),
    ],
)
def test_parse_accept_language(header: str | None, default: str, expected: str) -> None:
    assert i18n.parse_accept_language(header, default) == expected


# --- negotiation ---------------------------------------------------------------------


def test_preferred_language_beats_header_and_default() -> None:
    assert i18n.negotiate_language("fr", "zh-CN", "de") == "zh"
    assert i18n.negotiate_language("fr", "JA", "de") == "ja"


def test_header_beats_default_when_preferred_is_unusable() -> None:
    assert i18n.negotiate_language("fr;q=0.9", None, "de") == "fr"
    assert i18n.negotiate_language("fr", "klingon", "de") == "fr"
    assert i18n.negotiate_language("fr", 7, "de") == "fr"


def test_default_used_when_nothing_else_matches() -> None:
    assert i18n.negotiate_language(None, None, "de") == "de"
    assert i18n.negotiate_language("it", None, "pt-BR") == "pt"
    assert i18n.negotiate_language("*", None, "ja") == "ja"
    assert i18n.negotiate_language(None, None) == "en"


def test_unsupported_default_means_english() -> None:
    assert i18n.negotiate_language(None, None, "klingon") == "en"
    assert i18n.negotiate_language("*", None, "it") == "en"


# --- translate -----------------------------------------------------------------------


def test_translate_english_is_identity() -> None:
    assert i18n.translate("en", messages.NOT_FOUND) == messages.NOT_FOUND
    assert i18n.translate("en", messages.FIELD_REQUIRED, field="threadId") == ("threadId is required.")


def test_translate_with_params_zh() -> None:
    assert i18n.translate("zh", messages.FIELD_REQUIRED, field="threadId") == "必须提供 threadId。"
    assert i18n.translate("zh", messages.IMAGE_TOO_LARGE, limit=5) == "图片超过大小上限 5 MiB。"
    assert i18n.translate("zh", messages.CANCELLED) == "执行已取消。"


def test_translate_with_params_fr() -> None:
    assert (
        i18n.translate("fr", messages.FIELD_TOO_LONG, field="runId", limit=64)
        == "runId doit comporter au maximum 64 caractères."
    )
    assert i18n.translate("fr", messages.RESUME_UNKNOWN, ids="a, b") == (
        "La reprise fait référence à une interruption inconnue : a, b."
    )


def test_translate_accepts_regional_tags() -> None:
    assert i18n.translate("zh-CN", messages.CANCELLED) == "执行已取消。"


def test_translate_falls_back_to_english() -> None:
    assert i18n.translate("klingon", messages.CANCELLED) == messages.CANCELLED
    assert i18n.translate("zh", "Not a catalogued {thing}.", thing="message") == ("Not a catalogued message.")


@pytest.mark.parametrize("language", i18n.SUPPORTED_LANGUAGES)
def test_translate_never_raises_on_bad_params(language: str) -> None:
    translated = i18n.translate(language, messages.FIELD_TOO_LONG)
    assert "{field}" in translated and "{limit}" in translated
    assert i18n.translate(language, messages.FIELD_TOO_LONG, field="x") == translated
    assert i18n.translate(language, "Stray { brace", x=1) == "Stray { brace"
    assert i18n.translate(language, "Positional {0}", x=1) == "Positional {0}"
    assert i18n.translate(language, "Attribute {x.missing}", x=1) == "Attribute {x.missing}"
    assert i18n.translate(language, "Spec {x:d}", x="text") == "Spec {x:d}"


@pytest.mark.parametrize("language", i18n.SUPPORTED_LANGUAGES)
def test_every_message_formats(language: str) -> None:
    for template in messages.all_messages().values():
        params = {name: "X" for name in _placeholders(template)}
        translated = i18n.translate(language, template, **params)
        assert "{" not in translated and "}" not in translated


def test_translation_is_per_call_across_threads() -> None:
    languages = ("zh", "fr", "ja", "de")
    i18n._catalog.cache_clear()  # make the threads race on the lazy catalog load too
    barrier = threading.Barrier(len(languages))

    def worker(language: str) -> set[str]:
        barrier.wait(timeout=10)
        return {i18n.translate(language, messages.FIELD_REQUIRED, field="runId") for _ in range(500)}

    with ThreadPoolExecutor(max_workers=len(languages)) as pool:
        futures = {language: pool.submit(worker, language) for language in languages}
        results = {language: future.result(timeout=30) for language, future in futures.items()}
    expected = {
        "zh": {"必须提供 runId。"},
        "fr": {"runId est obligatoire."},
        "ja": {"runId は必須です。"},
        "de": {"runId ist erforderlich."},
    }
    assert results == expected
