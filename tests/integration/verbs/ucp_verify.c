// ucp-verify: UCP tagged messages of many sizes between two processes, every byte checked.
//
//   ucp-verify -p PORT [-l ADDR]       the server: listens on ADDR:PORT (default 127.0.0.1)
//                                      for one client
//   ucp-verify -c HOST -p PORT [-r N]  the client: N rounds (default 3) over every size
//
// The client sends each message, the server receives it into a buffer of its own, checks it and
// sends it back, and the client checks the echo. Sizes run from 0 B to 4 MiB, so UCX's eager
// (copied) and rendezvous (zero-copy RDMA, registered memory) protocols both carry data.
//
// Why the buffers move around: UCX caches memory registrations and hooks mmap/munmap/brk to drop
// entries whose pages go away, while the libibverbs face moves the pages of a registered range
// onto a memfd of its own (docs/verbs.md). Each message uses one of three buffers in turn: a
// fresh malloc() (freed after), a fresh anonymous mmap() (unmapped after; the next one of the same
// size usually lands at the same address, so a stale cache entry would hand the NIC the old
// pages), and one long-lived buffer rewritten every time (a cache hit on pages already moved).
// Small heap canaries, allocated between them, must keep their contents throughout: the moves
// take whole pages, so they take the canaries' neighbouring data along.
//
// Exit status 0: everything matched; 1: a mismatch or a UCX error (the first one is printed);
// 2: bad usage.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

static const size_t kSizes[] = {0,       1,      7,     8,     63,     64,         255,     4096,
                                8191,    16384,  65536, 65537, 262144, 524288 + 3, 1048576, 1048576 + 13,
                                2097152, 4194304};
enum { kSizeCount = sizeof(kSizes) / sizeof(kSizes[0]) };
static const size_t kMaxSize = 4194304 + 4096;
enum { kCanaries = 64, kCanarySize = 200 };
static const int kTimeoutSeconds = 60;  // a stuck transfer fails instead of hanging the test
static const ucp_tag_t kEchoBit = (ucp_tag_t)1 << 63;

static void die(const char *what, const char *detail) {
    fprintf(stderr, "ucp-verify: %s: %s\n", what, detail);
    exit(1);
}

static void dieStatus(const char *what, ucs_status_t status) {
    die(what, ucs_status_string(status));
}

// ---- the data: a pattern derived from the message's number, so both sides know it ----

static uint64_t next(uint64_t *state) {  // xorshift64*
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return *state * 2685821657736338717ull;
}

static void fill(unsigned char *buf, size_t size, uint64_t seed) {
    uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < size; i += 8) {
        uint64_t word = next(&state);
        memcpy(buf + i, &word, size - i < 8 ? size - i : 8);
    }
}

// Compares the whole message with its pattern; prints the first difference.
static int check(const unsigned char *buf, size_t size, uint64_t seed, const char *what) {
    uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < size; i += 8) {
        uint64_t word = next(&state);
        size_t n = size - i < 8 ? size - i : 8;
        if (memcmp(buf + i, &word, n) != 0) {
            for (size_t j = 0; j < n; ++j) {
                unsigned char want = ((const unsigned char *)&word)[j];
                if (buf[i + j] != want) {
                    fprintf(stderr,
                            "ucp-verify: %s of message %llu (%zu B): byte %zu is 0x%02x, not 0x%02x\n", what,
                            (unsigned long long)seed, size, i + j, buf[i + j], want);
                    return 0;
                }
            }
        }
    }
    return 1;
}

// ---- buffers: fresh malloc, fresh mmap, or the long-lived one ----

enum Kind { kMalloc, kMmap, kKept, kKinds };
static const char *const kKindNames[] = {"malloc", "mmap", "kept"};

struct Buffer {
    enum Kind kind;
    unsigned char *data;
    size_t size;
};

static unsigned char *kept;  // kMaxSize bytes, allocated once per direction below
static unsigned char *keptEcho;

static struct Buffer acquire(enum Kind kind, size_t size, int echo) {
    struct Buffer b = {kind, NULL, size};
    size_t bytes = size ? size : 1;
    if (kind == kMalloc) {
        b.data = malloc(bytes);
    } else if (kind == kMmap) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        b.data = p == MAP_FAILED ? NULL : p;
    } else {
        b.data = echo ? keptEcho : kept;
    }
    if (b.data == NULL) {
        die("allocating a buffer", strerror(errno));
    }
    return b;
}

static void release(struct Buffer *b) {
    if (b->kind == kMalloc) {
        free(b->data);
    } else if (b->kind == kMmap) {
        munmap(b->data, b->size ? b->size : 1);
    }
    b->data = NULL;
}

