"""End-to-end scenario with psycopg 3 against `spindle serve`.

Run by crates/server/tests/clients.rs as `python3 psycopg_scenario.py PORT`;
exits non-zero (with a traceback) when anything is off.
"""

import datetime
import decimal
import sys

import psycopg
from psycopg import errors

port = int(sys.argv[1])
conn = psycopg.connect(
    host="127.0.0.1", port=port, user="spindle", dbname="spindle", autocommit=True
)
cur = conn.cursor()

# Interleaved tables, in Spanner's PostgreSQL dialect.
cur.execute(
    "CREATE TABLE singers (singer_id bigint NOT NULL, name varchar(100), "
    "PRIMARY KEY (singer_id))"
)
cur.execute(
    "CREATE TABLE albums (singer_id bigint NOT NULL, album_id bigint NOT NULL, "
    "title varchar, released date, price numeric, rating float8, "
    "PRIMARY KEY (singer_id, album_id)) "
    "INTERLEAVE IN PARENT singers ON DELETE CASCADE"
)

# Parameterized inserts (server-side binding: Parse/Bind/Execute with $n).
cur.executemany(
    "INSERT INTO singers (singer_id, name) VALUES (%s, %s)",
    [(1, "Marc"), (2, "Catalina"), (3, None)],
)
assert cur.rowcount == 3 or cur.rowcount == 1, cur.rowcount
cur.execute(
    "INSERT INTO albums VALUES (%s, %s, %s, %s, %s, %s)",
    (1, 1, "Total Junk", datetime.date(2020, 1, 2), decimal.Decimal("9.99"), 4.5),
)
assert cur.rowcount == 1, cur.rowcount
cur.execute(
    "INSERT INTO albums (singer_id, album_id, title) VALUES (%s, %s, %s), (%s, %s, %s)",
    (1, 2, "Go, Go, Go", 2, 1, "Green"),
)
assert cur.rowcount == 2, cur.rowcount

# Parameterized selects, text and binary results, typed values back.
cur.execute("SELECT name FROM singers WHERE singer_id = %s", (2,))
assert cur.fetchone() == ("Catalina",)
cur.execute("SELECT name FROM singers WHERE singer_id = %s", (3,))
assert cur.fetchone() == (None,)
for binary in (False, True):
    bcur = conn.cursor(binary=binary)
    bcur.execute(
        "SELECT singer_id, album_id, title, released, price, rating FROM albums "
        "WHERE singer_id = %s AND album_id = %s",
        (1, 1),
    )
    row = bcur.fetchone()
    assert row[:4] == (1, 1, "Total Junk", datetime.date(2020, 1, 2)), row
    assert decimal.Decimal(row[4]) == decimal.Decimal("9.99"), row
    assert row[5] == 4.5, row
cur.execute(
    "SELECT s.name, count(*) FROM singers s JOIN albums a ON a.singer_id = s.singer_id "
    "GROUP BY s.name ORDER BY s.name"
)
assert cur.fetchall() == [("Catalina", 1), ("Marc", 2)], cur.fetchall()

# A transaction that commits.
with conn.transaction():
    cur.execute("INSERT INTO singers (singer_id, name) VALUES (%s, %s)", (4, "Alice"))
    cur.execute("INSERT INTO albums (singer_id, album_id, title) VALUES (%s, %s, %s)", (4, 1, "Wonder"))
cur.execute("SELECT count(*) FROM albums WHERE singer_id = %s", (4,))
assert cur.fetchone() == (1,)

# A transaction that rolls back.
with conn.transaction():
    cur.execute("INSERT INTO singers (singer_id, name) VALUES (%s, %s)", (5, "Bob"))
    cur.execute("SELECT count(*) FROM singers")
    assert cur.fetchone() == (5,)
    raise psycopg.Rollback()
cur.execute("SELECT count(*) FROM singers WHERE singer_id = %s", (5,))
assert cur.fetchone() == (0,)

# The same with autocommit off: commit() and rollback().
conn.autocommit = False
cur.execute("UPDATE singers SET name = %s WHERE singer_id = %s", ("Marc R.", 1))
conn.rollback()
cur.execute("SELECT name FROM singers WHERE singer_id = %s", (1,))
assert cur.fetchone() == ("Marc",)
conn.rollback()
cur.execute("UPDATE singers SET name = %s WHERE singer_id = %s", ("Marc R.", 1))
conn.commit()
conn.autocommit = True
cur.execute("SELECT name FROM singers WHERE singer_id = %s", (1,))
assert cur.fetchone() == ("Marc R.",)

# Errors carry their SQLSTATE; the connection stays usable.
try:
    cur.execute("INSERT INTO singers (singer_id, name) VALUES (%s, %s)", (1, "again"))
    raise AssertionError("duplicate key accepted")
except errors.UniqueViolation as e:
    assert e.sqlstate == "23505", e.sqlstate
try:
    cur.execute("INSERT INTO albums (singer_id, album_id, title) VALUES (%s, %s, %s)", (9, 1, "Orphan"))
    raise AssertionError("orphan accepted")
except errors.ForeignKeyViolation as e:
    assert e.sqlstate == "23503", e.sqlstate
try:
    cur.execute("SELECT nope FROM singers")
    raise AssertionError("unknown column accepted")
except errors.UndefinedColumn as e:
    assert e.sqlstate == "42703", e.sqlstate
# An error inside a transaction block: 25P02 until it ends, then rolled back.
try:
    with conn.transaction():
        cur.execute("INSERT INTO singers (singer_id, name) VALUES (%s, %s)", (6, "Eve"))
        cur.execute("INSERT INTO singers (singer_id, name) VALUES (%s, %s)", (6, "Eve again"))
    raise AssertionError("duplicate key accepted in a transaction")
except errors.UniqueViolation as e:
    assert e.sqlstate == "23505"
cur.execute("SELECT count(*) FROM singers WHERE singer_id = %s", (6,))
assert cur.fetchone() == (0,)

# COPY in both directions.
with cur.copy("COPY singers (singer_id, name) FROM STDIN") as copy:
    copy.write_row((10, "Copied"))
    copy.write_row((11, None))
cur.execute("SELECT name FROM singers WHERE singer_id >= 10 ORDER BY singer_id")
assert cur.fetchall() == [("Copied",), (None,)]
with cur.copy("COPY (SELECT singer_id, name FROM singers WHERE singer_id >= 10 ORDER BY singer_id) TO STDOUT") as copy:
    rows = list(copy.rows())
assert rows == [("10", "Copied"), ("11", None)], rows

# ON DELETE CASCADE removes the row tree.
cur.execute("DELETE FROM singers WHERE singer_id = %s", (1,))
cur.execute("SELECT count(*) FROM albums WHERE singer_id = %s", (1,))
assert cur.fetchone() == (0,)

conn.close()
print("psycopg scenario: ok")
