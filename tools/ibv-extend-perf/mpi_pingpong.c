/* 8 B ping-pong between MPI ranks 0 and 1 (ibv-extend-perf's middleware scenario runs it with
 * mpirun through ibv-extend-run): after a warm-up, rank 0 times `iters` round trips of MPI_Send +
 * MPI_Recv and prints "rtt_us <mean round trip>" and "half_rtt_us <one way>". The message
 * carries the round number and each side checks it, so a lost or stale message is an error, not
 * a fast figure. Usage: ibvx-mpi-pingpong [iters] [warmup] */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const long iters = argc > 1 ? atol(argv[1]) : 10000;
    const long warmup = argc > 2 ? atol(argv[2]) : 1000;
    if (size != 2 || iters <= 0 || warmup < 0) {
        if (rank == 0) {
            fprintf(stderr, "ibvx-mpi-pingpong: needs exactly 2 ranks and iters > 0 (got %d ranks)\n", size);
        }
        MPI_Finalize();
        return 2;
    }
    const int peer = 1 - rank;
    int bad = 0;
    double t0 = 0;
    for (long i = 0; i < warmup + iters; ++i) {
        if (i == warmup) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        uint64_t out = (uint64_t)i, in = 0;
        if (rank == 0) {
            MPI_Send(&out, 8, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
            MPI_Recv(&in, 8, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(&in, 8, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(&out, 8, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
        }
        bad += in != (uint64_t)i;
    }
    const double secs = MPI_Wtime() - t0;
    int all_bad = 0;
    MPI_Reduce(&bad, &all_bad, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("rtt_us %.3f\nhalf_rtt_us %.3f\nbad_messages %d\n", secs * 1e6 / (double)iters,
               secs * 1e6 / (double)iters / 2, all_bad);
    }
    MPI_Finalize();
    return all_bad == 0 ? 0 : 1;
}
