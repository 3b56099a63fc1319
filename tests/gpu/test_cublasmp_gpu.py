"""The flat cuBLASMp bindings on one GPU with one rank, checked against PyTorch.

One NCCL rank, one cuBLASMp handle on a stream of its own (made torch's current stream for
this module), and a 1 x 1 process grid. Buffers are torch CUDA tensors (``data_ptr()``);
scalars (alpha, beta) are host ctypes values passed by address; device workspaces come from
``cublasmp.malloc`` and host workspaces from NumPy.

Layout: cuBLASMp, like cuBLAS and ScaLAPACK, stores local matrices column-major. A column-major
``rows x cols`` matrix ``X`` lives in a row-major torch tensor of shape ``(cols, rows)``:
``X.t().contiguous()`` stores it, ``buf.t()`` reads it back. With ``transa = T`` the stored A
is ``op(A)^T``, so the row-major tensor of ``op(A)`` (``m x k``) is already its storage.
On a 1 x 1 grid the local matrix is the global one; ``lld`` is ``numroc(rows, mb, 0, 0, 1)``.

Every result is compared with a float64 torch reference computed from the same (already
rounded) inputs, with a tolerance that fits the data and compute types.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from mpbind._infra import loader as _loader  # noqa: E402
from mpbind.errors import CuBLASMpError, LibraryNotFoundError  # noqa: E402

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="the cuBLASMp GPU tests use torch tensors as buffers")

try:
    _loader.load("cublasmp")
except LibraryNotFoundError as _exc:
    pytest.skip(f"the cuBLASMp library is not available: {_exc}", allow_module_level=True)

from mpbind.bindings import cublasmp, nccl  # noqa: E402
from mpbind.bindings.cublasmp import (  # noqa: E402
    CublasComputeType,
    CublasDiagType,
    CublasFillMode,
    CublasOperation,
    CublasSideMode,
    CudaDataType,
    GridLayout,
    MatmulDescriptorAttribute,
)

M, N, K = 64, 48, 96  # matmul sizes: multiples of 16, as FP8 needs
SEED = 1234
_NO_DESC = cublasmp.MatrixDescriptor(0)  # C is not given (beta is 0): NULL pointer and descriptor

CTypesValue = ctypes.c_int32 | ctypes.c_int64 | ctypes.c_void_p | ctypes.c_float | ctypes.c_double


# --- environment ---------------------------------------------------------------------------


@dataclass
class Env:
    comm: nccl.Comm
    handle: cublasmp.Handle
    grid: cublasmp.Grid
    stream: Any  # torch.cuda.Stream

    def sync(self) -> None:
        self.stream.synchronize()


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    torch.cuda.set_device(0)
    torch.cuda.init()
    previous = torch.cuda.current_stream()
    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)  # torch's work and cuBLASMp's share one stream: ordered
    comm = nccl.comm_init_rank(1, nccl.get_unique_id(), 0)
    handle = cublasmp.create(int(stream.cuda_stream))
    grid = cublasmp.grid_create(1, 1, GridLayout.COL_MAJOR, comm)
    try:
        yield Env(comm, handle, grid, stream)
    finally:
        torch.cuda.synchronize()
        cublasmp.grid_destroy(grid)
        cublasmp.destroy(handle)
        nccl.comm_finalize(comm)
        nccl.comm_destroy(comm)
        torch.cuda.set_stream(previous)


# --- helpers -------------------------------------------------------------------------------


def _addr(value: CTypesValue) -> int:
    return ctypes.addressof(value)


def _scalar(value: float, compute: CublasComputeType) -> ctypes.c_float | ctypes.c_double:
    """alpha/beta: host scalars of the compute type's scale type."""
    if compute in (CublasComputeType.COMPUTE_64F, CublasComputeType.COMPUTE_64F_PEDANTIC):
        return ctypes.c_double(value)
    return ctypes.c_float(value)


