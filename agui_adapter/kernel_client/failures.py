"""How a call to the kernel fails, as plain values: refused (a JSON-RPC error) or unavailable.

Why a module: the client (``a2a``) raises them and the run machine reads them (``rpc_code``,
``detail``, ``kind``), so they live apart from the client's I/O: the pure layer imports this
module and nothing else of ``kernel_client`` (``tests/unit/test_layers.py``).
"""

from __future__ import annotations

from typing import Any


class KernelRejected(Exception):
    """The kernel answered with a JSON-RPC error object (``rpc_code``, ``detail``, ``data``)."""

    kind = "rejected"

    def __init__(self, error: dict[str, Any]) -> None:
        self.error = error if isinstance(error, dict) else {}
        message = self.error.get("message")
        self.detail = message if isinstance(message, str) else "JSON-RPC error"
        self.rpc_code = self.error.get("code")
        super().__init__(f"{self.rpc_code}: {self.detail}")

    @property
    def data(self) -> Any:
        return self.error.get("data")


class KernelUnavailable(Exception):
    """The kernel could not be reached, or answered with an HTTP error.

    ``kind`` says how (``kernel_client.calls``): connection, timeout, http_status, bad_answer."""

    def __init__(self, message: str, kind: str = "connection") -> None:
        super().__init__(message)
        self.kind = kind
