// NVSHMEM objects: the process-wide Runtime (finalize), Teams (split, destroy),
// symmetric allocations (nvshmem_malloc/calloc/align, nvshmem_free) and
// refcounted local registrations (nvshmemx_buffer_register).
//
// Initialisation itself runs in Python through the flat bindings (its attribute
// structures live there); Runtime::start wraps it so that the checks on a second
// initialisation and the creation of the state happen under one lock.

#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <type_traits>

#include "mpbind/bindings/_core_abi/cuda_driver.hpp"
#include "mpbind/bindings/_core_abi/nvshmem.hpp"
#include "arrays.hpp"
#include "core.hpp"
#include "nvshmem.hpp"
#include "register.hpp"
#include "watchdog.hpp"

namespace mpbind::nvshmem {

namespace {

using namespace abi::nvshmem;
using capi::call;
using capi::invoke;

const char* const kFinalizedMessage =
    "NVSHMEM was finalized in this process and cannot be used or initialised again "
    "(NVSHMEM allows one initialisation per process): keep one Runtime for the process's lifetime";
const char* const kNotInitializedMessage = "NVSHMEM is not initialised: call mpbind.nvshmem.init() first";

// --- host-side collectives after this PE's on-stream ones ----------------------------------
//
// NVSHMEM runs its host-side collectives (nvshmem_malloc/calloc/align and nvshmem_free, team split
// and destroy, finalize) as barriers on a non-blocking stream of its own. A collective this PE queued
// on another stream may still be in flight then, and the collectives of a team must not overlap:
// they share the team's barrier state (NVSHMEM: a team's collectives run one at a time, in the same
// order on every PE). Each on-stream collective of the layer records an event on its stream after it,
// and a host-side collective first waits for those events. Events rather than the streams
// themselves: a stream may be destroyed before the wait, its recorded event stays valid.
//
// Everything but the waits runs with the GIL held and without releasing it (the driver calls go
// through the raw pointers), so Python threads see the lists change one call at a time.
namespace cu = abi::cuda_driver;

class CollectiveFence {
public:
    // After an on-stream collective was queued on `stream`.
    void note(uintptr_t stream) {
        const cu::Api& drv = cu::api();
        void* event = nullptr;
        for (const auto& [s, e] : pending_) {
            if (s == stream) {
                event = e;
                break;
            }
        }
        if (event == nullptr) {
            if (spare_.empty()) {
                capi::check(drv.cuEventCreate, drv.cuEventCreate.ptr(&event, static_cast<unsigned>(cu::CU_EVENT_DISABLE_TIMING)));
            } else {
                event = spare_.back();
                spare_.pop_back();
            }
            pending_.emplace_back(stream, event);
        }
        capi::check(drv.cuEventRecord, drv.cuEventRecord.ptr(event, reinterpret_cast<void*>(stream)));
    }

    // A launch from a framework's program (launch.hpp), on a thread that may not hold the GIL: the
    // gate held (launch_gate()), after its work was queued on `stream`. False when no event could be
    // recorded (the launch reports it).
    bool note_launched(uintptr_t stream) {
        const cu::Api& drv = cu::api();
        void* event = nullptr;
        for (const auto& [s, e] : launched_) {
            if (s == stream) event = e;
        }
        if (event == nullptr) {
            if (launch_spare_.empty()) {
                if (drv.cuEventCreate.ptr(&event, static_cast<unsigned>(cu::CU_EVENT_DISABLE_TIMING)) != cu::CUDA_SUCCESS) {
                    return false;
                }
            } else {
                event = launch_spare_.back();
                launch_spare_.pop_back();
            }
            launched_.emplace_back(stream, event);
        }
        return drv.cuEventRecord.ptr(event, reinterpret_cast<void*>(stream)) == cu::CUDA_SUCCESS;
    }

    std::unique_lock<std::mutex> gate() { return std::unique_lock<std::mutex>(gate_); }

    // Before a host-side collective: this PE's on-stream collectives have completed, the launches'
    // included (a launch under way finishes queueing first: the gate). Bounded by the runtime's deadline
    // and interruptible (Ctrl-C): WaitTimeoutError when a PE never joined one.
    void settle() {
        std::vector<void*> launched;
        {
            nb::gil_scoped_release release;  // a launch holding the gate never waits for the GIL
            std::lock_guard<std::mutex> g(gate_);
            for (const auto& [s, e] : launched_) launched.push_back(e);
            launched_.clear();
        }
        if (pending_.empty() && launched.empty()) return;
        std::vector<void*> events;
        for (const auto& [s, e] : pending_) events.push_back(e);
        events.insert(events.end(), launched.begin(), launched.end());
        pending_.clear();
        const cu::Api& drv = cu::api();
        size_t done = 0;
        cu::CUresult error = cu::CUDA_SUCCESS;
        try {
            wait_until("nvshmem: this PE's collectives on streams", timeout(), [&] {
                for (; done < events.size(); ++done) {
                    cu::CUresult r = drv.cuEventQuery.ptr(events[done]);
                    if (r == cu::CUDA_ERROR_NOT_READY) return false;
                    if (r != cu::CUDA_SUCCESS && error == cu::CUDA_SUCCESS) error = r;
                }
                return true;
            }, {}, [] {
                return std::string("an NVSHMEM collective queued on a stream has not completed (a PE died, or never "
                                   "joined it); NVSHMEM cannot abort it, so the process should end");
            });
        } catch (...) {
            give_back(events, launched.size());
            throw;
        }
        give_back(events, launched.size());
        if (error != cu::CUDA_SUCCESS) capi::check(drv.cuEventQuery, error);
    }

    // Before a collective release: as settle(), but a CUDA error must not keep this PE from the
    // release the other PEs make (it shows again on the next call). A wait that ran out or was
    // interrupted does: the release would wait for the same PEs.
    void settle_for_release() {
        try {
            settle();
        } catch (nb::python_error& e) {
            if (e.matches(PyExc_TimeoutError) || !e.matches(PyExc_Exception)) throw;
        }
    }

    double timeout() const { return timeout_ > 0 ? timeout_ : default_timeout(); }
    void set_timeout(double t) { timeout_ = t; }

    // After finalize: the events go with the runtime.
    void drop() {
        const cu::Api& drv = cu::api();
        for (const auto& [s, e] : pending_) spare_.push_back(e);
        pending_.clear();
        for (void* e : spare_) drv.cuEventDestroy.ptr(e);
        spare_.clear();
        nb::gil_scoped_release release;
        std::lock_guard<std::mutex> g(gate_);
        for (const auto& [s, e] : launched_) launch_spare_.push_back(e);
        launched_.clear();
        for (void* e : launch_spare_) drv.cuEventDestroy.ptr(e);
        launch_spare_.clear();
    }

    // The streams with an on-stream collective not yet waited for (the tests read them).
    std::vector<uintptr_t> streams() const {
        std::vector<uintptr_t> out;
        for (const auto& [s, e] : pending_) out.push_back(s);
        return out;
    }

private:
    // The last `launched` of `events` were the launches': back to their spares, under the gate.
    void give_back(const std::vector<void*>& events, size_t launched) {
        size_t own = events.size() - launched;
        spare_.insert(spare_.end(), events.begin(), events.begin() + static_cast<std::ptrdiff_t>(own));
        nb::gil_scoped_release release;
        std::lock_guard<std::mutex> g(gate_);
        launch_spare_.insert(launch_spare_.end(), events.begin() + static_cast<std::ptrdiff_t>(own), events.end());
    }

    std::vector<std::pair<uintptr_t, void*>> pending_;  // stream, the event recorded after its last collective
    std::vector<void*> spare_;
    std::mutex gate_;  // launches (no GIL) hold it while they check their objects, queue and note
    std::vector<std::pair<uintptr_t, void*>> launched_;  // under gate_: as pending_, for the launches
    std::vector<void*> launch_spare_;                      // under gate_
    double timeout_ = 0;  // seconds; 0: the process default (init() sets the runtime's)
};

// --- the watchdog over NVSHMEM's collectives on streams ------------------------------------------
//
// NVSHMEM cannot abort an operation. While watched (nvshmem.init(watchdog=True), MPBIND_WATCHDOG=1)
// each on-stream collective of this PE (and each cuFFTMp execution over NVSHMEM) is tracked; one
// past the deadline is reported on stderr with the PE, the operation and the flight record, and the
// process ends (exit status kHangExit) rather than hang.
constexpr int kHangExit = 70;  // EX_SOFTWARE

class PeWatch : public watch::Tracker {
public:
    PeWatch(int pe, int npes, double timeout)
        : Tracker("NVSHMEM PE " + std::to_string(pe) + " of " + std::to_string(npes), timeout), pe(pe) {}
    ~PeWatch() override { drop_events(); }
    const int pe;

