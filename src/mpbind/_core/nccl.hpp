// NCCL objects of the core that other parts build on (cuBLASMp grids live on a communicator).
#pragma once

#include "abi/nccl.hpp"
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

}  // namespace mpbind::nccl
