"""The check of the PEs' placement on GPUs before NVSHMEM initialises (the same PlacementError on every
PE, from one fixed-size exchange), and the notice of a long wait."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mpbind import nvshmem as nv
from mpbind import process_group as pg
from mpbind._infra import placement as _placement
from mpbind.errors import PlacementError, UsageError

sys.path.insert(0, str(Path(__file__).parent))
from fake_groups import ThreadWorld, same_error  # noqa: E402

A0, A1, B0 = ("a", "00" * 16), ("a", "11" * 16), ("b", "00" * 16)  # host a GPUs 0 and 1, host b GPU 0
UID = b"\0" * 128


@pytest.mark.parametrize("gpus", [
    [A0, A0, A0],              # 3 PEs on one GPU
    [A0, A1],                  # one PE per GPU
    [A0, A0, A1, A1],          # 2 + 2, blocks
    [A0, A1, A0, A1],          # 2 + 2, round robin
    [A0, A1, B0],              # one per GPU on two hosts (the same UUID on two hosts is two GPUs)
    [A0, None, A1],            # a PE that could not tell its GPU: nothing to compare
    [],
])
def test_placements_nvshmem_initialises(gpus: list[Any]) -> None:
    assert _placement.problem(gpus) is None


def test_uneven_pes_per_gpu_is_refused() -> None:
    found = _placement.problem([A0, A0, A1])
    assert found is not None
    assert "same number of PEs" in found and "2 + 1 PEs on 2 GPUs" in found
    assert f"GPU-{'00' * 4} PEs 0, 1" in found and f"GPU-{'11' * 4} PE 2" in found


def test_unevenly_strided_pes_on_a_gpu_are_refused() -> None:
    found = _placement.problem([A0, A0, A1, A0, A1, A1])  # PEs 0, 1, 3 share GPU 0
    assert found is not None and "evenly strided" in found and "0, 1, 3" in found


def frames_of(gpus: list[Any]) -> list[bytes]:
    """The frames PEs on `gpus` send in the placement exchange."""
    frames: list[bytes] = []

    def record(data: bytes) -> list[bytes]:
        frames.append(data)
        return [data, data]

    for gpu in gpus:
        _placement.exchange(pg.CallableProcessGroup(0, 2, allgather=record), gpu)
    return frames


def test_every_pe_raises_the_same_error() -> None:
    frames = frames_of([A0, A0, A1])
    messages = []
    for pe in range(3):
        with pytest.raises(PlacementError) as info:
            _placement.check(pg.CallableProcessGroup(pe, 3, allgather=lambda _mine: frames), None)
        messages.append(str(info.value))
    assert len(set(messages)) == 1 and "NVSHMEM cannot initialise 3 PEs" in messages[0]
    assert isinstance(info.value, UsageError)


def test_placements_travel_in_fixed_records() -> None:
    for gpu in (A0, ("h" * 300, "ab" * 16), None):
        record = _placement.encode(gpu)
        assert len(record) == _placement.GPU_BYTES
        back = _placement.decode(record)
        assert back == (None if gpu is None else (gpu[0][:255], gpu[1]))  # a host name is at most 255 bytes


def test_every_pe_raises_the_same_placement_error() -> None:
    world = ThreadWorld(3)
    gpus = [A0, A0, A1]  # PEs 0 and 1 on GPU 0 of host a, PE 2 on its GPU 1
    assert world.run(lambda g: _placement.exchange(g, gpus[g.rank])) == [gpus] * 3

    def check(g: pg.ProcessGroup) -> None:
        found = _placement.problem(_placement.exchange(g, gpus[g.rank]))
        if found:
            raise PlacementError(found)

    assert "2 + 1 PEs on 2 GPUs" in same_error(world.run(check), PlacementError)


def test_init_checks_the_placement_before_initialising() -> None:
    frames = frames_of([A0, A0, A1])
    sent: list[bytes] = []

    def allgather(mine: bytes) -> list[bytes]:
        sent.append(mine)
        return frames

    with pytest.raises(PlacementError, match="2 \\+ 1 PEs on 2 GPUs"):
        nv.init(UID, 0, 3, placement_via=allgather)
    assert len(sent) == 1  # this PE's GPU (None here: no GPU) went out once
    assert not nv.is_initialized() and not nv.is_finalized()


def test_a_long_init_wait_is_noticed_and_no_runtime_is_made() -> None:
    # The flat initialisation replaced by a wait that initialises nothing: the PE says it is waiting,
    # then the core refuses to make a runtime over an incomplete initialisation.
    code = (
        "import time\n"
        "from mpbind import nvshmem as nv\n"
        "from mpbind.errors import MpbindError\n"
        "nv._select_device = lambda device: None\n"
        "nv._flat().init_attr = lambda flags, attr: time.sleep(1.0)\n"
        "try: nv.init(b'\\0' * 128, 0, 2, notice_after=0.2)\n"
        "except MpbindError as e: print(type(e).__name__, e)\n"
        "print(nv.is_initialized())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "nvshmem.init (rank 0 of 2, uid bootstrap) has waited 0.2 s for the other PEs" in proc.stderr
    assert "Ctrl-C interrupts it" in proc.stderr
    out = proc.stdout.splitlines()
    assert out[0].startswith("MpbindError NVSHMEM initialisation returned without initialising NVSHMEM"), out
    assert out[1] == "False"
