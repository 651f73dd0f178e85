"""Every field-level error names its field, the workspace (``cwd``) included, over a real socket."""

from __future__ import annotations

from pathlib import Path

import pytest

from agui_adapter.protocol import catalog as messages
from agui_adapter.protocol.i18n import SUPPORTED_LANGUAGES, translate
from tests.support.agui_client import Client, run_body

CWD = "forwardedProps.iacCode.cwd"


@pytest.mark.parametrize("language", SUPPORTED_LANGUAGES)
def test_a_relative_cwd_is_refused_naming_the_field(client: Client, language: str) -> None:
    result = client.run(run_body(cwd="relative/dir"), headers={"Accept-Language": language})
    assert result.status == 400 and result.error["code"] == "INVALID_INPUT"
    assert CWD in result.error["message"]
    assert result.error["message"] == translate(language, messages.CWD_NOT_ABSOLUTE, field=CWD)


def test_every_cwd_refusal_names_the_field(client: Client, tmp_path: Path, workspace: Path) -> None:
    a_file = workspace / "file.txt"
    a_file.write_text("x")
    for cwd in ("", "~nobody-such-user/x", "/etc", str(a_file), str(workspace / "a\x00b")):
        result = client.run(run_body(cwd=cwd))
        assert result.status == 400, cwd
        assert CWD in result.error["message"], (cwd, result.error)


@pytest.mark.parametrize("language", SUPPORTED_LANGUAGES)
def test_every_cwd_message_names_the_field(language: str) -> None:
    for name, template in messages.all_messages().items():
        if name.startswith("CWD_"):
            assert CWD in translate(language, template, field=CWD), (language, name)
