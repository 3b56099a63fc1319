// mpbind._core._testing: library-free doubles that drive the registry, the teardown queue and
// the cache with Python callbacks in place of a library, so that their logic can be checked on
// any machine (16 threads in the CPU tests). Their kinds are rows of the lifetime table too.

#include <nanobind/stl/string.h>

#include "core.hpp"
#include "register.hpp"

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

// An owner of registrations and resources; `collective` makes what it registers collective.
class TestOwner : public State {
public:
    TestOwner(bool collective, nb::object on_register, nb::object on_deregister)
        : State("testing.Owner"),
          collective(collective),
          on_register(std::move(on_register)),
          on_deregister(std::move(on_deregister)) {}
    const bool collective;
    nb::object on_register, on_deregister;
    Registry registry;

protected:
    void release() override {}
};

class TestResource : public State {
public:
    TestResource(bool collective, nb::object on_release)
        : State(collective ? "testing.CollectiveResource" : "testing.Resource"), on_release(std::move(on_release)) {}
    nb::object on_release;

protected:
    void release() override {
        if (on_release.is_valid() && !on_release.is_none()) on_release(serial());
    }
};

class TestCached : public State {
public:
    TestCached() : State("testing.Cached") {}
    Cache<int, TestCached>* cache = nullptr;

protected:
    void release() override {
        if (cache) cache->erase(this);
    }
};

Cache<int, TestCached>& test_cache() {
    static auto* c = new Cache<int, TestCached>();
    return *c;
}

// A Python int as the 64-bit operand of checked_mul/checked_add (OverflowError when it is none).
template <class T>
T operand(nb::handle v) {
    if (!PyLong_Check(v.ptr())) raise_type("an operand must be an int, not " + py_type_name(v));
    if constexpr (std::is_signed_v<T>) {
        long long x = PyLong_AsLongLong(v.ptr());
        if (x == -1 && PyErr_Occurred()) throw nb::python_error();
        return static_cast<T>(x);
    } else {
        unsigned long long x = PyLong_AsUnsignedLongLong(v.ptr());
        if (x == static_cast<unsigned long long>(-1) && PyErr_Occurred()) throw nb::python_error();
        return static_cast<T>(x);
    }
}

template <class T>
nb::object arithmetic(const std::string& op, nb::handle a, nb::handle b) {
    T x = operand<T>(a), y = operand<T>(b);
    if (op == "mul") return nb::cast(checked_mul(x, y, "the product"));
    if (op == "add") return nb::cast(checked_add(x, y, "the sum"));
    raise_usage("op must be 'mul' or 'add', not '" + op + "'");
}

}  // namespace

void register_testing(nb::module_& m) {
    nb::module_ t = m.def_submodule(
        "_testing", "Library-free doubles that exercise the registry, teardown queue and cache.");

    using OwnerRef = Ref<TestOwner>;
    auto owner = nb::class_<OwnerRef>(t, "Owner");
    owner.def(
        "__init__",
        [](OwnerRef* self, bool collective, nb::object on_register, nb::object on_deregister) {
            new (self) OwnerRef(std::make_shared<TestOwner>(collective, std::move(on_register),
                                                            std::move(on_deregister)));
        },
        nb::arg("collective") = false, nb::arg("on_register") = nb::none(),
        nb::arg("on_deregister") = nb::none());
    owner.def(
        "register",
        [](OwnerRef& h, uintptr_t ptr, size_t size, nb::object buffer) {
            TestOwner& o = h.get();
            return o.registry.acquire(o, ptr, size, [&] {
                if (!o.on_register.is_none()) o.on_register(ptr, size);
                auto s = std::make_shared<TestRegistrationState>(
                    o.collective ? "testing.CollectiveRegistration" : "testing.Registration", ptr, size, buffer);
                s->on_deregister = o.on_deregister;
                return std::static_pointer_cast<RegistrationState>(s);
            });
        },
        nb::arg("ptr"), nb::arg("size"), nb::arg("buffer") = nb::none());
    owner.def("registrations", [](OwnerRef& h) { return describe(h.get().registry.live()); });
    owner.def("add", [](OwnerRef& h, bool collective, nb::object on_release) {
        auto r = std::make_shared<TestResource>(collective, std::move(on_release));
        r->depends_on(h.state());
        h.get().add_child(r);
        return Ref<TestResource>(r);
    }, nb::arg("collective"), nb::arg("on_release") = nb::none());
    bind_lifetime(owner, "Release the owner and, first, everything registered on it.");

    using ResourceRef = Ref<TestResource>;
    auto res = nb::class_<ResourceRef>(t, "Resource");
    res.def(
        "__init__",
        [](ResourceRef* self, bool collective, nb::object on_release) {
            new (self) ResourceRef(std::make_shared<TestResource>(collective, std::move(on_release)));
        },
        nb::arg("collective"), nb::arg("on_release") = nb::none());
    bind_lifetime(res, "Release it.");

    using CachedRef = Ref<TestCached>;
    auto cached = nb::class_<CachedRef>(t, "Cached");
    bind_lifetime(cached, "Release it and drop it from the cache.");
    t.def("cached", [](int key) {
        return CachedRef(test_cache().get(key, [] {
            auto s = std::make_shared<TestCached>();
            s->cache = &test_cache();
            return s;
        }));
    });
    t.def("checked", [](const std::string& op, nb::handle a, nb::handle b, bool is_unsigned) {
        return is_unsigned ? arithmetic<uint64_t>(op, a, b) : arithmetic<int64_t>(op, a, b);
    }, nb::arg("op"), nb::arg("a"), nb::arg("b"), nb::arg("unsigned") = false,
       "The core's checked_mul ('mul') or checked_add ('add') of a and b as int64 (uint64 with `unsigned`): "
       "the result, or OverflowError when it does not fit.");
    t.def("cache_info", [] { return describe(test_cache().info()); });
    t.def("cache_clear", [] {
        for (auto& s : test_cache().entries()) s->close();
    });
}

}  // namespace mpbind
