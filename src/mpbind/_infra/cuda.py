"""The layer's own CUDA runtime and driver calls, in one place (private).

The features and facades need a few small things from CUDA beside the libraries they bind: copy a
few bytes to or from the device, copy pitched rows between device buffers, wait for a stream or the
device, read or set the current device, read a device attribute or UUID. They go through
``cuda.bindings`` (a dependency) here and nowhere else, and a failure is one error:
:class:`~mpbind.errors.CudaError`, naming the call and CUDA's error name, code and text.

cuda-core's object model (kernel libraries, launches and the streams they are given) stays with the
kernel code that uses it; this module is the plain calls. ``cuda.bindings`` is imported on the
first call, never with ``mpbind``.
"""

from __future__ import annotations

from mpbind.errors import CudaError, LibraryNotFoundError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import time)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "check",
    "compute_capability",
    "copy_2d_async",
    "copy_from_device",
    "copy_to_device",
    "current_device",
    "device_uuid",
    "ensure_context",
    "multiprocessor_count",
    "read_int64s",
    "set_device",
    "synchronize_device",
    "synchronize_stream",
    "write_int64s",
]


def _runtime() -> Any:
    from cuda.bindings import runtime

    return runtime


def _driver() -> Any:
    from cuda.bindings import driver

    return driver


def _text(result: Any) -> str | None:
    """The string of a (status, bytes) pair cuda-bindings returns from cudaGetErrorString/cuGetErrorString."""
    if not isinstance(result, tuple) or len(result) != 2 or int(result[0]) != 0:
        return None
    text = result[1]
    return text.decode(errors="replace") if isinstance(text, bytes) else (str(text) if text else None)


def _description(err: Any) -> str | None:
    """CUDA's own text of `err` (runtime or driver status), or None where CUDA cannot give it."""
    try:
        if type(err).__name__ == "CUresult":
            return _text(_driver().cuGetErrorString(err))
        return _text(_runtime().cudaGetErrorString(err))
    except Exception:  # noqa: BLE001 - only a description: the name and code are the error
        return None


def _call(function: str, fn: Any, *args: Any) -> tuple[Any, ...]:
    """`fn(*args)` checked (:func:`check`); a machine without the driver library is
    :class:`~mpbind.errors.LibraryNotFoundError` (cuda-bindings loads it on the first call)."""
    from cuda.pathfinder import DynamicLibNotFoundError

    try:
        result = fn(*args)
    except DynamicLibNotFoundError as exc:
        raise LibraryNotFoundError(f"{function} needs the NVIDIA driver (libcuda.so.1): {exc}") from None
    return check(result, function)


def check(result: Any, function: str) -> tuple[Any, ...]:
    """The values after the status in `result` (what a cuda-bindings call returns: a status, or a
    tuple starting with one); :class:`CudaError` naming `function` when the status is not success."""
    values = result if isinstance(result, tuple) else (result,)
    err = values[0]
    if int(err) != 0:
        raise CudaError(function, int(err), getattr(err, "name", None), _description(err))
    return tuple(values[1:])


# --- copies -------------------------------------------------------------------------------------------------


def copy_2d_async(dst: int, dst_pitch: int, src: int, src_pitch: int, row_bytes: int, rows: int,
                  stream: int) -> None:
    """`rows` rows of `row_bytes` bytes from `src` to `dst` (device memory, `*_pitch` bytes apart), on
    `stream`: one plain copy where both sides are packed, a pitched one otherwise. Nothing to do is
    no call."""
    if rows == 0 or row_bytes == 0:
        return
    rt = _runtime()
    kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    if src_pitch == row_bytes and dst_pitch == row_bytes:
        _call("cudaMemcpyAsync", rt.cudaMemcpyAsync, dst, src, rows * row_bytes, kind, stream)
    else:
        _call("cudaMemcpy2DAsync", rt.cudaMemcpy2DAsync, dst, dst_pitch, src, src_pitch, row_bytes, rows, kind,
              stream)


def copy_to_device(dst: int, src: int, nbytes: int) -> None:
    """`nbytes` from host address `src` to device address `dst` (cudaMemcpy: ordered after the work on
    the legacy default stream, the host buffer free to reuse when it returns)."""
    rt = _runtime()
    _call("cudaMemcpy", rt.cudaMemcpy, dst, src, nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice)


