"""``/health`` names the kernel behind the adapter: ``scripted``, ``iac-code`` or ``external``.

The console shows it, so that a person knows whether answers come from the scripted test
kernel or from the real one. Over real sockets: the in-process adapter built on the scripted
kernel, and ``run.py --a2a-url`` (a configured kernel the adapter did not start: external).
"""

from __future__ import annotations

from typing import Any

import pytest
import requests

from agui_adapter.kernel_client.launch import KernelProcess


def test_health_names_the_scripted_kernel(make_adapter: Any) -> None:
    adapter = make_adapter()
    health = requests.get(adapter.url + "health", timeout=5).json()
    assert health["kernel"] == "scripted"


def test_a_configured_kernel_is_external(adapter_process: Any) -> None:
    process = adapter_process()
    health = requests.get(process.url + "health", timeout=5).json()
    assert health["kernel"] == "external"


KINDS = [("scripted", "scripted"), ("iac-code", "iac-code"), ("configured", "external"), ("x", "external")]


@pytest.mark.parametrize(("kind", "shown"), KINDS)
def test_health_kind_of_each_kernel_process(kind: str, shown: str) -> None:
    assert KernelProcess("http://127.0.0.1:1/", "t", kind).health_kind == shown