    void fail(const watch::Finding& f) override {
        std::string text = report(label + ": " + f.reason + ". NVSHMEM cannot abort an operation: ending the process " +
                                  "(exit status " + std::to_string(kHangExit) + ") rather than hang");
        std::fputs(text.c_str(), stderr);
        std::fflush(stderr);
        std::fflush(stdout);
        std::_Exit(kHangExit);
    }
};

std::atomic<PeWatch*> g_pe_watch{nullptr};  // set once, never freed (the watchdog holds it too)

CollectiveFence& fence();

// An on-stream collective's record while watched, from before its library call (one that blocks on
// the host shows as one that has not returned) to after it; the collective fence's note once
// queued. When not watched, a relaxed load is its whole cost.
class Watched {
public:
    Watched(const char* op, int64_t bytes, uintptr_t stream) : stream_(stream) {
        if (op == nullptr) return;
        w_ = g_pe_watch.load(std::memory_order_relaxed);
        if (w_ != nullptr) seq_ = w_->begin(op, 0, bytes, "", -1, stream);
    }
    ~Watched() {
        if (seq_ != 0 && !queued_) w_->call_failed(seq_);  // the call raised
    }
    Watched(const Watched&) = delete;
    Watched& operator=(const Watched&) = delete;
    void queued() {
        fence().note(stream_);
        queued_ = true;
        if (seq_ != 0) w_->enqueued(seq_, stream_);
    }

private:
    uintptr_t stream_;
    PeWatch* w_ = nullptr;
    uint64_t seq_ = 0;
    bool queued_ = false;
};

CollectiveFence& fence() {
    static auto* f = new CollectiveFence();  // one runtime per process; never destroyed (used at exit)
    return *f;
}

class AllocState;

// --- the runtime -----------------------------------------------------------

class RuntimeState : public State {
public:
    RuntimeState(std::map<std::string, std::string> params, int pe, int npes, int status)
        : State("nvshmem.Runtime"), params(std::move(params)), pe(pe), npes(npes), status(status) {}
    const std::map<std::string, std::string> params;
    const int pe, npes, status;
    Registry registrations;  // nvshmemx_buffer_register (local)

    void track(const std::shared_ptr<AllocState>& s, uintptr_t ptr) {
        Lock l = lock(allocs_mu_);
        allocs_[ptr] = s;
    }
    void forget(uintptr_t ptr) {
        Lock l = lock(allocs_mu_);
        allocs_.erase(ptr);
    }
    std::vector<std::shared_ptr<AllocState>> live_allocations();
    // The live allocation holding [ptr, ptr + nbytes), if any.
    std::shared_ptr<AllocState> containing(uintptr_t ptr, size_t nbytes);

protected:
    // One runtime per process, never re-creatable: its lifetime row (never) keeps dropped
    // references from queuing a finalize; it lives until finalize() (or the process ends).
    void release() override;

private:
    Mutex allocs_mu_;
    std::map<uintptr_t, std::weak_ptr<AllocState>> allocs_;
};

struct Global {
    Mutex mu;
    // Set once: start() makes a runtime only while none was made, since a closed one means finalized.
    std::shared_ptr<RuntimeState> runtime;
    std::atomic<RuntimeState*> hot{nullptr};  // runtime.get(), for hot_runtime()
    bool finalized = false;
};

Global& global() {
    static Global* g = new Global();  // never destroyed: used at exit
    return *g;
}

void RuntimeState::release() {
    {
        Global& g = global();
        Lock l = lock(g.mu);
        g.finalized = true;  // even if the call fails: NVSHMEM is unusable after an attempt
    }
    fence().settle_for_release();
    invoke(api().nvshmemx_hostlib_finalize);
    fence().drop();
}

// The live runtime, or UsageError saying why there is none.
std::shared_ptr<RuntimeState> current() {
    Global& g = global();
    Lock l = lock(g.mu);
    if (g.runtime && !g.runtime->closed()) return g.runtime;
    if (g.finalized) raise_usage(kFinalizedMessage);
    raise_usage(kNotInitializedMessage);
}

// The live runtime of the hot calls, read without current()'s lock and reference count: the one
// runtime a process makes is kept by global() until the process ends, and closed() is an atomic read.
RuntimeState& hot_runtime() {
    RuntimeState* rt = global().hot.load(std::memory_order_acquire);
    if (rt != nullptr && !rt->closed()) return *rt;
    return *current();  // raises why there is none (or returns the runtime start() is publishing)
}

RuntimeState& open_runtime(const std::shared_ptr<RuntimeState>& s) {
    if (s->closed()) raise_usage(kFinalizedMessage);
    return *s;
}

using Runtime = Ref<RuntimeState>;

// --- symmetric allocations -------------------------------------------------

class AllocState : public State {
public:
    AllocState(std::shared_ptr<RuntimeState> rt, uintptr_t ptr, size_t nbytes)
        : State("nvshmem.SymmetricMemory"), runtime(std::move(rt)), ptr(ptr), nbytes(nbytes) {}
    std::shared_ptr<RuntimeState> runtime;
    const uintptr_t ptr;
    const size_t nbytes;

protected:
    void release() override {
        runtime->forget(ptr);
        fence().settle_for_release();
        invoke(api().nvshmem_free, reinterpret_cast<void*>(ptr));
    }
};
using Allocation = Ref<AllocState>;

std::vector<std::shared_ptr<AllocState>> RuntimeState::live_allocations() {
    Lock l = lock(allocs_mu_);
    std::vector<std::shared_ptr<AllocState>> out;
    for (auto& kv : allocs_) {
        if (auto s = kv.second.lock(); s && !s->closed()) out.push_back(std::move(s));
    }
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a->serial() < b->serial(); });
    return out;
}

std::shared_ptr<AllocState> RuntimeState::containing(uintptr_t ptr, size_t nbytes) {
    Lock l = lock(allocs_mu_);
    auto it = allocs_.upper_bound(ptr);
    if (it == allocs_.begin()) return nullptr;
    --it;
    auto s = it->second.lock();
    if (!s || s->closed()) return nullptr;
    if (!span_within(ptr, nbytes, s->ptr, s->nbytes)) return nullptr;  // (ptr + nbytes could wrap)
    return s;
}

Allocation allocate(size_t nbytes, bool zero, size_t alignment) {
    std::shared_ptr<RuntimeState> rt = current();
    if (nbytes == 0) raise_usage("cannot allocate 0 bytes of symmetric memory");
    if (alignment != 0 && (alignment & (alignment - 1)) != 0) {
        raise_usage("alignment must be a power of two, got " + std::to_string(alignment));
    }
    if (zero && alignment != 0) raise_usage("zeroed memory with an alignment is not available (nvshmem_calloc "
                                            "takes none); allocate with alignment and zero it");
    const Api& a = api();
    const char* function = zero ? a.nvshmem_calloc.name : alignment ? a.nvshmem_align.name : a.nvshmem_malloc.name;
    fence().settle();
    void* p = zero ? invoke(a.nvshmem_calloc, nbytes, size_t{1})
                   : alignment ? invoke(a.nvshmem_align, alignment, nbytes) : invoke(a.nvshmem_malloc, nbytes);
    if (p == nullptr) {
        raise_library_error(library.name, function, NVSHMEMX_ERROR_OUT_OF_MEMORY,
                            "returned NULL for " + std::to_string(nbytes) +
                                " bytes (the symmetric heap is exhausted; NVSHMEM_SYMMETRIC_SIZE sets its size)");
    }
    auto s = std::make_shared<AllocState>(rt, reinterpret_cast<uintptr_t>(p), nbytes);
    s->depends_on(rt);
    rt->add_child(s);
    rt->track(s, s->ptr);
    return Allocation(s);
}

// --- kernel libraries ----------------------------------------------------------
//
// A loaded cubin (mpbind.kernels.Library): the core owns its lifetime (serial, the teardown
// queue, the runtime as parent), the layer makes the CUDA calls. Its release is local but never runs
// from the garbage collector: a kernel launched from it may still run, and NVSHMEM keeps a pointer
// into it until nvshmemx_culibrary_finalize, which needs the runtime up. So a library registered with
// NVSHMEM is a child of the runtime (finalize() unloads it first), and one dropped unclosed is queued.

class KernelLibraryState : public State {
public:
    KernelLibraryState(nb::object code, uintptr_t handle, int device, std::string name, nb::object unload)
        : State("nvshmem.KernelLibrary"),
          handle(handle),
          device(device),
          name(std::move(name)),
          code_(std::move(code)),
          unload_(std::move(unload)) {}
    ~KernelLibraryState() override {
        if (!Py_IsInitialized()) {  // the interpreter is gone: leak the references
            code_.release();
            unload_.release();
            return;
        }
        nb::gil_scoped_acquire gil;
        code_.reset();
        unload_.reset();
    }
    const uintptr_t handle;  // the CUlibrary
    const int device;
    const std::string name;
    bool registered = false;  // with NVSHMEM (nvshmemx_culibrary_init)
    // The loaded code (cuda.core's ObjectCode, which unloads the CUlibrary when collected).
    const nb::object& code() {
        check_open();
        return code_;
    }

protected:
    // unload() synchronises the device and unregisters the library from NVSHMEM; dropping the code
    // object then unloads it. The code is dropped even when unload() fails: released once.
    void release() override {
        nb::object unload = std::move(unload_), code = std::move(code_);
        unload_.reset();
        code_.reset();
        if (unload.is_valid() && !unload.is_none()) unload(registered);
    }

private:
    nb::object code_, unload_;
};
using KernelLibrary = Ref<KernelLibraryState>;

KernelLibrary load_library(nb::object code, uintptr_t handle, int device, std::string name, bool registered,
                           nb::object unload) {
    if (!PyCallable_Check(unload.ptr())) raise_type("unload must be callable, not " + py_type_name(unload));
    std::shared_ptr<RuntimeState> rt = registered ? current() : nullptr;  // UsageError without a runtime
    auto s = std::make_shared<KernelLibraryState>(std::move(code), handle, device, std::move(name),
                                                  std::move(unload));
    s->registered = registered;
    if (rt) {
        s->depends_on(rt);
        rt->add_child(s);
    }
    return KernelLibrary(s);
}

// --- teams -------------------------------------------------------------------

class TeamState : public State {
public:
    // Predefined teams (world, shared, node) are not destroyed: their state is
    // local, and closing it only marks this object's view closed.
    TeamState(int32_t team, bool predefined)
        : State(predefined ? "nvshmem.Team(predefined)" : "nvshmem.Team"),
          team(team),
          predefined(predefined) {}
    const int32_t team;
    const bool predefined;

protected:
    void release() override {
        if (predefined) return;
        fence().settle_for_release();
        invoke(api().nvshmem_team_destroy, team);
    }
};
using Team = Ref<TeamState>;

