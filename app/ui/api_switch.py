"""The window's switch for the local OpenAI-compatible API (app/api/server.py, what `ellm serve`
runs): started in the background when the setting is on (at startup, and when it is turned on),
stopped when it is turned off and when the window closes. The window binds loopback only, so
no key is needed and nothing beyond this computer can reach it; its address is on a permanent
label of the status bar while it serves."""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QLabel

from app.settings import Settings

HOST = "127.0.0.1"   # the window never serves beyond this computer (`ellm serve --host` can, with a key)


class ApiSwitch(QObject):
    """Starts and stops the session's API server as the settings say."""

    sig_error = Signal(str)
    """The server could not start (the port is taken, ...): a message a person can act on."""
    sig_message = Signal(str)
    """The server was started or stopped: one line for the status bar."""

    def __init__(self, session, parent=None):
        super().__init__(parent)
        self.session = session
        self.server = None          # the running ApiServer, if any
        self.port: int | None = None
        self.error = ""             # why the last start failed
        self.label = QLabel("")
        self.label.setObjectName("apiStatus")
        self.label.setToolTip("Other programs on this computer can use eLLM through this OpenAI-compatible "
                              "address (Settings → Local API server)")
        self.label.setVisible(False)

    # ---- Public API --------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.server is not None and bool(self.server.running)

    @property
    def url(self) -> str:
        """The server's address while it serves ("" otherwise)."""
        return self.server.url if self.running else ""

    def describe(self) -> str:
        """One line for the settings dialog: where it serves, or why not."""
        if self.running:
            return f"Serving at {self.url}/v1 (this computer only)"
        if self.error:
            return f"Not serving: {self.error}"
        return ""

    def apply(self, settings: Settings) -> None:
        """Serve on ``settings.api_port`` when ``settings.api_server`` is on; stop otherwise."""
        if not settings.api_server:
            if self.server is not None:
                self.stop()
                self.sig_message.emit("The local API server is off")
            self.error = ""
            return
        if self.running and self.port == settings.api_port:
            return
        self.stop()
        self.start(settings.api_port)

    def start(self, port: int) -> bool:
        """Start serving on ``HOST:port``; a failure becomes a message (sig_error), never an exception."""
        try:
            from app.api.server import ApiServer

            server = ApiServer(self.session, HOST, port)
            server.start()
        except Exception as e:   # ApiServerError (cannot bind), a missing server library: say so, carry on
            self.error = str(e) or type(e).__name__
            self._show()
            self.sig_error.emit(f"The local API server could not start: {self.error.rstrip('.')}. Choose another "
                                f"port than {port} in Settings → Local API server, or turn it off.")
            return False
        self.server, self.port, self.error = server, port, ""
        self._show()
        self.sig_message.emit(f"The local API server is on: {server.url}/v1")
        return True

    def stop(self) -> None:
        """Stop serving (nothing when it is not running)."""
        server, self.server, self.port = self.server, None, None
        if server is not None:
            try:
                server.stop()
            except Exception as e:  # it is going away anyway: say so, do not stop the window closing
                self.sig_message.emit(f"The local API server stopped with an error: {e}")
        self._show()

    # ---- Internals -------------------------------------------------------------

    def _show(self) -> None:
        self.label.setText(f"API: {self.url}" if self.running else "")
        self.label.setVisible(self.running)
