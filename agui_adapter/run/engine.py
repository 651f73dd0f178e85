"""The run engine: one per adapter process, the face the web app talks to.

Each of its jobs lives in a module of its own, and the engine only wires them and passes
calls on, keeping the names the web app and the tests use:

* ``slots``: the ``max_runs`` run slots;
* ``registry``: the live runs of this process (``live_driver``, ``live_runs``);
* ``admission``: admitting a run (``admit``);
* ``driver``: streaming it (``stream``), with the narrow ``services`` it uses;
* ``reattach``: readers of a run's journal (``reattach``, ``attach_reader``);
* ``adoption``: runs whose process is gone, taken over here;
* ``shutdown``: ending or handing over the live runs (``shut_down_runs``);
* ``cancel``: the cancel extension (``cancel_execution``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from agui_adapter.config import Settings
from agui_adapter.kernel_client.a2a import KernelClient
from agui_adapter.ops.idle import IdleWatch
from agui_adapter.ops.metrics import Metrics
from agui_adapter.ops.tracing import Tracing
from agui_adapter.protocol.validation import RunInput
from agui_adapter.run.admission import Admitter
from agui_adapter.run.admitted import Admission, context_id_for, run_mode_name
from agui_adapter.run.adoption import Adoption
from agui_adapter.run.cancel import Cancellation
from agui_adapter.run.driver import RunDriver
from agui_adapter.run.machine import RunMachine
from agui_adapter.run.reattach import Reattachment
from agui_adapter.run.registry import LiveRuns
from agui_adapter.run.services import RunServices
from agui_adapter.run.shutdown import shut_down_runs
from agui_adapter.run.slots import RunSlots
from agui_adapter.state.journal import JournalReader, JournalStore
from agui_adapter.state.store import ThreadStore
from agui_adapter.state.workspace import Workspaces

__all__ = ["Admission", "RunEngine", "context_id_for", "run_mode_name"]


class RunEngine:
    """Admits runs and streams them; one instance per adapter process."""

    def __init__(
        self,
        store: ThreadStore,
        kernel: KernelClient,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        env: dict[str, str] | None = None,
        metrics: Metrics | None = None,
        tracing: Tracing | None = None,
        adopt_orphans: bool = True,
    ) -> None:
        self.store = store
        self.kernel = kernel
        self.settings = settings
        self.clock = clock
        self.metrics = metrics if metrics is not None else Metrics()
        self.tracing = tracing if tracing is not None else Tracing()
        self._env = dict(os.environ if env is None else env)
        if settings.allowed_cwds:
            self._env["IAC_CODE_AGUI_ALLOWED_CWDS"] = settings.allowed_cwds
        self.idle = IdleWatch()  # runs admitted and ended, for --idle-shutdown (``idle.py``)
        self.workspaces = Workspaces(self._env, reserved=(store.root,))
        self.journals = JournalStore(
            store.root,
            retention_seconds=settings.replay_retention_seconds,
            buffer_bytes=settings.replay_buffer_bytes,
        )
        self.slots = RunSlots(settings.max_runs)
        self.live = LiveRuns(self.slots, self.metrics, self.idle)
        self.services = RunServices(
            kernel, store, self.journals, settings, self.metrics, clock, monotonic, run_ended=self.live.ended
        )
        self.adoption = Adoption(self.services, self.slots, self.live)
        self._admitter = Admitter(
            store, kernel, settings, clock, self.workspaces, self.slots, self.live, self.adoption, self.idle
        )
        self._reattachment = Reattachment(store, self.journals, self.adoption, self.metrics)
        self._cancellation = Cancellation(store, kernel, self.live)
        if adopt_orphans:  # runs whose process died or handed them over: adopted here (``adoption``)
            self.adoption.start()

    # ------------------------------------------------------------------ admission
    def admit(self, run_input: RunInput, language: str) -> Admission:
        """Check and record a new run; raises AguiError (answered before the stream)."""
        return self._admitter.admit(run_input, language)

    # ------------------------------------------------------------------ reattach
    def reattach(
        self, thread_id: str, run_id: str, after: int, digest: str | None = None, *, attach: bool = True
    ) -> JournalReader | None:
        """A reader of the run's events after id ``after`` (``reattach``)."""
        return self._reattachment.reattach(thread_id, run_id, after, digest, attach=attach)

    def attach_reader(self, thread_id: str, run_id: str, reader: JournalReader) -> None:
        self._reattachment.attach_reader(thread_id, run_id, reader)

    # ------------------------------------------------------------------ streaming
    def stream(
        self,
        admission: Admission,
        client_gone: Callable[[], bool] | None = None,
        client_watch: Callable[[Callable[[bool], None]], bool] | None = None,
    ) -> RunDriver:
        """The SSE body of an admitted run (a WSGI iterable with ``close()``); ``client_gone``
        and ``client_watch``, when the server offers them, tell the run its client hung up
        while it waits (``run.client_watch``)."""
        machine = RunMachine(
            admission.run_input,
            mode=admission.mode,
            record=admission.record,
            language=admission.language,
            parts=admission.parts,
            interrupt_ttl_seconds=self.settings.interrupt_ttl_seconds,
            stale_task_id=admission.stale_task_id,
        )
        driver = RunDriver(self.services, admission, machine, client_gone, client_watch)
        self.live.opened(driver)
        return driver

    def run_ended(self, driver: RunDriver) -> None:
        """A run's body was closed: it leaves the live runs and gives its slot back."""
        self.live.ended(driver)

    def live_driver(self, thread_id: str) -> RunDriver | None:
        """This process's live run of the thread: the one holding it, else a guidance run."""
        return self.live.driver_of(thread_id)

    def live_runs(self) -> int:
        return self.live.count()

    # ------------------------------------------------------------------ shutdown
    def shut_down_runs(self, grace_seconds: float, flush_seconds: float = 5.0, *, hand_over: bool = False) -> int:
        """Graceful shutdown (``shutdown``): how many runs had to be ended or handed over."""
        return shut_down_runs(self.live, grace_seconds, flush_seconds, hand_over=hand_over)

    # ------------------------------------------------------------------ cancel
    def cancel_execution(self, thread_id: str, ros_invocation_id: str, execution_id: str) -> str:
        """The cancel extension: ``cancelled`` or ``already_terminal``; else EXECUTION_NOT_FOUND."""
        return self._cancellation.cancel_execution(thread_id, ros_invocation_id, execution_id)
