// Deadlines, bounded waits, blocking calls on a thread of their own, and the watchdog thread with
// its flight records (see watchdog.hpp).

#include "watchdog.hpp"

#include <nanobind/stl/string.h>

#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "mpbind/bindings/_core_abi/cuda_driver.hpp"
#include "register.hpp"

namespace mpbind {

namespace cu = abi::cuda_driver;

// ---------------------------------------------------------------------------
// Deadlines
// ---------------------------------------------------------------------------

namespace {

std::string seconds_text(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", s);
    return buf;
}

const char* const kTimeoutRule = "a number of seconds > 0 (at most 1e9)";

}  // namespace

double default_timeout() {
    const char* text = std::getenv(kTimeoutVariable);
    if (text == nullptr || *text == '\0') return kDefaultTimeout;
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(text, &end);
    while (end != nullptr && (*end == ' ' || *end == '\t')) ++end;
    if (end == text || end == nullptr || *end != '\0' || errno != 0 || !std::isfinite(v) || v <= 0 ||
        v > kMaxTimeout) {
        raise_usage(std::string(kTimeoutVariable) + " must be " + kTimeoutRule + ", not '" + text + "'");
    }
    return v;
}

double timeout_arg(nb::handle value, const char* what) {
    if (value.is_none()) return default_timeout();
    PyObject* o = value.ptr();
    if (PyBool_Check(o) || !(PyLong_Check(o) || PyFloat_Check(o))) {
        raise_type(std::string(what) + " must be " + kTimeoutRule + " or None (the default, " + kTimeoutVariable +
                   "), not " + py_type_name(value));
    }
    double v = PyFloat_Check(o) ? PyFloat_AsDouble(o) : PyLong_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred()) {  // an int beyond a double: too large anyway
        PyErr_Clear();
        v = HUGE_VAL;
    }
    if (!std::isfinite(v) || v <= 0 || v > kMaxTimeout) {
        raise_usage(std::string(what) + " must be " + kTimeoutRule + " or None, not " +
                    nb::cast<std::string>(nb::repr(value)));
    }
    return v;
}

namespace {

bool watchdog_default() {
    const char* text = std::getenv(kWatchdogVariable);
    if (text == nullptr || *text == '\0' || std::string(text) == "0") return false;
    if (std::string(text) == "1") return true;
    raise_usage(std::string(kWatchdogVariable) + " must be 1 (watch every communicator) or 0, not '" + text + "'");
}

}  // namespace

bool watchdog_arg(nb::handle value, const char* what) {
    if (value.is_none()) return watchdog_default();
    if (!PyBool_Check(value.ptr())) {
        raise_type(std::string(what) + " must be True, False or None (the default, " + kWatchdogVariable + "), not " +
                   py_type_name(value));
    }
    return value.ptr() == Py_True;
}

void raise_wait_timeout(const std::string& operation, double timeout, const std::string& detail) {
    nb::object cls = nb::module_::import_("mpbind.errors").attr("WaitTimeoutError");
    nb::object err = cls(operation, timeout, detail);
    PyErr_SetObject(cls.ptr(), err.ptr());
    throw nb::python_error();
}

// ---------------------------------------------------------------------------
// Waits
// ---------------------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

// give_up() must not replace the exception that ended the wait: one of its own is reported.
void run_give_up(const GiveUp& give_up, bool timed_out) {
    if (!give_up) return;
    try {
        give_up(timed_out);
    } catch (nb::python_error& e) {
        e.discard_as_unraisable("mpbind: cleaning up after a wait that was given up");
    } catch (std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        PyErr_WriteUnraisable(nullptr);
    }
}

}  // namespace

