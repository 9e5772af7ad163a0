"""`conformance.support.launching`: what the launching cases rely on beyond the launch itself."""

from __future__ import annotations

import threading

import pytest

from conformance.support.launching import holding_port


def test_holding_port_makes_a_second_holder_wait_then_names_the_port() -> None:
    """A second run waits for the port while the first holds it, gets it once released, and a wait past its
    timeout is one TimeoutError naming the port."""
    port = 65001  # a name for the lock only; nothing listens
    acquired = threading.Event()
    with holding_port(port, timeout=5):
        with pytest.raises(TimeoutError, match=f"port {port} stayed reserved"):
            with holding_port(port, timeout=0.2):
                pass

        def second_run() -> None:
            with holding_port(port, timeout=5):
                acquired.set()

        waiter = threading.Thread(target=second_run)
        waiter.start()
        assert not acquired.wait(0.3), "a second holder got the port while the first still held it"
    waiter.join(5)
    assert acquired.is_set(), "the second holder never got the port after it was released"
