// Registers each library part of the core under mpbind._core.<library>.
#include "modules.hpp"

namespace mpbind {

void register_modules(nanobind::module_& m) {
    register_nccl(m);
    register_cublasmp(m);
    register_nvshmem(m);
    register_cufftmp(m);
    register_abi(m);
}

}  // namespace mpbind
