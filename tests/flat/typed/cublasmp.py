"""A small typed program using the flat cuBLASMp bindings; `mypy --strict` must accept it.

It is also runnable without a GPU: its main() only reads the module's tables and enums (every
cuBLASMp call needs the NVIDIA driver).
"""

from __future__ import annotations

from mpbind.bindings import cublasmp
from mpbind.errors import CuBLASMpError, CuBLASMpInvalidValueError, LibraryError


def version() -> tuple[int, int, int]:
    code: int = cublasmp.get_version()
    return code // 10000, code % 10000 // 100, code % 100


def grid(comm: int, nprow: int, npcol: int) -> cublasmp.Grid:
    return cublasmp.grid_create(nprow, npcol, cublasmp.GridLayout.COL_MAJOR, comm)


def matrix(grid: cublasmp.Grid, m: int, n: int, mb: int, nb: int, lld: int) -> cublasmp.MatrixDescriptor:
    return cublasmp.matrix_descriptor_create(m, n, mb, nb, 0, 0, lld, cublasmp.CudaDataType.R_32F, grid)


def transposed_matmul() -> cublasmp.MatmulDescriptor:
    desc = cublasmp.matmul_descriptor_create(cublasmp.CublasComputeType.COMPUTE_32F)
    cublasmp.matmul_descriptor_set(desc, cublasmp.MatmulDescriptorAttribute.TRANSA, cublasmp.CublasOperation.T)
    return desc


def workspace_sizes(handle: cublasmp.Handle, desc: cublasmp.MatmulDescriptor, a: cublasmp.MatrixDescriptor,
                    n: int, alpha: int, beta: int, ptr: int) -> tuple[int, int]:
    device, host = cublasmp.matmul_buffer_size(handle, desc, n, n, n, alpha, ptr, 1, 1, a, ptr, 1, 1, a, beta,
                                               ptr, 1, 1, a, ptr, 1, 1, a)
    return device, host


def attribute_ctype(attr: cublasmp.MatmulDescriptorAttribute) -> str:
    ctype, _, _ = cublasmp.MATMUL_DESCRIPTOR_ATTRIBUTE_TYPES[attr]
    return ctype


def explain(error: LibraryError) -> str:
    if isinstance(error, CuBLASMpInvalidValueError):
        return f"bad argument to {error.function}"
    if isinstance(error, CuBLASMpError):
        return f"{error.function} -> {error.status_name} ({error.status})"
    return str(error)


def log_to(lines: list[str]) -> None:
    def record(level: int, function: str, message: str) -> None:
        lines.append(f"{level} {function}: {message}")

    cublasmp.logger_set_callback(record)


def main() -> None:
    print(attribute_ctype(cublasmp.MatmulDescriptorAttribute.EPILOGUE), cublasmp.Status.INVALID_VALUE.name)
    print(explain(CuBLASMpInvalidValueError("cublasMpGemm", 3, "CUBLASMP_STATUS_INVALID_VALUE")))


if __name__ == "__main__":
    main()