Team make_team(const std::shared_ptr<RuntimeState>& rt, int32_t id, bool predefined) {
    auto s = std::make_shared<TeamState>(id, predefined);
    s->depends_on(rt);
    rt->add_child(s);
    return Team(s);
}

int team_n_pes(int32_t team) { return invoke(api().nvshmem_team_n_pes, team); }

// A C int argument: TypeError or UsageError naming it (a bool or float is not taken for an int).
int c_int(nb::handle value, const char* what) {
    return static_cast<int>(int_arg(value, what, INT32_MIN, INT32_MAX));
}

std::optional<Team> split_strided(Team& parent, int start, int stride, int size) {
    TeamState& p = parent.get();
    std::shared_ptr<RuntimeState> rt = current();
    int n = team_n_pes(p.team);
    if (size < 1) raise_usage("size must be >= 1, got " + std::to_string(size));
    if (stride < 1) raise_usage("stride must be >= 1, got " + std::to_string(stride));
    if (start < 0 || static_cast<long long>(start) + static_cast<long long>(stride) * (size - 1) >= n) {
        raise_usage("PEs start=" + std::to_string(start) + ", stride=" + std::to_string(stride) +
                    ", size=" + std::to_string(size) + " do not fit in the parent team of " + std::to_string(n) +
                    " PEs");
    }
    nvshmem_team_t team = NVSHMEM_TEAM_INVALID;
    fence().settle();
    call(api().nvshmem_team_split_strided, p.team, start, stride, size, nullptr, 0L, &team);
    if (team == NVSHMEM_TEAM_INVALID) return std::nullopt;  // this PE is not a member
    return make_team(rt, team, false);
}

int translate_pe(Team& self, int pe, Team& dest) {
    TeamState& s = self.get();
    TeamState& d = dest.get();
    int n = team_n_pes(s.team);
    if (pe < 0 || pe >= n) {
        raise_usage("pe must be in [0, " + std::to_string(n) + "), got " + std::to_string(pe));
    }
    return invoke(api().nvshmem_team_translate_pe, s.team, pe, d.team);
}

// --- registrations -----------------------------------------------------------

class BufferRegistration : public RegistrationState {
public:
    using RegistrationState::RegistrationState;

protected:
    void deregister() override {
        call(api().nvshmemx_buffer_unregister, reinterpret_cast<void*>(ptr));
    }
};

RegistrationRef do_register(RuntimeState& rt, uintptr_t ptr, size_t size, nb::object buffer) {
    if (ptr == 0) raise_usage("cannot register a NULL pointer");
    if (size == 0) raise_usage("cannot register 0 bytes");
    if (rt.containing(ptr, 1)) {
        raise_usage("the buffer lies in NVSHMEM's symmetric heap: it is usable without registration");
    }
    return rt.registrations.acquire(rt, ptr, size, [&]() -> std::shared_ptr<RegistrationState> {
        call(api().nvshmemx_buffer_register, reinterpret_cast<void*>(ptr), size);
        return std::make_shared<BufferRegistration>("nvshmem.Registration", ptr, size, std::move(buffer));
    });
}

// --- start ---------------------------------------------------------------------

std::string describe_difference(const std::map<std::string, std::string>& live,
                                const std::map<std::string, std::string>& asked) {
    std::string out;
    auto add = [&](const std::string& key, const std::string& was, const std::string& now) {
        if (!out.empty()) out += ", ";
        out += key + "=" + now + " (the live runtime has " + was + ")";
    };
    for (auto& [k, v] : asked) {
        auto it = live.find(k);
        std::string was = it == live.end() ? "none" : it->second;
        if (was != v) add(k, was, v);
    }
    for (auto& [k, v] : live) {
        if (!asked.count(k)) add(k, v, "none");
    }
    return out;
}

Runtime start(std::map<std::string, std::string> params, nb::callable init, bool require_initialized) {
    Global& g = global();
    Lock l = lock(g.mu);
    if (g.finalized) raise_usage(kFinalizedMessage);
    if (g.runtime && !g.runtime->closed()) {
        std::string diff = describe_difference(g.runtime->params, params);
        if (!diff.empty()) {
            raise_usage("NVSHMEM is already initialised in this process with other parameters: " + diff +
                        "; it cannot be initialised twice, so use the live runtime (mpbind.nvshmem.runtime())");
        }
        return Runtime(g.runtime);
    }
    const Api& a = api();
    if (invoke(a.nvshmemx_init_status) >= static_cast<int>(NVSHMEM_STATUS_IS_INITIALIZED)) {
        raise_usage("NVSHMEM was initialised outside mpbind.nvshmem (through mpbind.bindings.nvshmem); "
                    "mpbind.nvshmem can only use a runtime it initialised");
    }
    init();  // the flat initialisation (collective); raises the library's typed error
    int status = invoke(a.nvshmemx_init_status);
    // A runtime is made only over a complete initialisation: a half-made one (no PEs) would let calls
    // through that the library answers by exiting the process.
    if (require_initialized && status < NVSHMEM_STATUS_IS_INITIALIZED) {
        raise_mpbind("NVSHMEM initialisation returned without initialising NVSHMEM (nvshmemx_init_status() = " +
                     std::to_string(status) + "); no runtime was made");
    }
    int pe = invoke(a.nvshmem_my_pe);
    int npes = invoke(a.nvshmem_n_pes);
    g.runtime = std::make_shared<RuntimeState>(std::move(params), pe, npes, status);
    g.hot.store(g.runtime.get(), std::memory_order_release);
    return Runtime(g.runtime);
}


// --- RMA, synchronisation and collectives on a stream: the hot path -----------------------------
//
// One call from the facade each: arguments described and checked here (symmetric memory, dtypes,
// sizes, PE numbers, team, the limited multi-PE-per-GPU mode), then one library call without the
// GIL. Nothing reaches NVSHMEM before every check passed.

// What the checks read of the runtime; tests give a list of symmetric ranges instead of a runtime.
struct Heap {
    int npes = 0;
    bool limited = false;
    RuntimeState* rt = nullptr;
    std::vector<std::pair<uintptr_t, size_t>> ranges;

    bool holds(uintptr_t p, size_t n) const {
        if (n == 0) n = 1;
        if (rt != nullptr) return rt->containing(p, n) != nullptr;
        for (const auto& [base, size] : ranges) {
            if (span_within(p, n, base, size)) return true;
        }
        return false;
    }
};

Heap heap_of(RuntimeState& rt) {
    Heap h;
    h.npes = rt.npes;
    h.limited = rt.status == NVSHMEM_STATUS_LIMITED_MPG;
    h.rt = &rt;
    return h;
}

enum class Rma { kPut, kGet, kQuiet, kBarrierAll, kSyncAll, kBarrier, kBroadcast, kFcollect, kAlltoall, kReduce };
constexpr const char* kStepNames[] = {"put",     "get",       "quiet",    "barrier_all", "sync_all",
                                      "barrier", "broadcast", "fcollect", "alltoall",    "reduce"};

// The arguments of one library call.
struct Step {
    Rma kind;
    int32_t team = NVSHMEM_TEAM_WORLD;
    uintptr_t dest = 0, src = 0;
    size_t n = 0;  // bytes, or elements for reduce
    int pe = 0;    // target PE or root
    uintptr_t stream = 0;
    arrays::Dtype dtype = arrays::Dtype::kInvalid;
    int op = -1;   // reduce: index in kReduceOps
};

constexpr const char* kReduceOps[] = {"sum", "prod", "min", "max", "and", "or", "xor"};
constexpr int kArithmeticOps = 4;  // the others are bitwise: integers only

// NVSHMEM's name of our element type in its typed families, or nullptr.
const char* nvshmem_type(arrays::Dtype d) {
    using D = arrays::Dtype;
    switch (d) {
        case D::kInt8: return "int8";
        case D::kInt16: return "int16";
        case D::kInt32: return "int32";
        case D::kInt64: return "int64";
        case D::kUInt8: return "uint8";
        case D::kUInt16: return "uint16";
        case D::kUInt32: return "uint32";
        case D::kUInt64: return "uint64";
        case D::kFloat16: return "half";
        case D::kBFloat16: return "bfloat16";
        case D::kFloat32: return "float";
        case D::kFloat64: return "double";
        default: return nullptr;
    }
}

bool is_integer(arrays::Dtype d) {
    return d >= arrays::Dtype::kInt8 && d <= arrays::Dtype::kUInt64;
}

arrays::Array local_arg(nb::handle obj, const char* what, bool writable) {
    return arrays::device_array(obj, {what, writable, true, false});
}

arrays::Array symmetric_arg(nb::handle obj, const char* what, const Heap& heap, bool writable) {
    arrays::Array a = local_arg(obj, what, writable);
    if (a.source == arrays::Source::kPeer) {
        raise_usage(std::string(what) + " is a peer view (PeerArray); pass the SymmetricArray itself");
    }
    if (a.source != arrays::Source::kSymmetric && !heap.holds(a.ptr, static_cast<size_t>(a.nbytes()))) {
        raise_usage(std::string(what) + " is not NVSHMEM symmetric memory (allocate it with mpbind.nvshmem.empty "
                    "or zeros, or view such an array)");
    }
    return a;
}

void same(const arrays::Array& d, const arrays::Array& s, const char* what, bool nbytes) {
    if (d.dtype != s.dtype) {
        raise_usage(std::string(what) + ": dest has dtype " + arrays::name(d.dtype) + ", src " + arrays::name(s.dtype));
    }
    if (nbytes && d.nbytes() != s.nbytes()) {
        raise_usage(std::string(what) + ": dest has " + std::to_string(d.size) + " elements, src " +
                    std::to_string(s.size));
    }
}

