"""Records tests/data/a2a-subscribe/ 10-15: what the real kernel says of an artifact made while
no adapter process followed the task (run: python tests/realkernel/record_artifacts.py).

10-13: a kernel that approves permissions itself (``auto_approve_permissions``) runs a
``[WRITE] [SLOW] [SLOW-AFTER]`` turn whose stream's client goes away after the first text, as
an adapter process killed mid-turn does; ``write_file`` (an artifact) runs with nobody following,
then the closing text streams slowly; GetTask and SubscribeToTask are asked meanwhile and after.
14-15: the usual kernel (it asks): the answer to the permission (``allow_once``) is sent on a
stream whose client goes away after its first frame, as an adapter process killed right after
sending a Resume; what GetTask says then."""

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.realkernel.harness import RealKernel  # noqa: E402

out = Path(__file__).resolve().parents[1] / "data" / "a2a-subscribe"


def scrub(obj: Any, tmp: Path) -> Any:
    return json.loads(json.dumps(obj).replace(str(tmp), "/srv/kernel"))


def dump(name: str, items: list[dict[str, Any]], tmp: Path) -> None:
    with (out / name).open("w") as f:
        for item in items:
            f.write(json.dumps(scrub(item, tmp), ensure_ascii=False) + "\n")


def dump_one(name: str, item: dict[str, Any], tmp: Path) -> None:
    (out / name).write_text(json.dumps(scrub(item, tmp), indent=1, ensure_ascii=False) + "\n")


config = Path(tempfile.mkdtemp()) / "a2a.yaml"
config.write_text("auto_approve_permissions: true\n")
with RealKernel(slow_interval=0.5, extra_args=["--config", str(config)]) as k:
    tmp = k.tmp_dir
    turn = k.message("[WRITE] [SLOW] [SLOW-AFTER] write it", "ctx-sub-3")
    it = k.iter_stream("SendStreamingMessage", {"message": turn})
    head = []
    for item in it:
        head.append(item)
        if "I will write" in json.dumps(item):
            break
    it.close()  # the adapter process dies mid-turn
    dump("10-auto-write-before-drop.jsonl", head, tmp)
    task_id = head[0]["result"]["task"]["id"]
    deadline = time.time() + 30
    task = k.rpc("GetTask", {"id": task_id})
    while not task["result"].get("artifacts") and time.time() < deadline:
        time.sleep(0.1)
        task = k.rpc("GetTask", {"id": task_id})
    dump_one("11-gettask-artifact-made-unattended.json", task, tmp)
    dump("12-subscribe-after-artifact.jsonl", k.stream("SubscribeToTask", {"id": task_id}, timeout=60), tmp)
    dump_one("13-gettask-artifact-after-end.json", k.rpc("GetTask", {"id": task_id, "historyLength": 100}), tmp)

with RealKernel(slow_interval=0.5) as k:
    tmp = k.tmp_dir
    first = k.send(k.message("[WRITE] [SLOW-AFTER] write it", "ctx-sub-4"), timeout=60)
    task_id = next(r["result"]["task"]["id"] for r in first if "task" in r.get("result", {}))
    update = [r for r in first if "statusUpdate" in r.get("result", {})][-1]["result"]["statusUpdate"]
    envelope = update["metadata"]["iac_code"]["input"]
    answer = {
        "schemaVersion": 1,
        "kind": "permission",
        "requestTaskId": envelope["requestTaskId"],
        "inputId": envelope["inputId"],
        "toolUseId": envelope["toolUseId"],
        "decision": "allow_once",
    }
    parts = [{"data": answer, "mediaType": "application/json"}]
    message = k.message(None, "ctx-sub-4", task_id=envelope["requestTaskId"], parts=parts)
    it = k.iter_stream("SendStreamingMessage", {"message": message}, timeout=60)
    head = [next(it)]
    it.close()  # the adapter process dies right after its Resume reached the kernel
    dump("14-answer-before-drop.jsonl", head, tmp)
    deadline = time.time() + 30
    while len(k.llm_requests()) < 2 and time.time() < deadline:  # the tool ran, the LLM was asked again
        time.sleep(0.1)
    time.sleep(3.0)  # its closing text (three chunks 0.5 s apart) is over
    dump_one("15-gettask-after-answer-drop.json", k.rpc("GetTask", {"id": task_id, "historyLength": 100}), tmp)
    print("done; LLM:", [r["behaviour"] for r in k.llm_requests()], file=sys.stderr)
