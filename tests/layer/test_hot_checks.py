"""The hot calls' checks, run by the core exactly as before a library call but without one
(mpbind._core._testing.nccl_plan, nvshmem_plan, cufftmp_exec, cublasmp_operand): what each call
would pass to the library, and every refusal, on any machine."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mpbind import _core
from mpbind.cublasmp import GridLayout
from mpbind.errors import UsageError
from mpbind.nccl import DataType, RedOp

sys.path.insert(0, str(Path(__file__).parents[1] / "core"))
from dlpack_objects import FLAG_READ_ONLY, KDL_CPU, STREAMS, Exported, InterfaceArray  # noqa: E402

T = _core._testing
COL_MAJOR, ROW_MAJOR = int(GridLayout.COL_MAJOR), int(GridLayout.ROW_MAJOR)


def nccl(name: str, sendbuf: Any = None, recvbuf: Any = None, *, size: int = 2, device: int = 0,
         op: Any = "sum", peer: Any = None, stream: Any = None) -> tuple[int, ...]:
    return tuple(T.nccl_plan(name, 0, size, device, sendbuf, recvbuf, op, peer, stream))


def arr(n: int, typestr: str = "<f4", ptr: int = 0x1000, readonly: bool = False) -> InterfaceArray:
    return InterfaceArray((n,), typestr, ptr=ptr, readonly=readonly)


# --- NCCL -----------------------------------------------------------------------------------------


def test_nccl_calls() -> None:
    s, r = arr(8, ptr=0x1000), arr(8, ptr=0x2000)
    assert nccl("all_reduce", s, r, op="max", stream=STREAMS[0]) == (0x1000, 0x2000, 8, int(DataType.FLOAT32),
                                                                    int(RedOp.MAX), 0, STREAMS[0])
    assert nccl("reduce", s, r, peer=1, op=RedOp.PROD)[2:6] == (8, int(DataType.FLOAT32), int(RedOp.PROD), 1)
    assert nccl("broadcast", s, r, peer=np.int64(1))[5] == 1
    assert nccl("all_gather", arr(4), arr(8))[2] == 4  # the send count
    assert nccl("reduce_scatter", arr(8), arr(4), op="AVG")[2:5] == (4, int(DataType.FLOAT32), int(RedOp.AVG))
    assert nccl("all_to_all", arr(8), arr(8))[2] == 4  # per peer
    assert nccl("send", arr(3, "<i8"), peer=1)[0:4] == (0x1000, 0, 3, int(DataType.INT64))
    assert nccl("recv", recvbuf=arr(3, "|u1"), peer=0)[1:4] == (0x1000, 3, int(DataType.UINT8))


def test_nccl_in_place_describes_once() -> None:
    x = arr(5)
    assert nccl("all_reduce", x, x)[:3] == (0x1000, 0x1000, 5)
    ro = arr(5, readonly=True)
    with pytest.raises(UsageError, match="recvbuf is read-only"):
        nccl("all_reduce", ro, ro)


@pytest.mark.parametrize(("spec", "code"), [("bfloat16", DataType.BFLOAT16), ("float8_e4m3fn", DataType.FLOAT8E4M3),
                                            ("float8_e5m2", DataType.FLOAT8E5M2), ("float16", DataType.FLOAT16),
                                            (np.uint64, DataType.UINT64)])
def test_nccl_every_type(spec: Any, code: DataType) -> None:
    assert nccl("all_reduce", (0x10, 4, spec), (0x20, 4, spec))[3] == int(code)


def test_nccl_fp8_and_empty_arrays_through_dlpack() -> None:
    fp8 = Exported((16,), 10, 8)
    assert nccl("all_reduce", fp8, fp8)[2:4] == (16, int(DataType.FLOAT8E4M3))
    empty = Exported((4, 0), 4, 16, strides=(1, 1), data=0)  # PyTorch's empty bf16 (4, 0)
    assert nccl("all_reduce", empty, empty)[2:4] == (0, int(DataType.BFLOAT16))


REFUSALS: dict[str, tuple[type[Exception], str, dict[str, Any]]] = {
    "host array": (UsageError, "sendbuf must be in GPU memory", {"sendbuf": np.zeros(4, np.float32)}),
    "host dlpack": (UsageError, "recvbuf must be in GPU memory", {"recvbuf": Exported((8,), device=(KDL_CPU, 0))}),
    "other device": (UsageError, "sendbuf is on device 0 but the communicator uses device 1", {"device": 1}),
    "dtypes differ": (UsageError, "sendbuf is float32 but recvbuf is int32", {"recvbuf": arr(8, "<i4")}),
    "counts differ": (UsageError, "sendbuf has 8 elements and recvbuf 4; expected sendbuf = 1 x recvbuf",
                      {"recvbuf": arr(4)}),
    "no NCCL type": (UsageError, "sendbuf: NCCL has no complex64 type", {"sendbuf": arr(8, "<c8")}),
    "not contiguous": (UsageError, "sendbuf must be C-contiguous",
                       {"sendbuf": InterfaceArray((4, 2), strides=(4, 16))}),
    "read-only": (UsageError, "recvbuf is read-only", {"recvbuf": Exported((8,), flags=FLAG_READ_ONLY)}),
    "not an array": (TypeError, "sendbuf: expected an array", {"sendbuf": object()}),
    "short tuple": (TypeError, r"recvbuf given as a tuple must be \(ptr, count, dtype\)", {"recvbuf": (1, 2)}),
    "bad op": (UsageError, "unknown reduction 'mean'", {"op": "mean"}),
    "op type": (TypeError, "op must be a reduction name", {"op": 1.5}),
    "op bool": (TypeError, "op must be a reduction name", {"op": True}),
    "bad stream": (TypeError, "stream", {"stream": "default"}),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_nccl_refusals(case: str) -> None:
    error, match, changes = REFUSALS[case]
    kwargs: dict[str, Any] = {"sendbuf": arr(8), "recvbuf": arr(8, ptr=0x2000)}
    kwargs.update(changes)
    with pytest.raises(error, match=match):
        nccl("all_reduce", **kwargs)


def test_nccl_counts_per_collective() -> None:
    with pytest.raises(UsageError, match=r"expected sendbuf = 0.5 x recvbuf for this collective on 2 ranks"):
        nccl("all_gather", arr(4), arr(4))
    with pytest.raises(UsageError, match=r"expected sendbuf = 3 x recvbuf for this collective on 3 ranks"):
        nccl("reduce_scatter", arr(4), arr(4), size=3)
    with pytest.raises(UsageError, match="all_to_all: 9 elements do not split into 2 equal blocks"):
        nccl("all_to_all", arr(9), arr(9))


@pytest.mark.parametrize("rank", [2, -1, True, 1.0, "0", None])
def test_nccl_ranks(rank: Any) -> None:
    with pytest.raises(UsageError, match=r"root must be a rank in \[0, 2\)"):
        nccl("broadcast", arr(4), arr(4), peer=rank)
    with pytest.raises(UsageError, match=r"peer must be a rank in \[0, 2\)"):
        nccl("send", arr(4), peer=rank)


# --- NVSHMEM --------------------------------------------------------------------------------------

HEAP = [(0x10000, 4096), (0x20000, 4096)]


def nv(name: str, *args: Any, npes: int = 2, limited: bool = False) -> tuple[Any, ...]:
    return tuple(T.nvshmem_plan(name, args, npes, limited, HEAP))


def sym(n: int, offset: int = 0, typestr: str = "<f4", region: int = 0) -> InterfaceArray:
    return InterfaceArray((n,), typestr, ptr=HEAP[region][0] + offset)


def test_nvshmem_calls() -> None:
    assert nv("put", sym(4), arr(4, ptr=0x5000), 1, STREAMS[1]) == ("put", 0, 0x10000, 0x5000, 16, 1, STREAMS[1],
                                                                     None)
    assert nv("get", arr(4, ptr=0x5000), sym(4, region=1), np.int32(1))[2:6] == (0x5000, 0x20000, 16, 1)
    assert nv("quiet", STREAMS[2]) == ("quiet", 0, 0, 0, 0, 0, STREAMS[2], None)
    assert nv("broadcast", sym(4), sym(4, region=1), 1)[1:6] == (0, 0x10000, 0x20000, 16, 1)
    assert nv("fcollect", sym(8), sym(4, region=1))[4] == 16  # bytes of src
    assert nv("alltoall", sym(8), sym(8, region=1))[4] == 16  # bytes per PE
    assert nv("reduce", "sum", sym(4, typestr="<f2"), sym(4, typestr="<f2", region=1))[4:] == (
        4, 0, 0, "nvshmemx_half_sum_reduce_on_stream")
    assert nv("reduce", "xor", sym(4, typestr="<u8"), sym(4, typestr="<u8", region=1))[7] == (
        "nvshmemx_uint64_xor_reduce_on_stream")
    bf16 = Exported((4,), 4, 16, data=0x10000)
    assert nv("reduce", "max", bf16, Exported((4,), 4, 16, data=0x20000))[7] == "nvshmemx_bfloat16_max_reduce_on_stream"


NV_REFUSALS: dict[str, tuple[str, tuple[Any, ...], str]] = {
    "put to local memory": ("put", (arr(4, ptr=0x5000), arr(4)), "dest is not NVSHMEM symmetric memory"),
    "get from local memory": ("get", (arr(4), arr(4, ptr=0x5000)), "src is not NVSHMEM symmetric memory"),
    "past the allocation": ("put", (sym(4, offset=4090), arr(4)), "dest is not NVSHMEM symmetric memory"),
    "host source": ("put", (sym(4), np.zeros(4, np.float32)), "src must be in GPU memory"),
    "dtypes differ": ("put", (sym(4), arr(4, "<i4")), "put: dest has dtype float32, src int32"),
    "sizes differ": ("get", (arr(8), sym(4)), "get: dest has 8 elements, src 4"),
    "pe range": ("put", (sym(4), arr(4), 2), r"pe must be a PE number in \[0, 2\), not 2"),
    "pe bool": ("put", (sym(4), arr(4), True), "pe must be a PE number"),
    "read-only dest": ("get", (arr(4, readonly=True), sym(4)), "dest is read-only"),
    "root range": ("broadcast", (sym(4), sym(4, region=1), 5), r"root must be a PE number in \[0, 2\)"),
    "fcollect size": ("fcollect", (sym(4), sym(4, region=1)), "fcollect: dest has 4 elements; 2 PEs x 4"),
    "alltoall blocks": ("alltoall", (sym(3), sym(3, region=1)), "alltoall: 3 elements do not split into 2"),
    "unknown op": ("reduce", ("mean", sym(4), sym(4, region=1)), "reduce: unknown op 'mean'"),
    "bitwise float": ("reduce", ("and", sym(4), sym(4, region=1)), "reduce: and is not available for float32"),
    "complex": ("reduce", ("sum", sym(4, typestr="<c8"), sym(4, typestr="<c8", region=1)),
                "reduce: sum is not available for complex64"),
    "team type": ("barrier", ("world",), "team must be an mpbind.nvshmem.Team or None, not str"),
}


@pytest.mark.parametrize("case", sorted(NV_REFUSALS))
def test_nvshmem_refusals(case: str) -> None:
    name, args, match = NV_REFUSALS[case]
    if name in ("put", "get") and len(args) == 2:
        args = (*args, 1)
    error = TypeError if case == "team type" else UsageError
    with pytest.raises(error, match=match):
        nv(name, *args)


def test_nvshmem_limited_mode_refuses_collectives_first() -> None:
    for name, args in (("barrier", ()), ("broadcast", (sym(4), sym(4, region=1), 0)),
                       ("reduce", ("sum", sym(4), sym(4, region=1)))):
        with pytest.raises(UsageError, match="limited multi-PE-per-GPU mode"):
            nv(name, *args, limited=True)
    assert nv("put", sym(4), arr(4), 1, limited=True)[0] == "put"  # RMA works in that mode


# --- cuBLASMp: new operands of a planned matmul ----------------------------------------------------


def numroc(n: int, nb: int, iproc: int, isrcproc: int, nprocs: int) -> int:
    """ScaLAPACK's NUMROC (cuBLASMp's numroc needs the driver to load)."""
    mydist = (nprocs + iproc - isrcproc) % nprocs
    nblocks, extra = divmod(n // nb, nprocs)
    num = nblocks * nb
    return num + nb if mydist < extra else num + n % nb if mydist == extra else num


@pytest.mark.parametrize(("m", "mb", "rsrc", "nprocs"), [(10, 3, 0, 2), (10, 3, 1, 3), (7, 7, 0, 2), (1, 4, 1, 4)])
def test_cublasmp_local_shape_is_numroc(m: int, mb: int, rsrc: int, nprocs: int) -> None:
    pieces = []
    for rank in range(nprocs):  # an nprocs x 1 grid, column-major: the process row is the rank
        rows, cols = T.cublasmp_local_shape(m, 5, mb, 5, rsrc, 0, nprocs, 1, COL_MAJOR, rank)
        assert (rows, cols) == (numroc(m, mb, rank, rsrc, nprocs), 5)
        pieces.append(rows)
    assert sum(pieces) == m
    # a 2 x 2 grid, row-major: rank 1 is process (0, 1)
    assert T.cublasmp_local_shape(8, 8, 2, 3, 0, 0, 2, 2, ROW_MAJOR, 1) == (4, numroc(8, 3, 1, 0, 2))


def test_cublasmp_new_operands() -> None:
    col_major = InterfaceArray((4, 3), "<f4", strides=(4, 16), ptr=0x9000)  # lld 4
    assert T.cublasmp_operand(col_major, "a", 4, 3, 4, "float32") == 0x9000
    padded = InterfaceArray((4, 3), "<f4", strides=(4, 32))  # lld 8
    with pytest.raises(UsageError, match="a has leading dimension 8; the plan's descriptor has 4"):
        T.cublasmp_operand(padded, "a", 4, 3, 4, "float32")
    with pytest.raises(UsageError, match="b is 3 x 4; the plan's local piece is 4 x 3"):
        T.cublasmp_operand(InterfaceArray((3, 4), "<f4", strides=(4, 12)), "b", 4, 3, 4, "float32")
    with pytest.raises(UsageError, match="must be column-major"):
        T.cublasmp_operand(InterfaceArray((4, 3), "<f4"), "a", 4, 3, 4, "float32")
    with pytest.raises(UsageError, match="a has dtype float64, expected float32"):
        T.cublasmp_operand(InterfaceArray((4, 3), "<f8", strides=(8, 32)), "a", 4, 3, 4, "float32")
    with pytest.raises(UsageError, match="d is read-only"):
        T.cublasmp_operand(InterfaceArray((4, 3), "<f4", strides=(4, 16), readonly=True), "d", 4, 3, 4, "float32",
                           True)
    with pytest.raises(UsageError, match="GPU memory"):
        T.cublasmp_operand(np.zeros((4, 3), np.float32, order="F"), "c", 4, 3, 4, "float32")
