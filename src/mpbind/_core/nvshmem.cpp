// NVSHMEM objects: the process-wide Runtime (finalize), Teams (split, destroy),
// symmetric allocations (nvshmem_malloc/calloc/align, nvshmem_free) and
// refcounted local registrations (nvshmemx_buffer_register).
//
// Initialisation itself runs in Python through the flat bindings (its attribute
// structures live there); Runtime::start wraps it so that the checks on a second
// initialisation and the creation of the state happen under one lock.

#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <map>
#include <optional>

#include "abi/nvshmem.hpp"
#include "core.hpp"
#include "register.hpp"

namespace mpbind::nvshmem {

namespace {

using namespace abi::nvshmem;
using capi::call;
using capi::invoke;

const char* const kFinalizedMessage =
    "NVSHMEM was finalized in this process and cannot be used or initialised again "
    "(NVSHMEM allows one initialisation per process): keep one Runtime for the process's lifetime";
const char* const kNotInitializedMessage = "NVSHMEM is not initialised: call mpbind.nvshmem.init() first";

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
    std::shared_ptr<RuntimeState> runtime;
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
    invoke(api().nvshmemx_hostlib_finalize);
}

// The live runtime, or UsageError saying why there is none.
std::shared_ptr<RuntimeState> current() {
    Global& g = global();
    Lock l = lock(g.mu);
    if (g.runtime && !g.runtime->closed()) return g.runtime;
    if (g.finalized) raise_usage(kFinalizedMessage);
    raise_usage(kNotInitializedMessage);
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
    if (ptr + nbytes > s->ptr + s->nbytes) return nullptr;
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
        if (!predefined) invoke(api().nvshmem_team_destroy, team);
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
    return Runtime(g.runtime);
}

nb::dict describe_allocation(const AllocState& s) {
    nb::dict d;
    d["ptr"] = s.ptr;
    d["nbytes"] = s.nbytes;
    d["serial"] = s.serial();
    d["references"] = s.refs();
    return d;
}

}  // namespace

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
            size_t offset = uint_arg(offset_arg, "offset");
            AllocState& s = a.get();
            int n = open_runtime(s.runtime).npes;
            if (pe < 0 || pe >= n) {
                raise_usage("pe must be in [0, " + std::to_string(n) + "), got " + std::to_string(pe));
            }
            if (offset >= s.nbytes) raise_usage("offset " + std::to_string(offset) + " is past the allocation");
            void* p = invoke(api().nvshmem_ptr, reinterpret_cast<const void*>(s.ptr + offset), pe);
            if (p == nullptr) return std::nullopt;
            return reinterpret_cast<uintptr_t>(p);
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

    m.def("start", &start, nb::arg("params"), nb::arg("init"), nb::arg("require_initialized") = true,
          nb::sig("def start(params: collections.abc.Mapping[str, str], init: collections.abc.Callable[[], object], "
                  "require_initialized: bool = True) -> Runtime"),
          "Run `init()` (the flat initialisation, collective; mpbind.nvshmem.init() builds it) unless a runtime is "
          "live, then make the runtime; with a live runtime, return it when `params` are the same and raise "
          "UsageError naming what differs otherwise. With `require_initialized`, raise MpbindError unless NVSHMEM "
          "is initialised after `init()` (tests adopt a no-op initialisation without it).");
    m.def("allocate", &allocate, nb::arg("nbytes"), nb::arg("zero") = false, nb::arg("alignment") = 0,
          "nvshmem_malloc, nvshmem_calloc (zero=True) or nvshmem_align (alignment > 0). Collective.");
    m.def("runtime", [] { return Runtime(current()); },
          "The live runtime; UsageError before init() or after finalize().");
    m.def("is_initialized", [] {
        Global& g = global();
        Lock l = lock(g.mu);
        return g.runtime != nullptr && !g.runtime->closed();
    });
    m.def("is_finalized", [] {
        Global& g = global();
        Lock l = lock(g.mu);
        return g.finalized;
    }, "True once NVSHMEM was finalized in this process (it cannot be initialised again).");
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