void wait_until(const std::string& what, double timeout, const std::function<bool()>& ready,
                const GiveUp& give_up, const std::function<std::string()>& detail,
                const std::function<void()>& raise_timeout) {
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout));
    const auto slice = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kSignalSlice));
    auto pause = std::chrono::microseconds(0);
    for (;;) {
        bool done = false;
        {
            nb::gil_scoped_release release;
            const auto slice_end = std::min(Clock::now() + slice, deadline);
            for (;;) {
                if (ready()) {
                    done = true;
                    break;
                }
                if (Clock::now() >= slice_end) break;
                if (pause.count() > 0) std::this_thread::sleep_for(pause);
                // A spin first (the usual wait is short), then sleeps growing to 1 ms.
                pause = std::min(std::chrono::microseconds(1000), pause * 2 + std::chrono::microseconds(1));
            }
        }
        if (done) return;
        if (PyErr_CheckSignals() != 0) {
            nb::python_error interrupted;  // set aside: give_up() may call the library
            run_give_up(give_up, false);
            throw interrupted;
        }
        if (Clock::now() >= deadline) {
            run_give_up(give_up, true);
            if (raise_timeout) raise_timeout();
            raise_wait_timeout(what, timeout, detail ? detail() : std::string());
        }
    }
}

namespace {

// The caller's current CUDA context (nullptr: none, or no driver), for the thread of a Worker.
void* caller_context() {
    void* ctx = nullptr;
    try {
        const cu::Api& d = cu::api();
        if (d.cuCtxGetCurrent.ptr(&ctx) != cu::CUDA_SUCCESS) ctx = nullptr;
    } catch (nb::python_error&) {
        ctx = nullptr;
    }
    if (PyErr_Occurred()) PyErr_Clear();  // cuda-bindings without a driver raises from its loader
    return ctx;
}

}  // namespace

std::shared_ptr<Worker> Worker::start(std::function<long long()> call, std::function<void(long long)> late) {
    auto w = std::make_shared<Worker>();
    w->late_ = std::move(late);
    void* ctx = caller_context();
    const cu::Api* drv = ctx != nullptr ? &cu::api() : nullptr;  // loaded by caller_context()
    std::thread([w, call = std::move(call), ctx, drv] {
        if (ctx != nullptr) drv->cuCtxSetCurrent.ptr(ctx);
        long long r = -1;
        try {
            r = call();
        } catch (...) {
        }
        w->result_ = r;
        int running = kRunning;
        if (!w->state_.compare_exchange_strong(running, kDone, std::memory_order_acq_rel) && w->late_) {
            w->late_(r);  // abandoned: clean up what the call made
        }
    }).detach();
    return w;
}

bool Worker::abandon() {
    int running = kRunning;
    return state_.compare_exchange_strong(running, kAbandoned, std::memory_order_acq_rel);
}

long long run_bounded(const std::string& what, double timeout, std::function<long long()> call,
                      std::function<void(long long)> late, const GiveUp& give_up,
                      const std::function<std::string()>& detail) {
    std::shared_ptr<Worker> w = Worker::start(std::move(call), late);
    auto abandon = [&](bool timed_out) {
        if (!w->abandon() && late) late(w->result());  // it returned just now: clean up here
        if (give_up) give_up(timed_out);
    };
    wait_until(what, timeout, [&] { return w->done(); }, abandon, detail);
    return w->result();
}

// ---------------------------------------------------------------------------
// Trackers
// ---------------------------------------------------------------------------

