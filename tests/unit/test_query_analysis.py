"""Recall's query analysis: speakers, stripping, dates, when-questions, time expressions."""

from __future__ import annotations

import datetime as dt
import tempfile
from pathlib import Path

from mnemo_server.retrieval.query_analysis import analyse, has_time_expression, query_dates, speaker_of
from mnemo_server.store.database import Database
from mnemo_server.store.schema import MIGRATIONS


def test_speaker_prefix_and_labels() -> None:
    assert speaker_of("Caroline: I went to a support group") == "Caroline"
    assert speaker_of("Mary Ann Lee: hi") == "Mary Ann Lee"
    assert speaker_of("Decision: we use Postgres") == ""  # a label, not a speaker
    assert speaker_of("no prefix here") == ""
    assert speaker_of("lowercase: not a name") == ""


def test_dates_in_queries() -> None:
    assert query_dates("What happened on 9 November, 2022?") == [(dt.date(2022, 11, 9), dt.date(2022, 11, 9))]
    assert query_dates("plans for May 2023") == [(dt.date(2023, 5, 1), dt.date(2023, 5, 31))]
    assert query_dates("in 2021 or March 3, 2020") == [
        (dt.date(2020, 3, 3), dt.date(2020, 3, 3)),
        (dt.date(2021, 1, 1), dt.date(2021, 12, 31)),
    ]
    # No such day: the month still counts.
    assert query_dates("31 February, 2022") == [(dt.date(2022, 2, 1), dt.date(2022, 2, 28))]


def test_analysis_strips_speakers_but_keeps_a_question() -> None:
    a = analyse("When did Caroline go to the support group?", ["Caroline", "Melanie"], strip=True)
    assert a.named_speakers == ("Caroline",) and a.when_question
    assert a.text == "When did go to the support group?"
    assert analyse("Melanie's?", ["Melanie"], strip=True).text == "Melanie's?"  # nothing left: keep it
    assert (
        analyse("Caroline and Melanie", ["Caroline", "Melanie"], strip=False).text == "Caroline and Melanie"
    )


def test_time_expressions_ignore_the_speaker_prefix() -> None:
    assert has_time_expression("Jon: I'll go next week")
    assert not has_time_expression("Monday: I am fine")  # "Monday" here is only the speaker-like prefix


def test_speaker_migration_backfills_existing_rows() -> None:
    path = Path(tempfile.mkdtemp()) / "old.duckdb"
    import duckdb

    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE store_meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)")
    for ddl in MIGRATIONS[:3]:
        con.execute(
            ddl.replace("CREATE TABLE store_meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL);", "")
        )
    con.execute("INSERT INTO store_meta VALUES ('schema_version', '3')")
    values = [
        "t",
        "",
        1,
        None,
        "workspace",
        "default",
        "episodic",
        "general",
        "",
        "",
        "h",
        0.5,
        1.0,
        False,
        "",
        "",
        "",
        "",
        "{}",
        0,
        0,
        0,
        None,
        "",
        "",
        1,
        "m",
        None,
        None,
        0,
        None,
    ]
    for i, content in enumerate(["Jon: hello there", "Decision: use Postgres", "plain text"]):
        row = list(values)
        row[1], row[2], row[8] = f"id{i}", i, content
        con.execute(f"INSERT INTO memories VALUES ({', '.join('?' * len(row))})", row)
    con.close()
    db = Database(path)  # opening runs migration 4
    rows = db.reader().execute("SELECT id, speaker FROM memories ORDER BY id").fetchall()
    assert rows == [("id0", "Jon"), ("id1", ""), ("id2", "")]
    assert db.get_meta("schema_version") == str(len(MIGRATIONS))
    db.close()
