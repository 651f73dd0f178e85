"""Records what the real iac-code 0.16.0 kernel keeps of a conversation (``tests/data/history/``).

Not a test: run it by hand (``PYTHONPATH=. python -m tests.realkernel.capture_history OUT``)
when the kernel version changes. Through an adapter in front of the real kernel and the fake
LLM it plays three turns on one thread (a text turn with thinking, a ``write_file`` turn that
asks for permission and its allowing Resume, a ``[RECALL]`` turn), then asks the kernel what
it kept: ``GetTask`` with ``historyLength`` for every task, ``ListTasks`` for the context with
``historyLength`` and ``includeArtifacts``, and the session recovery route. The AG-UI streams
are stored beside the answers, so that ids can be compared.
"""

from __future__ import annotations

import json
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.agui_client import Client, resume, run_body, session_value

from .harness import Adapters, RealKernel, require_kernel_venv


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    venv = require_kernel_venv()
    with RealKernel(venv) as kernel, tempfile.TemporaryDirectory() as root:
        adapters = Adapters(kernel, Path(root), Path(root) / "outside")
        try:
            adapter = adapters.start()
            client = Client(adapter.url)
            cwd = str(kernel.workdir / "ws-history")
            thread = "rk-history-capture"
            streams: list[dict[str, Any]] = []
            tasks: list[str] = []

            def play(body: dict[str, Any]) -> Any:
                result = client.run(body)
                assert result.status == 200, result.error
                streams.append({"request": body, "events": result.events})
                session = session_value(result)
                if session and session.get("taskId") and session["taskId"] not in tasks:
                    tasks.append(session["taskId"])
                return result

            play(run_body("[THINK] hello <history>", thread_id=thread, cwd=cwd, ros="inv-h1"))
            first = run_body("[WRITE] write it <history>", thread_id=thread, cwd=cwd, ros="inv-h2")
            interrupted = play(first)
            interrupt = interrupted.terminal["outcome"]["interrupts"][0]
            play(
                resume(
                    first,
                    [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}],
                )
            )
            play(run_body("[RECALL] how many? <history>", thread_id=thread, cwd=cwd, ros="inv-h3"))
            (out / "agui-streams.json").write_text(json.dumps(streams, indent=1, ensure_ascii=False) + "\n")

            context_id = streams[0]["events"][1]["value"]["contextId"]
            answers: dict[str, Any] = {}
            for task_id in tasks:
                answers[f"GetTask {task_id} historyLength=100"] = kernel.rpc(
                    "GetTask", {"id": task_id, "historyLength": 100}
                )
                answers[f"GetTask {task_id}"] = kernel.rpc("GetTask", {"id": task_id})
            answers["ListTasks historyLength=100 includeArtifacts"] = kernel.rpc(
                "ListTasks", {"contextId": context_id, "historyLength": 100, "includeArtifacts": True, "pageSize": 50}
            )
            last = answers[f"GetTask {tasks[-1]} historyLength=100"]["result"]
            execution_id = last["metadata"]["iac_code"]["executionControl"]["executionId"]
            first = answers[f"GetTask {tasks[0]} historyLength=100"]
            older = first["result"]["metadata"]["iac_code"]["executionControl"]["executionId"]
            probes = {
                "GET /iac-code/session/recovery": (context_id, execution_id),
                "GET /iac-code/session/recovery (the first task's executionId)": (context_id, older),
                "GET /iac-code/session/recovery (unknown executionId)": (context_id, "exec-unknown"),
                "GET /iac-code/session/recovery (unknown contextId)": ("ctx-unknown", execution_id),
            }
            for name, (context, execution) in probes.items():
                url = f"{kernel.url}/iac-code/session/recovery?contextId={context}&executionId={execution}"
                request = urllib.request.Request(url, headers=kernel.headers())
                try:
                    with urllib.request.urlopen(request, timeout=30) as response:
                        answers[name] = {"status": response.status, "body": json.loads(response.read())}
                except urllib.error.HTTPError as exc:
                    answers[name] = {"status": exc.code, "body": exc.read().decode()}
            (out / "kernel-history.json").write_text(json.dumps(answers, indent=1, ensure_ascii=False) + "\n")
        finally:
            adapters.stop_all()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
