"""procs.py - child processes that never outlive the Python process that started them.

Used by the pytest suite (tests/conftest.py) and by the benchmarks (bench_server.py), which
start servers, nginx, wrk, Prometheus or a whole benchmark as children.

 * spawn() starts a child in a session of its own (start_new_session=True): one killpg
   reaches it and everything it forks (nginx's workers), and a Ctrl-C on the terminal
   reaches only the Python process, which then stops its children itself.  SIGINT, SIGTERM
   and SIGHUP are held back while the child is started and recorded, so an interrupt
   cannot leave a child that nothing knows of.
 * stop() ends a child and its process group: a signal, a bounded wait, then SIGKILL to the
   group, and the group waited for until it is empty; stop_all() all of them at once.
 * A watchdog, a small process in a session of its own, holds the read end of a pipe whose
   write end only this process has.  However this process ends (an exception, a Ctrl-C,
   pytest's timeout, SIGKILL), the kernel closes the pipe, and the watchdog stops the group
   of every child not stopped yet (SIGTERM, SIGKILL CLEAN_UP seconds later), then exits.

Python standard library only; run as a script, it is the watchdog.
"""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

# The bound of a wait for something that takes a second or less on an idle machine (a
# server to become ready, to exit on SIGTERM): no loaded machine takes that long, and a
# wait that ends early costs nothing.
PATIENCE = 120.0
# How long a child stopped before its end (a timeout, an interrupt) has after SIGTERM to clean
# up (a benchmark removes its temporary directory) before SIGKILL.
CLEAN_UP = 10.0

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_lock = threading.RLock()
_children = {}  # pid -> (Popen, its start time: with the pid, what names the process)
_owners = []  # lists of children: spawn() adds each child to the innermost (see owned())
_watchdog = None


def stat(pid):
    """(state, process group id, start time in clock ticks since boot) of a process, from
    /proc/PID/stat; None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[0].decode(), int(fields[2]), fields[19].decode()


def start_time(pid):
    st = stat(pid)
    return st and st[2]


def group_members(pgid):
    """Pids of the live (not zombie) processes of the process group pgid."""
    pids = []
    for entry in os.listdir("/proc"):
        st = entry.isdigit() and stat(entry)
        if st and st[1] == pgid and st[0] != "Z":
            pids.append(int(entry))
    return pids


def _killpg(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------
# The watchdog

def _ours(pid, start):
    """Whether pgid pid still names the group of the child started at start: its leader is
    that process (alive or a zombie), or gone, and then only members of its group can hold
    the id (the kernel gives no new process an id that a group still uses)."""
    return start_time(pid) in (start, None)


def _watchdog_main():
    """Reads "+pid start" and "-pid" lines; at end of input (the parent is gone, however it
    ended) or on SIGTERM, stops the group of every pid still listed: SIGTERM (a benchmark
    then stops its own children and removes its files), SIGKILL to what is left CLEAN_UP
    seconds later."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # a terminal's signals are for the parent
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    groups = {}
    try:
        for line in sys.stdin.buffer:
            fields = line.decode().split()
            if fields[0].startswith("+"):
                groups[int(fields[0][1:])] = fields[1]
            else:
                groups.pop(int(fields[0][1:]), None)
    finally:
        for pid, start in groups.items():
            if _ours(pid, start):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + CLEAN_UP
        while time.monotonic() < deadline and any(group_members(pid) for pid in groups):
            time.sleep(0.05)
        for pid, start in groups.items():
            if _ours(pid, start):
                _killpg(pid)


def _tell(line):
    """A line to the watchdog, started on first use (again if it died: then it is told
    every child instead)."""
    global _watchdog
    for _ in range(2):
        if _watchdog is None or _watchdog.poll() is not None:
            _watchdog = subprocess.Popen([sys.executable, os.path.abspath(__file__)],
                                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         start_new_session=True)
            line = "".join(f"+{pid} {start}\n" for pid, (_, start) in _children.items())
        try:
            _watchdog.stdin.write(line.encode())
            _watchdog.stdin.flush()
            return
        except OSError:
            _watchdog = None


# --------------------------------------------------------------------------
# Children