namespace watch {

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

const char* state_name(OpState s) {
    switch (s) {
        case OpState::kEnqueuing: return "enqueuing";
        case OpState::kPending: return "pending";
        case OpState::kCompleted: return "completed";
        case OpState::kUntracked: return "untracked";
        case OpState::kFailed: return "failed";
    }
    return "?";
}

Tracker::Tracker(std::string label, double timeout) : label(std::move(label)), timeout_(timeout) {}

Tracker::~Tracker() = default;

void Tracker::drop_events() {
    std::lock_guard<std::mutex> g(mu_);
    if (events_dropped_) return;
    events_dropped_ = true;
    for (auto& p : pending_) destroy_event(p.event);
    for (void* e : spare_) destroy_event(e);
    pending_.clear();
    spare_.clear();
}

Record* Tracker::slot(uint64_t seq) {
    Record& r = ring_[seq % kRecords];
    return r.seq == seq ? &r : nullptr;
}

uint64_t Tracker::begin(const char* op, uint64_t count, int64_t bytes, const char* dtype, int peer,
                        uintptr_t stream) {
    int64_t t = now_ns();
    std::lock_guard<std::mutex> g(mu_);
    uint64_t seq = next_++;
    ring_[seq % kRecords] = Record{seq, op, count, bytes, dtype, peer, stream, t, OpState::kEnqueuing};
    return seq;
}

void Tracker::enqueued(uint64_t seq, uintptr_t stream) {
    std::lock_guard<std::mutex> g(mu_);
    Record* r = slot(seq);
    OpState state = OpState::kUntracked;
    // No capture check here (a driver call per operation): an event recorded while the stream captures a
    // graph is legal and changes nothing in the graph; look() finds it "captured" and drops it.
    if (!events_dropped_) {
        if (!prefilled_) {
            prefilled_ = true;
            for (size_t i = 0; i < kPrefill; ++i) {
                if (void* e = new_event()) spare_.push_back(e);
            }
        }
        const bool room = pending_.size() < kMaxPending;
        Pending* newest = pending_.empty() ? nullptr : &pending_.back();
        void* e = nullptr;
        if (room && !spare_.empty()) {
            e = spare_.back();
            spare_.pop_back();
        } else if (newest != nullptr && !newest->looked && newest->op.stream == stream) {
            // Recorded again after this operation: it completes once every operation it covers has.
            if (record(newest->event, stream)) {
                newest->last = seq;
                state = OpState::kPending;
            }
        } else if (room) {
            e = new_event();
        }
        if (e != nullptr && record(e, stream)) {
            state = OpState::kPending;
            Record copy = r ? *r : Record{seq, "?", 0, -1, "", -1, stream, now_ns(), state};
            copy.state = state;
            pending_.push_back({copy, seq, e});
        } else if (e != nullptr) {
            spare_.push_back(e);
        }
    }
    if (r) r->state = state;
}

void Tracker::call_failed(uint64_t seq) {
    std::lock_guard<std::mutex> g(mu_);
    if (Record* r = slot(seq)) r->state = OpState::kFailed;
}

std::vector<Record> Tracker::recent() const {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<Record> out;
    uint64_t first = next_ > kRecords ? next_ - kRecords : 1;
    for (uint64_t s = first; s < next_; ++s) {
        const Record& r = ring_[s % kRecords];
        if (r.seq == s) out.push_back(r);
    }
    return out;
}

namespace {

std::string describe_line(const Record& r, int64_t now) {
    char buf[320];
    std::string what = r.op;
    if (r.count || *r.dtype) what += " " + std::to_string(r.count) + (*r.dtype ? std::string(" x ") + r.dtype : "");
    if (r.bytes >= 0) what += " (" + std::to_string(r.bytes) + " B)";
    if (r.peer >= 0) what += " peer/root " + std::to_string(r.peer);
    std::snprintf(buf, sizeof buf, "  #%" PRIu64 " %s on stream 0x%" PRIxPTR ", enqueued %.3f s ago: %s\n", r.seq,
                  what.c_str(), r.stream, static_cast<double>(now - r.enqueued_ns) * 1e-9, state_name(r.state));
    return buf;
}

}  // namespace

std::string Tracker::report(const std::string& headline) const {
    std::vector<Record> records = recent();
    int64_t now = now_ns();
    std::string out = "mpbind: " + headline + "\nmpbind: flight record of " + label + " (last " +
                      std::to_string(records.size()) + " operations, oldest first):\n";
    for (const Record& r : records) out += describe_line(r, now);
    if (records.empty()) out += "  (no operation issued)\n";
    return out;
}

void Tracker::mark(const Pending& p, OpState state) {
    uint64_t first = std::max(p.op.seq, next_ > kRecords ? next_ - kRecords : uint64_t{1});
    for (uint64_t s = first; s <= p.last; ++s) {
        Record* r = slot(s);
        // Between its first and last only this entry's operations are pending (an operation with an
        // entry of its own ends coalescing), the others are untracked or failed and stay so.
        if (r != nullptr && r->state == OpState::kPending) r->state = state;
    }
}

Finding Tracker::look(int64_t now) {
    std::lock_guard<std::mutex> g(mu_);
    Finding f;
    const int64_t limit = static_cast<int64_t>(timeout_ * 1e9);
    // Completed events go back to the pool; the oldest still running is checked against its deadline.
    size_t i = 0;
    while (i < pending_.size()) {
        int error = 0;
        int q = query(pending_[i].event, &error);
        const Record& rec = pending_[i].op;
        pending_[i].looked = true;
        if (q == 1 || q == 2) {
            mark(pending_[i], q == 1 ? OpState::kCompleted : OpState::kUntracked);
            spare_.push_back(pending_[i].event);
            pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
            continue;
        }
        if (q < 0 && !f.failed) {
            f.failed = true;
            f.op = rec;
            f.reason = "a CUDA error on its stream (cuEventQuery returned CUresult " + std::to_string(error) + ")";
        } else if (q == 0 && !f.failed && now - rec.enqueued_ns > limit) {
            f.failed = f.overrun = true;
            f.op = rec;
            f.reason = std::string(rec.op) + " #" + std::to_string(rec.seq) + " did not complete within " +
                       seconds_text(timeout_) + " s";
        }
        ++i;
    }
    // A library call that has not returned (it waits on the host for another rank).
    if (!f.failed && next_ > 1) {
        const Record& last = ring_[(next_ - 1) % kRecords];
        if (last.state == OpState::kEnqueuing && now - last.enqueued_ns > limit) {
            f.failed = f.overrun = true;
            f.op = last;
            f.reason = std::string(last.op) + " #" + std::to_string(last.seq) + " has not returned to the caller within " +
                       seconds_text(timeout_) + " s";
        }
    }
    return f;
}

void* Tracker::new_event() {
    void* e = nullptr;
    const cu::Api& d = cu::api();
    if (d.cuEventCreate.ptr(&e, static_cast<unsigned>(cu::CU_EVENT_DISABLE_TIMING)) != cu::CUDA_SUCCESS) {
        // cydriver may have set a Python error (a missing driver symbol); only a thread with the GIL has one
        if (PyGILState_Check() && PyErr_Occurred()) PyErr_Clear();
        return nullptr;
    }
    return e;
}

bool Tracker::record(void* event, uintptr_t stream) {
    return cu::api().cuEventRecord.ptr(event, reinterpret_cast<void*>(stream)) == cu::CUDA_SUCCESS;
}

int Tracker::query(void* event, int* error) {
    cu::CUresult r = cu::api().cuEventQuery.ptr(event);
    if (r == cu::CUDA_SUCCESS) return 1;
    if (r == cu::CUDA_ERROR_NOT_READY) return 0;
    if (r == cu::CUDA_ERROR_CAPTURED_EVENT) return 2;  // recorded into a graph capture: nothing to watch
    *error = static_cast<int>(r);
    return -1;
}

void Tracker::destroy_event(void* event) { cu::api().cuEventDestroy.ptr(event); }

// ---------------------------------------------------------------------------
// The watchdog thread
// ---------------------------------------------------------------------------

namespace {

constexpr auto kPeriod = std::chrono::milliseconds(50);  // how often every tracker is looked at
constexpr auto kStopWait = std::chrono::seconds(5);       // at exit, the longest wait for the thread

struct Dog {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::shared_ptr<Tracker>> trackers;
    bool started = false, stopping = false, exited = false;
    std::thread thread;
};

Dog* g_dog = nullptr;

void forked_child() {
    // The thread did not come along; its state is the parent's (its mutex may be held): start afresh.
    g_dog = new Dog();
}

Dog& dog() {
    if (g_dog == nullptr) {  // first use, under the GIL
        g_dog = new Dog();   // never destroyed: used at exit
        pthread_atfork(nullptr, nullptr, forked_child);
    }
    return *g_dog;
}

void loop(Dog* d) {
    for (;;) {
        std::vector<std::shared_ptr<Tracker>> ts;
        {
            std::unique_lock<std::mutex> l(d->mu);
            d->cv.wait_for(l, kPeriod, [d] { return d->stopping; });
            if (d->stopping) break;
            auto& v = d->trackers;
            v.erase(std::remove_if(v.begin(), v.end(), [](auto& t) { return t->failed.load() || !t->alive(); }),
                    v.end());
            ts = v;
        }
        for (auto& t : ts) {
            Finding f;
            if (!t->look_library(f)) continue;  // busy: next round
            if (!f.failed) f = t->look(now_ns());
            if (f.failed && !t->failed.exchange(true)) t->fail(f);
        }
        ts.clear();  // a released tracker may be destroyed here, without the GIL (it holds no Python object)
    }
    std::lock_guard<std::mutex> g(d->mu);
    d->exited = true;
    d->cv.notify_all();
}

}  // namespace

void watch(const std::shared_ptr<Tracker>& tracker) {
    Dog& d = dog();
    std::lock_guard<std::mutex> g(d.mu);
    d.trackers.push_back(tracker);
    if (!d.started && !d.stopping) {
        d.started = true;
        d.thread = std::thread(loop, &d);
    }
}

void stop() {
    if (g_dog == nullptr) return;
    Dog& d = *g_dog;
    nb::gil_scoped_release release;  // the thread never takes the GIL, but a failure report may be running
    std::unique_lock<std::mutex> l(d.mu);
    if (!d.started || d.stopping) return;
    d.stopping = true;
    d.cv.notify_all();
    bool exited = d.cv.wait_for(l, kStopWait, [&d] { return d.exited; });
    l.unlock();
    if (exited) {
        d.thread.join();
    } else {
        d.thread.detach();  // stuck in a library call: leave it to the process's end
    }
    d.trackers.clear();
}

bool running() {
    if (g_dog == nullptr) return false;
    std::lock_guard<std::mutex> g(g_dog->mu);
    return g_dog->started && !g_dog->exited && !g_dog->stopping;
}

nb::list describe(const std::vector<Record>& records) {
    nb::list out;
    int64_t now = now_ns();
    nb::object wall = nb::module_::import_("time").attr("time")();
    double wall_now = nb::cast<double>(wall);
    for (const Record& r : records) {
        nb::dict d;
        d["seq"] = r.seq;
        d["operation"] = r.op;
        d["count"] = r.count;
        d["bytes"] = r.bytes < 0 ? nb::object(nb::none()) : nb::object(nb::int_(r.bytes));
        d["dtype"] = *r.dtype ? nb::object(nb::str(r.dtype)) : nb::object(nb::none());
        d["peer"] = r.peer < 0 ? nb::object(nb::none()) : nb::object(nb::int_(r.peer));
        d["stream"] = r.stream;
        d["enqueued"] = wall_now - static_cast<double>(now - r.enqueued_ns) * 1e-9;  // time.time() then
        d["state"] = state_name(r.state);
        d["completed"] = r.state == OpState::kCompleted    ? nb::object(nb::bool_(true))
                         : r.state == OpState::kPending ||
                                   r.state == OpState::kEnqueuing ? nb::object(nb::bool_(false))
                                                                  : nb::object(nb::none());
        out.append(d);
    }
    return out;
}

}  // namespace watch

}  // namespace mpbind

