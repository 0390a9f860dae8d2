// The small shared pieces every part uses: Unix-socket addresses, the C-ABI helpers, the
// warning line, the status macros and the generated build facts.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>

#include <ibv_extend.h>

#include "common/build_config.h"
#include "common/c_abi.h"
#include "common/status.h"
#include "common/unix_socket.h"
#include "common/warn.h"

namespace ibvx {
namespace {

std::string shortTempDir() {
    char tmpl[] = "/tmp/ibvx-us.XXXXXX";
    const char *dir = mkdtemp(tmpl);
    return dir != nullptr ? dir : "";
}

TEST(UnixSocket, APathThatDoesNotFitIsRefusedNotTruncated) {
    std::string longest(sizeof(sockaddr_un::sun_path) - 1, 'a');
    auto ok = unixAddress(longest);
    ASSERT_TRUE(ok.isOk());
    EXPECT_EQ(std::string(ok->addr.sun_path), longest);
    EXPECT_EQ(ok->len, offsetof(sockaddr_un, sun_path) + longest.size() + 1);

    auto too_long = unixAddress(longest + "b");
    ASSERT_FALSE(too_long.isOk());
    EXPECT_EQ(too_long.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(too_long.status().errnoValue(), ENAMETOOLONG);
    EXPECT_NE(too_long.status().message().find(longest + "b"), std::string::npos);
    EXPECT_FALSE(unixAddress("").isOk());
    // connectUnix refuses it the same way, before making a socket.
    EXPECT_EQ(connectUnix(longest + "b").status().errnoValue(), ENAMETOOLONG);
}

TEST(UnixSocket, ConnectsToAListenerAndSaysWhyNot) {
    std::string dir = shortTempDir();
    ASSERT_FALSE(dir.empty());
    std::string path = dir + "/s.sock";
    auto missing = connectUnix(path);
    ASSERT_FALSE(missing.isOk());
    EXPECT_EQ(missing.status().errnoValue(), ENOENT);
    EXPECT_NE(missing.status().message().find(path), std::string::npos);

    auto addr = unixAddress(path);
    ASSERT_TRUE(addr.isOk());
    UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(listener.valid());
    ASSERT_EQ(::bind(listener.get(), addr->get(), addr->len), 0);
    ASSERT_EQ(::listen(listener.get(), 4), 0);
    auto fd = connectUnix(path, SOCK_NONBLOCK);
    ASSERT_TRUE(fd.isOk()) << fd.status().message();
    EXPECT_TRUE(fd->valid());

    listener.reset();  // a socket file nobody listens on any more
    auto refused = connectUnix(path);
    ASSERT_FALSE(refused.isOk());
    EXPECT_EQ(refused.status().errnoValue(), ECONNREFUSED);
    ::unlink(path.c_str());
    ::rmdir(dir.c_str());
}

int *throwsForPointer() {
    throw std::bad_alloc();
}
int throwsForInt(int) {
    throw std::bad_alloc();
}
void throwsForVoid() {
    throw std::bad_alloc();
}
int answers(int v) {
    return v + 1;
}
int hook_calls = 0;
void countHook() {
    ++hook_calls;
}

TEST(CAbi, NoExceptionCrossesAndTheReferenceConventionIsKept) {
    errno = 0;
    EXPECT_EQ((CEntry<throwsForPointer>::call()), nullptr);
    EXPECT_EQ(errno, ENOMEM);
    EXPECT_EQ((CEntry<throwsForInt>::call(3)), -ENOMEM);
    CEntry<throwsForVoid>::call();  // returns
    EXPECT_EQ((CEntry<answers>::call(41)), 42);
    hook_calls = 0;
    EXPECT_EQ((CEntry<throwsForInt, countHook>::call(1)), -ENOMEM);
    EXPECT_EQ((CEntry<answers, countHook>::call(1)), 2);
    EXPECT_EQ(hook_calls, 1);  // only the call that threw
    errno = 0;
    EXPECT_EQ(failNull<int>(EINVAL), nullptr);
    EXPECT_EQ(errno, EINVAL);
}

void warnf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vwarn("part: ", fmt, ap);
    va_end(ap);
}

TEST(Warn, OneLineOnlyWhenAsked) {
    unsetenv("IBV_EXTEND_SHOW_WARNINGS");
    testing::internal::CaptureStderr();
    warnf("hidden %d", 1);
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
    setenv("IBV_EXTEND_SHOW_WARNINGS", "1", 1);
    testing::internal::CaptureStderr();
    warnf("shown %d", 2);
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "ibv_extend: Warning: part: shown 2\n");
    unsetenv("IBV_EXTEND_SHOW_WARNINGS");
}

Status failsWith(int err) {
    return err == 0 ? Status::ok() : Status::fromErrno(err, "failed");
}
StatusOr<int> valueOr(int err) {
    if (err != 0) {
        return Status::fromErrno(err, "no value");
    }
    return 7;
}
int reached = 0;
Status chain(int first, int second) {
    reached = 0;
    RETURN_IF_ERROR(failsWith(first));
    reached = 1;
    ASSIGN_OR_RETURN(int v, valueOr(second));
    reached = v;
    RETURN_IF_ERROR(valueOr(0));  // a StatusOr works too
    return Status::ok();
}

TEST(StatusMacros, ReturnAtTheFirstFailureAndAssignOtherwise) {
    EXPECT_EQ(chain(EINVAL, 0).errnoValue(), EINVAL);
    EXPECT_EQ(reached, 0);
    EXPECT_EQ(chain(0, ENOENT).errnoValue(), ENOENT);
    EXPECT_EQ(reached, 1);
    EXPECT_TRUE(chain(0, 0).isOk());
    EXPECT_EQ(reached, 7);
}

TEST(BuildConfig, TheProjectVersionIsThePublicHeadersVersion) {
    // project(VERSION) in CMakeLists.txt and the reference version of ibv_extend.h must agree:
    // the broker announces the first, tenants built against the second.
    EXPECT_EQ(IBVX_PROJECT_VERSION_MAJOR, IBV_EXTEND_VERSION_MAJOR);
    EXPECT_EQ(IBVX_PROJECT_VERSION_MINOR, IBV_EXTEND_VERSION_MINOR);
    EXPECT_EQ(IBVX_PROJECT_VERSION_PATCH, IBV_EXTEND_VERSION_PATCH);
    EXPECT_STREQ(IBVX_PROJECT_VERSION, IBV_EXTEND_VERSION_STRING);
}

}  // namespace
}  // namespace ibvx
