// NCCL objects: Communicator (init, split, shrink, revoke, finalize/destroy/abort), Buffer
// (ncclMemAlloc/ncclMemFree) and refcounted registrations and windows; the hot calls; and what the
// watchdog and the bounded waits know of each communicator (CommWatch).
//
// Deadlines. A communicator keeps the blocking mode its config asks for (blocking by default): a
// non-blocking NCCL communicator runs every collective's launch on a thread NCCL starts for it,
// which the hot path cannot afford. What waits for other ranks (init, split, shrink, finalize,
// window registration) is bounded instead: the call runs on a thread of its own (a Worker) and
// this thread waits for it with wait_until(), which honours Ctrl-C and the deadline; a
// non-blocking communicator's ncclInProgress is polled the same way. A call given up is abandoned:
// a communicator it was making is aborted by its thread when (if ever) it returns.

#include "nccl.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cctype>
#include <climits>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>
#include <tuple>

#include "arrays.hpp"
#include "launch.hpp"
#include "register.hpp"

namespace mpbind::nccl {

namespace {

using namespace abi::nccl;
using capi::call;
using capi::check;
using capi::invoke;

const char* result_name(int r) {
    static constexpr const char* kNames[] = {"ncclSuccess",       "ncclUnhandledCudaError", "ncclSystemError",
                                             "ncclInternalError", "ncclInvalidArgument",    "ncclInvalidUsage",
                                             "ncclRemoteError",   "ncclInProgress",         "ncclTimeout"};
    return r >= 0 && r < 9 ? kNames[r] : "an unknown ncclResult_t";
}

std::string seconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", s);
    return buf;
}

// Why a wait was given up, for the failure it leaves.
std::string given_up(const std::string& what, bool timed_out, double timeout) {
    return what + (timed_out ? " did not complete within " + seconds(timeout) + " s" : " was interrupted (a signal)");
}

ncclConfig_t* config_ptr(const nb::object& config) {
    if (config.is_none()) return nullptr;
    if (!nb::hasattr(config, "ptr") || !nb::hasattr(config, "blocking")) {
        raise_type("config must be an mpbind.bindings.nccl.Config or None, not " +
                   nb::cast<std::string>(nb::str(config.type().attr("__name__"))));
    }
    return reinterpret_cast<ncclConfig_t*>(nb::cast<uintptr_t>(config.attr("ptr")));
}

// The caller's config as bytes (NCCL_CONFIG_INITIALIZER stores its size first): what a call on a
// thread of its own reads, kept with that thread. `nonblocking`: NCCL will answer ncclInProgress.
struct ConfigCopy {
    std::vector<unsigned char> bytes;
    bool nonblocking = false;
    ncclConfig_t* ptr() { return bytes.empty() ? nullptr : reinterpret_cast<ncclConfig_t*>(bytes.data()); }
};

bool env_nonblocking() {
    const char* v = std::getenv("NCCL_COMM_BLOCKING");
    return v != nullptr && std::string(v) == "0";
}

ConfigCopy copy_config(const nb::object& config, bool inherit_nonblocking) {
    ConfigCopy c;
    ncclConfig_t* p = config_ptr(config);
    if (p == nullptr) {
        c.nonblocking = inherit_nonblocking || env_nonblocking();
        return c;
    }
    size_t n = 0;
    std::memcpy(&n, p, sizeof n);
    if (n < 2 * sizeof(size_t) || n > 4096) {
        raise_usage("config is not an initialised ncclConfig_t (its size field is " + std::to_string(n) + ")");
    }
    auto* b = reinterpret_cast<const unsigned char*>(p);
    c.bytes.assign(b, b + n);
    int blocking = nb::cast<int>(config.attr("blocking"));
    c.nonblocking = blocking == 0 || (blocking == INT_MIN && (inherit_nonblocking || env_nonblocking()));
    return c;
}

// The raw entry points a Worker's thread calls (read here, under the GIL: the table is loaded).
struct Raw {
    decltype(Api::ncclCommAbort.ptr) abort;
    decltype(Api::ncclCommGetAsyncError.ptr) poll;
};
Raw raw() {
    const Api& a = api();
    return {a.ncclCommAbort.ptr, a.ncclCommGetAsyncError.ptr};
}

// `call` (a management call that may wait for other ranks) bounded by `timeout` seconds: on a Worker,
// then, when it answered ncclInProgress (a non-blocking communicator), ncclCommGetAsyncError of
// `poll_on` (nullptr: the communicator the call made) until it is no longer in progress, within the
// same deadline. `call` writes the communicator it makes, if any, to its argument: one made by a call
// that was given up is aborted (by the Worker's thread when the call returns late). `give_up` runs
// when the wait ends early (Ctrl-C, the deadline). Returns the call's final status and what it made.
std::pair<ncclResult_t, void*> bounded(const std::string& what, double timeout,
                                        std::function<ncclResult_t(void**)> call, void* poll_on,
                                        const GiveUp& give_up, const std::function<std::string()>& detail) {
    Raw r = raw();
    auto made = std::make_shared<std::atomic<void*>>(nullptr);
    auto start = std::chrono::steady_clock::now();
    long long status = run_bounded(
        what, timeout,
        [call = std::move(call), made]() -> long long {
            void* c = nullptr;
            ncclResult_t st = call(&c);
            made->store(c);
            return st;
        },
        [made, r](long long) {
            if (void* c = made->load()) r.abort(c);
        },
        give_up, detail);
    void* c = made->load();
    if (status != in_progress) return {static_cast<ncclResult_t>(status), c};
    void* target = poll_on != nullptr ? poll_on : c;
    double left = timeout - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ncclResult_t queried = success, state = in_progress;
    wait_until(
        what, std::max(left, 1e-3),
        [&] {
            queried = r.poll(target, &state);
            return queried != success || state != in_progress;
        },
        [&](bool timed_out) {
            if (c != nullptr) {
                nb::gil_scoped_release release;
                r.abort(c);  // non-blocking: nothing runs inside NCCL on this communicator
            }
            if (give_up) give_up(timed_out);
        },
        detail);
    if (queried != success) return {queried, c};
    return {state, c};
}

void check_status(ncclResult_t status, const char* function) { check(library, status, function); }

}  // namespace

// ---------------------------------------------------------------------------
// CommWatch: the communicator's health, shared with the watchdog thread
// ---------------------------------------------------------------------------

namespace {

// Whether the loaded NCCL exports ncclCommRevoke (2.28.7 and later): asked once, under the GIL.
std::atomic<int> g_have_revoke{-1};

bool have_revoke() {
    int known = g_have_revoke.load();
    if (known >= 0) return known == 1;
    bool has = false;
    try {
        nb::object addr = nb::module_::import_("mpbind.bindings._internal.nccl").attr("symbol_address")("ncclCommRevoke");
        has = nb::cast<uintptr_t>(addr) != 0;
    } catch (nb::python_error&) {
        has = false;
    }
    g_have_revoke.store(has ? 1 : 0);
    return has;
}

}  // namespace

CommWatch::CommWatch(std::string label, double timeout, void* comm, int rank, bool nonblocking)
    : Tracker(std::move(label), timeout), rank(rank), comm(comm) {
    if (nonblocking) flags.fetch_or(kNonblocking);
}

CommWatch::~CommWatch() { drop_events(); }

void CommWatch::mark_failed(Failure f) {
    {
        std::lock_guard<std::mutex> g(fail_mu_);
        if (flags.load() & kFailed) return;  // the first failure is the one to report
        failure_ = std::move(f);
    }
    flags.fetch_or(kFailed, std::memory_order_seq_cst);
}

Failure CommWatch::failure() const {
    std::lock_guard<std::mutex> g(fail_mu_);
    return failure_;
}

void CommWatch::raise_failed() const {
    Failure f = failure();
    nb::object cls = nb::module_::import_("mpbind.errors").attr(f.timed_out ? "CollectiveTimeoutError"
                                                                           : "CommunicatorAbortedError");
    nb::object err = cls(label, rank, f.operation, f.sequence, f.reason);
    PyErr_SetObject(cls.ptr(), err.ptr());
    throw nb::python_error();
}

