# Toolchain of the wheel build (make wheel): zig's clang against an older glibc (MPBIND_GLIBC) and
# its libc++ linked statically, so the extension modules need glibc and nothing else of the system.
# Not a cross build: the modules run here too (nanobind's stub generation imports the core).
set(CMAKE_C_COMPILER "${CMAKE_CURRENT_LIST_DIR}/zig-cc")
set(CMAKE_CXX_COMPILER "${CMAKE_CURRENT_LIST_DIR}/zig-c++")
set(CMAKE_AR "${CMAKE_CURRENT_LIST_DIR}/zig-ar" CACHE FILEPATH "")
set(CMAKE_RANLIB "${CMAKE_CURRENT_LIST_DIR}/zig-ranlib" CACHE FILEPATH "")
# No flags of its own: CMake compiles the modules with -fPIC (nanobind's static library too), and
# Python's symbols stay undefined in them, which zig's linker allows in a shared object by default.
