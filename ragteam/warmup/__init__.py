"""The joint systems' format warm-up (issue 25): its data first.

- `gold`: each training question's gold hop chain (sub-question, sub-answer, the passage sentence that states it),
  from the synthetic world's supporting ids or 2Wiki's evidence triples;
- `oracle`: `OracleEngine`, an engine whose every role answers from that chain through the rollouts' own workflow
  code (so its prompts are the policy's), one function per system (M-ASK, QAgent so far);
- `traces`: complete oracle episodes as validated SFT rows, one per role call (`ragteam oracle-traces SYSTEM`).

A package of its own, not part of `ragteam.train`: no DVC stage runs it yet, so adding it leaves every stage's code
deps (and `dvc.lock`) as they were; the `oracle_traces@<system>` stage will declare it.
"""
