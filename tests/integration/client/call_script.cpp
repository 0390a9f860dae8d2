// ibvx-call-script: one fixed sequence of every public call of libibv_extend.so on a device
// (default softnda0), printing one line per call with what the caller sees (return code, errno,
// and values that do not depend on addresses). Run once with IBV_EXTEND_MODE=direct and once with
// IBV_EXTEND_MODE=broker: the outputs must be identical, which is what "broker mode behaves like
// direct mode" means for a program. Exit status 0 unless the script could not run at all.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <ibv_extend.h>
#include <ibv_extend_broker.h>

#include "common/qp_init_attr.h"

namespace {

// Queue memory for direct mode (the broker ignores these): plain process memory.
void *opsAlloc(size_t size) {
    void *p = nullptr;
    return posix_memalign(&p, 4096, size) == 0 ? p : nullptr;
}
void opsFree(void *p) {
    free(p);
}
void opsMemset(void *dst, int v, size_t n) {
    memset(dst, v, n);
}
int opsMemcpy(void *dst, size_t dst_max, void *src, size_t n, uint32_t) {
    if (n > dst_max) {
        return -1;
    }
    memcpy(dst, src, n);
    return 0;
}
void *opsDbMmap(doorbell_map_desc *desc) {
    return desc->type == DB_MAP_MODE_HOST_VA ? reinterpret_cast<void *>(desc->hva) : nullptr;
}
int opsDbUnmap(void *, doorbell_map_desc *) {
    return 0;
}
ibv_extend_ops g_ops{opsAlloc, opsFree, opsMemset, opsMemcpy, opsDbMmap, opsDbUnmap};

void line(const char *what, long value) {
    printf("%s %ld\n", what, value);
}
// Pointer calls: "ok" or the errno.
template <typename T>
T *ptr(const char *what, T *p) {
    if (p != nullptr) {
        printf("%s ok\n", what);
    } else {
        printf("%s errno=%s\n", what, strerrorname_np(errno));
    }
    return p;
}
void rc(const char *what, int r) {
    if (r < 0) {
        printf("%s rc=-%s\n", what, strerrorname_np(-r));
    } else {
        printf("%s rc=%d\n", what, r);
    }
}

ibv_cq_extend *cq(ibv_context_extend *ctx, int cqe) {
    ibv_cq_init_attr_extend a{};
    a.attr.cqe = static_cast<uint32_t>(cqe);
    a.type = QU_BUF_DMA_MODE_DEFAULT;
    a.ops = &g_ops;
    return ibv_create_cq_extend(ctx, &a);
}

ibv_qp_extend *qp(ibv_context_extend *ctx, ibv_pd *pd, ibv_cq_extend *c, ibv_srq_extend *srq,
                  ibv_qp_type type) {
    ibv_qp_init_attr_extend a = ibvx::qpInitAttr({.pd = pd,
                                                  .send_cq = c->cq,
                                                  .srq = srq != nullptr ? srq->srq : nullptr,
                                                  .qp_type = type,
                                                  .ops = &g_ops});
    return ibv_create_qp_extend(ctx, &a);
}

}  // namespace

