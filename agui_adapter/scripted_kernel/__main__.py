"""Run the scripted kernel as its own process: ``python -m agui_adapter.scripted_kernel``.

Why: a separate process is how ``run.py`` and out-of-process benchmarks use the
kernel, exactly like the real ``iac-code a2a``. The one stdout line
``READY <base url>`` tells the parent which port was bound (``--port 0`` picks
a free one); the process serves until SIGTERM or SIGINT and then exits 0, after
saving its sessions (``--state-dir``) and removing its temporary folders.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from types import FrameType

from agui_adapter.scripted_kernel.loopback import ScriptedKernel


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agui_adapter.scripted_kernel",
        description="Deterministic A2A 1.0 JSON-RPC kernel speaking the iac-code dialect.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one")
    parser.add_argument("--token", default=None, help="require 'Authorization: Bearer <token>'")
    parser.add_argument(
        "--token-env",
        default=None,
        help="read the token from this environment variable (keeps it off the command line)",
    )
    parser.add_argument(
        "--delay-scale",
        type=float,
        default=1.0,
        help="multiplier for [SLOW]/[SILENT] delays",
    )
    parser.add_argument(
        "--keepalive-seconds",
        type=float,
        default=15.0,
        help="send ': ping' after this many idle seconds on a stream (<= 0 disables)",
    )
    parser.add_argument("--log-requests", action="store_true", help="log each HTTP request to stderr")
    parser.add_argument(
        "--state-dir",
        default=None,
        help="keep sessions in this directory so a restart continues them (default: forget them on exit)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    token = args.token or (os.environ.get(args.token_env) if args.token_env else None)
    kernel = ScriptedKernel(
        token or None,
        delay_scale=args.delay_scale,
        keepalive_seconds=args.keepalive_seconds,
        log_requests=args.log_requests,
        state_dir=args.state_dir,
    )
    try:
        url = kernel.start(args.host, args.port)
    except OSError as exc:
        print(
            f"scripted kernel: cannot bind {args.host}:{args.port}: {exc}",
            file=sys.stderr,
        )
        return 2
    sys.stdout.write(f"READY {url}\n")
    sys.stdout.flush()
    try:
        while not stop.wait(0.2):
            pass
    finally:
        kernel.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
