"""CDI specs: what podman 4.3 and containerd 1.6 can read, one device per name of a claim."""

from __future__ import annotations

from typing import Any

from rdmad.daemon.cdi import spec_for
from rdmad.model import Attachment, CharDev, ChardevKind, Claim

UVERBS = CharDev(ChardevKind.UVERBS, "/dev/infiniband/uverbs0", 231, 192)


def claim(cdi_name: str = "") -> Claim:
    return Claim(
        id="c0ffee",
        device="mlx5_0",
        attachment=Attachment(4026532000, "", 1),
        ifname="net1",
        shared=False,
        owner="",
        created_at_us=0,
        chardevs=(UVERBS,),
        cdi_name=cdi_name,
    )


def test_spec_is_cdi_050_which_podman_43_reads() -> None:
    assert spec_for(claim())["cdiVersion"] == "0.5.0"


def test_spec_names_the_claim_id() -> None:
    devices = spec_for(claim())["devices"]
    assert devices == [
        {
            "name": "c0ffee",
            "containerEdits": {
                "env": ["RDMAD_DEVICE=mlx5_0", "NCCL_IB_HCA==mlx5_0"],  # no GIDs: no index
                "deviceNodes": [
                    {"path": "/dev/infiniband/uverbs0", "type": "c", "major": 231, "minor": 192}
                ],
            },
        }
    ]


def test_cdi_name_is_a_second_device_with_the_same_nodes() -> None:
    devices: Any = spec_for(claim("web.eth0"))["devices"]
    assert [d["name"] for d in devices] == ["c0ffee", "web.eth0"]
    assert devices[1]["containerEdits"] == devices[0]["containerEdits"]