def _random(shape: tuple[int, ...], seed: int, scale: float = 1.0) -> Any:
    """Uniform in [-scale, scale), float64 on the host (deterministic)."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) * scale


def _store(x: Any, dtype: Any) -> Any:
    """Column-major device storage of the matrix `x` (rows x cols) as `dtype`."""
    return x.t().contiguous().to(device="cuda", dtype=dtype)


def _load(buf: Any) -> Any:
    """The matrix held in column-major storage `buf`, as float64 on the host."""
    return buf.t().to(torch.float64).cpu()


def _desc(stack: contextlib.ExitStack, env: Env, rows: int, cols: int, dtype: CudaDataType | int,
          mb: int | None = None, nb: int | None = None) -> cublasmp.MatrixDescriptor:
    """A descriptor of a rows x cols matrix on the 1 x 1 grid; blocks default to the whole matrix."""
    mb = rows if mb is None else mb
    nb = cols if nb is None else nb
    lld = max(1, cublasmp.numroc(rows, mb, 0, 0, 1))
    desc = cublasmp.matrix_descriptor_create(rows, cols, mb, nb, 0, 0, lld, dtype, env.grid)
    assert desc != 0
    stack.callback(cublasmp.matrix_descriptor_destroy, desc)
    return desc


@dataclass
class Workspace:
    device: int
    device_bytes: int
    host: Any  # numpy array, kept alive while in use
    host_bytes: int

    @property
    def host_ptr(self) -> int:
        return int(self.host.ctypes.data)


def _workspace(stack: contextlib.ExitStack, env: Env, sizes: tuple[int, int]) -> Workspace:
    device_bytes, host_bytes = sizes
    assert device_bytes >= 0 and host_bytes >= 0
    device = 0
    if device_bytes:
        device = cublasmp.malloc(env.grid, device_bytes)
        assert device != 0

        def release() -> None:
            env.sync()  # nothing may still be using it
            cublasmp.free(env.grid, device)

        stack.callback(release)
    host = np.zeros(max(1, host_bytes), dtype=np.uint8)
    return Workspace(device, device_bytes, host, host_bytes)


def _matmul_desc(stack: contextlib.ExitStack, compute: CublasComputeType) -> cublasmp.MatmulDescriptor:
    desc = cublasmp.matmul_descriptor_create(compute)
    assert desc != 0
    stack.callback(cublasmp.matmul_descriptor_destroy, desc)
    return desc


def _set_attr(desc: cublasmp.MatmulDescriptor, attr: MatmulDescriptorAttribute, value: int) -> None:
    """The typed setter: it packs `value` as the attribute's C type (enums as int32, pointers as void *)."""
    cublasmp.matmul_descriptor_set(desc, attr, value)


def _set_trans(desc: cublasmp.MatmulDescriptor, transa: CublasOperation, transb: CublasOperation) -> None:
    _set_attr(desc, MatmulDescriptorAttribute.TRANSA, transa)
    _set_attr(desc, MatmulDescriptorAttribute.TRANSB, transb)


def _scale_mode(suffix: str) -> int:
    """A cublasMpMatmulMatrixScale_t value found by the end of its name (robust to prefix changes)."""
    for member in cublasmp.MatmulMatrixScale:
        if member.name.endswith(suffix):
            return int(member)
    raise AssertionError(f"no MatmulMatrixScale member ends with {suffix}")


def _run_matmul(stack: contextlib.ExitStack, env: Env, mm: cublasmp.MatmulDescriptor, m: int, n: int, k: int,
                alpha: ctypes.c_float | ctypes.c_double, a: Any, desc_a: cublasmp.MatrixDescriptor, b: Any,
                desc_b: cublasmp.MatrixDescriptor, beta: ctypes.c_float | ctypes.c_double, d: Any,
                desc_d: cublasmp.MatrixDescriptor) -> None:
    """D = alpha op(A) op(B) (beta 0, no C): buffer sizes, workspace, matmul, synchronise."""
    sizes = cublasmp.matmul_buffer_size(env.handle, mm, m, n, k, _addr(alpha), a.data_ptr(), 1, 1, desc_a,
                                        b.data_ptr(), 1, 1, desc_b, _addr(beta), 0, 1, 1, _NO_DESC,
                                        d.data_ptr(), 1, 1, desc_d)
    assert isinstance(sizes, tuple) and len(sizes) == 2
    ws = _workspace(stack, env, sizes)
    cublasmp.matmul(env.handle, mm, m, n, k, _addr(alpha), a.data_ptr(), 1, 1, desc_a,
                    b.data_ptr(), 1, 1, desc_b, _addr(beta), 0, 1, 1, _NO_DESC,
                    d.data_ptr(), 1, 1, desc_d, ws.device, ws.device_bytes, ws.host_ptr, ws.host_bytes)
    env.sync()


def _assert_close(out: Any, ref: Any, atol: float, rtol: float, what: str) -> None:
    err = (out - ref).abs()
    bound = atol + rtol * ref.abs()
    worst = float((err - bound).max())
    assert worst <= 0, (f"{what}: max |error| {float(err.max()):.3g} exceeds atol {atol:g} + rtol {rtol:g} "
                        f"* |ref| (max |ref| {float(ref.abs().max()):.3g})")


# --- library queries ---------------------------------------------------------------------