// ---- canaries: small heap blocks among the buffers, checked after every message ----

static unsigned char *canary[kCanaries];

static void plantCanary(int i) {
    canary[i] = malloc(kCanarySize);
    if (canary[i] == NULL) {
        die("allocating a canary", strerror(errno));
    }
    fill(canary[i], kCanarySize, 0xca0000u + (unsigned)i);
}

static void checkCanaries(void) {
    for (int i = 0; i < kCanaries; ++i) {
        if (canary[i] != NULL && !check(canary[i], kCanarySize, 0xca0000u + (unsigned)i, "heap canary")) {
            exit(1);
        }
    }
}

// ---- out of band: worker addresses over one TCP connection ----

static void writeAll(int fd, const void *data, size_t size) {
    const char *p = data;
    while (size > 0) {
        ssize_t n = write(fd, p, size);
        if (n <= 0) {
            die("writing to the peer", n < 0 ? strerror(errno) : "closed");
        }
        p += n;
        size -= (size_t)n;
    }
}

static void readAll(int fd, void *data, size_t size) {
    char *p = data;
    while (size > 0) {
        ssize_t n = read(fd, p, size);
        if (n <= 0) {
            die("reading from the peer", n < 0 ? strerror(errno) : "closed");
        }
        p += n;
        size -= (size_t)n;
    }
}

static int serverConnection(const char *listen_addr, int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, listen_addr, &sa.sin_addr) != 1) {
        die("the listen address", listen_addr);
    }
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 1) != 0) {
        die("listening", strerror(errno));
    }
    int conn = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
    if (conn < 0) {
        die("accepting the client", strerror(errno));
    }
    close(fd);
    return conn;
}

static int clientConnection(const char *host, int port) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    char service[16];
    snprintf(service, sizeof(service), "%d", port);
    int rc = getaddrinfo(host, service, &hints, &ai);
    if (rc != 0) {
        die(host, gai_strerror(rc));
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        die("connecting to the server", strerror(errno));
    }
    freeaddrinfo(ai);
    return fd;
}

static void exchangeAddresses(int fd, const ucp_address_t *mine, size_t myLength, ucp_address_t **theirs) {
    uint64_t length = myLength;
    writeAll(fd, &length, sizeof(length));
    writeAll(fd, mine, myLength);
    readAll(fd, &length, sizeof(length));
    if (length == 0 || length > (1u << 20)) {
        die("the peer's worker address", "implausible length");
    }
    *theirs = malloc(length);
    if (*theirs == NULL) {
        die("allocating the peer's address", strerror(errno));
    }
    readAll(fd, *theirs, length);
}

static void barrier(int fd) {
    char byte = 'b';
    writeAll(fd, &byte, 1);
    readAll(fd, &byte, 1);
}

// ---- UCP ----

static ucp_worker_h worker;

static ucs_status_t complete(void *request, const char *what, ucp_tag_recv_info_t *info) {
    if (request == NULL) {
        return UCS_OK;
    }
    if (UCS_PTR_IS_ERR(request)) {
        return UCS_PTR_STATUS(request);
    }
    const time_t deadline = time(NULL) + kTimeoutSeconds;
    ucs_status_t status;
    while ((status = info ? ucp_tag_recv_request_test(request, info) : ucp_request_check_status(request)) ==
           UCS_INPROGRESS) {
        if (ucp_worker_progress(worker) == 0 && time(NULL) > deadline) {
            die(what, "timed out");
        }
    }
    ucp_request_free(request);
    return status;
}

static void sendMessage(ucp_ep_h ep, const struct Buffer *b, ucp_tag_t tag) {
    ucp_request_param_t param = {.op_attr_mask = 0};
    ucs_status_t status = complete(ucp_tag_send_nbx(ep, b->data, b->size, tag, &param), "sending", NULL);
    if (status != UCS_OK) {
        dieStatus("ucp_tag_send_nbx", status);
    }
}

static void receive(const struct Buffer *b, ucp_tag_t tag) {
    ucp_tag_recv_info_t info = {0};
    // A request always, even for a message already here: UCX 1.13 reports the length and tag of
    // an immediate completion nowhere (param.recv_info is not filled for tags).
    ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL};
    ucs_status_t status =
        complete(ucp_tag_recv_nbx(worker, b->data, b->size, tag, (ucp_tag_t)-1, &param), "receiving", &info);
    if (status != UCS_OK) {
        dieStatus("ucp_tag_recv_nbx", status);
    }
    if (info.length != b->size || info.sender_tag != tag) {
        fprintf(stderr, "ucp-verify: received %zu B with tag 0x%llx, expected %zu B with tag 0x%llx\n",
                info.length, (unsigned long long)info.sender_tag, b->size, (unsigned long long)tag);
        exit(1);
    }
}