@contextlib.contextmanager
def _signals_held():
    """SIGINT, SIGTERM and SIGHUP wait until the end of the block, then are raised again
    (handlers can only be changed in the main thread; elsewhere the block runs as is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending = []
    saved = {s: signal.signal(s, lambda n, _f: pending.append(n)) for s in _SIGNALS
             if signal.getsignal(s) != signal.SIG_IGN}  # an ignored one stays so, in the child too
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
        for s in pending:
            signal.raise_signal(s)


@contextlib.contextmanager
def owned():
    """Yields a list that collects the children spawned during the block (in any thread),
    for their owner to stop when it ends (the pytest hooks in tests/conftest.py)."""
    mine = []
    with _lock:
        _owners.append(mine)
    try:
        yield mine
    finally:
        with _lock:
            _owners.remove(mine)


def spawn(cmd, **popen_kw):
    """subprocess.Popen(cmd, **popen_kw) in a session of its own, known to the watchdog."""
    with _signals_held(), _lock:
        proc = subprocess.Popen(cmd, start_new_session=True, **popen_kw)
        start = start_time(proc.pid)  # a zombie has one too: the child is not reaped yet
        _children[proc.pid] = (proc, start)
        if _owners:
            _owners[-1].append(proc)
        _tell(f"+{proc.pid} {start}\n")
    return proc


def run(cmd, input=None, capture_output=False, timeout=PATIENCE, **popen_kw):
    """subprocess.run(), the child spawn()ed and its group stopped however the call ends
    (done, timeout, exception, interrupt: SIGTERM, SIGKILL CLEAN_UP seconds later)."""
    if input is not None:
        popen_kw["stdin"] = subprocess.PIPE
    if capture_output:
        popen_kw["stdout"] = popen_kw["stderr"] = subprocess.PIPE
    proc = spawn(cmd, **popen_kw)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    finally:
        stop(proc, signal.SIGTERM, CLEAN_UP)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _exited(proc, timeout):
    """Whether proc exited within timeout seconds (None: no bound), without reaping it: its
    zombie keeps its pid, and so its process group's id, from being used again."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            flags = os.WEXITED | os.WNOWAIT | (0 if deadline is None else os.WNOHANG)
            if os.waitid(os.P_PID, proc.pid, flags) is not None:
                return True
        except ChildProcessError:  # reaped already (Popen.poll)
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def stop(proc, sig=signal.SIGTERM, timeout=PATIENCE):
    """Ends a spawn()ed child: sig to it (SIGKILL: to its group at once), up to timeout
    seconds for it to exit, then SIGKILL to its group, and waits until no process of the
    group is left.  Returns its exit status (negative: the signal that ended it)."""
    if proc.returncode is None:
        if sig == signal.SIGKILL:
            _killpg(proc.pid)
        elif sig is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
        if not _exited(proc, timeout if sig != signal.SIGKILL else None):
            _killpg(proc.pid)
            _exited(proc, None)
        if proc.returncode is None:  # not reaped: the group id is still this child's
            _killpg(proc.pid)  # what the leader left behind (nginx's workers)
            deadline = time.monotonic() + PATIENCE
            while group_members(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
        proc.wait()
    # Forgotten only now: a stop cut short (an interrupt) leaves it to stop_all and the watchdog.
    with _lock:
        if _children.get(proc.pid, (None,))[0] is proc:
            del _children[proc.pid]
            _tell(f"-{proc.pid}\n")
    return proc.returncode


def stop_all(sig=signal.SIGKILL, timeout=PATIENCE):
    """stop() every child not stopped yet: sig to all of them at once, then each waited for,
    all within timeout seconds, then SIGKILL to the groups of those left."""
    with _lock:
        procs = [p for p, _ in reversed(list(_children.values()))]
    for proc in procs:
        if proc.returncode is None and sig is not None:
            if sig == signal.SIGKILL:
                _killpg(proc.pid)
            else:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            stop(proc, None, max(0.0, deadline - time.monotonic()))
        except Exception as e:  # keep going: the others must be stopped too
            print(f"procs: could not stop pid {proc.pid}: {e}", file=sys.stderr)


def shutdown(sig=signal.SIGKILL, timeout=PATIENCE):
    """stop_all(sig, timeout), then the watchdog ends and is waited for: nothing is left."""
    global _watchdog
    stop_all(sig, timeout)
    with _lock:
        if _watchdog is not None:
            with contextlib.suppress(OSError):
                _watchdog.stdin.close()
            _watchdog.wait()
            _watchdog = None


if __name__ == "__main__":
    _watchdog_main()
