// What other parts of the core read of NVSHMEM objects (arrays.cpp: symmetric arrays).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

#include "arrays.hpp"
#include "core.hpp"

namespace mpbind::nvshmem {

// mpbind.nvshmem.SymmetricArray and PeerArray, the core's own (final) types: whether `type` is one.
bool is_symmetric_array(PyTypeObject* type);
bool is_peer_array(PyTypeObject* type);
// The description such an array holds (made and checked once, when the array was made), with its
// address: UsageError once its allocation is freed.
void describe_symmetric(nanobind::handle obj, arrays::Array& a, const char* what);
void describe_peer(nanobind::handle obj, arrays::Array& a, const char* what);

// Whether [ptr, ptr + nbytes) lies in a live symmetric allocation of the live runtime (false when none
// is live): what makes an array usable in place by a cuFFTMp transform (cufftmp.cpp).
bool holds(uintptr_t ptr, size_t nbytes);

// An on-stream NVSHMEM collective that another library makes (cufftmp.cpp), made around its library
// call: in the watchdog's flight record as `op` from before the call (one that blocks on the host
// shows as one that has not returned) to queued(), which notes it in the collective fence. `op`
// nullptr: no collective (nothing is done).
class CollectiveCall {
public:
    CollectiveCall(const char* op, uintptr_t stream);
    ~CollectiveCall();
    CollectiveCall(const CollectiveCall&) = delete;
    CollectiveCall& operator=(const CollectiveCall&) = delete;
    void queued();

private:
    struct Impl;
    Impl* impl_;
};

// Launches from a framework's program (launch.hpp; no GIL): the gate is held while a launch checks
// that its objects are not being released, queues its work and notes the stream it queued on
// (note_launched, false when no event could be recorded); the fence's settle takes the gate first,
// so a release (which settles, having marked its state releasing) waits for a launch under way and
// then for its work.
std::unique_lock<std::mutex> launch_gate();
bool note_launched(uintptr_t stream);
// The state of a symmetric array (the core's SymmetricArray), for a launch to check. Needs the GIL.
std::shared_ptr<State> symmetric_state(nanobind::handle array);

// The collective fence before a host-side collective (an allocation, a free): this PE's on-stream
// collectives complete first, bounded by the runtime's deadline. The release form raises no CUDA
// error (a PE must not skip a collective release the others make), only a wait that ran out or was
// interrupted (the release would wait the same way).
void settle_collectives();
void settle_collectives_for_release();

}  // namespace mpbind::nvshmem
