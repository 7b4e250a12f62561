#!/usr/bin/env python3
"""tools/ctest_targets.py — the build targets whose programs a selection of CTest tests runs, so that a build stage compiles only what its tests need.

    python3 tools/ctest_targets.py BUILD_DIR [ctest filter args] [-- more filter args ...]

Each group of filter arguments (e.g. ``-L unit -LE mpi``) is one `ctest --show-only=json-v1`
selection of the configured BUILD_DIR; the union of their tests is taken. A target is printed
when the program it builds (by name) appears anywhere in a selected test's command line (read
from the CTestTestfile.cmake files): run directly, through mpiexec, or as an argument of a script. Fails when a selection is empty, or
when no target matches, rather than letting the build stage build nothing.
"""
import json
import os
import re
import subprocess
import sys


def selections(args):
    group = []
    for arg in args:
        if arg == "--":
            yield group
            group = []
        else:
            group.append(arg)
    yield group


def executable_targets(build_dir):
    """Names of the build's executable targets (CMake's file API would need a query written
    before configuring; the build system's own listing of targets serves)."""
    listing = subprocess.run(["cmake", "--build", build_dir, "--target", "help"], check=True,
                             stdout=subprocess.PIPE, text=True).stdout
    names = set()
    for line in listing.splitlines():
        line = line.strip()
        if line.startswith("... "):
            names.add(line[4:].split()[0])
    return names


ADD_TEST = re.compile(r'^add_test\((?:\[=\[(.*?)\]=\]|([^\s"]+))\s+(.*)\)\s*$')


def test_commands(build_dir):
    """{test name: the words of its command} from the CTestTestfile.cmake files CMake wrote.
    (ctest's JSON leaves a command out while its program is not built yet, which is exactly
    when this is asked.)"""
    commands = {}
    for folder, _, files in os.walk(build_dir):
        if "CTestTestfile.cmake" not in files:
            continue
        with open(os.path.join(folder, "CTestTestfile.cmake")) as f:
            for line in f:
                match = ADD_TEST.match(line.strip())
                if match:
                    name = match.group(1) or match.group(2)
                    commands[name] = re.findall(r'"((?:[^"\\]|\\.)*)"', match.group(3))
    return commands


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    build_dir = sys.argv[1]
    targets = executable_targets(build_dir)
    commands = test_commands(build_dir)
    wanted = set()
    for group in selections(sys.argv[2:]):
        shown = subprocess.run(["ctest", "--test-dir", build_dir, "--show-only=json-v1", *group], check=True,
                               stdout=subprocess.PIPE, text=True).stdout
        names = [test["name"] for test in json.loads(shown).get("tests", [])]
        if not names:
            print(f"ctest_targets: no test matches {' '.join(group)}", file=sys.stderr)
            return 1
        for name in names:
            for word in commands.get(name, []):
                for piece in word.replace("=", " ").split():
                    if os.path.basename(piece) in targets:
                        wanted.add(os.path.basename(piece))
    if not wanted:
        print("ctest_targets: the selected tests run no program of this build", file=sys.stderr)
        return 1
    print(" ".join(sorted(wanted)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
