// NCCL objects of the core that other parts build on (cuBLASMp grids live on a communicator).
#pragma once

#include <atomic>
#include <mutex>
#include <string>

#include "mpbind/bindings/_core_abi/nccl.hpp"
#include "core.hpp"
#include "launch.hpp"
#include "watchdog.hpp"

namespace mpbind::nccl {

using UniqueId = abi::nccl::ncclUniqueId;

// How a communicator failed: what every later call on it (and on what depends on it) raises.
struct Failure {
    bool timed_out = false;  // an operation ran past the deadline (CollectiveTimeoutError)
    std::string operation;   // the operation that failed ("" when none was running)
    uint64_t sequence = 0;   // its number in the flight record (0: none)
    std::string reason;
};

// What the watchdog and the bounded waits share about one communicator: its health (read on every
// hot call), the handle and how it ended, and the flight record (a Tracker, kept while watched).
class CommWatch : public watch::Tracker {
public:
    enum : uint32_t { kWatched = 1, kFailed = 2, kNonblocking = 4 };

    CommWatch(std::string label, double timeout, void* comm, int rank, bool nonblocking);
    ~CommWatch() override;

    // 0 for a healthy blocking communicator nobody watches: the hot calls read it relaxed, and do
    // nothing more when it is 0.
    std::atomic<uint32_t> flags{0};
    // A watched hot call is inside NCCL: the watchdog does not abort (free) the communicator under it.
    std::atomic<int> in_call{0};
    const int rank;

    // The handle and how it ended. Taken by the watchdog with try_lock only, so a wait that holds it
    // never blocks the watchdog thread.
    std::mutex comm_mu;
    void* const comm;
    std::atomic<bool> gone{false};  // aborted or destroyed: no NCCL call may name it
    bool revoked = false;           // ncclCommRevoke ran: no finalize; destroyed once quiescent

    // The first failure is kept; flags get kFailed. Any thread.
    void mark_failed(Failure f);
    Failure failure() const;
    [[noreturn]] void raise_failed() const;  // CommunicatorAbortedError / CollectiveTimeoutError

    bool look_library(watch::Finding& finding) override;  // ncclCommGetAsyncError
    void fail(const watch::Finding& finding) override;     // revoke (NCCL >= 2.28.7), else abort
    bool alive() const override { return !gone.load(); }

private:
    mutable std::mutex fail_mu_;
    Failure failure_;
};

class CommState : public State {
public:
    CommState(void* comm, int rank, int size, int device, double timeout, bool watched, bool nonblocking);
    void* comm;  // ncclComm_t
    int rank = 0, size = 0, device = -1;
    bool finalized = false;
    bool aborting = false;
    const double timeout;  // seconds: this communicator's deadline (its waits, and the watchdog's)
    const std::shared_ptr<CommWatch> watch;
    Registry registrations;  // ncclCommRegister (local)
    Registry windows;        // ncclCommWindowRegister (collective)

    bool failed() const { return (watch->flags.load(std::memory_order_relaxed) & CommWatch::kFailed) != 0; }
    // Raise what failed it, if it failed (the grids, plans and registrations on it call this).
    void refuse_if_failed() const {
        if (failed()) watch->raise_failed();
    }

    void finalize();  // ncclCommFinalize after draining what is queued under it, bounded

protected:
    void release() override;
};

using Communicator = Ref<CommState>;

// Note an operation of another library enqueued on `comm`'s behalf (a cuBLASMp matmul over it) in
// its flight record and, while watched, for the watchdog: begin before the call, end after it
// (`ok`: it was enqueued). Returns 0 when the communicator is not watched.
uint64_t begin_foreign(CommState& comm, const char* op, uintptr_t stream);
void end_foreign(CommState& comm, uint64_t seq, uintptr_t stream, bool ok);

// A launch's hold on the communicator its work runs over (launch.hpp: no GIL, failures as a Status),
// for NCCL's own collectives and another library's work over it (a cuBLASMp matmul). While it lives
// it holds the communicator's handle (a release or the watchdog's abort waits for the call); it
// refuses a closed or failed communicator (`refused`, naming `what`, else the communicator) and,
// while watched, notes the operation in the flight record. returned(): the library call returned;
// done(): whether the work was enqueued (a guard dropped without it counts as not enqueued).
class LaunchGuard {
public:
    LaunchGuard(CommState& comm, const char* op, uintptr_t stream, const std::string& what = {},
                uint64_t count = 0, int64_t bytes = -1, const char* dtype = "");
    ~LaunchGuard() { done(false); }
    LaunchGuard(const LaunchGuard&) = delete;
    LaunchGuard& operator=(const LaunchGuard&) = delete;
    launch::Status refused;  // !ok(): do not call the library
    void returned();
    void done(bool ok);

private:
    CommState& comm_;
    std::lock_guard<std::mutex> handle_;
    uintptr_t stream_;
    uint64_t seq_ = 0;
};

// A failed launch::collective on the communicator registered as `comm`, raised as the layer raises
// its calls' failures: UsageError for a refusal, the communicator's own error
// (CommunicatorAbortedError, CollectiveTimeoutError) once it failed, MpbindError otherwise; `what`
// names the caller.
[[noreturn]] void raise_launch(uint64_t comm, const launch::Status& status, const char* what);
// The number of ranks of the communicator registered as `comm`; -1 when none is.
int launch_size(uint64_t comm);

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
