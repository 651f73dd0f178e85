"""The adapter's Prometheus metrics, and their text exposition for ``GET /metrics``.

Operators alert on numbers, not on log lines: how many runs are open and how many may be,
how runs end (success, interrupt, error, abandoned) and with which error codes, how long
they take by run mode (turn, resume, guidance, pipeline) and outcome, what the HTTP edge
answers and how many connections it holds, how many events go out, whether the kernel is
up and how each of its A2A methods answers (latency, errors by kind), how long a thread
state write takes, how many interrupts wait for an answer, how many runs go on without a
client, how much the run journals weigh, and which build runs. This module owns those
series and nothing else; the places that see the facts (``run.driver``, ``run.engine``, ``web.app``,
``kernel_client.calls``, the store's write hook, the built-in server's connection count) call one
method each.

Two backends behind one ``Metrics`` object, with the same series:

- **one process** (the default): a small thread-safe registry of our own (counters,
  gauges, histograms). A scrape renders it through prometheus_client's ``CollectorRegistry``
  when the optional ``metrics`` extra is installed (imported at the first scrape, not at
  start), with its process, platform and GC collectors (``process_*``, ``python_info``,
  ``python_gc_*``); without the package it is rendered here in the Prometheus text format
  0.0.4, with ``process_*`` and ``python_info`` read the way prometheus_client reads them
  (``/proc/self``). Correct for one process: ``python run.py``, or a WSGI server with a
  single worker process.
- **prometheus_client in multiprocess mode**, chosen when ``PROMETHEUS_MULTIPROC_DIR``
  names a directory and ``prometheus_client`` is installed: every worker process writes its
  values to files in that directory, and a scrape answered by any worker adds up all of
  them (gunicorn ``-w N``). The gauges of live things (runs active, their limit, detached
  runs) sum the live workers only (``livesum``; gunicorn's ``child_exit`` hook should call
  ``prometheus_client.multiprocess.mark_process_dead``). As prometheus_client documents,
  per-process collectors do not apply there: no ``process_*`` series. Without the package
  the built-in registry is used and a warning says that each worker then reports only
  itself.

Some values are read when scraped, never stored (the same in both modes, from the process
that answers): ``agui_kernel_up`` (the kernel's health, cached ``KERNEL_UP_TTL`` seconds so
that scrapes stay cheap and cannot flood the kernel), ``agui_interrupts_pending`` and
``agui_journal_bytes`` (read from the shared state directory, cached ``STATE_TTL`` seconds:
right whichever worker answers), ``agui_connections_open``/``agui_connections_max`` (only
under the built-in server, which hands its count over with ``watch_connections``: other
WSGI servers do not say, and the series is then absent), and ``agui_build_info``.
The hot path (events sent) is one counter add per written chunk, never per event.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

log = logging.getLogger("agui_adapter.ops.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
KERNEL_UP_TTL = 5.0
STATE_TTL = 15.0

OUTCOMES = ("success", "interrupt", "error", "abandoned")
MODES = ("turn", "resume", "guidance", "pipeline")
FIRST_EVENT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DURATION_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
KERNEL_CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
STATE_WRITE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

# name, help; the label names and kinds are given where the series are made (``Metrics``)
RUNS_ACTIVE = ("agui_runs_active", "Runs whose SSE response is open.")
RUNS_MAX = ("agui_runs_max", "Runs that may be open at once (--max-runs; summed over the worker processes).")
RUNS_DETACHED = (
    "agui_runs_detached",
    "Runs going on without their own client (disconnect grace, or other readers still following them).",
)
RUNS = ("agui_runs_total", "Runs that ended, by outcome (success, interrupt, error, abandoned).")
RUN_ERRORS = ("agui_run_errors_total", "Runs that ended with RUN_ERROR, by error code.")
HTTP_REQUESTS = ("agui_http_requests_total", "HTTP requests answered, by route (endpoint name) and status.")
EVENTS_SENT = ("agui_events_sent_total", "AG-UI events written to SSE streams.")
KERNEL_UP = ("agui_kernel_up", "1 when the kernel answers its health check (cached a few seconds), else 0.")
FIRST_EVENT = (
    "agui_run_first_event_seconds",
    "Seconds from a run's admission to its first event after RUN_STARTED (the kernel's first answer), "
    "by run mode and outcome.",
)
RUN_DURATION = ("agui_run_duration_seconds", "Seconds from a run's admission to its end, by run mode and outcome.")
DISCONNECTS = ("agui_sse_clients_disconnected_total", "SSE clients that went away before their run ended.")
REATTACHES = ("agui_reattaches_total", "Streams of a run opened again with Last-Event-ID or GET .../events.")
ADOPTIONS = ("agui_runs_adopted_total", "Runs taken over from an adapter process that died or handed them over.")
KERNEL_CALLS = (
    "agui_kernel_call_seconds",
    "Seconds an A2A call to the kernel takes, by method (a stream: until its answer starts).",
)
KERNEL_ERRORS = ("agui_kernel_call_errors_total", "A2A calls to the kernel that failed, by method and kind.")
STATE_WRITES = ("agui_state_write_seconds", "Seconds one thread state write takes (durable: fsync included).")
INTERRUPTS_PENDING = ("agui_interrupts_pending", "Interrupts waiting for an answer (read from the state directory).")
JOURNAL_BYTES = ("agui_journal_bytes", "Bytes of run journals (reattach buffers) in the state directory.")
CONNECTIONS_OPEN = ("agui_connections_open", "Connections open on the built-in server (reserve included).")
CONNECTIONS_MAX = ("agui_connections_max", "Connections the built-in server serves at once (--max-connections).")
BUILD_INFO = ("agui_build_info", "The adapter's version and the kind of kernel it talks to (always 1).")
PROCESS_THREADS = ("agui_process_threads", "Python threads of this process.")

#: A value read at scrape time: (name, help, [(labels, value), ...]), rendered as a gauge.
Reading = tuple[str, str, list[tuple[dict[str, str], float]]]


# ====================================================================== the built-in registry
def _number(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    if value == float("-inf"):
        return "-Inf"
    return repr(float(value))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _labels(names: Sequence[str], values: Sequence[str], extra: tuple[str, str] | None = None) -> str:
    pairs = list(zip(names, values, strict=True))
    if extra is not None:
        pairs.append(extra)
    if not pairs:
        return ""
    return "{" + ",".join(f'{name}="{_escape_label(value)}"' for name, value in pairs) + "}"


class _Value:
    """One counter or gauge value."""

    __slots__ = ("_lock", "value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value -= amount

    def set(self, value: float) -> None:
        with self._lock:
            self.value = float(value)

    def samples(self, name: str, labels: str) -> list[str]:
        return [f"{name}{labels} {_number(self.value)}"]


class _Buckets:
    """One histogram: counts per bucket (not cumulative until rendered), sum and count."""

    __slots__ = ("_bounds", "_counts", "_lock", "_sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._lock = threading.Lock()
        self._bounds = list(bounds)
        self._counts = [0] * (len(self._bounds) + 1)  # the last one is +Inf
        self._sum = 0.0

    def observe(self, amount: float) -> None:
        index = bisect.bisect_left(self._bounds, amount)
        with self._lock:
            self._counts[index] += 1
            self._sum += amount

    def cumulative(self) -> tuple[list[tuple[float, float]], float]:
        """(upper bound, cumulative count) per bucket, +Inf last, and the sum."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        buckets, running = [], 0
        for bound, count in zip([*self._bounds, float("inf")], counts, strict=True):
            running += count
            buckets.append((bound, float(running)))
        return buckets, total

    def samples(self, name: str, names: Sequence[str], values: Sequence[str]) -> list[str]:
        buckets, total = self.cumulative()
        lines = [f"{name}_bucket{_labels(names, values, ('le', _number(b)))} {_number(c)}" for b, c in buckets]
        lines.append(f"{name}_sum{_labels(names, values)} {_number(total)}")
        lines.append(f"{name}_count{_labels(names, values)} {_number(buckets[-1][1])}")
        return lines


