"""params.yaml for studies/qagent_rl/run.sh (issue 25 §3: why QAgent's RL loses to its warm-up).

    params_edit.py train <seed> <threads> [key=value ...]
        the default run's QAgent RL (joint.qagent, both stages) with RL seed `seed` (joint.ppo.seed), `threads`
        torch threads; key=value pairs set `joint.qagent` keys, dotted for nested ones (YAML values), e.g.
        dynamic_sampling.enabled=true dynamic_sampling.max_rounds=3
    params_edit.py evaluate <row>=<model dir> [<row>=<model dir> ...]
        `evaluate` restricted to qagent_warmup (models/warmup/qagent) and the given rows (workflow qagent on that
        model), each on the first 40 synthetic dev questions and compared with the warm-up row
"""
import sys
from pathlib import Path

import yaml


def main(argv: list[str]) -> None:
    p = Path("params.yaml")
    d = yaml.safe_load(p.read_text())
    if argv[0] == "train":
        seed, threads = int(argv[1]), int(argv[2])
        d["joint"]["ppo"]["seed"] = seed
        d["llm"]["threads"] = threads
        for arg in argv[3:]:
            key, _, value = arg.partition("=")
            node = d["joint"]["qagent"]
            *path, last = key.split(".")
            for k in path:
                node = node.setdefault(k, {})
            node[last] = yaml.safe_load(value)
    elif argv[0] == "evaluate":
        rows = {"qagent_warmup": {"workflow": "qagent", "model": "models/warmup/qagent", "n_questions": 40}}
        for arg in argv[1:]:
            name, _, model = arg.partition("=")
            rows[name] = {"workflow": "qagent", "model": model, "n_questions": 40}
        d["eval"]["systems"] = rows
        d["eval"]["compare"] = [[name, "qagent_warmup"] for name in rows if name != "qagent_warmup"]
    else:
        sys.exit(f"params_edit.py: phase {argv[0]!r} is not train or evaluate")
    p.write_text(yaml.safe_dump(d, sort_keys=False))


if __name__ == "__main__":
    main(sys.argv[1:])
