// The broker core's tests run over the real softnda driver, linked in and registered by the
// test: one DeviceRegistry scanned over it serves a whole test suite.
#pragma once

#include <gtest/gtest.h>

#include "daemon/core/device.h"
#include "softnda_ops.h"

namespace ibvx::daemon {

class SoftndaDevicesTest : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        verbs_register_driver_extend(&softnda_driver_ops);
        verbs_register_vdev_extend(&softnda_vdev_ops);
        devices_ = new DeviceRegistry;
        devices_->scan();
    }
    static void TearDownTestSuite() {
        delete devices_;
        devices_ = nullptr;
    }

    static inline DeviceRegistry *devices_ = nullptr;
};

}  // namespace ibvx::daemon
