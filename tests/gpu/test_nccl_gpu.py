"""The flat NCCL bindings on one GPU with one rank, checked against PyTorch.

Buffers are torch CUDA tensors (``data_ptr()``) and work is enqueued on torch's
current stream. With one rank every collective has a known result: torch computes
it from the same inputs.
"""

from __future__ import annotations

import importlib
import inspect
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mpbind._infra import loader as _loader  # noqa: E402
from mpbind.bindings import _coverage, nccl  # noqa: E402
from mpbind.errors import FunctionNotFoundError, NCCLError  # noqa: E402

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

INIT_TIMEOUT_S = 120.0
COUNT = 1000  # elements per collective: small

DTYPES: dict[Any, nccl.DataType] = {
    torch.float32: nccl.DataType.FLOAT32,
    torch.float16: nccl.DataType.FLOAT16,
    torch.bfloat16: nccl.DataType.BFLOAT16,
    torch.int32: nccl.DataType.INT32,
}
DTYPE_IDS = [str(d).removeprefix("torch.") for d in DTYPES]


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _stream() -> int:
    return int(torch.cuda.current_stream().cuda_stream)


def _data(dtype: Any, n: int = COUNT, seed: int = 0) -> Any:
    """Small integers: exact in every dtype, so sums and maxima compare exactly."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(-50, 50, (n,), generator=gen, dtype=torch.int32)
    return values.to(dtype).cuda()


def _sentinel(dtype: Any, n: int) -> Any:
    return torch.full((n,), 77, dtype=dtype, device="cuda")


def _wait_ready(comm: nccl.Comm, timeout_s: float = INIT_TIMEOUT_S) -> nccl.Result | int:
    """Poll a non-blocking communicator until it is no longer in progress."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = nccl.comm_get_async_error(comm)
        if state != nccl.Result.IN_PROGRESS:
            return state
        if time.monotonic() > deadline:
            raise TimeoutError(f"communicator still in progress after {timeout_s} s")
        time.sleep(0.001)


@pytest.fixture(scope="module")
def comm() -> Iterator[nccl.Comm]:
    torch.cuda.set_device(0)
    torch.cuda.init()
    handle = nccl.comm_init_rank(1, nccl.get_unique_id(), 0)
    assert handle != 0
    yield handle
    torch.cuda.synchronize()
    nccl.comm_finalize(handle)
    nccl.comm_destroy(handle)


# --- queries -------------------------------------------------------------------------------


def test_comm_queries(comm: nccl.Comm) -> None:
    assert nccl.comm_count(comm) == 1
    assert nccl.comm_user_rank(comm) == 0
    assert nccl.comm_cu_device(comm) == torch.cuda.current_device()
    assert nccl.comm_get_async_error(comm) == nccl.Result.SUCCESS


def test_loaded_version_matches(comm: nccl.Comm) -> None:
    version = _loader.loaded_version("nccl")
    assert version is not None
    assert _loader.format_version("nccl", nccl.get_version()) == version


# --- collectives ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(DTYPES), ids=DTYPE_IDS)
@pytest.mark.parametrize("op", [nccl.RedOp.SUM, nccl.RedOp.MAX], ids=["sum", "max"])
def test_all_reduce(comm: nccl.Comm, dtype: Any, op: nccl.RedOp) -> None:
    inputs = [_data(dtype)]
    recv = _sentinel(dtype, COUNT)
    nccl.all_reduce(inputs[0].data_ptr(), recv.data_ptr(), COUNT, DTYPES[dtype], op, comm,
                    _stream())
    torch.cuda.synchronize()
    stacked = torch.stack(inputs)
    expected = stacked.sum(0).to(dtype) if op == nccl.RedOp.SUM else stacked.amax(0)
    assert torch.equal(recv, expected)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=DTYPE_IDS)
