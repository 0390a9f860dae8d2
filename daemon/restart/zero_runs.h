// The state file's record compression (state_file.h): runs of zero bytes written as a count.
// Restart records are mostly zeros (a softnda QP's driver state is a fixed struct whose
// optional parts are zero, a stored reply carries zeroed attribute structs: about 80 % of a
// CreateQp's bytes), and general compression (zlib's deflate) costs a commit tens of thousands of
// instructions where this costs one pass.
//
// Encoding: tokens until the end, each a varint v then, when v is even, v / 2 literal bytes;
// an odd v stands for (v - 1) / 2 zero bytes.
#pragma once

#include <cstddef>
#include <string>

namespace ibvx::daemon {

// The encoding of raw, into *out; false (out unspecified) when it would not be shorter.
bool encodeZeroRuns(const std::string &raw, std::string *out);
// The bytes encoded holds; false when encoded is malformed or decodes past max_size bytes.
bool decodeZeroRuns(const std::string &encoded, size_t max_size, std::string *out);

}  // namespace ibvx::daemon
