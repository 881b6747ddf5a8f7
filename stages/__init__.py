"""Thin DVC stage modules (`python -m stages.<name>`)."""
import os

# Before torch is imported: spinning OpenMP threads made forward/backward 3-6x slower on 2 shared cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import logging  # noqa: E402

from ragteam import timing  # noqa: E402

timing.start()   # a stage's time split (metrics/<stage>.json `time_split`) counts from here

# Progress of long library work (training steps, shards) goes to stderr with the stage's output.
logging.basicConfig(format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
logging.getLogger("ragteam").setLevel(logging.INFO)
