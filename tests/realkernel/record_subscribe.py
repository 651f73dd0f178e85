"""Records tests/data/a2a-subscribe/: what the real kernel sends for SubscribeToTask and GetTask
after the client of a task's stream went away (run: python tests/realkernel/record_subscribe.py)."""

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.realkernel.harness import RealKernel  # noqa: E402


def has_text(item: dict[str, Any]) -> bool:
    update = item.get("result", {}).get("statusUpdate") or {}
    return bool((update.get("status") or {}).get("message"))


out = Path(__file__).resolve().parents[1] / "data" / "a2a-subscribe"


def dump(name, items):
    with (out / name).open("w") as f:
        for item in items:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")


def scrub(obj, tmp):
    s = json.dumps(obj).replace(str(tmp), "/srv/kernel")
    return json.loads(s)


with RealKernel(slow_interval=0.5) as k:
    tmp = k.tmp_dir
    # 1. slow turn: read 4 deltas then drop the connection (the adapter dies)
    ctx = "ctx-sub-1"
    it = k.iter_stream("SendStreamingMessage", {"message": k.message("[SLOW] go", ctx)}, timeout=60)
    first = []
    task_id = None
    for item in it:
        first.append(item)
        r = item.get("result", {})
        task_id = task_id or (r.get("task") or {}).get("id")
        if has_text(item) and sum(1 for x in first if has_text(x)) >= 3:
            break
    it.close()
    t_drop = time.time()
    dump("01-slow-turn-before-drop.jsonl", scrub(first, tmp))
    time.sleep(1.6)  # deltas happen meanwhile with nobody subscribed
    gt = k.rpc("GetTask", {"id": task_id})
    json.dump(scrub(gt, tmp), (out / "02-gettask-after-drop.json").open("w"), indent=1)
    gth = k.rpc("GetTask", {"id": task_id, "historyLength": 100})
    json.dump(scrub(gth, tmp), (out / "03-gettask-history-after-drop.json").open("w"), indent=1)
    sub = k.stream("SubscribeToTask", {"id": task_id}, timeout=60)
    dump("04-subscribe-after-drop.jsonl", scrub(sub, tmp))
    gt_end = k.rpc("GetTask", {"id": task_id, "historyLength": 100})
    json.dump(scrub(gt_end, tmp), (out / "05-gettask-after-end.json").open("w"), indent=1)
    sub_end = k.stream("SubscribeToTask", {"id": task_id}, timeout=10)
    dump("06-subscribe-after-end.jsonl", scrub(sub_end, tmp))

    # 2. write permission reached while nobody is subscribed
    ctx = "ctx-sub-2"
    it = k.iter_stream("SendStreamingMessage", {"message": k.message("[WRITE] [SLOW] write it", ctx)}, timeout=60)
    first = []
    task_id = None
    for item in it:
        first.append(item)
        r = item.get("result", {})
        task_id = task_id or (r.get("task") or {}).get("id")
        if len(first) >= 4:
            break
    it.close()
    dump("07-write-before-drop.jsonl", scrub(first, tmp))
    deadline = time.time() + 60
    while time.time() < deadline:
        st = k.rpc("GetTask", {"id": task_id})["result"]["status"]["state"]
        if st not in ("TASK_STATE_WORKING", "TASK_STATE_SUBMITTED"):
            break
        time.sleep(0.3)
    gt = k.rpc("GetTask", {"id": task_id, "historyLength": 100})
    json.dump(scrub(gt, tmp), (out / "08-gettask-permission-reached-unattended.json").open("w"), indent=1)
    sub = k.stream("SubscribeToTask", {"id": task_id}, timeout=10)
    dump("09-subscribe-permission-pending.jsonl", scrub(sub, tmp))
    print("done", file=sys.stderr)
