// NCCL objects of the core that other parts build on (cuBLASMp grids live on a communicator).
#pragma once

#include "mpbind/bindings/_core_abi/nccl.hpp"
#include "core.hpp"

namespace mpbind::nccl {

using UniqueId = abi::nccl::ncclUniqueId;

class CommState : public State {
public:
    CommState(void* comm);
    void* comm;  // ncclComm_t
    int rank = 0, size = 0, device = -1;
    bool finalized = false;
    bool aborting = false;
    Registry registrations;  // ncclCommRegister (local)
    Registry windows;        // ncclCommWindowRegister (collective)

    void finalize();  // ncclCommFinalize after draining what is queued under it

protected:
    void release() override;
};

using Communicator = Ref<CommState>;

// A buffer from ncclMemAlloc, as arrays.cpp reads one passed as an array (bytes).
struct BufferSpan {
    uintptr_t ptr;
    size_t nbytes;
    int device;  // the device current at allocation; -2 when it could not be asked
};
// The span of an mpbind.nccl.Buffer (UsageError once freed).
BufferSpan buffer_of(nb::handle buffer);
// The Python type of mpbind.nccl.Buffer.
nb::handle buffer_type();

}  // namespace mpbind::nccl
