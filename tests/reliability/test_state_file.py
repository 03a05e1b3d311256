"""The state files: a torn or corrupt file at start, and a full disk while claiming."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from dbus_fast import Variant

from rdmad.core.store import State as StoreState
from rdmad.core.store import Store
from rdmad.model import ClaimPhase
from testbed.daemon import DBusCallError
from testbed.faulty_rdmad import PAUSE_AT
from testbed.net import eventually
from tests.reliability.conftest import is_stopped, reliability_rig, settings_of
from tests.support.invariants import assert_invariants
from tests.unit.test_store import a_claim

CLAIM_FILE = "claims/3f92088486aabbcc.json"
CORRUPT = {
    "torn": b'{"version": 2, "claim": {"id": "3f92088486',
    "empty": b"",
    "binary": bytes(range(256)) * 4,
    "wrong-schema": b'{"version": 99, "claim": {}}',
    "wrong-shape": b'{"version": 2, "claim": {"id": 5}}',
}
WHOLE = {"ifname": Variant("s", "rdma0"), "addresses": Variant("as", ["192.0.2.7/24"])}


@pytest.mark.parametrize("kind", list(CORRUPT))
async def test_corrupt_state_file_is_kept_aside_reported_and_rebuilt_from_the_kernel(
    bus_address: str, tmp_path: Path, netns: str, kind: str
) -> None:
    state = tmp_path / "state"
    bad = state / CLAIM_FILE
    bad.parent.mkdir(parents=True)
    bad.write_bytes(CORRUPT[kind])
    async with reliability_rig(bus_address, tmp_path, 2) as rig:
        assert f"state file unreadable: {bad}" in rig.daemon.log(), "the operator is told"
        assert "state file unreadable" in rig.daemon.notified[-1], "and systemctl status says so"
        [aside] = (state / "aside").iterdir()
        assert aside.read_bytes() == CORRUPT[kind], "evidence kept"
        assert await rig.client.manager("ListClaims") == []
        settings = settings_of(rig.nics)
        await assert_invariants(rig.client, rig.nics, settings)
        path = await rig.client.manager("Claim", "ssa{sv}", "sim0", netns, WHOLE)
        await rig.client.call_raw("io.rdmad1", path, "io.rdmad1.Claim", "Release")
        await assert_invariants(rig.client, rig.nics, settings, [netns])
        print(f"corrupt state file ({kind}): daemon up, rebuilt, claim+release ok")


@contextlib.contextmanager
def tiny_tmpfs(where: Path) -> Iterator[Path]:
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(directory: Path) -> Path:
    """Write until ENOSPC; return the filler (delete it to free the space)."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


@pytest.mark.parametrize("when", ["before-pending", "after-netdev-placed"])
async def test_disk_full_fails_the_claim_cleanly_and_rolls_the_kernel_back(
    bus_address: str, tmp_path: Path, netns: str, when: str
) -> None:
    env = {PAUSE_AT: "netdev-placed"} if when.startswith("after") else {}
    with tiny_tmpfs(tmp_path / "state") as state:
        async with reliability_rig(bus_address, tmp_path, 1, env=env) as rig:
            settings = settings_of(rig.nics)
            call = asyncio.ensure_future(
                rig.client.manager("Claim", "ssa{sv}", "sim0", netns, WHOLE)
            )
            if env:
                assert rig.daemon.proc is not None
                pid = rig.daemon.proc.pid
                await eventually(lambda: is_stopped(pid), 10, "the pause")
                # The ACTIVE write goes into the spare file (rdmad.core.store), which a full disk
                # fails only when the spare needs a new page. The kernel has moved the
                # netdev; with the spare gone and the disk full, the ACTIVE write fails.
                (state / "claims" / ".spare").unlink(missing_ok=True)
                filler = fill(state)
                os.kill(pid, signal.SIGCONT)
            else:
                filler = fill(state)
            with pytest.raises(DBusCallError) as err:
                await call
            assert err.value.name == "io.rdmad1.Error.KernelError"
            assert "ENOSPC" in err.value.message, err.value.message
            assert await rig.client.manager("ListClaims") == []
            await assert_invariants(rig.client, rig.nics, settings, [netns])
            # Space back: the daemon works again, and a restart reconciles whatever the
            # failed writes left on disk.
            filler.unlink()
            path = await rig.client.manager("Claim", "ssa{sv}", "sim0", netns, WHOLE)
            await rig.client.call_raw("io.rdmad1", path, "io.rdmad1.Claim", "Release")
            await rig.daemon.kill()
            await rig.daemon.start()
            report = await assert_invariants(rig.client, rig.nics, settings, [netns])
            print(f"disk full {when}: claim -> KernelError ENOSPC, {report.summary()}")


def test_a_full_disk_does_not_fail_a_save_that_fits_in_the_spare(tmp_path: Path) -> None:
    with tiny_tmpfs(tmp_path / "state") as state:
        store = Store(state)
        claim = a_claim()
        store.save(StoreState([claim]))
        claim.phase = ClaimPhase.ACTIVE
        store.save_claim(claim, live=True, pending_restores=[])  # makes the spare
        filler = fill(state)
        try:
            claim.phase = ClaimPhase.RELEASING  # from here on, the spare is rewritten in place
            store.save_claim(claim, live=True, pending_restores=[])
            assert Store(state).load() == StoreState([claim])
        finally:
            filler.unlink()
