"""systemd's notification protocol (``sd_notify``), spoken without a dependency.

Why it exists: with ``Type=notify`` systemd considers the service started only when it
says ``READY=1``, so units ordered after the adapter start once its port listens and its
kernel is chosen, not merely once the process exists; ``STOPPING=1`` tells systemd the
stop it sees is deliberate; ``WATCHDOG=1`` pings, at half the ``WatchdogSec=`` the unit sets
(``$WATCHDOG_USEC``), let systemd restart an adapter whose server loop hangs. The protocol
is one datagram per message to the AF_UNIX socket named by ``$NOTIFY_SOCKET`` (a path, or
an abstract address written with a leading ``@``), as ``sd_notify(3)`` describes; a few
lines of ``socket`` rather than the ``systemd`` or ``sdnotify`` packages.

The parsing of the environment is pure (``address``, ``watchdog_interval``); ``Notifier``
does the sending. Without ``$NOTIFY_SOCKET`` (not under systemd, or ``Type=simple``) every
call is a no-op. A failed send is logged once and otherwise ignored: systemd's own client
library does the same, and the adapter must keep serving.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger("agui_adapter.ops.sdnotify")


def address(env: Mapping[str, str]) -> str | bytes | None:
    """Where to send, from ``$NOTIFY_SOCKET``: a filesystem path, an abstract address
    (bytes starting with NUL, from ``@name``), or None when notifications are off."""
    value = env.get("NOTIFY_SOCKET", "")
    if value.startswith("@"):
        return b"\0" + value[1:].encode("utf-8")
    if value.startswith("/"):
        return value
    return None  # unset, or a vsock address (``vsock:``), which the adapter does not speak


def watchdog_interval(env: Mapping[str, str], pid: int | None = None) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings: half of ``$WATCHDOG_USEC`` (as ``sd_watchdog_enabled(3)``
    advises), or None when the watchdog is off or meant for another process (``$WATCHDOG_PID``)."""
    usec = env.get("WATCHDOG_USEC", "")
    owner = env.get("WATCHDOG_PID", "")
    if owner and owner != str(os.getpid() if pid is None else pid):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2 / 1_000_000 if value > 0 else None


class Notifier:
    """Sends ``KEY=value`` messages to systemd; a no-op without ``$NOTIFY_SOCKET``."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.address = address(env)
        self.watchdog_interval = watchdog_interval(env)
        self._failed = False

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *fields: str) -> bool:
        """Send one datagram of ``fields`` (e.g. ``"READY=1"``, ``"STATUS=..."``); True if sent."""
        if self.address is None:
            return False
        payload = "\n".join(fields).encode("utf-8")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(payload, self.address)
        except OSError as exc:
            if not self._failed:
                self._failed = True
                log.warning("cannot notify systemd at $NOTIFY_SOCKET: %s", exc)
            return False
        return True

    def ready(self, status: str = "") -> bool:
        return self.notify("READY=1", *((f"STATUS={status}",) if status else ()))

    def stopping(self, status: str = "") -> bool:
        return self.notify("STOPPING=1", *((f"STATUS={status}",) if status else ()))

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")
