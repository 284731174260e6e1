"""service/store/db.py: the in-process turn-taking of SQLite writers."""

from __future__ import annotations

import threading

from service.store.db import make_engine, one_writer


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