class _Family:
    """A metric and its labelled children, prometheus_client-style (``labels(...).inc()``)."""

    def __init__(self, kind: str, name: str, documentation: str, labelnames: Sequence[str] = (), **options: Any):
        self.kind, self.name, self.documentation = kind, name, documentation
        self.labelnames = tuple(labelnames)
        self._buckets: tuple[float, ...] = tuple(options.get("buckets", ()))
        self._lock = threading.Lock()
        self._children: dict[tuple[str, ...], Any] = {}
        if not self.labelnames:
            self._default = self.labels()

    def _new_child(self) -> Any:
        return _Buckets(self._buckets) if self.kind == "histogram" else _Value()

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)  # the label values are strings already, as a rule
        if child is not None:
            return child
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            if len(key) != len(self.labelnames):
                raise ValueError(f"{self.name} takes the labels {self.labelnames}")
            with self._lock:
                child = self._children.setdefault(key, self._new_child())
        return child

    # unlabelled metrics are used directly
    def inc(self, amount: float = 1.0) -> None:
        self._default.inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self._default.dec(amount)

    def set(self, value: float) -> None:
        self._default.set(value)

    def observe(self, amount: float) -> None:
        self._default.observe(amount)

    def children(self) -> list[tuple[tuple[str, ...], Any]]:
        with self._lock:
            return sorted(self._children.items())

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {_escape_help(self.documentation)}", f"# TYPE {self.name} {self.kind}"]
        for values, child in self.children():
            if self.kind == "histogram":
                lines += child.samples(self.name, self.labelnames, values)
            else:
                lines += child.samples(self.name, _labels(self.labelnames, values))
        return lines


