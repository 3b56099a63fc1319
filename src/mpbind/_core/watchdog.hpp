// Failure handling of the core: deadlines, waits that honour Ctrl-C, blocking library calls on a
// thread of their own, and the watchdog thread with the flight records it keeps.
//
// * wait_until(): every wait the layer makes. The condition is polled without the GIL; every
//   kSignalSlice the GIL is taken and PyErr_CheckSignals() runs, so Ctrl-C (KeyboardInterrupt)
//   reaches Python within a fraction of a second; at the deadline WaitTimeoutError is raised.
//   Before either, the caller's give_up() runs (abort what the wait was for).
// * Worker: one blocking library call (a blocking communicator's ncclCommInitRankConfig or
//   ncclCommFinalize, NVSHMEM's initialisation) on a thread of its own, which the caller waits for
//   with wait_until(). A call that cannot be interrupted is abandoned, never killed: its clean-up
//   runs on its own thread when (if ever) the call returns.
// * Tracker: what the watchdog watches for one communicator (or for NVSHMEM's on-stream
//   collectives): the flight record (the last kRecords operations) and a CUDA event recorded after
//   each operation not yet seen complete. One thread per process, started by the first Tracker,
//   polls them: a library error, or an operation older than its deadline, makes the tracker fail().
//   That thread never takes the GIL: it calls the libraries through the tables' raw pointers and
//   writes to stderr with stdio.

#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core.hpp"

namespace mpbind {

// ---------------------------------------------------------------------------
// Deadlines
// ---------------------------------------------------------------------------

inline constexpr double kDefaultTimeout = 600.0;   // seconds: torch's ProcessGroupNCCL default
inline constexpr double kMaxTimeout = 1e9;          // seconds: any longer is a mistake, not a deadline
inline constexpr const char* kTimeoutVariable = "MPBIND_TIMEOUT";
inline constexpr const char* kWatchdogVariable = "MPBIND_WATCHDOG";

// The process default of every deadline: MPBIND_TIMEOUT seconds, else 600. UsageError naming the
// variable when it is not a number of seconds in (0, 1e9].
double default_timeout();
// A `timeout=` argument: None is default_timeout(); an int or float in (0, 1e9] is itself;
// TypeError (a bool, a string, ...) or UsageError (NaN, infinite, <= 0, too large) naming `what`.
double timeout_arg(nb::handle value, const char* what);
// A `watchdog=` argument: None is MPBIND_WATCHDOG ("1" on; unset, "" or "0" off); a bool is itself;
// TypeError otherwise. UsageError naming the variable for another value of it.
bool watchdog_arg(nb::handle value, const char* what);

// mpbind.errors.WaitTimeoutError(operation, timeout, detail).
[[noreturn]] void raise_wait_timeout(const std::string& operation, double timeout, const std::string& detail);

// ---------------------------------------------------------------------------
// Waits
// ---------------------------------------------------------------------------

// What runs when a wait ends early: `timed_out` (the deadline), else a signal (Ctrl-C).
using GiveUp = std::function<void(bool timed_out)>;

// How often a wait takes the GIL to run the signal handlers.
inline constexpr double kSignalSlice = 0.005;  // seconds

// Wait until `ready()` returns true. `ready` runs without the GIL (it may not touch Python) and
// is polled at a pace that backs off from a spin to 1 ms. A signal handler that raises (Ctrl-C:
// KeyboardInterrupt) ends the wait with its exception; `timeout` seconds end it with
// WaitTimeoutError(`what`, timeout, detail()). Either way `give_up(timed_out)` runs first, GIL held, the
// exception set aside (it may call the library: abort what the wait was for); an exception of its
// own is reported as unraisable. `raise_timeout`, when given, raises in place of WaitTimeoutError (a
// collective past its deadline is a CollectiveTimeoutError). Needs the GIL.
void wait_until(const std::string& what, double timeout, const std::function<bool()>& ready,
                const GiveUp& give_up = {}, const std::function<std::string()>& detail = {},
                const std::function<void()>& raise_timeout = {});

// One blocking library call on a thread of its own (started by start(), with the caller's CUDA
// context current on it). The caller waits for done() with wait_until(); when it gives up it calls
// abandon(): the call's thread then runs `late(result)` when the call returns, the clean-up of what
// the call made. The thread never takes the GIL.
class Worker {
public:
    static std::shared_ptr<Worker> start(std::function<long long()> call, std::function<void(long long)> late);
    bool done() const { return state_.load(std::memory_order_acquire) == kDone; }
    long long result() const { return result_; }
    // Abandon the call; false when it returned first (the caller then owns its result).
    bool abandon();

private:
    enum : int { kRunning, kDone, kAbandoned };
    std::atomic<int> state_{kRunning};
    long long result_ = 0;
    std::function<void(long long)> late_;
};

// Run `call` on a Worker and wait for it (wait_until's rules): its result, or the exception that
// ended the wait after `give_up()` ran (the Worker abandoned first; `late` cleans up after it).
long long run_bounded(const std::string& what, double timeout, std::function<long long()> call,
                      std::function<void(long long)> late, const GiveUp& give_up = {},
                      const std::function<std::string()>& detail = {});

// ---------------------------------------------------------------------------
// The watchdog and its trackers
// ---------------------------------------------------------------------------

namespace watch {

using Clock = std::chrono::steady_clock;
int64_t now_ns();

enum class OpState : uint8_t {
    kEnqueuing,  // the library call has not returned
    kPending,    // enqueued; its event has not completed
    kCompleted,  // its event completed
    kUntracked,  // enqueued, not tracked (a stream capturing a graph, no event to be had, too many pending)
    kFailed,     // the library call raised
};
const char* state_name(OpState s);

// One operation of a flight record.
struct Record {
    uint64_t seq = 0;         // 1, 2, ...: this tracker's operations in the order they were issued
    const char* op = "";      // "all_reduce", "barrier_all", "cublasmp.matmul", ...
    uint64_t count = 0;       // elements
    int64_t bytes = -1;       // bytes moved from this rank (-1: not known)
    const char* dtype = "";   // element type ("" when none)
    int peer = -1;            // root or peer (-1: none)
    uintptr_t stream = 0;
    int64_t enqueued_ns = 0;  // now_ns() before the library call
    OpState state = OpState::kUntracked;
};

// What a look at a tracker found.
struct Finding {
    bool failed = false;
    bool overrun = false;  // an operation ran past its deadline (else: an error)
    Record op;             // the operation (seq 0: none; the communicator itself failed)
    std::string reason;
};

class Tracker : public std::enable_shared_from_this<Tracker> {
public:
    static constexpr size_t kRecords = 64;
    static constexpr size_t kMaxPending = 1024;
    static constexpr size_t kPrefill = 16;  // events made at the first operation, off the later ones' path

