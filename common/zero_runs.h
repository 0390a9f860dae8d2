// Runs of zero bytes written as a count: the restart state file's record compression
// (daemon/restart/state_file.h) and the form a session keeps its stored replies in
// (daemon/core/session.h). Both hold mostly zeros (a softnda QP's driver state is a fixed
// struct whose optional parts are zero, a stored reply carries zeroed attribute structs: about
// 80 % of a CreateQp's bytes), and general compression (zlib's deflate) costs a commit tens of
// thousands of instructions where this costs one pass.
//
// Encoding: tokens until the end, each a varint v then, when v is even, v / 2 literal bytes;
// an odd v stands for (v - 1) / 2 zero bytes.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ibvx {

// The encoding of raw, into *out; false (out unspecified) when it would not be shorter.
bool encodeZeroRuns(std::string_view raw, std::string *out);
// The bytes encoded holds; false when encoded is malformed or decodes past max_size bytes.
bool decodeZeroRuns(std::string_view encoded, size_t max_size, std::string *out);

}  // namespace ibvx
