"""A CRI client that calls containerd as the kubelet does: the CRI v1 services over gRPC on
the runtime's unix socket, with the messages of runtime_v1.proto (compiled at first use by
grpcio-tools, in memory)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

# Named from the checkout's root, which is on sys.path under pytest: grpc looks a .proto up
# on sys.path, and names its modules after that path.
PROTO = "testbed/cri/runtime_v1.proto"
TIMEOUT_S = 60.0  # a CRI call that takes longer is a hung runtime
# gRPC retries a socket that is not there yet after 1 s, then longer; containerd makes its
# socket a quarter of a second after it starts.
RECONNECT = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.max_reconnect_backoff_ms", 200)]


@functools.cache
def api() -> tuple[Any, Any]:
    """(messages, services) of runtime.v1."""
    messages, services = grpc.protos_and_services(PROTO)
    return messages, services


@dataclass(frozen=True)
class Exec:
    """What ExecSync gave back."""

    exit_code: int
    stdout: str
    stderr: str


class Cri:
    """RuntimeService and ImageService of one runtime; `pb` builds their messages."""

    def __init__(self, socket: Path) -> None:
        self.pb, services = api()
        self.channel = grpc.aio.insecure_channel(f"unix://{socket}", options=RECONNECT)
        self.runtime = services.RuntimeServiceStub(self.channel)
        self.images = services.ImageServiceStub(self.channel)

    async def wait_ready(self, timeout: float) -> None:
        """Until the runtime answers on its socket (gRPC waits for the socket to appear)."""
        await self.runtime.Version(
            self.pb.VersionRequest(version="v1"), timeout=timeout, wait_for_ready=True
        )

    async def not_ready(self) -> dict[str, str]:
        """Status's conditions that are false (the kubelet checks RuntimeReady and
        NetworkReady), with their reasons and messages."""
        reply = await self.runtime.Status(self.pb.StatusRequest(), timeout=TIMEOUT_S)
        return {c.type: f"{c.reason}: {c.message}" for c in reply.status.conditions if not c.status}

    async def image_id(self, reference: str) -> str:
        """The image's id, "" when the runtime does not have it (the kubelet pulls then)."""
        spec = self.pb.ImageSpec(image=reference)
        reply = await self.images.ImageStatus(
            self.pb.ImageStatusRequest(image=spec), timeout=TIMEOUT_S
        )
        return str(reply.image.id)

    async def run_pod_sandbox(self, config: Any) -> str:
        reply = await self.runtime.RunPodSandbox(
            self.pb.RunPodSandboxRequest(config=config), timeout=TIMEOUT_S
        )
        return str(reply.pod_sandbox_id)

    async def pod_sandbox_status(self, sandbox_id: str) -> Any:
        reply = await self.runtime.PodSandboxStatus(
            self.pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id), timeout=TIMEOUT_S
        )
        return reply.status

    async def list_pod_sandboxes(self) -> list[str]:
        reply = await self.runtime.ListPodSandbox(
            self.pb.ListPodSandboxRequest(), timeout=TIMEOUT_S
        )
        return [str(item.id) for item in reply.items]

    async def stop_pod_sandbox(self, sandbox_id: str) -> None:
        await self.runtime.StopPodSandbox(
            self.pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=TIMEOUT_S
        )

    async def remove_pod_sandbox(self, sandbox_id: str) -> None:
        await self.runtime.RemovePodSandbox(
            self.pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=TIMEOUT_S
        )

    async def create_container(self, sandbox_id: str, config: Any, sandbox_config: Any) -> str:
        request = self.pb.CreateContainerRequest(
            pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox_config
        )
        reply = await self.runtime.CreateContainer(request, timeout=TIMEOUT_S)
        return str(reply.container_id)

    async def start_container(self, container_id: str) -> None:
        await self.runtime.StartContainer(
            self.pb.StartContainerRequest(container_id=container_id), timeout=TIMEOUT_S
        )

    async def exec_sync(self, container_id: str, *cmd: str, timeout_s: int = 30) -> Exec:
        request = self.pb.ExecSyncRequest(container_id=container_id, cmd=cmd, timeout=timeout_s)
        reply = await self.runtime.ExecSync(request, timeout=timeout_s + TIMEOUT_S)
        return Exec(reply.exit_code, reply.stdout.decode(), reply.stderr.decode())

    async def close(self) -> None:
        await self.channel.close()