int pe_arg(nb::handle v, const char* what, int n) {
    long long pe = -1;
    if (!arrays::as_index(v, pe) || pe < 0 || pe >= n) {
        raise_usage(std::string(what) + " must be a PE number in [0, " + std::to_string(n) + "), not " +
                    arrays::repr_of(v));
    }
    return static_cast<int>(pe);
}

// (nvshmem_team_t, number of PEs) of `team`; None is the world team.
std::pair<int32_t, int> team_arg(nb::handle team, const Heap& heap) {
    if (team.is_none()) return {NVSHMEM_TEAM_WORLD, heap.npes};
    Team* t = nullptr;
    if (!nb::try_cast<Team*>(team, t) || t == nullptr) {
        raise_type("team must be an mpbind.nvshmem.Team or None, not " + arrays::typename_of(team));
    }
    int32_t h = t->get().team;
    int n = team_n_pes(h);
    if (n < 1) raise_usage("team " + std::to_string(h) + " has no PEs (nvshmem_team_n_pes returned " +
                           std::to_string(n) + ")");
    return {h, n};
}

void full_mode(const Heap& heap, const char* what) {
    // libnvshmem_host ends the process on these calls in limited MPG mode: refuse first.
    if (heap.limited) {
        raise_usage(std::string(what) + " is not available in NVSHMEM's limited multi-PE-per-GPU mode (several PEs "
                    "on one GPU without CUDA MPS); run under MPS or with one PE per GPU");
    }
}

int reduce_op(nb::handle op) {
    if (PyUnicode_Check(op.ptr())) {
        std::string name = nb::cast<std::string>(op);
        for (int i = 0; i < 7; ++i) {
            if (name == kReduceOps[i]) return i;
        }
    }
    raise_usage("reduce: unknown op " + arrays::repr_of(op) + "; use one of sum, prod, min, max, and, or, xor");
}

// RMA: dest and src, one of them symmetric, of the same dtype and size.
Step plan_rma(Rma kind, const Heap& heap, nb::handle dest, nb::handle src, nb::handle pe, nb::handle stream) {
    Step k{kind};
    arrays::Array d, s;
    if (kind == Rma::kPut) {
        d = symmetric_arg(dest, "dest", heap, false);
        s = local_arg(src, "src", false);
    } else {
        s = symmetric_arg(src, "src", heap, false);
        d = local_arg(dest, "dest", true);
    }
    same(d, s, kind == Rma::kPut ? "put" : "get", true);
    k.pe = pe_arg(pe, "pe", heap.npes);
    k.dest = d.ptr;
    k.src = s.ptr;
    k.n = static_cast<size_t>(d.nbytes());
    k.stream = stream_handle(stream);
    return k;
}

// Collectives over a team: dest and src symmetric.
Step plan_collective(Rma kind, const Heap& heap, int op, nb::handle dest, nb::handle src, nb::handle root,
                     nb::handle team, nb::handle stream) {
    static constexpr const char* kWhat[] = {"", "", "", "", "", "", "broadcast", "fcollect", "alltoall", "reduce"};
    const char* what = kWhat[static_cast<int>(kind)];
    Step k{kind};
    auto [handle, n] = team_arg(team, heap);
    k.team = handle;
    arrays::Array d = symmetric_arg(dest, "dest", heap, true);
    arrays::Array s = symmetric_arg(src, "src", heap, false);
    same(d, s, what, kind != Rma::kFcollect);
    k.dest = d.ptr;
    k.src = s.ptr;
    switch (kind) {
        case Rma::kBroadcast:
            k.pe = pe_arg(root, "root", n);
            k.n = static_cast<size_t>(d.nbytes());
            break;
        case Rma::kFcollect: {
            int64_t need = checked_mul(s.size, static_cast<int64_t>(n), "fcollect: the elements of dest (team size x "
                                                                        "src elements)");
            if (d.size != need) {
                raise_usage("fcollect: dest has " + std::to_string(d.size) + " elements; " + std::to_string(n) +
                            " PEs x " + std::to_string(s.size) + " elements of src need " + std::to_string(need));
            }
            k.n = static_cast<size_t>(s.nbytes());
            break;
        }
        case Rma::kAlltoall:
            if (s.size % n) {
                raise_usage("alltoall: " + std::to_string(s.size) + " elements do not split into " + std::to_string(n) +
                            " equal blocks");
            }
            k.n = static_cast<size_t>(s.nbytes() / n);
            break;
        default: {  // reduce
            if (nvshmem_type(d.dtype) == nullptr || (op >= kArithmeticOps && !is_integer(d.dtype))) {
                raise_usage(std::string("reduce: ") + kReduceOps[op] + " is not available for " +
                            arrays::name(d.dtype));
            }
            k.dtype = d.dtype;
            k.op = op;
            k.n = static_cast<size_t>(d.size);
        }
    }
    full_mode(heap, what);
    k.stream = stream_handle(stream);
    return k;
}

// The typed reduce entries, by (element type, operation), found once by name in the table.
using ReduceCall = void (*)(const void* fn, int32_t team, uintptr_t dest, uintptr_t src, size_t n, uintptr_t stream);

template <class F>
struct ReduceEntry : std::false_type {};
template <class D, capi::Gil G>
struct ReduceEntry<capi::Fn<int(nvshmem_team_t, D*, const D*, size_t, cudaStream_t), capi::Status, G>>
    : std::true_type {
    using FnType = capi::Fn<int(nvshmem_team_t, D*, const D*, size_t, cudaStream_t), capi::Status, G>;
    static void call(const void* fn, int32_t team, uintptr_t dest, uintptr_t src, size_t n, uintptr_t stream) {
        capi::call(*static_cast<const FnType*>(fn), team, reinterpret_cast<D*>(dest), reinterpret_cast<const D*>(src),
                   n, reinterpret_cast<cudaStream_t>(stream));
    }
};

struct Reducer {
    const void* fn = nullptr;
    ReduceCall call = nullptr;
};

const Reducer& reducer(arrays::Dtype dtype, int op) {
    static std::array<std::array<Reducer, 7>, 32>* table = nullptr;  // filled once, under the GIL
    if (table == nullptr) {
        std::map<std::string, Reducer> by_name;
        const_cast<Api&>(api()).each([&](auto& fn) {
            using F = std::remove_cv_t<std::remove_reference_t<decltype(fn)>>;
            if constexpr (ReduceEntry<F>::value) by_name[fn.name] = {&fn, &ReduceEntry<F>::call};
        });
        auto t = std::make_unique<std::array<std::array<Reducer, 7>, 32>>();
        for (int d = 0; d < 32; ++d) {
            const char* type = nvshmem_type(static_cast<arrays::Dtype>(d));
            if (type == nullptr) continue;
            for (int o = 0; o < 7; ++o) {
                auto it = by_name.find(std::string("nvshmemx_") + type + "_" + kReduceOps[o] + "_reduce_on_stream");
                if (it != by_name.end()) (*t)[d][o] = it->second;
            }
        }
        table = t.release();
    }
    return (*table)[static_cast<size_t>(dtype)][op];
}

void issue(const Step& k) {
    const bool collective = k.kind >= Rma::kBarrierAll;  // the collectives follow RMA in Rma
    Watched watched(collective ? kStepNames[static_cast<int>(k.kind)] : nullptr, static_cast<int64_t>(k.n),
                    k.stream);
    const Api& a = api();
    auto* dest = reinterpret_cast<void*>(k.dest);
    auto* src = reinterpret_cast<const void*>(k.src);
    auto* stream = reinterpret_cast<cudaStream_t>(k.stream);
    switch (k.kind) {
        case Rma::kPut: invoke(a.nvshmemx_putmem_on_stream, dest, src, k.n, k.pe, stream); break;
        case Rma::kGet: invoke(a.nvshmemx_getmem_on_stream, dest, src, k.n, k.pe, stream); break;
        case Rma::kQuiet: invoke(a.nvshmemx_quiet_on_stream, stream); break;
        case Rma::kBarrierAll: invoke(a.nvshmemx_barrier_all_on_stream, stream); break;
        case Rma::kSyncAll: invoke(a.nvshmemx_sync_all_on_stream, stream); break;
        case Rma::kBarrier: call(a.nvshmemx_barrier_on_stream, k.team, stream); break;
        case Rma::kBroadcast: call(a.nvshmemx_broadcastmem_on_stream, k.team, dest, src, k.n, k.pe, stream); break;
        case Rma::kFcollect: call(a.nvshmemx_fcollectmem_on_stream, k.team, dest, src, k.n, stream); break;
        case Rma::kAlltoall: call(a.nvshmemx_alltoallmem_on_stream, k.team, dest, src, k.n, stream); break;
        case Rma::kReduce: {
            const Reducer& r = reducer(k.dtype, k.op);
            r.call(r.fn, k.team, k.dest, k.src, k.n, k.stream);
            break;
        }
    }
    if (collective) watched.queued();
}

Step plan_sync(Rma kind, const Heap& heap, nb::handle team, nb::handle stream) {
    Step k{kind};
    if (kind == Rma::kBarrier) {
        k.team = team_arg(team, heap).first;
        full_mode(heap, "barrier on a team");
    }
    k.stream = stream_handle(stream);
    return k;
}

// A step as the tests see it: (kind, team, dest, src, n, pe, stream, reduce function or None).
nb::tuple describe_step(const Step& k) {
    const auto& kKinds = kStepNames;
    nb::object fn = nb::none();
    if (k.kind == Rma::kReduce) {
        fn = nb::str((std::string("nvshmemx_") + nvshmem_type(k.dtype) + "_" + kReduceOps[k.op] +
                      "_reduce_on_stream").c_str());
    }
    return nb::make_tuple(kKinds[static_cast<int>(k.kind)], k.team, k.dest, k.src, k.n, k.pe, k.stream, fn);
}

nb::dict describe_allocation(const AllocState& s) {
    nb::dict d;
    d["ptr"] = s.ptr;
    d["nbytes"] = s.nbytes;
    d["serial"] = s.serial();
    d["references"] = s.refs();
    return d;
}

