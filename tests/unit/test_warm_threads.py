"""Warm threads (``ops.warm_threads``: the server's workers, the runs' kernel readers):
reused, bounded, and gone when idle."""

from __future__ import annotations

import threading
import time

from agui_adapter.ops.warm_threads import WarmThreads

WAIT = 5.0


def wait_for(condition, timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


def test_work_runs_on_another_thread_and_a_finished_thread_serves_the_next_work() -> None:
    threads = WarmThreads(idle_seconds=WAIT, max_idle=8, name="test")
    seen: list[int] = []
    done = threading.Event()

    def work() -> None:
        seen.append(threading.get_ident())
        done.set()

    threads.run(work)
    assert done.wait(WAIT)
    assert seen[0] != threading.get_ident()
    assert wait_for(lambda: threads.idle() == 1)
    done.clear()
    threads.run(work)
    assert done.wait(WAIT)
    assert seen[1] == seen[0]  # the same thread, not a new one
    assert wait_for(lambda: threads.idle() == 1)


def test_work_given_while_every_thread_is_busy_gets_a_thread_of_its_own() -> None:
    threads = WarmThreads(idle_seconds=WAIT, max_idle=8, name="test")
    release = threading.Event()
    started: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        with lock:
            started.append(threading.get_ident())
        release.wait(WAIT)

    for _ in range(3):
        threads.run(work)
    assert wait_for(lambda: len(started) == 3)
    assert len(set(started)) == 3
    release.set()
    assert wait_for(lambda: threads.idle() == 3)


def test_no_more_than_max_idle_threads_wait_and_an_idle_thread_ends() -> None:
    # its own threads counted by name: other tests' threads come and go meanwhile
    threads = WarmThreads(idle_seconds=1.0, max_idle=1, name="test-max-idle")  # long enough to see one wait
    release = threading.Event()
    finished = threading.Semaphore(0)

    def alive() -> int:
        return sum(1 for thread in threading.enumerate() if thread.name == "test-max-idle")

    def work() -> None:
        release.wait(WAIT)
        finished.release()

    threads.run(work)
    threads.run(work)
    assert wait_for(lambda: alive() == 2)
    release.set()
    assert finished.acquire(timeout=WAIT) and finished.acquire(timeout=WAIT)
    assert wait_for(lambda: threads.idle() == 1 and alive() == 1)
    assert wait_for(lambda: threads.idle() == 0 and alive() == 0, 2 * WAIT)


def test_a_failing_work_does_not_cost_the_thread() -> None:
    threads = WarmThreads(idle_seconds=WAIT, max_idle=8, name="test")
    done = threading.Event()

    def failing() -> None:
        raise RuntimeError("boom")

    threads.run(failing)
    assert wait_for(lambda: threads.idle() == 1)
    threads.run(done.set)
    assert done.wait(WAIT)


def test_a_forked_child_forgets_the_parents_waiting_threads() -> None:
    import os

    threads = WarmThreads(idle_seconds=WAIT, max_idle=8, name="test")
    done = threading.Event()
    threads.run(done.set)
    assert done.wait(WAIT) and wait_for(lambda: threads.idle() == 1)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its work must run on a thread of its own, not in a dead parent's
        try:
            ran = threading.Event()
            idle_before = threads.idle()
            threads.run(ran.set)
            os.write(write, b"%d %d" % (idle_before, ran.wait(WAIT)))
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 100)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"0 1"
    assert threads.idle() == 1  # the parent's thread still waits in the parent
