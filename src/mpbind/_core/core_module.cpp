// Python surface of the shared machinery: drain(), queued(), registrations(),
// the Registration handle, stream coercion, and `_testing`, which drives the
// registry, queue and cache with Python callbacks in place of a library so
// their logic can be checked on any machine (16 threads in the CPU tests).

#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "core.hpp"

namespace mpbind {

namespace {

// --- test doubles of a library: every "library call" is a Python callback ---

class TestRegistrationState : public RegistrationState {
public:
    using RegistrationState::RegistrationState;
    nb::object on_deregister;

protected:
    void deregister() override {
        if (on_deregister.is_valid() && !on_deregister.is_none()) on_deregister(ptr, size);
    }
};

class TestOwner : public State {
public:
    TestOwner(bool collective, nb::object on_register, nb::object on_deregister)
        : State("testing.Owner", collective),
          on_register(std::move(on_register)),
          on_deregister(std::move(on_deregister)) {}
    nb::object on_register, on_deregister;
    Registry registry;

protected:
    void release() override {}
};

class TestResource : public State {
public:
    TestResource(bool collective, nb::object on_release)
        : State("testing.Resource", collective), on_release(std::move(on_release)) {}
    nb::object on_release;

protected:
    void release() override {
        if (on_release.is_valid() && !on_release.is_none()) on_release(serial());
    }
};

class TestCached : public State {
public:
    TestCached() : State("testing.Cached", true) {}
    Cache<int, TestCached>* cache = nullptr;

protected:
    void release() override {
        if (cache) cache->erase(this);
    }
    void unreferenced() override {}  // owned by the cache
};

Cache<int, TestCached>& test_cache() {
    static auto* c = new Cache<int, TestCached>();
    return *c;
}

void register_testing(nb::module_& m) {
    nb::module_ t = m.def_submodule(
        "_testing", "Library-free doubles that exercise the registry, teardown queue and cache.");

    using OwnerH = Handle<TestOwner>;
    auto owner = nb::class_<OwnerH>(t, "Owner");
    owner.def(
        "__init__",
        [](OwnerH* self, bool collective, nb::object on_register, nb::object on_deregister) {
            new (self) OwnerH(std::make_shared<TestOwner>(collective, std::move(on_register),
                                                          std::move(on_deregister)));
        },
        nb::arg("collective") = false, nb::arg("on_register") = nb::none(),
        nb::arg("on_deregister") = nb::none());
    owner.def(
        "register",
        [](OwnerH& h, uintptr_t ptr, size_t size, nb::object buffer) {
            TestOwner& o = h.get();
            return o.registry.acquire(o, ptr, size, [&] {
                if (!o.on_register.is_none()) o.on_register(ptr, size);
                auto s = std::make_shared<TestRegistrationState>("testing.Registration", o.collective(),
                                                                 "testing", ptr, size, buffer);
                s->on_deregister = o.on_deregister;
                return std::static_pointer_cast<RegistrationState>(s);
            });
        },
        nb::arg("ptr"), nb::arg("size"), nb::arg("buffer") = nb::none());
    owner.def("registrations", [](OwnerH& h) { return describe(h.get().registry.live()); });
    owner.def("add", [](OwnerH& h, bool collective, nb::object on_release) {
        auto r = std::make_shared<TestResource>(collective, std::move(on_release));
        r->depends_on(h.state());
        h.get().add_child(r);
        return Handle<TestResource>(r);
    }, nb::arg("collective"), nb::arg("on_release") = nb::none());
    bind_lifetime(owner, "Release the owner and, first, everything registered on it.");

    using ResH = Handle<TestResource>;
    auto res = nb::class_<ResH>(t, "Resource");
    res.def(
        "__init__",
        [](ResH* self, bool collective, nb::object on_release) {
            new (self) ResH(std::make_shared<TestResource>(collective, std::move(on_release)));
        },
        nb::arg("collective"), nb::arg("on_release") = nb::none());
    bind_lifetime(res, "Release it.");

    using CachedH = Handle<TestCached>;
    auto cached = nb::class_<CachedH>(t, "Cached");
    bind_lifetime(cached, "Release it and drop it from the cache.");
    t.def("cached", [](int key) {
        return CachedH(test_cache().get(key, [] {
            auto s = std::make_shared<TestCached>();
            s->cache = &test_cache();
            return s;
        }));
    });
    t.def("cache_info", [] { return describe(test_cache().info()); });
    t.def("cache_clear", [] {
        for (auto& s : test_cache().entries()) s->close();
    });
}

}  // namespace

void register_core(nb::module_& m) {
    nb::set_leak_warnings(false);  // objects alive at exit are left to the OS on purpose

    auto reg = nb::class_<Registration>(
        m, "Registration",
        "A reference on a buffer registration. Registering the same (owner, pointer, size) "
        "again returns another reference; the last one closed deregisters.");
    reg.def("close", &Registration::close,
            "Drop this reference; the last one deregisters the buffer (collectively where the "
            "library requires it).")
        .def_prop_ro("closed", &Registration::closed)
        .def_prop_ro("ptr", [](Registration& r) { return r.get().ptr; })
        .def_prop_ro("size", [](Registration& r) { return r.get().size; })
        .def_prop_ro("library", [](Registration& r) { return r.state()->library; })
        .def_prop_ro("kind", [](Registration& r) { return r.state()->kind(); })
        .def_prop_ro("handle", [](Registration& r) { return r.get().lib_handle; },
                     "The library's handle of the registration (an ncclWindow_t, ...), or 0.")
        .def_prop_ro("references", [](Registration& r) { return r.state()->handles(); },
                     "Open references on this registration.")
        .def_prop_ro("buffer", [](Registration& r) { return r.get().buffer; },
                     "The object kept alive while registered.")
        .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
        .def("__exit__", [](Registration& r, nb::args) { r.close(); })
        .def("__repr__", [](Registration& r) {
            auto& s = *r.state();
            return nb::str("<{} ptr=0x{:x} size={} references={}{}>")
                .format(s.kind(), s.ptr, s.size, s.handles(), r.closed() ? " closed" : "");
        });

    m.def("registrations", [] { return describe(all_registrations()); },
          "Every live registration in this process: library, kind, owner serial, ptr, size, references.");
    m.def("drain", [] {
        collect_garbage();
        return drain_queue(nullptr);
    }, "Collect garbage (objects in reference cycles are dropped now, not at a different moment on each "
       "rank), then run the queued collective releases, newest first. Collective: call on every rank.");
    m.def("queued", &queued, "What waits in the teardown queue: (kind, serial), newest first.");
    m.def("stream_handle", [](nb::handle s) { return stream_handle(s); }, nb::arg("stream").none(),
          "The cudaStream_t of an int, None, or a __cuda_stream__/CuPy/PyTorch stream.");
    m.def("dlpack_info", [](nb::ndarray<nb::ro> a) {
        nb::list shape, strides;
        for (size_t i = 0; i < a.ndim(); ++i) {
            shape.append(a.shape(i));
            strides.append(a.stride(i));
        }
        auto dt = a.dtype();
        return nb::make_tuple(reinterpret_cast<uintptr_t>(a.data()), nb::tuple(shape), nb::tuple(strides),
                              dt.code, dt.bits, dt.lanes, a.device_type(), a.device_id());
    }, nb::arg("array"),
          "Import `array` through DLPack: (ptr, shape, strides in elements, dtype code, bits, lanes, "
          "device type, device id). The pointer is valid while `array` lives.");
    m.def("dlpack_view", [](uintptr_t ptr, std::vector<size_t> shape, uint8_t code, uint8_t bits,
                            int device_id, nb::handle owner) {
        nb::dlpack::dtype dt{code, bits, 1};
        return nb::ndarray<nb::array_api>(reinterpret_cast<void*>(ptr), shape.size(), shape.data(), owner, nullptr, dt,
                             nb::device::cuda::value, device_id);
    }, nb::arg("ptr"), nb::arg("shape"), nb::arg("code"), nb::arg("bits"), nb::arg("device_id"),
          nb::arg("owner"),
          "A C-contiguous CUDA array over `ptr` that exports DLPack and keeps `owner` alive.");
    m.def("_at_exit", [] {
        auto pending = queued();
        mark_exiting();
        if (!pending.empty()) {
            std::string msg = "mpbind: " + std::to_string(pending.size()) +
                              " collective release(s) still queued at exit were skipped "
                              "(call drain() or finalize() on every rank before exiting)\n";
            PySys_WriteStderr("%s", msg.c_str());
        }
    });
    nb::module_::import_("atexit").attr("register")(m.attr("_at_exit"));

    register_testing(m);
}

}  // namespace mpbind
