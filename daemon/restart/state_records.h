// The vocabulary of a session's state log (docs/restart.md), shared by the commit that writes it
// (restart_state.cpp) and the restore that reads it (restore.cpp): the record types, and the
// names its fds go by in the fd store and across exec.
#pragma once

#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "daemon/core/mapping.h"

namespace ibvx::daemon::state {

// StateFile::Record types.
enum RecordType : uint8_t {
    kHeader = 1,
    kObjectPut = 2,
    kObjectDel = 3,
    kChunkPut = 4,
    kChunkDel = 5,
    kDoorbellPut = 6,
    kDoorbellDel = 7,
    kReply = 8,
    kAlias = 9,         // "name\ncanonical": name's fd is the file stored as canonical
    kChunkBlocks = 10,  // a ChunkDelta: a logged chunk's allocations and frees since its last record
};

inline std::string u64Payload(uint64_t v) {
    return std::string(reinterpret_cast<const char *>(&v), sizeof(v));
}

inline bool u64From(std::string_view p, uint64_t *v) {
    if (p.size() != sizeof(*v)) {
        return false;
    }
    std::memcpy(v, p.data(), sizeof(*v));
    return true;
}

// The wall clock the globals record (when the writer was last alive, when a handover began).
inline uint64_t nowUnixMs() {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count());
}

// 16 lower-case hex digits. By hand: the fd store's names are built on a commit's path, and
// snprintf was ~500 instructions of a mutating call.
inline std::string hex(uint64_t v) {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string out(16, '0');
    for (size_t i = 16; i-- > 0; v >>= 4) {
        out[i] = kDigits[v & 0xf];
    }
    return out;
}

inline constexpr const char *kGlobalName = "ibvx.global";

// Every fd of session s is named "ibvx.s<s>.<what>".
inline std::string prefix(uint64_t session) {
    return "ibvx.s" + std::to_string(session) + ".";
}
inline std::string stateName(uint64_t session) {
    return prefix(session) + "state";
}
inline bool isStateName(const std::string &name) {
    return name.size() > 6 && name.compare(name.size() - 6, 6, ".state") == 0;
}
inline std::string channelName(uint64_t session) {
    return prefix(session) + "ch";
}
inline std::string chunkName(uint64_t session, RegionId r) {
    return prefix(session) + "c" + std::to_string(r);
}
inline std::string doorbellName(uint64_t session, RegionId r) {
    return prefix(session) + "d" + std::to_string(r);
}
inline std::string mrName(uint64_t session, uint64_t handle) {
    return prefix(session) + "m" + hex(handle);
}
// The file of a shared XRC domain handle (XrcdObject::file).
inline std::string xrcdFileName(uint64_t session, uint64_t handle) {
    return prefix(session) + "x" + hex(handle);
}
// An object's own fds (its driver state's) are "<this>0", "<this>1", ...
inline std::string driverFdsPrefix(uint64_t session, uint64_t handle) {
    return prefix(session) + "o" + hex(handle) + ".";
}
inline std::string driverFdName(uint64_t session, uint64_t handle, size_t n) {
    return driverFdsPrefix(session, handle) + std::to_string(n);
}

}  // namespace ibvx::daemon::state
