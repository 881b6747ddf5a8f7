"""benchmarks/ppo_update.py: the samples it times are a system's oracle trace rows, one episode per question (the
timed runs themselves take minutes: benchmarks/results/ppo_update_mask_8q.md has one)."""
import json

import pytest

from benchmarks.ppo_update import load_samples


def test_the_samples_are_the_first_questions_trace_rows_tokenised_as_the_trainer_does(tmp_path, smollm2_dir):
    from transformers import AutoTokenizer

    from ragteam.records import AgentCall
    from ragteam.train.joint.batch import tokenize_call

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    msgs = [{"role": "user", "content": "Which film came out first?"}]
    rows = [{"question_id": q, "role": r, "messages": msgs, "response": resp, "eos": eos}
            for q, r, resp, eos in [("a", "plan", "<q1>x</q1>", True), ("b", "plan", "<q1>y", False),
                                    ("a", "answer", "<answer>z</answer>", True), ("c", "plan", "w", True)]]
    traces = tmp_path / "traces.jsonl"
    traces.write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = load_samples(tok, traces, questions=2)
    assert [(s.episode, s.call, s.role) for s in samples] == [(0, 0, "plan"), (1, 0, "plan"), (0, 1, "answer")]
    assert all(s.reward in (-1.0, 1.0) for s in samples)
    want = tokenize_call(tok, AgentCall(role="plan", prompt=msgs, response="<q1>y", finish_reason="length"))
    assert (samples[1].prompt_ids, samples[1].response_ids) == want     # cut by its budget: no EOS appended
    assert samples[0].response_ids[-1] == tok.eos_token_id
    with pytest.raises(SystemExit, match="no oracle traces"):
        load_samples(tok, tmp_path / "nosuch.jsonl", questions=2)