// --- symmetric arrays: mpbind.nvshmem.SymmetricArray and PeerArray ---------------------------------
//
// The core's own types, final (no subclass): a hot call recognises them by C++ type and copies the
// description each holds, made and put through the intake rules once, when the array was made (its
// shape, dtype and device never change). Only the allocation is read at each call, checked open.

// mpbind._core.dlpack_view, looked up once (never freed: it may be used until the process ends).
nb::object* g_dlpack_view = nullptr;

// A C-order CUDA array over symmetric memory: what SymmetricArray and PeerArray share.
struct ArrayView {
    nb::object shape;          // the tuple of ints it was made with
    nb::object dtype;          // the element type's name (a str)
    arrays::Array described;   // validated when made; ptr is filled in at each use

    int device() const { return described.device; }
    nb::dict cuda_array_interface(uintptr_t ptr) const {
        const char* ts = arrays::info(described.dtype).typestr;
        if (ts == nullptr) {
            // bfloat16 and float8 have no typestr: AttributeError makes consumers fall back to DLPack.
            PyErr_SetString(PyExc_AttributeError, ("__cuda_array_interface__ cannot describe " +
                                                   std::string(arrays::name(described.dtype)) + "; use DLPack")
                                                      .c_str());
            throw nb::python_error();
        }
        nb::dict d;
        d["version"] = 3;
        d["shape"] = shape;
        d["typestr"] = ts;
        d["data"] = nb::make_tuple(ptr, false);
        d["strides"] = nb::none();
        d["stream"] = nb::none();
        return d;
    }
    // A DLPack export of [ptr, ...) that keeps `owner` (the array) alive as long as the consumer's tensor.
    nb::object dlpack(uintptr_t ptr, nb::handle owner, const nb::kwargs& kwargs) const {
        if (g_dlpack_view == nullptr) g_dlpack_view = new nb::object(nb::module_::import_("mpbind._core").attr("dlpack_view"));
        const arrays::DtypeInfo& i = arrays::info(described.dtype);
        nb::list extents;
        for (size_t k = 0; k < described.shape.size(); ++k) extents.append(described.shape[k]);
        nb::object view = (*g_dlpack_view)(ptr, extents, i.dl_code, i.dl_bits, device(), owner);
        nb::dict given;
        for (auto [k, v] : kwargs) {
            if (!v.is_none()) given[k] = v;
        }
        return view.attr("__dlpack__")(**given);
    }
};

struct SymmetricArray {
    nb::object memory;                   // the SymmetricMemory (Allocation) it owns
    std::shared_ptr<AllocState> state;   // memory's state
    ArrayView view;

    AllocState& alloc() const {
        state->check_open();  // UsageError once freed
        return *state;
    }
};

struct PeerArray {
    nb::object base;             // its SymmetricArray
    const SymmetricArray* sym;   // base's (base keeps it alive)
    uintptr_t address;
    int pe;
    ArrayView view;              // described at the peer address

    uintptr_t ptr() const {
        sym->alloc();
        return address;
    }
};

PyTypeObject* g_symmetric_type = nullptr;
PyTypeObject* g_peer_type = nullptr;

// nvshmem_ptr of PE `pe`'s copy at `offset`, or nullopt when that memory is not directly addressable.
std::optional<uintptr_t> peer_address(AllocState& s, int pe, size_t offset) {
    int n = open_runtime(s.runtime).npes;
    if (pe < 0 || pe >= n) raise_usage("pe must be in [0, " + std::to_string(n) + "), got " + std::to_string(pe));
    if (offset >= s.nbytes) raise_usage("offset " + std::to_string(offset) + " is past the allocation");
    void* p = invoke(api().nvshmem_ptr, reinterpret_cast<const void*>(s.ptr + offset), pe);
    if (p == nullptr) return std::nullopt;
    return reinterpret_cast<uintptr_t>(p);
}

// A view described at `ptr`: the intake rules, and no more than the allocation holds.
ArrayView make_view(uintptr_t ptr, nb::handle shape, nb::handle dtype, int device, size_t allocated,
                    arrays::Source source, const char* what) {
    if (!PyTuple_Check(shape.ptr())) raise_type(std::string(what) + ": shape must be a tuple of ints");
    if (!PyUnicode_Check(dtype.ptr())) raise_type(std::string(what) + ": dtype must be an element type's name");
    if (device < 0) raise_usage(std::string(what) + ": device must be a CUDA ordinal, got " + std::to_string(device));
    ArrayView v{nb::borrow(shape), nb::borrow(dtype), arrays::describe_c_order(ptr, shape, dtype, device, source, what)};
    if (static_cast<uint64_t>(v.described.nbytes()) > allocated) {
        raise_usage(std::string(what) + ": " + std::to_string(v.described.nbytes()) +
                    " bytes, more than its symmetric allocation's " + std::to_string(allocated));
    }
    return v;
}

template <class T>
T& ready(nb::handle obj, const char* kind) {
    if (!nb::inst_ready(obj)) raise_type(std::string("this ") + kind + " was not made by mpbind.nvshmem");
    return *nb::inst_ptr<T>(obj);
}

}  // namespace

bool is_symmetric_array(PyTypeObject* type) { return type == g_symmetric_type && type != nullptr; }
bool is_peer_array(PyTypeObject* type) { return type == g_peer_type && type != nullptr; }

void describe_symmetric(nb::handle obj, arrays::Array& a, const char* what) {
    (void)what;
    const SymmetricArray& s = ready<SymmetricArray>(obj, "SymmetricArray");
    const AllocState& m = s.alloc();  // UsageError once freed
    a = s.view.described;
    a.ptr = a.symmetric = m.ptr;
}

void describe_peer(nb::handle obj, arrays::Array& a, const char* what) {
    (void)what;
    const PeerArray& p = ready<PeerArray>(obj, "PeerArray");
    a = p.view.described;
    a.ptr = p.ptr();  // UsageError once the array is freed
}