def test_get_version_is_loaded_version() -> None:
    code = cublasmp.get_version()
    assert isinstance(code, int) and code > 0
    loaded = _loader.loaded_version("cublasmp")
    assert loaded is not None
    assert _loader.format_version("cublasmp", code) == loaded


def test_get_status_string() -> None:
    for status in cublasmp.Status:
        text = cublasmp.get_status_string(status)
        assert isinstance(text, str) and text, status
    assert cublasmp.get_status_string(int(cublasmp.Status.INVALID_VALUE)) == cublasmp.get_status_string(
        cublasmp.Status.INVALID_VALUE)
    # An unknown value gives the library's fallback string (or None), never an exception.
    other = cublasmp.get_status_string(12345)
    assert other is None or isinstance(other, str)


def test_numroc() -> None:
    assert cublasmp.numroc(10, 3, 0, 0, 1) == 10
    # Blocks of 3 over 2 processes: rows 0-2, 6-8 on process 0; 3-5, 9 on process 1.
    assert cublasmp.numroc(10, 3, 0, 0, 2) == 6
    assert cublasmp.numroc(10, 3, 1, 0, 2) == 4
    assert cublasmp.numroc(10, 3, 1, 1, 2) == 6  # source process 1 starts the cycle


def test_error_is_typed(env: Env) -> None:
    # cublasMpGridCreate's contract: the communicator holds exactly nprow * npcol ranks;
    # this one holds 1. (A negative matrix size, tried first, is accepted by the library.)
    with pytest.raises(CuBLASMpError) as info:
        cublasmp.grid_create(2, 2, cublasmp.GridLayout.COL_MAJOR, env.comm)
    err = info.value
    assert isinstance(err, RuntimeError)
    assert err.function == "cublasMpGridCreate"
    assert err.status != cublasmp.Status.SUCCESS
    assert "cublasMpGridCreate" in str(err)
    described = cublasmp.get_status_string(err.status)
    if described:
        assert described in str(err)


def test_matmul_descriptor_raw_attribute_round_trip() -> None:
    with contextlib.ExitStack() as stack:
        mm = _matmul_desc(stack, CublasComputeType.COMPUTE_32F)
        value = ctypes.c_int32(CublasOperation.T)
        cublasmp.matmul_descriptor_set_attribute(mm, MatmulDescriptorAttribute.TRANSA, _addr(value),
                                                 ctypes.sizeof(value))
        out = ctypes.c_int32(-1)
        written = cublasmp.matmul_descriptor_get_attribute(mm, MatmulDescriptorAttribute.TRANSA, _addr(out),
                                                           ctypes.sizeof(out))
        assert written == ctypes.sizeof(out)
        assert out.value == CublasOperation.T
        cublasmp.matmul_descriptor_init(mm, CublasComputeType.COMPUTE_32F)  # back to defaults
        assert cublasmp.matmul_descriptor_get(mm, MatmulDescriptorAttribute.TRANSA) \
            == CublasOperation.N


def test_matmul_descriptor_typed_attribute_round_trip() -> None:
    with contextlib.ExitStack() as stack:
        mm = _matmul_desc(stack, CublasComputeType.COMPUTE_32F)
        assert cublasmp.matmul_descriptor_get(mm, MatmulDescriptorAttribute.COMPUTE_TYPE) \
            == CublasComputeType.COMPUTE_32F
        cublasmp.matmul_descriptor_set(mm, MatmulDescriptorAttribute.TRANSB, CublasOperation.T)
        got = cublasmp.matmul_descriptor_get(mm, MatmulDescriptorAttribute.TRANSB)
        assert got == CublasOperation.T and isinstance(got, CublasOperation)
        scale = torch.ones(1, dtype=torch.float32, device="cuda")
        cublasmp.matmul_descriptor_set(mm, MatmulDescriptorAttribute.A_SCALE_POINTER, scale.data_ptr())
        assert cublasmp.matmul_descriptor_get(mm, MatmulDescriptorAttribute.A_SCALE_POINTER) == scale.data_ptr()


# --- matmul --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MatmulCase:
    name: str
    dtype: Any  # torch dtype of A, B and D
    cuda_type: CudaDataType
    compute: CublasComputeType
    transa: CublasOperation
    atol: float
    rtol: float


