"""What the Pythonic layer takes, as types: CUDA streams, device arrays and buffers.

Structural types (``Protocol``), so that no framework is needed to name them: a CuPy, PyTorch,
JAX or Numba object matches by the protocol it implements. The layer's signatures use the
aliases at the bottom (:data:`Stream`, :data:`Array`, :data:`Operand`, :data:`Buffer`); this
module imports nothing but ``typing`` at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, SupportsIndex, TypeAlias

__all__ = [
    "Array", "Buffer", "CuPyStream", "CudaArrayInterface", "CudaStreamProtocol", "DLPackArray", "DTypeLike",
    "DeviceBuffer", "Dim3Like", "Extents", "KernelArguments", "KernelLike", "KernelObject", "Operand", "Stream",
    "TorchStream",
]


class CudaStreamProtocol(Protocol):
    """An object with ``__cuda_stream__()`` (the CUDA stream protocol): ``(version, cudaStream_t)``."""

    def __cuda_stream__(self) -> tuple[int, int]: ...


class TorchStream(Protocol):
    """A PyTorch stream: ``cuda_stream`` is its ``cudaStream_t``."""

    @property
    def cuda_stream(self) -> int: ...


class CuPyStream(Protocol):
    """A CuPy stream: ``ptr`` is its ``cudaStream_t``."""

    @property
    def ptr(self) -> int: ...


class CudaArrayInterface(Protocol):
    """An array with ``__cuda_array_interface__`` (v3): CuPy, PyTorch, Numba, JAX."""

    @property
    def __cuda_array_interface__(self) -> Mapping[str, Any]: ...


class DLPackArray(Protocol):
    """An array that exports DLPack (``__dlpack__``): also bfloat16 and float8, which the CUDA array
    interface cannot describe."""

    def __dlpack__(self) -> Any: ...


class DeviceBuffer(Protocol):
    """Device memory of mpbind's own (``nccl.Buffer``, ``cublasmp.Workspace``): a pointer and a size."""

    @property
    def ptr(self) -> int: ...

    @property
    def nbytes(self) -> int: ...


class KernelObject(Protocol):
    """A kernel object whose ``handle`` is the kernel: cuda.core's ``Kernel`` (a ``CUkernel``)."""

    @property
    def handle(self) -> SupportsIndex: ...


class Extents(Protocol):
    """A grid or block shape with ``x``, ``y`` and ``z``: ``nvshmem.Dim3``, cuda.bindings' ``dim3``."""

    @property
    def x(self) -> int: ...

    @property
    def y(self) -> int: ...

    @property
    def z(self) -> int: ...


#: A kernel to launch: a ``CUkernel`` or ``CUfunction`` of cuda.bindings (ints to ``int()``), a
#: cuda.core ``Kernel``, or the kernel's address as an int.
KernelLike: TypeAlias = SupportsIndex | KernelObject
#: A grid or block shape (CUDA's ``dim3``): ``n`` is ``(n, 1, 1)``; one to three extents, the
#: missing ones 1; or an object with ``x``, ``y`` and ``z``.
Dim3Like: TypeAlias = int | tuple[int, ...] | list[int] | Extents
#: A kernel's arguments as CUDA's ``kernelParams``: the address of each argument's value, in the
#: kernel's parameter order (read when the launch is made), or the int address of such a
#: ``void*`` array.
KernelArguments: TypeAlias = tuple[int, ...] | list[int] | int
#: A CUDA stream: None (the default stream), a ``cudaStream_t`` as an int, or a stream object.
Stream: TypeAlias = int | None | CudaStreamProtocol | TorchStream | CuPyStream
#: A device array, described by the CUDA array interface or DLPack.
Array: TypeAlias = CudaArrayInterface | DLPackArray
#: An element type: a name (``"float32"``, ``"bfloat16"``), a NumPy dtype or type, or a framework dtype.
DTypeLike: TypeAlias = Any
#: A collective's operand: an array, or ``(ptr, count, dtype)``.
Operand: TypeAlias = Array | tuple[int, int, DTypeLike]
#: Memory to register: an array, one of mpbind's buffers, or ``(ptr, nbytes)``.
Buffer: TypeAlias = Array | DeviceBuffer | tuple[int, int]
