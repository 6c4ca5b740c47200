"""The MPS daemon check before Allocate: a live daemon (socket or named pipe) passes; a missing endpoint, a
socket its daemon left behind, and anything else are refused with the reason."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from share_plugin.mps import CONTROL
from share_plugin.mps import control_problem
from tests.unit.plugin.simnode import listen_like_mps_control


@pytest.fixture
def pipe_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="mps", dir="/tmp") as d:  # short: unix socket paths are limited
        yield Path(d)


def test_a_listening_seqpacket_socket_is_a_running_daemon(pipe_dir: Path) -> None:
    daemon = listen_like_mps_control(str(pipe_dir))
    try:
        assert control_problem(pipe_dir) is None
    finally:
        daemon.close()


def test_a_stream_socket_listener_is_accepted_too(pipe_dir: Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(pipe_dir / CONTROL))
    sock.listen(1)
    try:
        assert control_problem(pipe_dir) is None
    finally:
        sock.close()


def test_the_socket_of_a_daemon_that_exited_is_refused(pipe_dir: Path) -> None:
    listen_like_mps_control(str(pipe_dir)).close()  # the file stays, as after `quit` or SIGKILL
    assert (pipe_dir / CONTROL).is_socket()
    problem = control_problem(pipe_dir)
    assert problem is not None and "no daemon listens" in problem and str(pipe_dir / CONTROL) in problem


def test_an_older_daemons_named_pipe_passes(pipe_dir: Path) -> None:
    os.mkfifo(pipe_dir / CONTROL)
    assert control_problem(pipe_dir) is None


def test_a_missing_endpoint_names_the_path(pipe_dir: Path) -> None:
    assert control_problem(pipe_dir) == f"{pipe_dir / CONTROL}: No such file or directory"


def test_a_regular_file_is_not_a_daemon(pipe_dir: Path) -> None:
    (pipe_dir / CONTROL).write_text("")
    problem = control_problem(pipe_dir)
    assert problem is not None and "neither the daemon's socket nor its named pipe" in problem
