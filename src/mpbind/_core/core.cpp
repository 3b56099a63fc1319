// Shared machinery of mpbind._core: errors, states and their
// drop policies, the teardown queue and the registration registry (see core.hpp).

#include "core.hpp"

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>

namespace mpbind {

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

namespace {

[[noreturn]] void raise_from(const char* class_name, const std::string& message) {
    nb::object cls = nb::module_::import_("mpbind.errors").attr(class_name);
    PyErr_SetString(cls.ptr(), message.c_str());
    throw nb::python_error();
}

std::atomic<bool> g_exiting{false};
std::atomic<uint64_t> g_serial{0};

}  // namespace

void raise_usage(const std::string& message) { raise_from("UsageError", message); }

void raise_mpbind(const std::string& message) { raise_from("MpbindError", message); }

void raise_type(const std::string& message) {
    PyErr_SetString(PyExc_TypeError, message.c_str());
    throw nb::python_error();
}

void raise_overflow(const std::string& message) {
    PyErr_SetString(PyExc_OverflowError, message.c_str());
    throw nb::python_error();
}

void refuse_copy(nb::handle self, const char* how) {
    // The class as the lifetime table names kinds: "nvshmem.Team" (module mpbind._core.nvshmem). Not
    // tp_name, which nanobind makes the full dotted path.
    nb::handle type = self.type();
    std::string name = nb::cast<std::string>(nb::str(type.attr("__name__")));
    nb::object module = nb::getattr(type, "__module__", nb::none());
    const std::string prefix = "mpbind._core.";
    if (nb::isinstance<nb::str>(module)) {
        std::string m = nb::cast<std::string>(module);
        if (m.compare(0, prefix.size(), prefix) == 0) name = m.substr(prefix.size()) + "." + name;
    }
    if (std::strcmp(how, "pickle") == 0) {
        raise_type("cannot pickle " + name + ": it owns a library resource of this process, which cannot be "
                   "saved or sent to another");
    }
    raise_type("cannot " + std::string(how) + " " + name + ": it owns a library resource, which close() releases "
               "once; pass the object itself (a copy would share the resource, and closing either would release "
               "it under the other)");
}

void refuse_wrapping_range(uintptr_t ptr, size_t size) {
    raise_usage("cannot register " + std::to_string(size) + " bytes at " + std::to_string(ptr) +
                ": the range passes the end of the address space (2**64)");
}

namespace detail {

void raise_arithmetic_overflow(const char* what, const char* op, const std::string& a, const std::string& b,
                               bool is_signed) {
    raise_overflow(std::string(what) + " overflows: " + a + " " + op + " " + b + " does not fit in " +
                   (is_signed ? "a signed 64-bit integer (at most 2**63 - 1)" : "64 bits (at most 2**64 - 1)"));
}

}  // namespace detail

void raise_status(const char* library, int status, const char* function) {
    std::string module = std::string("mpbind.bindings.") + library;
    nb::module_::import_(module.c_str()).attr("_raise_status")(status, function);
    // _raise_status always raises; reaching here means it did not.
    raise_from("MpbindError", std::string(function) + " failed with status " + std::to_string(status));
}

void raise_library_error(const char* library, const char* function, int status,
                         const std::string& description) {
    nb::object err = nb::module_::import_("mpbind.bindings._status")
                         .attr("make_error")(library, function, status, description);
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
    throw nb::python_error();
}

void warn_resource(const std::string& message) {
    if (PyErr_WarnEx(PyExc_ResourceWarning, message.c_str(), 1) != 0) {
        // Warnings turned into errors: a destructor cannot raise, so report it.
        PyErr_WriteUnraisable(nullptr);
    }
}

void mark_exiting() { g_exiting.store(true); }

bool exiting() { return g_exiting.load() || !Py_IsInitialized(); }

// ---------------------------------------------------------------------------
// The teardown queue
// ---------------------------------------------------------------------------

namespace {

struct TeardownQueue {
    Mutex mu;
    std::vector<std::shared_ptr<State>> items;
};

TeardownQueue& teardown_queue() {
    static TeardownQueue* q = new TeardownQueue();  // never destroyed: used at exit
    return *q;
}

}  // namespace

void unqueue(State* s) {
    std::shared_ptr<State> keep;
    TeardownQueue& q = teardown_queue();
    Lock l = lock(q.mu);
    if (!s->queued_) return;
    s->queued_ = false;
    auto it = std::find_if(q.items.begin(), q.items.end(),
                           [s](const std::shared_ptr<State>& p) { return p.get() == s; });
    if (it != q.items.end()) {
        keep = std::move(*it);
        q.items.erase(it);
    }
    l.unlock();
    // The caller holds its own reference, so `keep` is not the last one.
}

size_t drain_queue(const State* owner) {
    if (exiting()) return 0;
    size_t ran = 0;
    nb::object first_error;
    for (;;) {
        std::shared_ptr<State> item;
        {
            TeardownQueue& q = teardown_queue();
            Lock l = lock(q.mu);
            auto best = q.items.end();
            for (auto it = q.items.begin(); it != q.items.end(); ++it) {
                if (owner != nullptr && !(*it)->descends_from(owner)) continue;
                if (best == q.items.end() || (*it)->serial() > (*best)->serial()) best = it;
            }
            if (best == q.items.end()) break;
            item = std::move(*best);
            item->queued_ = false;
            q.items.erase(best);
        }
        try {
            item->close();
        } catch (nb::python_error& e) {
            // Keep draining: the other ranks do, and a skipped release would hang them.
            if (!first_error.is_valid()) first_error = nb::borrow(e.value());
        }
        ++ran;
    }
    if (first_error.is_valid()) {
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(first_error.ptr())), first_error.ptr());
        throw nb::python_error();
    }
    return ran;
}

