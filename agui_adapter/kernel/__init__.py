"""The embedded kernel: a scripted A2A runtime that speaks the iac-code dialect.

The adapter always reaches its kernel over JSON-RPC/SSE on loopback. When the
real iac-code runtime is not installed (``python run.py`` out of the box), and
for the fast tests and the throughput benchmarks, this package provides a
deterministic stand-in that produces the same wire shapes as iac-code 0.16.0.
It is a real HTTP server, not an in-process shortcut, so the adapter's A2A
client path is exercised exactly as in production.

``ScriptedKernel`` starts it in a daemon thread; ``python -m agui_adapter.kernel``
runs it as a process. The scripts (chosen by directives such as ``[WRITE]`` in
the user text) are documented in :mod:`agui_adapter.kernel.scripted`, including
pipeline mode (``iac_code.run_mode: "pipeline"``: envelopes, batches, the journal
behind ``/iac-code/pipeline/state`` and the ``[PIPE-...]`` directives).
"""

from agui_adapter.kernel.scripted import (
    A2A_VERSION,
    Directives,
    KernelState,
    RpcError,
    ScriptedKernel,
    ScriptedKernelApp,
    create_app,
)

__all__ = [
    "A2A_VERSION",
    "Directives",
    "KernelState",
    "RpcError",
    "ScriptedKernel",
    "ScriptedKernelApp",
    "create_app",
]
