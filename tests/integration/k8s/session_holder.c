/* Holds one broker session open (a device opened through libibv_extend) until the file named by
 * argv[2] exists, so a test can look at the broker's sessions while it lives. Prints "open=ok"
 * once the session is up, or "open=<errno>". */
#include <errno.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include <ibv_extend_broker.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: session_holder DEVICE STOP-FILE\n");
        return 2;
    }
    struct ibv_context_extend *ext = ibvx_open_device(argv[1]);
    if (ext == NULL) {
        printf("open=%d\n", errno);
        return 1;
    }
    printf("open=ok\n");
    fflush(stdout);
    /* Bounded: a test that dies never leaves this behind for long. */
    for (int i = 0; i < 1200 && access(argv[2], F_OK) != 0; ++i) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return ibvx_close_device(ext) == 0 ? 0 : 1;
}
