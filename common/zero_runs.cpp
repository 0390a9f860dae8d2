#include "common/zero_runs.h"

#include <cstdint>
#include <cstring>

namespace ibvx {
namespace {

// Shorter runs cost as much to name as to copy.
constexpr size_t kMinRun = 4;

bool getVarint(std::string_view in, size_t *at, uint64_t *v) {
    *v = 0;
    for (unsigned shift = 0; shift < 64 && *at < in.size(); shift += 7) {
        const auto byte = static_cast<uint8_t>(in[(*at)++]);
        *v |= uint64_t{byte & 0x7fu} << shift;
        if ((byte & 0x80) == 0) {
            return true;
        }
    }
    return false;
}

}  // namespace

bool encodeZeroRuns(std::string_view raw, std::string *out) {
    const char *const p = raw.data();
    const size_t n = raw.size();
    // Written in place into raw's size, and given up as soon as it would not be shorter: grown
    // token by token, a ~1 KiB record reallocated several times (a commit encodes every record
    // it writes, and a mutating call's stored reply).
    out->resize(n);
    char *const begin = out->data();
    char *o = begin;
    const char *const end_of_room = begin + n;
    auto put = [&](uint64_t v, const char *bytes, size_t len) {
        char varint[10];
        size_t k = 0;
        for (; v >= 0x80; v >>= 7) {
            varint[k++] = static_cast<char>(v | 0x80);
        }
        varint[k++] = static_cast<char>(v);
        if (static_cast<size_t>(end_of_room - o) < k + len) {
            return false;
        }
        std::memcpy(o, varint, k);
        o += k;
        if (len != 0) {
            std::memcpy(o, bytes, len);
            o += len;
        }
        return true;
    };
    size_t literal = 0;  // where the pending literal bytes start
    size_t i = 0;
    // One pass, at memchr's pace over literal bytes and eight zeros at a time over a run.
    while (i < n) {
        const void *zero = std::memchr(p + i, 0, n - i);
        if (zero == nullptr) {
            break;
        }
        const size_t start = static_cast<size_t>(static_cast<const char *>(zero) - p);
        size_t end = start + 1;
        for (uint64_t word = 0; end + sizeof(word) <= n; end += sizeof(word)) {
            std::memcpy(&word, p + end, sizeof(word));
            if (word != 0) {
                break;
            }
        }
        while (end < n && p[end] == 0) {
            ++end;
        }
        if (end - start >= kMinRun) {
            if (start > literal && !put(uint64_t{start - literal} << 1, p + literal, start - literal)) {
                return false;
            }
            if (!put((uint64_t{end - start} << 1) | 1, nullptr, 0)) {
                return false;
            }
            literal = end;
        }
        i = end;
    }
    if (n > literal && !put(uint64_t{n - literal} << 1, p + literal, n - literal)) {
        return false;
    }
    const auto size = static_cast<size_t>(o - begin);
    out->resize(size);
    return size < n;
}

bool decodeZeroRuns(std::string_view encoded, size_t max_size, std::string *out) {
    // Two passes: the first checks the tokens and sums their sizes, so the output is sized once
    // (zeroed, which the runs then are) and the literals copied in. Appending token by token
    // grew a restore's ~1 KiB QP records through several reallocations each.
    size_t total = 0;
    for (size_t at = 0; at < encoded.size();) {
        uint64_t v = 0;
        if (!getVarint(encoded, &at, &v)) {
            return false;
        }
        const uint64_t n = v >> 1;
        if (n == 0 || n > max_size - total) {
            return false;
        }
        if ((v & 1) == 0) {
            if (n > encoded.size() - at) {
                return false;
            }
            at += static_cast<size_t>(n);
        }
        total += static_cast<size_t>(n);
    }
    out->assign(total, '\0');
    char *to = out->data();
    for (size_t at = 0; at < encoded.size();) {
        uint64_t v = 0;
        (void)getVarint(encoded, &at, &v);
        const auto n = static_cast<size_t>(v >> 1);
        if ((v & 1) == 0) {
            std::memcpy(to, encoded.data() + at, n);
            at += n;
        }
        to += n;
    }
    return true;
}

}  // namespace ibvx
