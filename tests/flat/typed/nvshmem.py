"""A small typed program using the flat NVSHMEM bindings; `mypy --strict` must accept it.

It is also runnable: it needs libnvshmem_host (from the nvidia-nvshmem-cu13 wheel) but no GPU,
and it never initialises NVSHMEM.
"""

from __future__ import annotations

import numpy as np

from mpbind.bindings import nvshmem
from mpbind.errors import LibraryError, NVSHMEMError, NVSHMEMOutOfMemoryError


def version() -> tuple[int, int, int]:
    return nvshmem.vendor_get_version_info()


def name_and_spec() -> tuple[str, tuple[int, int]]:
    return nvshmem.info_get_name(), nvshmem.info_get_version()


def unique_id_attributes(rank: int, nranks: int) -> tuple[nvshmem.UniqueId, nvshmem.InitAttr]:
    uid: nvshmem.UniqueId = nvshmem.get_uniqueid()
    assert nvshmem.UniqueId(bytes(uid)) == uid and len(uid) == uid.nbytes
    attr = nvshmem.InitAttr()
    nvshmem.set_attr_uniqueid_args(rank, nranks, uid, attr)
    args: nvshmem.InitArgs = attr.args
    uid_args: nvshmem.UniqueIdArgs = args.uid_args
    assert uid_args.myrank == rank
    version: int = attr.version
    assert version == nvshmem.INIT_ATTR_V2_IDENTIFIER
    return uid, attr


def team_config(contexts: int) -> nvshmem.TeamConfig:
    config = nvshmem.TeamConfig(num_contexts=contexts)
    config.uniqueid = 7
    padding: tuple[int, ...] = config.padding
    assert len(padding) == 48
    return config


def initialised() -> bool:
    return nvshmem.init_status() == nvshmem.InitStatus.IS_INITIALIZED


def put_floats(dest: int, source: int, count: int, pe: int) -> None:
    nvshmem.put(np.float32, dest, source, count, pe)
    nvshmem.put("double", dest, source, count, pe)
    nvshmem.sum_reduce_on_stream("float", nvshmem.Team.WORLD, dest, source, count, 0)


def launch(kernel: int, buffer_address: int, value_address: int, stream: int) -> int:
    """A collective launch of fill(buffer, value) over the largest co-resident grid (not run here)."""
    grid: int = nvshmem.collective_launch_query_gridsize(kernel, (128, 1, 1), None, 0)
    nvshmem.collective_launch(kernel, grid, [128], [buffer_address, value_address], 0, stream)
    config = nvshmem.LaunchConfig(gridDim=nvshmem.Dim3(x=grid, y=1, z=1), blockDim=nvshmem.Dim3(x=128, y=1, z=1))
    nvshmem.collective_launch_attr(nvshmem.CollectiveLaunchAttr(cuda_config=config), kernel, (buffer_address,))
    return grid


def explain(error: LibraryError) -> str:
    if isinstance(error, NVSHMEMOutOfMemoryError):
        return f"out of symmetric memory in {error.function}"
    if isinstance(error, NVSHMEMError):
        return f"{error.function} -> {error.status_name} ({error.status})"
    return str(error)


def try_malloc(size: int) -> int | None:
    try:
        return nvshmem.malloc(size)
    except NVSHMEMOutOfMemoryError as error:
        print(explain(error))
        return None


def main() -> None:
    print(version(), name_and_spec(), initialised(), team_config(2).num_contexts)
    print(unique_id_attributes(0, 1)[1].args.uid_args, try_malloc(1 << 20))


if __name__ == "__main__":
    main()
