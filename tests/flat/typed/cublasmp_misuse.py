"""Misuse of the flat cuBLASMp bindings: mypy --strict must reject each marked line with that error code."""

from mpbind.bindings import cublasmp

grid = cublasmp.grid_create(2, 1, "column major", 0)  # error: arg-type
handle: cublasmp.Handle = 5  # error: assignment
desc: cublasmp.MatrixDescriptor = cublasmp.matmul_descriptor_create(0)  # error: assignment
text: int = cublasmp.get_status_string(cublasmp.Status.SUCCESS)  # error: assignment
status: cublasmp.Status = cublasmp.GridLayout.COL_MAJOR  # error: assignment
cublasmp.logger_set_callback(print, 2)  # error: call-arg
device, host, extra = cublasmp.gemr2d_buffer_size(cublasmp.Handle(0), 1, 1, 0, 1, 1, cublasmp.MatrixDescriptor(0), 0, 1, 1, cublasmp.MatrixDescriptor(0), 0)  # error: misc  # noqa: E501
