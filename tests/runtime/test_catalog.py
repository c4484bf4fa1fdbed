"""`ellm models available` and `ellm models install`: the catalogue, installing through pip from a
package index (here a local one of wheels the test builds), verifying the sha256, resuming, and
the catalogue's default model taking over once it is installed."""
from __future__ import annotations

import dataclasses
import hashlib
import zipfile

import pytest

import app.runtime.catalog as catalog
from app.runtime.model_files import default_model_path

PART = 3000   # bytes per part of the test model (the last part is shorter)


def _wheel(folder, dist: str, member: str, data: bytes) -> None:
    """A minimal wheel of distribution ``dist`` 1.0 holding ``member``."""
    pkg = dist.replace("-", "_")
    with zipfile.ZipFile(folder / f"{pkg}-1.0-py3-none-any.whl", "w") as z:
        z.writestr(f"{pkg}/__init__.py", "")
        z.writestr(member.replace("PKG", pkg), data)
        z.writestr(f"{pkg}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        z.writestr(f"{pkg}-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                  "Tag: py3-none-any\n")
        z.writestr(f"{pkg}-1.0.dist-info/RECORD", "")


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A local package index (PIP_FIND_LINKS, no network) and a catalogue whose default model is
    the packaged SmolLM2 file cut into parts across three wheels."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    data = default_model_path().read_bytes()[: 2 * PART + 100]
    model = dataclasses.replace(
        catalog.find(catalog.DEFAULT_MODEL), file="test-model.gguf", file_size=len(data),
        packages=tuple(f"ellm-test-part{i}==1.0" for i in range(1, 4)), member="*/data/part*.bin",
        sha256=hashlib.sha256(data).hexdigest())
    for i in range(3):
        _wheel(wheels, f"ellm-test-part{i + 1}", f"PKG/data/part{i + 1:02d}.bin", data[i * PART:(i + 1) * PART])
    monkeypatch.setattr(catalog, "CATALOG", (model,))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return wheels, model, data


def test_available_lists_every_field_a_person_chooses_by(cli):
    rc, rows, _ = cli("models", "available", "--json", json_out=True)
    assert rc == 0 and [r["name"] for r in rows] == [m.name for m in catalog.CATALOG]
    for r in rows:
        assert {"name", "parameters", "quantization", "file_size", "ram_needed", "context_length", "licence",
                "packages", "sha256", "installed", "path", "default"} <= set(r)
        assert r["ram_needed"] > r["file_size"] and len(r["sha256"]) == 64 and r["installed"] is False
    assert [r["name"] for r in rows if r["default"]] == [catalog.DEFAULT_MODEL]
    rc, text, _ = cli("models", "available")
    assert rc == 0 and "Qwen2.5-Coder-1.5B-Instruct" in text and "Apache-2.0" in text and "Q4_K_M" in text


def test_install_joins_the_parts_verifies_them_and_the_default_model_takes_over(cli, index, data_dir):
    wheels, model, data = index
    assert default_model_path(data_dir / "models") == default_model_path()      # nothing installed yet
    rc, out, err = cli("models", "install", model.name)
    assert rc == 0, err
    installed = data_dir / "models" / model.file
    assert installed.read_bytes() == data
    assert "downloading ellm-test-part3==1.0 (3 of 3)" in err and "installed" in out
    assert not (data_dir / "models" / catalog.DOWNLOADS).exists() and not list((data_dir / "models").glob("*.part"))
    # The catalogue's default, once installed, is the model the app uses when none is chosen.
    assert default_model_path(data_dir / "models") == installed
    rc, listed, _ = cli("models", "--json", json_out=True)
    assert [m["path"] for m in listed if m["default"]] == [str(installed)]
    rc, rows, _ = cli("models", "available", "--json", json_out=True)
    assert rows[0]["installed"] is True and rows[0]["path"] == str(installed)
    rc, _, err = cli("models", "install", model.name)          # again: nothing to do
    assert rc == 0 and "already installed" in err


def test_an_interrupted_install_resumes_with_what_it_downloaded(cli, index, data_dir):
    wheels, model, data = index
    third = next(wheels.glob("ellm_test_part3-*.whl"))
    held = third.rename(third.with_suffix(".held"))             # the index loses a wheel mid-way
    rc, _, err = cli("models", "install", model.name)
    assert rc == 1 and "pip could not download ellm-test-part3==1.0" in err and "run the command again" in err
    downloads = data_dir / "models" / catalog.DOWNLOADS / model.name
    assert sorted(p.name for p in downloads.glob("*.whl")) == ["ellm_test_part1-1.0-py3-none-any.whl",
                                                               "ellm_test_part2-1.0-py3-none-any.whl"]
    assert not (data_dir / "models" / model.file).exists()
    held.rename(third)
    for w in wheels.glob("ellm_test_part[12]-*.whl"):            # the next run needs only the missing one
        w.unlink()
    rc, _, err = cli("models", "install", model.name)
    assert rc == 0, err
    assert (data_dir / "models" / model.file).read_bytes() == data


def test_a_corrupted_download_is_refused_and_deleted(cli, index, data_dir):
    wheels, model, data = index
    second = next(wheels.glob("ellm_test_part2-*.whl"))
    second.unlink()
    _wheel(wheels, "ellm-test-part2", "PKG/data/part02.bin", b"\0" * PART)   # same size, other bytes
    rc, _, err = cli("models", "install", model.name)
    assert rc == 1 and "corrupt" in err and "sha256" in err and "deleted" in err
    models = data_dir / "models"
    assert not (models / model.file).exists() and not list(models.glob("*.part"))
    assert not (models / catalog.DOWNLOADS / model.name).exists()     # the next try downloads afresh
    assert default_model_path(models) == default_model_path()


def test_unknown_names_and_missing_names_say_what_to_do(cli):
    rc, _, err = cli("models", "install", "no-such-model")
    assert rc == 1 and "no model named 'no-such-model'" in err and "ellm models available" in err
    rc, _, err = cli("models", "install")
    assert rc == 1 and "which model?" in err