    Tracker(std::string label, double timeout);
    virtual ~Tracker();
    Tracker(const Tracker&) = delete;
    Tracker& operator=(const Tracker&) = delete;

    const std::string label;  // "nccl.Communicator serial 3 (rank 0 of 2, device 0)"
    double timeout() const { return timeout_; }

    // --- the thread that issues the work, GIL held, around one library call ---
    // A record for the operation about to be issued; its sequence number.
    uint64_t begin(const char* op, uint64_t count, int64_t bytes, const char* dtype, int peer, uintptr_t stream);
    // The call returned: an event after it on `stream` (one recorded into a graph capture is dropped
    // at the next look: the operation is then untracked). With no spare event (a burst between two
    // looks) or the queue full, the newest entry no look has seen, when it is on the same stream, is
    // recorded again after this operation and covers it too (work on one stream completes in order).
    void enqueued(uint64_t seq, uintptr_t stream);
    // The call raised: nothing to wait for.
    void call_failed(uint64_t seq);

    // The flight record, oldest first.
    std::vector<Record> recent() const;
    // The flight record as lines of text (what is printed on stderr when the tracker fails).
    std::string report(const std::string& headline) const;

    // --- the watchdog thread ---
    // Complete what completed; find an operation past its deadline, or an error.
    Finding look(int64_t now);
    // What to do once a look found a failure (no GIL; once per tracker).
    virtual void fail(const Finding& finding) = 0;
    // A look at the library's own state before the operations (ncclCommGetAsyncError); may skip
    // this round (return false) when what it needs is busy.
    virtual bool look_library(Finding& finding) {
        (void)finding;
        return true;
    }
    // Whether it is still worth watching (a released communicator is not).
    virtual bool alive() const { return true; }

    std::atomic<bool> failed{false};

protected:
    // CUDA events through the driver; the tests' double overrides them.
    virtual void* new_event();                          // nullptr: none to be had
    virtual bool record(void* event, uintptr_t stream);  // false: not recorded
    // 1 complete, 0 not yet, 2 recorded into a graph capture (nothing to wait for), -1 a CUDA error (*error)
    virtual int query(void* event, int* error);
    virtual void destroy_event(void* event);
    // Release the events (a derived destructor calls it, so that its overrides run).
    void drop_events();

    mutable std::mutex mu_;  // the records and events; never held while calling Python

private:
    Record* slot(uint64_t seq);  // the record of `seq` while it is in the ring

    double timeout_;
    std::array<Record, kRecords> ring_{};
    uint64_t next_ = 1;
    struct Pending {
        Record op;             // the first operation it covers (a copy: the ring may have moved on)
        uint64_t last;         // the last operation it covers (op.seq when alone)
        void* event;           // recorded after `last`
        bool looked = false;   // a look has seen it (it takes no more operations: its deadline holds)
    };
    void mark(const Pending& p, OpState state);  // the ring's records of what `p` covers
    std::deque<Pending> pending_;  // oldest first
    std::vector<void*> spare_;
    bool events_dropped_ = false;
    bool prefilled_ = false;
};

// Watch `tracker` (starts the watchdog thread on first use). Needs the GIL.
void watch(const std::shared_ptr<Tracker>& tracker);
// Stop the watchdog thread (at interpreter exit): bounded, never hangs the exit. Needs the GIL.
void stop();
bool running();
// The flight record as Python sees it: a list of dicts, oldest first.
nb::list describe(const std::vector<Record>& records);

}  // namespace watch

}  // namespace mpbind
