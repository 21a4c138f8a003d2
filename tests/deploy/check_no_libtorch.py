#!/usr/bin/python3
"""Fails if LibTorch comes back into what must not load it (issue 31).

recal-server (every role), recalctl and the client library link no LibTorch: only
recal-worker and recal-run load it. A binary's libraries are walked through their
DT_NEEDED entries (readelf -d), resolved where ldd resolves them, so that a forbidden one is
reported with the chain that pulled it in (recal-server -> librecal_engine.so ->
libtorch.so). The client library is a static archive, which needs nothing by itself: any
LibTorch symbol (at::, c10::, torch::) its objects leave undefined would have to come from
LibTorch wherever it is linked (nm). And recal-worker must load LibTorch, so that the check
cannot pass for a reason that has nothing to do with the libraries (a broken ldd, a walk
that finds nothing).

usage: check_no_libtorch.py --torch-free BINARY... --client-archive LIBRECAL_CLIENT.a
                            --loads-torch RECAL_WORKER
"""
import argparse
import os
import re
import subprocess
import sys

FORBIDDEN = re.compile(r"^(libtorch[^/]*\.so|libc10[^/]*\.so|librecal_engine\.so)")
TORCH_SYMBOL = re.compile(r"\b(at|c10|torch)::")


def resolved_libraries(binary):
    """name -> path of every library the dynamic loader maps for `binary` (ldd)."""
    out = subprocess.run(["ldd", binary], check=True, capture_output=True, text=True).stdout
    paths = {}
    for line in out.splitlines():
        match = re.match(r"\s*(\S+) => (\S+)", line)
        if match and match.group(2) != "not":
            paths[match.group(1)] = match.group(2)
    return paths


def needed(path):
    """The DT_NEEDED entries of one ELF object."""
    out = subprocess.run(["readelf", "-d", path], check=True, capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def chains(binary):
    """Every library reachable from `binary`, each with the first chain that reaches it."""
    paths = resolved_libraries(binary)
    found = {}
    queue = [(binary, [os.path.basename(binary)])]
    while queue:
        path, chain = queue.pop(0)
        for name in needed(path):
            if name in found:
                continue
            found[name] = chain + [name]
            if name in paths:
                queue.append((paths[name], found[name]))
    return found


def forbidden_in(binary):
    return sorted(" -> ".join(chain) for name, chain in chains(binary).items() if FORBIDDEN.match(name))


def torch_symbols_in(archive):
    out = subprocess.run(["nm", "-C", "--undefined-only", archive], check=True, capture_output=True,
                         text=True).stdout
    return sorted({line.split(" U ", 1)[-1] for line in out.splitlines() if TORCH_SYMBOL.search(line)})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--torch-free", nargs="+", default=[], help="binaries that must not load LibTorch")
    parser.add_argument("--client-archive", help="librecal_client.a: no LibTorch symbol left undefined")
    parser.add_argument("--loads-torch", nargs="+", default=[], help="binaries that must load LibTorch")
    args = parser.parse_args()
    failures = []
    for binary in args.torch_free:
        pulled = forbidden_in(binary)
        failures += [f"{binary} loads LibTorch: {chain}" for chain in pulled]
        if not pulled:
            print(f"ok: {os.path.basename(binary)} loads no LibTorch ({len(chains(binary))} libraries)")
    if args.client_archive:
        symbols = torch_symbols_in(args.client_archive)
        failures += [f"{args.client_archive} needs LibTorch's {symbol}" for symbol in symbols[:20]]
        if not symbols:
            print(f"ok: {os.path.basename(args.client_archive)} needs no LibTorch symbol")
    for binary in args.loads_torch:
        pulled = forbidden_in(binary)
        if not any(re.search(r"-> libtorch[^ ]*\.so[^ ]*$", chain) for chain in pulled):
            failures.append(f"{binary} should load libtorch*.so, and the walk did not find it: the check is blind")
        else:
            print(f"ok: {os.path.basename(binary)} loads LibTorch, as it must: {pulled[0]}")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
