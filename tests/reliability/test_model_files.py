"""Bad model files are refused with a clear message before anything loads them:
a truncated GGUF, a file that is not GGUF, and a model too large for free memory."""
from __future__ import annotations

import re
import shutil

import pytest

from app.runtime.catalog import MEMORY_MARGIN_BYTES
from app.runtime.model_files import GIB, default_model_path
from tests.conftest import TREATY_PAGES
from tests.docs.make_samples import make_pdf
from tests.reliability.helpers import cli_env, run_cli

DEFAULT = default_model_path()
FREE = 200 * 2**20  # what ELLM_FAKE_MEMAVAILABLE tells eLLM is free: less than the default model needs
# SmolLM2-135M: 30 layers, 3 KV heads of 64 dims; an f16 KV cache of 8192 tokens (the context the tests ask for).
KV_8192 = 8192 * 30 * 3 * (64 + 64) * 2


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory):
    """Built once for the module and removed after it (150 MB: pytest keeps three runs)."""
    tmp_path = tmp_path_factory.mktemp("models")
    half = tmp_path / "truncated.gguf"
    with open(DEFAULT, "rb") as src, open(half, "wb") as dst:
        dst.write(src.read(DEFAULT.stat().st_size // 2))
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("These are my notes, saved with the wrong name.\n" * 40)
    big = tmp_path / "big.gguf"
    shutil.copy(DEFAULT, big)
    yield {"truncated": half, "not_gguf": not_gguf, "big": big}
    shutil.rmtree(tmp_path)


def expected_messages(models) -> dict[str, str]:
    size = DEFAULT.stat().st_size
    needs = size + KV_8192 + MEMORY_MARGIN_BYTES + int(0.10 * size)
    return {
        "truncated": f"{models['truncated']}: the GGUF file is truncated or corrupt: its tensors need {size} bytes "
                     f"but the file has {size // 2} (50%); download or copy it again",
        "not_gguf": f"{models['not_gguf']}: not a GGUF model file (the first bytes are not 'GGUF')",
        "big": f"{models['big']}: model needs {needs / GIB:.2f} GiB, {FREE / GIB:.2f} GiB free",
    }


@pytest.fixture
def nothing_loads(monkeypatch):
    """Fail the test if a backend starts loading a model (each ``cli`` call opens a session of its
    own, with nothing loaded whose memory would count as free)."""
    import app.engine.llamacpp_backend

    def refuse(self, *args, **kwargs):
        raise AssertionError("a model was loaded although it should have been refused first")

    monkeypatch.setattr(app.engine.llamacpp_backend.LlamaCppBackend, "__init__", refuse)
    monkeypatch.setenv("ELLM_FAKE_MEMAVAILABLE", str(FREE))


@pytest.mark.parametrize("kind", ["truncated", "not_gguf", "big"])
def test_complete_refuses_a_bad_model_before_loading_it(cli, bad_models, nothing_loads, kind):
    rc, out, err = cli("complete", "hi", "--model", str(bad_models[kind]), "--engine", "llamacpp")
    assert (rc, out) == (1, "")
    assert err.startswith("ellm: error: " + expected_messages(bad_models)[kind]), err


@pytest.mark.parametrize("kind", ["truncated", "not_gguf", "big"])
def test_ask_refuses_a_bad_model_before_loading_it(cli, bad_models, tmp_path, data_dir, request, kind):
    from app.settings import Paths
    from app.store import Store

    make_pdf(tmp_path / "treaty.pdf", TREATY_PAGES)
    assert cli("ingest", str(tmp_path / "treaty.pdf"))[0] == 0  # with the default model's tokenizer
    request.getfixturevalue("nothing_loads")
    rc, out, err = cli("ask", "Who kept the lamp?", "--doc", "treaty.pdf", "--model", str(bad_models[kind]),
                       "--engine", "llamacpp", "--ctx", "8192")
    assert (rc, out) == (1, "")
    assert err.startswith("ellm: error: " + expected_messages(bad_models)[kind]), err
    store = Store(Paths.resolve(data_dir).db)
    assert store.answers() == []
    store.close()


def test_the_real_command_refuses_each_bad_model(bad_models, data_dir):
    """The same through `ellm complete` in a process of its own, with the real loader in place."""
    expected = expected_messages(bad_models)
    env = cli_env(ELLM_FAKE_MEMAVAILABLE=str(FREE))
    for kind, path in bad_models.items():
        run = run_cli(data_dir, "complete", "hi", "--model", str(path), "--engine", "llamacpp", env=env, timeout=120)
        assert (run.rc, run.out) == (1, ""), (kind, run.err)
        assert run.err.startswith("ellm: error: " + expected[kind]), (kind, run.err)
        assert "Traceback" not in run.err


def test_enough_free_memory_lets_the_default_model_load(data_dir):
    """The check is not a blanket refusal: with the memory it needs (and no more) it loads."""
    size = DEFAULT.stat().st_size
    ctx = 512
    kv = ctx * 30 * 3 * (64 + 64) * 2
    just_enough = size + kv + MEMORY_MARGIN_BYTES + int(0.10 * size)
    env = cli_env(ELLM_FAKE_MEMAVAILABLE=str(just_enough))
    args = ("complete", "The river", "-n", "4", "--greedy", "--engine", "llamacpp", "--ctx", str(ctx),
            "--threads", "1")
    run = run_cli(data_dir, *args, env=env, timeout=120)
    assert run.rc == 0 and run.out.strip(), run.err
    short = run_cli(data_dir, *args, env=cli_env(ELLM_FAKE_MEMAVAILABLE=str(just_enough - 1)), timeout=120)
    assert short.rc == 1 and re.search(r"model needs \d+\.\d\d GiB, \d+\.\d\d GiB free", short.err), short.err
