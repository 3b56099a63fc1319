// NCCL objects: Communicator (init, split, shrink, finalize/destroy/abort),
// Buffer (ncclMemAlloc/ncclMemFree) and refcounted registrations and windows.

#include "nccl.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cctype>
#include <cstdio>
#include <optional>

#include "arrays.hpp"
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
    BufferState(void* ptr, size_t size, int device) : State("nccl.Buffer"), ptr(ptr), size(size), device(device) {}
    void* ptr;
    size_t size;
    int device;  // current when allocated (-2: unknown), for its use as an array

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

constexpr const char* kOpNames[] = {"sum", "prod", "max", "min", "avg"};  // ncclSum .. ncclAvg

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
void enqueue(const Fn& fn, A... args) {
    ncclResult_t status = invoke(fn, args...);
    if (status != success && status != in_progress) check(fn, status);
}

void issue(Coll kind, const Call& k, void* comm) {
    const Api& a = api();
    auto* send = reinterpret_cast<const void*>(k.send);
    auto* recv = reinterpret_cast<void*>(k.recv);
    auto* stream = reinterpret_cast<cudaStream_t>(k.stream);
    switch (kind) {
        case Coll::kAllReduce: enqueue(a.ncclAllReduce, send, recv, k.count, k.dtype, k.op, comm, stream); break;
        case Coll::kReduce: enqueue(a.ncclReduce, send, recv, k.count, k.dtype, k.op, k.peer, comm, stream); break;
        case Coll::kBroadcast: enqueue(a.ncclBroadcast, send, recv, k.count, k.dtype, k.peer, comm, stream); break;
        case Coll::kAllGather: enqueue(a.ncclAllGather, send, recv, k.count, k.dtype, comm, stream); break;
        case Coll::kReduceScatter:
            enqueue(a.ncclReduceScatter, send, recv, k.count, k.dtype, k.op, comm, stream);
            break;
        case Coll::kAllToAll: enqueue(a.ncclAlltoAll, send, recv, k.count, k.dtype, comm, stream); break;
        case Coll::kSend: enqueue(a.ncclSend, send, k.count, k.dtype, k.peer, comm, stream); break;
        case Coll::kRecv: enqueue(a.ncclRecv, recv, k.count, k.dtype, k.peer, comm, stream); break;
    }
}

void run(Coll kind, Communicator& c, nb::handle sendbuf, nb::handle recvbuf, nb::handle op, nb::handle peer,
         nb::handle stream) {
    CommState& s = c.get();
    issue(kind, plan(kind, {s.rank, s.size, s.device}, sendbuf, recvbuf, op, peer, stream), s.comm);
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
    // The hot calls: one call from the facade each (see plan() and issue()).
    auto none = nb::none();
    comm.def("all_reduce", [](Communicator& c, nb::handle s, nb::handle r, nb::handle op, nb::handle st) {
        run(Coll::kAllReduce, c, s, r, op, none_handle(), st);
    }, nb::arg("sendbuf").none(), nb::arg("recvbuf").none(), nb::arg("op").none() = "sum",
       nb::arg("stream").none() = none, "ncclAllReduce; sendbuf may be recvbuf (in place).")
        .def("reduce", [](Communicator& c, nb::handle s, nb::handle r, nb::handle root, nb::handle op, nb::handle st) {
            run(Coll::kReduce, c, s, r, op, root, st);
        }, nb::arg("sendbuf").none(), nb::arg("recvbuf").none(), nb::arg("root").none(), nb::arg("op").none() = "sum",
           nb::arg("stream").none() = none, "ncclReduce to `root`.")
        .def("broadcast", [](Communicator& c, nb::handle s, nb::handle r, nb::handle root, nb::handle st) {
            run(Coll::kBroadcast, c, s, r, none_handle(), root, st);
        }, nb::arg("sendbuf").none(), nb::arg("recvbuf").none(), nb::arg("root").none(),
           nb::arg("stream").none() = none, "ncclBroadcast from `root`.")
        .def("all_gather", [](Communicator& c, nb::handle s, nb::handle r, nb::handle st) {
            run(Coll::kAllGather, c, s, r, none_handle(), none_handle(), st);
        }, nb::arg("sendbuf").none(), nb::arg("recvbuf").none(), nb::arg("stream").none() = none,
           "ncclAllGather: recvbuf holds size x sendbuf.")
        .def("reduce_scatter", [](Communicator& c, nb::handle s, nb::handle r, nb::handle op, nb::handle st) {
            run(Coll::kReduceScatter, c, s, r, op, none_handle(), st);
        }, nb::arg("sendbuf").none(), nb::arg("recvbuf").none(), nb::arg("op").none() = "sum",
           nb::arg("stream").none() = none, "ncclReduceScatter: sendbuf holds size x recvbuf.")
        .def("all_to_all", [](Communicator& c, nb::handle s, nb::handle r, nb::handle st) {
            run(Coll::kAllToAll, c, s, r, none_handle(), none_handle(), st);
        }, nb::arg("sendbuf").none(), nb::arg("recvbuf").none(), nb::arg("stream").none() = none,
           "ncclAlltoAll: both hold size blocks; block j of sendbuf goes to rank j.")
        .def("send", [](Communicator& c, nb::handle s, nb::handle peer, nb::handle st) {
            run(Coll::kSend, c, s, none_handle(), none_handle(), peer, st);
        }, nb::arg("sendbuf").none(), nb::arg("peer").none(), nb::arg("stream").none() = none, "ncclSend to `peer`.")
        .def("recv", [](Communicator& c, nb::handle r, nb::handle peer, nb::handle st) {
            run(Coll::kRecv, c, none_handle(), r, none_handle(), peer, st);
        }, nb::arg("recvbuf").none(), nb::arg("peer").none(), nb::arg("stream").none() = none,
           "ncclRecv from `peer`.");
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
    m.def("mem_alloc", [](size_t nbytes) {
        if (nbytes == 0) raise_usage("nbytes must be > 0");
        void* p = nullptr;
        int device = current_device();
        call(api().ncclMemAlloc, &p, nbytes);
        return Buffer(std::make_shared<BufferState>(p, nbytes, device));
    }, nb::arg("nbytes"), "ncclMemAlloc: device memory suited to NCCL registration and symmetric windows.");
}

}  // namespace mpbind
