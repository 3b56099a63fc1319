"""The hot path on one GPU with one NCCL rank: every element type NCCL has, float8 and empty arrays
of any shape from PyTorch, CuPy and JAX, every coercion path agreeing on CUDA tensors, and the
refusals the core makes before NCCL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

from mpbind import _core, nccl  # noqa: E402
from mpbind.errors import UsageError  # noqa: E402

NCCL_TYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16",
              "float8_e4m3fn", "float8_e5m2"]
EMPTY_SHAPES = [(0,), (4, 0), (0, 4), (2, 0, 3)]


@pytest.fixture(scope="module")
def comm() -> Iterator[nccl.Communicator]:
    torch.cuda.set_device(0)
    c = nccl.Communicator.init(1, 0, nccl.get_unique_id())
    yield c
    c.close()


def _torch_dtype(name: str) -> Any:
    return getattr(torch, name)


@pytest.mark.parametrize("name", NCCL_TYPES)
def test_every_nccl_type_from_torch(comm: nccl.Communicator, name: str) -> None:
    x = (torch.arange(64, device="cuda") % 7).to(_torch_dtype(name))
    out = torch.zeros_like(x)
    op = "max" if name.startswith("float8") else "sum"  # one rank: both give x
    comm.all_reduce(x, out, op=op)
    comm.broadcast(x, x, root=0)  # in place
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.uint8), x.view(torch.uint8))


@pytest.mark.parametrize("shape", EMPTY_SHAPES, ids=str)
@pytest.mark.parametrize("name", ["float32", "bfloat16", "float8_e4m3fn"])
def test_empty_torch_arrays(comm: nccl.Communicator, shape: tuple[int, ...], name: str) -> None:
    x = torch.zeros(shape, device="cuda", dtype=_torch_dtype(name))
    comm.all_reduce(x, x)
    comm.all_gather(x, torch.zeros_like(x))
    torch.cuda.synchronize()


def test_every_path_agrees_on_cuda_tensors() -> None:
    torch.cuda.set_device(0)
    paths = ["torch", "dlpack"] + (["exchange"] if hasattr(torch.Tensor, "__dlpack_c_exchange_api__") else [])
    for t in (torch.zeros(4, 3, device="cuda"), torch.zeros(3, 4, device="cuda").t(),
              torch.zeros(4, 0, device="cuda", dtype=torch.bfloat16), torch.zeros(8, device="cuda")[::2],
              torch.zeros(16, device="cuda", dtype=torch.float8_e5m2)):
        # (float8 tensors have no interface typestr: that path falls back to DLPack.)
        seen = {p: _core.array_info(t, source=p) for p in [*paths, "interface"]}
        for path, (ptr, shape, _, dtype, device, readonly, contiguous, _) in seen.items():
            assert (shape, dtype, device, readonly, contiguous) == (
                tuple(t.shape), str(t.dtype).removeprefix("torch."), 0, False, t.is_contiguous()), path
            assert ptr == t.data_ptr() or t.numel() == 0, path  # an empty tensor's pointer is anything


def test_torch_refusals_before_nccl(comm: nccl.Communicator) -> None:
    x = torch.zeros(8, device="cuda")
    with pytest.raises(UsageError, match="sendbuf must be C-contiguous"):
        comm.all_reduce(torch.zeros(4, 4, device="cuda").t(), torch.zeros(16, device="cuda"))
    with pytest.raises(UsageError, match="NCCL has no complex64 type"):
        comm.all_reduce(x.to(torch.complex64), x.to(torch.complex64))
    with pytest.raises(UsageError, match="sendbuf is float32 but recvbuf is bfloat16"):
        comm.all_reduce(x, x.to(torch.bfloat16))
    if torch.cuda.device_count() > 1:
        with pytest.raises(UsageError, match="is on device 1 but the communicator uses device 0"):
            comm.all_reduce(torch.zeros(8, device="cuda:1"), x)


def test_cupy_arrays(comm: nccl.Communicator) -> None:
    cp = pytest.importorskip("cupy")
    with cp.cuda.Device(0):
        x = cp.arange(32, dtype=cp.float32)
        out = cp.zeros_like(x)
        s = cp.cuda.Stream(non_blocking=True)
        comm.all_reduce(x, out, stream=s)
        s.synchronize()
        assert bool((out == x).all())
        assert _core.array_info(x)[7] == "cupy"
        assert _core.array_info(x)[:7] == _core.array_info(x, source="interface")[:7]
        for shape in EMPTY_SHAPES:
            e = cp.zeros(shape, dtype=cp.float16)
            comm.all_reduce(e, e)
        with pytest.raises(UsageError, match="C-contiguous"):
            comm.all_reduce(cp.zeros((4, 4), cp.float32).T, cp.zeros(16, cp.float32))
        cp.cuda.runtime.deviceSynchronize()


def test_jax_arrays_as_sources(comm: nccl.Communicator) -> None:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the GPU's memory to torch
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    gpu = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpu:
        pytest.skip("JAX sees no GPU")
    for name in ("float32", "bfloat16", "float8_e4m3fn", "float8_e5m2"):
        src = jax.device_put(jnp.arange(16).astype(getattr(jnp, name)), gpu[0])
        src.block_until_ready()
        out = torch.zeros(16, device="cuda", dtype=_torch_dtype(name))
        comm.all_reduce(src, out, op="max")  # a JAX array is read-only to us: a source only
        torch.cuda.synchronize()
        expected = torch.arange(16, device="cuda").to(_torch_dtype(name))
        assert torch.equal(out.view(torch.uint8), expected.view(torch.uint8)), name
    empty = jax.device_put(jnp.zeros((4, 0), jnp.bfloat16), gpu[0])
    comm.all_reduce(empty, torch.zeros(4, 0, device="cuda", dtype=torch.bfloat16))
    torch.cuda.synchronize()


def test_matmul_on_new_operands(comm: nccl.Communicator) -> None:
    """A planned matmul runs again on new arrays of the planned shapes; others are refused first."""
    from mpbind import cublasmp
    from mpbind._infra import loader as _loader
    from mpbind.errors import LibraryNotFoundError

    try:
        _loader.load("cublasmp")
    except LibraryNotFoundError as exc:
        pytest.skip(f"the cuBLASMp library is not available: {exc}")
    m, n, k = 128, 96, 64
    a, b, d = torch.rand(m, k, device="cuda"), torch.rand(k, n, device="cuda"), torch.zeros(m, n, device="cuda")
    a2, b2, d2 = torch.rand(m, k, device="cuda"), torch.rand(k, n, device="cuda"), torch.zeros(m, n, device="cuda")
    s = torch.cuda.Stream()
    handle = cublasmp.Handle(s)
    grid = cublasmp.grid(comm, 1, 1)
    # Row-major tensors as column-major matrices: D^T = B^T A^T.
    with cublasmp.Matmul(handle, cublasmp.Matrix(grid, b.T), cublasmp.Matrix(grid, a.T),
                         cublasmp.Matrix(grid, d.T)) as plan:
        plan.execute()
        plan.execute(a=b2.T, b=a2.T, d=d2.T)
        s.synchronize()
        assert float((d - a @ b).abs().max()) < 1e-3
        assert float((d2 - a2 @ b2).abs().max()) < 1e-3
        with pytest.raises(UsageError, match="the plan's local piece is"):
            plan.execute(a=torch.zeros(n + 1, k, device="cuda").T)
        with pytest.raises(UsageError, match="dtype float64, expected float32"):
            plan.execute(d=d2.double().T)
        with pytest.raises(UsageError, match="must be column-major"):
            plan.execute(d=d2.T.contiguous())  # the planned shape, row-major
        with pytest.raises(UsageError, match="the plan was made without c"):
            plan.execute(c=d2.T)
    handle.close()
