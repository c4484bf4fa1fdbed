"""Test hooks for eLLM subprocesses, each off unless its environment variable is set.
This folder is put on PYTHONPATH by tests/reliability/helpers.py only.

ELLM_TEST_NO_NETWORK=1     internet sockets and name lookups raise (and are logged to
                           ELLM_TEST_NETWORK_LOG when set), see ellm_netguard.py;
                           =listen: a server may listen on loopback, nothing more
ELLM_TEST_VANISH=PATH      PATH is deleted just before the process first opens it:
                           a file that disappears between listing and reading
ELLM_TEST_PAUSE_IN_SAVE=N  the Nth document saved with pages stops inside its open
                           transaction (pages written, not committed), says
                           "PAUSED IN TRANSACTION" on stderr and sleeps: kill it there
ELLM_TEST_STREAM_DELAY=S   an answer's text streams with S seconds between pieces, so
                           a test can kill `ellm ask` mid-answer whatever the model says
ELLM_TEST_HWM_FILE=PATH    at exit, the process writes its peak resident set (VmHWM of
                           its own address space, in bytes) to PATH. wait4's ru_maxrss
                           cannot be used: Linux carries the forking parent's peak into
                           the child across exec, so a big pytest process inflates it
ELLM_TEST_INGEST_HOLD=PATH while PATH exists, ingestion goes on at one file per 0.2 s,
                           so it is surely still writing while the test does something else
"""
import os

if os.environ.get("ELLM_TEST_HWM_FILE"):
    import atexit

    def _write_hwm(path=os.environ["ELLM_TEST_HWM_FILE"]):
        with open("/proc/self/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        with open(path, "w") as f:
            f.write(str(kb * 1024))

    atexit.register(_write_hwm)

if os.environ.get("ELLM_TEST_NO_NETWORK"):
    import ellm_netguard

    ellm_netguard.install_for_process(listen=os.environ["ELLM_TEST_NO_NETWORK"] == "listen")

if os.environ.get("ELLM_TEST_VANISH"):
    import builtins

    _vanish = os.path.abspath(os.environ["ELLM_TEST_VANISH"])
    _real_open = builtins.open

    def _open(file, *args, **kwargs):
        global _vanish
        if _vanish and isinstance(file, (str, os.PathLike)) and os.path.abspath(file) == _vanish:
            os.unlink(_vanish)
            _vanish = ""
        return _real_open(file, *args, **kwargs)

    builtins.open = _open

if os.environ.get("ELLM_TEST_PAUSE_IN_SAVE"):
    import sys
    import time

    from app.store import db as _db

    _pause_at, _saved = int(os.environ["ELLM_TEST_PAUSE_IN_SAVE"]), 0
    _real_save = _db.Store.save_document

    def _save(self, record, pages=None, chunks=None):
        global _saved
        if pages is None:
            return _real_save(self, record, pages, chunks)
        _saved += 1
        with self.transaction():  # the real save nests inside: its writes stay uncommitted
            doc_id = _real_save(self, record, pages, chunks)
            if _saved == _pause_at:
                sys.stderr.write(f"PAUSED IN TRANSACTION {record['path']}\n")
                sys.stderr.flush()
                time.sleep(300)
        return doc_id

    _db.Store.save_document = _save

if os.environ.get("ELLM_TEST_STREAM_DELAY"):
    import time

    import app.qa.answer as _ask

    _delay = float(os.environ["ELLM_TEST_STREAM_DELAY"])
    _real_stream = _ask.stream_text

    def _slow_stream(*args, **kwargs):
        for piece in _real_stream(*args, **kwargs):
            yield piece
            time.sleep(_delay)

    _ask.stream_text = _slow_stream

if os.environ.get("ELLM_TEST_INGEST_HOLD"):
    import time

    import app.library.ingest as _ingest

    _hold = os.environ["ELLM_TEST_INGEST_HOLD"]
    _real_one = _ingest._ingest_one

    def _held_one(*args, **kwargs):
        event = _real_one(*args, **kwargs)
        if os.path.exists(_hold):
            time.sleep(0.2)
        return event

    _ingest._ingest_one = _held_one
