"""``sdnotify``: $NOTIFY_SOCKET parsed, messages sent as datagrams to a path or an abstract address."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest

from agui_adapter.ops import fdlimit, sdnotify


def test_the_address_is_a_path_an_abstract_name_or_nothing() -> None:
    assert sdnotify.address({"NOTIFY_SOCKET": "/run/systemd/notify"}) == "/run/systemd/notify"
    assert sdnotify.address({"NOTIFY_SOCKET": "@abstract/name"}) == b"\0abstract/name"
    assert sdnotify.address({}) is None
    assert sdnotify.address({"NOTIFY_SOCKET": ""}) is None
    assert sdnotify.address({"NOTIFY_SOCKET": "vsock:2:1234"}) is None


def test_the_watchdog_pings_at_half_its_timeout_for_this_process_only() -> None:
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}) == 15.0
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, pid=2) is None
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "x"}) is None
    assert sdnotify.watchdog_interval({}) is None


def _receive(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    return sock.recv(4096)


def test_messages_reach_a_socket_bound_at_a_path(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        notifier = sdnotify.Notifier({"NOTIFY_SOCKET": path})
        assert notifier.ready("listening on 127.0.0.1:8000")
        assert _receive(sock) == b"READY=1\nSTATUS=listening on 127.0.0.1:8000"
        assert notifier.watchdog() and _receive(sock) == b"WATCHDOG=1"
        assert notifier.stopping() and _receive(sock) == b"STOPPING=1"


def test_messages_reach_an_abstract_socket() -> None:
    name = f"agui-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        assert sdnotify.Notifier({"NOTIFY_SOCKET": "@" + name}).ready()
        assert _receive(sock) == b"READY=1"


def test_without_a_socket_nothing_is_sent_and_a_dead_socket_is_no_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert not sdnotify.Notifier({}).enabled
    assert sdnotify.Notifier({}).ready() is False
    gone = sdnotify.Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody")})
    assert gone.enabled and gone.watchdog() is False and gone.watchdog() is False
    assert len([r for r in caplog.records if "NOTIFY_SOCKET" in r.getMessage()]) == 1  # logged once


def test_the_descriptor_budget_grows_with_connections_and_runs() -> None:
    small = fdlimit.descriptors_needed(100, 10)
    assert fdlimit.descriptors_needed(1024, 256) > 1024 > small > 100
    assert fdlimit.descriptors_needed(1024, 256) > fdlimit.descriptors_needed(1024, 10)


def test_the_soft_limit_is_raised_to_the_hard_one_and_a_tight_one_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    resource = pytest.importorskip("resource")
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        hard = before[1]
        if hard != resource.RLIM_INFINITY and hard > 256:
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
            soft = fdlimit.check(10, 10)
            assert soft == hard == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        caplog.clear()
        soft = fdlimit.check(10_000_000, 10)
        assert any("open-file limit" in r.getMessage() for r in caplog.records)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


def test_the_watchdog_pings_only_while_the_server_is_healthy(tmp_path: Path) -> None:
    from agui_adapter.cli import start_watchdog

    path = str(tmp_path / "notify")
    healthy = [True]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        notifier = sdnotify.Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "100000"})
        stop = start_watchdog(notifier, lambda: healthy[0])
        try:
            assert _receive(sock) == b"WATCHDOG=1" and _receive(sock) == b"WATCHDOG=1"
            healthy[0] = False
            sock.settimeout(0.5)
            try:  # drain a ping that was on its way when health turned bad
                for _ in range(3):
                    sock.recv(4096)
            except TimeoutError:
                pass
            with pytest.raises(TimeoutError):
                sock.recv(4096)  # 0.5 s: ten intervals without a ping
        finally:
            stop.set()
    assert start_watchdog(sdnotify.Notifier({}), lambda: True).is_set() is False  # no watchdog: no thread
