"""The SQLite store (sqlite-utils, WAL, versioned schema)."""
from app.store.db import Store, fts_query
from app.store.migrations import SCHEMA_VERSION, SchemaTooNew

__all__ = ["Store", "fts_query", "SCHEMA_VERSION", "SchemaTooNew"]
