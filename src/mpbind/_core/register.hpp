// The functions that fill the extension module mpbind._core (extension.cpp calls them in order):
// one for the shared names, one for the library-free test doubles, one per library submodule.
#pragma once

#include <nanobind/nanobind.h>

namespace mpbind {

void register_shared(nanobind::module_& m);   // register_shared.cpp: drain, queued, Registration, ...
void register_testing(nanobind::module_& m);  // register_testing.cpp: mpbind._core._testing
void register_watchdog(nanobind::module_& m);  // watchdog.cpp: deadlines, wait_until, the watchdog's state

void register_nccl(nanobind::module_& m);      // nccl.cpp: mpbind._core.nccl
void register_cublasmp(nanobind::module_& m);  // cublasmp.cpp: mpbind._core.cublasmp
void register_nvshmem(nanobind::module_& m);   // nvshmem.cpp: mpbind._core.nvshmem
void register_cufftmp(nanobind::module_& m);   // cufftmp.cpp: mpbind._core.cufftmp
void register_abi(nanobind::module_& m);       // capi.cpp: mpbind._core._abi, the function tables
void register_torch(nanobind::module_& m);     // torch_ops.cpp: the collectives as torch operators
void register_arrays(nanobind::module_& m);    // arrays.cpp: array_info, dtype_info, stream_handle
#ifdef MPBIND_XLA_FFI
void register_xla(nanobind::module_& m);       // xla_ffi.cpp: mpbind._core.xla (built with jaxlib's FFI headers)
#endif

}  // namespace mpbind
