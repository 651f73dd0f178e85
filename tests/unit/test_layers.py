"""The folders are the layers: which layer may import which, and what the pure modules may not
touch. The map is the README's ("a map of the package"); a new import across layers that this
table does not allow is a design change, to be made here on purpose."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import agui_adapter

PACKAGE = Path(agui_adapter.__file__).parent

#: Layer -> the other layers it may import (the package root's names and ``config`` aside
#: where listed). ``cli`` and ``wsgi`` are the ways in: they may import anything.
ALLOWED: dict[str, set[str]] = {
    "scripted_kernel": set(),  # a separate program: nothing of the adapter
    "protocol": set(),
    "ops": {"protocol"},
    "http": {"ops"},
    "config": {"protocol", "flatyaml"},
    "flatyaml": set(),
    "state": {"protocol", "ops", "config"},
    "kernel_client": {"http", "ops", "config"},
    "run": {"protocol", "state", "kernel_client", "ops", "config"},
    "web": {"http", "kernel_client", "ops", "protocol", "run", "state", "config"},
}

#: The one module of ``http`` the kernel client may use: the chunked decoding of HTTP/1.1,
#: shared wire rules (sans-I/O), not the server.
KERNEL_CLIENT_FROM_HTTP = {"agui_adapter.http.rules"}

#: The run's sans-I/O modules (README, design card): no sockets, files, threads or clocks.
PURE_RUN = {
    "answers", "context", "effects", "endings", "gap_artifacts", "history", "identity", "interrupts", "loop",
    "machine", "outbound", "pipeline_progress", "pipeline_state", "process_gone", "reconcile", "resume",
    "resume_replies", "resume_steps", "stream_end", "task_lost", "transitions", "translation", "usage",
}  # fmt: skip
#: What of the adapter the pure modules may use: the AG-UI side, the thread record's values and
#: the kernel client's values (``KernelRejected``, a frame's ``Repeat``), never the client or the disk.
PURE_MAY_IMPORT = (
    "agui_adapter.protocol",
    "agui_adapter.state.record",
    "agui_adapter.kernel_client.failures",
    "agui_adapter.kernel_client.repeats",
)
IO_MODULES = {"os", "socket", "threading", "time", "requests", "http", "subprocess", "pathlib", "queue", "select"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(path: Path) -> list[str]:
    """Every module the file imports, anywhere in it (function-level and TYPE_CHECKING too)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _violations(modules: dict[str, Path]) -> list[str]:
    names = set(modules)
    out = []
    for module, path in sorted(modules.items()):
        layer = _layer(module)
        if layer not in ALLOWED:  # the root, cli, wsgi
            continue
        for target in _imports(path):
            if not target.startswith("agui_adapter."):
                continue
            to = _layer(target)
            if to in ("__version__", "PROTOCOL_VERSION") or to == layer:
                continue
            if to == "http" and layer == "kernel_client" and any(target.startswith(m) for m in KERNEL_CLIENT_FROM_HTTP):
                continue
            if to not in ALLOWED[layer] or (to == "http" and layer == "kernel_client"):
                out.append(f"{module} imports {target}")
        if layer == "run" and module.rsplit(".", 1)[-1] in PURE_RUN:
            for target in _imports(path):
                top = target.split(".")[0]
                if target.startswith("agui_adapter."):
                    if _layer(target) != "run" and not target.startswith(PURE_MAY_IMPORT):
                        out.append(f"pure {module} imports {target}")
                    elif _layer(target) == "run" and target.rsplit(".", 1)[0] in names:
                        if (mod := target.split(".")[2]) not in PURE_RUN:
                            out.append(f"pure {module} imports {target} ({mod} is not pure)")
                elif top in IO_MODULES:
                    out.append(f"pure {module} imports {target}")
    return out


def test_every_layer_imports_only_what_the_map_allows() -> None:
    assert _violations(_modules()) == []


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The check is not vacuous: a protocol module that reaches for the run, and a pure run
    module that opens a socket or reads the store, are each caught."""
    bad_protocol = tmp_path / "protocol_bad.py"
    bad_protocol.write_text("def f():\n    from agui_adapter.run.machine import RunMachine\n")
    bad_pure = tmp_path / "machine_bad.py"
    bad_pure.write_text("import socket\nfrom agui_adapter.state.store import ThreadStore\n")
    found = _violations({"agui_adapter.protocol.bad": bad_protocol, "agui_adapter.run.machine": bad_pure})
    assert found == [
        "agui_adapter.protocol.bad imports agui_adapter.run.machine.RunMachine",
        "pure agui_adapter.run.machine imports socket",
        "pure agui_adapter.run.machine imports agui_adapter.state.store.ThreadStore",
    ]


def test_the_pure_modules_named_here_exist() -> None:
    run = {name.rsplit(".", 1)[-1] for name in _modules() if _layer(name) == "run"}
    assert PURE_RUN <= run, PURE_RUN - run


def test_no_two_modules_share_a_name() -> None:
    """A name means one thing: ``server.py`` is the built-in server and nothing else."""
    names = Counter(path.name for path in PACKAGE.rglob("*.py") if path.name not in ("__init__.py", "__main__.py"))
    assert [name for name, count in names.items() if count > 1] == []
