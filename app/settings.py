"""Where eLLM keeps its files, and the user settings with their defaults.

Defaults live in one table (``Settings`` field defaults); the store keeps only
what a person changed.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

# The choices are the engine's own lists (light modules: nothing of numba loads here).
from app.engine.attention.config import MODES
from app.engine.cpu.plan import NUMA_POLICIES
from app.engine.kv.formats import KV_NAMES
from app.runtime.auto import AUTO
from app.runtime.engines import ENGINES

# "auto" leaves the choice to eLLM (app/runtime/auto.py), then the engine's own lists.
KV_SETTINGS = (AUTO,) + KV_NAMES
ATTENTION = (AUTO,) + MODES

AUTO_BUDGET = -1   # the cache budget's "automatic": a share of the disk (qa/cache_budget.py)

__all__ = ["ATTENTION", "AUTO_BUDGET", "ENGINES", "KV_SETTINGS", "NUMA_POLICIES", "Paths", "Settings", "default_data_dir"]


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "ellm"


@dataclass(frozen=True)
class Paths:
    """The data directory: the store, the models folder and the caches."""

    root: Path

    @classmethod
    def resolve(cls, data_dir: str | os.PathLike | None = None) -> "Paths":
        """``--data-dir`` wins, then ``ELLM_DATA_DIR``, then the XDG data directory."""
        chosen = data_dir or os.environ.get("ELLM_DATA_DIR") or default_data_dir()
        return cls(Path(chosen).expanduser().resolve())

    @property
    def db(self) -> Path:
        return self.root / "ellm.db"

    @property
    def models_dir(self) -> Path:
        return self.root / "models"

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    @property
    def planes_dir(self) -> Path:
        """The models' repacked weights, kept between starts (app/engine/quant/planes_file.py)."""
        return self.cache_dir / "planes"

    def ensure(self) -> "Paths":
        for d in (self.root, self.models_dir, self.cache_dir):
            d.mkdir(parents=True, exist_ok=True)
        return self


@dataclass(frozen=True)
class Settings:
    """What a person can change; every default is here and nowhere else."""

    model: str = ""  # path of a GGUF file; "" = the default model
    engine: str = "auto"
    n_ctx: int = 0  # context length in tokens (prompt + answer); 0 = the whole document (runtime/auto.py)
    max_tokens: int = 512
    temperature: float = 0.2
    top_k: int = 40
    top_p: float = 0.95
    repeat_penalty: float = 1.1
    seed: int = 0
    threads: int = 0  # 0 = one per physical core
    numa: str = "distribute"  # NUMA policy: distribute | isolate | none
    kv: str = "auto"  # KV format: auto | f16 | k8v8 | k8v4 | k4v4 (docs/engine.md, "KV cache")
    attention: str = "auto"  # auto | dense | sparse | sparse-decode (docs/engine.md, "Sparse attention", "Automatic settings")
    api_server: bool = False  # the window serves the local OpenAI-compatible API (on 127.0.0.1 only)
    api_port: int = 8080  # ... on this port
    cache_budget: int = AUTO_BUDGET  # bytes of disk for document caches; -1 = automatic (docs/engine.md, "Libraries and the cache budget")
    read_ahead_share: float = 0.5  # reading ahead stops at this share of the budget for documents nobody opened

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")
        if self.n_ctx != 0 and self.n_ctx < 256:
            raise ValueError(f"context length must be 0 (automatic) or at least 256 tokens, not {self.n_ctx}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, not {self.max_tokens}")
        if self.kv not in KV_SETTINGS:
            raise ValueError(f"KV setting must be one of {', '.join(KV_SETTINGS)}, not {self.kv!r}")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, not {self.attention!r}")
        if self.numa not in NUMA_POLICIES:
            raise ValueError(f"NUMA policy must be one of {', '.join(NUMA_POLICIES)}, not {self.numa!r}")
        if self.cache_budget < AUTO_BUDGET:
            raise ValueError(f"the cache budget must be a number of bytes (or -1, automatic), not {self.cache_budget}")
        if not 0.0 <= self.read_ahead_share <= 1.0:
            raise ValueError(f"the share of the cache budget reading ahead may fill must be between 0 and 1, "
                             f"not {self.read_ahead_share}")
        if not 1 <= self.api_port <= 65535:
            raise ValueError(f"the API server's port must be between 1 and 65535, not {self.api_port}")

    @classmethod
    def from_dict(cls, values: dict) -> "Settings":
        """Known keys only, each converted to its field's type; unknown keys ignored
        (a newer eLLM may have stored more)."""
        known = {f.name: f for f in fields(cls)}
        kwargs = {}
        for k, v in values.items():
            if k in known:
                kind = type(known[k].default)
                kwargs[k] = kind(v)
        return cls(**kwargs)

    def as_dict(self) -> dict:
        return asdict(self)

    def changed(self) -> dict:
        """Only the values that differ from the defaults."""
        base = Settings()
        return {k: v for k, v in self.as_dict().items() if getattr(base, k) != v}

    def with_(self, **changes) -> "Settings":
        return replace(self, **changes)
