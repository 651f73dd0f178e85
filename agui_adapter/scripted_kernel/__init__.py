"""The embedded kernel: a scripted A2A runtime that speaks the iac-code dialect.

The adapter always reaches its kernel over JSON-RPC/SSE on loopback. When the
real iac-code runtime is not installed (``python run.py`` out of the box), and
for the fast tests and the throughput benchmarks, this package provides a
deterministic stand-in that produces the same wire shapes as iac-code 0.16.0.
It is a real HTTP server, not an in-process shortcut, so the adapter's A2A
client path is exercised exactly as in production.

``ScriptedKernel`` starts it in a daemon thread; ``python -m agui_adapter.scripted_kernel``
runs it as a process. README.md beside this file is its manual: the wire
surface, the directives that choose a script (such as ``[WRITE]``), pipeline
mode, and which module owns what.
"""

from agui_adapter.scripted_kernel.directives import Directives
from agui_adapter.scripted_kernel.jsonrpc import ScriptedKernelApp, create_app
from agui_adapter.scripted_kernel.loopback import ScriptedKernel
from agui_adapter.scripted_kernel.tasks import KernelState
from agui_adapter.scripted_kernel.wire import A2A_VERSION, RpcError

__all__ = [
    "A2A_VERSION",
    "Directives",
    "KernelState",
    "RpcError",
    "ScriptedKernel",
    "ScriptedKernelApp",
    "create_app",
]
