"""service/store/db.py: the turn-taking of SQLite writers, in one process and across processes."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

from service.store.db import make_engine, one_writer, writer_turn_now


def test_writers_of_one_sqlite_database_take_turns_and_other_databases_do_not_wait(tmp_path):
    same, other = make_engine(f"sqlite:///{tmp_path}/a.db"), make_engine(f"sqlite:///{tmp_path}/b.db")
    held, release, order = threading.Event(), threading.Event(), []

    def first() -> None:
        with one_writer(same):
            held.set()
            release.wait(10)
            order.append("first")

    def second() -> None:
        with one_writer(make_engine(f"sqlite:///{tmp_path}/a.db")):  # another engine on the same file: the same turn
            order.append("second")

    holder = threading.Thread(target=first)
    holder.start()
    assert held.wait(10)
    with one_writer(other):
        order.append("other database")
    waiter = threading.Thread(target=second)
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and order == ["other database"]  # still waiting for the first writer's turn
    release.set()
    holder.join(10)
    waiter.join(10)
    assert order == ["other database", "first", "second"]


def test_postgresql_writers_are_not_held_back():
    engine = make_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")  # never connects
    with one_writer(engine), one_writer(engine):  # a lock would deadlock here
        pass
    with writer_turn_now(engine) as ours:  # no turns to take: the event loop leaves PostgreSQL's writes to threads
        assert ours is False


def test_the_turn_now_is_had_only_when_free_and_is_then_held(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/a.db")
    with one_writer(engine), writer_turn_now(make_engine(f"sqlite:///{tmp_path}/./a.db")) as ours:
        assert ours is False  # the same file by another name: the same turn
    with writer_turn_now(engine) as ours:
        assert ours is True
        taken = threading.Event()

        def write() -> None:
            with one_writer(engine):
                taken.set()

        waiter = threading.Thread(target=write)
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive() and not taken.is_set()  # a thread's writer waits for the turn the loop holds
    waiter.join(10)
    assert taken.is_set()


def _hold_the_turn(database_url: str, held: Path, release: Path) -> None:
    """In another process: take the writers' turn, say so, and keep it until ``release`` exists."""
    with one_writer(make_engine(database_url)):
        held.touch()
        deadline = time.monotonic() + 30
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.01)


def test_writers_in_other_processes_take_turns_too(tmp_path):
    """``serve --api-processes`` runs several API processes on one SQLite file: a writer waits for another process's
    turn to end, on the lock file beside the database."""
    url, held, release = f"sqlite:///{tmp_path}/a.db", tmp_path / "held", tmp_path / "release"
    other = multiprocessing.get_context("spawn").Process(target=_hold_the_turn, args=(url, held, release))
    other.start()
    try:
        deadline = time.monotonic() + 60
        while not held.exists():
            assert other.is_alive() and time.monotonic() < deadline, "the other process never took its turn"
            time.sleep(0.01)
        with writer_turn_now(make_engine(url)) as ours:
            assert ours is False  # the other process's turn: the event loop does not wait for it
        order: list[str] = []

        def write() -> None:
            with one_writer(make_engine(url)):
                order.append("here")

        waiter = threading.Thread(target=write)
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive() and order == []  # still waiting for the other process's turn
        with writer_turn_now(make_engine(url)) as ours:
            assert ours is False  # nor for this process's writer that waits on it
        release.touch()
        waiter.join(10)
        assert order == ["here"]
        with writer_turn_now(make_engine(url)) as ours:
            assert ours is True  # nobody's turn now: the loop takes it
        assert (tmp_path / "a.db.writer-lock").exists()
    finally:
        release.touch()
        other.join(30)
