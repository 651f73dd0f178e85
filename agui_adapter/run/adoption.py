"""Adoption: a run whose adapter process is gone is taken over by the next process that meets it.

The kernel is a process of its own: when the adapter process running a run dies (``kill -9``,
an OOM kill, a gunicorn worker recycled or killed) or stops handing its runs over
(``--on-shutdown handover``), the kernel task goes on and still has everything. What the
client was sent is in the run's journal (``state.journal``). So a run whose journal has no live
writer (nobody holds its directory lock) and no end is an *orphan*, and the first process
that meets it becomes its driver again:

* on a reattach to it (``POST /`` with ``Last-Event-ID``, the events route, or a reader
  following it when its writer dies: ``journal.follow``'s ``adopt``),
* on a new turn for its thread (``admission.Admitter``: the orphan holds the thread again, so
  the turn is ``THREAD_BUSY`` while the run goes on),
* at start-up and every ``SCAN_SECONDS`` after (``Adoption.scan``): found from the journal
  directory, never by scanning thread records. A journal that ended never takes another
  event, so a scan remembers which had: a thread directory unchanged since (the same mtime,
  older than ``SETTLED_SECONDS`` so that a change in the same clock tick is not missed) costs
  one ``stat`` when all its runs had ended, and only its other runs are looked at otherwise;
  a changed one (a run made or removed) is looked into whole. The runs this process writes
  are never looked at (no orphans, by their writer's lock held here), and another run's
  writer is looked for before its journal's end: 200 live streams are 200 directory
  listings a scan, not 200 journals opened and read.

Only one process adopts a run: the journal directory's OS lock decides
(``JournalWriter.claim``); the thread's run lock, released by the OS when the dead process
went, is taken next. The adopter builds the run's machine with the journal's events
(``RunMachine(adopted_events=...)``: which ids were used, which spans are open, what text
each kernel message showed) and follows the kernel task again (``SubscribeToTask``: its
snapshot, then its live events; ``GetTask`` when it no longer runs). The snapshot gives back
the text the kernel produced while no process followed (``reconcile.Reconciliation``), the
kernel's conversation, read once the snapshot came, the tool calls of that gap
(``reconcile.gap_tool_calls``, ``AdoptedDriver``); the rest is an ordinary detached run (``run.driver``):
interrupts committed before their ``RUN_FINISHED``, the grace period (at least
``ADOPTED_GRACE_SECONDS``, so that clients whose stream was cut have time to come back), the
cancel extension, metrics and logs. A run that cannot be adopted (the kernel no longer has
its task, its execution was retired, another run holds its thread, a guidance run: the README
says why) is concluded in its journal: every span closed and ``RUN_ERROR EXECUTION_LOST``
(``process_gone``), so its readers see one valid run. A process that is stopping adopts nothing (``Adoption.stop``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agui_adapter.ops.faults import describe
from agui_adapter.protocol import events as ev
from agui_adapter.protocol.validation import IacCodeProps, RunInput
from agui_adapter.run import gap_artifacts
from agui_adapter.run.admitted import Admission
from agui_adapter.run.driver import RunDriver
from agui_adapter.run.effects import Mode
from agui_adapter.run.lifecycle import Attach, Lifecycle
from agui_adapter.run.machine import RunMachine
from agui_adapter.run.process_gone import process_gone_ending
from agui_adapter.run.pump import KernelByteStream
from agui_adapter.run.reconcile import gap_tool_calls
from agui_adapter.run.registry import LiveRuns
from agui_adapter.run.services import RunServices
from agui_adapter.run.slots import RunSlots
from agui_adapter.run.translation import SESSION_EVENT
from agui_adapter.state.journal import END, JournalWriter, read_meta, read_pipeline_note, scan_run, writer_alive
from agui_adapter.state.store import StoreError

log = logging.getLogger("agui_adapter.run.adoption")

#: How often each process looks for orphans in the journal directory.
SCAN_SECONDS = 2.0
#: A directory's mtime is trusted to show every change once it is this old (file times come
#: from a coarse clock: two changes within one tick leave the same mtime).
SETTLED_SECONDS = 1.0
#: The grace period of an adopted run when ``--disconnect-grace-seconds`` is 0: its clients'
#: streams were cut, not closed by them, and they need a moment to come back.
ADOPTED_GRACE_SECONDS = 30.0
_TERMINAL = ("RUN_FINISHED", "RUN_ERROR")


def _end_seen(directory: Path) -> bool | None:
    """Whether the run's newest segment ends with the end mark (a cheap look, no parsing);
    None when the look failed (the run is gone meanwhile, or the system said no: out of file
    handles, say), which ``orphaned`` counts as no orphan and a scan does not remember.
    The segment's tail is read with ``pread`` at its size (four system calls; a buffered
    file object's set-up and seeks take eleven)."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".sse"))
    except OSError:
        return None
    if not names:
        return True
    try:
        fd = os.open(directory / names[-1], os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        return size >= len(END) and os.pread(fd, len(END), size - len(END)) == END
    except OSError:
        return None
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class _ThreadLook:
    """What the last scan saw of one thread directory."""

    mtime_ns: int
    ended: frozenset[str]  # its runs whose journals had ended
    settled: bool  # the mtime was old enough to show every change (``SETTLED_SECONDS``)
    quiet: bool  # every run in it had ended


def orphaned(directory: Path) -> bool:
    """A journal without an end whose writer is gone."""
    return _end_seen(directory) is False and not writer_alive(directory)


def _scan_forever(adoption_ref: weakref.ref[Adoption]) -> None:
    """The scanner's loop; it ends with its engine (tests make many, each on its own directory)."""
    while True:
        adoption = adoption_ref()
        if adoption is None:
            return
        try:
            adoption.scan()
        except Exception:  # noqa: BLE001 - the scanner must outlive one bad directory
            log.exception("adoption scan failed")
        del adoption
        time.sleep(SCAN_SECONDS)


class _AfterSnapshot:
    """The adopted run's kernel stream, whose first chunk (the task's snapshot) is held until
    ``before_first`` has run: what that reads of the kernel is then at least as new as the
    snapshot, and anything later comes live (the translator takes each tool call once)."""

    def __init__(self, stream: KernelByteStream, before_first: Callable[[], None]) -> None:
        self._stream = stream
        self._before_first: Callable[[], None] | None = before_first

    def chunks(self) -> Iterator[bytes]:
        for chunk in self._stream.chunks():
            hook, self._before_first = self._before_first, None
            if hook is not None:
                hook()
            yield chunk

    def close(self) -> None:
        self._stream.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _ReconcilingKernel:
    """The kernel client as an adopted run's driver sees it: its first ``follow`` (the
    ``SubscribeToTask`` that takes the run up again) reads the kernel's conversation after
    the snapshot came, for the tool calls made while no adapter process was alive."""

    def __init__(self, kernel: Any, before_first: Callable[[], None]) -> None:
        self._kernel = kernel
        self._before_first: Callable[[], None] | None = before_first

    def follow(self, task_id: str) -> Any:
        stream = self._kernel.follow(task_id)
        hook, self._before_first = self._before_first, None
        return _AfterSnapshot(stream, hook) if hook is not None else stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kernel, name)


