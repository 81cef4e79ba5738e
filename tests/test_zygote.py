"""The worker zygote (psbench/core/zygote.py): a forked child behaves like `python -m MODULE ARGV`
under the supervisor: its output in its log, its environment, its exit code or the signal that
killed it, a session of its own, and a launcher check that works from a grandchild."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from psbench.core.supervisor import Supervisor, describe_exit, launcher_gone
from psbench.core.zygote import Zygote


@pytest.fixture
def module(tmp_path, monkeypatch):
    """A throwaway module `zyg_child` the forked children run."""
    (tmp_path / "zyg_child.py").write_text(textwrap.dedent("""
        import os, sys, time
        what = sys.argv[1]
        print("argv", sys.argv[1:], "env", os.environ.get("ZYG_VALUE"), "sid", os.getsid(0) == os.getpid())
        if what == "exit":
            sys.exit(int(sys.argv[2]))
        if what == "raise":
            raise ValueError("boom")
        if what == "sleep":
            time.sleep(60)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))


def test_forked_children_run_like_python_m(tmp_path, module):
    with Supervisor(tmp_path) as sup:
        zygote = Zygote(sup, ["json"], tmp_path / "zygote.log", module)
        ok = zygote.fork("zyg_child", ["exit", "0"], dict(module, ZYG_VALUE="seven"), tmp_path / "ok.log")
        bad = zygote.fork("zyg_child", ["exit", "3"], module, tmp_path / "bad.log")
        raised = zygote.fork("zyg_child", ["raise"], module, tmp_path / "raised.log")
        assert ok.wait(30) == 0 and bad.wait(30) == 3 and raised.wait(30) == 1
        assert "argv ['exit', '0'] env seven sid True" in (tmp_path / "ok.log").read_text()
        assert "ValueError: boom" in (tmp_path / "raised.log").read_text()
        zygote.close_requests()
        assert zygote.child.proc.wait(30) == 0  # no more requests and its children gone: it exits


def test_a_killed_child_reads_as_killed_and_the_supervisor_stops_the_rest(tmp_path, module):
    with Supervisor(tmp_path, grace_s=1.0) as sup:
        zygote = Zygote(sup, [], tmp_path / "zygote.log", module)
        victim = sup.adopt("victim", zygote.fork("zyg_child", ["sleep"], module, tmp_path / "v.log"))
        other = sup.adopt("other", zygote.fork("zyg_child", ["sleep"], module, tmp_path / "o.log"))
        time.sleep(0.5)
        sup.stop([victim], grace_s=0)  # fault injection's SIGKILL
        assert victim.poll() == -signal.SIGKILL and victim.describe() == describe_exit(-9) == "killed by SIGKILL"
        assert other.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            other.proc.wait(0.2)
    assert other.poll() is not None and zygote.child.poll() is not None  # the with block stopped everything
    for pid in (victim.pid, other.pid, zygote.child.pid):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_launcher_gone_looks_past_the_zygote():
    assert launcher_gone(None) is False
    assert launcher_gone(os.getppid()) is False      # our parent
    assert launcher_gone(os.getpid()) is False       # alive, though not our parent (a zygote's child)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert launcher_gone(dead.pid) is True


def test_a_child_leaves_as_the_interpreter_would_less_its_module_teardown(tmp_path, module):
    """The quick exit keeps what a clean shutdown guarantees (the threads it started finish, atexit
    hooks run, buffered output reaches the log, the exit code) and skips only the teardown of its
    modules, which copied the zygote's pages back into every child (seconds per run on 2 cores)."""
    (tmp_path / "zyg_exit.py").write_text(textwrap.dedent(f"""
        import atexit, sys, threading, time
        out = {str(tmp_path)!r}
        def late():
            time.sleep(0.3)
            open(out + "/thread.txt", "w").write("finished")
        threading.Thread(target=late).start()            # not a daemon: waited for
        atexit.register(lambda: open(out + "/atexit.txt", "w").write("ran"))
        class Teardown:
            def __del__(self):
                open(out + "/teardown.txt", "w").write("ran")
        keep = Teardown()                                 # collected only by module teardown
        sys.stdout.write("buffered, no newline")
        sys.exit(int(sys.argv[1]))
    """))
    with Supervisor(tmp_path) as sup:
        zygote = Zygote(sup, ["json"], tmp_path / "zygote.log", module)
        assert zygote.fork("zyg_exit", ["5"], module, tmp_path / "exit.log").wait(30) == 5
        zygote.close_requests()
    assert (tmp_path / "thread.txt").read_text() == "finished"
    assert (tmp_path / "atexit.txt").read_text() == "ran"
    assert (tmp_path / "exit.log").read_text() == "buffered, no newline"
    assert not (tmp_path / "teardown.txt").exists()


def test_a_child_terminates_its_zmq_context_so_its_last_frames_arrive(tmp_path, module):
    """A child that sends and returns at once, its socket left open: the quick exit terminates the
    context (within the socket's linger), so the frames queued at exit are delivered, not dropped."""
    import zmq

    receiver = zmq.Context.instance().socket(zmq.PULL)
    port = receiver.bind_to_random_port("tcp://127.0.0.1")
    (tmp_path / "zyg_send.py").write_text(textwrap.dedent(f"""
        import zmq
        sock = zmq.Context.instance().socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 10000)
        sock.connect("tcp://127.0.0.1:{port}")
        for i in range(200):
            sock.send(bytes(64 * 1024))
    """))
    try:
        with Supervisor(tmp_path) as sup:
            zygote = Zygote(sup, ["zmq"], tmp_path / "zygote.log", module)
            assert zygote.fork("zyg_send", [], module, tmp_path / "send.log").wait(30) == 0
            zygote.close_requests()
        got = 0
        while receiver.poll(2000):
            receiver.recv()
            got += 1
        assert got == 200
    finally:
        receiver.close(linger=0)
