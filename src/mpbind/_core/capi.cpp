// The loader of the core's function tables (capsule lookup and signature check), their errors,
// and mpbind._core._abi, which lists and loads every table (see capi.hpp).

#include "capi.hpp"

#include <cstring>
#include <string>

#include "mpbind/bindings/_core_abi/tables.hpp"
#include "core.hpp"
#include "register.hpp"

namespace mpbind {

namespace capi {

void* capi_pointer(const char* module, const char* name, const char* signature) {
    nb::object mod = nb::module_::import_(module);
    nb::object table = mod.attr("__pyx_capi__");
    PyObject* capsule = PyDict_GetItemString(table.ptr(), name);  // borrowed
    if (capsule == nullptr || !PyCapsule_CheckExact(capsule)) {
        PyErr_Format(PyExc_RuntimeError, "%s exports no C function %s", module, name);
        throw nb::python_error();
    }
    const char* recorded = PyCapsule_GetName(capsule);
    if (recorded == nullptr || std::strcmp(recorded, signature) != 0) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s.%s has signature '%s' but mpbind._core was built for '%s'; rebuild mpbind",
                     module, name, recorded ? recorded : "?", signature);
        throw nb::python_error();
    }
    void* p = PyCapsule_GetPointer(capsule, recorded);
    if (p == nullptr) throw nb::python_error();
    return p;
}

void raise_failed(const Library& library, long long status, const char* function) {
    if (library.typed_errors) raise_status(library.name, static_cast<int>(status), function);
    raise_mpbind(std::string(function) + " failed with " + library.status_type + " " + std::to_string(status));
}

}  // namespace capi

void register_abi(nb::module_& parent) {
    nb::module_ m = parent.def_submodule(
        "_abi", "The core's function tables (generated from the IR into src/mpbind/bindings/_core_abi).");
    m.def("entries", [] {
        nb::list out;
        abi::each_table([&](auto table) {
            table.each([&](auto& fn) { out.append(nb::make_tuple(fn.library->module, fn.name, fn.signature)); });
        });
        return out;
    }, "(module, function, capsule signature) of every entry, in table order.");
    m.def("load", [] {
        size_t entries = 0;
        abi::each_table([&](auto table) {
            capi::table<decltype(table)>();
            table.each([&](auto&) { ++entries; });
        });
        return entries;
    }, "Look up every entry in its module's __pyx_capi__, checking each signature (loads no library); "
       "returns how many.");
}

}  // namespace mpbind
