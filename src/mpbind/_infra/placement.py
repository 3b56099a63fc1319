"""Where the PEs of an NVSHMEM job run, checked before NVSHMEM initialises.

NVSHMEM (3.4 to 3.8 at least) decides on each PE alone whether several PEs share its GPU, then runs
bootstrap collectives only on the PEs that do: with a different number of PEs on each GPU (3 PEs
placed 2 + 1 on two GPUs) ``nvshmemx_init_attr`` never returns on any PE. With PEs sharing a GPU
that are not evenly strided it exits the process ("Could not form NVSHMEMI_TEAM_SAME_GPU").

So before initialising, every PE tells the others its GPU (host name and device UUID) over the
channel the job already has (a :class:`~mpbind.process_group.ProcessGroup`: its MPI communicator,
a torch.distributed group, a callable), in one fixed-size exchange; each then checks the same list
with :func:`problem` and raises the same :class:`~mpbind.errors.PlacementError`, before any PE
enters NVSHMEM.
"""

from __future__ import annotations

from mpbind.errors import PlacementError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: import time
if TYPE_CHECKING:
    from collections.abc import Sequence

    from mpbind.process_group import ProcessGroup

#: A PE's GPU: (host name, device UUID as hex), or None when it could not be told.
Gpu = tuple[str, str] | None


def this_gpu(device: int | None) -> Gpu:
    """This process's GPU: `device` (a CUDA ordinal), or the current device when None. None when no
    driver or GPU answers (initialisation then fails on its own, with the library's error)."""
    import socket  # here: importing it costs more than the rest of mpbind.nvshmem's import

    from mpbind._infra import cuda as _cuda

    try:
        return socket.gethostname(), _cuda.device_uuid(device).hex()
    except Exception:  # noqa: BLE001 - no usable driver: nothing to compare, the library reports it
        return None


def problem(gpus: Sequence[Gpu]) -> str | None:
    """Why NVSHMEM cannot initialise PEs placed on `gpus` (item i: PE i's GPU), or None when it can.

    The one place that says which placements NVSHMEM refuses: every GPU must hold the same number
    of PEs, and the PEs sharing a GPU must be evenly strided. Unknown GPUs check nothing."""
    if not gpus or any(g is None for g in gpus):
        return None
    by_gpu: dict[Gpu, list[int]] = {}
    for pe, gpu in enumerate(gpus):
        by_gpu.setdefault(gpu, []).append(pe)
    if len({len(pes) for pes in by_gpu.values()}) > 1:
        return (f"every GPU must hold the same number of PEs, or NVSHMEM's initialisation never returns; "
                f"run as many PEs on each GPU (or all on one GPU) [{describe(by_gpu)}]")
    for pes in by_gpu.values():
        if len({b - a for a, b in zip(pes, pes[1:], strict=False)}) > 1:
            return (f"the PEs sharing a GPU must be evenly strided (PEs {_pes(pes)} are not), or NVSHMEM exits "
                    f"the process [{describe(by_gpu)}]")
    return None


def describe(by_gpu: dict[Gpu, list[int]]) -> str:
    """``2 + 1 PEs on 2 GPUs: host a GPU-0a1b2c3d PEs 0, 1; host a GPU-4e5f6a7b PE 2``."""
    shares = " + ".join(str(len(pes)) for pes in by_gpu.values())
    where = "; ".join(f"host {gpu[0]} GPU-{gpu[1][:8]} {'PEs' if len(pes) > 1 else 'PE'} {_pes(pes)}"
                      for gpu, pes in by_gpu.items() if gpu is not None)
    return f"{shares} PEs on {len(by_gpu)} GPUs: {where}"


def _pes(pes: list[int]) -> str:
    return ", ".join(map(str, pes))


# A GPU as it travels: known (1 byte), the device UUID (16 bytes), the host name (UTF-8, NUL-padded;
# Linux's are at most 64 bytes, DNS names at most 253).
_UUID, _HOST = 16, 255
GPU_BYTES = 1 + _UUID + _HOST


def encode(gpu: Gpu) -> bytes:
    """`gpu` as the fixed-size record the PEs exchange."""
    if gpu is None:
        return bytes(GPU_BYTES)
    host = gpu[0].encode("utf-8", "replace")[:_HOST]
    return b"\1" + bytes.fromhex(gpu[1])[:_UUID].ljust(_UUID, b"\0") + host.ljust(_HOST, b"\0")


def decode(record: bytes) -> Gpu:
    """The GPU a record of :func:`encode` holds."""
    if len(record) != GPU_BYTES or record[0] != 1:
        return None
    return record[1 + _UUID:].rstrip(b"\0").decode("utf-8", "replace"), record[1:1 + _UUID].hex()


def exchange(group: ProcessGroup, gpu: Gpu) -> list[Gpu]:
    """Every PE's GPU (in PE order), this one's being `gpu`. Collective over `group`."""
    return [decode(record) for record in group.allgather_bytes(encode(gpu))]


def check(group: ProcessGroup, device: int | None, library: str = "NVSHMEM") -> None:
    """Collective over the PEs of `group` (in PE order): exchange GPUs, then raise
    :class:`PlacementError` on every PE alike when :func:`problem` finds one."""
    gpus = exchange(group, this_gpu(device))
    found = problem(gpus)
    if found is not None:
        raise PlacementError(f"{library} cannot initialise {len(gpus)} PEs placed this way: {found}")
