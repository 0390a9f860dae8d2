#!/usr/bin/env python3
"""Fails when a document names a file, folder, function or identifier the tree no longer has.

    check-doc-names.py REPO_ROOT DOC.md... [--paths DOC.md...]

Every `code span` of each document is checked against the files git tracks (with their text,
documents left out, so a document cannot vouch for itself):
  - a path into the tree (its first part is a top-level file or folder of the repository) must
    exist, from the top or from the document's folder (a module may be named without its
    suffix: common/fd_channel); other paths (an install's lib/..., a host's /run, <build>/ placeholders, URLs) are not
    the tree's and are skipped;
  - a function, `name()` or `Scope::name()`, must be written as a call or definition,
    `name(`, in the code; with a scope, in a file that also names the scope (its class,
    struct or namespace) or spells `Scope::name(`;
  - any other identifier (a type, a variable, a constant, an enumerator, a proto message or
    an environment variable) must stand as a whole word somewhere in the code.
Spans with spaces, operators or punctuation (shell lines, TOML, prose) are skipped: they do not
name one thing. A line `<!-- doc-names: skip NAME -->` exempts NAME in that document (for a name
the text quotes on purpose, e.g. one that belongs to rdma-core or to the reference library).
"""
import os
import re
import subprocess
import sys

DOC_SUFFIXES = (".md",)
# Paths a document names that belong to a host, not to the tree.
HOST_PREFIXES = ("/", "~", "http:", "https:")
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_~][A-Za-z0-9_]*)*(\(\))?$")
PATHLIKE = re.compile(r"^[A-Za-z0-9_.@+-]+(/[A-Za-z0-9_.@*+-]*)+$|^[A-Za-z0-9_.+-]+\.[A-Za-z0-9]+$")
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
FENCE = re.compile(r"^\s*```")
SKIP_DIRECTIVE = re.compile(r"<!--\s*doc-names:\s*skip\s+(.+?)\s*-->")


def tracked(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True, capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p]


def load_code(root, files):
    texts = {}
    for rel in files:
        if rel.endswith(DOC_SUFFIXES) or rel.startswith("docs/man/"):
            continue
        path = os.path.join(root, rel)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        if b"\0" in data:
            continue
        texts[rel] = data.decode("utf-8", "replace")
    return texts


def spans(doc_text):
    """(line number, span) for each inline code span outside fenced blocks."""
    in_fence = False
    for n, line in enumerate(doc_text.splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for m in SPAN.finditer(line):
            yield n, m.group(1).strip()


class Tree:
    def __init__(self, root):
        self.root = root
        self.files = tracked(root)
        self.file_set = set(self.files)
        self.dirs = {os.path.dirname(f) for f in self.files}
        for f in list(self.dirs):
            while f:
                f = os.path.dirname(f)
                self.dirs.add(f)
        self.top = {f.split("/", 1)[0] for f in self.files}
        self.code = load_code(root, self.files)
        self.blob = "\n".join(self.code.values())
        self.cache = {}

    def in_tree(self, p):
        """Whether p points into the tree: its first part is a top-level entry of it."""
        first = p.split("/", 1)[0]
        return first in self.top and (first != p or "." in first)

    def has_path(self, p):
        p = p.rstrip("/")
        if "*" in p:
            pattern = re.compile("^" + re.escape(p).replace(r"\*", "[^/]*") + "(/|$)")
            return any(pattern.match(f) for f in self.files)
        if p in self.file_set or p in self.dirs:
            return True
        # A module named without its suffix (common/fd_channel: the .h and the .cpp).
        if "." not in os.path.basename(p) and any(f.startswith(p + ".") for f in self.files):
            return True
        # {a,b} is how a document names a pair of files (broker.{h,cpp}).
        m = re.match(r"^(.*)\{([^}]*)\}(.*)$", p)
        if m:
            return all(self.has_path(m.group(1) + alt + m.group(3)) for alt in m.group(2).split(","))
        return False

    def word(self, name):
        key = ("w", name)
        if key not in self.cache:
            self.cache[key] = re.search(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"(?![A-Za-z0-9_])", self.blob) is not None
        return self.cache[key]

    def function(self, qualified):
        key = ("f", qualified)
        if key in self.cache:
            return self.cache[key]
        parts = qualified.split("::")
        name = parts[-1]
        call = re.compile(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"\s*\(")
        found = False
        if len(parts) == 1:
            found = call.search(self.blob) is not None
        else:
            scope = parts[-2]
            spelled = re.compile(r"(?<![A-Za-z0-9_])" + re.escape(scope) + r"::" + re.escape(name) + r"\s*\(")
            declares = re.compile(r"\b(class|struct|namespace|union)\s+([A-Za-z0-9_]+::)*" + re.escape(scope) + r"\b"
                                  r"|\busing\s+" + re.escape(scope) + r"\s*=")
            for text in self.code.values():
                if spelled.search(text) or (declares.search(text) and call.search(text)):
                    found = True
                    break
        self.cache[key] = found
        return found


def check(tree, doc, paths_only):
    with open(os.path.join(tree.root, doc), encoding="utf-8") as f:
        text = f.read()
    skipped = set()
    for m in SKIP_DIRECTIVE.finditer(text):
        skipped.update(m.group(1).split())
    problems = []
    for line, span in spans(text):
        token = span.rstrip(".,;:")
        if token in skipped:
            continue
        if token.startswith(HOST_PREFIXES) or "<" in token or ">" in token:
            continue
        if PATHLIKE.match(token):
            # A document beside its code may name paths relative to its own folder.
            here = os.path.normpath(os.path.join(os.path.dirname(doc), token))
            if tree.in_tree(token) and not tree.has_path(token) and not tree.has_path(here):
                problems.append(f"{doc}:{line}: `{span}`: no such file or folder in the tree")
            continue
        if paths_only or not IDENT.match(token):
            continue
        if token.endswith("()"):
            if not tree.function(token[:-2]):
                problems.append(f"{doc}:{line}: `{span}`: no function of that name in the code")
        elif "::" in token:
            if not all(tree.word(part) for part in token.split("::")):
                problems.append(f"{doc}:{line}: `{span}`: not found in the code")
        elif not tree.word(token):
            problems.append(f"{doc}:{line}: `{span}`: not found in the code")
    return problems


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    tree = Tree(argv[1])
    problems = []
    paths_only = False
    docs = 0
    for doc in argv[2:]:
        if doc == "--paths":
            paths_only = True
            continue
        problems += check(tree, doc, paths_only)
        docs += 1
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} name(s) in the documents above no longer match the tree: change the document "
              "with the code (or the code back)")
        return 1
    print(f"doc names: every file and name in {docs} document(s) is in the tree")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