static void usage(void) {
    fprintf(stderr, "usage: ucp-verify -p PORT [-l ADDR] | ucp-verify -c HOST -p PORT [-r ROUNDS]\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *host = NULL, *listen_addr = "127.0.0.1";
    int port = 0, rounds = 3, opt;
    while ((opt = getopt(argc, argv, "c:l:p:r:")) != -1) {
        if (opt == 'c') {
            host = optarg;
        } else if (opt == 'l') {
            listen_addr = optarg;
        } else if (opt == 'p') {
            port = atoi(optarg);
        } else if (opt == 'r') {
            rounds = atoi(optarg);
        } else {
            usage();
        }
    }
    if (port <= 0 || port > 65535 || rounds <= 0 || optind != argc) {
        usage();
    }
    const int client = host != NULL;

    ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG};
    ucp_context_h context;
    ucs_status_t status = ucp_init(&params, NULL, &context);
    if (status != UCS_OK) {
        dieStatus("ucp_init", status);
    }
    ucp_worker_params_t wparams = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                                   .thread_mode = UCS_THREAD_MODE_SINGLE};
    if ((status = ucp_worker_create(context, &wparams, &worker)) != UCS_OK) {
        dieStatus("ucp_worker_create", status);
    }
    ucp_address_t *mine, *theirs;
    size_t myLength;
    if ((status = ucp_worker_get_address(worker, &mine, &myLength)) != UCS_OK) {
        dieStatus("ucp_worker_get_address", status);
    }
    int oob = client ? clientConnection(host, port) : serverConnection(listen_addr, port);
    exchangeAddresses(oob, mine, myLength, &theirs);
    ucp_worker_release_address(worker, mine);
    ucp_ep_params_t eparams = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS, .address = theirs};
    ucp_ep_h ep;
    if ((status = ucp_ep_create(worker, &eparams, &ep)) != UCS_OK) {
        dieStatus("ucp_ep_create", status);
    }

    // The canaries go first, then the long-lived buffers, then more canaries, so heap pages
    // that registration moves hold data of the program's own.
    for (int i = 0; i < kCanaries / 2; ++i) {
        plantCanary(i);
    }
    kept = malloc(kMaxSize);
    keptEcho = malloc(kMaxSize);
    if (kept == NULL || keptEcho == NULL) {
        die("allocating the long-lived buffers", strerror(errno));
    }
    for (int i = kCanaries / 2; i < kCanaries; ++i) {
        plantCanary(i);
    }

    unsigned long long messages = 0, bytes = 0;
    for (int round = 0; round < rounds; ++round) {
        for (int s = 0; s < kSizeCount; ++s) {
            const uint64_t seq = (uint64_t)round * kSizeCount + (uint64_t)s;
            const enum Kind kind = (enum Kind)((round + s) % kKinds);
            const size_t size = kSizes[s];
            struct Buffer b = acquire(kind, size, 0);
            if (client) {
                fill(b.data, size, seq);
                sendMessage(ep, &b, seq);
                struct Buffer e = acquire((enum Kind)((kind + 1) % kKinds), size, 1);
                memset(e.data, 0xee, size);
                receive(&e, seq | kEchoBit);
                if (!check(e.data, size, seq, kKindNames[e.kind])) {
                    return 1;
                }
                release(&e);
            } else {
                memset(b.data, 0xee, size);
                receive(&b, seq);
                if (!check(b.data, size, seq, kKindNames[b.kind])) {
                    return 1;
                }
                sendMessage(ep, &b, seq | kEchoBit);
            }
            release(&b);
            checkCanaries();
            ++messages;
            bytes += size;
        }
    }

    barrier(oob);  // neither side closes while the other still waits for an echo
    ucp_request_param_t cparams = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = 0};
    status = complete(ucp_ep_close_nbx(ep, &cparams), "closing the endpoint", NULL);
    if (status != UCS_OK) {
        dieStatus("ucp_ep_close_nbx", status);
    }
    barrier(oob);
    close(oob);
    free(theirs);
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
    printf("ucp-verify: %s checked %llu messages, %llu bytes, %d rounds, sizes 0 B to %zu B\n",
           client ? "client" : "server", messages, bytes, rounds, kSizes[kSizeCount - 1]);
    return 0;
}
