#!/usr/bin/python3
"""rdma-core's own tests, as a standard consumer's check of the face: the unittest suite
rdma-core's maintainers run against every provider (Debian's python3-pyverbs ships it in
/usr/share/doc/rdma-core/tests), run unmodified through the face on a brokered device.

    rdma_core_suite.py SUITE_DIR WORK_DIR DEVICE EXPECTED

Copies the suite into WORK_DIR (gunzipping what Debian compressed), then runs each test module in
a process of its own, so that a crash (a NULL op, say) is reported against the test that was
running and the other modules still run. Every test must pass, or be skipped for a reason the
EXPECTED file accepts, or be a failure that file lists (which must still fail: a listed failure
that passes is reported, so that the list stays true). A test the file calls racy (rdma-core's
own test races the device) is run once more, alone, before it counts as failed.

Prints a summary and "OK" on success; the problems and exit status 1 otherwise.
"""
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import unittest

MODULE_TIMEOUT = 600  # seconds: a module that hangs is reported as such


def prepare(suite_dir, work_dir):
    """A writable copy of the suite, as the package `tests` under work_dir."""
    dest = os.path.join(work_dir, "tests")
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    for name in os.listdir(suite_dir):
        src = os.path.join(suite_dir, name)
        if name.endswith(".py.gz"):
            with gzip.open(src, "rb") as f, open(os.path.join(dest, name[:-3]), "wb") as out:
                out.write(f.read())
        elif name.endswith(".py"):
            shutil.copyfile(src, os.path.join(dest, name))
    return sorted(n[:-3] for n in os.listdir(dest) if n.startswith("test_") and n.endswith(".py"))


def read_expected(path):
    skips, fails, racy = [], {}, {}
    why = []
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                why = []
                continue
            if line.startswith("#"):
                why.append(line.lstrip("# "))
                continue
            kind, _, arg = line.partition(" ")
            if kind == "skip":
                skips.append(re.compile(arg))
            elif kind == "fail":
                fails[arg] = " ".join(why)
            elif kind == "racy":
                racy[arg] = " ".join(why)
            else:
                sys.exit(f"{path}: unknown line {line!r}")
    return skips, fails, racy


class Reporter(unittest.TextTestResult):
    """One JSON line per event on stdout, flushed, so a crash still leaves what ran."""

    def emit(self, **kw):
        sys.__stdout__.write(json.dumps(kw) + "\n")
        sys.__stdout__.flush()

    def startTest(self, test):
        super().startTest(test)
        self.emit(event="start", id=test.id())

    def addSuccess(self, test):
        super().addSuccess(test)
        self.emit(event="end", id=test.id(), outcome="ok")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.emit(event="end", id=test.id(), outcome="skip", reason=str(reason))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.emit(event="end", id=test.id(), outcome="fail", reason=self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self.emit(event="end", id=test.id(), outcome="error", reason=self._exc_info_to_string(err, test))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.emit(event="end", id=test.id(), outcome="ok")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self.emit(event="end", id=test.id(), outcome="ok")


def child(work_dir, device, name):
    """Runs one module (tests.test_x) or one test (tests.test_x.Class.test_y) with Reporter."""
    sys.path.insert(0, os.path.join(work_dir, "tests"))
    sys.path.insert(0, work_dir)
    sys.argv = [sys.argv[0], "--dev", device]
    from args_parser import parser  # the suite's own, as run_tests.py uses it

    parser.parse_args()
    suite = unittest.TestLoader().loadTestsFromName(name)
    with open(os.devnull, "w") as quiet:
        unittest.TextTestRunner(stream=quiet, resultclass=Reporter, verbosity=0).run(suite)


def run(work_dir, device, name):
    """{test id: (outcome, reason)} of a module or test run in a child process."""
    proc = subprocess.Popen([sys.executable, __file__, "--child", work_dir, device, name],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=MODULE_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    results, running = {}, None
    for line in out.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev["event"] == "start":
            running = ev["id"]
        else:
            results[ev["id"]] = (ev["outcome"], ev.get("reason", ""))
            running = None
    if proc.returncode != 0 and running is None and not results:
        running = name  # died before any test started (an import failed)
    if proc.returncode < 0:
        results[running or name] = ("crash", f"killed by signal {signal.Signals(-proc.returncode).name}")
    elif running is not None:
        results[running] = ("crash", f"exit status {proc.returncode}: {err[-2000:]}")
    return results


def main(suite_dir, work_dir, device, expected_path):
    if not os.path.isdir(suite_dir):
        print(f"SKIP: {suite_dir} is missing (Debian's python3-pyverbs ships rdma-core's tests there)")
        return 0
    modules = prepare(suite_dir, work_dir)
    skips, fails, racy = read_expected(expected_path)
    results = {}
    for m in modules:
        results.update(run(work_dir, device, "tests." + m))
    problems, counts, reasons = [], {"ok": 0, "skip": 0, "known failure": 0, "rerun": 0}, {}
    for test_id, (outcome, reason) in sorted(results.items()):
        short = test_id.removeprefix("tests.")
        if outcome == "ok" and short in fails:
            problems.append(f"{short}: listed as failing ({fails[short]}) but passed: update the list")
        elif outcome == "ok":
            counts["ok"] += 1
        elif outcome == "skip":
            if any(p.search(reason) for p in skips):
                counts["skip"] += 1
                reasons[reason] = reasons.get(reason, 0) + 1
            else:
                problems.append(f"{short}: skipped for a reason not accepted: {reason}")
        elif short in fails:
            counts["known failure"] += 1
        elif short in racy and run(work_dir, device, test_id).get(test_id, ("",))[0] == "ok":
            counts["rerun"] += 1
            print(f"{short}: failed, then passed alone ({racy[short]})")
        else:
            problems.append(f"{short}: {outcome}: {reason.strip()[-1500:]}")
    for short in fails:
        if "tests." + short not in results:
            problems.append(f"{short}: listed as failing but did not run: update the list")
    print(f"{len(results)} tests in {len(modules)} modules: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  skipped {n}: {reason}")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(*sys.argv[2:])
    elif len(sys.argv) == 5:
        sys.exit(main(*sys.argv[1:]))
    else:
        sys.exit(__doc__)
