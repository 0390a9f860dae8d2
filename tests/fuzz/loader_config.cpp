// Fuzz target: the driver discovery parsers (providers/loader/discovery.h), which read files in
// /etc/libibverbs_extend.d and the IBV_EXTEND_DRIVERS variable before any driver is dlopen()ed.
// A name that gets through becomes part of a dlopen() path, so what they accept matters as much
// as not crashing.
//
// The whole input is both a config file and a driver list.
//
// Invariants, checked against the input rather than against the parser's own helpers:
//  - parseConfig: every name is 1..128 characters of [A-Za-z0-9_-]; its source is
//    "fuzz.conf:<n>" and line n of the input really is `driver <name>` give or take blanks.
//  - splitDriverList: no item is empty or holds a separator, and the items put back together are
//    the input without its separators.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "providers/loader/discovery.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using ibvx::loader::detail::ConfigName;

constexpr char kSource[] = "fuzz.conf";

bool nameChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

bool blank(char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

// Line n (1-based) of text, split on '\n' only, as the parser counts lines.
bool lineAt(std::string_view text, size_t n, std::string_view *out) {
    for (size_t i = 1; i < n; ++i) {
        size_t nl = text.find('\n');
        if (nl == std::string_view::npos) {
            return false;
        }
        text.remove_prefix(nl + 1);
    }
    *out = text.substr(0, text.find('\n'));
    return true;
}

std::string_view trimBlanks(std::string_view s) {
    while (!s.empty() && blank(s.front())) {
        s.remove_prefix(1);
    }
    while (!s.empty() && blank(s.back())) {
        s.remove_suffix(1);
    }
    return s;
}

void checkConfigName(std::string_view text, const ConfigName &c) {
    FUZZ_CHECK(!c.name.empty() && c.name.size() <= ibvx::loader::detail::kDriverNameMax,
               "accepted a name of %zu characters", c.name.size());
    for (char ch : c.name) {
        FUZZ_CHECK(nameChar(ch), "accepted a name with byte 0x%02x", static_cast<unsigned char>(ch));
    }
    const std::string prefix = std::string(kSource) + ":";
    FUZZ_CHECK(c.source.rfind(prefix, 0) == 0, "source '%s' does not name the file", c.source.c_str());
    std::string digits = c.source.substr(prefix.size());
    FUZZ_CHECK(
        !digits.empty() && digits.size() < 12 && digits.find_first_not_of("0123456789") == std::string::npos,
        "source '%s' has no line number", c.source.c_str());
    std::string_view line;
    FUZZ_CHECK(lineAt(text, std::stoul(digits), &line), "source '%s' names a line past the end",
               c.source.c_str());
    line = trimBlanks(line);
    // "driver", at least one space or tab, the name, then nothing but blanks (already trimmed).
    FUZZ_CHECK(line.size() > 6 && line.substr(0, 6) == "driver" && (line[6] == ' ' || line[6] == '\t'),
               "%s is not a driver line", c.source.c_str());
    FUZZ_CHECK(trimBlanks(line.substr(6)) == c.name, "%s does not name '%s'", c.source.c_str(),
               c.name.c_str());
}

void checkDriverList(std::string_view input) {
    std::vector<std::string> items = ibvx::loader::detail::splitDriverList(input);
    std::string joined;
    for (const std::string &item : items) {
        FUZZ_CHECK(!item.empty(), "empty item in the driver list");
        FUZZ_CHECK(item.find_first_of(":;") == std::string::npos, "item '%s' holds a separator",
                   item.c_str());
        joined += item;
    }
    std::string expected;
    for (char ch : input) {
        if (ch != ':' && ch != ';') {
            expected.push_back(ch);
        }
    }
    FUZZ_CHECK(joined == expected, "the driver list lost or invented bytes (%zu kept of %zu)", joined.size(),
               expected.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::string_view text(reinterpret_cast<const char *>(data), size);
    std::vector<ConfigName> names;
    ibvx::loader::detail::parseConfig(text, kSource, &names);
    for (const ConfigName &c : names) {
        checkConfigName(text, c);
    }
    checkDriverList(text);
    return 0;
}
