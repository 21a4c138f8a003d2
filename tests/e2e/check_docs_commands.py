#!/usr/bin/env python3
"""Every command in the docs names things that exist: a test that fails when a page goes stale.

    .venv/bin/python tests/e2e/check_docs_commands.py --build build

Reads every ```sh block of README.md, docs/*.md and bench/README.md (a line ending in `\\`
continues on the next; `# ...` is a comment) and checks each command it holds:
- a binary of this project (recal-run, recal-server, recal-worker, recalctl, a benchmark):
  it is built, every --flag named is one its --help lists, and a recalctl command is one of
  its commands;
- a script of the repository (scripts/, bench/, tests/, run directly or by .venv/bin/python):
  it exists, and a Python script's --flags are in its --help;
- `ctest ... -R RE`: RE selects at least one test; `-L LABEL`: a label some test carries;
- any argument that is a path into the repository (deploy/..., scripts/..., bench/...): it exists.
Commands of other programs (docker, kubectl, openssl, ...) are checked for those paths only.
README.md's examples with their output are run for real by check_readme_examples.py, and the
quick start by the demo and CI; this test covers the rest, which needs machines (a cluster, a
bucket, Kubernetes) that a test cannot have. Exits 1 listing every stale name with its page
and line.
"""
import argparse
import glob
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = ["README.md", "bench/README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
OUR_BINARIES = {"recal-run", "recal-server", "recal-worker", "recalctl"}
REPO_DIRS = ("scripts/", "bench/", "tests/", "deploy/", "docs/", "client/", "proto/", "fuzz/")
SEPARATORS = {"&&", "||", "|", ";", "&"}
REDIRECTS = {">", ">>", "<", "2>", "2>&1"}


def sh_commands(page_text):
    """[(line number, [words])] of every command in the page's sh blocks."""
    commands = []
    for block in re.finditer(r"```sh\n(.*?)```", page_text, re.S):
        first_line = page_text.count("\n", 0, block.start(1)) + 1
        pending, pending_line = "", None
        for offset, line in enumerate(block.group(1).splitlines()):
            if pending_line is None:
                pending_line = first_line + offset
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            pending += line
            for words in split_commands(pending):
                commands.append((pending_line, words))
            pending, pending_line = "", None
    return commands


def split_commands(text):
    """The commands of one shell line: words split on separators, without redirections."""
    # Placeholders (`sha256:<hex>`, `<the token>`) are words, not redirections, and an optional
    # part (`[--top N | --all]`) offers alternatives, not a pipe.
    text = re.sub(r"<[^<>\n]*>", "PLACEHOLDER", text)
    text = re.sub(r"\[([^\]]*)\]", lambda optional: optional.group(1).replace("|", " "), text)
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        words = list(lexer)
    except ValueError:  # an unbalanced quote in prose: nothing to check
        return []
    commands, current, skip_next = [], [], False
    for word in words:
        if skip_next:
            skip_next = False
            continue
        if word in SEPARATORS:
            commands.append(current)
            current = []
        elif word in REDIRECTS or set(word) <= set("<>&"):
            skip_next = True  # the redirection's target is not an argument
        else:
            current.append(word)
    commands.append(current)
    # VAR=value prefixes and `nice -n N` run the command after them.
    cleaned = []
    for command in commands:
        while command and re.match(r"^[A-Z_]+=", command[0]):
            command = command[1:]
        if command[:1] == ["nice"]:
            command = command[3:] if command[1:2] == ["-n"] else command[1:]
        if command:
            cleaned.append(command)
    return cleaned


class Checker:
    def __init__(self, build):
        self.build = build
        self.help_cache = {}
        self.problems = []

    def help_text(self, argv):
        key = tuple(argv)
        if key not in self.help_cache:
            run = subprocess.run(argv + ["--help"], capture_output=True, text=True, timeout=60, cwd=ROOT)
            self.help_cache[key] = run.stdout + run.stderr
        return self.help_cache[key]

    def known_flags(self, argv):
        return set(re.findall(r"--([a-z][a-z0-9_]*)", self.help_text(argv)))

    def flags_named(self, words):
        named = []
        for word in words:
            match = re.match(r"^--([a-z][a-z0-9_]*)", word)
            if match:
                named.append(match.group(1))
        return named

    def check_flags(self, where, program, argv, words):
        known = self.known_flags(argv)
        for flag in self.flags_named(words):
            bare = flag[2:] if flag.startswith("no") and flag[2:] in known else flag
            if bare not in known and flag not in ("help", "version"):
                self.problems.append("%s: %s has no flag --%s" % (where, program, flag))

    def check_paths(self, where, words):
        for word in words:
            value = word.split("=", 1)[1] if word.startswith("--") and "=" in word else word
            if value.startswith(REPO_DIRS) and not re.search(r"[<>*$]", value):
                if not os.path.exists(os.path.join(ROOT, value)):
                    self.problems.append("%s: no %s in the repository" % (where, value))

    def check_command(self, where, words):
        program = os.path.basename(words[0])
        if program in OUR_BINARIES or words[0].startswith("build/bin/"):
            self.check_our_binary(where, program, words)
        elif words[0].startswith(("scripts/", "bench/", "tests/")):
            self.check_script(where, [], words[0], words[1:])
        elif words[0].endswith("python") and len(words) > 1 and words[1].endswith(".py"):
            self.check_script(where, [os.path.join(ROOT, ".venv", "bin", "python")], words[1], words[2:])
        elif program == "ctest":
            self.check_ctest(where, words)
        # What mkdir names is made by it, and so is where cp and mv put things.
        if program != "mkdir":
            self.check_paths(where, words[1:-1] if program in ("cp", "mv") else words[1:])

    def check_our_binary(self, where, program, words):
        binary = os.path.join(self.build, "bin", program)
        if not os.path.exists(binary):
            self.problems.append("%s: %s is not built by the project (no %s)" % (where, program, binary))
            return
        if program == "recalctl":
            commands = set(re.findall(r"^  ([a-z]+) ", self.help_text([binary]).split("Job flags")[0], re.M))
            informational = set(self.flags_named(words[1:])) & {"help", "version"}
            if not informational and not any(word in commands for word in words[1:]):
                self.problems.append("%s: recalctl has no command in %s" % (where, " ".join(words[1:])))
        self.check_flags(where, program, [binary], words[1:])

    def check_script(self, where, interpreter, script, args):
        path = os.path.join(ROOT, script)
        if not os.path.exists(path):
            self.problems.append("%s: no script %s" % (where, script))
            return
        if script.endswith(".py"):
            self.check_flags(where, script, interpreter + [path], args)

    def check_ctest(self, where, words):
        for option, what in (("-R", "selects no test"), ("-L", "is a label no test carries")):
            if option not in words or words.index(option) + 1 >= len(words):
                continue
            pattern = words[words.index(option) + 1]
            listed = subprocess.run(["ctest", "--test-dir", self.build, "-N", option, pattern],
                                    capture_output=True, text=True, timeout=120).stdout
            count = re.search(r"Total Tests: (\d+)", listed)
            if not count or int(count.group(1)) == 0:
                self.problems.append("%s: ctest %s %s %s" % (where, option, pattern, what))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--pages", nargs="*", default=PAGES, help="pages relative to the repository")
    parser.add_argument("--expect_stale", type=int, default=0,
                        help="succeed only with exactly this many stale names (to prove the check on a stale page)")
    args = parser.parse_args()
    checker = Checker(os.path.abspath(args.build))
    checked = 0
    for page in args.pages:
        with open(os.path.join(ROOT, page)) as f:
            text = f.read()
        for line, words in sh_commands(text):
            checker.check_command("%s:%d" % (page, line), words)
            checked += 1
    for problem in checker.problems:
        print(problem)
    print("%d commands on %d pages checked, %d stale" % (checked, len(args.pages), len(checker.problems)))
    return 0 if len(checker.problems) == args.expect_stale else 1


if __name__ == "__main__":
    sys.exit(main())
