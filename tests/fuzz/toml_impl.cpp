// toml++'s parser compiled into the libFuzzer binary of daemon_config. Debian ships toml++ as a
// shared library built without coverage, so without this copy libFuzzer would see the TOML
// parser as a black box and could only guess its way into the config code behind it.
#define TOML_IMPLEMENTATION
#include <toml++/toml.h>