bool CommWatch::look_library(watch::Finding& finding) {
    std::unique_lock<std::mutex> l(comm_mu, std::try_to_lock);
    if (!l.owns_lock()) return false;  // a wait or a release holds it: next round
    if (gone.load()) return false;
    ncclResult_t state = success;
    ncclResult_t r = api().ncclCommGetAsyncError.ptr(comm, &state);
    if (r == success && (state == success || state == in_progress)) return true;
    int bad = r != success ? r : state;
    finding.failed = true;
    finding.reason = std::string("NCCL reported ") + result_name(bad) + " (" + std::to_string(bad) +
                     ") on this communicator (ncclCommGetAsyncError)";
    std::vector<watch::Record> recent = this->recent();
    for (auto it = recent.rbegin(); it != recent.rend(); ++it) {
        if (it->state == watch::OpState::kPending || it->state == watch::OpState::kEnqueuing) finding.op = *it;
    }
    return true;
}

void CommWatch::fail(const watch::Finding& f) {
    const bool revoke = g_have_revoke.load() == 1;
    mark_failed({f.overrun, f.op.seq ? f.op.op : "", f.op.seq, f.reason});
    std::string action = revoke ? "the watchdog revokes it (ncclCommRevoke)" : "the watchdog aborts it (ncclCommAbort)";
    std::string text = report(label + " failed on rank " + std::to_string(rank) + ": " + f.reason + "; " + action +
                              ", and every later call on it raises " +
                              (f.overrun ? "CollectiveTimeoutError" : "CommunicatorAbortedError"));
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
    // The handle: a wait or a release may hold it (it then sees the failure itself); try for a while.
    std::unique_lock<std::mutex> l(comm_mu, std::defer_lock);
    for (int i = 0; i < 200 && !l.try_lock(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!l.owns_lock() || gone.load()) return;
    const Api& a = api();
    if (revoke) {
        a.ncclCommRevoke.ptr(comm, 0);  // stops what is in flight; the communicator stays for shrink()
        revoked = true;
        return;
    }
    // ncclCommAbort frees the communicator: not while a hot call is inside NCCL with it (it returns
    // soon, or it waits on the host for another rank, which only the abort ends).
    for (int i = 0; i < 200 && in_call.load(std::memory_order_seq_cst) != 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    a.ncclCommAbort.ptr(comm);
    gone.store(true);
}

namespace {

std::unique_lock<std::mutex> lock_handle(CommWatch& w) {
    std::unique_lock<std::mutex> l(w.comm_mu, std::try_to_lock);
    if (!l.owns_lock()) {
        nb::gil_scoped_release release;  // the watchdog holds it briefly, and never waits for the GIL
        l.lock();
    }
    return l;
}

std::string label_of(uint64_t serial, int rank, int size, int device) {
    return "nccl.Communicator serial " + std::to_string(serial) + " (rank " + std::to_string(rank) + " of " +
           std::to_string(size) + ", device " + std::to_string(device) + ")";
}

// Abort a communicator whose wait was given up (`why`), and mark it failed. Handle lock held.
void abort_given_up(CommState& s, const std::string& operation, const std::string& why, bool timed_out) {
    CommWatch& w = *s.watch;
    w.mark_failed({timed_out, operation, 0, why});
    if (w.gone.load()) return;
    {
        nb::gil_scoped_release release;
        raw().abort(s.comm);
    }
    w.gone.store(true);
}

// Until the communicator is quiescent (after ncclCommRevoke), bounded; handle lock held.
void wait_quiescent(CommState& s, const char* what) {
    Raw r = raw();
    void* comm = s.comm;
    ncclResult_t state = in_progress;
    wait_until(what, s.timeout, [&] {
        r.poll(comm, &state);
        return state != in_progress;
    }, [&](bool timed_out) {
        abort_given_up(s, what, std::string(what) + (timed_out ? " timed out" : " was interrupted") +
                                    " while the revoked communicator became quiescent; it was aborted", timed_out);
    },
       [] { return std::string("the revoked communicator did not become quiescent; it was aborted"); });
}

}  // namespace

namespace {

UniqueId to_unique_id(nb::handle uid) {
    UniqueId id{};
    Py_buffer view;
    if (PyObject_GetBuffer(uid.ptr(), &view, PyBUF_SIMPLE) != 0) {
        PyErr_Clear();
        raise_type("unique_id must be a 128-byte bytes-like object (mpbind.bindings.nccl.UniqueId or bytes)");
    }
    size_t n = static_cast<size_t>(view.len);
    if (n == sizeof(id.internal)) std::memcpy(id.internal, view.buf, n);
    PyBuffer_Release(&view);
    if (n != sizeof(id.internal)) {
        raise_usage("unique_id must be 128 bytes, got " + std::to_string(n));
    }
    return id;
}

// --- buffers from ncclMemAlloc ---

class BufferState : public State {
public:
    BufferState(void* ptr, size_t size, int device) : State("nccl.Buffer"), ptr(ptr), size(size), device(device) {}
    void* ptr;
    size_t size;
    int device;  // current when allocated (-2: unknown), for its use as an array

protected:
    void release() override { call(api().ncclMemFree, ptr); }
};
using Buffer = Ref<BufferState>;

// --- registrations ---

// ncclCommWindowRegister/Deregister (collective) bounded by the communicator's deadline; a wait given
// up leaves the communicator failed (it is inside a collective the other ranks never finished).
ncclResult_t bounded_window(CommState& s, const char* function, std::function<ncclResult_t()> fn) {
    auto [status, made] = bounded(std::string("nccl.Communicator ") + function, s.timeout,
                                  [fn = std::move(fn)](void**) { return fn(); }, s.comm,
                                  [&](bool timed_out) {
                                      s.watch->mark_failed({timed_out, function, 0, given_up(function, timed_out, s.timeout)});
                                  },
                                  [&] { return "another rank never made the same call (or died)"; });
    (void)made;
    return status;
}

class CommRegistration : public RegistrationState {
public:
    CommRegistration(bool window, uintptr_t ptr, size_t size, nb::object buffer)
        : RegistrationState(window ? "nccl.Window" : "nccl.Registration", ptr, size, std::move(buffer)),
          window(window) {}
    const bool window;  // ncclCommWindowRegister (collective), else ncclCommRegister (local)
    std::shared_ptr<CommState> comm;

protected:
    void deregister() override {
        // Over a failed communicator nothing is released: the library cannot, and the other ranks
        // would not join a collective deregistration.
        if (comm->aborting || comm->failed()) return;
        void* h = reinterpret_cast<void*>(lib_handle);
        void* c = comm->comm;
        if (window) {
            auto fn = api().ncclCommWindowDeregister.ptr;
            check_status(bounded_window(*comm, "ncclCommWindowDeregister", [fn, c, h] { return fn(c, h); }),
                         "ncclCommWindowDeregister");
        } else {
            call(api().ncclCommDeregister, c, h);
        }
    }
};

}  // namespace

CommState::CommState(void* comm, int rank, int size, int device, double timeout, bool watched, bool nonblocking)
    : State("nccl.Communicator"),
      comm(comm),
      rank(rank),
      size(size),
      device(device),
      timeout(timeout),
      watch(std::make_shared<CommWatch>(label_of(serial(), rank, size, device), timeout, comm, rank, nonblocking)) {
    if (watched) {
        have_revoke();  // asked now, under the GIL: the watchdog thread reads the answer
        watch->flags.fetch_or(CommWatch::kWatched);
        watch::watch(watch);
    }
}

namespace {

// ncclCommFinalize, bounded: a blocking communicator waits inside it for the other ranks. Given up,
// the communicator is aborted (from this thread, while the call waits on its own: NCCL's way to end
// it). Handle lock held.
void finalize_bounded(CommState& s) {
    auto fn = api().ncclCommFinalize.ptr;
    void* c = s.comm;
    auto [status, made] = bounded(
        "nccl.Communicator.finalize", s.timeout, [fn, c](void**) { return fn(c); }, c,
        [&](bool timed_out) {
            abort_given_up(s, "finalize", given_up("ncclCommFinalize", timed_out, s.timeout) + "; it was aborted",
                           timed_out);
        },
        [] { return std::string("another rank did not finalize, or an operation on the communicator never completed; "
                                "the communicator was aborted"); });
    (void)made;
    check_status(status, "ncclCommFinalize");
}

}  // namespace

void CommState::finalize() {
    check_open();
    refuse_if_failed();
    if (finalized) return;
    drain_queue(this);
    auto l = lock_handle(*watch);
    if (watch->gone.load()) watch->raise_failed();
    finalize_bounded(*this);
    finalized = true;
}

void CommState::release() {
    CommWatch& w = *watch;
    auto l = lock_handle(w);
    if (w.gone.load()) return;  // aborted already (by the watchdog, or a wait given up)
    if (aborting || (failed() && !w.revoked)) {
        {
            nb::gil_scoped_release release;
            raw().abort(comm);
        }
        w.gone.store(true);
        return;
    }
    if (w.revoked) {  // no finalize after a revoke: destroy once quiescent
        wait_quiescent(*this, "nccl.Communicator.close");
        if (w.gone.load()) return;
    } else if (!finalized) {
        finalize_bounded(*this);
        finalized = true;
    }
    w.gone.store(true);
    call(api().ncclCommDestroy, comm);
}

namespace {

// A new communicator over `comm` (what init/split/shrink made, ready): its rank, size and device.
std::shared_ptr<CommState> adopt(void* comm, double timeout, bool watched, bool nonblocking) {
    const Api& a = api();
    int rank = 0, size = 0, device = -1;
    try {
        call(a.ncclCommUserRank, comm, &rank);
        call(a.ncclCommCount, comm, &size);
        call(a.ncclCommCuDevice, comm, &device);
    } catch (...) {
        raw().abort(comm);
        throw;
    }
    return std::make_shared<CommState>(comm, rank, size, device, timeout, watched, nonblocking);
}

// The deadline and the watchdog of a communicator made from `parent`: what is given, else the parent's.
double child_timeout(const CommState& parent, nb::handle timeout) {
    return timeout.is_none() ? parent.timeout : timeout_arg(timeout, "timeout");
}
bool child_watched(const CommState& parent, nb::handle watchdog) {
    if (watchdog.is_none()) return (parent.watch->flags.load() & CommWatch::kWatched) != 0;
    return watchdog_arg(watchdog, "watchdog");
}

Communicator init(int nranks, int rank, nb::handle unique_id, nb::object config, nb::handle timeout_h,
                  nb::handle watchdog_h) {
    if (nranks < 1) raise_usage("nranks must be >= 1, got " + std::to_string(nranks));
    if (rank < 0 || rank >= nranks) {
        raise_usage("rank must be in [0, " + std::to_string(nranks) + "), got " + std::to_string(rank));
    }
    UniqueId id = to_unique_id(unique_id);
    double timeout = timeout_arg(timeout_h, "timeout");
    bool watched = watchdog_arg(watchdog_h, "watchdog");
    auto cfg = std::make_shared<ConfigCopy>(copy_config(config, false));
    auto fn = api().ncclCommInitRankConfig.ptr;
    std::string who = "rank " + std::to_string(rank) + " of " + std::to_string(nranks);
    auto [status, comm] = bounded(
        "nccl.Communicator.init (" + who + ")", timeout,
        [fn, id, nranks, rank, cfg](void** out) {
            ncclComm_t c = nullptr;
            ncclResult_t st = fn(&c, nranks, id, rank, cfg->ptr());
            *out = c;
            return st;
        },
        nullptr, {},
        [] { return std::string("not every rank called init with this unique id and number of ranks (one never "
                                "started, or died); should NCCL still make the communicator, it is aborted"); });
    if (status != success) {
        if (comm != nullptr) raw().abort(comm);
        check_status(status, "ncclCommInitRankConfig");
    }
    return Communicator(adopt(comm, timeout, watched, cfg->nonblocking));
}

std::optional<Communicator> split(Communicator& self, int color, int key, nb::object config, nb::handle timeout_h,
                                  nb::handle watchdog_h) {
    CommState& s = self.get();
    s.refuse_if_failed();
    if (color < NCCL_SPLIT_NOCOLOR) {
        raise_usage("color must be >= 0 or " + std::to_string(NCCL_SPLIT_NOCOLOR) + " (no color), got " +
                    std::to_string(color));
    }
    double timeout = child_timeout(s, timeout_h);
    bool watched = child_watched(s, watchdog_h);
    bool parent_nb = (s.watch->flags.load() & CommWatch::kNonblocking) != 0;
    auto cfg = std::make_shared<ConfigCopy>(copy_config(config, parent_nb));
    auto fn = api().ncclCommSplit.ptr;
    void* parent = s.comm;
    auto l = lock_handle(*s.watch);
    auto [status, comm] = bounded(
        "nccl.Communicator.split", timeout,
        [fn, parent, color, key, cfg](void** out) {
            ncclComm_t c = nullptr;
            ncclResult_t st = fn(parent, color, key, &c, cfg->ptr());
            *out = c;
            return st;
        },
        parent,  // polled when the new communicator is NULL (this rank passed no color)
        [&](bool timed_out) {
            s.watch->mark_failed({timed_out, "split", 0, given_up("ncclCommSplit", timed_out, timeout)});
        },
        [] { return std::string("another rank of the communicator never called split (or died)"); });
    if (status != success) {
        if (comm != nullptr) raw().abort(comm);
        check_status(status, "ncclCommSplit");
    }
    if (comm == nullptr) return std::nullopt;  // this rank passed no color
    return Communicator(adopt(comm, timeout, watched, cfg->nonblocking));
}

Communicator shrink(Communicator& self, std::vector<int> exclude, nb::object config, int flags, nb::handle timeout_h,
                    nb::handle watchdog_h) {
    std::shared_ptr<CommState> keep = self.state();
    CommState& s = self.get();
    CommWatch& w = *s.watch;
    for (int r : exclude) {
        if (r < 0 || r >= s.size) {
            raise_usage("exclude_ranks: rank " + std::to_string(r) + " is not in [0, " + std::to_string(s.size) +
                        ")");
        }
    }
    double timeout = child_timeout(s, timeout_h);
    bool watched = child_watched(s, watchdog_h);
    bool parent_nb = (w.flags.load() & CommWatch::kNonblocking) != 0;
    auto cfg = std::make_shared<ConfigCopy>(copy_config(config, parent_nb));
    auto l = lock_handle(w);
    if (w.gone.load()) {
        Failure f = w.failure();
        nb::object cls = nb::module_::import_("mpbind.errors").attr("CommunicatorAbortedError");
        nb::object err = cls(w.label, w.rank, "shrink", 0,
                             "it was aborted (" + (f.reason.empty() ? std::string("abort()") : f.reason) +
                                 "), so it cannot be shrunk: NCCL revokes a communicator (keeping it for shrink) only "
                                 "from 2.28.7; make a new communicator of the remaining ranks");
        PyErr_SetObject(cls.ptr(), err.ptr());
        throw nb::python_error();
    }
    if (w.revoked) wait_quiescent(s, "nccl.Communicator.shrink");
    auto fn = api().ncclCommShrink.ptr;
    void* parent = s.comm;
    auto excl = std::make_shared<std::vector<int>>(std::move(exclude));
    auto [status, comm] = bounded(
        "nccl.Communicator.shrink", timeout,
        [fn, parent, excl, cfg, flags](void** out) {
            ncclComm_t c = nullptr;
            ncclResult_t st = fn(parent, excl->data(), static_cast<int>(excl->size()), &c, cfg->ptr(), flags);
            *out = c;
            return st;
        },
        nullptr,
        [&](bool timed_out) { w.mark_failed({timed_out, "shrink", 0, given_up("ncclCommShrink", timed_out, timeout)}); },
        [] { return std::string("a remaining rank never called shrink with the same excluded ranks (or died)"); });
    if (status != success) {
        if (comm != nullptr) raw().abort(comm);
        check_status(status, "ncclCommShrink");
    }
    return Communicator(adopt(comm, timeout, watched, cfg->nonblocking));
}

// ncclCommRevoke: stop what is in flight on this communicator and refuse everything but shrink()
// and close() from now on (the layer raises CommunicatorAbortedError); returns once quiescent.
void revoke(Communicator& self) {
    std::shared_ptr<CommState> keep = self.state();
    CommState& s = self.get();
    CommWatch& w = *s.watch;
    auto l = lock_handle(w);
    if (w.gone.load()) w.raise_failed();
    if (!w.revoked) {
        call(api().ncclCommRevoke, s.comm, 0);  // FunctionNotFoundError naming 2.28.7 before it
        w.revoked = true;
        w.mark_failed({false, "revoke", 0, "revoke() was called on this rank"});
    }
    wait_quiescent(s, "nccl.Communicator.revoke");
}

RegistrationRef do_register(Communicator& self, uintptr_t ptr, size_t size, nb::object buffer, bool window,
                         int flags) {
    if (ptr == 0) raise_usage("cannot register a NULL pointer");
    if (size == 0) raise_usage("cannot register 0 bytes");
    std::shared_ptr<CommState> comm = self.state();
    CommState& s = self.get();
    s.refuse_if_failed();
    Registry& reg = window ? s.windows : s.registrations;
    return reg.acquire(s, ptr, size, [&]() -> std::shared_ptr<RegistrationState> {
        void* h = nullptr;
        if (window) {
            auto fn = api().ncclCommWindowRegister.ptr;
            void* c = s.comm;
            auto out = std::make_shared<void*>(nullptr);  // written by the call's thread, maybe late
            check_status(bounded_window(s, "ncclCommWindowRegister",
                                        [fn, c, ptr, size, out, flags] {
                                            return fn(c, reinterpret_cast<void*>(ptr), size, out.get(), flags);
                                        }),
                         "ncclCommWindowRegister");
            h = *out;
            if (h == nullptr) {
                raise_library_error(library.name, api().ncclCommWindowRegister.name, ncclInternalError,
                                    "returned ncclSuccess but a NULL window (symmetric memory is not "
                                    "available for this buffer or communicator)");
            }
        } else {
            call(api().ncclCommRegister, s.comm, reinterpret_cast<void*>(ptr), size, &h);
        }
        auto r = std::make_shared<CommRegistration>(window, ptr, size, std::move(buffer));
        r->lib_handle = reinterpret_cast<uintptr_t>(h);
        r->comm = comm;
        return r;
    });
}

nb::list list_registrations(Communicator& self) {
    CommState& s = self.get();
    auto live = s.registrations.live();
    auto windows = s.windows.live();
    live.insert(live.end(), windows.begin(), windows.end());
    return describe(live);
}


// --- collectives and point-to-point calls: the hot path ---------------------------------------
//
// Each is one call from the facade: the arguments are described and checked here (the same
// checks, in the same order, as the layer made in Python), then the library is called once with
// the GIL released. Nothing reaches NCCL before every check passed.

enum class Coll { kAllReduce, kReduce, kBroadcast, kAllGather, kReduceScatter, kAllToAll, kSend, kRecv };

// What the checks read of a communicator.
struct CommView {
    int rank, size, device;
};

// The arguments of one library call.
struct Call {
    uintptr_t send = 0, recv = 0;
    size_t count = 0;
    int dtype = 0;
    int op = 0;    // ncclRedOp_t
    int peer = 0;  // root or peer
    uintptr_t stream = 0;
};

struct Operand {
    uintptr_t ptr;
    int64_t count;
    arrays::Dtype dtype;
};

Operand checked(const arrays::Array& a, const char* what, int device) {
    if (a.device >= 0 && a.device != device) {
        raise_usage(std::string(what) + " is on device " + std::to_string(a.device) +
                    " but the communicator uses device " + std::to_string(device));
    }
    if (arrays::info(a.dtype).nccl < 0) {
        raise_usage(std::string(what) + ": NCCL has no " + arrays::name(a.dtype) + " type");
    }
    return {a.ptr, a.size, a.dtype};
}

Operand operand(nb::handle obj, const char* what, int device, bool writable) {
    return checked(arrays::device_array(obj, {what, writable, true, true}), what, device);
}

std::string ratio_text(double r) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", r);
    return buf;
}

// sendbuf and recvbuf of a collective whose sendbuf holds `num`/`den` times recvbuf's elements.
void pair(nb::handle send, nb::handle recv, const CommView& c, int64_t num, int64_t den, Operand& s, Operand& r) {
    if (send.is(recv)) {  // in place: one description serves both
        arrays::Array a = arrays::device_array(send, {"sendbuf", false, true, true});
        s = checked(a, "sendbuf", c.device);
        if (a.readonly) raise_usage("recvbuf is read-only");
        r = s;
    } else {
        s = operand(send, "sendbuf", c.device, false);
        r = operand(recv, "recvbuf", c.device, true);
    }
    if (s.dtype != r.dtype) {
        raise_usage(std::string("sendbuf is ") + arrays::name(s.dtype) + " but recvbuf is " + arrays::name(r.dtype));
    }
    // (counts below 2**63 times up to the number of ranks: a product can overflow, and wrap to a match)
    int64_t send_scaled = checked_mul(s.count, den, "sendbuf's elements x ranks");
    int64_t recv_scaled = checked_mul(r.count, num, "recvbuf's elements x ranks");
    if (send_scaled != recv_scaled) {
        raise_usage("sendbuf has " + std::to_string(s.count) + " elements and recvbuf " + std::to_string(r.count) +
                    "; expected sendbuf = " + ratio_text(static_cast<double>(num) / static_cast<double>(den)) +
                    " x recvbuf for this collective on " + std::to_string(c.size) + " ranks");
    }
}

int rank_arg(nb::handle v, const char* what, const CommView& c) {
    long long r = -1;
    if (!arrays::as_index(v, r) || r < 0 || r >= c.size) {
        raise_usage(std::string(what) + " must be a rank in [0, " + std::to_string(c.size) + "), got " +
                    arrays::repr_of(v));
    }
    return static_cast<int>(r);
}

constexpr const auto& kOpNames = launch::kNcclRedOpNames;

int op_arg(nb::handle v) {
    if (PyUnicode_Check(v.ptr())) {
        std::string name = nb::cast<std::string>(v);
        for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        for (int i = 0; i < 5; ++i) {
            if (name == kOpNames[i]) return i;
        }
        raise_usage("unknown reduction " + arrays::repr_of(v) + " (use one of sum, prod, max, min, avg or a RedOp)");
    }
    long long op = 0;
    if (!arrays::as_index(v, op)) {
        raise_type("op must be a reduction name (sum, prod, max, min, avg) or a RedOp, not " + arrays::typename_of(v));
    }
    if (op < 0 || op > 0x7fffffffLL) raise_usage("op must be a RedOp (an ncclRedOp_t >= 0), got " + std::to_string(op));
    return static_cast<int>(op);
}

Call plan(Coll kind, const CommView& c, nb::handle sendbuf, nb::handle recvbuf, nb::handle op, nb::handle peer,
          nb::handle stream) {
    Call k;
    Operand s{}, r{};
    switch (kind) {
        case Coll::kSend: s = operand(sendbuf, "sendbuf", c.device, false); break;
        case Coll::kRecv: r = operand(recvbuf, "recvbuf", c.device, true); break;
        case Coll::kAllGather: pair(sendbuf, recvbuf, c, 1, c.size, s, r); break;
        case Coll::kReduceScatter: pair(sendbuf, recvbuf, c, c.size, 1, s, r); break;
        default: pair(sendbuf, recvbuf, c, 1, 1, s, r); break;
    }
    k.send = s.ptr;
    k.recv = r.ptr;
    switch (kind) {
        case Coll::kAllGather:
        case Coll::kSend: k.count = static_cast<size_t>(s.count); break;
        case Coll::kAllToAll:
            if (s.count % c.size) {
                raise_usage("all_to_all: " + std::to_string(s.count) + " elements do not split into " +
                            std::to_string(c.size) + " equal blocks");
            }
            k.count = static_cast<size_t>(s.count / c.size);
            break;
        default: k.count = static_cast<size_t>(r.count); break;
    }
    k.dtype = arrays::info(kind == Coll::kSend ? s.dtype : r.dtype).nccl;
    if (kind == Coll::kReduce || kind == Coll::kBroadcast) k.peer = rank_arg(peer, "root", c);
    if (kind == Coll::kSend || kind == Coll::kRecv) k.peer = rank_arg(peer, "peer", c);
    if (kind == Coll::kAllReduce || kind == Coll::kReduce || kind == Coll::kReduceScatter) k.op = op_arg(op);
    k.stream = stream_handle(stream);
    return k;
}

// A collective's status: ncclInProgress is how a non-blocking communicator says it started.
template <class Fn, class... A>
ncclResult_t enqueue(const Fn& fn, A... args) {
    ncclResult_t status = invoke(fn, args...);
    if (status != success && status != in_progress) check(fn, status);
    return status;
}

ncclResult_t issue(Coll kind, const Call& k, void* comm) {
    const Api& a = api();
    auto* send = reinterpret_cast<const void*>(k.send);
    auto* recv = reinterpret_cast<void*>(k.recv);
    auto* stream = reinterpret_cast<cudaStream_t>(k.stream);
    switch (kind) {
        case Coll::kAllReduce: return enqueue(a.ncclAllReduce, send, recv, k.count, k.dtype, k.op, comm, stream);
        case Coll::kReduce: return enqueue(a.ncclReduce, send, recv, k.count, k.dtype, k.op, k.peer, comm, stream);
        case Coll::kBroadcast: return enqueue(a.ncclBroadcast, send, recv, k.count, k.dtype, k.peer, comm, stream);
        case Coll::kAllGather: return enqueue(a.ncclAllGather, send, recv, k.count, k.dtype, comm, stream);
        case Coll::kReduceScatter:
            return enqueue(a.ncclReduceScatter, send, recv, k.count, k.dtype, k.op, comm, stream);
        case Coll::kAllToAll: return enqueue(a.ncclAlltoAll, send, recv, k.count, k.dtype, comm, stream);
        case Coll::kSend: return enqueue(a.ncclSend, send, k.count, k.dtype, k.peer, comm, stream);
        case Coll::kRecv: return enqueue(a.ncclRecv, recv, k.count, k.dtype, k.peer, comm, stream);
    }
    return success;
}

constexpr const char* kCollNames[] = {"all_reduce", "reduce",     "broadcast", "all_gather",
                                      "reduce_scatter", "all_to_all", "send", "recv"};

// ncclDataType_t: its name and size (ncclInt8 .. ncclFloat8e5m2).
constexpr const char* kTypeNames[] = {"int8",    "uint8",   "int32",    "uint32",        "int64",      "uint64",
                                      "float16", "float32", "float64", "bfloat16", "float8_e4m3fn", "float8_e5m2"};
constexpr const int* kTypeSizes = launch::kNcclTypeSizes;

// The layer's group (mpbind.nccl.group()) on this thread: what its end settles. Non-blocking
// communicators launch a group's work on a thread NCCL starts at ncclGroupEnd, so the events of the
// watched operations are recorded only after it.
struct Group {
    int depth = 0;
    std::vector<std::shared_ptr<CommState>> nonblocking;
    std::vector<std::tuple<std::shared_ptr<CommWatch>, uint64_t, uintptr_t>> tracked;
};
thread_local Group t_group;

// Until a non-blocking communicator's operation is launched (ncclInProgress), within its deadline; given
// up, the communicator is aborted (nothing of it runs inside NCCL: non-blocking) and raises what failed it.
void settle(CommState& s, const char* operation) {
    CommWatch& w = *s.watch;
    auto l = lock_handle(w);
    if (w.gone.load()) w.raise_failed();
    Raw r = raw();
    void* comm = s.comm;
    ncclResult_t queried = success, state = in_progress;
    wait_until(std::string("nccl.Communicator.") + operation, s.timeout, [&] {
        queried = r.poll(comm, &state);
        return queried != success || state != in_progress;
    }, [&](bool timed_out) {
        abort_given_up(s, operation, given_up(operation, timed_out, s.timeout) + " (NCCL had not launched it); "
                       "the communicator was aborted", timed_out);
    }, {}, [&] { w.raise_failed(); });
    if (queried != success) check_status(queried, "ncclCommGetAsyncError");
    check_status(state, operation);
}

// A hot call on a communicator whose flags are not 0: failed (raise), watched (track it) or
// non-blocking (wait until launched, or note it for the group's end).
void run_flagged(Coll kind, const Call& k, const std::shared_ptr<CommState>& sp, uint32_t f) {
    CommState& s = *sp;
    CommWatch& w = *s.watch;
    const char* name = kCollNames[static_cast<int>(kind)];
    if (f & CommWatch::kFailed) w.raise_failed();
    uint64_t seq = 0;
    if (f & CommWatch::kWatched) {
        // Dekker with CommWatch::fail(): either this call sees the failure, or the watchdog sees the call.
        w.in_call.store(1, std::memory_order_seq_cst);
        if (w.flags.load(std::memory_order_seq_cst) & CommWatch::kFailed) {
            w.in_call.store(0);
            w.raise_failed();
        }
        bool known = k.dtype >= 0 && k.dtype < 12;
        int64_t bytes = known ? static_cast<int64_t>(k.count) * kTypeSizes[k.dtype] : -1;
        bool rooted = kind == Coll::kReduce || kind == Coll::kBroadcast || kind == Coll::kSend || kind == Coll::kRecv;
        seq = w.begin(name, k.count, bytes, known ? kTypeNames[k.dtype] : "", rooted ? k.peer : -1, k.stream);
    }
    ncclResult_t status;
    try {
        status = issue(kind, k, s.comm);
    } catch (...) {
        if (seq) {
            w.call_failed(seq);
            w.in_call.store(0, std::memory_order_release);
        }
        throw;
    }
    if (seq) w.in_call.store(0, std::memory_order_release);
    bool grouped = t_group.depth > 0;
    if (grouped && (f & CommWatch::kNonblocking)) {
        bool known = false;
        for (auto& c : t_group.nonblocking) known = known || c.get() == &s;
        if (!known) t_group.nonblocking.push_back(sp);
    } else if (status == in_progress) {
        try {
            settle(s, name);
        } catch (...) {
            if (seq) w.call_failed(seq);
            throw;
        }
    }
    if (!seq) return;
    if (grouped) {
        t_group.tracked.emplace_back(s.watch, seq, k.stream);
    } else {
        w.enqueued(seq, k.stream);
    }
}

void run(Coll kind, Communicator& c, nb::handle sendbuf, nb::handle recvbuf, nb::handle op, nb::handle peer,
         nb::handle stream) {
    CommState& s = c.get();
    // Nothing but this relaxed load when the communicator is blocking, healthy and not watched.
    uint32_t f = s.watch->flags.load(std::memory_order_relaxed);
    if (f & CommWatch::kFailed) s.watch->raise_failed();
    Call k = plan(kind, {s.rank, s.size, s.device}, sendbuf, recvbuf, op, peer, stream);
    if (f == 0) {
        issue(kind, k, s.comm);
        return;
    }
    run_flagged(kind, k, c.state(), f);
}

void group_start() {
    call(api().ncclGroupStart);
    ++t_group.depth;
}

// ncclGroupEnd, then (outermost group) the non-blocking communicators' launches and the events of
// the watched operations. Raises the first error, after settling every communicator.
void group_end() {
    if (t_group.depth == 0) raise_usage("group_end() without group_start() on this thread");
    --t_group.depth;
    ncclResult_t status = invoke(api().ncclGroupEnd);
    if (t_group.depth > 0) {
        if (status != success && status != in_progress) check_status(status, "ncclGroupEnd");
        return;
    }
    Group done = std::move(t_group);
    t_group = Group{};
    std::optional<nb::python_error> first;
    if (status != success && status != in_progress) {
        try {
            check_status(status, "ncclGroupEnd");
        } catch (nb::python_error& e) {
            first.emplace(std::move(e));
        }
    }
    for (auto& c : done.nonblocking) {
        try {
            settle(*c, "group");
        } catch (nb::python_error& e) {
            if (!first) first.emplace(std::move(e));
        }
    }
    if (!first) {
        for (auto& [w, seq, stream] : done.tracked) w->enqueued(seq, stream);
    } else {
        for (auto& [w, seq, stream] : done.tracked) w->call_failed(seq);
        throw *first;
    }
}

nb::handle none_handle() { return nb::none(); }

// The current CUDA device (through cuda-bindings; not a hot path), or -2 when it cannot be asked.
int current_device() {
    try {
        nb::object r = nb::module_::import_("cuda.bindings.runtime").attr("cudaGetDevice")();
        if (nb::cast<int>(r[0]) == 0) return nb::cast<int>(r[1]);
    } catch (nb::python_error& e) {
        if (!e.matches(PyExc_Exception)) throw;
    } catch (nb::cast_error&) {
    }
    return -2;
}

constexpr struct {
    const char* name;
    Coll kind;
} kColls[] = {
    {"all_reduce", Coll::kAllReduce}, {"reduce", Coll::kReduce},         {"broadcast", Coll::kBroadcast},
    {"all_gather", Coll::kAllGather}, {"reduce_scatter", Coll::kReduceScatter}, {"all_to_all", Coll::kAllToAll},
    {"send", Coll::kSend},            {"recv", Coll::kRecv},
};

}  // namespace

BufferSpan buffer_of(nb::handle buffer) {
    BufferState& b = nb::cast<Buffer&>(buffer).get();
    return {reinterpret_cast<uintptr_t>(b.ptr), b.size, b.device};
}

nb::handle buffer_type() { return nb::type<Buffer>(); }

uint64_t begin_foreign(CommState& s, const char* op, uintptr_t stream) {
    CommWatch& w = *s.watch;
    uint32_t f = w.flags.load(std::memory_order_relaxed);
    if (f & CommWatch::kFailed) w.raise_failed();
    if (!(f & CommWatch::kWatched)) return 0;
    w.in_call.store(1, std::memory_order_seq_cst);  // as run_flagged(): the library calls NCCL with it
    if (w.flags.load(std::memory_order_seq_cst) & CommWatch::kFailed) {
        w.in_call.store(0);
        w.raise_failed();
    }
    return w.begin(op, 0, -1, "", -1, stream);
}

void end_foreign(CommState& s, uint64_t seq, uintptr_t stream, bool ok) {
    if (seq == 0) return;
    CommWatch& w = *s.watch;
    w.in_call.store(0, std::memory_order_release);
    if (ok) {
        w.enqueued(seq, stream);
    } else {
        w.call_failed(seq);
    }
}


// ---------------------------------------------------------------------------
// Launches from a framework's program (launch.hpp): no GIL, every failure a Status
// ---------------------------------------------------------------------------

namespace {

struct CommLaunch {
    std::shared_ptr<CommState> state;
};

launch::Status failure_status(const CommWatch& w) {
    Failure f = w.failure();
    std::string at;
    if (!f.operation.empty()) at = " in " + f.operation + (f.sequence ? " #" + std::to_string(f.sequence) : "");
    return {f.timed_out ? launch::Status::kTimeout : launch::Status::kAborted,
            w.label + " failed on rank " + std::to_string(w.rank) + at + ": " + f.reason};
}

// A non-blocking communicator's ncclInProgress, polled until launched within its deadline (a spin
// backing off to 1 ms); past it, or on a signal whose handler raises (`interruptible`: the caller is a
// Python thread without the GIL), the communicator is aborted and marked failed. comm_mu held.
launch::Status settle_launch(CommState& s, const char* name, bool interruptible) {
    CommWatch& w = *s.watch;
    auto poll = api().ncclCommGetAsyncError.ptr;
    auto start = std::chrono::steady_clock::now();
    auto signals = start;
    auto pause = std::chrono::microseconds(0);
    for (;;) {
        ncclResult_t state = in_progress;
        ncclResult_t queried = poll(s.comm, &state);
        if (queried != success) {
            return launch::Status::failed(std::string("ncclCommGetAsyncError failed with ") + result_name(queried));
        }
        if (state == success) return {};
        if (state != in_progress) return launch::Status::failed(std::string(name) + " failed with " + result_name(state));
        auto now = std::chrono::steady_clock::now();
        bool timed_out = std::chrono::duration<double>(now - start).count() > s.timeout;
        bool interrupted = false;
        if (interruptible && std::chrono::duration<double>(now - signals).count() > kSignalSlice) {
            signals = now;
            PyGILState_STATE gil = PyGILState_Ensure();
            interrupted = PyErr_CheckSignals() != 0;  // the exception stays pending on this thread
            PyGILState_Release(gil);
        }
        if (timed_out || interrupted) {
            w.mark_failed({timed_out, name, 0, given_up(name, timed_out, s.timeout) + " (NCCL had not launched it); "
                                                                                   "the communicator was aborted"});
            api().ncclCommAbort.ptr(s.comm);
            w.gone.store(true);
            if (interrupted) return {launch::Status::kInterrupted, given_up(name, false, s.timeout)};
            return failure_status(w);
        }
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2 + std::chrono::microseconds(1), std::chrono::microseconds(1000));
    }
}

ncclResult_t issue_launch(launch::Collective kind, CommState& s, const void* send, void* recv, size_t count,
                          int dtype, int op, uintptr_t stream) {
    const Api& a = api();
    auto* st = reinterpret_cast<cudaStream_t>(stream);
    auto d = static_cast<ncclDataType_t>(dtype);
    auto o = static_cast<ncclRedOp_t>(op);
    switch (kind) {
        case launch::Collective::kAllReduce: return a.ncclAllReduce.ptr(send, recv, count, d, o, s.comm, st);
        case launch::Collective::kAllGather: return a.ncclAllGather.ptr(send, recv, count, d, s.comm, st);
        case launch::Collective::kReduceScatter: return a.ncclReduceScatter.ptr(send, recv, count, d, o, s.comm, st);
        case launch::Collective::kAllToAll: return a.ncclAlltoAll.ptr(send, recv, count, d, s.comm, st);
    }
    return success;
}

constexpr const char* kLaunchNames[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"};

}  // namespace

LaunchGuard::LaunchGuard(CommState& s, const char* op, uintptr_t stream, const std::string& what, uint64_t count,
                         int64_t bytes, const char* dtype)
    : comm_(s), handle_(s.watch->comm_mu), stream_(stream) {
    CommWatch& w = *s.watch;
    if (s.releasing() || w.gone.load()) {
        refused = (w.flags.load() & CommWatch::kFailed)
                      ? failure_status(w)
                      : launch::Status::invalid((what.empty() ? std::string(op) + " on " + w.label : what) +
                                                ": the communicator is closed");
        return;
    }
    uint32_t f = w.flags.load(std::memory_order_seq_cst);
    if (f & CommWatch::kFailed) {
        refused = failure_status(w);
        return;
    }
    if (f & CommWatch::kWatched) {
        w.in_call.store(1, std::memory_order_seq_cst);  // as run_flagged(): Dekker with CommWatch::fail()
        if (w.flags.load(std::memory_order_seq_cst) & CommWatch::kFailed) {
            w.in_call.store(0);
            refused = failure_status(w);
            return;
        }
        seq_ = w.begin(op, count, bytes, dtype, -1, stream);
    }
}

void LaunchGuard::returned() {
    if (seq_ != 0) comm_.watch->in_call.store(0, std::memory_order_release);
}

void LaunchGuard::done(bool ok) {
    if (seq_ == 0) return;
    uint64_t seq = seq_;
    returned();
    seq_ = 0;
    CommWatch& w = *comm_.watch;
    if (ok) {
        w.enqueued(seq, stream_);
    } else {
        w.call_failed(seq);
    }
}

int launch_size(uint64_t comm) {
    std::shared_ptr<CommLaunch> entry = launch::registry<CommLaunch>().find(comm);
    return entry ? entry->state->size : -1;
}

void raise_launch(uint64_t comm, const launch::Status& status, const char* what) {
    if (status.code == launch::Status::kInterrupted && PyErr_Occurred()) throw nb::python_error();
    if (status.code == launch::Status::kInvalid) raise_usage(std::string(what) + ": " + status.message);
    if (status.code == launch::Status::kAborted || status.code == launch::Status::kTimeout) {
        std::shared_ptr<CommLaunch> entry = launch::registry<CommLaunch>().find(comm);
        if (entry) entry->state->refuse_if_failed();
    }
    raise_mpbind(std::string(what) + ": " + status.message);
}

}  // namespace mpbind::nccl