namespace {

void register_arrays_of(nb::module_& m) {
    auto sym = nb::class_<SymmetricArray>(
        m, "SymmetricArray", nb::is_final(),
        "An array in NVSHMEM's symmetric heap (every PE allocated it together).\n\n"
        "It exports __cuda_array_interface__ (v3) and DLPack, so CuPy, PyTorch and JAX view it without "
        "copying; such views keep it alive but do not stop free(). close() (or free(), or leaving a with "
        "block) is nvshmem_free, collective: every PE frees its array. Dropped unfreed, it warns "
        "ResourceWarning and waits for drain()/finalize().");
    sym.def("__init__", [](SymmetricArray*, nb::args, nb::kwargs) {
           raise_type("symmetric arrays come from mpbind.nvshmem.empty() or zeros()");
       }, nb::sig("def __init__(self, *args: object, **kwargs: object) -> None"))
        .def_prop_ro("ptr", [](const SymmetricArray& s) { return s.alloc().ptr; },
                     "The symmetric address; UsageError once freed.")
        .def_prop_ro("memory", [](const SymmetricArray& s) { return s.memory; },
                     nb::sig("def memory(self) -> SymmetricMemory"), "The allocation behind it.")
        .def_prop_ro("shape", [](const SymmetricArray& s) { return s.view.shape; },
                     nb::sig("def shape(self) -> tuple[int, ...]"))
        .def_prop_ro("dtype", [](const SymmetricArray& s) { return s.view.dtype; }, nb::sig("def dtype(self) -> str"),
                     "The element type's name (\"float32\", \"bfloat16\", ...).")
        .def_prop_ro("ndim", [](const SymmetricArray& s) { return s.view.described.shape.size(); })
        .def_prop_ro("size", [](const SymmetricArray& s) { return s.view.described.size; })
        .def_prop_ro("itemsize", [](const SymmetricArray& s) { return s.view.described.itemsize(); })
        .def_prop_ro("nbytes", [](const SymmetricArray& s) { return s.view.described.nbytes(); })
        .def_prop_ro("device", [](const SymmetricArray& s) { return s.view.device(); }, "The CUDA device ordinal.")
        .def_prop_ro("__cuda_array_interface__",
                     [](const SymmetricArray& s) { return s.view.cuda_array_interface(s.alloc().ptr); },
                     nb::sig("def __cuda_array_interface__(self) -> dict[str, typing.Any]"))
        .def("__dlpack__", [](nb::handle self, nb::kwargs kwargs) {
            const SymmetricArray& s = ready<SymmetricArray>(self, "SymmetricArray");
            return s.view.dlpack(s.alloc().ptr, self, kwargs);
        }, nb::sig("def __dlpack__(self, **kwargs: typing.Any) -> typing.Any"))
        .def("__dlpack_device__", [](const SymmetricArray& s) { return std::make_pair(2, s.view.device()); },
             nb::sig("def __dlpack_device__(self) -> tuple[int, int]"))
        .def("free", [](SymmetricArray& s) { s.state->close(); }, "nvshmem_free (collective); the same as close().")
        .def("peer", [](nb::handle self, nb::handle pe) -> nb::object {
            const SymmetricArray& s = ready<SymmetricArray>(self, "SymmetricArray");
            int number = pe_arg(pe, "pe", open_runtime(s.alloc().runtime).npes);
            std::optional<uintptr_t> address = peer_address(s.alloc(), number, 0);
            if (!address) return nb::none();
            ArrayView view = make_view(*address, s.view.shape, s.view.dtype, s.view.device(), s.state->nbytes,
                                       arrays::Source::kPeer, "a peer view");
            return nb::cast(PeerArray{nb::borrow(self), &s, *address, number, std::move(view)});
        }, nb::arg("pe").none(), nb::sig("def peer(self, pe: int) -> PeerArray | None"),
           "A view of PE `pe`'s copy of this array through nvshmem_ptr, or None when that PE's memory is not "
           "directly addressable from here (another node, or no peer access).")
        .def("close", [](SymmetricArray& s) { s.state->close(); },
             "nvshmem_free (collective: every PE frees its array). Idempotent.")
        .def_prop_ro("closed", [](const SymmetricArray& s) { return s.state->closed(); }, "True once freed.")
        .def_prop_ro("serial", [](const SymmetricArray& s) { return s.state->serial(); },
                     "Creation order in this process (its allocation's); queued releases run newest first.")
        .def("__enter__", [](nb::handle self) { return nb::borrow(self); }, nb::sig(kEnterSig))
        .def("__exit__", [](SymmetricArray& s, nb::args) { s.state->close(); }, nb::sig(kExitSig))
        .def("__repr__", [](const SymmetricArray& s) {
            return "<SymmetricArray shape=" + nb::cast<std::string>(nb::repr(s.view.shape)) +
                   " dtype=" + nb::cast<std::string>(nb::str(s.view.dtype)) + ": " +
                   nb::cast<std::string>(nb::repr(s.memory)) + ">";
        });
    refuse_copies(sym);
    g_symmetric_type = reinterpret_cast<PyTypeObject*>(sym.ptr());

    auto peer = nb::class_<PeerArray>(
        m, "PeerArray", nb::is_final(),
        "Another PE's copy of a symmetric array, addressed directly (loads and stores over NVLink or within one "
        "GPU). Not symmetric memory itself: pass the SymmetricArray to RMA calls.");
    peer.def("__init__", [](PeerArray*, nb::args, nb::kwargs) {
            raise_type("peer views come from SymmetricArray.peer()");
        }, nb::sig("def __init__(self, *args: object, **kwargs: object) -> None"))
        .def_prop_ro("ptr", [](const PeerArray& p) { return p.ptr(); },
                     "The peer address; UsageError once the array is freed.")
        .def_prop_ro("pe", [](const PeerArray& p) { return p.pe; })
        .def_prop_ro("base", [](const PeerArray& p) { return p.base; }, nb::sig("def base(self) -> SymmetricArray"))
        .def_prop_ro("shape", [](const PeerArray& p) { return p.view.shape; },
                     nb::sig("def shape(self) -> tuple[int, ...]"))
        .def_prop_ro("dtype", [](const PeerArray& p) { return p.view.dtype; }, nb::sig("def dtype(self) -> str"))
        .def_prop_ro("ndim", [](const PeerArray& p) { return p.view.described.shape.size(); })
        .def_prop_ro("size", [](const PeerArray& p) { return p.view.described.size; })
        .def_prop_ro("itemsize", [](const PeerArray& p) { return p.view.described.itemsize(); })
        .def_prop_ro("nbytes", [](const PeerArray& p) { return p.view.described.nbytes(); })
        .def_prop_ro("device", [](const PeerArray& p) { return p.view.device(); }, "The CUDA device ordinal.")
        .def_prop_ro("__cuda_array_interface__", [](const PeerArray& p) { return p.view.cuda_array_interface(p.ptr()); },
                     nb::sig("def __cuda_array_interface__(self) -> dict[str, typing.Any]"))
        .def("__dlpack__", [](nb::handle self, nb::kwargs kwargs) {
            const PeerArray& p = ready<PeerArray>(self, "PeerArray");
            return p.view.dlpack(p.ptr(), self, kwargs);
        }, nb::sig("def __dlpack__(self, **kwargs: typing.Any) -> typing.Any"))
        .def("__dlpack_device__", [](const PeerArray& p) { return std::make_pair(2, p.view.device()); },
             nb::sig("def __dlpack_device__(self) -> tuple[int, int]"))
        .def("__repr__", [](const PeerArray& p) {
            return "<PeerArray pe=" + std::to_string(p.pe) + " of " + nb::cast<std::string>(nb::repr(p.base)) + ">";
        });
    g_peer_type = reinterpret_cast<PyTypeObject*>(peer.ptr());

    m.def("symmetric_array", [](nb::handle memory, nb::handle shape, nb::handle dtype, int device) {
        Allocation& a = object_arg<Allocation>(memory, "memory", "an mpbind.nvshmem.SymmetricMemory");
        AllocState& s = a.get();
        ArrayView view = make_view(s.ptr, shape, dtype, device, s.nbytes, arrays::Source::kSymmetric,
                                   "a symmetric array");
        return SymmetricArray{nb::borrow(memory), a.state(), std::move(view)};
    }, nb::arg("memory"), nb::arg("shape"), nb::arg("dtype"), nb::arg("device"),
       nb::sig("def symmetric_array(memory: SymmetricMemory, shape: tuple[int, ...], dtype: str, device: int) "
               "-> SymmetricArray"),
       "A C-order array of `shape` and `dtype` (a name) over `memory` on `device`, which it owns (mpbind.nvshmem's "
       "empty() and zeros() make them). UsageError when it would hold more than the allocation.");
}

}  // namespace

bool holds(uintptr_t ptr, size_t nbytes) {
    std::shared_ptr<RuntimeState> rt;
    {
        Global& g = global();
        Lock l = lock(g.mu);
        if (g.runtime == nullptr || g.runtime->closed()) return false;
        rt = g.runtime;
    }
    return rt->containing(ptr, nbytes == 0 ? 1 : nbytes) != nullptr;
}

struct CollectiveCall::Impl {
    Watched watched;
};

CollectiveCall::CollectiveCall(const char* op, uintptr_t stream)
    : impl_(op != nullptr ? new Impl{Watched(op, -1, stream)} : nullptr) {}

CollectiveCall::~CollectiveCall() { delete impl_; }

void CollectiveCall::queued() {
    if (impl_ != nullptr) impl_->watched.queued();
}

void settle_collectives() { fence().settle(); }

std::unique_lock<std::mutex> launch_gate() { return fence().gate(); }

bool note_launched(uintptr_t stream) { return fence().note_launched(stream); }

std::shared_ptr<State> symmetric_state(nb::handle array) {
    if (!nb::isinstance<SymmetricArray>(array)) raise_type("expected an mpbind._core.nvshmem.SymmetricArray");
    return nb::cast<SymmetricArray&>(array).state;
}

void settle_collectives_for_release() { fence().settle_for_release(); }

}  // namespace mpbind::nvshmem

