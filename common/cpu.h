/*
 * cpu.h - spin-wait hint and the barriers of queue-memory fast paths, per architecture.
 *
 * Modelled on rdma-core's util/udma_barrier.h. x86 is strongly ordered (TSO: stores are seen in
 * order, loads are not reordered with loads), so most barriers there only stop the compiler;
 * aarch64 is weakly ordered and needs real fences wherever one agent publishes memory that
 * another reads without a lock. Code that can say what it orders with C11/C++ atomics
 * (release stores, acquire loads) should: these are for the places where the data itself is
 * written with plain stores and a separate flag or doorbell publishes it, as a device-side
 * producer does.
 *
 * Barriers are defined per architecture and an unknown one is an error, so a port has to think
 * about its memory model instead of silently inheriting x86's. The spin hint alone falls back to
 * a compiler barrier.
 *
 * Header-only, plain C11; compiles on its own in C and C++.
 */
#ifndef IBVX_COMMON_CPU_H
#define IBVX_COMMON_CPU_H

/* Stops the compiler from moving memory accesses across it; no instruction. */
#define ibvx_compiler_barrier() __asm__ __volatile__("" ::: "memory")

/* ---- Spin-wait hint ------------------------------------------------------------------ */

/* One iteration of a busy-wait loop: lets the sibling hyperthread run (x86 `pause`) or tells
 * the core it is spinning (aarch64 `yield`). Also a compiler barrier, so a loop around a relaxed
 * load still re-reads memory. */
static inline void ibvx_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    ibvx_compiler_barrier();
#endif
}

/* ---- Barriers ------------------------------------------------------------------------ */
/*
 * ibvx_to_device_barrier()    prior stores to queue memory are visible to the device (another
 *                             CPU, another process, a DMA master) before any later store, e.g.
 *                             WQE bytes before the doorbell record or register that publishes
 *                             them (rdma-core udma_to_device_barrier).
 * ibvx_from_device_barrier()  prior loads (e.g. a CQE's valid bit or a PI) complete before any
 *                             later load of the memory they guard (udma_from_device_barrier).
 * ibvx_full_barrier()         prior stores are visible before any later load: the store-then-
 *                             check of a sleep/wake handshake (Dekker), which neither of the
 *                             two above orders, even on x86.
 * ibvx_mmio_flush_writes()    prior stores, including write-combining MMIO, have left the core
 *                             (mmio_flush_writes).
 *
 * aarch64 uses the outer-shareable domain (`osh`) for the device barriers, as rdma-core does: it
 * covers DMA masters as well as the other CPUs (inner shareable).
 */
#if defined(__x86_64__) || defined(__i386__)
#define ibvx_to_device_barrier() ibvx_compiler_barrier()
#define ibvx_from_device_barrier() __asm__ __volatile__("lfence" ::: "memory")
#define ibvx_full_barrier() __asm__ __volatile__("mfence" ::: "memory")
#define ibvx_mmio_flush_writes() __asm__ __volatile__("sfence" ::: "memory")
#elif defined(__aarch64__)
#define ibvx_to_device_barrier() __asm__ __volatile__("dmb oshst" ::: "memory")
#define ibvx_from_device_barrier() __asm__ __volatile__("dmb oshld" ::: "memory")
#define ibvx_full_barrier() __asm__ __volatile__("dmb osh" ::: "memory")
#define ibvx_mmio_flush_writes() __asm__ __volatile__("dsb st" ::: "memory")
#else
#error "common/cpu.h: no memory barriers defined for this architecture"
#endif

#endif /* IBVX_COMMON_CPU_H */
