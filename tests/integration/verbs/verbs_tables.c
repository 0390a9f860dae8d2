/*
 * Prints the string and rate tables of whichever libibverbs.so.1 the loader gave this program
 * (it is linked against the system one; LD_LIBRARY_PATH can put the face in its place), headed by
 * that library's path. verbs_abi_test runs it both ways and compares the tables.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>

#include <infiniband/verbs.h>

int main(void) {
    /* The loaded libibverbs.so.1 by its soname, whichever file that is. */
    void *lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
    struct link_map *map = NULL;
    if (lib == NULL || dlinfo(lib, RTLD_DI_LINKMAP, &map) != 0 || map == NULL)
        return 1;
    printf("library %s\n", map->l_name);
    dlclose(lib);
    /* One past each end of every enum too: those answer "unknown" / -1 / IBV_RATE_MAX. */
    for (int v = -1; v <= IBV_WC_TM_RNDV_INCOMPLETE + 2; ++v)
        printf("wc %d %s\n", v, ibv_wc_status_str(v));
    for (int v = -1; v <= IBV_NODE_UNSPECIFIED + 2; ++v)
        printf("node %d %s\n", v, ibv_node_type_str(v));
    for (int v = -1; v <= IBV_PORT_ACTIVE_DEFER + 2; ++v)
        printf("port %d %s\n", v, ibv_port_state_str(v));
    for (int v = -1; v <= IBV_EVENT_WQ_FATAL + 2; ++v)
        printf("event %d %s\n", v, ibv_event_type_str(v));
    for (int v = -1; v <= IBV_RATE_1200_GBPS + 2; ++v) {
        int mult = ibv_rate_to_mult(v), mbps = ibv_rate_to_mbps(v);
        printf("rate %d mult %d mbps %d back %d %d\n", v, mult, mbps, mult_to_ibv_rate(mult),
               mbps_to_ibv_rate(mbps));
    }
    for (int m = -1; m <= 500; ++m)
        printf("mult %d %d\n", m, mult_to_ibv_rate(m));
    static const int mbps[] = {0, 1, 2500, 14062, 14063, 25781, 53125, 103125, 1275000, 1275001};
    for (size_t i = 0; i < sizeof(mbps) / sizeof(mbps[0]); ++i)
        printf("mbps %d %d\n", mbps[i], mbps_to_ibv_rate(mbps[i]));
    return 0;
}
