/*
 * What the XRC test programs (xrc_behaviour.c, xrc_shared.c, xrc_open_qp.c, xrc_wire.c) share: a
 * domain opened by file, its targets, initiators and SRQs, and two processes of the same program
 * talking over pipes. Include after
 * rc_helpers.h (fail()).
 */
#ifndef IBVX_TESTS_XRC_HELPERS_H
#define IBVX_TESTS_XRC_HELPERS_H

#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* ibv_open_xrcd on the file fd with oflags (errno cleared first, so a NULL says why). */
static inline struct ibv_xrcd *open_xrcd(struct ibv_context *ctx, int fd, int oflags) {
    struct ibv_xrcd_init_attr xa;
    memset(&xa, 0, sizeof(xa));
    xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    xa.fd = fd;
    xa.oflags = oflags;
    errno = 0;
    return ibv_open_xrcd(ctx, &xa);
}

/* A target QP in xrcd; NULL (errno) when it cannot be made. */
static inline struct ibv_qp *xrc_target(struct ibv_context *ctx, struct ibv_xrcd *xrcd) {
    struct ibv_qp_init_attr_ex ia;
    memset(&ia, 0, sizeof(ia));
    ia.qp_type = IBV_QPT_XRC_RECV;
    ia.comp_mask = IBV_QP_INIT_ATTR_XRCD;
    ia.xrcd = xrcd;
    return ibv_create_qp_ex(ctx, &ia);
}

/* An initiator of pd completing on cq, max_send_wr deep with one SGE; NULL (errno) when it cannot
 * be made. */
static inline struct ibv_qp *xrc_initiator(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *cq,
                                           uint32_t max_send_wr) {
    struct ibv_qp_init_attr_ex ia;
    memset(&ia, 0, sizeof(ia));
    ia.qp_type = IBV_QPT_XRC_SEND;
    ia.comp_mask = IBV_QP_INIT_ATTR_PD;
    ia.pd = pd;
    ia.send_cq = cq;
    ia.cap.max_send_wr = max_send_wr;
    ia.cap.max_send_sge = 1;
    return ibv_create_qp_ex(ctx, &ia);
}

/* An XRC SRQ of pd in xrcd completing on cq, max_wr receives of one SGE, its number in *srqn;
 * the program fails with step when it cannot be made. */
static inline struct ibv_srq *xrc_srq(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_xrcd *xrcd,
                                      struct ibv_cq *cq, uint32_t max_wr, uint32_t *srqn, const char *step) {
    struct ibv_srq_init_attr_ex sa;
    memset(&sa, 0, sizeof(sa));
    sa.comp_mask =
        IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
    sa.srq_type = IBV_SRQT_XRC;
    sa.pd = pd;
    sa.xrcd = xrcd;
    sa.cq = cq;
    sa.attr.max_wr = max_wr;
    sa.attr.max_sge = 1;
    struct ibv_srq *srq = ibv_create_srq_ex(ctx, &sa);
    if (srq == NULL || ibv_get_srq_num(srq, srqn) != 0) {
        fail(step, strerror(errno));
    }
    return srq;
}

static inline void write_u32(int fd, uint32_t v) {
    if (write(fd, &v, sizeof(v)) != (ssize_t)sizeof(v)) {
        fail("the pipe to the other process", strerror(errno));
    }
}

static inline uint32_t read_u32(int fd) {
    uint32_t v = 0;
    if (read(fd, &v, sizeof(v)) != (ssize_t)sizeof(v)) {
        fail("the pipe from the other process", "closed early");
    }
    return v;
}

/* Posts a signalled SEND of len bytes at msg (inside mr) through initiator ini to SRQ number
 * srqn, as wr_id id. */
static inline void post_xrc_send(struct ibv_qp *ini, struct ibv_mr *mr, void *msg, uint32_t len,
                                 uint32_t srqn, uint64_t id) {
    struct ibv_sge sge = {(uintptr_t)msg, len, mr->lkey};
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.qp_type.xrc.remote_srqn = srqn;
    if (ibv_post_send(ini, &wr, &bad) != 0) {
        fail("ibv_post_send (XRC)", "refused");
    }
}

/* Posts a receive of len bytes at buf (inside mr) to srq, as wr_id id. */
static inline void post_srq_recv(struct ibv_srq *srq, struct ibv_mr *mr, void *buf, uint32_t len,
                                 uint64_t id) {
    struct ibv_sge sge = {(uintptr_t)buf, len, mr->lkey};
    struct ibv_recv_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (ibv_post_srq_recv(srq, &wr, &bad) != 0) {
        fail("ibv_post_srq_recv", "refused");
    }
}

/* Starts this program again (self) as the other process: "self device role path W R", W and R its
 * ends of two pipes; *to_other and *from_other are ours. */
static inline pid_t start_other(const char *self, const char *device, const char *role, const char *path,
                                int *to_other, int *from_other) {
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) {
        fail("pipe", strerror(errno));
    }
    pid_t pid = fork();
    if (pid < 0) {
        fail("fork", strerror(errno));
    }
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        char to_us[16], from_us[16];
        snprintf(to_us, sizeof(to_us), "%d", up[1]);
        snprintf(from_us, sizeof(from_us), "%d", down[0]);
        execl(self, self, device, role, path, to_us, from_us, (char *)NULL);
        _exit(127);
    }
    close(down[0]);
    close(up[1]);
    *to_other = down[1];
    *from_other = up[0];
    return pid;
}

#endif
