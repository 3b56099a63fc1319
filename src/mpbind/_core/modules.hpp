// One register function per library part of the core; modules.cpp calls those present.
#pragma once

#include <nanobind/nanobind.h>

namespace mpbind {

void register_modules(nanobind::module_& m);

void register_nccl(nanobind::module_& m);
void register_cublasmp(nanobind::module_& m);
void register_nvshmem(nanobind::module_& m);
void register_cufftmp(nanobind::module_& m);
void register_abi(nanobind::module_& m);  // mpbind._core._abi: the function tables (capi.cpp)

}  // namespace mpbind
