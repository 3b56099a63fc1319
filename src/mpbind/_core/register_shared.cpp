// The shared names of mpbind._core: drain(), queued(), registrations(), lifetimes(), the
// Registration and Composite classes, stream and DLPack helpers, and the report of what is queued at exit.

#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <string>

#include "arrays.hpp"
#include "core.hpp"
#include "register.hpp"

namespace mpbind {

namespace {

// At interpreter exit: from now on no release runs (a collective one would hang the other ranks, which
// may be exiting too). Say on stderr what was dropped and queued, then, one line per kind, what is
// still referenced; the process's end reclaims both.
void report_at_exit() {
    auto pending = queued();
    auto open = alive();
    mark_exiting();
    std::string out;
    if (!pending.empty()) {
        std::string which;
        for (auto& [kind, serial] : pending) {
            which += (which.empty() ? "" : ", ") + kind + " (serial " + std::to_string(serial) + ")";
        }
        out += "mpbind: " + std::to_string(pending.size()) +
               " collective release(s) still queued at exit were skipped: " + which +
               " (call drain() or finalize() on every rank before exiting)\n";
    }
    std::map<std::string, std::vector<uint64_t>> by_kind;  // referenced, not queued
    for (auto& [kind, serial] : open) {
        bool waiting = false;
        for (auto& q : pending) waiting = waiting || q.second == serial;
        // Predefined NVSHMEM teams and the like have nothing to release.
        if (!waiting && std::string(lifetime(kind.c_str()).release).rfind("nothing", 0) != 0) {
            by_kind[kind].push_back(serial);
        }
    }
    constexpr size_t kShown = 8;
    for (auto& [kind, serials] : by_kind) {
        std::string list;
        for (size_t i = 0; i < serials.size() && i < kShown; ++i) {
            list += (i ? ", " : "") + std::to_string(serials[i]);
        }
        if (serials.size() > kShown) list += ", ...";
        out += "mpbind: " + std::to_string(serials.size()) + " " + kind + " still open at exit (serial" +
               (serials.size() > 1 ? "s " : " ") + list + "), not released: nothing collective runs at exit\n";
    }
    if (out.empty()) return;
    // Not PySys_WriteStderr: it cuts its output at 1000 bytes.
    nb::object err = nb::module_::import_("sys").attr("stderr");
    if (!err.is_none()) {
        err.attr("write")(out);
        err.attr("flush")();
    }
}

}  // namespace

void register_shared(nb::module_& m) {
    nb::set_leak_warnings(false);  // objects alive at exit are left to the OS on purpose

    auto reg = nb::class_<RegistrationRef>(
        m, "Registration",
        "A reference on a buffer registration. Registering the same (owner, pointer, size) "
        "again returns another reference; the last one closed deregisters.");
    refuse_copies(reg);
    reg.def("close", &RegistrationRef::close,
            "Drop this reference; the last one deregisters the buffer (collectively where the "
            "library requires it).")
        .def_prop_ro("closed", &RegistrationRef::closed)
        .def_prop_ro("ptr", [](RegistrationRef& r) { return r.get().ptr; })
        .def_prop_ro("size", [](RegistrationRef& r) { return r.get().size; })
        .def_prop_ro("library", [](RegistrationRef& r) { return r.state()->library(); })
        .def_prop_ro("kind", [](RegistrationRef& r) { return r.state()->kind(); })
        .def_prop_ro("handle", [](RegistrationRef& r) { return r.get().lib_handle; },
                     "The library's handle of the registration (an ncclWindow_t, ...), or 0.")
        .def_prop_ro("references", [](RegistrationRef& r) { return r.state()->refs(); },
                     "Open references on this registration.")
        .def_prop_ro("buffer", [](RegistrationRef& r) { return r.get().buffer; },
                     "The object kept alive while registered.")
        .def("__enter__", [](nb::handle self) { return nb::borrow(self); }, nb::sig(kEnterSig))
        .def("__exit__", [](RegistrationRef& r, nb::args) { r.close(); }, nb::sig(kExitSig))
        .def("__repr__", [](RegistrationRef& r) {
            auto& s = *r.state();
            return nb::str("<{} ptr=0x{:x} size={} references={}{}>")
                .format(s.kind(), s.ptr, s.size, s.refs(), r.closed() ? " closed" : "");
        });

    using Composite = Ref<CompositeState>;
    auto composite = nb::class_<Composite>(
        m, "Composite",
        "The object of a plan made of several owned objects (its parts): close() closes them newest first "
        "(the reverse of the order given), once; dropped unclosed, each part follows its own lifetime row.");
    composite
        .def("__init__", [](Composite* self, nb::iterable parts, std::string what) {
            std::vector<nb::object> held;
            for (nb::handle p : parts) {
                if (!nb::hasattr(p, "close")) {
                    raise_type("a part of " + what + " must have close(), not " + py_type_name(p));
                }
                held.push_back(nb::borrow(p));
            }
            new (self) Composite(std::make_shared<CompositeState>(std::move(held), std::move(what)));
        }, nb::arg("parts"), nb::arg("what"),
           nb::sig("def __init__(self, parts: collections.abc.Iterable[object], what: str) -> None"))
        .def_prop_ro("parts", [](Composite& c) {
            nb::list out;
            for (auto& p : c.state()->parts()) out.append(p);
            return nb::tuple(out);
        }, nb::sig("def parts(self) -> tuple[object, ...]"), "Its parts, oldest first.")
        .def_prop_ro("what", [](Composite& c) { return c.state()->what; })
        .def("__repr__", [](Composite& c) {
            auto& s = *c.state();
            if (s.closed()) return "<" + s.what + " (closed)>";
            std::string out = "<" + s.what + ":";
            const char* sep = " ";
            for (auto& p : s.parts()) {
                out += sep + nb::cast<std::string>(nb::repr(p));
                sep = ", ";
            }
            return out + ">";
        });
    bind_lifetime(composite, "Close its parts, newest first (collective where theirs are). Idempotent.");

    m.def("registrations", [] { return describe(all_registrations()); },
          nb::sig("def registrations() -> list[dict[str, typing.Any]]"),
          "Every live registration in this process: library, kind, owner serial, ptr, size, references.");
    m.def("drain", [] {
        collect_garbage();
        return drain_queue(nullptr);
    }, "Collect garbage (objects in reference cycles are dropped now, not at a different moment on each "
       "rank), then run the queued releases (collective ones, and kernel libraries), newest first. Collective: "
       "call on every rank.");
    m.def("queued", &queued, "What waits in the teardown queue: (kind, serial), newest first.");
    m.def("alive", &alive,
          "Every object not yet released (still referenced, or queued): (kind, serial), oldest first.");
    m.def("lifetimes", [] {
        nb::list out;
        for (const Lifetime& row : lifetimes()) {
            nb::dict d;
            d["kind"] = row.kind;
            d["drop"] = drop_name(row.drop);
            d["collective"] = row.collective;
            d["parent"] = *row.parent ? nb::object(nb::str(row.parent)) : nb::none();
            d["release"] = row.release;
            out.append(d);
        }
        return out;
    }, nb::sig("def lifetimes() -> list[dict[str, typing.Any]]"), "The lifetime table, one dict per object kind: kind; drop (what happens when the last reference "
       "goes without close(): at_once, queued, queued_once_collective, by_owner, never); collective (its "
       "release is); parent (the kind whose close() releases it first, or None); release (what releases it).");
    m.def("dlpack_view", [](uintptr_t ptr, std::vector<size_t> shape, uint8_t code, uint8_t bits,
                            int device_id, nb::handle owner) {
        arrays::check_export(ptr, shape, code, bits, device_id, "dlpack_view");  // the consumer trusts all of it
        nb::dlpack::dtype dt{code, bits, 1};
        return nb::ndarray<nb::array_api>(reinterpret_cast<void*>(ptr), shape.size(), shape.data(), owner, nullptr, dt,
                             nb::device::cuda::value, device_id);
    }, nb::arg("ptr"), nb::arg("shape"), nb::arg("code"), nb::arg("bits"), nb::arg("device_id"),
          nb::arg("owner"),
          "A C-contiguous CUDA array over `ptr` that exports DLPack and keeps `owner` alive.");
    m.def("_at_exit", &report_at_exit,
          "Stop every release (nothing collective runs at exit) and say on stderr what is left.");
    nb::module_::import_("atexit").attr("register")(m.attr("_at_exit"));
}

}  // namespace mpbind
