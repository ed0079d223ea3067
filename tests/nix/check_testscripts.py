#!/usr/bin/env python3
"""Static checks on the nixosTests' testScripts (checks/nixos/*.nix).

Reads the JSON of tests/nix/testscripts.nix on stdin and, for each test:
  * the script is valid Python (ast.parse);
  * every method called on a node (or on a helper's `machine` parameter)
    is a method of the NixOS test driver's Machine class;
  * every name it reads is a node, a driver global, a Python builtin, or
    bound in the script itself (assignment, loop, def, import, with, ...).
  * with --pyflakes: pyflakes (which the NixOS test driver runs on every
    testScript before the VMs boot) reports nothing.
Prints one line per problem and "N passed, M failed"; exits 1 on failure.
Adapted from shared/nix-eval/check_testscript.py (same API lists).
"""
import ast
import builtins
import json
import shutil
import subprocess
import sys

# nixos/lib/test-driver: Machine's public methods.
MACHINE_API = {
    "start", "shutdown", "crash", "reboot", "block", "unblock", "screenshot",
    "send_monitor_command", "send_key", "send_chars", "send_console", "execute",
    "succeed", "fail", "wait_until_succeeds", "wait_until_fails", "wait_for_unit",
    "wait_for_file", "wait_for_open_port", "wait_for_closed_port",
    "wait_for_open_unix_socket", "wait_for_console_text", "wait_for_shutdown",
    "wait_for_x", "wait_for_window", "wait_for_text", "get_unit_info",
    "get_unit_property", "systemctl", "start_job", "stop_job", "require_unit_state",
    "copy_from_host", "copy_from_host_via_shell", "copy_from_vm", "shell_interact",
    "console_interact", "sleep", "forward_port", "get_screen_text", "dump_tty_contents",
    "get_screen_text_variants", "is_up", "log", "nested", "wait_for_qmp_event",
    "release",
}
# Globals the driver puts in the script's namespace.
GLOBALS = {"start_all", "subtest", "retry", "polling_condition", "join_all",
           "serial_stdout_on", "serial_stdout_off", "driver", "machines", "vlans",
           "test_script", "run_tests", "create_machine", "log", "t"}
# Helper parameters that stand for a Machine.
MACHINE_PARAMS = {"machine"}


def bound_names(tree):
    names = set()

    def targets(t):
        for n in ast.walk(t):
            if isinstance(n, ast.Name):
                names.add(n.id)

    for n in ast.walk(tree):
        if isinstance(n, (ast.Assign,)):
            for t in n.targets:
                targets(t)
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr)):
            targets(n.target)
        elif isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)):
            targets(n.target)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, ast.arguments):
            for a in n.posonlyargs + n.args + n.kwonlyargs:
                names.add(a.arg)
            for a in (n.vararg, n.kwarg):
                if a is not None:
                    names.add(a.arg)
        elif isinstance(n, ast.withitem) and n.optional_vars is not None:
            targets(n.optional_vars)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            for a in n.names:
                names.add((a.asname or a.name).split(".")[0])
        elif isinstance(n, ast.ExceptHandler) and n.name:
            names.add(n.name)
    return names


def pyflakes(name, spec):
    """pyflakes on the script, with the driver's globals and the nodes
    declared first (as the driver does), line numbers mapped back."""
    exe = shutil.which("pyflakes3") or shutil.which("pyflakes")
    if exe is None:
        return [f"{name}: pyflakes is not installed (apt-get install python3-pyflakes)"]
    declared = sorted(GLOBALS | set(spec["nodeNames"]))
    prefix = "".join(f"{g} = None  # noqa\n" for g in declared)
    run = subprocess.run([exe], input=prefix + spec["testScript"], capture_output=True, text=True)
    problems = []
    for line in (run.stdout + run.stderr).splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[1].isdigit():
            problems.append(f"{name}: line {int(parts[1]) - len(declared)}: pyflakes:{parts[2]}")
        elif line.strip():
            problems.append(f"{name}: pyflakes: {line}")
    return problems


def check(name, spec):
    try:
        tree = ast.parse(spec["testScript"], filename=name)
    except SyntaxError as e:
        return [f"{name}: line {e.lineno}: {e.msg}"]
    nodes = set(spec["nodeNames"])
    machines = nodes | MACHINE_PARAMS
    known = nodes | GLOBALS | set(dir(builtins)) | bound_names(tree)
    problems = []
    for n in ast.walk(tree):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and isinstance(n.func.value, ast.Name) and n.func.value.id in machines
                and n.func.attr not in MACHINE_API):
            problems.append(f"{name}: line {n.lineno}: {n.func.value.id}.{n.func.attr} is not a Machine method")
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in known:
            problems.append(f"{name}: line {n.lineno}: unknown name {n.id!r} (nodes: {sorted(nodes)})")
    if not nodes:
        problems.append(f"{name}: declares no nodes")
    return problems


def main():
    use_pyflakes = "--pyflakes" in sys.argv[1:]
    tests = json.load(sys.stdin)
    passed = failed = 0
    names = {}
    for file, spec in sorted(tests.items()):
        problems = check(file, spec)
        if use_pyflakes and not problems:
            problems = pyflakes(file, spec)
        if spec["name"] in names:
            problems.append(f"{file}: test name {spec['name']!r} also used by {names[spec['name']]}")
        names[spec["name"]] = file
        for p in problems:
            print(f"FAIL {p}")
        if problems:
            failed += 1
        else:
            passed += 1
            print(f"ok   {file}: testScript parses; nodes {sorted(spec['nodeNames'])}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed or not tests else 0)


main()
