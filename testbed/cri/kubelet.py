"""The kubelet's side of CRI, in the order it makes the calls: a pod sandbox (which runs the
CNI ADD), then each container: ImageStatus, CreateContainer (with the CDI devices a DRA
driver's NodePrepareResources returned, in CRI's CDIDevices), StartContainer. The messages
carry what the kubelet puts in them that containerd acts on: the pod's metadata (its uid
reaches CNI as K8S_POD_UID), the kubelet's labels, log paths."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.cri.client import Cri, Exec
from testbed.cri.containerd import IMAGE


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    uid: str
    sandbox_id: str
    config: Any  # the PodSandboxConfig it was made with; CreateContainer takes it again


@dataclass(frozen=True)
class Container:
    pod: Pod
    id: str


class Kubelet:
    def __init__(self, cri: Cri, logs: Path) -> None:
        self.cri = cri
        self.logs = logs  # /var/log/pods on a node

    async def run_pod(
        self,
        name: str,
        namespace: str = "team",
        uid: str = "",
        attempt: int = 0,
        cgroup_parent: str = "",
        host_network: bool = False,
    ) -> Pod:
        """`uid`: the pod's, when a test prepared claims for it first (else a new one).
        `attempt`: 1 and up for a sandbox the kubelet makes again for the same pod (its
        last one died or changed). `cgroup_parent`: the pod's cgroup, which the kubelet
        made before this call (else the runtime's default). `host_network`: the pod spec's
        hostNetwork (the node's netns and host name: no CNI call)."""
        pb = self.cri.pb
        uid = uid or str(uuid.uuid4())
        network = pb.NODE if host_network else pb.POD
        options = pb.NamespaceOption(network=network)
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(
                name=name, uid=uid, namespace=namespace, attempt=attempt
            ),
            hostname="" if host_network else name,  # the node's: no UTS namespace of its own
            log_directory=str(self.logs / f"{namespace}_{name}_{uid}"),
            labels={
                "io.kubernetes.pod.name": name,
                "io.kubernetes.pod.namespace": namespace,
                "io.kubernetes.pod.uid": uid,
            },
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=cgroup_parent,
                security_context=pb.LinuxSandboxSecurityContext(namespace_options=options),
            ),
        )
        return Pod(name, namespace, uid, await self.cri.run_pod_sandbox(config), config)

    async def run_container(
        self,
        pod: Pod,
        name: str,
        cdi_devices: tuple[str, ...] = (),
        command: tuple[str, ...] = ("/bin/sleep", "3600"),
        attempt: int = 0,
        mounts: tuple[Any, ...] = (),
        image: str = IMAGE,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> Container:
        """A started container in `pod`, with the CDI devices named (`kind=name` each).
        `attempt`: the container's restart count (the kubelet's next one after it died, or
        in a sandbox made again while the old sandbox's container is not removed yet).
        `mounts`: CRI Mounts (host paths bound into the container). `command` () runs the
        image's entrypoint, with `args`; `env`: the container's environment."""
        pb = self.cri.pb
        assert await self.cri.image_id(image), f"{image} is not in the runtime"
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=attempt),
            image=pb.ImageSpec(image=image),
            command=list(command),
            args=list(args),
            envs=[pb.KeyValue(key=k, value=v) for k, v in (env or {}).items()],
            log_path=f"{name}/0.log",
            labels={
                "io.kubernetes.container.name": name,
                "io.kubernetes.pod.name": pod.name,
                "io.kubernetes.pod.namespace": pod.namespace,
                "io.kubernetes.pod.uid": pod.uid,
            },
            CDI_devices=[pb.CDIDevice(name=d) for d in cdi_devices],
            mounts=list(mounts),
        )
        container_id = await self.cri.create_container(pod.sandbox_id, config, pod.config)
        await self.cri.start_container(container_id)
        return Container(pod, container_id)

    async def exec(self, container: Container, *cmd: str, timeout_s: int = 30) -> Exec:
        """`cmd` in the container (ExecSync, as `kubectl exec` reaches it); must exit 0."""
        done = await self.cri.exec_sync(container.id, *cmd, timeout_s=timeout_s)
        assert done.exit_code == 0, f"{' '.join(cmd)} in the container: {done}"
        return done

    async def pod_ip(self, pod: Pod) -> str:
        """The pod's IP as the kubelet reads it (PodSandboxStatus), from the CNI result."""
        status = await self.cri.pod_sandbox_status(pod.sandbox_id)
        return str(status.network.ip)

    async def stop_pod(self, pod: Pod) -> None:
        await self.cri.stop_pod_sandbox(pod.sandbox_id)

    async def remove_pod(self, pod: Pod) -> None:
        await self.cri.remove_pod_sandbox(pod.sandbox_id)