MATMUL_CASES = [
    MatmulCase("fp64", torch.float64, CudaDataType.R_64F, CublasComputeType.COMPUTE_64F, CublasOperation.T,
               1e-11, 1e-11),
    MatmulCase("fp32", torch.float32, CudaDataType.R_32F, CublasComputeType.COMPUTE_32F, CublasOperation.T,
               1e-4, 1e-5),
    MatmulCase("fp32-NN", torch.float32, CudaDataType.R_32F, CublasComputeType.COMPUTE_32F, CublasOperation.N,
               1e-4, 1e-5),
    MatmulCase("tf32", torch.float32, CudaDataType.R_32F, CublasComputeType.COMPUTE_32F_FAST_TF32,
               CublasOperation.T, 3e-2, 5e-3),
    MatmulCase("bf16", torch.bfloat16, CudaDataType.R_16BF, CublasComputeType.COMPUTE_32F, CublasOperation.T,
               2e-2, 1e-2),
    MatmulCase("fp16", torch.float16, CudaDataType.R_16F, CublasComputeType.COMPUTE_32F, CublasOperation.T,
               5e-3, 2e-3),
]


def _matmul_case(env: Env, case: MatmulCase, alpha_value: float = 1.0) -> tuple[Any, Any]:
    """Run D = alpha op(A) B for `case`; return (D, float64 reference) on the host."""
    a_op = _random((M, K), SEED).to(case.dtype)  # op(A), rounded to the data type
    b = _random((K, N), SEED + 1).to(case.dtype)
    stored_a = a_op.t() if case.transa == CublasOperation.T else a_op  # the matrix A itself
    with contextlib.ExitStack() as stack:
        a_buf = _store(stored_a, case.dtype)
        b_buf = _store(b, case.dtype)
        d_buf = torch.full((N, M), float("nan"), dtype=case.dtype, device="cuda")
        desc_a = _desc(stack, env, stored_a.shape[0], stored_a.shape[1], case.cuda_type)
        desc_b = _desc(stack, env, K, N, case.cuda_type)
        desc_d = _desc(stack, env, M, N, case.cuda_type)
        mm = _matmul_desc(stack, case.compute)
        _set_trans(mm, case.transa, CublasOperation.N)
        alpha = _scalar(alpha_value, case.compute)
        beta = _scalar(0.0, case.compute)
        _run_matmul(stack, env, mm, M, N, K, alpha, a_buf, desc_a, b_buf, desc_b, beta, d_buf, desc_d)
        out = _load(d_buf)
    ref = alpha_value * (a_op.to(torch.float64) @ b.to(torch.float64))
    return out, ref


@pytest.mark.parametrize("case", MATMUL_CASES, ids=[c.name for c in MATMUL_CASES])
def test_matmul(env: Env, case: MatmulCase) -> None:
    out, ref = _matmul_case(env, case, alpha_value=1.5)
    assert torch.isfinite(out).all(), f"{case.name}: D has values the matmul did not write"
    _assert_close(out, ref, case.atol * 1.5, case.rtol, f"matmul {case.name}")
    # The same data through torch.matmul meets the same tolerance (the tolerance is sane).
    if case.dtype != torch.float64:
        torch_out = (torch.matmul(_random((M, K), SEED).to(case.dtype).cuda(),
                                  _random((K, N), SEED + 1).to(case.dtype).cuda()) * 1.5)
        _assert_close(torch_out.to(torch.float64).cpu(), ref, case.atol * 1.5, case.rtol * 2,
                      f"torch.matmul {case.name}")


