#!/usr/bin/env python3
"""Prints, after a failed ctest run, each failed test's first failure in a few short lines.

ctest --output-on-failure prints a failing test's whole output where it ends, which for an
integration test is often a broker log of thousands of lines, and then the summary. A reader who
sees only the end of a CI run (the last screenful) would get the failed tests' names and never
what failed. This reads the run's JUnit file (ctest --output-junit) and prints, last, for each
failed test: its name, then the lines from its first gtest "Failure" (or sanitizer report) on,
cut short, or the last lines it printed when it has none (a crash, a timeout).

  ctest-digest.py JUNIT.xml [--lines N] [--tests N]
"""
import argparse
import re
import sys
import xml.etree.ElementTree as ET

# Where a test's story of its failure starts, in order of trust: gtest's "file:line: Failure" or a
# sanitizer's report; else gtest's "[  FAILED  ]". Nothing looser: a word such as "Timeout" or
# "Aborted" in a log line printed earlier would hide the real failure. A test killed by a signal
# or by ctest's timeout prints no marker (ctest says so in its own lines, and the JUnit file
# carries no message), and the end of what it printed is its story.
MARKERS = [re.compile(r": Failure$|^==\d+==ERROR|^WARNING: ThreadSanitizer|runtime error:"),
           re.compile(r"^\[  FAILED  \]")]
WIDTH = 200


def first_failure(out: str, lines: int) -> list:
    text = out.splitlines()
    for marker in MARKERS:
        for i, line in enumerate(text):
            if marker.search(line):
                return [l[:WIDTH] for l in text[i:i + lines]]
    return [l[:WIDTH] for l in text[-lines:]]  # no marker: the end of what it printed


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("junit")
    ap.add_argument("--lines", type=int, default=8, help="lines per failed test")
    ap.add_argument("--tests", type=int, default=3, help="failed tests shown")
    args = ap.parse_args()
    try:
        root = ET.parse(args.junit).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"ctest-digest: cannot read {args.junit}: {e}")
        return 1
    failed = [tc for tc in root.iter("testcase") if tc.get("status") == "fail"]
    if not failed:
        return 0
    print(f"ctest-digest: {len(failed)} failed; the first failure of each (full output above):")
    for tc in failed[:args.tests]:
        out = "".join(e.text or "" for e in tc.iter("system-out"))
        print(f"--- {tc.get('name')}")
        for line in first_failure(out, args.lines):
            print(f"  {line}")
    if len(failed) > args.tests:
        print(f"--- and {len(failed) - args.tests} more")
    return 0


if __name__ == "__main__":
    sys.exit(main())
