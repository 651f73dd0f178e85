"""The real kernel's ``selling`` pipeline against a loopback fake Alibaba Cloud.

The kernel runs with ``HTTPS_PROXY``, ``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE`` and
``CURL_CA_BUNDLE`` pointing at :class:`~tests.support.fake_aliyun.FakeAliyun` (a CONNECT proxy
terminating TLS for ``*.aliyuncs.com`` with a test CA made at test time); every request sends
fake credentials in ``forwardedProps.iacCode.alibabaCloud``. The fake LLM's ``[PIPE-CLOUD]``
makes each candidate's cost step call ``ros_validate_template``, ``ros_preview_template`` and
``ros_estimate_template_cost`` and the deploying step call ``ros_deploy`` (create).

What the kernel's code lets through (tests/data/a2a-selling/README.md has the evidence):
the asyncio OpenAPI path (aiohttp, ``trust_env``, OpenSSL's default store) trusts the test CA;
the synchronous one (darabonba's ``Session.send`` with ``verify=True``: requests' certifi bundle,
``REQUESTS_CA_BUNDLE`` never read) refuses it, so those calls end at the TLS handshake.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.agui_client import Client, RunResult, session_value
from tests.support.fake_aliyun import FakeAliyun

from . import fake_cloud
from .fake_cloud import assert_clean_delivery, calls_since, cloud_body, describe, resume_with
from .harness import (
    RealKernel,
    journal,
    only_interrupt,
    pipeline_events,
    step_names,
)

# the fake cloud, the kernel that uses it and a fake secret per test
fake_aliyun = fake_cloud.fake_aliyun
real_kernel = fake_cloud.real_kernel
secret = fake_cloud.secret


def deploying_conclusion(kernel: RealKernel, task_id: str) -> dict[str, Any]:
    done = [e for e in journal(kernel, task_id) if e["eventType"] == "step_completed"]
    return dict([e for e in done if (e.get("step") or {}).get("id") == "deploying"][-1]["data"]["conclusion"])


def to_the_deploy_permission(
    client: Client, ws: Path, cloud: FakeAliyun, secret: str, tag: str
) -> tuple[dict[str, Any], list[RunResult], dict[str, Any]]:
    """A ``[PIPE-CLOUD]`` pipeline up to ros_deploy's permission: (body, runs, permission interrupt)."""
    mark = len(cloud.calls)
    body = cloud_body(f"[PIPE-SELL] [PIPE-CLOUD] I want a small website on Alibaba Cloud. {tag}", ws, secret)
    first = client.run(body)
    selection = only_interrupt(first)
    # each candidate's cost step called ROS through the proxy, and the prices it got back are the
    # prices of the selection (the fake quotes 42.50 for template 1-*, 8.00 for 2-*)
    priced = [(c["action"], c["params"].get("TemplateURL", "").rsplit("/", 1)[-1]) for c in calls_since(cloud, mark)]
    for action in ("ValidateTemplate", "PreviewStack", "GetTemplateEstimateCost"):
        assert sorted(name for kind, name in priced if kind == action) == [
            "1-ecs-behind-slb.yml",
            "2-static-site-on-oss.yml",
        ], describe(first, cloud)
    assert {c["host"] for c in calls_since(cloud, mark)} == {"ros.aliyuncs.com"}
    options = selection["metadata"]["options"]
    assert [o["totalMonthlyCost"] for o in options] == ["¥42.50/月", "¥8.00/月"]
    assert [o["costItems"][0]["monthlyCost"] for o in options] == ["¥42.50/月", "¥8.00/月"]
    mark = len(cloud.calls)
    second = client.run(resume_with(body, secret, selection, {"selectedId": "1"}))
    permission = only_interrupt(second)
    # before asking, the kernel resolved the caller through STS (a2a: permission_wait.py); nothing
    # was created yet
    assert [(c["host"], c["action"]) for c in calls_since(cloud, mark)] == [("sts.aliyuncs.com", "GetCallerIdentity")]
    return body, [first, second], permission


