"""A small typed program using the flat NCCL bindings; `mypy --strict` must accept it.

It is also runnable: it needs libnccl (from the nvidia-nccl-cu13 wheel) but no GPU.
"""

from __future__ import annotations

from mpbind.bindings import nccl
from mpbind.errors import LibraryError, NCCLError, NCCLInvalidArgumentError


def version() -> tuple[int, int, int]:
    code: int = nccl.get_version()
    return code // 10000, code % 10000 // 100, code % 100


def new_unique_id() -> bytes:
    uid: nccl.UniqueId = nccl.get_unique_id()
    same = nccl.UniqueId(bytes(uid))
    assert same == uid and len(uid) == nccl.UNIQUE_ID_BYTES
    return bytes(uid)


def non_blocking_config(name: str) -> nccl.Config:
    config = nccl.Config(blocking=0, commName=name)
    config.cgaClusterSize = 2
    netname: str | None = config.netName
    assert netname is None
    size: int = config.size
    assert size == config.nbytes
    return config


def rank_and_size(comm: nccl.Comm) -> tuple[int, int]:
    return nccl.comm_user_rank(comm), nccl.comm_count(comm)


def null_comm() -> nccl.Comm:
    return nccl.Comm(0)


def float32() -> nccl.DataType:
    return nccl.DataType.FLOAT32


def describe(result: nccl.Result) -> str:
    text: str | None = nccl.get_error_string(result)
    return f"{result.name}: {text}"


def explain(error: LibraryError) -> str:
    if isinstance(error, NCCLInvalidArgumentError):
        return f"bad argument to {error.function}"
    if isinstance(error, NCCLError):
        return f"{error.function} -> {error.status_name} ({error.status})"
    return str(error)


def main() -> None:
    print(version(), len(new_unique_id()), non_blocking_config("x").commName)
    print(float32(), describe(nccl.Result.INVALID_ARGUMENT), null_comm())
    print(explain(NCCLInvalidArgumentError("ncclCommCount", 4, "ncclInvalidArgument")))


if __name__ == "__main__":
    main()
