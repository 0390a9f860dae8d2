/* Prints the mode libibv_extend resolves in a fresh process (the mode is decided once per
 * process, so each probe is its own process). With an argument, also opens that device by name
 * and prints "open=ok" or "open=<errno>". */
#include <errno.h>
#include <stdio.h>

#include <ibv_extend_broker.h>

int main(int argc, char **argv) {
    printf("%s\n", ibvx_mode());
    if (argc > 1) {
        struct ibv_context_extend *ext = ibvx_open_device(argv[1]);
        if (ext != NULL) {
            printf("open=ok\n");
            return ibvx_close_device(ext) == 0 ? 0 : 1;
        }
        printf("open=%d\n", errno);
    }
    return 0;
}