def test_all_reduce_in_place_plain_ints(comm: nccl.Comm, dtype: Any) -> None:
    buf = _data(dtype, seed=1)
    expected = buf.clone()
    # Enums as plain ints.
    nccl.all_reduce(buf.data_ptr(), buf.data_ptr(), COUNT, int(DTYPES[dtype]), 0, comm,
                    _stream())
    torch.cuda.synchronize()
    assert torch.equal(buf, expected)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=DTYPE_IDS)
def test_broadcast(comm: nccl.Comm, dtype: Any) -> None:
    send = _data(dtype, seed=2)
    recv = _sentinel(dtype, COUNT)
    nccl.broadcast(send.data_ptr(), recv.data_ptr(), COUNT, DTYPES[dtype], 0, comm, _stream())
    torch.cuda.synchronize()
    assert torch.equal(recv, send)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=DTYPE_IDS)
def test_all_gather(comm: nccl.Comm, dtype: Any) -> None:
    nranks = nccl.comm_count(comm)
    send = _data(dtype, seed=3)
    recv = _sentinel(dtype, COUNT * nranks)
    nccl.all_gather(send.data_ptr(), recv.data_ptr(), COUNT, DTYPES[dtype], comm, _stream())
    torch.cuda.synchronize()
    assert torch.equal(recv, torch.cat([send] * nranks))


@pytest.mark.parametrize("dtype", list(DTYPES), ids=DTYPE_IDS)
def test_reduce_scatter(comm: nccl.Comm, dtype: Any) -> None:
    nranks = nccl.comm_count(comm)
    send = _data(dtype, COUNT * nranks, seed=4)
    recv = _sentinel(dtype, COUNT)
    nccl.reduce_scatter(send.data_ptr(), recv.data_ptr(), COUNT, DTYPES[dtype], nccl.RedOp.SUM,
                        comm, _stream())
    torch.cuda.synchronize()
    expected = send.view(nranks, COUNT).sum(0).to(dtype)[: COUNT]
    assert torch.equal(recv, expected)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=DTYPE_IDS)
def test_reduce(comm: nccl.Comm, dtype: Any) -> None:
    send = _data(dtype, seed=5)
    recv = _sentinel(dtype, COUNT)
    nccl.reduce(send.data_ptr(), recv.data_ptr(), COUNT, DTYPES[dtype], nccl.RedOp.SUM, 0, comm,
                _stream())
    torch.cuda.synchronize()
    assert torch.equal(recv, torch.stack([send]).sum(0).to(dtype))


@pytest.mark.parametrize("dtype", list(DTYPES), ids=DTYPE_IDS)
def test_send_recv_to_self(comm: nccl.Comm, dtype: Any) -> None:
    send = _data(dtype, seed=6)
    recv = _sentinel(dtype, COUNT)
    rank = nccl.comm_user_rank(comm)
    nccl.group_start()
    try:
        nccl.send(send.data_ptr(), COUNT, DTYPES[dtype], rank, comm, _stream())
        nccl.recv(recv.data_ptr(), COUNT, DTYPES[dtype], rank, comm, _stream())
    finally:
        nccl.group_end()
    torch.cuda.synchronize()
    assert torch.equal(recv, send)


def test_collective_error_is_typed(comm: nccl.Comm) -> None:
    # On a communicator of its own, so that a failed enqueue cannot disturb the shared one.
    own = nccl.comm_split(comm, 0, 0)
    assert own != 0
    try:
        send = _data(torch.float32)
        with pytest.raises(NCCLError) as info:
            nccl.all_reduce(send.data_ptr(), send.data_ptr(), COUNT, 12345, nccl.RedOp.SUM, own,
                            _stream())
        assert info.value.function == "ncclAllReduce"
        assert info.value.status == nccl.Result.INVALID_ARGUMENT
        assert "ncclAllReduce" in str(info.value)
    finally:
        torch.cuda.synchronize()
        nccl.comm_finalize(own)
        nccl.comm_destroy(own)


# --- memory and registration ---------------------------------------------------------------


