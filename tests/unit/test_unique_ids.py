"""Ids and jitter leave the ``random`` module's shared generator alone."""

from __future__ import annotations

import os
import random

from boundedcode_gateway.call_context import CallContext
from boundedcode_gateway.fronts.messages.errors import new_request_id
from boundedcode_gateway.policy.retry import backoff_s
from boundedcode_gateway.unique_ids import base62_id, hex_id


def test_making_ids_and_jitter_does_not_move_the_shared_generator() -> None:
    random.seed(7)
    before = random.getstate()
    CallContext.new("t1", "main")
    new_request_id()
    backoff_s(2)
    assert random.getstate() == before


def test_a_program_that_seeds_the_shared_generator_does_not_repeat_our_ids() -> None:
    random.seed(7)
    first = CallContext.new("t1", "main").call_id
    random.seed(7)
    assert CallContext.new("t1", "main").call_id != first


def test_ids_have_their_forms() -> None:
    assert len(hex_id()) == 32 and int(hex_id(), 16) >= 0
    assert len(hex_id(64)) == 16
    assert len(base62_id(24)) == 24 and base62_id(24).isalnum()


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, back through the pipe
        os.write(write, hex_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    assert hex_id() != child
