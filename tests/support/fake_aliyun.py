"""A loopback fake of the Alibaba Cloud OpenAPI (ROS and STS) behind an HTTPS CONNECT proxy.

Why: every cloud call of the real kernel's ``selling`` pipeline goes to ``*.aliyuncs.com`` over
HTTPS, and neither iac-code nor the Alibaba Cloud SDK reads an endpoint from the environment.
What they do honour is ``HTTPS_PROXY`` (aiohttp with ``trust_env``, darabonba's proxies) and,
for the asyncio path, the OpenSSL default trust store (``SSL_CERT_FILE``). So the fake is a
proxy on 127.0.0.1 that answers ``CONNECT host:443``, terminates TLS with a leaf certificate for
``*.aliyuncs.com`` signed by a test CA made at start-up with the ``openssl`` command, and serves
the OpenAPI calls itself with plausible JSON:

* ROS 2019-09-10: ``ValidateTemplate``, ``GetTemplateParameterConstraints``, ``PreviewStack``,
  ``GetTemplateEstimateCost``, ``CreateStack``, ``GetStack`` (``CREATE_COMPLETE``),
  ``ListStackResources``, ``ListStackEvents``, ``DescribeRegions``;
* STS 2015-04-01: ``GetCallerIdentity`` (a RAM user).

Anything else is answered 404 ``InvalidAction.NotFound``. Nothing leaves the machine.

Every call is appended to ``calls`` and to a JSON-lines log as ``{time, host, action, method,
path, params}``: the action comes from the ``x-acs-action`` header (ACS3 signatures) or the
``Action`` parameter; ``params`` keeps only the parameter *names*, plus the values of a few
harmless keys (``StackName``, ``StackId``, ``TemplateURL``, ``RegionId``). Headers are never
logged, so no access key, signature or security token reaches the log.

``FakeAliyun(directory).start()``; ``environment()`` gives the variables that point a process
at it (``HTTPS_PROXY``, ``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE``).
"""

from __future__ import annotations

import json
import socket
import socketserver
import ssl
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

if TYPE_CHECKING:
    from typing_extensions import Self

#: Host names the leaf certificate covers (``*.aliyuncs.com`` covers one label only).
CERT_NAMES = (
    "aliyuncs.com",
    "*.aliyuncs.com",
    "*.cn-hangzhou.aliyuncs.com",
    "*.cn-shanghai.aliyuncs.com",
    "*.cn-beijing.aliyuncs.com",
    "*.vpc-proxy.aliyuncs.com",
)
ACCOUNT_ID = "1234567890123456"
USER_ID = "200000000000000001"
#: Parameter values that may be logged (everything else is logged by name only).
LOGGED_VALUES = frozenset({"StackName", "StackId", "TemplateURL", "RegionId"})
#: The monthly price the fake quotes for a template, by the first character of its file name.
PRICES = {"1": 42.5, "2": 8.0}


def monthly_price(template_url: str) -> float:
    """The fake's price for a template (``TradeAmount``): 42.50 for ``1-*``, 8.00 for ``2-*``, else 1.00."""
    return PRICES.get(template_url.rsplit("/", 1)[-1][:1], 1.0)


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A test CA and a leaf for :data:`CERT_NAMES` signed by it: ``(ca.pem, leaf.pem, leaf.key)``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_pem = directory / "ca.key", directory / "ca.pem"
    leaf_key, leaf_csr, leaf_pem = directory / "leaf.key", directory / "leaf.csr", directory / "leaf.pem"
    extensions = directory / "leaf.ext"
    extensions.write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
        "subjectAltName=" + ",".join(f"DNS:{name}" for name in CERT_NAMES) + "\n"
    )

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-keyout", str(ca_key), "-out", str(ca_pem),
        "-subj", "/CN=agui-adapter fake Alibaba Cloud test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-addext", "subjectKeyIdentifier=hash",
    )  # fmt: skip
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(leaf_key), "-out", str(leaf_csr),
        "-subj", "/CN=aliyuncs.com",
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", str(leaf_csr), "-CA", str(ca_pem), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "2", "-out", str(leaf_pem), "-extfile", str(extensions),
    )  # fmt: skip
    return ca_pem, leaf_pem, leaf_key