void collect_garbage() { nb::module_::import_("gc").attr("collect")(); }

std::vector<std::pair<std::string, uint64_t>> queued() {
    TeardownQueue& q = teardown_queue();
    Lock l = lock(q.mu);
    std::vector<std::pair<std::string, uint64_t>> out;
    for (auto& s : q.items) out.emplace_back(s->kind(), s->serial());
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.second > b.second; });
    return out;
}

// ---------------------------------------------------------------------------
// Every state not yet released, for alive() and the report at exit
// ---------------------------------------------------------------------------

namespace {

struct AliveStates {
    std::mutex mu;  // never held while calling Python or waiting for the GIL
    std::map<uint64_t, const char*> kinds;  // serial -> kind (a string of the lifetime table)
};

AliveStates& alive_states() {
    static AliveStates* a = new AliveStates();  // never destroyed: used at exit
    return *a;
}

void forget_alive(uint64_t serial) {
    AliveStates& a = alive_states();
    std::lock_guard<std::mutex> g(a.mu);
    a.kinds.erase(serial);
}

}  // namespace

std::vector<std::pair<std::string, uint64_t>> alive() {
    AliveStates& a = alive_states();
    std::lock_guard<std::mutex> g(a.mu);
    std::vector<std::pair<std::string, uint64_t>> out;
    for (auto& [serial, kind] : a.kinds) out.emplace_back(kind, serial);
    return out;
}

// ---------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------

State::State(const char* kind) : lifetime_(mpbind::lifetime(kind)), serial_(++g_serial) {
    AliveStates& a = alive_states();
    std::lock_guard<std::mutex> g(a.mu);
    a.kinds[serial_] = lifetime_.kind;
}

State::~State() { forget_alive(serial_); }

bool State::closed() { return closed_.load(std::memory_order_acquire); }

void State::check_open() {
    if (closed()) raise_usage(kind() + " is closed");
}

void State::add_child(const std::shared_ptr<State>& child) {
    if (std::strcmp(child->lifetime_.parent, lifetime_.kind) != 0) {
        throw std::logic_error(child->kind() + " is released first by " +
                               (*child->lifetime_.parent ? child->lifetime_.parent : "nothing") +
                               " in the lifetime table, not by " + kind());
    }
    Lock l = lock(mu_);
    // Forget released children so a long-lived owner does not grow without bound.
    children_.erase(std::remove_if(children_.begin(), children_.end(),
                                   [](const std::weak_ptr<State>& w) { return w.expired(); }),
                    children_.end());
    children_.push_back(child);
    if (child->parent_ == nullptr) child->parent_ = this;
}

void State::depends_on(std::shared_ptr<State> parent) {
    if (parent_ == nullptr) parent_ = parent.get();
    deps_.push_back(std::move(parent));
}

bool State::descends_from(const State* ancestor) const {
    for (const State* p = parent_; p != nullptr; p = p->parent_) {
        if (p == ancestor) return true;
    }
    return false;
}

