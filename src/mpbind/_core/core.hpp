// The machinery every library object of mpbind._core shares.
//
// * State: one library resource (a communicator, a grid, a registration, ...).
//   It is released exactly once, after its children; it keeps alive the states
//   it depends on. Python never sees a State directly.
// * Lifetime: the row of the lifetime table (lifetimes.cpp) that a State looks
//   up by its kind: what happens when its last reference goes away unreleased
//   (released at once, queued for a collective drain, left to its owner, never),
//   whether its release is collective, and which kind releases it first.
// * Ref<S>: one Python object's reference on a State. A state may have several
//   (a cached grid returned twice); close() on any releases the state.
// * RegistrationRef: one counted reference on a registration of (owner,
//   pointer, size); close() drops that reference, the last one deregisters.
// * The teardown queue: collective releases of dropped objects, which every
//   rank drains in the same (reverse creation) order.
// * Library calls go through the function tables of capi.hpp and bindings/_core_abi/<lib>.hpp.
//
// Locking rule: a core mutex is never waited for while holding the GIL (see
// lock()), so a thread holding one may take the GIL to raise or warn.

#pragma once

#include <nanobind/nanobind.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
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
[[noreturn]] void raise_overflow(const std::string& message);  // OverflowError: a size beyond 64 bits
// Raises the generated per-status error of `library` (via mpbind.bindings.<library>._raise_status).
[[noreturn]] void raise_status(const char* library, int status, const char* function);
// Raises the error of `status` from `function` with our own description
// (for failures the library reports as success, e.g. a NULL handle).
[[noreturn]] void raise_library_error(const char* library, const char* function, int status,
                                      const std::string& description);
void warn_resource(const std::string& message);

// ---------------------------------------------------------------------------
// Checked size arithmetic: every size or address the core computes from a caller's values
// ---------------------------------------------------------------------------

// a * b and a + b over 64-bit integers (int64_t, uint64_t, long long, size_t): OverflowError naming
// `what` ("sendbuf's byte size") instead of a wrapped result. Inline: one flag test when they fit.
namespace detail {
[[noreturn]] void raise_arithmetic_overflow(const char* what, const char* op, const std::string& a,
                                            const std::string& b, bool is_signed);
template <class T>
[[noreturn]] void overflowed(const char* what, const char* op, T a, T b) {
    static_assert(std::is_integral_v<T> && sizeof(T) == 8, "checked arithmetic takes 64-bit integers");
    raise_arithmetic_overflow(what, op, std::to_string(a), std::to_string(b), std::is_signed_v<T>);
}
}  // namespace detail

template <class T>
inline T checked_mul(T a, T b, const char* what) {
    T out;
    if (__builtin_mul_overflow(a, b, &out)) detail::overflowed(what, "*", a, b);
    return out;
}

template <class T>
inline T checked_add(T a, T b, const char* what) {
    T out;
    if (__builtin_add_overflow(a, b, &out)) detail::overflowed(what, "+", a, b);
    return out;
}

// Whether [ptr, ptr + nbytes) lies in [base, base + size), computed without forming an end address
// (which could wrap past 2**64 and make a far range look inside).
inline bool span_within(uintptr_t ptr, uint64_t nbytes, uintptr_t base, uint64_t size) {
    return ptr >= base && ptr - base <= size && nbytes <= size - (ptr - base);
}

// Nanoseconds per call of `step` over `n` calls: the timing loop of the test hooks that measure
// the core's own costs (_testing.*_ns).
template <class Step>
double ns_per_call(size_t n, Step&& step) {
    auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < n; ++i) step();
    auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(n ? n : 1);
}

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
// The lifetime table (one row per object kind; the rows are in lifetimes.cpp)
// ---------------------------------------------------------------------------

// What happens when the last reference on an object goes away without close().
enum class Drop {
    kAtOnce,                // a local release, run now (also from the garbage collector)
    kQueued,                // collective, or waiting for the device (a kernel library): warn
                            // ResourceWarning and wait in the teardown queue until drain() or
                            // finalize() runs on every rank
    kQueuedOnceCollective,  // kAtOnce until the object holds something collective
                            // (State::became_collective()), kQueued from then on
    kByOwner,               // nothing: its owner releases it (a cached grid: its communicator)
    kNever,                 // nothing: only an explicit close() releases it (the NVSHMEM runtime)
    kByParts,               // nothing of its own: its references on its parts go, and each part
                            // follows its own row (a composite plan)
};

struct Lifetime {
    const char* kind;     // "nccl.Communicator": the name in messages and in queued()
    Drop drop;
    bool collective;      // its release is collective: every rank releases it together
    const char* parent;   // the kind whose close() releases it first ("" for none)
    const char* release;  // what releases it
};

// The row of `kind`; a kind missing from the table is a programming error (std::logic_error).
const Lifetime& lifetime(const char* kind);
// Every row of the library objects, in table order (the test doubles of _testing are not listed).
const std::vector<Lifetime>& lifetimes();
const char* drop_name(Drop drop);  // "at_once", "queued", ... as lifetimes() reports them