def test_cost_steps_price_from_the_fake_cloud_and_ros_deploy_asks_after_sts(
    client: Client, ws: Path, real_kernel: RealKernel, fake_aliyun: FakeAliyun, secret: str, tag: str
) -> None:
    body, runs, permission = to_the_deploy_permission(client, ws, fake_aliyun, secret, tag)
    meta = permission["metadata"]
    assert (permission["reason"], meta["kind"], meta["toolName"], meta["effect"]) == (
        "tool_call",
        "permission",
        "ros_deploy",
        "cloud_change",
    )
    assert meta["operation"]["apiCalls"] == [{"product": "ROS", "action": "CreateStack", "effect": "change"}]
    # the deployment summary carries the price the cost step got from the cloud for the chosen plan
    assert (meta["deploymentSummary"]["candidateName"], meta["deploymentSummary"]["totalMonthlyCost"]) == (
        "Static site on OSS",
        "¥8.00/月",
    )
    assert step_names(runs[1], "STEP_STARTED") == ["confirm_and_select", "deploying"]
    # allowed through our Resume: the kernel resolves the caller again and calls CreateStack on the
    # synchronous SDK path, which refuses the test CA (requests' certifi bundle; REQUESTS_CA_BUNDLE
    # is not read by darabonba's Session.send): the fake sees the TLS handshake break off
    mark, refused = len(fake_aliyun.calls), len(fake_aliyun.tls_failures)
    third = client.run(resume_with(body, secret, permission, {"decision": "allow_once"}))
    runs.append(third)
    assert third.terminal["type"] == "RUN_FINISHED" and third.terminal["outcome"] == {"type": "success"}, describe(
        third, fake_aliyun
    )
    assert [c["action"] for c in calls_since(fake_aliyun, mark)] == ["GetCallerIdentity"]
    assert [f for f in fake_aliyun.tls_failures[refused:] if f.startswith("ros.aliyuncs.com")]
    task_id = session_value(runs[0])["taskId"]
    [deployed] = [
        e["data"]
        for e in journal(real_kernel, task_id)
        if e["eventType"] == "tool_result" and e["data"]["toolName"] == "ros_deploy"
    ]
    assert deployed["isError"] and "[CreateStack]" in deployed["result"]
    assert "CERTIFICATE_VERIFY_FAILED" in deployed["result"]
    conclusion = deploying_conclusion(real_kernel, task_id)
    assert conclusion["status"] == "failed" and "[CreateStack]" in conclusion["error"]
    ends = [e for e in pipeline_events(third) if e["eventType"] == "pipeline_completed"]
    assert ends and ends[-1]["data"] == {"totalSteps": 5}
    resolved = [e for e in journal(real_kernel, task_id) if e["eventType"] == "permission_resolved"]
    assert [e["data"]["decision"] for e in resolved] == ["allow_once"]
    assert_clean_delivery(real_kernel, fake_aliyun, secret, runs)


def test_ros_deploy_denied_through_resume_creates_nothing(
    client: Client, ws: Path, real_kernel: RealKernel, fake_aliyun: FakeAliyun, secret: str, tag: str
) -> None:
    body, runs, permission = to_the_deploy_permission(client, ws, fake_aliyun, secret, tag)
    mark, refused = len(fake_aliyun.calls), len(fake_aliyun.tls_failures)
    third = client.run(resume_with(body, secret, permission, {"decision": "deny"}))
    runs.append(third)
    assert third.terminal["type"] == "RUN_FINISHED" and third.terminal["outcome"] == {"type": "success"}
    assert calls_since(fake_aliyun, mark) == [] and fake_aliyun.tls_failures[refused:] == []
    task_id = session_value(runs[0])["taskId"]
    conclusion = deploying_conclusion(real_kernel, task_id)
    assert conclusion["status"] == "failed" and "CreateStack" not in conclusion["error"]
    resolved = [e for e in journal(real_kernel, task_id) if e["eventType"] == "permission_resolved"]
    assert [e["data"]["decision"] for e in resolved] == ["deny"]
    assert_clean_delivery(real_kernel, fake_aliyun, secret, runs)
