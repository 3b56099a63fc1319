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

using namespace abi::nccl;
using capi::call;
using capi::check;
using capi::invoke;

// A non-blocking communicator (config.blocking = 0) answers ncclInProgress;
// wait until it is ready so every object of this layer is usable when returned.
// Polled without the GIL: NCCL progresses on its own threads.
void wait_ready(void* comm, const char* function) {
    const auto& poll = api().ncclCommGetAsyncError;
    ncclResult_t status = success, state = in_progress;
    {
        nb::gil_scoped_release release;
        while (status == success && state == in_progress) status = poll.ptr(comm, &state);
    }
    check(poll, capi::returned(poll, status));
    check(library, state, function);
}

ncclConfig_t* config_ptr(const nb::object& config) {
    if (config.is_none()) return nullptr;
    if (!nb::hasattr(config, "ptr") || !nb::hasattr(config, "blocking")) {
        raise_type("config must be an mpbind.bindings.nccl.Config or None, not " +
                   nb::cast<std::string>(nb::str(config.type().attr("__name__"))));
    }
    return reinterpret_cast<ncclConfig_t*>(nb::cast<uintptr_t>(config.attr("ptr")));
}

std::shared_ptr<CommState> adopt(void* comm, ncclResult_t status, const char* function) {
    if (status == in_progress) {
        wait_ready(comm, function);
    } else {
        check(library, status, function);
    }
    auto s = std::make_shared<CommState>(comm);
    const Api& a = api();
    call(a.ncclCommUserRank, comm, &s->rank);
    call(a.ncclCommCount, comm, &s->size);
    call(a.ncclCommCuDevice, comm, &s->device);
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
    void release() override { call(api().ncclMemFree, ptr); }
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
            call(api().ncclCommWindowDeregister, comm->comm, h);
        } else {
            call(api().ncclCommDeregister, comm->comm, h);
        }
    }
};

}  // namespace

CommState::CommState(void* comm) : State("nccl.Communicator"), comm(comm) {}

void CommState::finalize() {
    check_open();
    if (finalized) return;
    drain_queue(this);
    call(api().ncclCommFinalize, comm);
    finalized = true;
}

void CommState::release() {
    if (aborting) {
        call(api().ncclCommAbort, comm);
        return;
    }
    if (!finalized) {
        call(api().ncclCommFinalize, comm);
        finalized = true;
    }
    call(api().ncclCommDestroy, comm);
}

namespace {

Communicator init(int nranks, int rank, nb::handle unique_id, nb::object config) {
    if (nranks < 1) raise_usage("nranks must be >= 1, got " + std::to_string(nranks));
    if (rank < 0 || rank >= nranks) {
        raise_usage("rank must be in [0, " + std::to_string(nranks) + "), got " + std::to_string(rank));
    }
    UniqueId id = to_unique_id(unique_id);
    const auto& fn = api().ncclCommInitRankConfig;
    ncclComm_t comm = nullptr;
    ncclResult_t status = invoke(fn, &comm, nranks, id, rank, config_ptr(config));
    return Communicator(adopt(comm, status, fn.name));
}

std::optional<Communicator> split(Communicator& self, int color, int key, nb::object config) {
    CommState& s = self.get();
    if (color < NCCL_SPLIT_NOCOLOR) {
        raise_usage("color must be >= 0 or " + std::to_string(NCCL_SPLIT_NOCOLOR) + " (no color), got " +
                    std::to_string(color));
    }
    const auto& fn = api().ncclCommSplit;
    ncclComm_t comm = nullptr;
    ncclResult_t status = invoke(fn, s.comm, color, key, &comm, config_ptr(config));
    if (status == success && comm == nullptr) return std::nullopt;  // this rank passed no color
    return Communicator(adopt(comm, status, fn.name));
}

Communicator shrink(Communicator& self, std::vector<int> exclude, nb::object config, int flags) {
    CommState& s = self.get();
    for (int r : exclude) {
        if (r < 0 || r >= s.size) {
            raise_usage("exclude_ranks: rank " + std::to_string(r) + " is not in [0, " + std::to_string(s.size) +
                        ")");
        }
    }
    const auto& fn = api().ncclCommShrink;
    ncclComm_t comm = nullptr;
    ncclResult_t status = invoke(fn, s.comm, exclude.data(), static_cast<int>(exclude.size()), &comm,
                                 config_ptr(config), flags);
    return Communicator(adopt(comm, status, fn.name));
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
            call(api().ncclCommWindowRegister, s.comm, reinterpret_cast<void*>(ptr), size, &h, flags);
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
        call(api().ncclMemAlloc, &p, nbytes);
        return Buffer(std::make_shared<BufferState>(p, nbytes));
    }, nb::arg("nbytes"), "ncclMemAlloc: device memory suited to NCCL registration and symmetric windows.");
}

}  // namespace mpbind