// ---------------------------------------------------------------------------
// mpbind._core: the deadline helpers and the watchdog's state; _testing: doubles of both
// ---------------------------------------------------------------------------

namespace mpbind {

namespace {

// A tracker without CUDA: an event completes after `complete_after` looks (never when < 0).
class FakeTracker : public watch::Tracker {
public:
    FakeTracker(double timeout, int complete_after, bool capture)
        : Tracker("testing.FakeTracker", timeout), complete_after_(complete_after), capture_(capture) {}
    ~FakeTracker() override { drop_events(); }

    std::mutex found_mu;
    watch::Finding found;            // what fail() was given
    std::atomic<bool> reported{false};  // fail() has run
    std::atomic<int> made{0};        // events made

    void fail(const watch::Finding& f) override {
        {
            std::lock_guard<std::mutex> g(found_mu);
            found = f;
        }
        std::string text = report(label + " failed: " + f.reason);
        std::fputs(text.c_str(), stderr);
        std::fflush(stderr);
        reported.store(true);
    }

protected:
    void* new_event() override {
        ++made;
        return new int(0);
    }
    bool record(void* event, uintptr_t) override {
        *static_cast<int*>(event) = 0;
        return true;
    }
    int query(void* event, int*) override {
        if (capture_) return 2;  // as the driver answers for an event recorded into a graph capture
        int& looks = *static_cast<int*>(event);
        return complete_after_ >= 0 && looks++ >= complete_after_ ? 1 : 0;
    }
    void destroy_event(void* event) override { delete static_cast<int*>(event); }

private:
    int complete_after_;
    bool capture_;
};

struct FakeHandle {
    std::shared_ptr<FakeTracker> t;
};

// A tracker on real CUDA events that never fails (the host cost of tracking, measured on a GPU).
class TimingTracker : public watch::Tracker {
public:
    TimingTracker() : Tracker("testing.TimingTracker", 600.0) {}
    ~TimingTracker() override { drop_events(); }
    void fail(const watch::Finding&) override {}
};

// Operation names live as long as the process (records keep the pointer).
const char* interned(const std::string& name) {
    static std::mutex mu;
    static auto* names = new std::vector<std::unique_ptr<std::string>>();
    std::lock_guard<std::mutex> g(mu);
    for (auto& n : *names) {
        if (*n == name) return n->c_str();
    }
    names->push_back(std::make_unique<std::string>(name));
    return names->back()->c_str();
}

std::atomic<int> g_gave_up{0}, g_late{0};

}  // namespace

void register_watchdog(nb::module_& m) {
    m.def("default_timeout", &default_timeout,
          "The process default of every deadline in seconds: MPBIND_TIMEOUT, else 600.");
    m.def("timeout_arg", [](nb::handle value, const std::string& what) { return timeout_arg(value, what.c_str()); },
          nb::arg("value").none(), nb::arg("what"),
          nb::sig("def timeout_arg(value: object, what: str) -> float"),
          "A timeout= argument as seconds: None is the default; TypeError or UsageError naming `what` otherwise.");
    m.def("watchdog_arg", [](nb::handle value, const std::string& what) { return watchdog_arg(value, what.c_str()); },
          nb::arg("value").none(), nb::arg("what"), nb::sig("def watchdog_arg(value: object, what: str) -> bool"),
          "A watchdog= argument: None is MPBIND_WATCHDOG; TypeError naming `what` for a non-bool.");
    m.def("wait_until", [](nb::callable ready, nb::handle timeout, const std::string& what, nb::object detail) {
        double t = timeout_arg(timeout, "timeout");
        std::unique_ptr<nb::python_error> error;
        wait_until(what, t, [&] {
            nb::gil_scoped_acquire gil;
            if (error) return true;
            int truth = -1;
            try {
                truth = PyObject_IsTrue(ready().ptr());
                if (truth < 0) throw nb::python_error();
            } catch (nb::python_error& e) {
                error = std::make_unique<nb::python_error>(std::move(e));
                return true;
            }
            return truth == 1;
        }, {}, [&] { return detail.is_none() ? std::string() : nb::cast<std::string>(nb::str(detail)); });
        if (error) throw nb::python_error(std::move(*error));
    }, nb::arg("ready"), nb::arg("timeout").none(), nb::arg("what"), nb::arg("detail").none() = nb::none(),
          nb::sig("def wait_until(ready: collections.abc.Callable[[], object], timeout: float | None, what: str, "
                  "detail: str | None = None) -> None"),
          "Call `ready()` every few ms (the GIL released between calls) until it returns true. Ctrl-C raises "
          "KeyboardInterrupt within a fraction of a second; after `timeout` seconds (None: the default) "
          "WaitTimeoutError(what, timeout, detail) is raised. The layer's Python waits go through it.");
    m.def("watchdog_running", &watch::running, "Whether the watchdog thread of this process runs.");
    m.def("_stop_watchdog", &watch::stop, "Stop the watchdog thread (at interpreter exit; bounded).");
    nb::module_::import_("atexit").attr("register")(m.attr("_stop_watchdog"));

    nb::module_ t = nb::borrow<nb::module_>(m.attr("_testing"));
    t.def("poll", [](double timeout, double ready_after) {
        auto start = watch::Clock::now();
        auto at = start + std::chrono::duration_cast<watch::Clock::duration>(std::chrono::duration<double>(ready_after));
        wait_until("testing.poll", timeout, [&] { return ready_after >= 0 && watch::Clock::now() >= at; },
                   [](bool) { ++g_gave_up; }, [] { return std::string("the test's condition never held"); });
        return std::chrono::duration<double>(watch::Clock::now() - start).count();
    }, nb::arg("timeout"), nb::arg("ready_after") = -1.0,
       "The core's wait on a condition that holds after `ready_after` seconds (never when < 0): the seconds "
       "waited, or the exception that ended the wait.");
    t.def("poll_gave_up", [] { return g_gave_up.load(); }, "How many waits of poll()/bounded_call() gave up.");
    t.def("bounded_call", [](double timeout, double duration) {
        auto call = [duration]() -> long long {
            std::this_thread::sleep_for(std::chrono::duration<double>(duration));
            return 7;
        };
        return run_bounded("testing.bounded_call", timeout, call, [](long long) { ++g_late; },
                           [](bool) { ++g_gave_up; });
    }, nb::arg("timeout"), nb::arg("duration"),
       "A blocking call of `duration` seconds on a Worker, waited for `timeout` seconds: 7, or the exception that "
       "ended the wait (the call, abandoned, counts in bounded_late() when it returns).");
    t.def("bounded_late", [] { return g_late.load(); }, "How many abandoned bounded_call()s have returned since.");

    auto fake = nb::class_<FakeHandle>(t, "FakeTracker", "A watchdog tracker whose events are counters (no CUDA).");
    fake.def("__init__", [](FakeHandle* self, double timeout, int complete_after, bool capturing) {
        new (self) FakeHandle{std::make_shared<FakeTracker>(timeout, complete_after, capturing)};
    }, nb::arg("timeout"), nb::arg("complete_after") = -1, nb::arg("capturing") = false)
        .def("issue", [](FakeHandle& h, const std::string& op, uint64_t count, uintptr_t stream) {
            uint64_t seq = h.t->begin(interned(op), count, static_cast<int64_t>(count) * 4, "float32", -1, stream);
            h.t->enqueued(seq, stream);
            return seq;
        }, nb::arg("op"), nb::arg("count") = 0, nb::arg("stream") = 0, "begin() and enqueued(): an enqueued operation.")
        .def("begin", [](FakeHandle& h, const std::string& op) {
            return h.t->begin(interned(op), 0, -1, "", -1, 0);
        }, "begin() only: a library call that has not returned.")
        .def("watch", [](FakeHandle& h) { watch::watch(h.t); })
        .def("recent", [](FakeHandle& h) { return watch::describe(h.t->recent()); },
             nb::sig("def recent(self) -> list[dict[str, typing.Any]]"))
        .def_prop_ro("failed", [](FakeHandle& h) { return h.t->reported.load(); })
        .def_prop_ro("events_made", [](FakeHandle& h) { return h.t->made.load(); }, "How many events it made.")
        .def_prop_ro("finding", [](FakeHandle& h) -> nb::object {
            if (!h.t->reported.load()) return nb::none();
            std::lock_guard<std::mutex> g(h.t->found_mu);
            nb::dict d;
            d["reason"] = h.t->found.reason;
            d["overrun"] = h.t->found.overrun;
            d["operation"] = h.t->found.op.op;
            d["seq"] = h.t->found.op.seq;
            return d;
        }, nb::sig("def finding(self) -> dict[str, typing.Any] | None"));
    t.def("track_ns", [](size_t n) {
        auto tr = std::make_shared<FakeTracker>(600.0, 0, false);
        const char* op = interned("all_reduce");
        uint64_t k = 0;
        double ns = ns_per_call(n, [&] {
            uint64_t seq = tr->begin(op, 1024, 4096, "float32", -1, 0);
            tr->enqueued(seq, 0);
            if ((++k & 63) == 0) tr->look(watch::now_ns());  // as the watchdog would: events back to the pool
        });
        return ns;
    }, nb::arg("n"),
       "Nanoseconds per tracked operation on a tracker without CUDA (the flight record and the event pool, "
       "without the driver's event record): the watchdog's own host cost per call.");
    t.def("track_cuda_ns", [](size_t n, nb::handle stream) {
        uintptr_t s = stream_handle(stream);
        auto tr = std::make_shared<TimingTracker>();
        const char* op = interned("all_reduce");
        uint64_t k = 0;
        auto step = [&] {
            uint64_t seq = tr->begin(op, 1024, 4096, "float32", -1, s);
            tr->enqueued(seq, s);
            if ((++k & 63) == 0) tr->look(watch::now_ns());
        };
        for (int i = 0; i < 256; ++i) step();  // the pool made
        if (tr->recent().back().state == watch::OpState::kUntracked) {  // pending or completed: an event took it
            if (PyErr_Occurred()) PyErr_Clear();
            raise_usage("track_cuda_ns: no CUDA event could be recorded (no GPU, or not this stream's device)");
        }
        return ns_per_call(n, step);  // GIL held, as a watched call holds it
    }, nb::arg("n"), nb::arg("stream").none(),
       "Nanoseconds per tracked operation on `stream` (an int cudaStream_t) with real CUDA events: the flight "
       "record, the pool and cuEventRecord (a look every 64 operations, as a burst between the watchdog's looks).");
    t.def("event_record_ns", [](size_t n, nb::handle stream) {
        uintptr_t s = stream_handle(stream);
        const cu::Api& d = cu::api();
        void* e = nullptr;
        if (d.cuEventCreate.ptr(&e, static_cast<unsigned>(cu::CU_EVENT_DISABLE_TIMING)) != cu::CUDA_SUCCESS) {
            raise_usage("event_record_ns: cuEventCreate failed (no GPU?)");
        }
        double ns;
        {
            nb::gil_scoped_release release;
            ns = ns_per_call(n, [&] { d.cuEventRecord.ptr(e, reinterpret_cast<void*>(s)); });
            d.cuEventSynchronize.ptr(e);
        }
        d.cuEventDestroy.ptr(e);
        return ns;
    }, nb::arg("n"), nb::arg("stream").none(), "Nanoseconds per cuEventRecord of one event on `stream`.");
}

}  // namespace mpbind
