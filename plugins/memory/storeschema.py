"""
The memory store's file layout: its tables, the full-text index recall
searches and the triggers that keep it in step, and how a file is made or
brought up to date when it is opened (L{checkVersion}, L{migrate}).
"""

from __future__ import annotations

import sqlite3

from rpmiddleware.builtin.memory.storeerrors import StoreError

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    integration TEXT NOT NULL,
    character TEXT NOT NULL,
    conversation TEXT NOT NULL,
    summary TEXT NOT NULL DEFAULT '',
    summarized INTEGER NOT NULL DEFAULT 0,
    updated REAL NOT NULL,
    UNIQUE (integration, character, conversation)
);
CREATE TABLE IF NOT EXISTS entries (
    conversation INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL,
    speaker TEXT NOT NULL,
    text TEXT NOT NULL,
    status TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (conversation, seq)
);
CREATE TABLE IF NOT EXISTS facts (
    id INTEGER PRIMARY KEY,
    conversation INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    text TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS state (
    conversation INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (conversation, name)
);
CREATE TABLE IF NOT EXISTS knowledge (
    id INTEGER PRIMARY KEY,
    integration TEXT NOT NULL,
    scope TEXT NOT NULL,
    entry TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS saves (
    id INTEGER PRIMARY KEY,
    integration TEXT NOT NULL,
    conversation TEXT NOT NULL,
    save TEXT NOT NULL,
    created REAL NOT NULL,
    characters TEXT NOT NULL,
    entries INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    body TEXT NOT NULL,
    checksum TEXT NOT NULL,
    UNIQUE (integration, conversation, save)
);
CREATE TABLE IF NOT EXISTS memories (
    id INTEGER PRIMARY KEY,
    conversation INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    text TEXT NOT NULL,
    importance REAL NOT NULL DEFAULT 0.5,
    at REAL NOT NULL,
    source TEXT NOT NULL DEFAULT 'game'
);
CREATE INDEX IF NOT EXISTS memories_conversation ON memories (conversation);
"""

#: The full-text index of what conversations remember (recall): one FTS5
#: table over the entries and the memories that keeps no copy of their text
#: (external content: the view C{recall_source}) and is kept in step by
#: triggers, so that every writer (this one, a restore, a cascade of a
#: forget) keeps it right.  Its row ids are our own and stable (an entry's
#: implicit rowid may change with VACUUM): an entry's is its conversation's
#: row id times L{search.RECALL_SPAN} plus its seq, a memory's the same with its
#: id, negated; so one conversation's entries are one range of ids and its
#: memories another, which FTS5 searches without reading the rest.
RECALL_SCHEMA = (
    """
CREATE VIEW IF NOT EXISTS recall_source (rid, text) AS
    SELECT conversation * 4294967296 + seq, text FROM entries
    UNION ALL SELECT -(conversation * 4294967296 + id), text FROM memories
""",
    """
CREATE TRIGGER IF NOT EXISTS recall_entry_added AFTER INSERT ON entries BEGIN
    INSERT INTO recall (rowid, text) VALUES (new.conversation * 4294967296 + new.seq, new.text);
END
""",
    """
CREATE TRIGGER IF NOT EXISTS recall_entry_removed AFTER DELETE ON entries BEGIN
    INSERT INTO recall (recall, rowid, text)
    VALUES ('delete', old.conversation * 4294967296 + old.seq, old.text);
END
""",
    """
CREATE TRIGGER IF NOT EXISTS recall_entry_changed AFTER UPDATE OF text ON entries BEGIN
    INSERT INTO recall (recall, rowid, text)
    VALUES ('delete', old.conversation * 4294967296 + old.seq, old.text);
    INSERT INTO recall (rowid, text) VALUES (new.conversation * 4294967296 + new.seq, new.text);
END
""",
    """
CREATE TRIGGER IF NOT EXISTS recall_memory_added AFTER INSERT ON memories BEGIN
    INSERT INTO recall (rowid, text) VALUES (-(new.conversation * 4294967296 + new.id), new.text);
END
""",
    """
CREATE TRIGGER IF NOT EXISTS recall_memory_removed AFTER DELETE ON memories BEGIN
    INSERT INTO recall (recall, rowid, text)
    VALUES ('delete', -(old.conversation * 4294967296 + old.id), old.text);
END
""",
    """
CREATE TRIGGER IF NOT EXISTS recall_memory_changed AFTER UPDATE OF text ON memories BEGIN
    INSERT INTO recall (recall, rowid, text)
    VALUES ('delete', -(old.conversation * 4294967296 + old.id), old.text);
    INSERT INTO recall (rowid, text) VALUES (-(new.conversation * 4294967296 + new.id), new.text);
END
""",
)
RECALL_TABLE = (
    "CREATE VIRTUAL TABLE recall USING fts5 (text, content='recall_source', "
    "content_rowid='rid', tokenize='porter unicode61 remove_diacritics 2')"
)


def indexForRecall(db: sqlite3.Connection) -> None:
    """
    Make the recall index if the file has none (a file written before it,
    or a new one), filled at once from what the file holds (a one-time
    C{rebuild}), and its triggers; inside the opening transaction.
    """
    found = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'recall'"
    ).fetchone()
    if found is None:
        db.execute(RECALL_TABLE)
    for statement in RECALL_SCHEMA:
        db.execute(statement)
    if found is None:
        db.execute("INSERT INTO recall (recall) VALUES ('rebuild')")


def checkVersion(db: sqlite3.Connection, path: str) -> None:
    """
    Refuse a file a newer rpmiddleware wrote (its schema is one this one
    cannot read).

    @raise StoreError: naming C{path} and both versions.
    """
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path} was written by a newer rpmiddleware (memory schema "
            f"{version}; this one reads {SCHEMA_VERSION})"
        )


def migrate(db: sqlite3.Connection) -> None:
    """
    Make what the file lacks of L{SCHEMA} and the recall index, in one
    transaction (a write at once, so that a file that cannot be written
    is said when it is opened).
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        for statement in SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)
        indexForRecall(db)
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