def _render_readings(readings: Iterable[Reading]) -> list[str]:
    lines: list[str] = []
    for name, documentation, samples in readings:
        lines += [f"# HELP {name} {_escape_help(documentation)}", f"# TYPE {name} gauge"]
        for labels, value in samples:
            lines.append(f"{name}{_labels(list(labels), list(labels.values()))} {_number(value)}")
    return lines


_client_installed: bool | None = None


def client_installed() -> bool:
    """Whether prometheus_client can be imported (asked once, without importing it)."""
    global _client_installed
    if _client_installed is None:
        import importlib.util

        _client_installed = importlib.util.find_spec("prometheus_client") is not None
    return _client_installed


class BuiltinRegistry:
    """The registry of one process (thread-safe). ``render`` goes through prometheus_client's
    registry when it is installed (``use_client``), else writes the text format here."""

    multiprocess = False

    def __init__(self, use_client: bool | None = None) -> None:
        self._families: list[_Family] = []
        self._use_client = use_client

    @property
    def uses_client(self) -> bool:
        return client_installed() if self._use_client is None else self._use_client

    def make(self, kind: str, name: str, documentation: str, labelnames: Sequence[str] = (), **options: Any) -> Any:
        family = _Family(kind, name, documentation, labelnames, **options)
        self._families.append(family)
        return family

    def render(self, readings: list[Reading]) -> bytes:
        if self.uses_client:
            return _render_with_client(self._families, readings)
        lines: list[str] = []
        for family in self._families:
            lines += family.render()
        lines += _render_readings([*readings, *process_readings()])
        return ("\n".join(lines) + "\n").encode("utf-8")