// ---------------------------------------------------------------------------
// State and Ref
// ---------------------------------------------------------------------------

class State : public std::enable_shared_from_this<State> {
public:
    // `kind` names the row of the lifetime table that says how it is dropped and released.
    explicit State(const char* kind);
    virtual ~State();
    State(const State&) = delete;
    State& operator=(const State&) = delete;

    std::string kind() const { return lifetime_.kind; }
    uint64_t serial() const { return serial_; }
    bool closed();
    // close() has begun (or ended): read by the core's launches without the GIL, which refuse a state
    // being released (launch.hpp; the collective fence orders the release after a launch under way).
    bool releasing() const { return releasing_.load(std::memory_order_acquire); }

    // Raise UsageError if released.
    void check_open();

    // Release children (newest first), queued items under this state, then
    // this state. Idempotent. Needs the GIL.
    void close();

    // From now on its release is collective (kQueuedOnceCollective: a cuFFTMp plan once a
    // communicator is attached, a reshape once made).
    void became_collective() { holds_collective_ = true; }

    // `child` is released before this state; the table names this state's kind as the child's
    // parent. The child keeps this state alive through `depends_on` (or through its refs),
    // never the other way round.
    void add_child(const std::shared_ptr<State>& child);
    void depends_on(std::shared_ptr<State> parent);
    State* parent() const { return parent_; }
    bool descends_from(const State* ancestor) const;

    // Reference accounting (GIL held).
    void ref_acquired();
    // The last reference gone without close(): what the table's Drop says.
    void ref_dropped();
    // A reference released by close(): the last one closes the state (no warning).
    void ref_closed();
    int refs() const { return refs_.load(); }

    // For the states a registry or cache hands out.
    Mutex& mutex() { return mu_; }

protected:
    // The library call that frees the resource; runs once, GIL held (it may
    // release it around the call).
    virtual void release() = 0;
    friend void unqueue(State* s);
    friend size_t drain_queue(const State* owner);

private:
    void queue_for_teardown();