namespace mpbind::launch {

Status collective(uint64_t id, Collective kind, uintptr_t stream, int device, const void* send, size_t send_bytes,
                  void* recv, size_t recv_bytes, int dtype, int op, bool interruptible) {
    using namespace nccl;
    int k = static_cast<int>(kind);
    if (k < 0 || k > 3) return Status::invalid("unknown collective " + std::to_string(k));
    const char* name = kLaunchNames[k];
    std::shared_ptr<CommLaunch> entry = registry<CommLaunch>().find(id);
    if (!entry) return unknown("communicator", id);
    CommState& s = *entry->state;
    CommWatch& w = *s.watch;
    auto where = [&] { return std::string(name) + " on " + w.label; };  // for messages only: not built per call
    if (dtype < 0 || dtype >= 12) return Status::invalid(where() + ": ncclDataType_t " + std::to_string(dtype) + " is unknown");
    if (op < 0 || op > 4) return Status::invalid(where() + ": ncclRedOp_t " + std::to_string(op) + " is not sum .. avg");
    if (device != s.device) {
        return Status::invalid(where() + ": the program runs on device " + std::to_string(device) +
                               "; the communicator uses device " + std::to_string(s.device));
    }
    auto size = static_cast<size_t>(kTypeSizes[dtype]);
    if (send_bytes % size || recv_bytes % size) {
        return Status::invalid(where() + ": buffers of " + std::to_string(send_bytes) + " and " + std::to_string(recv_bytes) +
                               " bytes are not whole " + kTypeNames[dtype] + " elements");
    }
    size_t n_send = send_bytes / size, n_recv = recv_bytes / size, ranks = static_cast<size_t>(s.size), count = n_recv;
    bool fits = true;
    switch (kind) {
        case Collective::kAllReduce: fits = n_send == n_recv; break;
        case Collective::kAllGather: fits = n_send <= n_recv / ranks && n_send * ranks == n_recv; count = n_send; break;
        case Collective::kReduceScatter: fits = n_recv <= n_send / ranks && n_recv * ranks == n_send; break;
        case Collective::kAllToAll: fits = n_send == n_recv && n_send % ranks == 0; count = n_send / ranks; break;
    }
    if (!fits) {
        return Status::invalid(where() + ": " + std::to_string(n_send) + " elements in and " + std::to_string(n_recv) +
                               " out do not fit this collective on " + std::to_string(ranks) + " ranks");
    }
    if (count == 0) return {};
    // the communicator held for the call (a release or the watchdog's abort waits for it), refused when
    // closed or failed, the call in its flight record when watched
    LaunchGuard held(s, name, stream, {}, count, static_cast<int64_t>(count * size), kTypeNames[dtype]);
    if (!held.refused.ok()) return held.refused;
    ncclResult_t status = issue_launch(kind, s, send, recv, count, dtype, op, stream);
    held.returned();
    Status out;
    if (status == in_progress) {
        out = settle_launch(s, name, interruptible);
    } else if (status != success) {
        out = Status::failed(std::string("nccl") + name + " failed with " + result_name(status));
    }
    held.done(out.ok());
    return out;
}

}  // namespace mpbind::launch