def _client_families(families: Sequence[_Family], readings: Iterable[Reading]) -> list[Any]:
    """Our families and readings as prometheus_client metric families."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    out: list[Any] = []
    for family in families:
        labels = list(family.labelnames)
        if family.kind == "counter":
            metric: Any = CounterMetricFamily(family.name, family.documentation, labels=labels)
        elif family.kind == "gauge":
            metric = GaugeMetricFamily(family.name, family.documentation, labels=labels)
        else:
            metric = HistogramMetricFamily(family.name, family.documentation, labels=labels)
        for values, child in family.children():
            if family.kind == "histogram":
                buckets, total = child.cumulative()
                metric.add_metric(list(values), [(_number(b), c) for b, c in buckets], total)
            else:
                metric.add_metric(list(values), child.value)
        out.append(metric)
    for name, documentation, samples in readings:
        names = list(samples[0][0]) if samples else []
        gauge = GaugeMetricFamily(name, documentation, labels=names)
        for labels, value in samples:
            gauge.add_metric([labels[n] for n in names], value)
        out.append(gauge)
    return out


class _Collected:
    """A prometheus_client collector handing over families made at scrape time."""

    def __init__(self, collect: Callable[[], list[Any]]) -> None:
        self.collect = collect


def _render_with_client(families: Sequence[_Family], readings: list[Reading]) -> bytes:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.gc_collector import GCCollector
    from prometheus_client.platform_collector import PlatformCollector
    from prometheus_client.process_collector import ProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    registry.register(_Collected(lambda: _client_families(families, readings)))  # type: ignore[arg-type]
    return bytes(generate_latest(registry))


# ------------------------------------------------------------------ process facts without prometheus_client
_TICKS: float | None = None
_PAGESIZE: int | None = None
_BOOT_TIME: float | None = None


def process_readings() -> list[Reading]:
    """``process_*`` and ``python_info`` as prometheus_client's collectors give them (Linux
    ``/proc``; nothing where there is none), read when scraped."""
    global _TICKS, _PAGESIZE, _BOOT_TIME
    readings: list[Reading] = []
    try:
        if _TICKS is None:
            _TICKS = float(os.sysconf("SC_CLK_TCK"))
            _PAGESIZE = os.sysconf("SC_PAGE_SIZE")
            with open("/proc/stat", "rb") as stat:
                for line in stat:
                    if line.startswith(b"btime "):
                        _BOOT_TIME = float(line.split()[1])
                        break
        with open("/proc/self/stat", "rb") as handle:
            parts = handle.read().split(b")")[-1].split()
        assert _PAGESIZE is not None
        readings += [
            ("process_virtual_memory_bytes", "Virtual memory size in bytes.", [({}, float(parts[20]))]),
            ("process_resident_memory_bytes", "Resident memory size in bytes.", [({}, float(parts[21]) * _PAGESIZE)]),
        ]
        if _BOOT_TIME is not None:
            started = float(parts[19]) / _TICKS + _BOOT_TIME
            help_text = "Start time of the process since unix epoch in seconds."
            readings.append(("process_start_time_seconds", help_text, [({}, started)]))
        cpu = (float(parts[11]) + float(parts[12])) / _TICKS
        readings.append(("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", [({}, cpu)]))
        fds = float(len(os.listdir("/proc/self/fd")))
        readings.append(("process_open_fds", "Number of open file descriptors.", [({}, fds)]))
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        readings.append(("process_max_fds", "Maximum number of open file descriptors.", [({}, float(soft))]))
    except (OSError, ValueError, IndexError, AssertionError):
        pass
    import platform  # only when scraped without prometheus_client

    major, minor, patch = platform.python_version_tuple()
    info = {
        "implementation": platform.python_implementation(),
        "major": major,
        "minor": minor,
        "patchlevel": patch,
        "version": platform.python_version(),
    }
    readings.append(("python_info", "Python platform information", [(info, 1.0)]))
    return readings


# ====================================================================== prometheus_client, multiprocess
class PrometheusMultiprocessRegistry:
    """prometheus_client's metrics in multiprocess mode: values live in files under
    ``PROMETHEUS_MULTIPROC_DIR``, and ``render`` collects those of every process."""

    multiprocess = True

    def __init__(self) -> None:
        import prometheus_client  # the optional ``metrics`` extra

        self._client = prometheus_client
        self._kinds = {
            "counter": prometheus_client.Counter,
            "gauge": prometheus_client.Gauge,
            "histogram": prometheus_client.Histogram,
        }

    def make(self, kind: str, name: str, documentation: str, labelnames: Sequence[str] = (), **options: Any) -> Any:
        if kind == "gauge":
            options.setdefault("multiprocess_mode", "livesum")
        # registry=None: the values are written to the directory; a scrape reads them all
        return self._kinds[kind](name, documentation, labelnames=tuple(labelnames), registry=None, **options)

    def render(self, readings: list[Reading]) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest, multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        if readings:
            registry.register(_Collected(lambda: _client_families((), readings)))  # type: ignore[arg-type]
        return bytes(generate_latest(registry))


class Registry(Protocol):
    multiprocess: bool

    def make(self, kind: str, name: str, documentation: str, labelnames: Sequence[str] = (), **options: Any) -> Any:
        """A metric with prometheus_client's interface (``labels``, ``inc``, ``dec``, ``set``, ``observe``)."""

    def render(self, readings: list[Reading]) -> bytes:
        """The text exposition of every series, and of the ``readings`` taken for this scrape."""