def test_mem_alloc_round_trip(comm: nccl.Comm) -> None:
    nbytes = COUNT * 4
    ptr = nccl.mem_alloc(nbytes)
    assert ptr != 0
    try:
        src = _data(torch.float32, seed=7)
        out = _sentinel(torch.float32, COUNT)
        # Write into the NCCL allocation and read it back, both through NCCL.
        nccl.all_reduce(src.data_ptr(), ptr, COUNT, nccl.DataType.FLOAT32, nccl.RedOp.SUM, comm,
                        _stream())
        nccl.all_reduce(ptr, out.data_ptr(), COUNT, nccl.DataType.FLOAT32, nccl.RedOp.SUM, comm,
                        _stream())
        torch.cuda.synchronize()
        assert torch.equal(out, src)
    finally:
        nccl.mem_free(ptr)


def test_comm_register(comm: nccl.Comm) -> None:
    buf = _data(torch.float32, seed=8)
    expected = buf.clone()
    handle = nccl.comm_register(comm, buf.data_ptr(), buf.numel() * buf.element_size())
    assert isinstance(handle, int)
    try:
        nccl.all_reduce(buf.data_ptr(), buf.data_ptr(), COUNT, nccl.DataType.FLOAT32,
                        nccl.RedOp.SUM, comm, _stream())
        torch.cuda.synchronize()
        assert torch.equal(buf, expected)
    finally:
        nccl.comm_deregister(comm, handle)


def test_comm_window_register(comm: nccl.Comm) -> None:
    # Windows need memory NCCL can map (cuMem-backed): take it from ncclMemAlloc.
    nbytes = max(COUNT * 4, nccl.WIN_REQUIRED_ALIGNMENT)
    ptr = nccl.mem_alloc(nbytes)
    try:
        win = nccl.comm_window_register(comm, ptr, nbytes, nccl.WIN_COLL_SYMMETRIC)
        assert isinstance(win, int)
        try:
            src = _data(torch.float32, seed=9)
            out = _sentinel(torch.float32, COUNT)
            nccl.all_reduce(src.data_ptr(), ptr, COUNT, nccl.DataType.FLOAT32, nccl.RedOp.SUM,
                            comm, _stream())
            nccl.all_reduce(ptr, out.data_ptr(), COUNT, nccl.DataType.FLOAT32, nccl.RedOp.SUM,
                            comm, _stream())
            torch.cuda.synchronize()
            assert torch.equal(out, src)
        finally:
            nccl.comm_window_deregister(comm, win)
    finally:
        torch.cuda.synchronize()
        nccl.mem_free(ptr)


# --- communicator lifecycle ----------------------------------------------------------------


def test_comm_split(comm: nccl.Comm) -> None:
    new = nccl.comm_split(comm, 0, 0)
    assert new != 0
    assert new != comm
    try:
        assert nccl.comm_count(new) == 1
        assert nccl.comm_user_rank(new) == 0
        buf = _data(torch.int32, seed=10)
        out = _sentinel(torch.int32, COUNT)
        nccl.all_reduce(buf.data_ptr(), out.data_ptr(), COUNT, nccl.DataType.INT32,
                        nccl.RedOp.SUM, new, _stream())
        torch.cuda.synchronize()
        assert torch.equal(out, buf)
    finally:
        nccl.comm_finalize(new)
        nccl.comm_destroy(new)


def test_comm_split_nocolor(comm: nccl.Comm) -> None:
    new = nccl.comm_split(comm, nccl.SPLIT_NOCOLOR, 0)
    assert not new  # NULL handle: this rank is in no new communicator


def test_comm_split_with_config(comm: nccl.Comm) -> None:
    new = nccl.comm_split(comm, 1, 0, nccl.Config(commName="split-with-config"))
    assert new != 0
    try:
        assert nccl.comm_count(new) == 1
    finally:
        nccl.comm_finalize(new)
        nccl.comm_destroy(new)


