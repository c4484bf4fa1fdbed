"""The local OpenAI-compatible HTTP API (``ellm serve``, the window's *Local API server*).

``requests`` reads and checks a chat request as OpenAI's API defines it (with eLLM's
``documents`` / ``folder`` / ``all`` extension), ``chat`` answers it through the answer service
(documents) or the model alone (no documents) and keeps the conversations it has answered so a
follow-up reuses the cache, ``server`` serves both on Starlette and uvicorn.
"""