_multiprocess_metrics: Metrics | None = None
_multiprocess_lock = threading.Lock()


# ====================================================================== the adapter's metrics
class Cached:
    """A number read at most once per ``ttl`` seconds (a failing read keeps the last value)."""

    def __init__(self, read: Callable[[], float], ttl: float = STATE_TTL) -> None:
        self._read = read
        self._ttl = ttl
        self._lock = threading.Lock()
        self._value = 0.0
        self._until = float("-inf")

    def value(self) -> float:
        with self._lock:
            now = time.monotonic()
            if now >= self._until:
                try:
                    self._value = float(self._read())
                except Exception:  # noqa: BLE001 - a scrape never fails on one reading
                    log.warning("a metrics reading failed", exc_info=True)
                self._until = now + self._ttl
            return self._value


class KernelUpProbe(Cached):
    """The kernel's health as 1.0 / 0.0, asked at most once per ``ttl`` seconds; a probe
    that fails means down (where another reading keeps its last value)."""

    def __init__(self, health: Callable[[], bool], ttl: float = KERNEL_UP_TTL) -> None:
        def up() -> float:
            try:
                return 1.0 if health() else 0.0
            except Exception:  # noqa: BLE001 - a failing probe means down
                return 0.0

        super().__init__(up, ttl)


