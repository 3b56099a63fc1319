"""Misuse of the flat NVSHMEM bindings: mypy --strict must reject each marked line with that error code."""

from mpbind.bindings import nvshmem

pe = nvshmem.malloc("1 MiB")  # error: arg-type
name: int = nvshmem.info_get_name()  # error: assignment
uid: bytes = nvshmem.get_uniqueid()  # error: assignment
nvshmem.set_attr_uniqueid_args(0, 1, nvshmem.get_uniqueid(), nvshmem.TeamConfig())  # error: arg-type
status: nvshmem.Status = nvshmem.InitStatus.NOT_INITIALIZED  # error: assignment
major, minor, patch = nvshmem.info_get_version()  # error: misc
attr = nvshmem.InitAttr(no_such_field=5)  # error: call-arg
nvshmem.collective_launch(1.5, 1, 1, None, 0, 0)  # error: arg-type
nvshmem.collective_launch(1, "8", 1, None, 0, 0)  # error: arg-type
nvshmem.collective_launch_attr(nvshmem.LaunchConfig(), 1)  # error: arg-type
grid: str = nvshmem.collective_launch_query_gridsize(1, 128, None, 0)  # error: assignment
