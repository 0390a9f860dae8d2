// What an operator gets from `DESTDIR=<stage> cmake --install <build> --prefix /opt/ibvx`: a unit
// that names the prefix's daemon, man pages man(1) finds, programs that load libibv_extend.so
// without LD_LIBRARY_PATH, and a daemon and ibv-extend-run that find their drivers and the
// libibverbs face relative to themselves. The stage lies outside the build tree, so nothing here
// falls back to the build tree's directories.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/build_config.h"
#include "common/unix_socket.h"
#include "tests/integration/ops/run_process.h"

namespace ibvx::test {
namespace {

namespace fs = std::filesystem;

constexpr const char *kPrefix = "/opt/ibvx";

const char *const kManPages[] = {"man8/ibv-extendd.8", "man8/ibv-extendctl.8", "man1/ibv-extend-run.1",
                                 "man3/ibv_extend.3"};

// The manual man-pages(7) names for a section, as the page headers say.
std::string manualOf(const std::string &section) {
    return section == "1"   ? "User Commands"
           : section == "3" ? "Library Functions Manual"
                            : "System Manager's Manual";
}

bool has(const std::string &text, const std::string &part) {
    return text.find(part) != std::string::npos;
}

// A program the check needs from the host (man-db, binutils); empty when it is missing.
std::string hostTool(const char *name) {
    for (const char *dir : {"/usr/bin", "/bin"}) {
        std::string path = std::string(dir) + "/" + name;
        if (::access(path.c_str(), X_OK) == 0) {
            return path;
        }
    }
    return {};
}

// A started program does not outlive its test, whichever assertion ends it.
struct KillOnExit {
    Background &bg;
    ~KillOnExit() {
        if (bg.pid > 0) {
            ::kill(bg.pid, SIGKILL);
            waitBackground(bg, 5000);
        }
    }
};

// One staged install per test, removed afterwards.
class Installed : public ::testing::Test {
  protected:
    void SetUp() override {
        // The drivers must be found from the binaries' own place, not from the test's launcher.
        ::unsetenv("IBV_EXTEND_PROVIDER_DIR");
        char tmpl[] = "/tmp/ibvx-inst.XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        stage_ = tmpl;
        root_ = stage_ + kPrefix;
        ProcessResult inst = runProcess({IBVX_CMAKE, "--install", IBVX_BUILD_TREE, "--prefix", kPrefix},
                                        RunOptions{{"DESTDIR=" + stage_}, -1, 120000});
        ASSERT_EQ(inst.exit_code, 0) << inst.out << inst.err;
    }
    void TearDown() override {
        if (!stage_.empty()) {
            fs::remove_all(stage_);
        }
    }
    std::string at(const std::string &rel) const { return root_ + "/" + rel; }