class Metrics:
    """Every series of the adapter; one instance per process (``for_environment``)."""

    def __init__(self, registry: Registry | None = None, kernel_health: Callable[[], bool] | None = None) -> None:
        self.registry: Registry = registry if registry is not None else BuiltinRegistry()
        self.kernel_up = KernelUpProbe(kernel_health) if kernel_health is not None else None
        make = self.registry.make
        self._runs_active = make("gauge", *RUNS_ACTIVE)
        self._runs_max = make("gauge", *RUNS_MAX)
        self._detached = make("gauge", *RUNS_DETACHED)
        self._runs = make("counter", *RUNS, labelnames=("outcome",))
        self._run_errors = make("counter", *RUN_ERRORS, labelnames=("code",))
        self._http = make("counter", *HTTP_REQUESTS, labelnames=("route", "status"))
        self._events = make("counter", *EVENTS_SENT)
        labels = ("mode", "outcome")
        self._first_event = make("histogram", *FIRST_EVENT, labelnames=labels, buckets=FIRST_EVENT_BUCKETS)
        self._duration = make("histogram", *RUN_DURATION, labelnames=labels, buckets=DURATION_BUCKETS)
        self._disconnects = make("counter", *DISCONNECTS)
        self._reattaches = make("counter", *REATTACHES)
        self._adoptions = make("counter", *ADOPTIONS)
        self._kernel_calls = make("histogram", *KERNEL_CALLS, labelnames=("method",), buckets=KERNEL_CALL_BUCKETS)
        self._kernel_errors = make("counter", *KERNEL_ERRORS, labelnames=("method", "kind"))
        self._state_writes = make("histogram", *STATE_WRITES, labelnames=("durable",), buckets=STATE_WRITE_BUCKETS)
        self._outcomes = {outcome: self._runs.labels(outcome) for outcome in OUTCOMES}  # all four exist at 0
        self._state_write = {True: self._state_writes.labels("true"), False: self._state_writes.labels("false")}
        self._build: dict[str, str] | None = None
        self._connections: tuple[Callable[[], int], int] | None = None
        self._pending: Cached | None = None
        self._journal: Cached | None = None

    @classmethod
    def for_environment(
        cls, kernel_health: Callable[[], bool] | None = None, env: dict[str, str] | None = None
    ) -> Metrics:
        """prometheus_client's multiprocess mode when ``PROMETHEUS_MULTIPROC_DIR`` is set
        (one instance per process, shared), else the built-in registry."""
        global _multiprocess_metrics
        env = dict(os.environ) if env is None else env
        directory = env.get(MULTIPROC_ENV, "")
        if not directory:
            return cls(kernel_health=kernel_health)
        if not os.path.isdir(directory):
            log.warning("%s is not a directory: metrics count this process only", MULTIPROC_ENV)
            return cls(kernel_health=kernel_health)
        with _multiprocess_lock:
            if _multiprocess_metrics is not None:
                return _multiprocess_metrics
            try:
                registry = PrometheusMultiprocessRegistry()
            except ImportError:
                log.warning(
                    "%s is set but prometheus_client is not installed (pip install agui-adapter[metrics]): "
                    "metrics count this process only",
                    MULTIPROC_ENV,
                )
                return cls(kernel_health=kernel_health)
            _multiprocess_metrics = cls(registry, kernel_health)
            return _multiprocess_metrics

    @property
    def multiprocess(self) -> bool:
        return self.registry.multiprocess

    # ------------------------------------------------------------------ what is configured
    def describe(self, version: str, kernel: str, max_runs: int) -> None:
        """``agui_build_info{version, kernel}`` and this process's share of ``agui_runs_max``."""
        self._build = {"version": version, "kernel": kernel}
        self._runs_max.set(max_runs)

    def watch_connections(self, count: Callable[[], int], limit: int) -> None:
        """The built-in server's open connections (read at scrape time) and its limit."""
        self._connections = (count, limit)

    def watch_state(self, pending_interrupts: Callable[[], float], journal_bytes: Callable[[], float]) -> None:
        """What the state directory holds, read at scrape time (cached ``STATE_TTL`` s)."""
        self._pending = Cached(pending_interrupts)
        self._journal = Cached(journal_bytes)

    # ------------------------------------------------------------------ what happened
    def run_opened(self) -> None:
        self._runs_active.inc()

    def run_closed(self) -> None:
        self._runs_active.dec()

    def run_detached(self) -> None:
        self._detached.inc()

    def detached_run_ended(self) -> None:
        self._detached.dec()

    def run_finished(
        self, outcome: str, code: str | None, seconds: float, mode: str = "turn", first_event: float | None = None
    ) -> None:
        """A run ended: its outcome, error code, duration and (when it had one) the time to
        its first event, both by mode and outcome."""
        counter = self._outcomes.get(outcome)
        (counter if counter is not None else self._runs.labels(outcome)).inc()
        if code:
            self._run_errors.labels(code).inc()
        self._duration.labels(mode, outcome).observe(seconds)
        if first_event is not None:
            self._first_event.labels(mode, outcome).observe(first_event)

    def first_event(self, seconds: float, mode: str = "turn", outcome: str = "success") -> None:
        self._first_event.labels(mode, outcome).observe(seconds)

    def events_sent(self, count: int) -> None:
        self._events.inc(count)

    def client_disconnected(self) -> None:
        self._disconnects.inc()

    def reattached(self) -> None:
        self._reattaches.inc()

    def adopted(self) -> None:
        self._adoptions.inc()

    def http_request(self, route: str, status: str) -> None:
        self._http.labels(route, status).inc()

    def kernel_call(self, method: str, seconds: float, error: str | None = None) -> None:
        """One A2A call (``error``: its kind when it failed)."""
        self._kernel_calls.labels(method).observe(seconds)
        if error is not None:
            self._kernel_errors.labels(method, error).inc()

    def state_written(self, seconds: float, durable: bool) -> None:
        self._state_write[bool(durable)].observe(seconds)

    # ------------------------------------------------------------------ the scrape
    def readings(self) -> list[Reading]:
        """The values read for this scrape (kernel up, state, connections, build, threads)."""
        out: list[Reading] = []
        if self.kernel_up is not None:
            out.append((*KERNEL_UP, [({}, self.kernel_up.value())]))
        if self._pending is not None:
            out.append((*INTERRUPTS_PENDING, [({}, self._pending.value())]))
        if self._journal is not None:
            out.append((*JOURNAL_BYTES, [({}, self._journal.value())]))
        if self._connections is not None:
            count, limit = self._connections
            out.append((*CONNECTIONS_OPEN, [({}, float(count()))]))
            out.append((*CONNECTIONS_MAX, [({}, float(limit))]))
        if self._build is not None:
            out.append((*BUILD_INFO, [(dict(self._build), 1.0)]))
        if not self.multiprocess:
            out.append((*PROCESS_THREADS, [({}, float(threading.active_count()))]))
        return out

    def render(self) -> bytes:
        """The text exposition of every series and of this scrape's readings."""
        return self.registry.render(self.readings())
