/* mpi-verify: an Open MPI job whose every received byte is checked, for the Open MPI case of
 * ucx_test.cpp (ranks as unprivileged tenants through ibv-extend-run, pml ucx, osc ucx).
 *   - point-to-point: rank 0 and rank 1 ping-pong 20 messages of each size from 0 B to 4 MiB
 *     (eager and rendezvous), the receiver checking every byte and answering with each byte + 1;
 *   - MPI_Allreduce of every rank's number, MPI_Alltoall of 4 KiB blocks naming sender and receiver;
 *   - one-sided: every rank MPI_Puts 64 KiB into its right neighbour's window and MPI_Gets its
 *     left neighbour's, between fences.
 * Prints one line of counts on rank 0; exits 1 if any byte was wrong, 2 on bad arguments. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kRounds = 20, kBlock = 4096, kWindow = 65536 };

static unsigned char pattern(size_t i, unsigned seed) {
    return (unsigned char)(i * 7u + seed * 13u + (i >> 8));
}

/* Rank 0 sends, rank 1 checks and answers with every byte + 1, rank 0 checks that. */
static long pingPong(int rank, size_t n, unsigned seed) {
    long bad = 0;
    unsigned char *buf = malloc(n ? n : 1);
    if (buf == NULL) {
        return 1;
    }
    if (rank == 0) {
        for (size_t i = 0; i < n; ++i)
            buf[i] = pattern(i, seed);
        MPI_Send(buf, (int)n, MPI_BYTE, 1, (int)seed, MPI_COMM_WORLD);
        MPI_Recv(buf, (int)n, MPI_BYTE, 1, (int)seed, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (size_t i = 0; i < n; ++i)
            bad += buf[i] != (unsigned char)(pattern(i, seed) + 1);
    } else if (rank == 1) {
        MPI_Recv(buf, (int)n, MPI_BYTE, 0, (int)seed, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (size_t i = 0; i < n; ++i) {
            bad += buf[i] != pattern(i, seed);
            buf[i]++;
        }
        MPI_Send(buf, (int)n, MPI_BYTE, 0, (int)seed, MPI_COMM_WORLD);
    }
    free(buf);
    return bad;
}

static long collectives(int rank, int size) {
    long bad = 0;
    long mine = rank + 1, sum = 0;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    bad += sum != (long)size * (size + 1) / 2;

    unsigned char *out = malloc((size_t)size * kBlock), *in = malloc((size_t)size * kBlock);
    if (out == NULL || in == NULL) {
        free(out);
        free(in);
        return 1;
    }
    for (int to = 0; to < size; ++to)
        for (size_t i = 0; i < kBlock; ++i)
            out[(size_t)to * kBlock + i] = pattern(i, (unsigned)(rank * 31 + to));
    MPI_Alltoall(out, kBlock, MPI_BYTE, in, kBlock, MPI_BYTE, MPI_COMM_WORLD);
    for (int from = 0; from < size; ++from)
        for (size_t i = 0; i < kBlock; ++i)
            bad += in[(size_t)from * kBlock + i] != pattern(i, (unsigned)(from * 31 + rank));
    free(out);
    free(in);
    return bad;
}

static long oneSided(int rank, int size) {
    long bad = 0;
    unsigned char *base, *mine = malloc(kWindow), *got = malloc(kWindow);
    MPI_Win win;
    if (mine == NULL || got == NULL) {
        free(mine);
        free(got);
        return 1;
    }
    MPI_Win_allocate(kWindow, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    const int right = (rank + 1) % size, left = (rank + size - 1) % size;
    for (size_t i = 0; i < kWindow; ++i)
        mine[i] = pattern(i, (unsigned)(100 + rank));
    MPI_Win_fence(0, win);
    MPI_Put(mine, kWindow, MPI_BYTE, right, 0, kWindow, MPI_BYTE, win);
    MPI_Win_fence(0, win);
    for (size_t i = 0; i < kWindow; ++i)
        bad += base[i] != pattern(i, (unsigned)(100 + left));
    MPI_Win_fence(0, win);
    MPI_Get(got, kWindow, MPI_BYTE, left, 0, kWindow, MPI_BYTE, win);
    MPI_Win_fence(0, win);
    /* left's window holds what left's left put there. */
    for (size_t i = 0; i < kWindow; ++i)
        bad += got[i] != pattern(i, (unsigned)(100 + (left + size - 1) % size));
    MPI_Win_free(&win);
    free(mine);
    free(got);
    return bad;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2) {
        if (rank == 0)
            fprintf(stderr, "mpi-verify: needs at least 2 ranks\n");
        MPI_Finalize();
        return 2;
    }
    const size_t sizes[] = {0, 1, 8, 1000, 4096, 65536, 1 << 20, 4 << 20};
    long bad = 0, round_trips = 0;
    for (unsigned s = 0; s < sizeof(sizes) / sizeof(sizes[0]); ++s) {
        for (unsigned r = 0; r < kRounds; ++r, ++round_trips)
            bad += pingPong(rank, sizes[s], s * kRounds + r);
    }
    const long p2p_bad = bad;
    bad += collectives(rank, size);
    const long coll_bad = bad - p2p_bad;
    bad += oneSided(rank, size);
    long all[3] = {p2p_bad, coll_bad, bad - p2p_bad - coll_bad}, sum[3] = {0, 0, 0};
    MPI_Reduce(all, sum, 3, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf(
            "mpi-verify: %d ranks, %ld round trips of 0 B-4 MiB, allreduce, alltoall, put/get: "
            "%ld + %ld + %ld bad bytes\n",
            size, round_trips, sum[0], sum[1], sum[2]);
    }
    MPI_Finalize();
    return rank == 0 && sum[0] + sum[1] + sum[2] != 0 ? 1 : 0;
}