def test_matmul_fp8_per_tensor_scales(env: Env) -> None:
    """FP8 e4m3 A and B (TN, as FP8 GEMMs need) with per-tensor float32 scales, D in bf16."""
    fp8 = torch.float8_e4m3fn
    a_op = _random((M, K), SEED + 2, scale=4.0).to(fp8)  # op(A) = A^T, m x k
    b = _random((K, N), SEED + 3, scale=4.0).to(fp8)
    a_scale_value, b_scale_value = 0.5, 4.0
    with contextlib.ExitStack() as stack:
        a_buf = a_op.contiguous().cuda()  # storage of A (k x m, column-major) = op(A) row-major
        b_buf = b.t().contiguous().cuda()
        d_buf = torch.full((N, M), float("nan"), dtype=torch.bfloat16, device="cuda")
        a_scale = torch.tensor([a_scale_value], dtype=torch.float32, device="cuda")
        b_scale = torch.tensor([b_scale_value], dtype=torch.float32, device="cuda")
        desc_a = _desc(stack, env, K, M, CudaDataType.R_8F_E4M3)
        desc_b = _desc(stack, env, K, N, CudaDataType.R_8F_E4M3)
        desc_d = _desc(stack, env, M, N, CudaDataType.R_16BF)
        mm = _matmul_desc(stack, CublasComputeType.COMPUTE_32F)
        alpha = ctypes.c_float(1.0)
        beta = ctypes.c_float(0.0)
        try:
            _set_trans(mm, CublasOperation.T, CublasOperation.N)
            scalar = _scale_mode("SCALAR_FP32")
            _set_attr(mm, MatmulDescriptorAttribute.A_SCALE_MODE, scalar)
            _set_attr(mm, MatmulDescriptorAttribute.B_SCALE_MODE, scalar)
            _set_attr(mm, MatmulDescriptorAttribute.A_SCALE_POINTER, a_scale.data_ptr())
            _set_attr(mm, MatmulDescriptorAttribute.B_SCALE_POINTER, b_scale.data_ptr())
            _run_matmul(stack, env, mm, M, N, K, alpha, a_buf, desc_a, b_buf, desc_b, beta, d_buf, desc_d)
        except CuBLASMpError as exc:
            # Refused here: the error must be typed and say which call and why.
            assert exc.function.startswith("cublasMp"), exc
            assert exc.function in str(exc) and (exc.status_name or "") in str(exc)
            pytest.skip(f"cuBLASMp refused FP8 e4m3 with per-tensor scales on this GPU: {exc}")
        out = _load(d_buf)
    ref = a_scale_value * b_scale_value * (a_op.to(torch.float32).to(torch.float64)
                                           @ b.to(torch.float32).to(torch.float64))
    assert torch.isfinite(out).all()
    _assert_close(out, ref, 0.25, 1e-2, "matmul fp8 e4m3 -> bf16")