void State::close() {
    {
        Lock l = lock(mu_);
        if (closed_ || closing_) return;
        closing_ = true;
        releasing_.store(true, std::memory_order_seq_cst);
    }
    std::shared_ptr<State> self = shared_from_this();
    unqueue(this);
    nb::object first_error;
    auto remember = [&](nb::python_error& e) {
        if (!first_error.is_valid()) first_error = nb::borrow(e.value());
    };
    try {
        drain_queue(this);
    } catch (nb::python_error& e) {
        remember(e);
    }
    std::vector<std::shared_ptr<State>> kids;
    {
        Lock l = lock(mu_);
        for (auto& w : children_) {
            if (auto c = w.lock()) kids.push_back(std::move(c));
        }
        children_.clear();
    }
    std::sort(kids.begin(), kids.end(), [](auto& a, auto& b) { return a->serial() > b->serial(); });
    for (auto& c : kids) {
        try {
            c->close();
        } catch (nb::python_error& e) {
            remember(e);
        }
    }
    kids.clear();
    // Released once even when the library call fails: a second attempt would
    // be a double free, and the error says what happened.
    try {
        release();
    } catch (nb::python_error& e) {
        remember(e);
    }
    {
        Lock l = lock(mu_);
        closed_.store(true, std::memory_order_release);
        closing_ = false;
    }
    forget_alive(serial_);
    if (first_error.is_valid()) {
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(first_error.ptr())), first_error.ptr());
        throw nb::python_error();
    }
}

void State::ref_acquired() {
    // Referenced again (e.g. a grid's communicator handed out): no longer waiting for teardown.
    if (refs_++ == 0 && queued_) unqueue(this);
}

void State::ref_dropped() {
    if (--refs_ > 0) return;
    if (exiting() || closed()) return;
    try {
        switch (lifetime_.drop) {
            case Drop::kAtOnce:
                close();
                break;
            case Drop::kQueuedOnceCollective:
                if (!holds_collective_) {
                    close();
                    break;
                }
                [[fallthrough]];
            case Drop::kQueued:
                queue_for_teardown();
                break;
            case Drop::kByOwner:
            case Drop::kNever:
            case Drop::kByParts:
                break;
        }
    } catch (nb::python_error& e) {
        e.restore();
        PyErr_WriteUnraisable(nullptr);
    } catch (std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        PyErr_WriteUnraisable(nullptr);
    }
}

void State::ref_closed() {
    if (--refs_ > 0) return;
    close();
}

void State::queue_for_teardown() {
    {
        TeardownQueue& q = teardown_queue();
        Lock l = lock(q.mu);
        if (queued_) return;
        queued_ = true;
        q.items.push_back(shared_from_this());
    }
    warn_resource(kind() + " (serial " + std::to_string(serial_) + ") was dropped without close(); " +
                  (lifetime_.collective ? "its release is collective, so it is queued until finalize() or drain() "
                                          "runs on every rank"
                                        : "the garbage collector does not release it (" +
                                              std::string(lifetime_.release) +
                                              "), so it is queued until finalize() or drain() runs"));
}

// ---------------------------------------------------------------------------
// Composites
// ---------------------------------------------------------------------------

CompositeState::CompositeState(std::vector<nb::object> parts, std::string what)
    : State("mpbind.Composite"), what(std::move(what)), parts_(std::move(parts)) {}

CompositeState::~CompositeState() {
    if (!Py_IsInitialized()) {
        for (auto& p : parts_) p.release();  // the interpreter is gone: leak the references
        return;
    }
    nb::gil_scoped_acquire gil;
    parts_.clear();  // each part follows its own row
}

std::vector<nb::object> CompositeState::parts() const { return parts_; }

void CompositeState::release() {
    std::vector<nb::object> parts = parts_;  // kept: a closed plan still shows what it owned
    nb::object first_error;
    // Newest first; every part is closed even when one fails (another rank closes them all).
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        try {
            it->attr("close")();
        } catch (nb::python_error& e) {
            if (!first_error.is_valid()) first_error = nb::borrow(e.value());
        }
    }
    if (first_error.is_valid()) {
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(first_error.ptr())), first_error.ptr());
        throw nb::python_error();
    }
}

// ---------------------------------------------------------------------------
// Registrations
// ---------------------------------------------------------------------------

