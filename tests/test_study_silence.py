"""studies/answer_silence/answer_silence.py's probe of the inference rules runs the pipeline's own continuation and answer
fallback (agents.core) through the Team it measures, not a copy of them."""
import importlib.util
from pathlib import Path

from ragteam.llm import Completion, SamplingConfig, Team

REPO = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("answer_silence", REPO / "studies" / "answer_silence" / "answer_silence.py")
silence = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(silence)


class Engine:
    """Prompt "q<i>": a continuation (the last message is the assistant's) and a fresh draw reply per question."""

    def __init__(self):
        self.samplings = []

    def generate(self, prompts, s):
        self.samplings.append(s)
        out = []
        for m in prompts:
            i = int(m[0]["content"][1:])
            if m[-1]["role"] == "assistant":
                text = {0: " Paris", 1: " answer:", 2: "\n"}[i] if s.min_new_tokens else ""
            else:
                text = {0: "Rome", 1: "Berlin", 2: "Answer:"}[i]
            out.append([Completion(text, 3, len(text.split()) + 1, "stop")] * s.n)
        return out


def test_the_probe_reports_each_rule_on_the_greedy_stubs_through_the_pipelines_code():
    eng = Engine()
    prompts = [([{"role": "user", "content": f"q{i}"}], [g]) for i, g in enumerate(["Paris", "Berlin", "Bonn"])]
    greedy = [Completion(t, 3, 2, "stop") for t in ("Answer:", "Answer:", "The answer is:")]
    out = silence.continuation_probe(Team(eng, {"answer_agent": SamplingConfig(max_new_tokens=8)}), prompts, greedy,
                                     max_new=8, ks=(1,), resamples=2, seed=3)
    assert out["stubs"] == 3
    # once: q0 "Answer: Paris" answers; q1 "Answer: answer:" and q2 "The answer is:\n" stay stubs
    assert out["min1"]["answered"] == round(100 / 3, 2) and out["min1"]["f1_of_answered"] == 100.0
    assert out["repeat"]["answered"] == round(100 / 3, 2)          # q1 continues to its budget, q2 has no answer
    # fresh draws: q0 "Rome" (wrong), q1 "Berlin" (right), q2 "Answer:" twice (none parses)
    assert out["resample"]["answered"] == round(200 / 3, 2) and out["resample"]["f1_of_answered"] == 50.0
    # the inference rule: the continuation answers q0 (Paris), the draws q1 (Berlin)
    assert out["repeat+resample"]["answered"] == round(200 / 3, 2)
    assert out["repeat+resample"]["f1_of_answered"] == 100.0
    draws = [s for s in eng.samplings if s.n == 2]
    assert len(draws) == 2 and all(s.temperature == 0.8 for s in draws)
