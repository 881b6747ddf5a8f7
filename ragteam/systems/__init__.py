"""The systems, one module or small package each (`ragteam.systems.<name>`), and the one registry of them
(`ragteam.systems.registry.REGISTRY`) that the stages, the joint trainer's and the warm-up's callers, evaluation,
params_check and the CLI read (issue 72: "one system, one module"; docs/adding-a-system.md).

This package file imports nothing: importing one system (MAPS's stages import `ragteam.systems.maps`) loads that
system alone, so a stage that needs one system depends on that system's code, not on every system's (dvc.yaml
deps); the registry, which imports them all, is its own module."""
