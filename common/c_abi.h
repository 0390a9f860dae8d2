// What every C entry point of ours (a driver's ops table, libibv_extend.so's functions) needs:
// the reference's "NULL and errno" failure for pointer-returning calls, and a wrapper that keeps
// C++ exceptions (std::bad_alloc from a container) from crossing into a C caller.
#pragma once

#include <cerrno>
#include <type_traits>

namespace ibvx {

// For pointer-returning C calls: NULL, with errno set to the positive err saying why.
template <typename T>
T *failNull(int err) {
    errno = err;
    return nullptr;
}

// CEntry<fn>::call has fn's signature and is noexcept. A throw inside fn becomes the
// reference's out-of-memory answer: NULL + ENOMEM for pointers, -ENOMEM for ints, nothing for
// void. OnThrow, when given, runs first (a driver's warning line, say).
template <auto Fn, void (*OnThrow)() = nullptr>
struct CEntry;
template <typename R, typename... A, R (*Fn)(A...), void (*OnThrow)()>
struct CEntry<Fn, OnThrow> {
    static R call(A... a) noexcept {
        try {
            return Fn(a...);
        } catch (...) {
            if constexpr (OnThrow != nullptr) {
                OnThrow();
            }
            if constexpr (std::is_void_v<R>) {
                return;
            } else if constexpr (std::is_pointer_v<R>) {
                errno = ENOMEM;
                return nullptr;
            } else {
                return -ENOMEM;
            }
        }
    }
};

}  // namespace ibvx
