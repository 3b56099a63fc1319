// Registers each library part of the core under mpbind._core.<library>.
#include "modules.hpp"

namespace mpbind {

void register_modules(nanobind::module_& m) {
    register_nccl(m);
    register_cufftmp(m);
}

}  // namespace mpbind
