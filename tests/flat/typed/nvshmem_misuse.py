"""Misuse of the flat NVSHMEM bindings: mypy --strict must reject each marked line with that error code."""

from mpbind.bindings import nvshmem

pe = nvshmem.malloc("1 MiB")  # error: arg-type
name: int = nvshmem.info_get_name()  # error: assignment
uid: bytes = nvshmem.get_uniqueid()  # error: assignment
nvshmem.set_attr_uniqueid_args(0, 1, nvshmem.get_uniqueid(), nvshmem.TeamConfig())  # error: arg-type
status: nvshmem.Status = nvshmem.InitStatus.NOT_INITIALIZED  # error: assignment
major, minor, patch = nvshmem.info_get_version()  # error: misc
attr = nvshmem.InitAttr(no_such_field=5)  # error: call-arg
