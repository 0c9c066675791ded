"""helpers.network: a call bounded in total time, and whether a server answers, against real local servers."""

import http.server
import socket
import threading
import time

import pytest

from helpers.network import call_within, http_answers


def test_call_within_returns_the_result_or_raises_the_calls_own_error():
    assert call_within(5.0, lambda x: x * 2, 21) == 42
    with pytest.raises(KeyError, match="missing"):
        call_within(5.0, lambda: {}["missing"])


def test_call_within_gives_up_after_its_bound_and_names_the_call():
    def never_returns():
        threading.Event().wait()

    start = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"never_returns did not return within 0\.3 s"):
        call_within(0.3, never_returns)
    assert time.perf_counter() - start < 5, "the caller is let go at the bound, not when the call ends"


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan")])
def test_call_within_refuses_a_bound_that_is_not_a_finite_number_of_seconds(timeout):
    with pytest.raises(ValueError, match="finite number of seconds"):
        call_within(timeout, lambda: None)


class _NotFound(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self):
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_any_http_reply_counts_as_an_answer_even_an_error_status():
    server = http.server.HTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert http_answers(f"http://127.0.0.1:{server.server_port}/", 5.0)
    finally:
        server.shutdown()


def test_a_server_that_accepts_and_never_answers_is_no_answer_within_the_bound():
    with socket.socket() as listener:  # the kernel accepts the connection; nobody ever reads or replies
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        start = time.perf_counter()
        assert not http_answers(f"http://127.0.0.1:{listener.getsockname()[1]}/", 0.5)
        assert time.perf_counter() - start < 5


def test_a_refused_connection_and_a_url_that_is_not_http_are_no_answer():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert not http_answers(f"http://127.0.0.1:{port}/", 2.0)
    assert not http_answers("not a url", 2.0)