class Cloud:
    """The fake's state: the stacks it created, and the answer to each action."""

    def __init__(self) -> None:
        self.stacks: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()

    def answer(self, host: str, action: str, params: dict[str, str]) -> tuple[int, dict[str, Any]]:
        request_id = str(uuid.uuid4()).upper()
        product = host.split(".")[0]
        handler = getattr(self, f"_{product}_{action}", None)
        if handler is None:
            body = {"Code": "InvalidAction.NotFound", "Message": f"Specified api is not found: {action}"}
            return 404, dict(body, RequestId=request_id, HostId=host)
        return 200, dict(handler(params), RequestId=request_id)

    # ------------------------------------------------------------------ STS
    @staticmethod
    def _sts_GetCallerIdentity(params: dict[str, str]) -> dict[str, Any]:  # noqa: N802 - the action's name
        return {
            "IdentityType": "RAMUser",
            "AccountId": ACCOUNT_ID,
            "UserId": USER_ID,
            "PrincipalId": USER_ID,
            "Arn": f"acs:ram::{ACCOUNT_ID}:user/agui-fake",
        }

    # ------------------------------------------------------------------ ROS
    @staticmethod
    def _ros_ValidateTemplate(params: dict[str, str]) -> dict[str, Any]:  # noqa: N802
        return {
            "Description": "validated by the fake Alibaba Cloud",
            "Parameters": [],
            "Outputs": [{"OutputKey": "VpcId", "Description": ""}],
            "ResourceTypes": {"Resources": ["ALIYUN::ECS::VPC"], "DataSources": []},
            "Resources": [{"LogicalResourceId": "Vpc", "ResourceType": "ALIYUN::ECS::VPC"}],
        }

    @staticmethod
    def _ros_GetTemplateParameterConstraints(params: dict[str, str]) -> dict[str, Any]:  # noqa: N802
        return {"ParameterConstraints": []}

    @staticmethod
    def _ros_PreviewStack(params: dict[str, str]) -> dict[str, Any]:  # noqa: N802
        return {
            "Stack": {
                "StackName": params.get("StackName", "preview"),
                "RegionId": params.get("RegionId", "cn-hangzhou"),
                "Description": "previewed by the fake Alibaba Cloud",
                "Parameters": [],
                "Resources": [
                    {
                        "LogicalResourceId": "Vpc",
                        "ResourceType": "ALIYUN::ECS::VPC",
                        "Action": "Add",
                        "Properties": {"CidrBlock": "192.168.0.0/16"},
                    }
                ],
            }
        }

    @staticmethod
    def _ros_GetTemplateEstimateCost(params: dict[str, str]) -> dict[str, Any]:  # noqa: N802
        amount = monthly_price(params.get("TemplateURL", ""))
        order = {"Currency": "CNY", "OriginalAmount": amount, "DiscountAmount": 0.0, "TradeAmount": amount}
        return {
            "Resources": {
                "Vpc": {
                    "Type": "ALIYUN::ECS::VPC",
                    "Result": {
                        "Order": order,
                        "OrderSupplement": {"ChargeType": "PostPaid", "PriceUnit": "/Month", "Quantity": 1},
                    },
                }
            }
        }

    def _ros_CreateStack(self, params: dict[str, str]) -> dict[str, Any]:  # noqa: N802
        stack_id = str(uuid.uuid4())
        with self.lock:
            self.stacks[stack_id] = {
                "StackId": stack_id,
                "StackName": params.get("StackName", "stack"),
                "RegionId": params.get("RegionId", "cn-hangzhou"),
                "Status": "CREATE_COMPLETE",
                "StatusReason": "Stack CREATE completed successfully",
                "CreateTime": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()),
            }
        return {"StackId": stack_id}

    def _ros_GetStack(self, params: dict[str, str]) -> dict[str, Any]:  # noqa: N802
        with self.lock:
            stack = dict(self.stacks.get(params.get("StackId", ""), {}))
        if not stack:
            return {"Status": "DELETE_COMPLETE", "StackId": params.get("StackId", "")}
        return dict(stack, Outputs=[{"OutputKey": "VpcId", "OutputValue": "vpc-fake0001"}], Parameters=[])

    def _ros_ListStackResources(self, params: dict[str, str]) -> dict[str, Any]:  # noqa: N802
        return {
            "Resources": [
                {
                    "LogicalResourceId": "Vpc",
                    "PhysicalResourceId": "vpc-fake0001",
                    "ResourceType": "ALIYUN::ECS::VPC",
                    "Status": "CREATE_COMPLETE",
                    "StatusReason": "state changed",
                    "StackId": params.get("StackId", ""),
                }
            ]
        }

    @staticmethod
    def _ros_ListStackEvents(params: dict[str, str]) -> dict[str, Any]:  # noqa: N802
        return {"Events": [], "TotalCount": 0, "PageNumber": 1, "PageSize": 10}

    @staticmethod
    def _ros_DescribeRegions(params: dict[str, str]) -> dict[str, Any]:  # noqa: N802
        return {"Regions": [{"RegionId": "cn-hangzhou", "LocalName": "华东1（杭州）"}]}


