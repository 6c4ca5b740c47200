"""Is the MPS control daemon there to enforce the limit? Asked before every Allocate in MPS mode.

CUDA reaches the daemon through `control` in CUDA_MPS_PIPE_DIRECTORY. Older MPS releases made it a named
pipe (FIFO); the daemon of CUDA 13 / driver 580 listens on a Unix socket of type SOCK_SEQPACKET there
(seen on an H100: `srw-rw-rw- control`; a SOCK_STREAM connect is refused with EPROTOTYPE). The socket file
outlives the daemon: after `quit` and after SIGKILL it stays, and a connect is refused (ECONNREFUSED). A
client that finds no daemon runs without MPS, silently and without the pinned memory limit, so a file
that merely exists proves nothing: the check connects, and the daemon takes a connection that sends
nothing as a closed UI session (it logs "User did not send valid credentials").
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

# The control daemon's endpoint in CUDA_MPS_PIPE_DIRECTORY (named "control" by every MPS release).
CONTROL = "control"


def control_problem(pipe_dir: str | Path) -> str | None:
    """Why CUDA clients in `pipe_dir` would not reach a running control daemon, or None when they would."""
    path = Path(pipe_dir) / CONTROL
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if stat.S_ISFIFO(mode):
        return None  # an older daemon's named pipe: it is removed when that daemon exits
    if not stat.S_ISSOCK(mode):
        return f"{path} is neither the daemon's socket nor its named pipe"
    return _connect_problem(path)


def _connect_problem(path: Path) -> str | None:
    last: OSError | None = None
    for kind in (socket.SOCK_SEQPACKET, socket.SOCK_STREAM):
        sock = socket.socket(socket.AF_UNIX, kind)
        try:
            sock.settimeout(2.0)
            sock.connect(os.fspath(path))
            return None
        except OSError as exc:
            if exc.errno != errno.EPROTOTYPE:  # a listener of the other type answers EPROTOTYPE: try it
                return _refused(path, exc)
            last = exc
        finally:
            sock.close()
    return _refused(path, last)


def _refused(path: Path, exc: OSError | None) -> str:
    if exc is not None and exc.errno == errno.ECONNREFUSED:
        return f"{path}: no daemon listens on it (a daemon that exited leaves its socket behind)"
    return f"{path}: cannot connect ({exc})"
