"""A second engine, as a rerun gets: it reproduces the first one's samples; then its process is killed and every
call fails at once with an error naming the model (no hang)."""
from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from ragteam.llm import SamplingConfig
from ragteam.llm.vllm_backend import EngineDead, VLLMEngine

from vllm_helpers import LORA_RANK, engine_config


@pytest.mark.timeout(600)
def test_a_rerun_reproduces_the_samples_and_a_killed_engine_fails_clearly(vllm_engine, smollm2_dir, rag_prompts,
                                                                         tmp_path):
    seeded = SamplingConfig(max_new_tokens=16, temperature=1.0, n=2, seed=7)
    greedy = SamplingConfig(max_new_tokens=16)
    first = [vllm_engine.generate(rag_prompts, s) for s in (seeded, greedy)]
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    rerun = VLLMEngine(str(smollm2_dir), engine_config(), max_lora_rank=LORA_RANK)
    mine = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    try:
        again = [rerun.generate(rag_prompts, s) for s in (seeded, greedy)]
        assert tokens(again) == tokens(first)
        # log-probs agree to float noise only: the CPU kernels' sums differ by ~1e-7 from one batch to the next
        for a, b in zip(logprobs(again), logprobs(first)):
            assert a == pytest.approx(b, abs=1e-4)
        core = [p for p in mine if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline())]
        assert len(core) == 1, [(p.pid, p.name()) for p in mine]
        # the whole engine dies (core and worker, as when the machine kills it): killing the core alone leaves its
        # worker holding the core's liveness pipe until it notices, which on a loaded machine took longer than the
        # test's 600 s (CI rehearsal beside a `dvc repro`), so vLLM never learnt the core was gone
        engine = [p for p in mine if "resource_tracker" not in " ".join(p.cmdline())]
        for p in engine:
            os.kill(p.pid, signal.SIGKILL)
        psutil.wait_procs(engine, timeout=30)
        t0 = time.perf_counter()
        with pytest.raises(EngineDead, match=f"vLLM engine on {smollm2_dir} has died"):
            rerun.generate(rag_prompts[:1], greedy)
        with pytest.raises(EngineDead, match="cannot be used again"):
            rerun.generate(rag_prompts[:1], greedy)
        assert time.perf_counter() - t0 < 30                     # fails, does not wait for a dead process
    finally:
        for p in mine:                                             # the engine's worker, if it outlived its core
            if p.is_running():
                p.kill()
    assert tokens([vllm_engine.generate(rag_prompts, greedy)]) == tokens(first[1:])  # the other engine is untouched


def tokens(calls) -> list:
    """Each completion's text and ids, call by call, prompt by prompt."""
    return [[[(c.text, c.token_ids) for c in o] for o in call] for call in calls]


def logprobs(calls) -> list[float]:
    return [lp for call in calls for o in call for c in o for lp in c.logprobs]


@pytest.mark.timeout(300)
def test_an_uncaught_exception_closes_the_engines_before_the_process_waits_for_their_threads(
        smollm2_dir, monkeypatch, capsys):
    """A stage whose exception escaped with an engine open printed its traceback and never exited (synthesize in the
    worker environment, 400 s until killed): the excepthook the engine installs closes every live engine first,
    then prints the traceback as before."""
    import sys
    import weakref

    from ragteam.llm import vllm_backend

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    eng = VLLMEngine(str(smollm2_dir), engine_config())
    # the engine's processes (multiprocessing's resource tracker, which vLLM starts once, lives with this process)
    mine = [p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and "resource_tracker" not in " ".join(p.cmdline())]
    assert mine and getattr(sys.excepthook, "_closes_vllm_engines", False)
    monkeypatch.setattr(vllm_backend, "_LIVE", weakref.WeakSet([eng]))   # leave the session's engine alone
    try:
        try:
            raise ModuleNotFoundError("No module named 'great_expectations'")
        except ModuleNotFoundError as e:
            sys.excepthook(type(e), e, e.__traceback__)
        assert "No module named 'great_expectations'" in capsys.readouterr().err
        gone, alive = psutil.wait_procs(mine, timeout=60)
        assert not alive, [(p.pid, p.name()) for p in alive]
        assert eng not in vllm_backend._LIVE
    finally:
        for p in mine:
            if p.is_running():
                p.kill()


@pytest.mark.timeout(300)
def test_a_terminated_stage_closes_its_engines_instead_of_leaving_them_running(smollm2_dir, tmp_path):
    """SIGTERM (a cancelled Prefect run, `kill`) to a stage in the worker environment: it exits 143 and its engine's
    processes go with it; before, the stage died at once and its engine kept two cores busy."""
    import subprocess
    import sys

    (tmp_path / "hold_engine.py").write_text(
        "import time\n"
        "from vllm_helpers import engine_config\n"
        "from ragteam.llm.vllm_backend import VLLMEngine\n"
        "if __name__ == '__main__':\n"      # as a stage module: vLLM's engine process re-imports the main module
        f"    VLLMEngine({str(smollm2_dir)!r}, engine_config())\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(600)\n")
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), here, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "ragteam.llm.worker_main", "hold_engine"], env=env,
                            stdout=subprocess.PIPE, text=True)
    engine: list = []
    try:
        for line in proc.stdout:          # vLLM logs to stdout too
            if line.strip() == "ready":
                break
        assert proc.poll() is None, "the stage ended before its engine was up"
        engine = [p for p in psutil.Process(proc.pid).children(recursive=True)
                  if "resource_tracker" not in " ".join(p.cmdline())]
        assert engine
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
        gone, alive = psutil.wait_procs(engine, timeout=60)
        assert not alive, [(p.pid, p.name()) for p in alive]
    finally:
        proc.kill()
        for p in engine:
            if p.is_running():
                p.kill()
