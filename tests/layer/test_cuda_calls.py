"""mpbind._infra.cuda, the layer's one home of CUDA runtime and driver calls, without a GPU: a failed call
is a CudaError naming the call and CUDA's error, success hands back the call's values, and copies
choose the plain or the pitched call (a recording stand-in for cuda-bindings' runtime)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from mpbind._infra import cuda as _cuda
from mpbind._infra import info as _info
from mpbind.errors import CudaError, LibraryError, LibraryNotFoundError, MpbindError

runtime = pytest.importorskip("cuda.bindings.runtime")
driver = pytest.importorskip("cuda.bindings.driver")


def test_a_runtime_failure_is_a_cuda_error() -> None:
    with pytest.raises(CudaError) as info:
        _cuda.check((runtime.cudaError_t.cudaErrorInvalidValue,), "cudaMemcpy")
    err = info.value
    assert isinstance(err, LibraryError) and isinstance(err, MpbindError) and isinstance(err, RuntimeError)
    assert (err.library, err.function, err.status, err.status_name) == ("cuda", "cudaMemcpy", 1,
                                                                        "cudaErrorInvalidValue")
    assert str(err).startswith("cudaMemcpy failed: cudaErrorInvalidValue (1)")
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is CudaError and str(clone) == str(err)


def test_a_driver_failure_is_a_cuda_error() -> None:
    status = driver.CUresult.CUDA_ERROR_INVALID_DEVICE
    with pytest.raises(CudaError, match=rf"cuDeviceGet\(7\) failed: CUDA_ERROR_INVALID_DEVICE \({int(status)}\)"):
        _cuda.check((status, 0), "cuDeviceGet(7)")


def test_success_hands_back_the_values() -> None:
    assert _cuda.check((runtime.cudaError_t.cudaSuccess, 3), "cudaGetDevice") == (3,)
    assert _cuda.check((driver.CUresult.CUDA_SUCCESS,), "cuInit") == ()
    assert _cuda.check(runtime.cudaError_t.cudaSuccess, "cudaFree") == ()


class _Recorder:
    """cuda-bindings' runtime as the copies see it: records each call, answers `status`."""

    def __init__(self, status: Any = 0) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.status = status
        self.cudaMemcpyKind = runtime.cudaMemcpyKind

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("cuda"):
            raise AttributeError(name)
        return lambda *args: self.calls.append((name, args)) or (self.status,)


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    fake = _Recorder()
    monkeypatch.setattr(_cuda, "_runtime", lambda: fake)
    return fake


def test_packed_rows_are_one_plain_copy(recorder: _Recorder) -> None:
    _cuda.copy_2d_async(0x1000, 40, 0x2000, 40, 40, 6, 5)
    d2d = runtime.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    assert recorder.calls == [("cudaMemcpyAsync", (0x1000, 0x2000, 240, d2d, 5))]


def test_padded_rows_are_a_pitched_copy(recorder: _Recorder) -> None:
    _cuda.copy_2d_async(0x1000, 48, 0x2000, 40, 40, 6, 0)
    d2d = runtime.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    assert recorder.calls == [("cudaMemcpy2DAsync", (0x1000, 48, 0x2000, 40, 40, 6, d2d, 0))]


@pytest.mark.parametrize(("rows", "row_bytes"), [(0, 40), (6, 0)])
def test_nothing_to_copy_is_no_call(recorder: _Recorder, rows: int, row_bytes: int) -> None:
    _cuda.copy_2d_async(0x1000, 48, 0x2000, 40, row_bytes, rows, 0)
    assert recorder.calls == []


def test_a_failed_copy_names_the_call(recorder: _Recorder) -> None:
    recorder.status = runtime.cudaError_t.cudaErrorInvalidPitchValue
    with pytest.raises(CudaError, match="cudaMemcpy2DAsync failed: cudaErrorInvalidPitchValue"):
        _cuda.copy_2d_async(0x1000, 48, 0x2000, 40, 40, 6, 0)