def test_non_blocking_init(comm: nccl.Comm) -> None:
    config = nccl.Config(blocking=0)
    assert config.blocking == 0
    new = nccl.comm_init_rank_config(1, nccl.get_unique_id(), 0, config)
    assert new != 0  # the handle exists while initialisation is in progress
    try:
        assert _wait_ready(new) == nccl.Result.SUCCESS
        assert nccl.comm_count(new) == 1
        buf = _data(torch.float32, seed=11)
        out = _sentinel(torch.float32, COUNT)
        nccl.all_reduce(buf.data_ptr(), out.data_ptr(), COUNT, nccl.DataType.FLOAT32,
                        nccl.RedOp.SUM, new, _stream())
        assert _wait_ready(new) == nccl.Result.SUCCESS
        torch.cuda.synchronize()
        assert torch.equal(out, buf)
        nccl.comm_finalize(new)  # may return ncclInProgress: not an error
        assert _wait_ready(new) == nccl.Result.SUCCESS
    finally:
        nccl.comm_destroy(new)


def test_finalize_and_destroy() -> None:
    torch.cuda.set_device(0)
    new = nccl.comm_init_rank(1, nccl.get_unique_id(), 0)
    assert nccl.comm_get_async_error(new) == nccl.Result.SUCCESS
    nccl.comm_finalize(new)
    nccl.comm_destroy(new)


# --- functions newer than the loaded library -----------------------------------------------

_DUMMIES: dict[str, Callable[[], Any]] = {
    "team": nccl.Team,
    "cft_team": nccl.Team,
    "multimem": nccl.MultimemHandle,
    "reqs": nccl.DevCommRequirements,
    "dev_comm": nccl.DevComm,
    "signal_descs": list,
    "comm_ids": list,
    "exclude_ranks_list": list,
    "key": lambda: "NCCL_DEBUG",
    "unique_id": lambda: None,
    # A non-NULL handle: the flat layer refuses NULL for handles the library does not check, before
    # the missing symbol is reported (the function is never called: the library lacks it).
    "comm": lambda: 8,
}
# Required parameters named `config` of functions that take a struct other than Config.
_CONFIG_DUMMIES: dict[str, Callable[[], Any]] = {
    "set_encryption": nccl.EncryptionConfig,
}


def _dummy_args(py_name: str, function: Callable[..., Any]) -> list[Any]:
    args: list[Any] = []
    for param in inspect.signature(function).parameters.values():
        if param.default is not inspect.Parameter.empty:
            break  # optional trailing parameters keep their defaults
        if param.name == "config":
            args.append(_CONFIG_DUMMIES.get(py_name, lambda: None)())
        elif param.name in _DUMMIES:
            args.append(_DUMMIES[param.name]())
        else:
            args.append(0)
    return args


def _newer_functions() -> list[tuple[str, str, str]]:
    names = {c: py for c, py, _ in _coverage.COVERAGE["nccl"] if py is not None}
    return [(c, names[c], since) for c, since in sorted(_coverage.SINCE["nccl"].items())
            if c in names and not since.startswith("<=")]


@pytest.mark.parametrize(("c_name", "py_name", "since"), _newer_functions(),
                         ids=[c for c, _, _ in _newer_functions()])
def test_newer_functions_raise_function_not_found(c_name: str, py_name: str, since: str) -> None:
    internal = importlib.import_module("mpbind.bindings._internal.nccl")

    loaded = _loader.loaded_version("nccl")
    assert loaded is not None
    if _version_tuple(since) <= _version_tuple(loaded):
        pytest.skip(f"{c_name} ({since}) is in the loaded NCCL {loaded}")
    # Never call into a library that does export it (dummy arguments could crash it).
    assert internal.symbol_address(c_name) == 0, f"NCCL {loaded} exports {c_name} ({since})"
    function = getattr(nccl, py_name)
    with pytest.raises(FunctionNotFoundError) as info:
        function(*_dummy_args(py_name, function))
    err = info.value
    assert isinstance(err, NotImplementedError)
    assert err.function == c_name
    assert err.loaded_version == loaded
    assert err.first_version == since
    assert c_name in str(err)
    assert loaded in str(err)
    assert since in str(err)
    assert err.library_path == _loader.load("nccl").path
