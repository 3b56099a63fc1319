// What other parts of the core read of NVSHMEM objects (arrays.cpp: symmetric arrays).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <utility>

namespace mpbind::nvshmem {

// (base pointer, bytes) of a live mpbind._core.nvshmem.SymmetricMemory; UsageError once freed.
std::pair<uintptr_t, size_t> allocation_of(nanobind::handle memory);

// The collective fence (nvshmem.cpp) for NVSHMEM collectives that another library makes (cufftmp.cpp):
// after it queued an on-stream one on `stream` (`op` names it in the watchdog's flight record), and
// before it makes a host-side one (an allocation, a free). Both waits are bounded by the runtime's
// deadline. The release form raises no CUDA error (a PE must not skip a collective release the
// others make), only a wait that ran out or was interrupted (the release would wait the same way).
void collective_queued(uintptr_t stream, const char* op);
void settle_collectives();
void settle_collectives_for_release();

}  // namespace mpbind::nvshmem
