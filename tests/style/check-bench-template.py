#!/usr/bin/env python3
"""docs/BENCHMARKS.md is bench/BENCHMARKS.md.in with its @FIGURES@ filled in by `make bench`
(bench/run.sh). Prose written into one of the two and not the other is lost at the next
`make bench` or never published: this fails when their text outside the figures differs.

    check-bench-template.py SOURCE_DIR
"""
import difflib
import pathlib
import sys

root = pathlib.Path(sys.argv[1])
template = (root / "bench/BENCHMARKS.md.in").read_text()
doc = (root / "docs/BENCHMARKS.md").read_text()
head, marker, tail = template.partition("@FIGURES@")
if not marker:
    sys.exit("bench/BENCHMARKS.md.in has no @FIGURES@ line")
problems = []
if not doc.startswith(head):
    problems.append(("before the figures", head, doc[: len(head)]))
if not doc.endswith(tail):
    # Compared from the tail's first line as the document has it (the figures end before it).
    first = tail.strip().splitlines()[0] if tail.strip() else ""
    at = doc.find("\n" + first + "\n", len(head)) if first else -1
    problems.append(("after the figures", tail.strip(), doc[at + 1:].strip() if at >= 0 else doc))
for where, want, got in problems:
    print(f"docs/BENCHMARKS.md and bench/BENCHMARKS.md.in differ {where}:")
    diff = difflib.unified_diff(want.splitlines(), got.splitlines(), "bench/BENCHMARKS.md.in",
                                "docs/BENCHMARKS.md", lineterm="", n=1)
    print("\n".join(list(diff)[:40]))
sys.exit(1 if problems else 0)
