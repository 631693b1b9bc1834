"""A configured interval in words is read back by PostgreSQL as the same interval (radixjobs.timewords)."""

from __future__ import annotations

from typing import Any

import psycopg

from radixjobs import timewords

S = 1_000_000_000


def test_interval_words_are_intervals_postgresql_reads_back(conn: psycopg.Connection[Any]) -> None:
    for ns in (5 * S, 60 * S, 7200 * S, S + S // 2, S // 4, 1_000, 86_400 * S + 1800 * S, 90 * S + S // 4,
               3 * 86_400 * S + 5 * 3600 * S + 7 * 60 * S + 9 * S + 123_456_000):
        words = timewords.interval_words(ns)
        same = conn.execute("SELECT %s::interval = %s::bigint * interval '1 microsecond'",
                            (words, ns // 1_000)).fetchone()
        assert same == (True,), words
