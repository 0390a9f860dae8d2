// libibv_extend.so exports exactly the public ABI, each symbol in its version stanza.
#include <cstdio>
#include <set>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace {

std::set<std::string> definedDynamicSymbols(const std::string &lib) {
    std::set<std::string> out;
    std::string cmd = "nm -D --defined-only " + lib;
    FILE *p = popen(cmd.c_str(), "r");
    if (p == nullptr) {
        ADD_FAILURE() << "popen " << cmd;
        return out;
    }
    char line[512];
    while (fgets(line, sizeof(line), p) != nullptr) {
        char addr[64], type[8], name[400];
        if (sscanf(line, "%63s %7s %399s", addr, type, name) == 3) {
            out.insert(std::string(type) + " " + name);
        }
    }
    EXPECT_EQ(pclose(p), 0) << cmd;
    return out;
}

TEST(ExportedSymbols, ExactlyThePublicAbi) {
    std::set<std::string> expected = {
        "A IBV_EXTEND_4.2",
        "A IBV_EXTEND_BROKER_1.0",
        "A IBV_EXTEND_BROKER_1.1",
        "A IBVX_VERBS_PRIVATE_1",
    };
    for (const char *f :
         {"ibv_extend_get_version", "ibv_extend_check_version", "ibv_open_extend", "ibv_close_extend",
          "ibv_query_device_extend", "ibv_create_qp_extend", "ibv_create_cq_extend", "ibv_create_srq_extend",
          "ibv_destroy_qp_extend", "ibv_destroy_cq_extend", "ibv_destroy_srq_extend", "ibv_modify_qp_extend",
          "ibv_query_qp_extend", "ibv_query_qp_supported_hyroce_feature", "ibv_nego_qp_hyroce_feature",
          "verbs_register_driver_extend", "verbs_register_vdev_extend"}) {
        expected.insert(std::string("T ") + f + "@@IBV_EXTEND_4.2");
    }
    for (const char *f :
         {"ibvx_mode", "ibvx_list_devices", "ibvx_open_device", "ibvx_close_device", "ibvx_alloc_pd",
          "ibvx_dealloc_pd", "ibvx_alloc_buf", "ibvx_free_buf", "ibvx_reg_mr", "ibvx_reg_mr_fd",
          "ibvx_dereg_mr", "ibvx_modify_qp", "ibvx_query_qp"}) {
        expected.insert(std::string("T ") + f + "@@IBV_EXTEND_BROKER_1.0");
    }
    expected.insert("T verbs_declare_guarantees_extend@@IBV_EXTEND_BROKER_1.1");
    // What the libibverbs face calls (client/verbs/verbs_private.h): one name per served verb.
    for (const char *f : {"get_device_list", "free_device_list",    "get_device_name",
                          "get_device_guid", "get_device_index",    "open_device",
                          "close_device",    "query_device",        "query_port",
                          "query_gid",       "query_gid_ex",        "query_gid_table",
                          "query_gid_type",  "query_pkey",          "get_pkey_index",
                          "alloc_pd",        "dealloc_pd",          "reg_mr_iova2",
                          "dereg_mr",        "create_comp_channel", "destroy_comp_channel",
                          "create_cq",       "destroy_cq",          "resize_cq",
                          "get_cq_event",    "ack_cq_events",       "create_qp",
                          "destroy_qp",      "modify_qp",           "query_qp",
                          "qp_to_qp_ex",     "create_srq",          "destroy_srq",
                          "modify_srq",      "query_srq",           "create_ah",
                          "destroy_ah",      "get_async_event",     "ack_async_event",
                          "fork_init",       "is_fork_initialized", "mcast",
                          "rereg_mr",        "import_device",       "import_pd",
                          "unimport_pd",     "import_mr",           "unimport_mr",
                          "import_dm",       "unimport_dm"}) {
        expected.insert(std::string("T ibvx_verbs_") + f + "@@IBVX_VERBS_PRIVATE_1");
    }
    EXPECT_EQ(definedDynamicSymbols(IBVX_LIBIBV_EXTEND), expected);
}

TEST(ExportedSymbols, SonameIsMajorFour) {
    std::string cmd = std::string("readelf -d ") + IBVX_LIBIBV_EXTEND;
    FILE *p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[512];
    while (fgets(buf, sizeof(buf), p) != nullptr) {
        out += buf;
    }
    EXPECT_EQ(pclose(p), 0);
    EXPECT_THAT(out, ::testing::HasSubstr("Library soname: [libibv_extend.so.4]"));
}

}  // namespace