class _OpenApi(BaseHTTPRequestHandler):
    """One TLS connection of the proxy, after CONNECT: OpenAPI requests for ``host``."""

    protocol_version = "HTTP/1.1"
    server: _Proxy
    host_name = ""

    def log_message(self, format: str, *args: Any) -> None:
        """No access log (the calls are recorded, without headers)."""

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        target = urlsplit(self.path)
        params = dict(parse_qsl(target.query, keep_blank_values=True))
        kind = self.headers.get("Content-Type", "")
        if raw and "json" in kind:
            try:
                body = json.loads(raw)
            except ValueError:
                body = {}
            if isinstance(body, dict):
                params.update({str(k): json.dumps(v) if not isinstance(v, str) else v for k, v in body.items()})
        elif raw:
            params.update(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))
        action = self.headers.get("x-acs-action") or params.get("Action", "")
        self.server.record(self.host_name, action, self.command, target.path, params)
        status, payload = self.server.cloud.answer(self.host_name, action, params)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json;charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-acs-request-id", payload["RequestId"])
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _handle  # noqa: N815 - http.server's names


class _ProxyHandler(socketserver.BaseRequestHandler):
    """``CONNECT host:443``: 200, then TLS with the fake's certificate, then :class:`_OpenApi`."""

    server: _Proxy

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(30)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                return
            head += chunk
            if len(head) > 65536:
                return
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split()
        if len(parts) != 3 or parts[0].upper() != "CONNECT":
            sock.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        host = parts[1].rsplit(":", 1)[0].lower()
        if not (host == "aliyuncs.com" or host.endswith(".aliyuncs.com")):
            self.server.refused.append(host)
            sock.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        sock.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        try:
            tls = self.server.tls.wrap_socket(sock, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            self.server.tls_failures.append(f"{host}: {exc}")
            return
        handler = type("_HostApi", (_OpenApi,), {"host_name": host})
        try:
            handler(tls, self.client_address, self.server)
        except (ssl.SSLError, OSError):
            pass
        finally:
            try:
                tls.close()
            except OSError:
                pass


class _Proxy(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, tls: ssl.SSLContext, log_path: Path) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.tls = tls
        self.log_path = log_path
        self.cloud = Cloud()
        self.calls: list[dict[str, Any]] = []
        self.refused: list[str] = []
        self.tls_failures: list[str] = []
        self.log_lock = threading.Lock()

    def record(self, host: str, action: str, method: str, path: str, params: dict[str, str]) -> None:
        entry = {
            "time": time.time(),
            "host": host,
            "action": action,
            "method": method,
            "path": path,
            "params": {k: (v if k in LOGGED_VALUES else None) for k, v in sorted(params.items())},
        }
        with self.log_lock:
            self.calls.append(entry)
            with self.log_path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(entry, ensure_ascii=False) + "\n")


class FakeAliyun:
    """The proxy and its fake cloud on a daemon thread (a context manager)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.log_path = self.directory / "aliyun-calls.jsonl"
        self._server: _Proxy | None = None
        self._thread: threading.Thread | None = None
        self.ca_path = self.directory / "ca.pem"

    def start(self) -> Self:
        if self._server is not None:
            return self
        ca, leaf, key = make_certificates(self.directory / "tls")
        self.ca_path = ca
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(leaf), str(key))
        self.log_path.touch()
        self._server = _Proxy(context, self.log_path)
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-aliyun", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    @property
    def proxy_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def environment(self) -> dict[str, str]:
        """Variables that send a process's HTTPS to the fake and make it trust the test CA."""
        return {
            "HTTPS_PROXY": self.proxy_url,
            "https_proxy": self.proxy_url,
            "SSL_CERT_FILE": str(self.ca_path),
            "REQUESTS_CA_BUNDLE": str(self.ca_path),
            "CURL_CA_BUNDLE": str(self.ca_path),
        }

    @property
    def calls(self) -> list[dict[str, Any]]:
        """Every OpenAPI call answered so far, oldest first."""
        assert self._server is not None
        return list(self._server.calls)

    @property
    def tls_failures(self) -> list[str]:
        """TLS handshakes a client broke off (for instance because it did not trust the test CA)."""
        assert self._server is not None
        return list(self._server.tls_failures)

    def actions(self) -> list[str]:
        return [c["action"] for c in self.calls]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