class AdoptedDriver(RunDriver):
    """The driver of an adopted run: no client of its own, it goes on in its journal (after
    the last id the dead process wrote) on a thread of its own, like a detached run."""

    def __init__(
        self, services: RunServices, admission: Admission, machine: RunMachine, writer: JournalWriter, last: int
    ):
        super().__init__(services, admission, machine, None)
        self._claimed: JournalWriter | None = writer
        self._events = last
        self._life = Lifecycle(Attach.DETACHED)  # no client of its own, ever
        if machine.run_input.props.run_mode != "pipeline":  # a pipeline's tool calls come in its journal
            self.kernel = _ReconcilingKernel(self.kernel, self._read_gap_tool_calls)

    def _read_gap_tool_calls(self) -> None:
        """Hand the run's tool calls in the kernel's conversation to its ``Reconciliation`` (which
        sends those the journal does not hold). Best effort: without them the run goes on."""
        machine = self.machine
        task_id, reconciliation = machine.task_id, machine.reconciliation
        if not task_id or reconciliation is None:
            return
        try:  # the conversation is the kernel execution's (its id: the task's executionControl)
            task = self.kernel.get_task(task_id, timeout=10.0)
            control = ((task.get("metadata") or {}).get("iac_code") or {}).get("executionControl") or {}
            execution_id = control.get("executionId")
            if not isinstance(execution_id, str) or not execution_id:
                log.warning("run %s: the kernel's task names no execution", self.run_id)
                return
            status, body = self.kernel.session_recovery(machine.record.context_id, execution_id)
        except Exception as exc:  # noqa: BLE001 - the run goes on without them
            log.warning("run %s: the kernel's conversation is unavailable: %s", self.run_id, describe(exc))
            return
        if status != 200 or not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            log.warning("run %s: the kernel's conversation is unavailable (HTTP %s)", self.run_id, status)
            return
        runs, namespace = machine.record.runs, machine.translator.id_namespace
        calls, results = gap_tool_calls(body["messages"], runs, self.run_id, task_id, namespace)
        reconciliation.gap_tool_calls, reconciliation.gap_tool_results = calls, results

    def _open_journal(self) -> None:
        self._journal.writer, self._claimed = self._claimed, None
        self._journal.hear_readers(self._wake)  # a reader here leaving: looked at at once

    def grace_seconds(self) -> float:
        grace = self.services.settings.disconnect_grace_seconds
        return grace if grace > 0 else ADOPTED_GRACE_SECONDS

    def go(self) -> None:
        thread = threading.Thread(target=self._go_on_detached, name=f"adopted-{self.run_id[:16]}", daemon=True)
        thread.start()


