"""The durable thread store seen through the adapter: a corrupt record, one state dir shared by two processes."""

from __future__ import annotations

from pathlib import Path

from tests.support.agui_client import Client, run_body


def test_corrupt_state_is_503(client: Client, workspace: Path, tmp_path: Path) -> None:
    body = run_body(cwd=str(workspace), thread_id="thread-corrupt")
    assert client.run(body).status == 200
    (tmp_path / "state" / "threads" / "thread-corrupt.json").write_text("garbage")
    result = client.run(run_body(cwd=str(workspace), thread_id="thread-corrupt"))
    assert result.status == 503 and result.error["code"] == "STATE_UNAVAILABLE"


def test_two_adapter_processes_share_one_state_dir(adapter_process, workspace: Path) -> None:  # type: ignore[no-untyped-def]
    import threading

    import requests

    one, two = adapter_process(), adapter_process()
    thread = "thread-two-procs"
    statuses: list[int] = []

    def go(url: str, i: int) -> None:
        body = run_body("[SLOW]", thread_id=thread, cwd=str(workspace), run_id=f"r{i}")
        with requests.post(url, json=body, headers={"Accept": "text/event-stream"}, stream=True, timeout=30) as r:
            statuses.append(r.status_code)
            for _ in r.iter_content(None):
                pass

    workers = [threading.Thread(target=go, args=(u, i)) for i, u in enumerate([one.url, two.url] * 3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert sorted(statuses) == [200, 409, 409, 409, 409, 409]
    # the winner's record is visible to the other process
    again = Client(two.url).run(run_body(thread_id=thread, cwd=str(workspace)))
    assert again.status == 200
