// The machinery every library object of mpbind._core shares.
//
// * State: one library resource (a communicator, a grid, a registration, ...).
//   It is released exactly once, after its children; it keeps alive the states
//   it depends on. Python never sees a State directly.
// * Handle<S>: the Python object over a State. A state may have several handles
//   (a cached grid returned twice, a registration made twice). When the last
//   handle goes away unreleased, the state either releases itself (a local
//   free) or, when its release is collective, warns and waits in the teardown
//   queue, which every rank drains in the same (reverse creation) order.
// * Registry: reference-counted registrations of (owner, pointer, size).
// * Library calls go through the function tables of capi.hpp and abi/<lib>.hpp.
//
// Locking rule: a core mutex is never waited for while holding the GIL (see
// lock()), so a thread holding one may take the GIL to raise or warn.

#pragma once

#include <nanobind/nanobind.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;

namespace mpbind {

// ---------------------------------------------------------------------------
// Errors (the classes of mpbind.errors; messages say what was wrong)
// ---------------------------------------------------------------------------

[[noreturn]] void raise_usage(const std::string& message);
[[noreturn]] void raise_type(const std::string& message);
[[noreturn]] void raise_mpbind(const std::string& message);  // MpbindError (e.g. a CUDA driver failure)
// Raises the generated per-status error of `library` (via mpbind.bindings.<library>._raise_status).
[[noreturn]] void raise_status(const char* library, int status, const char* function);
// Raises the error of `status` from `function` with our own description
// (for failures the library reports as success, e.g. a NULL handle).
[[noreturn]] void raise_library_error(const char* library, const char* function, int status,
                                      const std::string& description);
void warn_resource(const std::string& message);

// ---------------------------------------------------------------------------
// Locks
// ---------------------------------------------------------------------------

using Mutex = std::recursive_mutex;
using Lock = std::unique_lock<Mutex>;

// Take `m`, dropping the GIL while waiting for it (a holder may need the GIL).
inline Lock lock(Mutex& m) {
    Lock l(m, std::try_to_lock);
    if (!l.owns_lock()) {
        if (PyGILState_Check()) {
            nb::gil_scoped_release release;
            l.lock();
        } else {
            l.lock();
        }
    }
    return l;
}

// True once the interpreter is shutting down: nothing collective runs then.
bool exiting();
void mark_exiting();

// ---------------------------------------------------------------------------
// State and Handle
// ---------------------------------------------------------------------------

class State : public std::enable_shared_from_this<State> {
public:
    // `kind` names the object in messages ("nccl.Communicator"). A collective
    // state is released by every rank together, so never by the garbage collector.
    State(std::string kind, bool collective);
    virtual ~State();
    State(const State&) = delete;
    State& operator=(const State&) = delete;

    const std::string& kind() const { return kind_; }
    uint64_t serial() const { return serial_; }
    bool collective() const { return collective_; }
    bool closed();

    // Raise UsageError if released.
    void check_open();

    // Release children (newest first), queued items under this state, then
    // this state. Idempotent. Needs the GIL.
    void close();

    // `child` is released before this state. The child keeps this state alive
    // through `depends_on` (or through its handles), never the other way round.
    void add_child(const std::shared_ptr<State>& child);
    void depends_on(std::shared_ptr<State> parent);
    State* parent() const { return parent_; }
    bool descends_from(const State* ancestor) const;

    // Handle accounting (GIL held).
    void handle_acquired();
    void handle_dropped();
    // A handle released by close(): the last one closes the state (no warning).
    void handle_closed();
    int handles() const { return handles_.load(); }

    // For the handle-less states a registry or cache hands out.
    Mutex& mutex() { return mu_; }

protected:
    // The library call that frees the resource; runs once, GIL held (it may
    // release it around the call).
    virtual void release() = 0;
    // Called when the last handle went away without close(). The default:
    // a collective state warns and waits in the teardown queue, a local one
    // is released now.
    virtual void unreferenced();
    void queue_for_teardown(bool warn);
    friend void unqueue(State* s);
    friend size_t drain_queue(const State* owner);

private:
    std::string kind_;
    uint64_t serial_;
    bool collective_;
    Mutex mu_;
    bool closed_ = false;
    bool closing_ = false;
    bool queued_ = false;
    std::atomic<int> handles_{0};
    std::vector<std::weak_ptr<State>> children_;
    State* parent_ = nullptr;  // for draining; kept valid by deps_
    std::vector<std::shared_ptr<State>> deps_;
};

// Take `s` out of the teardown queue (it is closing, or referenced again).
void unqueue(State* s);

// Run the queued collective releases (all, or those under `owner`), newest
// first. Returns how many ran. Needs the GIL.
size_t drain_queue(const State* owner);
// gc.collect(): before an explicit drain, so that objects dropped in reference cycles are
// queued on every rank alike.
void collect_garbage();
// Python-facing description of what is queued: [(kind, serial)].
std::vector<std::pair<std::string, uint64_t>> queued();

template <class S>
class Handle {
public:
    explicit Handle(std::shared_ptr<S> state) : state_(std::move(state)) { state_->handle_acquired(); }
    Handle(Handle&& other) noexcept : state_(std::move(other.state_)) {}
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    ~Handle() {
        if (state_) state_->handle_dropped();
    }