def test_int64s_go_through_host_copies(recorder: _Recorder) -> None:
    _cuda.write_int64s(0x3000, [1, -2, 3])
    (name, (dst, _, nbytes, kind)), = recorder.calls
    assert (name, dst, nbytes, kind) == ("cudaMemcpy", 0x3000, 24, runtime.cudaMemcpyKind.cudaMemcpyHostToDevice)
    assert _cuda.read_int64s(0x3000, 4) == [0, 0, 0, 0]  # the stand-in copies nothing
    name, (_, src, nbytes, kind) = recorder.calls[-1]
    assert (name, src, nbytes, kind) == ("cudaMemcpy", 0x3000, 32, runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost)


def test_waits_and_device_calls_name_themselves(recorder: _Recorder) -> None:
    recorder.status = runtime.cudaError_t.cudaErrorInvalidDevice
    for call, name in ((_cuda.synchronize_device, "cudaDeviceSynchronize"),
                       (lambda: _cuda.synchronize_stream(0), "cudaStreamSynchronize"),
                       (lambda: _cuda.set_device(9), r"cudaSetDevice\(9\)")):
        with pytest.raises(CudaError, match=f"{name} failed: cudaErrorInvalidDevice"):
            call()
    assert _cuda.ensure_context() is False  # a warm-up reports, never raises


def test_without_a_gpu_device_queries_raise_mpbind_errors() -> None:
    """No driver library: LibraryNotFoundError; a driver without a usable GPU: CudaError."""
    if _info.gpu_count()[0]:
        pytest.skip("a GPU is visible: this checks the machine without one")
    for call, name in ((_cuda.current_device, "cudaGetDevice"), (lambda: _cuda.compute_capability(0), "cuInit"),
                       (_cuda.synchronize_device, "cudaDeviceSynchronize")):
        with pytest.raises((CudaError, LibraryNotFoundError)) as info:
            call()
        assert name in str(info.value)


def test_a_placement_without_a_gpu_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    from mpbind._infra import placement as _placement

    def no_gpu(device: int | None = None) -> bytes:
        raise CudaError("cuInit", 100, "CUDA_ERROR_NO_DEVICE")

    monkeypatch.setattr(_cuda, "device_uuid", no_gpu)
    assert _placement.this_gpu(None) is None
    monkeypatch.setattr(_cuda, "device_uuid", lambda device=None: bytes(range(16)))
    host, uuid = _placement.this_gpu(0) or ("", "")
    assert uuid == bytes(range(16)).hex() and host


def test_a_capability_that_cannot_be_read_is_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    from mpbind import matmul as _planned_matmul
    from mpbind.errors import UsageError

    def broken(device: int) -> tuple[int, int]:
        raise CudaError("cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 3)", 101,
                        "CUDA_ERROR_INVALID_DEVICE")

    monkeypatch.setattr(_cuda, "compute_capability", broken)
    with pytest.raises(UsageError, match="cannot read device 3's compute capability .*CUDA_ERROR_INVALID_DEVICE"):
        _planned_matmul._capability(3)
    monkeypatch.setattr(_cuda, "compute_capability", lambda device: (9, 0))
    assert _planned_matmul._capability(3) == (9, 0)


def test_kernel_arch_without_a_gpu_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    from mpbind.kernels import _build as _kernel_build

    monkeypatch.setattr(_cuda, "current_device", lambda: 0)
    monkeypatch.setattr(_cuda, "compute_capability", lambda device: (9, 0))
    assert _kernel_build.current_arch() == "sm_90"

    def no_driver(device: int) -> tuple[int, int]:
        raise CudaError("cuInit", 35, "CUDA_ERROR_INSUFFICIENT_DRIVER")

    monkeypatch.setattr(_cuda, "compute_capability", no_driver)  # the caller picks a default
    assert _kernel_build.current_arch() is None
