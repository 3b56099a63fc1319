// NCCL objects: Communicator (init, split, shrink, finalize/destroy/abort),
// Buffer (ncclMemAlloc/ncclMemFree) and refcounted registrations and windows.

#include "nccl.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>

#include "register.hpp"

namespace mpbind::nccl {

namespace {

constexpr const char* kCy = "mpbind.bindings.cynccl";
constexpr int kSuccess = 0;
constexpr int kInProgress = 7;
constexpr int kInternalError = 3;
constexpr int kSentinel = -42;  // MPBIND_NCCL_LOADING_ERROR
constexpr int kSplitNoColor = -1;

struct Api {
    int (*CommInitRankConfig)(void**, int, UniqueId, int, void*);
    int (*CommSplit)(void*, int, int, void**, void*);
    int (*CommShrink)(void*, int*, int, void**, void*, int);
    int (*CommFinalize)(void*);
    int (*CommDestroy)(void*);
    int (*CommAbort)(void*);
    int (*CommCount)(void*, int*);
    int (*CommCuDevice)(void*, int*);
    int (*CommUserRank)(void*, int*);
    int (*CommGetAsyncError)(void*, int*);
    int (*MemAlloc)(void**, size_t);
    int (*MemFree)(void*);
    int (*CommRegister)(void*, void*, size_t, void**);
    int (*CommDeregister)(void*, void*);
    int (*CommWindowRegister)(void*, void*, size_t, void**, int);
    int (*CommWindowDeregister)(void*, void*);
};

const Api& api() {
    static Api* a = nullptr;  // filled once under the GIL
    if (a) return *a;
    auto* t = new Api();
    load(t->CommInitRankConfig, kCy, "ncclCommInitRankConfig",
         "ncclResult_t (ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *)");
    load(t->CommSplit, kCy, "ncclCommSplit", "ncclResult_t (ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *)");
    load(t->CommShrink, kCy, "ncclCommShrink",
         "ncclResult_t (ncclComm_t, int *, int, ncclComm_t *, ncclConfig_t *, int)");
    load(t->CommFinalize, kCy, "ncclCommFinalize", "ncclResult_t (ncclComm_t)");
    load(t->CommDestroy, kCy, "ncclCommDestroy", "ncclResult_t (ncclComm_t)");
    load(t->CommAbort, kCy, "ncclCommAbort", "ncclResult_t (ncclComm_t)");
    load(t->CommCount, kCy, "ncclCommCount", "ncclResult_t (ncclComm_t const , int *)");
    load(t->CommCuDevice, kCy, "ncclCommCuDevice", "ncclResult_t (ncclComm_t const , int *)");
    load(t->CommUserRank, kCy, "ncclCommUserRank", "ncclResult_t (ncclComm_t const , int *)");
    load(t->CommGetAsyncError, kCy, "ncclCommGetAsyncError", "ncclResult_t (ncclComm_t, ncclResult_t *)");
    load(t->MemAlloc, kCy, "ncclMemAlloc", "ncclResult_t (void **, size_t)");
    load(t->MemFree, kCy, "ncclMemFree", "ncclResult_t (void *)");
    load(t->CommRegister, kCy, "ncclCommRegister", "ncclResult_t (ncclComm_t const , void *, size_t, void **)");
    load(t->CommDeregister, kCy, "ncclCommDeregister", "ncclResult_t (ncclComm_t const , void *)");
    load(t->CommWindowRegister, kCy, "ncclCommWindowRegister",
         "ncclResult_t (ncclComm_t, void *, size_t, ncclWindow_t *, int)");
    load(t->CommWindowDeregister, kCy, "ncclCommWindowDeregister", "ncclResult_t (ncclComm_t, ncclWindow_t)");
    a = t;
    return *a;
}

void check(int status, const char* function) {
    check_status("nccl", status, kSuccess, kSentinel, function);
}

template <class F, class... A>
void call(const char* function, F f, A... args) {
    call_checked("nccl", kSentinel, function, f, args...);
}

// A non-blocking communicator (config.blocking = 0) answers ncclInProgress;
// wait until it is ready so every object of this layer is usable when returned.
void wait_ready(void* comm, const char* function) {
    int state = kInProgress;
    while (state == kInProgress) {
        int status;
        {
            nb::gil_scoped_release release;
            status = api().CommGetAsyncError(comm, &state);
        }
        check(status, "ncclCommGetAsyncError");
    }
    check(state, function);
}

void* config_ptr(const nb::object& config) {
    if (config.is_none()) return nullptr;
    if (!nb::hasattr(config, "ptr") || !nb::hasattr(config, "blocking")) {
        raise_type("config must be an mpbind.bindings.nccl.Config or None, not " +
                   nb::cast<std::string>(nb::str(config.type().attr("__name__"))));
    }
    return reinterpret_cast<void*>(nb::cast<uintptr_t>(config.attr("ptr")));
}

std::shared_ptr<CommState> adopt(void* comm, int status, const char* function) {
    if (status == kInProgress) {
        wait_ready(comm, function);
    } else {
        check(status, function);
    }
    auto s = std::make_shared<CommState>(comm);
    const Api& a = api();
    check(a.CommUserRank(comm, &s->rank), "ncclCommUserRank");
    check(a.CommCount(comm, &s->size), "ncclCommCount");
    check(a.CommCuDevice(comm, &s->device), "ncclCommCuDevice");
    return s;
}

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
    BufferState(void* ptr, size_t size) : State("nccl.Buffer"), ptr(ptr), size(size) {}
    void* ptr;
    size_t size;

protected:
    void release() override { call("ncclMemFree", api().MemFree, ptr); }
};
using Buffer = Ref<BufferState>;

// --- registrations ---

class CommRegistration : public RegistrationState {
public:
    CommRegistration(bool window, uintptr_t ptr, size_t size, nb::object buffer)
        : RegistrationState(window ? "nccl.Window" : "nccl.Registration", ptr, size, std::move(buffer)),
          window(window) {}
    const bool window;  // ncclCommWindowRegister (collective), else ncclCommRegister (local)
    std::shared_ptr<CommState> comm;

protected:
    void deregister() override {
        if (comm->aborting) return;
        void* h = reinterpret_cast<void*>(lib_handle);
        if (window) {
            call("ncclCommWindowDeregister", api().CommWindowDeregister, comm->comm, h);
        } else {
            call("ncclCommDeregister", api().CommDeregister, comm->comm, h);
        }
    }
};

}  // namespace

