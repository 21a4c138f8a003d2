#!/usr/bin/env python3
"""README.md's command-line examples, run as written, print what the README shows.

    .venv/bin/python tests/e2e/check_readme_examples.py --build build

Every ```sh block of README.md that starts with `build/bin/` and is followed by an output
block (a plain ```) runs with bash from a scratch directory whose `build` is the build tree,
with RECAL_SERVER and RECAL_TOKEN naming a recal-server started here (a token of its own,
the fixtures as its data root, as the README starts one). Its output (stdout and stderr
together) must contain every line of the output block, in order, with numbers, job ids and
digests left out of the comparison (times and rates differ between runs); `...` in the
block stands for lines left out. Exits 1 naming the first line not found.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from demo_server import new_token, start_server  # noqa: E402  (the demo's server, started the same way)


def examples(readme):
    """[(commands, expected output lines)] of the sh blocks followed by an output block."""
    blocks = re.findall(r"```(\w*)\n(.*?)```", readme, re.S)
    found = []
    for (lang, body), (next_lang, next_body) in zip(blocks, blocks[1:]):
        if lang == "sh" and body.startswith("build/bin/") and next_lang == "":
            found.append((body, [l for l in next_body.splitlines() if l.strip() and l.strip() != "..."]))
    return found


def normalized(line):
    """The line without what differs between runs: ids, digests, numbers, spacing."""
    line = re.sub(r"job-[0-9a-f]+", "job-ID", line)
    line = re.sub(r"\b[0-9a-f]{64}\b", "HEX", line)
    line = re.sub(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?", "N", line)
    return " ".join(line.split())


def missing_line(expected, output):
    """The first expected line that the output lacks (in order), or None."""
    lines = [normalized(l) for l in output.splitlines()]
    at = 0
    for want in expected:
        target = normalized(want)
        while at < len(lines) and lines[at] != target:
            at += 1
        if at == len(lines):
            return want
        at += 1
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    with open(args.readme) as f:
        found = examples(f.read())
    if len(found) < 2:
        sys.exit(f"expected the README's recal-run and recalctl examples, found {len(found)}")
    work = tempfile.mkdtemp(prefix="recal-readme-")
    os.symlink(build, os.path.join(work, "build"))
    auth_file = os.path.join(work, "auth.txt")
    token = new_token(os.path.join(build, "bin", "recalctl"), auth_file)
    proc, port = start_server(os.path.join(build, "bin", "recal-server"), os.path.join(work, "data"),
                              os.path.join(build, "fixtures"), os.path.join(work, "server.log"),
                              ["--auth_file=" + auth_file])
    address = f"127.0.0.1:{port}"
    failed = 0
    try:
        env = dict(os.environ, RECAL_SERVER=address, RECAL_TOKEN=token, OMP_WAIT_POLICY="PASSIVE")
        for commands, expected in found:
            ran = subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=work, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
            first = commands.splitlines()[0]
            missing = missing_line(expected, ran.stdout)
            if ran.returncode != 0 or missing is not None:
                failed += 1
                print(f"FAIL {first}\n  exit {ran.returncode}; not in its output: {missing!r}\n{ran.stdout}")
            else:
                print(f"ok   {first} ({len(expected)} lines as shown)")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    print(f"{len(found) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