namespace mpbind {

void register_nvshmem(nb::module_& parent) {
    using namespace nvshmem;
    nb::module_ m = parent.def_submodule("nvshmem", "NVSHMEM objects of the core.");

    // --- Runtime ---
    auto rt = nb::class_<Runtime>(
        m, "Runtime",
        "The NVSHMEM runtime of this process (one per process). finalize() is collective and final: "
        "NVSHMEM cannot be initialised again in the same process.");
    rt.def_prop_ro("my_pe", [](Runtime& r) { return open_runtime(r.state()).pe; })
        .def_prop_ro("n_pes", [](Runtime& r) { return open_runtime(r.state()).npes; })
        .def_prop_ro("init_status", [](Runtime& r) { return open_runtime(r.state()).status; },
                     "nvshmemx_init_status() right after initialisation (an InitStatus value).")
        .def_prop_ro("limited_mpg",
                     [](Runtime& r) { return open_runtime(r.state()).status == NVSHMEM_STATUS_LIMITED_MPG; },
                     "True in NVSHMEM's limited multi-PE-per-GPU mode (several PEs on one GPU without CUDA "
                     "MPS), where team creation, team barriers and collectives other than barrier_all/sync_all "
                     "are not available.")
        .def_prop_ro("params", [](Runtime& r) { return r.state()->params; },
                     "The parameters it was initialised with.")
        .def_prop_ro("team_world", [](Runtime& r) {
            open_runtime(r.state());
            return make_team(r.state(), NVSHMEM_TEAM_WORLD, true);
        })
        .def_prop_ro("team_shared", [](Runtime& r) {
            open_runtime(r.state());
            return make_team(r.state(), NVSHMEM_TEAM_SHARED, true);
        })
        .def_prop_ro("team_node", [](Runtime& r) {
            open_runtime(r.state());
            return make_team(r.state(), NVSHMEMX_TEAM_NODE, true);
        })
        .def("finalize", [](Runtime& r) {
            collect_garbage();
            r.close();
        },
             "Release what depends on it (queued releases first, then live teams, allocations and "
             "registrations, newest first), then nvshmem_finalize. Collective; idempotent.")
        .def_prop_ro("finalized", [](Runtime& r) { return r.closed(); })
        .def("drain", [](Runtime& r) {
            open_runtime(r.state());
            collect_garbage();
            return drain_queue(r.state().get());
        }, "Run the queued collective releases under this runtime, newest first (collective).")
        .def("register", [](Runtime& r, uintptr_t ptr, size_t size, nb::object buffer) {
            return do_register(open_runtime(r.state()), ptr, size, std::move(buffer));
        }, nb::arg("ptr"), nb::arg("size"), nb::arg("buffer") = nb::none(),
           "nvshmemx_buffer_register (local), reference-counted per (ptr, size).")
        .def("registrations", [](Runtime& r) { return describe(open_runtime(r.state()).registrations.live()); },
             nb::sig("def registrations(self) -> list[dict[str, typing.Any]]"), "Live registrations on this runtime.")
        .def("allocations", [](Runtime& r) {
            nb::list out;
            for (auto& s : open_runtime(r.state()).live_allocations()) out.append(describe_allocation(*s));
            return out;
        }, nb::sig("def allocations(self) -> list[dict[str, int]]"), "Live symmetric allocations (also those queued for release), oldest first.")
        .def("__repr__", [](Runtime& r) {
            auto& s = *r.state();
            if (s.closed()) return std::string("<nvshmem.Runtime finalized>");
            return "<nvshmem.Runtime pe=" + std::to_string(s.pe) + " n_pes=" + std::to_string(s.npes) + ">";
        });
    bind_lifetime(rt, "Same as finalize().");

    // --- Team ---
    auto team = nb::class_<Team>(
        m, "Team",
        "An NVSHMEM team. Destruction is collective over its members: destroy() on every member, or drop it "
        "and drain() on every PE. Predefined teams (world, shared, node) are never destroyed.");
    team.def_prop_ro("handle", [](Team& t) { return t.get().team; }, "The nvshmem_team_t, for the flat bindings.")
        .def_prop_ro("predefined", [](Team& t) { return t.state()->predefined; })
        .def_prop_ro("my_pe", [](Team& t) { return invoke(api().nvshmem_team_my_pe, t.get().team); })
        .def_prop_ro("n_pes", [](Team& t) { return team_n_pes(t.get().team); })
        .def("split_strided", [](Team& t, nb::handle start, nb::handle stride, nb::handle size) {
            return split_strided(t, c_int(start, "start"), c_int(stride, "stride"), c_int(size, "size"));
        }, nb::arg("start").none(), nb::arg("stride").none(), nb::arg("size").none(),
             nb::sig("def split_strided(self, start: int, stride: int, size: int) -> Team | None"),
             "nvshmem_team_split_strided (collective over this team). None on PEs outside the new team.")
        .def("translate_pe", [](Team& t, nb::handle pe, nb::handle dest) {
            return translate_pe(t, c_int(pe, "pe"), object_arg<Team>(dest, "dest_team", "an nvshmem.Team"));
        }, nb::arg("pe").none(), nb::arg("dest_team").none(),
             nb::sig("def translate_pe(self, pe: int, dest_team: Team) -> int"),
             "The number in `dest_team` of this team's PE `pe`, or -1 when it is not a member.")
        .def("destroy", [](Team& t) { t.close(); }, "Same as close().")
        .def("__repr__", [](Team& t) {
            auto& s = *t.state();
            return nb::str("<nvshmem.Team {}{}{}>")
                .format(s.team, s.predefined ? " predefined" : "", s.closed() ? " closed" : "");
        });
    bind_lifetime(team, "nvshmem_team_destroy (collective over the team); predefined teams are only marked "
                        "closed. Idempotent.");

    // --- SymmetricMemory ---
    auto mem = nb::class_<Allocation>(
        m, "SymmetricMemory",
        "Symmetric memory from nvshmem_malloc/calloc/align. nvshmem_free is collective: free() on every PE, "
        "or drop it and drain()/finalize() on every PE (it then warns ResourceWarning).");
    mem.def_prop_ro("ptr", [](Allocation& a) { return a.get().ptr; })
        .def_prop_ro("nbytes", [](Allocation& a) { return a.get().nbytes; })
        .def("peer_ptr", [](Allocation& a, nb::handle pe_arg, nb::handle offset_arg) -> std::optional<uintptr_t> {
            int pe = c_int(pe_arg, "pe");
            return peer_address(a.get(), pe, uint_arg(offset_arg, "offset"));
        }, nb::arg("pe").none(), nb::arg("offset").none() = 0,
           nb::sig("def peer_ptr(self, pe: int, offset: int = 0) -> int | None"),
           "nvshmem_ptr: the address of this memory on PE `pe` usable from this PE, or None when that PE's "
           "memory is not directly addressable.")
        .def("free", [](Allocation& a) { a.close(); }, "Same as close().")
        .def("__repr__", [](Allocation& a) {
            auto& s = *a.state();
            return nb::str("<nvshmem.SymmetricMemory ptr=0x{:x} nbytes={}{}>")
                .format(s.ptr, s.nbytes, s.closed() ? " freed" : "");
        });
    bind_lifetime(mem, "nvshmem_free (collective). Idempotent.");
    register_arrays_of(m);

    // --- KernelLibrary ---
    auto lib = nb::class_<KernelLibrary>(
        m, "KernelLibrary",
        "A cubin loaded as a CUlibrary (and registered with NVSHMEM where it calls it): the core's object of "
        "mpbind.kernels.Library. Its release synchronises the device, unregisters and unloads it; never "
        "from the garbage collector: dropped unclosed, it is queued until drain() or finalize().");
    lib.def_prop_ro("handle", [](KernelLibrary& k) { return k.get().handle; },
                    "The CUlibrary; UsageError once closed.")
        .def_prop_ro("device", [](KernelLibrary& k) { return k.state()->device; })
        .def_prop_ro("name", [](KernelLibrary& k) { return k.state()->name; })
        .def_prop_ro("registered", [](KernelLibrary& k) { return k.state()->registered; },
                     "Whether it is registered with NVSHMEM (a child of the runtime, released before it).")
        .def_prop_ro("code", [](KernelLibrary& k) { return k.get().code(); },
                     "The loaded code object its kernels come from; UsageError once closed.")
        .def("__repr__", [](KernelLibrary& k) {
            auto& s = *k.state();
            return nb::str("<nvshmem.KernelLibrary {} {} (serial {})>")
                .format(s.name, s.closed() ? std::string("closed") : "device=" + std::to_string(s.device),
                        s.serial());
        });
    bind_lifetime(lib, "Synchronise the device, unregister it from NVSHMEM and unload it. Idempotent.");
    m.def("load_library", &load_library, nb::arg("code"), nb::arg("handle"), nb::arg("device"), nb::arg("name"),
          nb::arg("registered"), nb::arg("unload"),
          nb::sig("def load_library(code: object, handle: int, device: int, name: str, registered: bool, "
                  "unload: collections.abc.Callable[[bool], object]) -> KernelLibrary"),
          "The core's object of a loaded library: `code` is kept until its release, which calls "
          "`unload(registered)` once (it synchronises the device and, while NVSHMEM is up, unregisters the "
          "library), then drops `code`. `registered` (nvshmemx_culibrary_init was called) makes it a child of the "
          "live runtime: UsageError without one.");

    m.def("start", &start, nb::arg("params"), nb::arg("init"), nb::arg("require_initialized") = true,
          nb::sig("def start(params: collections.abc.Mapping[str, str], init: collections.abc.Callable[[], object], "
                  "require_initialized: bool = True) -> Runtime"),
          "Run `init()` (the flat initialisation, collective; mpbind.nvshmem.init() builds it) unless a runtime is "
          "live, then make the runtime; with a live runtime, return it when `params` are the same and raise "
          "UsageError naming what differs otherwise. With `require_initialized`, raise MpbindError unless NVSHMEM "
          "is initialised after `init()` (tests adopt a no-op initialisation without it).");
    // --- the hot calls: mpbind.nvshmem's put, get, quiet, ... are these functions themselves ---
    // (a Python function around each added its frame, 0.12-0.13 µs per put + quiet pair). Their
    // signatures and docs are the public ones: the stubs and help() take them from here.
    auto none = nb::none();
    m.def("put", [](nb::handle dest, nb::handle src, nb::handle pe, nb::handle stream) {
        issue(plan_rma(Rma::kPut, heap_of(hot_runtime()), dest, src, pe, stream));
    }, nb::arg("dest").none(), nb::arg("src").none(), nb::arg("pe").none(), nb::arg("stream").none() = none,
       nb::sig("def put(dest: mpbind.typing.Array, src: mpbind.typing.Array, pe: int, "
               "stream: mpbind.typing.Stream = None) -> None"),
       "Copy local `src` into symmetric `dest` on PE `pe`, on `stream` (``nvshmemx_putmem_on_stream``).\n"
       "Complete it with :func:`quiet`; make it visible to `pe` with a barrier.");
    m.def("get", [](nb::handle dest, nb::handle src, nb::handle pe, nb::handle stream) {
        issue(plan_rma(Rma::kGet, heap_of(hot_runtime()), dest, src, pe, stream));
    }, nb::arg("dest").none(), nb::arg("src").none(), nb::arg("pe").none(), nb::arg("stream").none() = none,
       nb::sig("def get(dest: mpbind.typing.Array, src: mpbind.typing.Array, pe: int, "
               "stream: mpbind.typing.Stream = None) -> None"),
       "Copy symmetric `src` from PE `pe` into local `dest`, on `stream` (``nvshmemx_getmem_on_stream``).");
    for (auto [name, kind, sig, doc] : {
             std::tuple{"quiet", Rma::kQuiet, "def quiet(stream: mpbind.typing.Stream = None) -> None",
                        "Complete this PE's outstanding RMA on `stream` (``nvshmemx_quiet_on_stream``)."},
             std::tuple{"barrier_all", Rma::kBarrierAll,
                        "def barrier_all(stream: mpbind.typing.Stream = None) -> None",
                        "Barrier over all PEs with completion of their RMA, on `stream` (collective; "
                        "``nvshmemx_barrier_all_on_stream``)."},
             std::tuple{"sync_all", Rma::kSyncAll, "def sync_all(stream: mpbind.typing.Stream = None) -> None",
                        "Barrier over all PEs without completing RMA, on `stream` (collective; "
                        "``nvshmemx_sync_all_on_stream``)."}}) {
        m.def(name, [kind = kind](nb::handle stream) {
            issue(plan_sync(kind, heap_of(hot_runtime()), nb::none(), stream));
        }, nb::arg("stream").none() = none, nb::sig(sig), doc);
    }
    m.def("barrier", [](nb::handle team, nb::handle stream) {
        issue(plan_sync(Rma::kBarrier, heap_of(hot_runtime()), team, stream));
    }, nb::arg("team").none() = none, nb::arg("stream").none() = none,
       nb::sig("def barrier(team: Team | None = None, stream: mpbind.typing.Stream = None) -> None"),
       "Barrier over `team` with completion of RMA, on `stream` (collective over the team; "
       "``nvshmemx_barrier_on_stream``).");
    m.def("broadcast", [](nb::handle dest, nb::handle src, nb::handle root, nb::handle team, nb::handle stream) {
        issue(plan_collective(Rma::kBroadcast, heap_of(hot_runtime()), -1, dest, src, root, team, stream));
    }, nb::arg("dest").none(), nb::arg("src").none(), nb::arg("root").none(), nb::arg("team").none() = none,
       nb::arg("stream").none() = none,
       nb::sig("def broadcast(dest: mpbind.typing.Array, src: mpbind.typing.Array, root: int, "
               "team: Team | None = None, stream: mpbind.typing.Stream = None) -> None"),
       "Copy `src` of the team's PE `root` into `dest` on every member (collective over `team`; "
       "``nvshmemx_broadcastmem_on_stream``).");
    m.def("fcollect", [](nb::handle dest, nb::handle src, nb::handle team, nb::handle stream) {
        issue(plan_collective(Rma::kFcollect, heap_of(hot_runtime()), -1, dest, src, nb::none(), team, stream));
    }, nb::arg("dest").none(), nb::arg("src").none(), nb::arg("team").none() = none, nb::arg("stream").none() = none,
       nb::sig("def fcollect(dest: mpbind.typing.Array, src: mpbind.typing.Array, team: Team | None = None, "
               "stream: mpbind.typing.Stream = None) -> None"),
       "Concatenate every member's `src` into `dest`, in team order (collective over `team`; "
       "``nvshmemx_fcollectmem_on_stream``).\n`dest` holds team-size times `src`'s elements.");
    m.def("alltoall", [](nb::handle dest, nb::handle src, nb::handle team, nb::handle stream) {
        issue(plan_collective(Rma::kAlltoall, heap_of(hot_runtime()), -1, dest, src, nb::none(), team, stream));
    }, nb::arg("dest").none(), nb::arg("src").none(), nb::arg("team").none() = none, nb::arg("stream").none() = none,
       nb::sig("def alltoall(dest: mpbind.typing.Array, src: mpbind.typing.Array, team: Team | None = None, "
               "stream: mpbind.typing.Stream = None) -> None"),
       "Block j of `src` goes to member j, into block i of its `dest` (i: this PE); both hold team-size equal "
       "blocks (collective over `team`; ``nvshmemx_alltoallmem_on_stream``).");
    m.def("reduce", [](nb::handle op, nb::handle dest, nb::handle src, nb::handle team, nb::handle stream) {
        int o = reduce_op(op);  // before the runtime: an unknown op is wrong everywhere
        issue(plan_collective(Rma::kReduce, heap_of(hot_runtime()), o, dest, src, nb::none(), team, stream));
    }, nb::arg("op").none(), nb::arg("dest").none(), nb::arg("src").none(), nb::arg("team").none() = none,
       nb::arg("stream").none() = none,
       nb::sig("def reduce(op: str, dest: mpbind.typing.Array, src: mpbind.typing.Array, team: Team | None = None, "
               "stream: mpbind.typing.Stream = None) -> None"),
       "Element-wise reduction of every member's `src` into `dest` on all members (collective over `team`; "
       "``nvshmemx_<type>_<op>_reduce_on_stream``).\n`op`: sum, prod, min, max for integer and float dtypes; "
       "and, or, xor for integers.");

    m.def("set_deadline", [](nb::handle timeout, nb::handle watchdog) {
        double t = timeout_arg(timeout, "timeout");
        bool watched = watchdog_arg(watchdog, "watchdog");
        fence().set_timeout(t);
        if (watched && g_pe_watch.load() == nullptr) {
            RuntimeState& rt = hot_runtime();
            static std::shared_ptr<PeWatch>* keep = nullptr;  // one runtime per process: never released
            keep = new std::shared_ptr<PeWatch>(std::make_shared<PeWatch>(rt.pe, rt.npes, t));
            g_pe_watch.store(keep->get());
            watch::watch(*keep);
        }
        return g_pe_watch.load() != nullptr;
    }, nb::arg("timeout").none(), nb::arg("watchdog").none(),
       nb::sig("def set_deadline(timeout: float | None, watchdog: bool | None) -> bool"),
       "The deadline (seconds; None: MPBIND_TIMEOUT, else 600) of this PE's waits for its collectives on streams, and, "
       "with `watchdog` (None: MPBIND_WATCHDOG), the watchdog over them from now on: one past the deadline ends the "
       "process with a report on stderr (NVSHMEM cannot abort it). Whether watched.");
    m.def("recent_operations", [] {
        PeWatch* w = g_pe_watch.load();
        return w ? watch::describe(w->recent()) : nb::list();
    }, nb::sig("def recent_operations() -> list[dict[str, typing.Any]]"));  // documented by mpbind.nvshmem's

    nb::module_ testing = nb::borrow<nb::module_>(parent.attr("_testing"));
    testing.def("fence_streams", [] { return fence().streams(); },
                "Streams whose on-stream NVSHMEM collectives the next host-side collective waits for.");
    testing.def("nvshmem_plan_ns", [](const std::string& name, nb::tuple args, size_t n) {
        auto arg = [&](size_t i) -> nb::handle { return i < nb::len(args) ? nb::handle(args[i]) : nb::none(); };
        bool put = name == "put";
        if (!put && name != "quiet") raise_usage("nvshmem_plan_ns: put or quiet, not " + name);
        uintptr_t sink = 0;
        double ns = ns_per_call(n, [&] {
            Step k = put ? plan_rma(Rma::kPut, heap_of(hot_runtime()), arg(0), arg(1), arg(2), arg(3))
                         : plan_sync(Rma::kQuiet, heap_of(hot_runtime()), nb::none(), arg(0));
            sink ^= k.dest ^ k.stream;
        });
        (void)sink;
        return ns;
    }, nb::arg("name"), nb::arg("args"), nb::arg("n"),
       "Nanoseconds per planning of mpbind.nvshmem.<name>(*args) (put or quiet) in C++ against the live runtime, "
       "n times, without the library call: the layer's own cost of the hot call.");
    testing.def("nvshmem_plan", [](const std::string& name, nb::tuple args, int npes, bool limited,
                                   std::vector<std::pair<uintptr_t, size_t>> heap) {
        if (npes < 1) raise_usage("nvshmem_plan: npes must be >= 1, got " + std::to_string(npes));
        Heap h;
        h.npes = npes;
        h.limited = limited;
        h.ranges = std::move(heap);
        auto arg = [&](size_t i) -> nb::handle { return i < nb::len(args) ? nb::handle(args[i]) : nb::none(); };
        if (name == "put" || name == "get") {
            return describe_step(plan_rma(name == "put" ? Rma::kPut : Rma::kGet, h, arg(0), arg(1), arg(2), arg(3)));
        }
        if (name == "quiet") return describe_step(plan_sync(Rma::kQuiet, h, nb::none(), arg(0)));
        if (name == "barrier") return describe_step(plan_sync(Rma::kBarrier, h, arg(0), arg(1)));
        if (name == "broadcast") {
            return describe_step(plan_collective(Rma::kBroadcast, h, -1, arg(0), arg(1), arg(2), arg(3), arg(4)));
        }
        if (name == "fcollect" || name == "alltoall") {
            return describe_step(plan_collective(name == "fcollect" ? Rma::kFcollect : Rma::kAlltoall, h, -1, arg(0),
                                                 arg(1), nb::none(), arg(2), arg(3)));
        }
        if (name == "reduce") {
            int o = reduce_op(arg(0));
            return describe_step(plan_collective(Rma::kReduce, h, o, arg(1), arg(2), nb::none(), arg(3), arg(4)));
        }
        raise_usage("no NVSHMEM operation named " + name);
    }, nb::arg("name"), nb::arg("args"), nb::arg("npes"), nb::arg("limited") = false,
       nb::arg("heap") = std::vector<std::pair<uintptr_t, size_t>>(),
       "The checks of mpbind.nvshmem.<name>(*args) against a runtime of `npes` PEs whose symmetric heap holds the "
       "(ptr, nbytes) ranges `heap`, without NVSHMEM: (kind, team, dest, src, n, pe, stream, reduce function).");

    m.def("allocate", &allocate, nb::arg("nbytes"), nb::arg("zero") = false, nb::arg("alignment") = 0,
          "nvshmem_malloc, nvshmem_calloc (zero=True) or nvshmem_align (alignment > 0). Collective.");
    // runtime(), my_pe(), n_pes() and is_finalized() are documented by mpbind.nvshmem's wrappers.
    m.def("runtime", [] { return Runtime(current()); });
    // The facade's my_pe() and n_pes(): without making a Runtime object per call.
    m.def("my_pe", [] { return hot_runtime().pe; });
    m.def("n_pes", [] { return hot_runtime().npes; });
    m.def("is_initialized", [] {
        Global& g = global();
        Lock l = lock(g.mu);
        return g.runtime != nullptr && !g.runtime->closed();
    });
    m.def("is_finalized", [] {
        Global& g = global();
        Lock l = lock(g.mu);
        return g.finalized;
    });
    m.def("containing", [](uintptr_t ptr, size_t nbytes) -> nb::object {
        std::shared_ptr<RuntimeState> rt = current();
        auto s = rt->containing(ptr, nbytes == 0 ? 1 : nbytes);
        if (!s) return nb::none();
        return describe_allocation(*s);
    }, nb::arg("ptr"), nb::arg("nbytes"), nb::sig("def containing(ptr: int, nbytes: int) -> dict[str, int] | None"),
          "The live allocation holding [ptr, ptr + nbytes) as a dict (ptr, nbytes, serial, references), or None.");
    m.def("allocations", [] {
        nb::list out;
        for (auto& s : current()->live_allocations()) out.append(describe_allocation(*s));
        return out;
    }, nb::sig("def allocations() -> list[dict[str, int]]"), "Live symmetric allocations (also those queued for release), oldest first.");
}

}  // namespace mpbind