class Adoption:
    """Finds and adopts the orphan runs of a state directory; one per process."""

    def __init__(self, services: RunServices, slots: RunSlots, live: LiveRuns) -> None:
        self.services = services
        self._slots = slots
        self._live = live
        self._scanner: threading.Thread | None = None
        self._lock = threading.Lock()
        self._taking: set[str] = set()  # threads whose run this process is taking over right now
        self._stopped = False
        self._looks: dict[str, _ThreadLook] = {}  # thread directory -> what the last scan saw

    def stop(self) -> None:
        """The process is stopping: it adopts nothing more (a run it took now would be orphaned
        again as it exits; the next process takes it)."""
        self._stopped = True

    @property
    def stopped(self) -> bool:
        return self._stopped

    def taking_over(self, thread_id: str) -> bool:
        """Whether this process is taking over a run of the thread right now (it holds the
        thread and has not heard from the kernel yet: the run may end at once)."""
        with self._lock:
            return thread_id in self._taking

    # ------------------------------------------------------------------ triggers
    def start(self) -> None:
        """Adopt the orphans now, and look again every ``SCAN_SECONDS`` (daemon thread)."""
        with self._lock:
            if self._scanner is not None:
                return
            self._scanner = threading.Thread(
                target=_scan_forever, args=(weakref.ref(self),), name="adoption-scan", daemon=True
            )
            self._scanner.start()

    def scan(self) -> int:
        """Adopt every orphan of the journal directory; how many were adopted. Thread
        directories unchanged since a scan saw all their runs ended are not opened."""
        adopted = 0
        root = self.services.journals.root
        settled_before = time.time_ns() - int(SETTLED_SECONDS * 1e9)
        try:
            threads = list(os.scandir(root))
        except OSError:
            return 0
        looks: dict[str, _ThreadLook] = {}
        mine = self._written_here()
        for thread_entry in threads:
            try:
                mtime_ns = thread_entry.stat(follow_symlinks=False).st_mtime_ns
            except OSError:
                continue
            known: frozenset[str] = frozenset()
            last = self._looks.get(thread_entry.path)
            if last is not None and last.settled and last.mtime_ns == mtime_ns:  # unchanged since
                if last.quiet:
                    looks[thread_entry.path] = last
                    continue
                known = last.ended
            count, ended, quiet = self._look_into(Path(thread_entry.path), known, mine)
            adopted += count
            looks[thread_entry.path] = _ThreadLook(mtime_ns, ended, mtime_ns < settled_before, quiet)
        self._looks = looks
        return adopted

    def thread(self, thread_id: str) -> int:
        """Adopt the orphan runs of one thread (a request for it arrived); how many."""
        try:
            directory = self.services.journals.run_dir(thread_id, "x").parent
        except StoreError:
            return 0
        return self._look_into(directory)[0]

    def _written_here(self) -> frozenset[Path]:
        """The journal directories this process writes now (their locks held here)."""
        held = (driver.journal_held for driver in self._live.all())
        return frozenset(directory for directory in held if directory is not None)

    def _look_into(
        self, directory: Path, known_ended: frozenset[str] = frozenset(), mine: frozenset[Path] = frozenset()
    ) -> tuple[int, frozenset[str], bool]:
        """Adopt the orphans of one thread directory, skipping ``known_ended`` and the runs
        this process writes (``mine``): how many were adopted, which runs have ended, and
        whether all of them have."""
        adopted = 0
        try:
            names = [e.name for e in os.scandir(directory) if not e.name.startswith(".")]
        except OSError:
            return 0, frozenset(), False
        ended = set(known_ended.intersection(names))
        for name in names:
            if name in ended:
                continue
            run_dir = directory / name
            if run_dir in mine or writer_alive(run_dir):
                continue  # live: looked at again at the next scan
            seen = _end_seen(run_dir)
            if seen:
                ended.add(name)
            elif seen is False and self.adopt(run_dir) == "adopted":
                adopted += 1
        return adopted, frozenset(ended), len(ended) == len(names)

    def run(self, thread_id: str, run_id: str) -> bool:
        """A reader met the run: adopt it if it is an orphan. Whether it has a live writer now."""
        try:
            directory = self.services.journals.run_dir(thread_id, run_id)
        except StoreError:
            return False
        if not orphaned(directory):
            return writer_alive(directory)
        if self._stopped:
            return False
        return self.adopt(directory) in ("adopted", "alive", "later")

    # ------------------------------------------------------------------ taking over
    def adopt(self, directory: Path) -> str:
        """``adopted``, ``alive`` (another process holds it), ``later`` (the kernel does not
        answer now, or this process is stopping: tried again at the next scan or reattach, by
        the next process), or ``concluded``/``gone``."""
        if self._stopped:
            return "later"
        writer = JournalWriter.claim(directory, self.services.journals.buffer_bytes)
        if writer is None:
            return "alive" if writer_alive(directory) else "gone"
        try:
            return self._take_over(directory, writer)
        except Exception:  # noqa: BLE001 - never leave a claimed journal locked by accident
            log.exception("adopting the run of %s failed", directory)
            with contextlib.suppress(OSError):
                writer.close()
            return "gone"

    def _take_over(self, directory: Path, writer: JournalWriter) -> str:
        services = self.services
        last, ended, events = scan_run(directory)
        if ended or last == 0:
            writer.close()
            return "gone"
        meta = read_meta(directory) or {}
        thread_id, run_id = meta.get("threadId"), meta.get("runId")
        language = str(meta.get("language") or services.settings.default_language)
        if events and events[-1].get("type") in _TERMINAL:  # it ended, the end mark did not make it
            writer.end()
            return "concluded"
        if not isinstance(thread_id, str) or not isinstance(run_id, str):
            return self._conclude(writer, events, last, language, "no run.json")
        # the thread first (the dead process's lock went with it): a new turn racing this
        # adoption either finds the thread held, or holds it and the run cannot go on
        run_lock = services.store.try_lock_run(thread_id)
        if run_lock is None:
            return self._conclude(writer, events, last, language, "another run holds its thread")
        with self._lock:
            self._taking.add(thread_id)
        try:
            return self._adopt_locked(directory, writer, events, last, meta, thread_id, run_id, language, run_lock)
        except BaseException:
            run_lock.release()
            raise
        finally:
            with self._lock:
                self._taking.discard(thread_id)

    def _adopt_locked(
        self,
        directory: Path,
        writer: JournalWriter,
        events: list[dict[str, Any]],
        last: int,
        meta: dict[str, Any],
        thread_id: str,
        run_id: str,
        language: str,
        run_lock: Any,
    ) -> str:
        services = self.services
        session = next(
            (e.get("value") for e in events if e.get("type") == "CUSTOM" and e.get("name") == SESSION_EVENT), None
        )
        mode = Mode(meta.get("mode", "turn"))
        try:
            record = services.store.load(thread_id)
        except StoreError as exc:
            run_lock.release()
            writer.close()
            log.warning("run %s: cannot adopt it, state unavailable: %s", run_id, exc)
            return "later"
        execution = record.execution if record is not None else None
        if (
            record is None
            or execution is None
            or mode is Mode.GUIDANCE
            or not isinstance(session, dict)
            or session.get("executionId") != execution.execution_id
            or not execution.task_id
        ):  # a retired execution is still followed: the kernel's last state says how its run ended
            run_lock.release()
            return self._conclude(writer, events, last, language, "its execution is over or unknown")
        if not services.kernel.health(timeout=2.0):  # a kernel down is not a kernel that lost the task
            run_lock.release()
            writer.close()
            log.warning("run %s: not adopted now: the kernel does not answer", run_id)
            return "later"
        if not self._slots.take():
            run_lock.release()
            writer.close()
            log.warning("run %s: not adopted now: no run slot free", run_id)
            return "later"
        try:
            props = IacCodeProps(
                schema_version=1,
                ros_invocation_id=str(meta.get("rosInvocationId") or execution.ros_invocation_id),
                cwd=record.cwd,
                user_id=record.user_id,
                preferred_language=meta.get("preferredLanguage"),
                run_mode=meta.get("runMode"),
                pipeline_name=meta.get("pipelineName"),
            )
            run_input = RunInput(thread_id, run_id, meta.get("parentRunId"), [], [], props, None, {})
            admission = Admission(run_input, language, record, run_lock, mode)
            machine = RunMachine(
                run_input,
                mode=mode,
                record=record,
                language=language,
                interrupt_ttl_seconds=services.settings.interrupt_ttl_seconds,
                adopted_events=events,
                adopted_pipeline=read_pipeline_note(directory),
            )
            if mode is not Mode.RESUME:  # a Resume's snapshot holds earlier runs' artifacts only
                assert machine.reconciliation is not None  # an adopted run's
                machine.reconciliation.gap_artifacts = gap_artifacts.for_journal(events)
            driver = AdoptedDriver(services, admission, machine, writer, last)
        except BaseException:
            self._slots.give()
            raise
        self._live.opened(driver, adopted=True)
        handed = (directory / "handed-over").exists()
        log.info(
            "run %s on thread %s adopted after event %d (%s)",
            run_id,
            thread_id,
            last,
            "handed over" if handed else "its process died",
        )
        driver.go()
        return "adopted"

    def _conclude(self, writer: JournalWriter, events: list[dict[str, Any]], last: int, language: str, why: str) -> str:
        """The run cannot go on: its journal ends as a valid run, ``RUN_ERROR EXECUTION_LOST``."""
        ending = process_gone_ending(events, int(time.time() * 1000), language)
        try:
            writer.append(ev.encode_many(ending, last + 1), last + len(ending) + 1)
            writer.end()
        except OSError as exc:
            log.warning("could not conclude the journal of %s: %s", writer.directory, exc)
            writer.close()
        log.info("run journal %s concluded EXECUTION_LOST: %s", writer.directory.name, why)
        return "concluded"
