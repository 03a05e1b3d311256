"""A loopback Kubernetes API server for the contract tests: the Node, the
resource.k8s.io/v1 ResourceSlice endpoints the plugin uses, and the ResourceClaims it reads
to prepare them, on 127.0.0.1, in a thread of the test process (http.server).

Every ResourceClaim a test puts in (`put_claim`) must deserialize into the kubernetes
client's v1 model (ResourceV1ResourceClaim), so that the plugin is tested on claims the
real API server could serve. `claims_down` answers claim reads with 503, as an API server
that is down behind its load balancer does, and `unreachable` refuses every connection, as
one with nothing in front of it does; `stall_claims` holds each claim read unanswered until
`answer_claims`, as an overloaded API server does (a plugin's read that gave up meanwhile
finds its connection closed). A claim's status subresource takes a driver's server-side
apply of `status.devices`, merged, validated and authorized as the real one does it
(testbed/dra/claim_status.py; `status.granted` is what the plugin's identity may do).

Every ResourceSlice it is given is validated as the real API server and the node
authorizer would: it must deserialize into the kubernetes client's V1ResourceSlice, keep
the API's limits (128 devices a slice, 64 once one consumes counters or has a taint, 32
attributes and capacities a device, string values of 64 bytes, DNS-label device and counter
names, devices or at most 8 counter sets in a slice, not both, taints of a label name and
value and a known effect), name this node and driver, and be owned by the Node. A slice
that fails is refused with 422 and its faults are kept in `invalid`, which the tests assert
empty. As the API server does, it stamps each taint without a timeAdded. The devices and
counter sets the tests read are the pool's newest complete generation's, as the scheduler
takes them. Its /version is `version` (1.37 unless a test says otherwise).
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from kubernetes.client import ResourceV1ResourceClaim, V1ResourceSlice

from testbed.dra.claim_status import APPLY, Refusal, StatusStore

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = re.compile(r"/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims/([^/]+)")
CLAIM_STATUS = re.compile(CLAIMS.pattern + "/status")
DEVICES_PER_SLICE = 128
DEVICES_PER_SLICE_ADVANCED = 64  # once one consumes counters or has a taint
COUNTER_SETS_PER_SLICE = 8
CONSUMPTIONS_PER_DEVICE = 2
COUNTERS_PER_SET = 32
TAINT_EFFECTS = {"None", "NoSchedule", "NoExecute"}
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
ATTRIBUTES_AND_CAPACITIES = 32
STRING_BYTES = 64
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
VALUE_KINDS = {"bool", "int", "string", "version"}


class ApiServer:
    def __init__(self, node: str, driver: str) -> None:
        self.node = node
        self.node_uid = str(uuid.uuid4())
        self.driver = driver
        self.version = (1, 37)  # /version: (major, minor)
        self.slices: dict[str, dict[str, Any]] = {}
        self.invalid: list[str] = []  # every refused slice's faults
        self.writes = 0  # slices created, replaced or deleted
        self.fail_writes = 0  # answer this many next writes with 500
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}  # by (namespace, name)
        self.claim_reads = 0
        self.claims_down = False  # answer claim reads with 503
        self.status = StatusStore(node)  # the status subresource: testbed/dra/claim_status.py
        self._claims_answered = threading.Event()  # clear: claim reads wait for it
        self._claims_answered.set()
        self._versions = itertools.count(1)
        self._changed = threading.Condition()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    def kubeconfig(self, directory: Path) -> Path:
        path = directory / "kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "loopback", "cluster": {"server": self.url}}],
            "users": [{"name": "node", "user": {"token": "node-token"}}],
            "contexts": [{"name": "c", "context": {"cluster": "loopback", "user": "node"}}],
            "current-context": "c",
        }
        path.write_text(json.dumps(config))
        return path

    # --- what the tests read ---

    def lock(self) -> threading.Condition:
        """Held, the server's state is the test's alone (the server thread waits)."""
        return self._changed

    def devices(self) -> dict[str, dict[str, Any]]:
        """The pool's devices by name, from its newest complete generation's slices."""
        with self._changed:
            return self._devices()

    def counter_sets(self) -> dict[str, dict[str, Any]]:
        """The pool's counter sets by name, from its newest complete generation's slices."""
        with self._changed:
            return {c["name"]: c for s in self._newest() for c in s.get("sharedCounters") or []}

    def _newest(self) -> list[dict[str, Any]]:
        """The specs of the pool's newest complete generation (all its resourceSliceCount
        slices written), as the scheduler takes it."""
        by_generation: dict[int, list[dict[str, Any]]] = {}
        for s in self.slices.values():
            by_generation.setdefault(s["spec"]["pool"]["generation"], []).append(s["spec"])
        for _, specs in sorted(by_generation.items(), reverse=True):
            if len(specs) == specs[0]["pool"]["resourceSliceCount"]:
                return specs
        return []

    def _devices(self) -> dict[str, dict[str, Any]]:
        return {d["name"]: d for s in self._newest() for d in s.get("devices") or []}

    async def wait_for(
        self, what: Callable[[dict[str, dict[str, Any]]], bool], timeout: float = 20.0
    ) -> dict[str, dict[str, Any]]:
        """The pool's devices once `what` holds for them (checked after each write)."""

        def wait() -> dict[str, dict[str, Any]]:
            with self._changed:
                if not self._changed.wait_for(lambda: what(self._devices()), timeout):
                    raise AssertionError(f"slices never matched; devices: {self._devices()}")
                return self._devices()

        return await asyncio.to_thread(wait)

    def put_claim(self, claim: dict[str, Any]) -> None:
        """Serve `claim` (API JSON), checked against the client's v1 model first."""
        ResourceV1ResourceClaim.model_validate(claim)
        meta = claim["metadata"]
        with self._changed:
            self.claims[(meta["namespace"], meta["name"])] = json.loads(json.dumps(claim))

    def device_status(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The claim's status.devices, as `kubectl get resourceclaim -o yaml` shows them."""
        with self._changed:
            claim = self.claims[(namespace, name)]
            return list(json.loads(json.dumps(claim.get("status", {}).get("devices") or [])))

    async def wait_status(
        self,
        namespace: str,
        name: str,
        what: Callable[[list[dict[str, Any]]], bool],
        timeout: float = 20.0,
    ) -> list[dict[str, Any]]:
        """The claim's status.devices once `what` holds for them (checked after each write)."""

        def wait() -> list[dict[str, Any]]:
            with self._changed:
                if not self._changed.wait_for(
                    lambda: what(self.device_status(namespace, name)), timeout
                ):
                    raise AssertionError(
                        f"status never matched: {self.device_status(namespace, name)}"
                    )
                return self.device_status(namespace, name)

        return await asyncio.to_thread(wait)

    def _apply_status(
        self, namespace: str, name: str, content_type: str, query: dict[str, list[str]], body: Any
    ) -> tuple[int, Any]:
        if content_type != APPLY:  # the plugin applies; merge patches are not served here
            return 415, _status(415, "UnsupportedMediaType", f"{content_type} is not served")
        with self._changed:
            claim = self.claims.get((namespace, name))
            if claim is None:
                return 404, _status(404, "NotFound", f"resourceclaims {name!r} not found")
            changed = json.loads(json.dumps(claim))
            try:
                self.status.apply(
                    changed,
                    body,
                    query.get("fieldManager", [""])[0],
                    query.get("force", [""])[0] == "true",
                )
            except Refusal as e:
                return e.code, _status(e.code, e.reason, e.message)
            changed["metadata"]["resourceVersion"] = str(next(self._versions))
            self.claims[(namespace, name)] = changed
            self._changed.notify_all()
            return 200, changed

    def stall_claims(self) -> None:
        """Hold every claim read, from now until `answer_claims`."""
        self._claims_answered.clear()

    def answer_claims(self) -> None:
        """Answer the held claim reads, and the next ones at once."""
        self._claims_answered.set()

    async def wait_claim_reads(self, count: int, timeout: float = 20.0) -> None:
        """Until `count` claim reads have come in (answered or held)."""

        def wait() -> None:
            with self._changed:
                if not self._changed.wait_for(lambda: self.claim_reads >= count, timeout):
                    raise AssertionError(f"{self.claim_reads} claim reads, never {count}")

        await asyncio.to_thread(wait)

    def _read_claim(self, namespace: str, name: str) -> tuple[int, Any]:
        with self._changed:
            self.claim_reads += 1
            self._changed.notify_all()
        self._claims_answered.wait()
        with self._changed:
            if self.claims_down:
                return 503, _status(503, "ServiceUnavailable", "the test took the server down")
            claim = self.claims.get((namespace, name))
            if claim is None:
                return 404, _status(404, "NotFound", f"resourceclaims {name!r} not found")
            return 200, claim

    # --- validation ---

    def faults(self, body: dict[str, Any]) -> list[str]:
        try:
            # strict: a field the v1 model does not have (v1beta1's `basic`) is refused
            model = V1ResourceSlice.model_validate(body)
        except ValueError as e:  # pydantic's ValidationError
            return [f"not a V1ResourceSlice: {e}"]
        out = []
        if model.spec is None or model.metadata is None:
            return ["no spec or metadata"]
        if (body.get("apiVersion"), body.get("kind")) != ("resource.k8s.io/v1", "ResourceSlice"):
            out.append(f"apiVersion/kind {body.get('apiVersion')}/{body.get('kind')}")
        spec = body["spec"]
        if spec.get("driver") != self.driver:
            out.append(f"driver {spec.get('driver')!r}")
        if spec.get("nodeName") != self.node:  # the node authorizer allows only its own
            out.append(f"nodeName {spec.get('nodeName')!r}")
        pool = spec.get("pool", {})
        if not pool.get("name") or not DNS_SUBDOMAIN.fullmatch(pool["name"]):
            out.append(f"pool name {pool.get('name')!r}")
        if not isinstance(pool.get("generation"), int) or pool["generation"] < 0:
            out.append(f"pool generation {pool.get('generation')!r}")
        if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] < 1:
            out.append(f"resourceSliceCount {pool.get('resourceSliceCount')!r}")
        owners = body["metadata"].get("ownerReferences") or []
        expected = {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self.node_uid}
        if [{k: o.get(k) for k in expected} for o in owners] != [expected]:
            out.append(f"ownerReferences {owners}")
        devices = spec.get("devices") or []
        counter_sets = spec.get("sharedCounters") or []
        if devices and counter_sets:
            out.append("both devices and sharedCounters")
        if len(counter_sets) > COUNTER_SETS_PER_SLICE:
            out.append(f"{len(counter_sets)} counter sets")
        for c in counter_sets:
            out += [f"counter set {c['name']!r}: {f}" for f in _counter_faults(c)]
        limit = DEVICES_PER_SLICE
        if any(d.get("consumesCounters") or d.get("taints") for d in devices):
            limit = DEVICES_PER_SLICE_ADVANCED
        if len(devices) > limit:
            out.append(f"{len(devices)} devices (at most {limit})")
        names = [d.get("name", "") for d in devices]
        if len(set(names)) != len(names):
            out.append(f"device names repeat: {names}")
        for d in devices:
            out += [f"device {d.get('name')!r}: {f}" for f in self._device_faults(d)]
        return out

    def _device_faults(self, device: dict[str, Any]) -> list[str]:
        out = []
        if not DNS_LABEL.fullmatch(device.get("name", "")):
            out.append("name is not a DNS label")
        attributes = device.get("attributes") or {}
        if len(attributes) + len(device.get("capacity") or {}) > ATTRIBUTES_AND_CAPACITIES:
            out.append("over 32 attributes and capacities")
        for key, value in attributes.items():
            domain, _, short = key.rpartition("/")
            if not C_IDENTIFIER.fullmatch(short) or (
                domain and not DNS_SUBDOMAIN.fullmatch(domain)
            ):
                out.append(f"attribute name {key!r}")
            if len(value) != 1 or not set(value) <= VALUE_KINDS:
                out.append(f"attribute {key}: not exactly one value: {value}")
            text = value.get("string")
            if text is not None and len(text.encode()) > STRING_BYTES:
                out.append(f"attribute {key}: {len(text.encode())} bytes")
        consumes = device.get("consumesCounters") or []
        if len(consumes) > CONSUMPTIONS_PER_DEVICE:
            out.append(f"{len(consumes)} counter consumptions")
        if len({c["counterSet"] for c in consumes}) != len(consumes):
            out.append("a counter set consumed twice")
        for c in consumes:
            out += [f"consumes {c['counterSet']!r}: {f}" for f in _counter_faults(c)]
        for taint in device.get("taints") or []:
            domain, _, name = taint.get("key", "").rpartition("/")
            if (
                not LABEL_VALUE.fullmatch(name)
                or not name
                or (domain and not DNS_SUBDOMAIN.fullmatch(domain))
            ):
                out.append(f"taint key {taint.get('key')!r}")
            if not LABEL_VALUE.fullmatch(taint.get("value", "")):
                out.append(f"taint value {taint.get('value')!r}")
            if taint.get("effect") not in TAINT_EFFECTS:
                out.append(f"taint effect {taint.get('effect')!r}")
        return out

    # --- HTTP ---

    def _write(self, method: str, name: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        with self._changed:
            if self.fail_writes:
                self.fail_writes -= 1
                return 500, _status(500, "InternalError", "the test made this write fail")
            if method == "DELETE":
                reply: Any = self.slices.pop(name, None)  # the object, as the API server has it
                if reply is None:
                    return 404, _status(404, "NotFound", f"resourceslices {name!r} not found")
            else:
                assert body is not None
                faults = self.faults(body)
                if faults:
                    self.invalid += faults
                    return 422, _status(422, "Invalid", "; ".join(faults))
                meta = body["metadata"]
                now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                for device in body["spec"].get("devices") or []:
                    for taint in device.get("taints") or []:
                        taint.setdefault("timeAdded", now)
                if method == "POST":
                    name = meta.pop("generateName") + uuid.uuid4().hex[:5]
                    meta["name"], meta["uid"] = name, str(uuid.uuid4())
                elif name not in self.slices:
                    return 404, _status(404, "NotFound", f"resourceslices {name!r} not found")
                elif (
                    meta.get("resourceVersion") != self.slices[name]["metadata"]["resourceVersion"]
                ):
                    return 409, _status(409, "Conflict", "the object has been modified")
                meta["resourceVersion"] = str(next(self._versions))
                self.slices[name] = reply = body
            self.writes += 1
            self._changed.notify_all()
            return (201 if method == "POST" else 200), reply

    def _list(self, query: dict[str, list[str]]) -> dict[str, Any]:
        wanted = dict(r.split("=", 1) for r in query.get("fieldSelector", [""])[0].split(",") if r)
        assert set(wanted) <= {"spec.driver", "spec.nodeName"}, wanted
        with self._changed:
            items = [
                s
                for s in self.slices.values()
                if all(s["spec"].get(k.removeprefix("spec.")) == v for k, v in wanted.items())
            ]
            return {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSliceList",
                "metadata": {"resourceVersion": str(next(self._versions))},
                "items": json.loads(json.dumps(items)),
            }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _reply(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                try:
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up on a held answer: what a slow server sees

            def handle_one_request(self) -> None:
                try:
                    super().handle_one_request()
                except _CutShort:
                    self.close_connection = True  # the API server drops such a request too

            def _body(self) -> dict[str, Any]:
                size = int(self.headers.get("Content-Length", "0"))
                data = self.rfile.read(size)
                if len(data) < size:  # urllib3 sends the body after the headers
                    raise _CutShort(f"{self.command} {self.path}: {len(data)} of {size} bytes")
                body: dict[str, Any] = json.loads(data or b"{}")
                return body

            def do_GET(self) -> None:
                url = urlparse(self.path)
                if url.path in ("/version", "/version/"):  # the client asks the latter
                    major, minor = server.version
                    self._reply(200, _version_info(major, minor))
                elif url.path == f"/api/v1/nodes/{server.node}":
                    node = {"name": server.node, "uid": server.node_uid}
                    self._reply(200, {"apiVersion": "v1", "kind": "Node", "metadata": node})
                elif url.path == SLICES:
                    self._reply(200, server._list(parse_qs(url.query)))
                elif claim := CLAIMS.fullmatch(url.path):
                    self._reply(*server._read_claim(claim[1], claim[2]))
                else:
                    self._reply(404, _status(404, "NotFound", url.path))

            def do_POST(self) -> None:
                assert urlparse(self.path).path == SLICES, self.path
                self._reply(*server._write("POST", "", self._body()))

            def do_PATCH(self) -> None:
                url = urlparse(self.path)
                claim = CLAIM_STATUS.fullmatch(url.path)
                assert claim is not None, self.path
                kind = self.headers.get("Content-Type", "")
                query = parse_qs(url.query)
                self._reply(*server._apply_status(claim[1], claim[2], kind, query, self._body()))

            def do_PUT(self) -> None:
                name = urlparse(self.path).path.removeprefix(SLICES + "/")
                self._reply(*server._write("PUT", name, self._body()))

            def do_DELETE(self) -> None:
                name = urlparse(self.path).path.removeprefix(SLICES + "/")
                self._body()
                self._reply(*server._write("DELETE", name, None))

        return Handler

    @contextmanager
    def running(self) -> Iterator[ApiServer]:
        self._serve()
        try:
            yield self
        finally:
            self.answer_claims()  # a held read's thread must not outlive the server
            self._stop()

    @contextmanager
    def unreachable(self) -> Iterator[None]:
        """Nothing listens on the server's port meanwhile (connections are refused), as
        when the API server is down with nothing in front of it; then it listens again, on
        the same port."""
        address = self._http.server_address
        self._stop()
        try:
            yield
        finally:
            self._http = ThreadingHTTPServer(address, self._handler())
            self._serve()

    def _serve(self) -> None:
        # shutdown() waits for serve_forever's next poll: 0.5 s by default, at every test's end
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def _stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join()


class _CutShort(Exception):
    """A request whose client went away before its whole body came (a plugin stopped
    between the headers and the body): not a request the server may act on."""


def _version(slice_: dict[str, Any]) -> Any:
    return slice_["metadata"]["resourceVersion"]


def _counter_faults(counters: dict[str, Any]) -> list[str]:
    """A counter set, or a device's consumption of one: DNS-label names, at most 32
    counters, each a whole, non-negative quantity (all rdmad-dra writes)."""
    name = counters.get("name", counters.get("counterSet", ""))
    out = [] if DNS_LABEL.fullmatch(name) else [f"name {name!r} is not a DNS label"]
    values = counters.get("counters") or {}
    if not values or len(values) > COUNTERS_PER_SET:
        out.append(f"{len(values)} counters")
    for key, counter in values.items():
        if not DNS_LABEL.fullmatch(key) or not str(counter.get("value", "")).isdigit():
            out.append(f"counter {key!r}: {counter}")
    return out


def _version_info(major: int, minor: int) -> dict[str, str]:
    """/version as an API server answers it (a vendor's `minor` may carry a `+`)."""
    return {
        "major": str(major),
        "minor": f"{minor}+",
        "gitVersion": f"v{major}.{minor}.0",
        "gitCommit": "0" * 40,
        "gitTreeState": "clean",
        "buildDate": "2026-09-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Success" if code < 300 else "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