def copy_from_device(dst: int, src: int, nbytes: int) -> None:
    """`nbytes` from device address `src` to host address `dst` (cudaMemcpy: complete when it returns)."""
    rt = _runtime()
    _call("cudaMemcpy", rt.cudaMemcpy, dst, src, nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost)


def malloc(nbytes: int) -> int:
    """`nbytes` of device memory on the current device (cudaMalloc); release with :func:`free`."""
    (ptr,) = _call("cudaMalloc", _runtime().cudaMalloc, nbytes)
    return int(ptr)


def free(ptr: int) -> None:
    """Release what :func:`malloc` returned (cudaFree)."""
    _call("cudaFree", _runtime().cudaFree, ptr)


def write_int64s(dst: int, values: list[int]) -> None:
    """`values` as int64 at device address `dst`."""
    import ctypes

    data = (ctypes.c_int64 * len(values))(*values)
    copy_to_device(dst, ctypes.addressof(data), ctypes.sizeof(data))


def read_int64s(src: int, count: int) -> list[int]:
    """`count` int64 from device address `src`."""
    import ctypes

    data = (ctypes.c_int64 * count)()
    copy_from_device(ctypes.addressof(data), src, ctypes.sizeof(data))
    return list(data)


# --- waiting ------------------------------------------------------------------------------------------------


def synchronize_device() -> None:
    """Wait for all work on the current device (cudaDeviceSynchronize)."""
    _call("cudaDeviceSynchronize", _runtime().cudaDeviceSynchronize)


def stream_done(stream: int) -> bool:
    """Whether everything queued on `stream` has completed (cudaStreamQuery), without waiting."""
    rt = _runtime()
    (err,) = rt.cudaStreamQuery(stream)
    if err == rt.cudaError_t.cudaErrorNotReady:
        return False
    check((err,), "cudaStreamQuery")
    return True


def synchronize_stream(stream: int) -> None:
    """Wait for the work queued on `stream` (a cudaStream_t; 0 is the legacy default stream)."""
    _call("cudaStreamSynchronize", _runtime().cudaStreamSynchronize, stream)


# --- devices ------------------------------------------------------------------------------------------------


def current_device() -> int:
    """The calling thread's current device (cudaGetDevice)."""
    (device,) = _call("cudaGetDevice", _runtime().cudaGetDevice)
    return int(device)


def set_device(device: int) -> None:
    """Make `device` the calling thread's current device (cudaSetDevice)."""
    _call(f"cudaSetDevice({device})", _runtime().cudaSetDevice, device)


def ensure_context() -> bool:
    """Have the current device's primary context exist (``cudaFree(0)``); whether that worked. A
    warm-up: a caller that needs a usable GPU lets its library report why there is none (only a
    machine without the driver library is refused here, LibraryNotFoundError)."""
    try:
        _call("cudaFree", _runtime().cudaFree, 0)
    except CudaError:
        return False
    return True


def _device_handle(device: int) -> Any:
    drv = _driver()
    _call("cuInit", drv.cuInit, 0)
    (handle,) = _call(f"cuDeviceGet({device})", drv.cuDeviceGet, device)
    return handle


def _attribute(device: int, name: str) -> int:
    drv = _driver()
    handle = _device_handle(device)
    (value,) = _call(f"cuDeviceGetAttribute({name}, {device})", drv.cuDeviceGetAttribute,
                     getattr(drv.CUdevice_attribute, name), handle)
    return int(value)


def compute_capability(device: int) -> tuple[int, int]:
    """(major, minor) compute capability of `device`."""
    return (_attribute(device, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"),
            _attribute(device, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR"))


def multiprocessor_count(device: int) -> int:
    """How many SMs `device` has."""
    return _attribute(device, "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT")


def device_uuid(device: int | None = None) -> bytes:
    """The 16-byte UUID of `device` (the current device when None)."""
    handle = _device_handle(current_device() if device is None else device)
    (uuid,) = _call("cuDeviceGetUuid", _driver().cuDeviceGetUuid, handle)
    return bytes(uuid.bytes)
