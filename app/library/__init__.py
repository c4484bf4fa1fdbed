"""The library: reading files and folders into the store, watching folders, locating passages
on pages, the ingest lock and the data directory doctor."""
