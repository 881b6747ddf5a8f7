"""params.yaml of one run of experiments/jade_rl_signal/run.sh: the RL seed, JADE's RL with more answer signal
(T 0.7, 8 questions a step, 8 steps), and `evaluate` restricted to jade_warmup vs jade_trained on 40 questions."""
import sys
from pathlib import Path

import yaml

seed = int(sys.argv[1])
p = Path("params.yaml")
d = yaml.safe_load(p.read_text())
d["joint"]["ppo"]["seed"] = seed
d["joint"]["jade"]["ppo"] = {"temperature": 0.7, "questions_per_step": 8, "steps": 8}
d["eval"]["systems"] = {"jade_warmup": {"workflow": "jade", "model": "models/warmup/jade", "n_questions": 40},
                        "jade_trained": {"workflow": "jade", "model": "models/agents/jade", "n_questions": 40}}
d["eval"]["compare"] = [["jade_trained", "jade_warmup"]]
p.write_text(yaml.safe_dump(d, sort_keys=False))