    const Lifetime& lifetime_;
    uint64_t serial_;
    Mutex mu_;
    // Written under mu_, read without it: closed() is on every hot call's path, and once set it
    // stays set, so a reader sees either the state as it was before close() or closed.
    std::atomic<bool> closed_{false};
    std::atomic<bool> releasing_{false};  // set with closing_ and never cleared
    bool closing_ = false;
    bool queued_ = false;
    bool holds_collective_ = false;
    std::atomic<int> refs_{0};
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
// Every state not yet released (referenced or queued): (kind, serial), oldest first.
std::vector<std::pair<std::string, uint64_t>> alive();

// A composite: the object of a plan made of several owned objects (an FFT plan's cuFFTMp plan, a
// reshape's handle and symmetric buffers, a planned matmul's handle, communicator, matrices and
// matmul). close() closes its parts newest first (the reverse of the order given), once, and raises
// the first error after every part was closed; dropped unclosed, it releases nothing of its own:
// its references on the parts go, and each part follows its own row.
class CompositeState : public State {
public:
    CompositeState(std::vector<nb::object> parts, std::string what);
    ~CompositeState() override;
    const std::string what;
    // The parts, oldest first.
    std::vector<nb::object> parts() const;

protected:
    void release() override;

private:
    std::vector<nb::object> parts_;
};

// One Python object's reference on a state: what nanobind binds as each library object.
template <class S>
class Ref {
public:
    explicit Ref(std::shared_ptr<S> state) : state_(std::move(state)) { state_->ref_acquired(); }
    Ref(Ref&& other) noexcept : state_(std::move(other.state_)) {}
    Ref(const Ref&) = delete;
    Ref& operator=(const Ref&) = delete;
    ~Ref() {
        if (state_) state_->ref_dropped();
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

// The stub signatures of every core context manager (nanobind would leave `*args` untyped).
inline constexpr const char* kEnterSig = "def __enter__(self) -> typing_extensions.Self";
inline constexpr const char* kExitSig = "def __exit__(self, *args: object) -> None";

// copy.copy, copy.deepcopy and pickle of an object that owns a library resource: TypeError. A copy
// would share the resource, so closing either would release it under the other; the object itself
// is what to pass around (the layer's Owned facades refuse the same way).
[[noreturn]] void refuse_copy(nb::handle self, const char* how);
template <class C>
void refuse_copies(C& cls) {
    cls.def("__copy__", [](nb::handle self) { refuse_copy(self, "copy"); },
            nb::sig("def __copy__(self) -> typing.NoReturn"))
        .def("__deepcopy__", [](nb::handle self, nb::handle) { refuse_copy(self, "copy"); },
             nb::sig("def __deepcopy__(self, memo: object) -> typing.NoReturn"))
        .def("__reduce_ex__", [](nb::handle self, nb::handle) { refuse_copy(self, "pickle"); },
             nb::sig("def __reduce_ex__(self, protocol: object) -> typing.NoReturn"))
        .def("__reduce__", [](nb::handle self) { refuse_copy(self, "pickle"); },
             nb::sig("def __reduce__(self) -> typing.NoReturn"));
}

// __enter__/__exit__/close/closed/serial on a bound Ref class, which refuses copies.
template <class R, class... Extra>
void bind_lifetime(nb::class_<R, Extra...>& cls, const char* close_doc) {
    refuse_copies(cls);
    cls.def("close", [](R& r) { r.close(); }, close_doc)
        .def_prop_ro("closed", [](R& r) { return r.closed(); }, "True once released.")
        .def_prop_ro("serial", [](R& r) { return r.state()->serial(); },
                     "Creation order in this process; the teardown queue runs newest first.")
        .def("__enter__", [](nb::handle self) { return nb::borrow(self); }, nb::sig(kEnterSig))
        .def("__exit__", [](R& r, nb::args) { r.close(); }, nb::sig(kExitSig));
}

// A read-only `ptr` (the library's C object as an int, for the flat bindings) and `handle`,
// its earlier name, kept as an alias. `doc` nullptr: a facade of the layer documents them.
template <class R, class... Extra, class Get>
void bind_c_pointer(nb::class_<R, Extra...>& cls, Get get, const char* doc) {
    auto as_int = [get](R& r) { return reinterpret_cast<uintptr_t>(get(r)); };
    if (doc == nullptr) {
        cls.def_prop_ro("ptr", as_int).def_prop_ro("handle", as_int);
    } else {
        cls.def_prop_ro("ptr", as_int, doc).def_prop_ro("handle", as_int, "Alias of ptr.");
    }
}

// ---------------------------------------------------------------------------
// Registry: reference-counted registrations keyed by (pointer, size) per owner
// ---------------------------------------------------------------------------

// One live registration with the library. RegistrationRefs are the references.
class RegistrationState : public State {
public:
    RegistrationState(const char* kind, uintptr_t ptr, size_t size, nb::object buffer)
        : State(kind), ptr(ptr), size(size), buffer(std::move(buffer)) {}
    ~RegistrationState() override;
    // The library part of the kind ("nccl" for "nccl.Window").
    std::string library() const;
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

// One counted reference on a registration; close() drops this reference only.
class RegistrationRef {
public:
    explicit RegistrationRef(std::shared_ptr<RegistrationState> s) : state_(std::move(s)) {
        state_->ref_acquired();
    }
    RegistrationRef(RegistrationRef&& o) noexcept : state_(std::move(o.state_)), closed_(o.closed_) {}
    ~RegistrationRef() {
        if (state_ && !closed_) state_->ref_dropped();
    }
    void close();
    bool closed() const { return closed_ || state_->closed(); }
    const RegistrationState& get() const;
    const std::shared_ptr<RegistrationState>& state() const { return state_; }

private:
    std::shared_ptr<RegistrationState> state_;
    bool closed_ = false;
};

// UsageError: [ptr, ptr + size) passes the end of the address space.
[[noreturn]] void refuse_wrapping_range(uintptr_t ptr, size_t size);

class Registry {
public:
    using Key = std::pair<uintptr_t, size_t>;
    // A new reference on the live registration of (ptr, size), made with
    // `make` (which calls the library) if there is none. `owner` becomes its parent.
    template <class Make>
    RegistrationRef acquire(State& owner, uintptr_t ptr, size_t size, Make&& make) {
        if (size > UINTPTR_MAX - ptr) refuse_wrapping_range(ptr, size);
        Lock l = lock(owner.mutex());
        owner.check_open();
        auto it = live_.find({ptr, size});
        if (it != live_.end()) {
            if (auto s = it->second.lock(); s && !s->closed()) return RegistrationRef(s);
        }
        std::shared_ptr<RegistrationState> s = make();
        s->owner_serial = owner.serial();
        s->depends_on(owner.shared_from_this());
        owner.add_child(s);
        live_[{ptr, size}] = s;
        track(s);
        return RegistrationRef(s);
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
// Arguments of public bindings: a wrong one is a TypeError or UsageError naming it
// ---------------------------------------------------------------------------

// The Python type name of `value`, for messages.
std::string py_type_name(nb::handle value);
// An int (not a bool) in [lo, hi]: TypeError naming `what` otherwise, UsageError when out of range.
long long int_arg(nb::handle value, const char* what, long long lo, long long hi);
// An int (not a bool) in [lo, 2**64): a size or a handle.
uint64_t uint_arg(nb::handle value, const char* what, uint64_t lo = 0);
// `value` as a bound object of type T (a Ref), or TypeError naming `what` and `expected`.
template <class T>
T& object_arg(nb::handle value, const char* what, const char* expected) {
    T* p = nullptr;
    if (!nb::try_cast<T*>(value, p) || p == nullptr) {
        raise_type(std::string(what) + " must be " + expected + ", not " + py_type_name(value));
    }
    return *p;
}

// ---------------------------------------------------------------------------
// Pointers and streams from Python objects
// ---------------------------------------------------------------------------

// An int, or an object with __cuda_stream__ (protocol), .cuda_stream (PyTorch)
// or .ptr (CuPy); None is the default stream (0). (arrays.cpp, with the arrays of hot calls.)
uintptr_t stream_handle(nb::handle obj);

}  // namespace mpbind
