"""``ops.process_local``: the pid and random bytes kept by the process, and renewed in a forked child."""

from __future__ import annotations

import os
import threading
import uuid

import pytest

from agui_adapter.ops import process_local


def test_random_bytes_are_the_systems_bought_once_per_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = os.urandom
    me = threading.get_ident()
    # this thread's calls only: a thread an earlier test left (a record log's checkpoint draws
    # its epoch with os.urandom) may call it meanwhile
    monkeypatch.setattr(os, "urandom", lambda n: (threading.get_ident() == me and calls.append(n)) or real(n))
    monkeypatch.setattr(process_local, "_buffer", b"")
    ids = [process_local.uuid4() for _ in range(process_local._CHUNK // 16)]
    assert calls == [process_local._CHUNK]  # 256 UUIDs, one system call
    assert len(set(ids)) == len(ids)
    process_local.random_bytes(1)
    assert calls == [process_local._CHUNK] * 2
    assert len(process_local.random_bytes(process_local._CHUNK + 1)) == process_local._CHUNK + 1  # not buffered
    assert calls[-1] == process_local._CHUNK + 1


def test_uuid4_is_a_version_4_uuid() -> None:
    for _ in range(1000):
        made = process_local.uuid4()
        assert made.version == 4 and made.variant == uuid.RFC_4122
        assert uuid.UUID(str(made)) == made


def test_random_hex_and_bytes_have_the_length_asked_for() -> None:
    for n in (0, 1, 8, 16, 100):
        assert len(process_local.random_bytes(n)) == n
        text = process_local.random_hex(n)
        assert len(text) == 2 * n and bytes.fromhex(text) is not None
    assert process_local.random_hex(8) != process_local.random_hex(8)


def test_pid_is_the_processs_and_a_forked_childs_own() -> None:
    assert process_local.pid() == os.getpid()
    process_local.random_bytes(1)  # the parent has buffered bytes at the fork
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.write(write, f"{process_local.pid()} {os.getpid()} {process_local.random_hex(16)}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        reported_pid, real_pid, child_bytes = pipe.read().split()
    os.waitpid(child, 0)
    assert int(reported_pid) == int(real_pid) == child != os.getpid()
    assert process_local.pid() == os.getpid()
    assert child_bytes != process_local.random_hex(16)  # not the parent's buffer handed out twice
