"""Worker processes, the one mechanism behind every fan-out (`run --gpus/--workers/--case-timeout`:
shard.py; `warm`: warm.py): spawned fresh, each reporting through a one-way pipe, each leading its own
process group so that a timeout kills it with the compilers it started, Ctrl-C left to the parent.

    parent: proc, conn = spawn(ctx, target, args, name)     child: become_worker(); ...; conn.send(...)
            ... conn.recv() ...  kill_process_group(proc)
"""

from __future__ import annotations

import contextlib
import os
import signal


def spawn(ctx, target, args: tuple, name: str):
    """Starts ``target(*args, writer)`` in a ``ctx`` (spawn) process; returns (process, reader).

    The child starts with SIGINT ignored (inherited through exec): Ctrl-C is the parent's to handle.
    Whatever ``start`` raises (arguments that do not pickle) is raised here, the pipe closed."""
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(*args, writer), name=name)
    old = None
    with contextlib.suppress(ValueError):  # not the main thread: the child handles SIGINT itself
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        proc.start()
    except BaseException:
        reader.close()
        raise
    finally:
        writer.close()
        if old is not None:
            signal.signal(signal.SIGINT, old)
    return proc, reader


def become_worker() -> None:
    """In a spawned child, first: lead a process group of its own (a timeout kills the group: this
    process and the compilers it started) and leave SIGINT to the parent."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def kill_process_group(proc) -> None:
    """Kills a worker or task process and its process group (the compilers it started) when the process
    leads its own group (``become_worker``), else only the process; waits for it."""
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError, AttributeError):
        if os.getpgid(proc.pid) == proc.pid and proc.pid != os.getpgrp():
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.kill()
    proc.join(10)
