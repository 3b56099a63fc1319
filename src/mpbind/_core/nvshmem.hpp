// What other parts of the core read of NVSHMEM objects (arrays.cpp: symmetric arrays).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <utility>

namespace mpbind::nvshmem {

// (base pointer, bytes) of a live mpbind._core.nvshmem.SymmetricMemory; UsageError once freed.
std::pair<uintptr_t, size_t> allocation_of(nanobind::handle memory);

}  // namespace mpbind::nvshmem