namespace {

struct AllRegistrations {
    Mutex mu;
    std::vector<std::weak_ptr<RegistrationState>> items;
};

AllRegistrations& all_regs() {
    static AllRegistrations* r = new AllRegistrations();
    return *r;
}

}  // namespace

RegistrationState::~RegistrationState() {
    if (!Py_IsInitialized()) {
        buffer.release();  // the interpreter is gone: leak the reference
        return;
    }
    if (buffer.is_valid()) {
        nb::gil_scoped_acquire gil;
        buffer.reset();
    }
}

std::string RegistrationState::library() const {
    std::string k = kind();
    return k.substr(0, k.find('.'));
}

void RegistrationState::release() {
    deregister();
    buffer.reset();
}

void RegistrationRef::close() {
    if (closed_) return;
    closed_ = true;
    // The last reference closed explicitly: deregister now, collectively if
    // the library requires it (every rank closes its last reference).
    state_->ref_closed();
}

const RegistrationState& RegistrationRef::get() const {
    if (closed_) raise_usage(state_->kind() + " reference is closed");
    state_->check_open();
    return *state_;
}

void Registry::track(const std::shared_ptr<RegistrationState>& s) {
    AllRegistrations& r = all_regs();
    Lock l = lock(r.mu);
    r.items.erase(std::remove_if(r.items.begin(), r.items.end(),
                                 [](auto& w) {
                                     auto p = w.lock();
                                     return !p || p->closed();
                                 }),
                  r.items.end());
    r.items.push_back(s);
}

std::vector<std::shared_ptr<RegistrationState>> Registry::live() {
    std::vector<std::shared_ptr<RegistrationState>> out;
    for (auto& kv : live_) {
        if (auto s = kv.second.lock(); s && !s->closed()) out.push_back(std::move(s));
    }
    return out;
}

std::vector<std::shared_ptr<RegistrationState>> all_registrations() {
    AllRegistrations& r = all_regs();
    Lock l = lock(r.mu);
    std::vector<std::shared_ptr<RegistrationState>> out;
    for (auto& w : r.items) {
        if (auto s = w.lock(); s && !s->closed()) out.push_back(std::move(s));
    }
    return out;
}

nb::dict describe(const RegistrationState& s) {
    nb::dict d;
    d["library"] = s.library();
    d["kind"] = s.kind();
    d["owner"] = s.owner_serial;
    d["ptr"] = s.ptr;
    d["size"] = s.size;
    d["references"] = s.refs();
    d["handle"] = s.lib_handle;
    d["serial"] = s.serial();
    return d;
}

nb::list describe(const std::vector<std::shared_ptr<RegistrationState>>& live) {
    nb::list out;
    for (auto& s : live) out.append(describe(*s));
    return out;
}

nb::dict describe(const CacheInfo& info) {
    nb::dict d;
    d["entries"] = info.entries;
    d["hits"] = info.hits;
    d["misses"] = info.misses;
    return d;
}

// ---------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------

std::string py_type_name(nb::handle value) {
    return nb::cast<std::string>(nb::str(value.type().attr("__name__")));
}

namespace {

void require_int(nb::handle value, const char* what) {
    if (!PyLong_Check(value.ptr()) || PyBool_Check(value.ptr())) {
        raise_type(std::string(what) + " must be an int, not " + py_type_name(value));
    }
}

std::string py_repr(nb::handle value) { return nb::cast<std::string>(nb::repr(value)); }

}  // namespace

long long int_arg(nb::handle value, const char* what, long long lo, long long hi) {
    require_int(value, what);
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
    if (overflow == 0 && v == -1 && PyErr_Occurred()) throw nb::python_error();
    if (overflow != 0 || v < lo || v > hi) {
        raise_usage(std::string(what) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                    "], got " + py_repr(value));
    }
    return v;
}

uint64_t uint_arg(nb::handle value, const char* what, uint64_t lo) {
    require_int(value, what);
    unsigned long long v = PyLong_AsUnsignedLongLong(value.ptr());
    if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {  // negative or >= 2**64
        PyErr_Clear();
        raise_usage(std::string(what) + " must be in [" + std::to_string(lo) + ", 2**64), got " + py_repr(value));
    }
    if (v < lo) raise_usage(std::string(what) + " must be >= " + std::to_string(lo) + ", got " + py_repr(value));
    return v;
}
}  // namespace mpbind
