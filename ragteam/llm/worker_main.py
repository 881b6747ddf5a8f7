"""`python -m ragteam.llm.worker_main <module> [args]`: how a stage runs once `ensure_engine_environment` has moved it
into the worker environment. It runs `<module>` as `python -m <module> [args]` would, then closes every vLLM engine
still open, however the stage ended (returned, `sys.exit`, an exception, SIGTERM), before the interpreter shuts
down.

Why: measured in `dvc repro`, stage synthesize on vLLM wrote its outputs, printed its metrics and then never exited
(the interpreter waits at shutdown for threads an open engine keeps; 4 min until killed), so the pipeline hung
after a stage that had succeeded. A closed engine leaves nothing to wait for. SIGTERM (a scheduler cancelling the
run, `kill`) exits through the same path with status 143: measured before, a terminated stage died at once and left
its engine's processes running (two cores busy for minutes, 4 GB held).
"""
from __future__ import annotations

import runpy
import signal
import sys


def _terminated(signum, frame) -> None:
    signal.signal(signum, signal.SIG_IGN)   # a second SIGTERM (a process group's, a retry) must not cut the cleanup
    raise SystemExit(128 + signum)          # unwinds to main's `finally`, which closes the engines


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m ragteam.llm.worker_main <module> [args...]")
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    signal.signal(signal.SIGTERM, _terminated)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        from ragteam.llm.vllm_backend import close_live_engines

        close_live_engines()


if __name__ == "__main__":
    main()