    std::string stage_;  // DESTDIR
    std::string root_;   // <stage>/opt/ibvx
};

TEST_F(Installed, TheServiceNamesTheInstallPrefixsPrograms) {
    std::string unit = readFile(at("lib/systemd/system/ibv-extendd.service"));
    ASSERT_FALSE(unit.empty());
    EXPECT_TRUE(has(unit, "\nExecStart=/opt/ibvx/sbin/ibv-extendd ")) << unit;
    EXPECT_FALSE(has(unit, "@IBVX_")) << "an unconfigured @VAR@ is left:\n" << unit;
    // Every program of ours an Exec*= line names (ExecStart, ExecReload, ExecStartPre ...) is the
    // prefix's copy, never the configured prefix's.
    int named = 0;
    std::istringstream lines(unit);
    for (std::string line; std::getline(lines, line);) {
        if (line.rfind("Exec", 0) != 0) {
            continue;
        }
        std::istringstream words(line.substr(line.find('=') + 1));
        for (std::string word; words >> word;) {
            fs::path p(word);
            if (p.is_absolute() && (p.filename() == "ibv-extendd" || p.filename() == "ibv-extendctl")) {
                ++named;
                EXPECT_TRUE(p.parent_path() == "/opt/ibvx/sbin" || p.parent_path() == "/opt/ibvx/bin")
                    << line;
            }
        }
    }
    EXPECT_GE(named, 1) << unit;
    EXPECT_TRUE(fs::exists(at("lib/systemd/system/ibv-extendd.socket")));
}

TEST_F(Installed, ManFindsEveryPageAndTheUnitsDocumentation) {
    std::string man = hostTool("man");
    if (man.empty()) {
        GTEST_SKIP() << "man (man-db) is not installed";
    }
    RunOptions env{{"MANPATH=" + at("share/man"), "MANWIDTH=80"}, -1, 20000};
    for (const char *page : kManPages) {
        std::string path = at(std::string("share/man/") + page);
        ASSERT_TRUE(fs::exists(path)) << page << " not installed (no go-md2man or pandoc at build time?)";
        std::string name = fs::path(page).stem();
        std::string section = fs::path(page).extension().string().substr(1);
        ProcessResult w = runProcess({man, "-w", section, name}, env);
        EXPECT_EQ(w.exit_code, 0) << page << ": " << w.err;
        EXPECT_EQ(w.out, path + "\n");
        ProcessResult shown = runProcess({man, "-P", "cat", "-l", path}, env);
        EXPECT_EQ(shown.exit_code, 0) << page << ": " << shown.err;
        EXPECT_TRUE(has(shown.out, "\nNAME\n")) << page << ":\n" << shown.out;
        EXPECT_TRUE(has(shown.out, "\nSYNOPSIS\n")) << page << ":\n" << shown.out;
        // The header line is "NAME(SECTION)  manual  NAME(SECTION)", the footer names the version:
        // a title line the renderer misread gives "ibv-extendd(8)(ibv-extend)  System ...".
        std::string title = name + "(" + section + ")";
        for (char &c : title) {
            c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        }
        std::string header = shown.out.substr(0, shown.out.find('\n'));
        EXPECT_EQ(header.rfind(title + " ", 0), 0u) << header;
        EXPECT_TRUE(has(header, " " + manualOf(section) + " ")) << header;
        EXPECT_TRUE(header.ends_with(" " + title)) << header;
        EXPECT_TRUE(has(shown.out, "\nibv-extend " IBVX_PROJECT_VERSION " "))
            << page << ": no version in the footer";
        // Markdown the renderer did not understand shows up literally.
        for (const char *junk : {"**", "% ", "```", "\\f"}) {
            EXPECT_FALSE(has(shown.out, junk)) << page << " shows '" << junk << "':\n" << shown.out;
        }
        EXPECT_FALSE(std::regex_search(shown.out, std::regex("\n *: ")))
            << page << " shows a ':' definition:\n"
            << shown.out;
    }
    // Documentation=man:ibv-extendd(8) points at an installed page.
    std::string unit = readFile(at("lib/systemd/system/ibv-extendd.service"));
    std::smatch doc;
    ASSERT_TRUE(std::regex_search(unit, doc, std::regex(R"(Documentation=man:([^( ]+)\(([0-9])\))"))) << unit;
    ProcessResult w = runProcess({man, "-w", doc[2].str(), doc[1].str()}, env);
    EXPECT_EQ(w.exit_code, 0) << doc[0] << ": " << w.err;
    EXPECT_EQ(w.out, at("share/man/man" + doc[2].str() + "/" + doc[1].str() + "." + doc[2].str()) + "\n");
}

TEST_F(Installed, ProgramsLinkingTheLibraryFindItWithoutLdLibraryPath) {
    std::string readelf = hostTool("readelf");
    std::string ldd = hostTool("ldd");
    if (readelf.empty() || ldd.empty()) {
        GTEST_SKIP() << "readelf (binutils) or ldd is not installed";
    }
    ::unsetenv("LD_LIBRARY_PATH");
    for (const char *program : {"bin/ibv-extend-perf", "bin/ibvx-demo"}) {
        ProcessResult d = runProcess({readelf, "-d", at(program)});
        ASSERT_EQ(d.exit_code, 0) << program << ": " << d.err;
        EXPECT_TRUE(has(d.out, "(RUNPATH)") && has(d.out, "[$ORIGIN/../lib]")) << program << ":\n" << d.out;
        EXPECT_FALSE(has(d.out, IBVX_BUILD_TREE)) << program << " still names the build tree:\n" << d.out;
    }
    for (const char *program : {"bin/ibv-extend-perf", "bin/ibvx-demo", "bin/ibv-extendctl",
                                "bin/ibv-extend-run", "bin/ibv-extend-device-plugin", "sbin/ibv-extendd"}) {
        ProcessResult l = runProcess({ldd, at(program)});
        EXPECT_EQ(l.exit_code, 0) << program << ": " << l.err;
        EXPECT_FALSE(has(l.out, "not found")) << program << ":\n" << l.out;
        if (has(l.out, "libibv_extend.so")) {
            EXPECT_TRUE(has(l.out, "=> " + at("bin/../lib/libibv_extend.so")) ||
                        has(l.out, "=> " + at("lib/libibv_extend.so")))
                << program << " loads another libibv_extend.so:\n"
                << l.out;
        }
    }
}

TEST_F(Installed, CtlPrintsItsVersion) {
    ProcessResult v = runProcess({at("bin/ibv-extendctl"), "--version"});
    EXPECT_EQ(v.exit_code, 0) << v.err;
    EXPECT_EQ(v.out, "ibv-extendctl " IBVX_PROJECT_VERSION "\n");
}

// <stage>/opt/ibvx/sbin/ibv-extendd must load <stage>/opt/ibvx/lib/ibv_extend/libsoftnda.so, and
// <stage>/opt/ibvx/bin/ibv-extend-run must put <stage>/opt/ibvx/lib/ibv_extend/verbs first.
TEST_F(Installed, TheDaemonAndRunFindTheirPrefixsDriversAndFace) {
    std::string sock = stage_ + "/b.sock";
    std::string log = stage_ + "/daemon.log";
    Background d = startBackground({at("sbin/ibv-extendd"), "--foreground", "--socket", sock}, log);
    KillOnExit stop{d};
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!connectUnix(sock).isOk() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(connectUnix(sock).isOk()) << readFile(log);

    // devinfo, not the Admin commands: the test may run as a user who is no broker admin.
    ProcessResult devinfo = runProcess({at("bin/ibv-extendctl"), "--socket", sock, "devinfo"});
    EXPECT_EQ(devinfo.exit_code, 0) << devinfo.err;
    EXPECT_TRUE(has(devinfo.out, "softnda0")) << devinfo.out << readFile(log);
    // The broker names the file it loaded softnda from.
    EXPECT_TRUE(has(readFile(log), " from " + at("lib/ibv_extend/libsoftnda.so") + "\n")) << readFile(log);

    ProcessResult run = runProcess(
        {at("bin/ibv-extend-run"), "--socket", sock, "--", "/bin/sh", "-c", "printf %s \"$LD_LIBRARY_PATH\""},
        RunOptions{{"LD_LIBRARY_PATH="}, -1, 20000});
    EXPECT_EQ(run.exit_code, 0) << run.err;
    EXPECT_EQ(run.out.substr(0, run.out.find(':')), at("lib/ibv_extend/verbs"));

    ::kill(d.pid, SIGTERM);
    EXPECT_EQ(waitBackground(d, 10000), 0) << readFile(log);
}

}  // namespace
}  // namespace ibvx::test