namespace mpbind {

void register_nccl(nb::module_& parent) {
    using namespace nccl;
    nb::module_ m = parent.def_submodule("nccl", "NCCL objects of the core.");

    auto comm = nb::class_<Communicator>(
        m, "Communicator",
        "An NCCL communicator. Destruction is collective: close() on every rank, or drop it and "
        "drain() on every rank.");
    comm.def_static("init", &init, nb::arg("nranks"), nb::arg("rank"), nb::arg("unique_id"),
                    nb::arg("config") = nb::none(), nb::arg("timeout").none() = nb::none(),
                    nb::arg("watchdog").none() = nb::none(),
                    nb::sig("def init(nranks: int, rank: int, unique_id: object, config: object = None, "
                            "timeout: float | None = None, watchdog: bool | None = None) -> Communicator"))
        .def("split", &split, nb::arg("color"), nb::arg("key"), nb::arg("config") = nb::none(),
             nb::arg("timeout").none() = nb::none(), nb::arg("watchdog").none() = nb::none(),
             nb::sig("def split(self, color: int, key: int, config: object = None, timeout: float | None = None, "
                     "watchdog: bool | None = None) -> Communicator | None"))
        .def("shrink", &shrink, nb::arg("exclude_ranks"), nb::arg("config") = nb::none(), nb::arg("flags") = 0,
             nb::arg("timeout").none() = nb::none(), nb::arg("watchdog").none() = nb::none(),
             nb::sig("def shrink(self, exclude_ranks: collections.abc.Sequence[int], config: object = None, "
                     "flags: int = 0, timeout: float | None = None, watchdog: bool | None = None) -> Communicator"))
        .def("revoke", &revoke)
        .def_prop_ro("rank", [](Communicator& c) { return c.get().rank; })
        .def_prop_ro("size", [](Communicator& c) { return c.get().size; })
        .def_prop_ro("device", [](Communicator& c) { return c.get().device; })
        .def_prop_ro("timeout", [](Communicator& c) { return c.state()->timeout; })
        .def_prop_ro("watched", [](Communicator& c) {
            return (c.state()->watch->flags.load() & CommWatch::kWatched) != 0;
        })
        .def_prop_ro("failed", [](Communicator& c) { return c.state()->failed(); })
        .def_prop_ro("finalized", [](Communicator& c) { return c.state()->finalized; })
        .def("recent_operations", [](Communicator& c) { return watch::describe(c.state()->watch->recent()); },
             nb::sig("def recent_operations(self) -> list[dict[str, typing.Any]]"))
        .def("finalize", [](Communicator& c) {
            c.get();
            collect_garbage();
            c.get().finalize();
        })
        .def("destroy", [](Communicator& c) { c.close(); })
        .def("abort", [](Communicator& c) {
            auto s = c.state();
            if (s->closed()) return;
            s->aborting = true;
            s->close();
        })
        .def("drain", [](Communicator& c) {
            collect_garbage();
            return drain_queue(c.state().get());
        })
        .def("register", [](Communicator& c, uintptr_t ptr, size_t size, nb::object buffer) {
            return do_register(c, ptr, size, std::move(buffer), false, 0);
        }, nb::arg("ptr"), nb::arg("size"), nb::arg("buffer") = nb::none())
        .def("register_window", [](Communicator& c, uintptr_t ptr, size_t size, int flags, nb::object buffer) {
            return do_register(c, ptr, size, std::move(buffer), true, flags);
        }, nb::arg("ptr"), nb::arg("size"), nb::arg("flags") = 0, nb::arg("buffer") = nb::none())
        .def("registrations", &list_registrations, nb::sig("def registrations(self) -> list[dict[str, typing.Any]]"))
        .def("__repr__", [](Communicator& c) {
            auto& s = *c.state();
            if (s.closed()) return std::string("<nccl.Communicator closed>");
            return "<nccl.Communicator rank=" + std::to_string(s.rank) + " size=" + std::to_string(s.size) +
                   " device=" + std::to_string(s.device) + ">";
        });
    // The hot calls: one call from the facade each (see plan() and issue()). mpbind.nccl.Communicator's
    // methods are the public ones: their signatures and docstrings are there, not here (nor for the
    // other methods it wraps).
    auto none = nb::none();
    comm.def("all_reduce", [](Communicator& c, nb::handle s, nb::handle r, nb::handle op, nb::handle st) {
        run(Coll::kAllReduce, c, s, r, op, none_handle(), st);
    }, nb::arg("sendbuf").none(), nb::arg("recvbuf").none(), nb::arg("op").none() = "sum",
       nb::arg("stream").none() = none)
        .def("reduce", [](Communicator& c, nb::handle s, nb::handle r, nb::handle root, nb::handle op, nb::handle st) {
            run(Coll::kReduce, c, s, r, op, root, st);
        }, nb::arg("sendbuf").none(), nb::arg("recvbuf").none(), nb::arg("root").none(), nb::arg("op").none() = "sum",
           nb::arg("stream").none() = none)
        .def("broadcast", [](Communicator& c, nb::handle s, nb::handle r, nb::handle root, nb::handle st) {
            run(Coll::kBroadcast, c, s, r, none_handle(), root, st);
        }, nb::arg("sendbuf").none(), nb::arg("recvbuf").none(), nb::arg("root").none(),
           nb::arg("stream").none() = none)
        .def("all_gather", [](Communicator& c, nb::handle s, nb::handle r, nb::handle st) {
            run(Coll::kAllGather, c, s, r, none_handle(), none_handle(), st);
        }, nb::arg("sendbuf").none(), nb::arg("recvbuf").none(), nb::arg("stream").none() = none)
        .def("reduce_scatter", [](Communicator& c, nb::handle s, nb::handle r, nb::handle op, nb::handle st) {
            run(Coll::kReduceScatter, c, s, r, op, none_handle(), st);
        }, nb::arg("sendbuf").none(), nb::arg("recvbuf").none(), nb::arg("op").none() = "sum",
           nb::arg("stream").none() = none)
        .def("all_to_all", [](Communicator& c, nb::handle s, nb::handle r, nb::handle st) {
            run(Coll::kAllToAll, c, s, r, none_handle(), none_handle(), st);
        }, nb::arg("sendbuf").none(), nb::arg("recvbuf").none(), nb::arg("stream").none() = none)
        .def("send", [](Communicator& c, nb::handle s, nb::handle peer, nb::handle st) {
            run(Coll::kSend, c, s, none_handle(), none_handle(), peer, st);
        }, nb::arg("sendbuf").none(), nb::arg("peer").none(), nb::arg("stream").none() = none)
        .def("recv", [](Communicator& c, nb::handle r, nb::handle peer, nb::handle st) {
            run(Coll::kRecv, c, none_handle(), r, none_handle(), peer, st);
        }, nb::arg("recvbuf").none(), nb::arg("peer").none(), nb::arg("stream").none() = none);
    bind_c_pointer(comm, [](Communicator& c) { return c.get().comm; }, nullptr);  // nccl.Communicator's ptr
    bind_lifetime(comm, "Release what depends on it (grids, windows, registrations), then finalize and destroy "
                        "(collective). Idempotent.");

    auto buf = nb::class_<Buffer>(m, "Buffer", "Device memory from ncclMemAlloc, freed by ncclMemFree "
                                                "when released or garbage-collected.");
    buf.def_prop_ro("ptr", [](Buffer& b) { return reinterpret_cast<uintptr_t>(b.get().ptr); })
        .def_prop_ro("nbytes", [](Buffer& b) { return b.get().size; })
        .def("__repr__", [](Buffer& b) {
            auto& s = *b.state();
            return nb::str("<nccl.Buffer ptr=0x{:x} nbytes={}{}>")
                .format(reinterpret_cast<uintptr_t>(s.ptr), s.size, s.closed() ? " closed" : "");
        });
    bind_lifetime(buf, "ncclMemFree now. Idempotent.");

    nb::module_ testing = nb::borrow<nb::module_>(parent.attr("_testing"));
    testing.def("nccl_plan", [](const std::string& name, int rank, int size, int device, nb::handle sendbuf,
                                nb::handle recvbuf, nb::handle op, nb::handle peer, nb::handle stream) {
        for (const auto& e : kColls) {
            if (name != e.name) continue;
            Call k = plan(e.kind, {rank, size, device}, sendbuf, recvbuf, op, peer, stream);
            return nb::make_tuple(k.send, k.recv, k.count, k.dtype, k.op, k.peer, k.stream);
        }
        raise_usage("no collective named " + name);
    }, nb::arg("name"), nb::arg("rank"), nb::arg("size"), nb::arg("device"), nb::arg("sendbuf").none(),
       nb::arg("recvbuf").none(), nb::arg("op").none() = "sum", nb::arg("peer").none() = nb::none(),
       nb::arg("stream").none() = nb::none(),
       "The checks of Communicator.<name> on a communicator of `size` ranks on `device`, without NCCL: the call's "
       "arguments (send, recv, count, ncclDataType_t, ncclRedOp_t, root/peer, stream).");
    m.def("group_start", &group_start, "ncclGroupStart, as mpbind.nccl.group() enters.");
    m.def("group_end", &group_end,
          "ncclGroupEnd, as mpbind.nccl.group() leaves; the outermost one then waits (bounded) until the non-blocking "
          "communicators of the group launched their work, and records the watched operations' events.");
    m.def("launch_register", [](Communicator& c) {
        CommState& s = c.get();
        s.refuse_if_failed();
        static_cast<void>(api());  // the table a launch calls through (a table loads on first use, with the GIL)
        return launch::registry<CommLaunch>().add(std::make_shared<CommLaunch>(CommLaunch{c.state()}));
    }, nb::arg("comm"),
          "Register an open communicator for launches from a framework's program; returns its id (release it with "
          "launch_release).");
    m.def("launch_release", [](uint64_t id) { return launch::registry<CommLaunch>().take(id); },
          nb::arg("id"), "Forget a communicator's launch id; False when none is registered under it.");
    m.def("launch_collective", [](uint64_t id, int kind, uintptr_t stream, int device, uintptr_t send,
                                  size_t send_bytes, uintptr_t recv, size_t recv_bytes, int dtype, int op) {
        launch::Status st;
        {
            nb::gil_scoped_release release;  // as a framework's thread calls it
            st = launch::collective(id, static_cast<launch::Collective>(kind), stream, device,
                                    reinterpret_cast<const void*>(send), send_bytes, reinterpret_cast<void*>(recv),
                                    recv_bytes, dtype, op);
        }
        return nb::make_tuple(static_cast<int>(st.code), st.message);
    }, nb::arg("id"), nb::arg("kind"), nb::arg("stream"), nb::arg("device"), nb::arg("send"), nb::arg("send_bytes"),
          nb::arg("recv"), nb::arg("recv_bytes"), nb::arg("dtype"), nb::arg("op"),
          "launch::collective as a framework's handler calls it (GIL released): (status code, message).");
    m.def("mem_alloc", [](size_t nbytes) {
        if (nbytes == 0) raise_usage("nbytes must be > 0");
        void* p = nullptr;
        int device = current_device();
        call(api().ncclMemAlloc, &p, nbytes);
        return Buffer(std::make_shared<BufferState>(p, nbytes, device));
    }, nb::arg("nbytes"));  // documented by mpbind.nccl.mem_alloc
}

}  // namespace mpbind
