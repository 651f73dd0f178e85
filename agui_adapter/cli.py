"""Start-up: command line, logging, kernel, and the threaded HTTP/1.1 server (``http.server``).

``python run.py`` (or the ``agui-adapter`` command) ends up in ``main``. One log line
says where the adapter listens and which kernel it uses; Ctrl-C (or SIGTERM) stops
the server and any kernel child it started. With ``--thread-retention-days`` a daemon
thread prunes idle thread records at start-up and hourly (``retention.py``).

Under systemd (``Type=notify``) the adapter says ``READY=1`` once its port listens, its
kernel is chosen and its own ``/health`` answered, ``STOPPING=1`` on SIGTERM (or an idle
shutdown), and pings the watchdog while its server answers ``/health`` (``sdnotify.py``).
At start it raises its open-file limit (``fdlimit.py``) and sizes the garbage collector's
youngest generation for batches of kernel frames (``collector.py``). Upstream's ``iac-code agui``
flags are accepted with upstream's meaning: ``--idle-shutdown`` (``idle.py``),
``-d/--debug`` (``--log-level debug``) and ``--log-stdout/--no-log-stdout``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from agui_adapter import __version__
from agui_adapter.config import (
    CONFIG_ENV,
    ENV_NAMES,
    KERNEL_CHOICES,
    LOG_FORMATS,
    LOG_LEVELS,
    ON_SHUTDOWN_CHOICES,
    ConfigError,
    Settings,
    load_settings,
)
from agui_adapter.http.server import ServerLimits, WSGIServer
from agui_adapter.kernel_client.a2a import KernelClient
from agui_adapter.kernel_client.calls import KernelCalls
from agui_adapter.kernel_client.launch import KernelProcess, KernelStartError, start_kernel
from agui_adapter.ops import collector, fdlimit, idle, logs, sdnotify, state_gauges
from agui_adapter.ops.metrics import Metrics
from agui_adapter.ops.tracing import Tracing, from_environment
from agui_adapter.protocol.decode_budget import DECODES, map_large_allocations
from agui_adapter.run.engine import RunEngine
from agui_adapter.state.retention import start_retention
from agui_adapter.state.store import StoreError, ThreadStore
from agui_adapter.web.app import AguiApp

log = logging.getLogger("agui_adapter")


#: ``agui_build_info{kernel}``: what ``KernelProcess.kind`` means to an operator.
def build_app(
    settings: Settings,
    kernel: KernelProcess,
    *,
    tracing: Tracing | None = None,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
) -> AguiApp:
    """The WSGI application for these settings, talking to ``kernel``; tracing as the
    environment says (``tracing.from_environment``) unless given; ``clock`` is the runs' wall
    clock (interrupt expiry, timestamps), ``monotonic`` the clock of their disconnect grace
    period, fake ones in tests."""
    client = KernelClient(kernel.url, kernel.token or None)
    store = ThreadStore(settings.resolved_state_dir())
    store.recover()  # before anything reads a record: what a power cut took from a dead process
    store.use_log()
    metrics = Metrics.for_environment(kernel_health=lambda: client.health(timeout=2.0))
    tracing = tracing if tracing is not None else from_environment()
    client.calls = KernelCalls(metrics, tracing)
    engine = RunEngine(store, client, settings, clock=clock, monotonic=monotonic, metrics=metrics, tracing=tracing)
    metrics.describe(__version__, kernel.health_kind, settings.max_runs)
    metrics.watch_state(
        lambda: state_gauges.pending_interrupts(store.threads_dir, time.time()),
        lambda: state_gauges.journal_bytes(engine.journals.root),
    )
    store.on_write = _state_write_observer(metrics, tracing)
    DECODES.configure(settings.image_decode_budget_pixels)
    map_large_allocations()
    language = settings.default_language
    return AguiApp(engine, auth_token=settings.auth_token, default_language=language, kernel_kind=kernel.health_kind)


def shut_down_open_runs(app: AguiApp, settings: Settings, kernel: KernelProcess) -> int:
    """The runs still open when the process stops gracefully (SIGTERM to ``python run.py``, or
    to a WSGI server's worker: ``wsgi``): they get ``shutdown_grace_seconds`` to end, then
    are handed over (``--on-shutdown handover``, when the kernel outlives this process: the
    next process adopts them) or ended. How many were handed over or ended."""
    app.engine.adoption.stop()  # a run adopted now would be orphaned again as the process exits
    hand_over = settings.on_shutdown_mode() == "handover" and kernel.process is None  # it outlives us
    if settings.on_shutdown == "handover" and not hand_over:
        log.info("on_shutdown handover: the kernel stops with the adapter, so open runs are ended")
    ended = app.engine.shut_down_runs(settings.shutdown_grace_seconds, hand_over=hand_over)
    if ended:
        log.info("%s %d open run(s) at shutdown", "handed over" if hand_over else "ended", ended)
    return ended


def _state_write_observer(metrics: Metrics, tracing: Tracing) -> Callable[[float, bool], None]:
    """What the store tells of each write: its latency to the metrics, a span when tracing."""
    if not tracing.enabled:
        return metrics.state_written

    def written(seconds: float, durable: bool) -> None:
        metrics.state_written(seconds, durable)
        end = time.time_ns()
        tracing.interval("agui.state_write", end - int(seconds * 1e9), end, durable=durable)

    return written


def server_limits(settings: Settings) -> ServerLimits:
    """The HTTP server's timeouts and connection limit from the settings."""
    return ServerLimits(
        keepalive_timeout=settings.keepalive_timeout_seconds,
        request_timeout=settings.request_timeout_seconds,
        send_timeout=settings.send_timeout_seconds,
        max_connections=settings.max_connections,
    )


def configure_logging(level: str, log_format: str = "text", stdout: bool = False) -> None:
    """Root logging at ``level``, as text lines or JSON lines (``logs.py``), on stderr, or
    on stdout with ``stdout`` (upstream's ``--log-stdout``)."""
    logs.configure(level, log_format)
    if stdout:
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr:
                handler.setStream(sys.stdout)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="agui-adapter",
        description="AG-UI front door for the iac-code A2A kernel (flags > env > config file > defaults).",
    )
    parser.add_argument("--version", action="version", version=f"agui-adapter {__version__}")
    parser.add_argument("--config", help="INI config file, or upstream's flat YAML one")
    parser.add_argument("--host", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", help="listen port (default 8000; 0 picks a free one)")
    parser.add_argument("--a2a-url", dest="a2a_url", help="URL of a running kernel (loopback)")
    parser.add_argument("--a2a-token", dest="a2a_token", help="bearer token of that kernel")
    parser.add_argument("--auth-token", dest="auth_token", help="bearer token clients must send")
    parser.add_argument("--state-dir", dest="state_dir", help="state directory (default $IAC_CODE_CONFIG_DIR/agui)")
    parser.add_argument("--kernel", choices=KERNEL_CHOICES, help="which kernel to start when no URL is given")
    parser.add_argument("--heartbeat-seconds", dest="heartbeat_seconds", help="SSE heartbeat interval (15)")
    parser.add_argument("--interrupt-ttl-seconds", dest="interrupt_ttl_seconds", help="interrupt lifetime (86400)")
    parser.add_argument(
        "--thread-retention-days",
        dest="thread_retention_days",
        help="delete thread records idle for longer than this many days (default 0 = keep for ever)",
    )
    parser.add_argument("--default-language", dest="default_language", help="fallback language (en)")
    parser.add_argument("--log-level", dest="log_level", choices=LOG_LEVELS, help="info by default")
    parser.add_argument(
        "-d", "--debug", action="store_true", default=None, help="same as --log-level debug (upstream's flag)"
    )
    parser.add_argument(
        "--log-stdout",
        dest="log_stdout",
        action=argparse.BooleanOptionalAction,
        help="log to stdout instead of stderr (upstream's flag; default --no-log-stdout)",
    )
    parser.add_argument(
        "--idle-shutdown",
        dest="idle_shutdown",
        metavar="SECONDS",
        help="exit after this long with no run active and no interrupt pending (default 0 = never)",
    )
    parser.add_argument("--log-format", dest="log_format", choices=LOG_FORMATS, help="text (default) or json lines")
    parser.add_argument(
        "--access-log",
        dest="access_log",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one log line per request (default on)",
    )
    parser.add_argument(
        "--keepalive-timeout-seconds", dest="keepalive_timeout_seconds", help="idle keep-alive connection lifetime (5)"
    )
    parser.add_argument(
        "--request-timeout-seconds", dest="request_timeout_seconds", help="deadline for a whole request to arrive (30)"
    )
    parser.add_argument(
        "--send-timeout-seconds", dest="send_timeout_seconds", help="a client not reading for this long is gone (60)"
    )
    parser.add_argument("--max-connections", dest="max_connections", help="connections served at once (1024)")
    parser.add_argument(
        "--shutdown-grace-seconds", dest="shutdown_grace_seconds", help="time open runs get on SIGTERM (10)"
    )
    parser.add_argument("--cors-origins", dest="cors_origins", help="browser origins allowed (comma-separated, or *)")
    parser.add_argument("--max-runs", dest="max_runs", help="concurrent runs per process (256)")
    parser.add_argument(
        "--image-decode-budget-pixels",
        dest="image_decode_budget_pixels",
        help="image pixels decoded at once per process (40000000); beyond: a short wait, then 503",
    )
    parser.add_argument(
        "--disconnect-grace-seconds",
        dest="disconnect_grace_seconds",
        help="how long a run goes on after its client left, waiting for a reattach (0 = cancel at once)",
    )
    parser.add_argument(
        "--replay-retention-seconds",
        dest="replay_retention_seconds",
        help="how long a run's events stay replayable after it ended (300)",
    )
    parser.add_argument(
        "--replay-buffer-bytes", dest="replay_buffer_bytes", help="bytes of a run's events kept for replay (4 MiB)"
    )
    parser.add_argument(
        "--on-shutdown",
        dest="on_shutdown",
        choices=ON_SHUTDOWN_CHOICES,
        help="runs still open after the shutdown grace: handover (default with --a2a-url) or cancel",
    )
    _name_environment_variables(parser)
    return parser.parse_args(argv)


def _name_environment_variables(parser: argparse.ArgumentParser) -> None:
    """``--help`` names each flag's environment variable (as upstream's typer help does)."""
    for action in parser._actions:  # noqa: SLF001 - argparse has no public list of its actions
        env = CONFIG_ENV if action.dest == "config" else ENV_NAMES.get(action.dest)
        if action.dest == "debug":
            env = ENV_NAMES["log_level"] + "=debug"
        if env:
            action.help = f"{action.help or ''} [env {env}]".strip()


def _waiting_threads(store: ThreadStore, thread_ids: list[str]) -> list[str]:
    """Those of ``thread_ids`` whose record has an interrupt that can still be answered."""
    waiting = []
    for thread_id in thread_ids:
        try:
            record = store.load(thread_id)
        except StoreError:
            continue  # unreadable: it cannot be answered either
        if record is not None and record.execution.waiting:
            waiting.append(thread_id)
    return waiting


def _health_probe(host: str, port: int, timeout: float) -> bool:
    """``HEAD /health`` answered 200 on the adapter's own port: its accept loop and a
    connection thread work (what the watchdog vouches for)."""
    import http.client

    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("HEAD", "/health", headers={"User-Agent": "agui-adapter-watchdog"})
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def announce_ready(notifier: sdnotify.Notifier, healthy: Any, status: str, deadline: float = 60.0) -> None:
    """``READY=1`` once ``healthy()`` (the server answered its own ``/health``): from a thread,
    since the server loop that answers runs in the caller's thread right after."""
    if not notifier.enabled:
        return

    def wait_then_notify() -> None:
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if healthy():
                notifier.ready(status)
                return
            time.sleep(0.01)
        log.warning("the server did not answer its own /health within %gs: not ready", deadline)

    threading.Thread(target=wait_then_notify, name="sd-ready", daemon=True).start()


def start_watchdog(notifier: sdnotify.Notifier, healthy: Any) -> threading.Event:
    """Ping systemd's watchdog every ``$WATCHDOG_USEC``/2 while ``healthy()``; set the event to stop."""
    stop = threading.Event()
    interval = notifier.watchdog_interval
    if interval is None:
        return stop

    def loop() -> None:
        while not stop.wait(interval):
            if healthy():
                notifier.watchdog()
            else:
                log.warning("the server did not answer its own /health: no watchdog ping")

    threading.Thread(target=loop, name="sd-watchdog", daemon=True).start()
    return stop


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    flags: dict[str, Any] = {k: v for k, v in vars(args).items() if k not in ("config", "debug")}
    if args.debug and args.log_level is None:
        flags["log_level"] = "debug"
    try:
        settings = load_settings(flags, config_path=args.config)
    except ConfigError as exc:
        print(f"agui-adapter: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format, settings.log_stdout)
    log.debug("settings: %r", settings)  # the tokens are not part of its repr
    fdlimit.check(settings.max_connections, settings.max_runs)
    collector.tune()
    notifier = sdnotify.Notifier()
    try:
        kernel = start_kernel(settings)
    except (KernelStartError, ValueError) as exc:
        print(f"agui-adapter: cannot start the kernel: {exc}", file=sys.stderr)
        return 1
    try:
        app = build_app(settings, kernel)
        server = WSGIServer(settings.host, settings.port, app, server_limits(settings))
    except Exception as exc:  # noqa: BLE001 - report and stop the kernel
        kernel.stop()
        print(f"agui-adapter: cannot start: {exc}", file=sys.stderr)
        return 1
    stopping, stopped = threading.Event(), threading.Event()

    def graceful_stop() -> None:
        """No new connections; open runs get the grace period, then a final event; then stop."""
        try:
            server.stop_accepting()
            shut_down_open_runs(app, settings, kernel)
            server.wait_idle(2.0)
            server.shutdown()
        finally:
            stopped.set()

    def stop(signum: int, _frame: Any) -> None:
        if not stopping.is_set():
            stopping.set()
            notifier.stopping()
            if signum:
                log.info("stopping (signal %d): open runs get %ss", signum, settings.shutdown_grace_seconds)
            threading.Thread(target=graceful_stop, name="graceful-stop", daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    host, port = server.server_address[:2]
    log.info(
        "agui-adapter %s listening on http://%s:%s/ (kernel: %s at %s, state: %s)",
        __version__,
        host,
        port,
        kernel.kind,
        kernel.url,
        settings.resolved_state_dir(),
    )
    retention = start_retention(settings)
    watchdog = start_watchdog(
        notifier, lambda: not stopping.is_set() and _health_probe(host, port, notifier.watchdog_interval or 1.0)
    )
    idle_monitor = (
        idle.start_monitor(
            settings.idle_shutdown,
            app.engine.idle,
            app.engine.live_runs,
            lambda ids: _waiting_threads(app.engine.store, ids),
            lambda: stop(0, None),
        )
        if settings.idle_shutdown > 0
        else None
    )
    announce_ready(
        notifier,
        lambda: not stopping.is_set() and _health_probe(host, port, 1.0),
        f"listening on {host}:{port}, kernel {kernel.kind}",
    )
    try:
        server.serve_forever()
        if stopping.is_set():
            stopped.wait(settings.shutdown_grace_seconds + 10)
    finally:
        watchdog.set()
        if idle_monitor is not None:
            idle_monitor.set()
        if retention is not None:
            retention.stop()
        server.server_close()
        kernel.stop()
        log.info("agui-adapter stopped")
    return 0