    // The state, checked open.
    S& get() const {
        state_->check_open();
        return *state_;
    }
    const std::shared_ptr<S>& state() const { return state_; }
    void close() { state_->close(); }
    bool closed() const { return state_->closed(); }

private:
    std::shared_ptr<S> state_;
};

// __enter__/__exit__/close/closed/serial on a bound Handle class.
template <class H, class... Extra>
void bind_lifetime(nb::class_<H, Extra...>& cls, const char* close_doc) {
    cls.def("close", [](H& h) { h.close(); }, close_doc)
        .def_prop_ro("closed", [](H& h) { return h.closed(); }, "True once released.")
        .def_prop_ro("serial", [](H& h) { return h.state()->serial(); },
                     "Creation order in this process; the teardown queue runs newest first.")
        .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
        .def("__exit__", [](H& h, nb::args) { h.close(); });
}

// ---------------------------------------------------------------------------
// Registry: reference-counted registrations keyed by (pointer, size) per owner
// ---------------------------------------------------------------------------

// One live registration with the library. Handles are the references.
class RegistrationState : public State {
public:
    RegistrationState(std::string kind, bool collective, std::string library, uintptr_t ptr,
                      size_t size, nb::object buffer)
        : State(std::move(kind), collective), library(std::move(library)), ptr(ptr), size(size),
          buffer(std::move(buffer)) {}
    ~RegistrationState() override;
    const std::string library;
    const uintptr_t ptr;
    const size_t size;
    nb::object buffer;  // kept alive while registered
    // The library's handle of the registration (a window, a registration handle), or 0.
    uintptr_t lib_handle = 0;
    uintptr_t owner_serial = 0;

protected:
    void release() override;
    virtual void deregister() = 0;
};

// A reference on a registration; close() drops this reference only.
class Registration {
public:
    explicit Registration(std::shared_ptr<RegistrationState> s) : state_(std::move(s)) {
        state_->handle_acquired();
    }
    Registration(Registration&& o) noexcept : state_(std::move(o.state_)), closed_(o.closed_) {}
    ~Registration() {
        if (state_ && !closed_) state_->handle_dropped();
    }
    void close();
    bool closed() const { return closed_ || state_->closed(); }
    const RegistrationState& get() const;
    const std::shared_ptr<RegistrationState>& state() const { return state_; }

private:
    std::shared_ptr<RegistrationState> state_;
    bool closed_ = false;
};

class Registry {
public:
    using Key = std::pair<uintptr_t, size_t>;
    // A new reference on the live registration of (ptr, size), made with
    // `make` (which calls the library) if there is none. `owner` becomes its parent.
    template <class Make>
    Registration acquire(State& owner, uintptr_t ptr, size_t size, Make&& make) {
        Lock l = lock(owner.mutex());
        owner.check_open();
        auto it = live_.find({ptr, size});
        if (it != live_.end()) {
            if (auto s = it->second.lock(); s && !s->closed()) return Registration(s);
        }
        std::shared_ptr<RegistrationState> s = make();
        s->owner_serial = owner.serial();
        s->depends_on(owner.shared_from_this());
        owner.add_child(s);
        live_[{ptr, size}] = s;
        track(s);
        return Registration(s);
    }
    std::vector<std::shared_ptr<RegistrationState>> live();

private:
    static void track(const std::shared_ptr<RegistrationState>& s);
    std::map<Key, std::weak_ptr<RegistrationState>> live_;
};

// Every registration alive in the process, for registrations().
std::vector<std::shared_ptr<RegistrationState>> all_registrations();

// A registration as Python sees it: library, kind, owner serial, ptr, size, references, handle, serial.
nb::dict describe(const RegistrationState& s);
nb::list describe(const std::vector<std::shared_ptr<RegistrationState>>& live);

// ---------------------------------------------------------------------------
// Cache: shared states by key (the cuBLASMp grid cache), with hit counts
// ---------------------------------------------------------------------------

struct CacheInfo {
    size_t entries, hits, misses;
};
nb::dict describe(const CacheInfo& info);  // {"entries", "hits", "misses"}

template <class Key, class S>
class Cache {
public:
    // The cached open state for `key`, or a new one from `make()` (called with
    // the cache locked, so concurrent misses on one key make one state).
    template <class Make>
    std::shared_ptr<S> get(const Key& key, Make&& make) {
        Lock l = lock(mu_);
        auto it = map_.find(key);
        if (it != map_.end() && !it->second->closed()) {
            ++hits_;
            return it->second;
        }
        ++misses_;
        std::shared_ptr<S> s = make();
        map_[key] = s;
        return s;
    }
    // Forget `s` (it was released); returns whether it was cached.
    bool erase(const S* s) {
        Lock l = lock(mu_);
        for (auto it = map_.begin(); it != map_.end(); ++it) {
            if (it->second.get() == s) {
                std::shared_ptr<S> keep = std::move(it->second);
                map_.erase(it);
                l.unlock();
                return true;
            }
        }
        return false;
    }
    CacheInfo info() {
        Lock l = lock(mu_);
        return {map_.size(), hits_, misses_};
    }
    std::vector<std::shared_ptr<S>> entries() {
        Lock l = lock(mu_);
        std::vector<std::shared_ptr<S>> out;
        for (auto& kv : map_) out.push_back(kv.second);
        return out;
    }

private:
    Mutex mu_;
    std::map<Key, std::shared_ptr<S>> map_;
    size_t hits_ = 0, misses_ = 0;
};

// ---------------------------------------------------------------------------
// Pointers and streams from Python objects
// ---------------------------------------------------------------------------

// An int, or an object with __cuda_stream__ (protocol), .cuda_stream (PyTorch)
// or .ptr (CuPy); None is the default stream (0).
uintptr_t stream_handle(nb::handle obj);

void register_core(nb::module_& m);

}  // namespace mpbind