CommState::CommState(void* comm) : State("nccl.Communicator"), comm(comm) {}

void CommState::finalize() {
    check_open();
    if (finalized) return;
    drain_queue(this);
    call("ncclCommFinalize", api().CommFinalize, comm);
    finalized = true;
}

void CommState::release() {
    if (aborting) {
        call("ncclCommAbort", api().CommAbort, comm);
        return;
    }
    if (!finalized) {
        call("ncclCommFinalize", api().CommFinalize, comm);
        finalized = true;
    }
    call("ncclCommDestroy", api().CommDestroy, comm);
}

namespace {

Communicator init(int nranks, int rank, nb::handle unique_id, nb::object config) {
    if (nranks < 1) raise_usage("nranks must be >= 1, got " + std::to_string(nranks));
    if (rank < 0 || rank >= nranks) {
        raise_usage("rank must be in [0, " + std::to_string(nranks) + "), got " + std::to_string(rank));
    }
    UniqueId id = to_unique_id(unique_id);
    void* cfg = config_ptr(config);
    const Api& a = api();
    void* comm = nullptr;
    int status;
    {
        nb::gil_scoped_release release;
        status = a.CommInitRankConfig(&comm, nranks, id, rank, cfg);
    }
    return Communicator(adopt(comm, status, "ncclCommInitRankConfig"));
}

std::optional<Communicator> split(Communicator& self, int color, int key, nb::object config) {
    CommState& s = self.get();
    if (color < kSplitNoColor) raise_usage("color must be >= 0 or -1 (no color), got " + std::to_string(color));
    void* cfg = config_ptr(config);
    void* comm = nullptr;
    int status;
    {
        nb::gil_scoped_release release;
        status = api().CommSplit(s.comm, color, key, &comm, cfg);
    }
    if (status == kSuccess && comm == nullptr) return std::nullopt;  // this rank passed no color
    return Communicator(adopt(comm, status, "ncclCommSplit"));
}

Communicator shrink(Communicator& self, std::vector<int> exclude, nb::object config, int flags) {
    CommState& s = self.get();
    for (int r : exclude) {
        if (r < 0 || r >= s.size) {
            raise_usage("exclude_ranks: rank " + std::to_string(r) + " is not in [0, " + std::to_string(s.size) +
                        ")");
        }
    }
    void* cfg = config_ptr(config);
    void* comm = nullptr;
    int status;
    {
        nb::gil_scoped_release release;
        status = api().CommShrink(s.comm, exclude.data(), static_cast<int>(exclude.size()), &comm, cfg, flags);
    }
    return Communicator(adopt(comm, status, "ncclCommShrink"));
}

RegistrationRef do_register(Communicator& self, uintptr_t ptr, size_t size, nb::object buffer, bool window,
                         int flags) {
    if (ptr == 0) raise_usage("cannot register a NULL pointer");
    if (size == 0) raise_usage("cannot register 0 bytes");
    std::shared_ptr<CommState> comm = self.state();
    CommState& s = self.get();
    Registry& reg = window ? s.windows : s.registrations;
    return reg.acquire(s, ptr, size, [&]() -> std::shared_ptr<RegistrationState> {
        void* h = nullptr;
        if (window) {
            call("ncclCommWindowRegister", api().CommWindowRegister, s.comm, reinterpret_cast<void*>(ptr), size,
                 &h, flags);
            if (h == nullptr) {
                raise_library_error("nccl", "ncclCommWindowRegister", kInternalError,
                                    "returned ncclSuccess but a NULL window (symmetric memory is not "
                                    "available for this buffer or communicator)");
            }
        } else {
            call("ncclCommRegister", api().CommRegister, s.comm, reinterpret_cast<void*>(ptr), size, &h);
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

}  // namespace

}  // namespace mpbind::nccl

namespace mpbind {

void register_nccl(nb::module_& parent) {
    using namespace nccl;
    nb::module_ m = parent.def_submodule("nccl", "NCCL objects of the core.");

    auto comm = nb::class_<Communicator>(
        m, "Communicator",
        "An NCCL communicator. Destruction is collective: close() on every rank, or drop it and "
        "drain() on every rank.");
    comm.def_static("init", &init, nb::arg("nranks"), nb::arg("rank"), nb::arg("unique_id"),
                    nb::arg("config") = nb::none(),
                    "ncclCommInitRankConfig (collective). A non-blocking config is waited on until ready.")
        .def("split", &split, nb::arg("color"), nb::arg("key"), nb::arg("config") = nb::none(),
             "ncclCommSplit (collective). Returns None on ranks that passed color=-1.")
        .def("shrink", &shrink, nb::arg("exclude_ranks"), nb::arg("config") = nb::none(), nb::arg("flags") = 0,
             "ncclCommShrink (collective): a communicator without `exclude_ranks`.")
        .def_prop_ro("rank", [](Communicator& c) { return c.get().rank; })
        .def_prop_ro("size", [](Communicator& c) { return c.get().size; })
        .def_prop_ro("device", [](Communicator& c) { return c.get().device; })
        .def_prop_ro("finalized", [](Communicator& c) { return c.state()->finalized; })
        .def("finalize", [](Communicator& c) {
            c.get();
            collect_garbage();
            c.get().finalize();
        },
             "Run what is queued under this communicator, then ncclCommFinalize (collective).")
        .def("destroy", [](Communicator& c) { c.close(); }, "Same as close().")
        .def("abort", [](Communicator& c) {
            auto s = c.state();
            if (s->closed()) return;
            s->aborting = true;
            s->close();
        }, "ncclCommAbort: not collective; what depends on it is dropped without library calls.")
        .def("drain", [](Communicator& c) {
            collect_garbage();
            return drain_queue(c.state().get());
        },
             "Run the queued collective releases under this communicator (collective).")
        .def("register", [](Communicator& c, uintptr_t ptr, size_t size, nb::object buffer) {
            return do_register(c, ptr, size, std::move(buffer), false, 0);
        }, nb::arg("ptr"), nb::arg("size"), nb::arg("buffer") = nb::none(),
           "ncclCommRegister, reference-counted per (ptr, size).")
        .def("register_window", [](Communicator& c, uintptr_t ptr, size_t size, int flags, nb::object buffer) {
            return do_register(c, ptr, size, std::move(buffer), true, flags);
        }, nb::arg("ptr"), nb::arg("size"), nb::arg("flags") = 0, nb::arg("buffer") = nb::none(),
           "ncclCommWindowRegister (collective), reference-counted per (ptr, size).")
        .def("registrations", &list_registrations, nb::sig("def registrations(self) -> list[dict[str, typing.Any]]"),
             "Live registrations and windows on this communicator.")
        .def("__repr__", [](Communicator& c) {
            auto& s = *c.state();
            if (s.closed()) return std::string("<nccl.Communicator closed>");
            return "<nccl.Communicator rank=" + std::to_string(s.rank) + " size=" + std::to_string(s.size) +
                   " device=" + std::to_string(s.device) + ">";
        });
    bind_c_pointer(comm, [](Communicator& c) { return c.get().comm; },
                   "The ncclComm_t, for the flat bindings (UsageError once closed).");
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
    m.def("mem_alloc", [](size_t nbytes) {
        if (nbytes == 0) raise_usage("nbytes must be > 0");
        void* p = nullptr;
        call("ncclMemAlloc", api().MemAlloc, &p, nbytes);
        return Buffer(std::make_shared<BufferState>(p, nbytes));
    }, nb::arg("nbytes"), "ncclMemAlloc: device memory suited to NCCL registration and symmetric windows.");
}

}  // namespace mpbind
