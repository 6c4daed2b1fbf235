"""A command's end without the interpreter's teardown (infra.process.exit_process), in fresh interpreters: what an
exit owes the user still happens, and only the teardown after it is skipped."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from infra.process import exit_code_of
from tests.conftest import PROJECT_ROOT

# a thread pool left open; module globals whose finalizer only the interpreter's teardown would run; a late thread;
# atexit callbacks; 2 MB of buffered stdout: what a command leaves behind at its end
PROGRAM = textwrap.dedent("""
    import atexit, sys, threading, time
    from concurrent.futures import ThreadPoolExecutor
    from infra.process import exit_process

    pool = ThreadPoolExecutor(2)  # its idle workers wait for threading's exit hook, never joined without it
    pool.submit(print, "pool", flush=True).result()

    class TornDown:
        def __del__(self):
            print("teardown", flush=True)

    kept = TornDown()
    atexit.register(print, "atexit registered first, run last")
    atexit.register(print, "atexit registered last, run first")
    threading.Thread(target=lambda: (time.sleep(0.5), print("thread finished"))).start()
    sys.stdout.write("x" * 2_000_000 + "\\n")
    exit_process({code})
""")


def run(code: str, end: str = "exit_process") -> subprocess.CompletedProcess:
    program = PROGRAM.format(code=code).replace("exit_process(", f"{end}(")
    return subprocess.run([sys.executable, "-c", program], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=30)


def test_the_threads_and_atexit_callbacks_run_stdout_is_flushed_and_the_teardown_is_skipped():
    done = run("0")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["pool", "x" * 2_000_000]
    assert lines[2:] == ["thread finished", "atexit registered last, run first", "atexit registered first, run last"]
    # the same program ending by sys.exit pays the teardown, which finalizes the module's objects
    assert run("0", end="sys.exit").stdout.splitlines()[-1] == "teardown"


@pytest.mark.parametrize(("code", "status", "stderr"), [
    ("None", 0, ""), ("2", 2, ""), ("143", 143, ""), ("256", 0, ""), ("'error: a message'", 1, "error: a message\n"),
])
def test_the_exit_status_is_the_interpreter_s(code, status, stderr):
    done = run(code)
    assert (done.returncode, done.stderr) == (status, stderr)
    assert done.stdout.splitlines()[-1] == "atexit registered first, run last"


def test_exit_code_of_reads_a_system_exit_s_code_as_the_interpreter_does():
    assert [exit_code_of(c) for c in (None, 0, 3, True, False, 300, "message")] == [0, 0, 3, 1, 0, 44, 1]


def test_a_pgt_command_ends_by_it_with_its_output_whole_and_its_status(tmp_path):
    """`pgt` (pgt.cli.main) ends every command through exit_process: a refusal's status and line, a command's
    output and the atexit callbacks, no teardown."""
    program = textwrap.dedent("""
        import atexit, sys
        from pgt.cli import main

        class TornDown:
            def __del__(self):
                print("teardown", flush=True)

        kept = TornDown()
        atexit.register(print, "atexit")
        sys.argv = ["pgt", *sys.argv[1:]]
        main()
    """)
    refused = subprocess.run([sys.executable, "-c", program, "manifest", str(tmp_path)], cwd=PROJECT_ROOT,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert refused.stderr == f"error: {tmp_path}: no manifest.json; expected a `pgt preprocess` output folder\n"
    assert refused.stdout == "atexit\n"
    helped = subprocess.run([sys.executable, "-c", program, "--help"], cwd=PROJECT_ROOT, capture_output=True,
                            text=True, timeout=60)
    assert helped.returncode == 0 and "Usage" in helped.stdout and helped.stdout.endswith("atexit\n")