def _block_scaled_refusal(env: Env, data_type: CudaDataType, scale_suffix: str, packed: int) -> CuBLASMpError:
    """Attempt a block-scaled matmul; return the CuBLASMpError it must raise."""
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        pytest.skip(f"the refusal is checked on sm_90 only; this GPU is sm_{major}{minor}")
    # Zeroed, generously sized buffers: should the library not refuse, nothing reads out of bounds.
    a_buf = torch.zeros(M * K // packed, dtype=torch.uint8, device="cuda")
    b_buf = torch.zeros(K * N // packed, dtype=torch.uint8, device="cuda")
    d_buf = torch.zeros((N, M), dtype=torch.bfloat16, device="cuda")
    a_scale = torch.zeros(1 << 16, dtype=torch.uint8, device="cuda")
    b_scale = torch.zeros(1 << 16, dtype=torch.uint8, device="cuda")
    with contextlib.ExitStack() as stack:
        desc_a = _desc(stack, env, K, M, data_type)
        desc_b = _desc(stack, env, K, N, data_type)
        desc_d = _desc(stack, env, M, N, CudaDataType.R_16BF)
        mm = _matmul_desc(stack, CublasComputeType.COMPUTE_32F)
        _set_trans(mm, CublasOperation.T, CublasOperation.N)
        alpha = ctypes.c_float(1.0)
        beta = ctypes.c_float(0.0)
        with pytest.raises(CuBLASMpError) as info:
            mode = _scale_mode(scale_suffix)
            _set_attr(mm, MatmulDescriptorAttribute.A_SCALE_MODE, mode)
            _set_attr(mm, MatmulDescriptorAttribute.B_SCALE_MODE, mode)
            _set_attr(mm, MatmulDescriptorAttribute.A_SCALE_POINTER, a_scale.data_ptr())
            _set_attr(mm, MatmulDescriptorAttribute.B_SCALE_POINTER, b_scale.data_ptr())
            _run_matmul(stack, env, mm, M, N, K, alpha, a_buf, desc_a, b_buf, desc_b, beta, d_buf, desc_d)
    env.sync()
    err = info.value
    assert err.library == "cublasmp"
    assert err.function.startswith("cublasMp") and err.function in str(err)
    assert err.status != cublasmp.Status.SUCCESS
    assert (err.status_name or "") in str(err)
    return err


def test_matmul_mxfp8_refused_on_sm90(env: Env) -> None:
    _block_scaled_refusal(env, CudaDataType.R_8F_E4M3, "VEC32_UE8M0", packed=1)


def test_matmul_nvfp4_refused_on_sm90(env: Env) -> None:
    _block_scaled_refusal(env, CudaDataType.R_4F_E2M1, "VEC16_UE4M3", packed=2)


def test_matmul_still_works_after_refusal(env: Env) -> None:
    out, ref = _matmul_case(env, MATMUL_CASES[1])
    _assert_close(out, ref, MATMUL_CASES[1].atol, MATMUL_CASES[1].rtol, "matmul fp32 after a refusal")


# --- PBLAS-style routines ------------------------------------------------------------------

BLOCK = 32  # block size of the PBLAS tests; the sizes below are not multiples of it


def test_gemm_fp32(env: Env) -> None:
    m, n, k = 70, 45, 83
    a = _random((m, k), SEED + 10)
    b = _random((k, n), SEED + 11)
    c = _random((m, n), SEED + 12)
    alpha, beta = ctypes.c_float(1.5), ctypes.c_float(0.5)
    compute = CublasComputeType.COMPUTE_32F
    with contextlib.ExitStack() as stack:
        a_buf, b_buf, c_buf = (_store(x, torch.float32) for x in (a, b, c))
        desc_a = _desc(stack, env, m, k, CudaDataType.R_32F, BLOCK, BLOCK)
        desc_b = _desc(stack, env, k, n, CudaDataType.R_32F, BLOCK, BLOCK)
        desc_c = _desc(stack, env, m, n, CudaDataType.R_32F, BLOCK, BLOCK)
        args = (env.handle, CublasOperation.N, CublasOperation.N, m, n, k, _addr(alpha),
                a_buf.data_ptr(), 1, 1, desc_a, b_buf.data_ptr(), 1, 1, desc_b, _addr(beta),
                c_buf.data_ptr(), 1, 1, desc_c, compute)
        ws = _workspace(stack, env, cublasmp.gemm_buffer_size(*args))
        cublasmp.gemm(*args, ws.device, ws.device_bytes, ws.host_ptr, ws.host_bytes)
        env.sync()
        out = _load(c_buf)
    ref = 1.5 * (a.float().double() @ b.float().double()) + 0.5 * c.float().double()
    _assert_close(out, ref, 1e-4, 1e-5, "gemm fp32")
    torch_ref = (1.5 * torch.matmul(a.float().cuda(), b.float().cuda()) + 0.5 * c.float().cuda()).double().cpu()
    _assert_close(out, torch_ref, 1e-4, 1e-5, "gemm fp32 vs torch.matmul")


def test_trsm_fp64(env: Env) -> None:
    """Solve A X = B (left, lower, no transpose, non-unit); B is overwritten with X."""
    m, n = 57, 23
    full = _random((m, m), SEED + 20)
    lower = torch.tril(full) + m * torch.eye(m, dtype=torch.float64)  # well conditioned
    stored_a = lower + torch.triu(full, 1)  # garbage above the diagonal: must not be read
    b = _random((m, n), SEED + 21)
    alpha = ctypes.c_double(1.0)
    compute = CublasComputeType.COMPUTE_64F
    with contextlib.ExitStack() as stack:
        a_buf = _store(stored_a, torch.float64)
        b_buf = _store(b, torch.float64)
        desc_a = _desc(stack, env, m, m, CudaDataType.R_64F, BLOCK, BLOCK)
        desc_b = _desc(stack, env, m, n, CudaDataType.R_64F, BLOCK, BLOCK)
        args = (env.handle, CublasSideMode.LEFT, CublasFillMode.LOWER, CublasOperation.N, CublasDiagType.NON_UNIT,
                m, n, _addr(alpha), a_buf.data_ptr(), 1, 1, desc_a, b_buf.data_ptr(), 1, 1, desc_b, compute)
        ws = _workspace(stack, env, cublasmp.trsm_buffer_size(*args))
        cublasmp.trsm(*args, ws.device, ws.device_bytes, ws.host_ptr, ws.host_bytes)
        env.sync()
        x = b_buf.t().cpu()
    _assert_close(lower @ x, b, 1e-10, 1e-10, "trsm: A @ X == B")
    _assert_close(x, torch.linalg.solve_triangular(lower, b, upper=False), 1e-12, 1e-10, "trsm vs torch")


def test_syrk_fp32(env: Env) -> None:
    """C = alpha A A^T + beta C on the lower triangle."""
    n, k = 51, 37
    a = _random((n, k), SEED + 30)
    c = _random((n, n), SEED + 31)
    alpha, beta = ctypes.c_float(2.0), ctypes.c_float(-1.0)
    compute = CublasComputeType.COMPUTE_32F
    with contextlib.ExitStack() as stack:
        a_buf = _store(a, torch.float32)
        c_buf = _store(c, torch.float32)
        desc_a = _desc(stack, env, n, k, CudaDataType.R_32F, BLOCK, BLOCK)
        desc_c = _desc(stack, env, n, n, CudaDataType.R_32F, BLOCK, BLOCK)
        args = (env.handle, CublasFillMode.LOWER, CublasOperation.N, n, k, _addr(alpha),
                a_buf.data_ptr(), 1, 1, desc_a, _addr(beta), c_buf.data_ptr(), 1, 1, desc_c, compute)
        ws = _workspace(stack, env, cublasmp.syrk_buffer_size(*args))
        cublasmp.syrk(*args, ws.device, ws.device_bytes, ws.host_ptr, ws.host_bytes)
        env.sync()
        out = _load(c_buf)
    a64, c64 = a.float().double(), c.float().double()
    ref = 2.0 * (a64 @ a64.t()) - c64
    _assert_close(torch.tril(out), torch.tril(ref), 1e-4, 1e-5, "syrk lower triangle")


@pytest.mark.parametrize("trans", [CublasOperation.N, CublasOperation.T], ids=["N", "T"])
def test_geadd_fp32(env: Env, trans: CublasOperation) -> None:
    """C = alpha op(A) + beta C."""
    m, n = 66, 41
    stored_a = _random((m, n) if trans == CublasOperation.N else (n, m), SEED + 40)
    a_op = stored_a if trans == CublasOperation.N else stored_a.t()
    c = _random((m, n), SEED + 41)
    alpha, beta = ctypes.c_float(0.75), ctypes.c_float(2.0)
    with contextlib.ExitStack() as stack:
        a_buf = _store(stored_a, torch.float32)
        c_buf = _store(c, torch.float32)
        desc_a = _desc(stack, env, stored_a.shape[0], stored_a.shape[1], CudaDataType.R_32F, BLOCK, BLOCK)
        desc_c = _desc(stack, env, m, n, CudaDataType.R_32F, BLOCK, BLOCK)
        args = (env.handle, trans, m, n, _addr(alpha), a_buf.data_ptr(), 1, 1, desc_a, _addr(beta),
                c_buf.data_ptr(), 1, 1, desc_c)
        ws = _workspace(stack, env, cublasmp.geadd_buffer_size(*args))
        cublasmp.geadd(*args, ws.device, ws.device_bytes, ws.host_ptr, ws.host_bytes)
        env.sync()
        out = _load(c_buf)
    ref = 0.75 * a_op.float().double() + 2.0 * c.float().double()
    _assert_close(out, ref, 1e-6, 1e-6, f"geadd {trans.name}")


@pytest.mark.parametrize(("dtype", "cuda_type"), [(torch.float32, CudaDataType.R_32F),
                                                  (torch.float64, CudaDataType.R_64F)], ids=["fp32", "fp64"])
def test_gemr2d_between_block_sizes(env: Env, dtype: Any, cuda_type: CudaDataType) -> None:
    """Redistribute from 2 x 2 blocks to 3 x 3 blocks on the 1 x 1 grid: an exact copy."""
    m, n = 29, 17
    src = _random((m, n), SEED + 50).to(dtype)
    with contextlib.ExitStack() as stack:
        a_buf = _store(src, dtype)
        b_buf = torch.full((n, m), float("nan"), dtype=dtype, device="cuda")
        desc_a = _desc(stack, env, m, n, cuda_type, 2, 2)
        desc_b = _desc(stack, env, m, n, cuda_type, 3, 3)
        sizes = cublasmp.gemr2d_buffer_size(env.handle, m, n, a_buf.data_ptr(), 1, 1, desc_a,
                                            b_buf.data_ptr(), 1, 1, desc_b, env.comm)
        ws = _workspace(stack, env, sizes)
        cublasmp.gemr2d(env.handle, m, n, a_buf.data_ptr(), 1, 1, desc_a, b_buf.data_ptr(), 1, 1, desc_b,
                        ws.device, ws.device_bytes, ws.host_ptr, ws.host_bytes, env.comm)
        env.sync()
    # One process holds every block, so both local layouts are the global column-major matrix.
    assert torch.equal(b_buf, a_buf)
    assert torch.equal(b_buf.t().cpu(), src)


# --- memory --------------------------------------------------------------------------------


def test_malloc_free(env: Env) -> None:
    nbytes = 1 << 20
    ptr = cublasmp.malloc(env.grid, nbytes)
    assert ptr != 0
    try:
        src = torch.arange(nbytes // 4, dtype=torch.float32, device="cuda")
        # Write into the allocation and read it back through NCCL (a one-rank all-reduce copies).
        nccl.all_reduce(src.data_ptr(), ptr, src.numel(), nccl.DataType.FLOAT32, nccl.RedOp.SUM, env.comm,
                        int(env.stream.cuda_stream))
        out = torch.zeros_like(src)
        nccl.all_reduce(ptr, out.data_ptr(), src.numel(), nccl.DataType.FLOAT32, nccl.RedOp.SUM, env.comm,
                        int(env.stream.cuda_stream))
        env.sync()
        assert torch.equal(out, src)
    finally:
        env.sync()
        cublasmp.free(env.grid, ptr)


class _DeviceBytes:
    """A device allocation that torch can view (``__cuda_array_interface__``)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "strides": None, "version": 3}


def test_buffer_register_nccl_backed_torch_buffer(env: Env) -> None:
    """Register a torch tensor over ncclMemAlloc memory, use it as the matmul workspace, deregister."""
    case = MATMUL_CASES[4]  # bf16
    a_op = _random((M, K), SEED + 60).to(case.dtype)
    b = _random((K, N), SEED + 61).to(case.dtype)
    with contextlib.ExitStack() as stack:
        a_buf = _store(a_op.t(), case.dtype)
        b_buf = _store(b, case.dtype)
        d_buf = torch.full((N, M), float("nan"), dtype=case.dtype, device="cuda")
        desc_a = _desc(stack, env, K, M, case.cuda_type)
        desc_b = _desc(stack, env, K, N, case.cuda_type)
        desc_d = _desc(stack, env, M, N, case.cuda_type)
        mm = _matmul_desc(stack, case.compute)
        _set_trans(mm, CublasOperation.T, CublasOperation.N)
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        device_bytes, host_bytes = cublasmp.matmul_buffer_size(
            env.handle, mm, M, N, K, _addr(alpha), a_buf.data_ptr(), 1, 1, desc_a, b_buf.data_ptr(), 1, 1,
            desc_b, _addr(beta), 0, 1, 1, _NO_DESC, d_buf.data_ptr(), 1, 1, desc_d)
        nbytes = max(device_bytes, 1 << 21)
        raw = nccl.mem_alloc(nbytes)
        stack.callback(nccl.mem_free, raw)
        work = torch.as_tensor(_DeviceBytes(raw, nbytes), device="cuda")
        assert work.data_ptr() == raw and work.numel() == nbytes
        cublasmp.buffer_register(env.grid, work.data_ptr(), nbytes)
        try:
            host = np.zeros(max(1, host_bytes), dtype=np.uint8)
            cublasmp.matmul(env.handle, mm, M, N, K, _addr(alpha), a_buf.data_ptr(), 1, 1, desc_a,
                            b_buf.data_ptr(), 1, 1, desc_b, _addr(beta), 0, 1, 1, _NO_DESC, d_buf.data_ptr(), 1, 1,
                            desc_d,
                            work.data_ptr(), nbytes, int(host.ctypes.data), host_bytes)
            env.sync()
        finally:
            env.sync()
            cublasmp.buffer_deregister(env.grid, work.data_ptr())
        out = _load(d_buf)
    _assert_close(out, a_op.double() @ b.double(), case.atol, case.rtol, "matmul with a registered workspace")


def test_buffer_register_caching_allocator_buffer(env: Env) -> None:
    """A plain torch buffer: registered and deregistered, or refused with a typed error."""
    buf = torch.zeros(1 << 21, dtype=torch.uint8, device="cuda")
    try:
        cublasmp.buffer_register(env.grid, buf.data_ptr(), buf.numel())
    except CuBLASMpError as exc:
        assert exc.function == "cublasMpBufferRegister"
        assert "cublasMpBufferRegister" in str(exc)
        pytest.skip(f"cuBLASMp does not register cudaMalloc memory here: {exc}")
    env.sync()
    cublasmp.buffer_deregister(env.grid, buf.data_ptr())


# --- logging -------------------------------------------------------------------------------


def test_logger_callback_collects_messages(env: Env) -> None:
    messages: list[tuple[int, str, str]] = []
    lock = threading.Lock()

    def collect(level: int, function: str, message: str) -> None:
        with lock:
            messages.append((level, function, message))

    cublasmp.logger_set_level(5)
    cublasmp.logger_set_callback(collect)
    try:
        out, ref = _matmul_case(env, MATMUL_CASES[1])
    finally:
        cublasmp.logger_set_callback(None)
        cublasmp.logger_set_level(0)
    _assert_close(out, ref, MATMUL_CASES[1].atol, MATMUL_CASES[1].rtol, "matmul while logging")
    with lock:
        seen = list(messages)
    assert seen, "no log message reached the callback at level 5 during a matmul"
    for level, function, message in seen:
        assert isinstance(level, int) and isinstance(function, str) and isinstance(message, str)
    # Once the callback is removed, nothing more arrives.
    _matmul_case(env, MATMUL_CASES[1])
    with lock:
        assert len(messages) == len(seen)
