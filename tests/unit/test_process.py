"""Process identity and lifecycle, exercised on a real short-lived OS process."""

import socket

from services.stack import process


def _start_sleeper(tmp_path):
    return process.start(
        ["sleep", "300"],
        pid_file=tmp_path / "run" / "sleeper.pid",
        log_file=tmp_path / "logs" / "sleeper.log",
        cwd=tmp_path,
        env={},
        user=None,
    )


def test_started_process_is_found_and_stopped_by_its_pid_file(tmp_path):
    started = _start_sleeper(tmp_path)
    pid_file = tmp_path / "run" / "sleeper.pid"
    assert process.running(pid_file) == started
    assert process.stop(pid_file, timeout_s=10) is True
    assert not process.is_running(started)
    assert not pid_file.exists()
    assert process.stop(pid_file) is False


def test_a_recycled_pid_is_not_mistaken_for_ours(tmp_path):
    started = _start_sleeper(tmp_path)
    try:
        impostor = process.Started(pid=started.pid, start_ticks=started.start_ticks - 1)
        assert not process.is_running(impostor)
    finally:
        process.stop(tmp_path / "run" / "sleeper.pid", timeout_s=10)


def test_port_in_use_sees_a_listening_socket():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert process.port_in_use("127.0.0.1", port)
    assert not process.port_in_use("127.0.0.1", port)
