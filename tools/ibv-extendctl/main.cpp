#include "tools/ibv-extendctl/ctl.h"

int main(int argc, char **argv) {
    return ibvx::ctl::run(argc, argv);
}
