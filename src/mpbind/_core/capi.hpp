// Calls from the core into the libraries, through the C entry points the generated cy<lib>
// modules export in __pyx_capi__ (so there is one loader, mpbind._infra.loader, and one dlsym table).
//
// The function tables themselves are generated from the IR (bindings/_core_abi/<lib>.hpp, listed in
// codegen/specs/core.toml): each entry knows its C prototype, the signature Cython recorded
// in its capsule, its library, whether it returns a status and whether the GIL is released
// around it. This file holds what every table shares: the entry type, the loader, and
// invoke/call/check.

#pragma once

#include <nanobind/nanobind.h>

#include <memory>
#include <type_traits>

namespace mpbind::capi {

namespace nb = nanobind;

// A library as the core calls it (one per generated header).
struct Library {
    const char* name;         // "nccl"
    const char* module;       // exports the entry points: "mpbind.bindings.cynccl"
    const char* status_type;  // "ncclResult_t", for messages
    long long success;
    bool typed_errors;  // mpbind.bindings.<name>._raise_status raises its statuses (else MpbindError)
};

// What a table entry's function returns: the library's status, or a value.
enum Returns { Status, Value };
// Whether the GIL is released around the call (the IR's policy: kept for O(1) queries).
enum Gil { KeepGil, ReleaseGil };

// How a Cython entry point says it raised (the library or the symbol is missing): it returns
// `value` with a Python exception set (`except? value`; 0 is NULL for pointers), or, with
// `any`, may have raised whatever it returns (`except *`).
struct Except {
    bool any;
    long long value;
};
constexpr Except except_value(long long value) { return {false, value}; }
constexpr Except except_any() { return {true, 0}; }

// One entry of a function table.
template <class Signature, Returns, Gil>
struct Fn;
template <class R, class... P, Returns S, Gil G>
struct Fn<R(P...), S, G> {
    using Pointer = R (*)(P...);
    const Library* library;
    const char* name;
    const char* signature;  // the capsule's name: the C signature as Cython spells it
    Except raised;
    Pointer ptr = nullptr;
};

// The pointer exported as `name` by `module`, checked against the C signature Cython recorded
// for it. Needs the GIL.
void* capi_pointer(const char* module, const char* name, const char* signature);

// `Table` with every entry looked up (once; needs the GIL).
template <class Table>
const Table& table() {
    static const Table* loaded = nullptr;  // filled once under the GIL
    if (loaded == nullptr) {
        auto t = std::make_unique<Table>();
        t->each([](auto& fn) {
            fn.ptr = reinterpret_cast<decltype(fn.ptr)>(capi_pointer(fn.library->module, fn.name, fn.signature));
        });
        loaded = t.release();
    }
    return *loaded;
}

[[noreturn]] void raise_failed(const Library& library, long long status, const char* function);

// Raise the library's error for `status` unless it is success.
inline void check(const Library& library, long long status, const char* function) {
    if (status != library.success) raise_failed(library, status, function);
}
template <class Sig, Returns S, Gil G>
void check(const Fn<Sig, S, G>& fn, long long status) {
    check(*fn.library, status, fn.name);
}

namespace detail {

template <Gil G>
struct GilFor {};
template <>
struct GilFor<ReleaseGil> {
    nb::gil_scoped_release release;
};

template <class R>
bool may_have_raised(const Except& e, R out) {
    if (e.any) return true;
    if constexpr (std::is_pointer_v<R>) {
        return out == nullptr;
    } else if constexpr (std::is_enum_v<R> || std::is_arithmetic_v<R>) {
        return static_cast<long long>(out) == e.value;
    } else {
        return true;
    }
}

// An argument as the C parameter it is passed to: the core keeps enum values as ints.
template <class P, class A>
P pass(A a) {
    if constexpr (std::is_enum_v<P> && std::is_integral_v<A>) {
        return static_cast<P>(a);
    } else {
        return a;
    }
}

}  // namespace detail

// `out`, returned by a call of fn.ptr made without invoke(), after rethrowing what fn's entry
// point raised. Needs the GIL.
template <class R, class... P, Returns S, Gil G>
R returned(const Fn<R(P...), S, G>& fn, R out) {
    if (detail::may_have_raised(fn.raised, out) && PyErr_Occurred()) throw nb::python_error();
    return out;
}

// fn(args...), with the GIL released when its policy says so; rethrows what its entry point
// raised. Returns what the function returned, unchecked.
template <class R, class... P, Returns S, Gil G, class... A>
R invoke(const Fn<R(P...), S, G>& fn, A... args) {
    if constexpr (std::is_void_v<R>) {
        {
            [[maybe_unused]] detail::GilFor<G> gil;
            fn.ptr(detail::pass<P>(args)...);
        }
        if (PyErr_Occurred()) throw nb::python_error();
    } else {
        R out = [&] {
            [[maybe_unused]] detail::GilFor<G> gil;
            return fn.ptr(detail::pass<P>(args)...);
        }();
        return returned(fn, out);
    }
}

// A call of a function returning the library's status: raises its error unless it succeeded.
template <class R, class... P, Gil G, class... A>
void call(const Fn<R(P...), Status, G>& fn, A... args) {
    check(fn, invoke(fn, args...));
}

}  // namespace mpbind::capi