int main(int argc, char **argv) {
    const char *dev = argc > 1 ? argv[1] : "softnda0";
    setvbuf(stdout, nullptr, _IOLBF, 0);
    fprintf(stderr, "mode %s\n", ibvx_mode());

    ibvx_device_info infos[8];
    int n = ibvx_list_devices(infos, 8);
    bool found = false;
    for (int i = 0; i < n && i < 8; ++i) {
        if (strcmp(infos[i].name, dev) == 0) {
            found = true;
            line("list.driver_version", infos[i].driver_version);
            line("list.ext_cap", infos[i].ext_cap);
            line("list.max_qp_wr", infos[i].max_qp_wr);
        }
    }
    line("list.found", found);
    rc("list.negative_max", ibvx_list_devices(nullptr, -1));
    ptr("open.unknown", ibvx_open_device("no-such-device0"));
    ptr("open.empty", ibvx_open_device(""));
    ibv_context_extend *ctx = ptr("open", ibvx_open_device(dev));
    if (ctx == nullptr) {
        return 1;
    }
    line("ops.version", ctx->ops->version);
    ibv_device_attr_extend attr{};
    rc("query_device", ibv_query_device_extend(ctx, &attr));
    line("query_device.ext_cap", attr.ext_cap);
    rc("query_device.null", ibv_query_device_extend(ctx, nullptr));

    ibv_context_extend *second = ptr("open_extend.again", ibv_open_extend(ctx->context));
    if (second != nullptr) {
        ibv_device_attr_extend attr2{};
        rc("open_extend.again.query_device", ibv_query_device_extend(second, &attr2));
        line("open_extend.again.version", second->ops->version);
        rc("close_extend.again", ibv_close_extend(second));
    }
    ptr("open_extend.null", ibv_open_extend(nullptr));
    rc("close_extend.null", ibv_close_extend(nullptr));
    uint32_t major = 0;
    ibv_extend_get_version(&major, nullptr, nullptr);
    line("version.major", major);
    line("check_version.newer_minor", ibv_extend_check_version(4, 3, 0));

    ibv_pd *pd = ptr("alloc_pd", ibvx_alloc_pd(ctx));
    ptr("alloc_pd.null", ibvx_alloc_pd(nullptr));
    ptr("create_cq.null_attr", ibv_create_cq_extend(ctx, nullptr));
    ptr("create_cq.zero", cq(ctx, 0));
    ptr("create_cq.too_deep", cq(ctx, 1 << 30));
    ibv_cq_extend *c = ptr("create_cq", cq(ctx, 64));
    if (pd == nullptr || c == nullptr) {
        return 1;
    }
    line("cq.entry_size", c->cq_info.qbuf.entry_size);
    line("cq.entry_cnt", c->cq_info.qbuf.entry_cnt);
    line("cq.cqe", c->cq->cqe);

    ibv_srq_init_attr_extend sa{};
    sa.pd = pd;
    sa.attr.attr.max_wr = 16;
    sa.attr.attr.max_sge = 1;
    sa.type = QU_BUF_DMA_MODE_DEFAULT;
    sa.ops = &g_ops;
    ibv_srq_extend *srq = ptr("create_srq", ibv_create_srq_extend(ctx, &sa));
    if (srq != nullptr) {
        line("srq.entry_cnt", srq->srq_info.qbuf.entry_cnt);
    }
    if (ibv_qp_extend *ud = ptr("create_qp.ud", qp(ctx, pd, c, nullptr, IBV_QPT_UD)); ud != nullptr) {
        line("qp.ud.type", ud->qp->qp_type);
        rc("destroy_qp.ud", ibv_destroy_qp_extend(ctx, ud));
    }
    // An XRC initiator (its receive CQ is ignored, SPEC.md §14), and a transport neither mode
    // serves (softnda and the broker refuse raw packet QPs alike).
    if (ibv_qp_extend *xi = ptr("create_qp.xrc_send", qp(ctx, pd, c, nullptr, IBV_QPT_XRC_SEND));
        xi != nullptr) {
        line("qp.xrc_send.type", xi->qp->qp_type);
        line("qp.xrc_send.rq_entry_cnt", xi->rq_info.qbuf.entry_cnt);
        rc("destroy_qp.xrc_send", ibv_destroy_qp_extend(ctx, xi));
    }
    ptr("create_qp.raw_packet", qp(ctx, pd, c, nullptr, IBV_QPT_RAW_PACKET));
    ibv_qp_extend *q = ptr("create_qp", qp(ctx, pd, c, nullptr, IBV_QPT_RC));
    ibv_qp_extend *qs = srq != nullptr ? ptr("create_qp.srq", qp(ctx, pd, c, srq, IBV_QPT_RC)) : nullptr;
    if (q == nullptr) {
        return 1;
    }
    line("qp.state", q->qp->state);
    line("qp.type", q->qp->qp_type);
    line("qp.sq_entry_cnt", q->sq_info.qbuf.entry_cnt);
    line("qp.sq_entry_size", q->sq_info.qbuf.entry_size);
    line("qp.sq_db_set", q->sq_info.db_hw_va.iov_base != nullptr);
    if (qs != nullptr) {
        line("qp.srq_rq_base_zero", qs->rq_info.qbuf.base == 0);
    }

    ibv_qp_attr qa{};
    rc("modify_qp.reset_to_rts", [&] {
        qa.qp_state = IBV_QPS_RTS;
        return ibvx_modify_qp(q->qp, &qa, IBV_QP_STATE);
    }());
    line("qp.state_after_bad_modify", q->qp->state);
    qa = ibv_qp_attr{};
    qa.qp_state = IBV_QPS_INIT;
    qa.port_num = 1;
    qa.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    rc("modify_qp.init",
       ibvx_modify_qp(q->qp, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
    line("qp.state_init", q->qp->state);
    qa = ibv_qp_attr{};
    qa.qp_state = IBV_QPS_RTR;
    qa.dest_qp_num = q->qp->qp_num;
    qa.path_mtu = IBV_MTU_1024;
    qa.max_dest_rd_atomic = 1;
    qa.min_rnr_timer = 12;
    qa.ah_attr.port_num = 1;
    rc("modify_qp.rtr", ibvx_modify_qp(q->qp, &qa,
                                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                           IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
    line("qp.state_rtr", q->qp->state);
    ibv_qp_attr got{};
    ibv_qp_init_attr init{};
    rc("query_qp", ibvx_query_qp(q->qp, &got, IBV_QP_STATE | IBV_QP_DEST_QPN | IBV_QP_CAP, &init));
    line("query_qp.state", got.qp_state);
    line("query_qp.dest_is_self", got.dest_qp_num == q->qp->qp_num);
    line("query_qp.init.qp_type", init.qp_type);
    line("query_qp.init.max_send_wr_ge16", init.cap.max_send_wr >= 16);
    line("query_qp.init.send_cq_is_ours", init.send_cq == c->cq);
    rc("query_qp.null", ibvx_query_qp(q->qp, nullptr, 0, &init));

    ibv_qp_attr_extend ea{};
    ea.qp = q->qp;
    ea.udp_src_port = 4791;
    rc("modify_qp_extend.udp", ibv_modify_qp_extend(ctx, &ea, IBV_QP_ATTR_EXTEND_UDP_SRC_PORT));
    rc("modify_qp_extend.max_bit", ibv_modify_qp_extend(ctx, &ea, IBV_QP_ATTR_EXTEND_MAX));
    rc("modify_qp_extend.null", ibv_modify_qp_extend(ctx, nullptr, 0));
    ibv_qp_attr_extend eq{};
    eq.qp = q->qp;
    rc("query_qp_extend.udp", ibv_query_qp_extend(ctx, &eq, IBV_QP_ATTR_EXTEND_UDP_SRC_PORT));
    line("query_qp_extend.udp_src_port", eq.udp_src_port);
    ibv_hyroce_feature f{};
    rc("hyroce.query", ibv_query_qp_supported_hyroce_feature(ctx, q->qp, 0, 0, &f));
    line("hyroce.type", f.type);
    line("hyroce.version", f.version);
    ibv_hyroce_feature out{};
    uint32_t more = 99;
    rc("hyroce.nego", ibv_nego_qp_hyroce_feature(ctx, q->qp, &f, &out, &more));
    line("hyroce.nego.more", more);
    rc("hyroce.nego.null", ibv_nego_qp_hyroce_feature(ctx, q->qp, &f, &out, nullptr));

    auto *buf = static_cast<uint8_t *>(ibvx_alloc_buf(8192));
    ibv_mr *mr =
        ptr("reg_mr", ibvx_reg_mr(pd, buf + 64, 1024, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ));
    if (mr != nullptr) {
        line("mr.addr_is_buf", mr->addr == buf + 64);
        line("mr.length", static_cast<long>(mr->length));
        line("mr.keys_set", mr->lkey != 0 || mr->rkey != 0);
    }
    ptr("reg_mr.zero_length", ibvx_reg_mr(pd, buf, 0, 0));
    int fd = memfd_create("script-mr", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (ftruncate(fd, 4096) == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0) {
        ibv_mr *fmr = ptr("reg_mr_fd", ibvx_reg_mr_fd(pd, fd, 0, 4096, IBV_ACCESS_LOCAL_WRITE));
        if (fmr != nullptr) {
            rc("dereg_mr_fd", ibvx_dereg_mr(fmr));
        }
    }
    close(fd);
    ptr("reg_mr_fd.bad_fd", ibvx_reg_mr_fd(pd, -1, 0, 4096, 0));

    rc("destroy_qp", ibv_destroy_qp_extend(ctx, q));
    if (qs != nullptr) {
        rc("destroy_qp.srq", ibv_destroy_qp_extend(ctx, qs));
    }
    if (srq != nullptr) {
        rc("destroy_srq", ibv_destroy_srq_extend(ctx, srq));
    }
    rc("destroy_cq", ibv_destroy_cq_extend(ctx, c));
    if (mr != nullptr) {
        rc("dereg_mr", ibvx_dereg_mr(mr));
    }
    ibvx_free_buf(buf);
    rc("dealloc_pd", ibvx_dealloc_pd(pd));
    rc("close.null", ibvx_close_device(nullptr));
    rc("close", ibvx_close_device(ctx));
    return 0;
}
