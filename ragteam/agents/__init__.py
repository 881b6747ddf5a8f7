"""Agent workflows: MAPS (`maps_workflow`), JADE (`jade_workflow`), the retrieval debate DRAG (`debate`) and the
Table 1 baselines (`baselines`); prompts and output parsers per system (`maps`, `jade`); shared pool / step / cost
machinery (`core`)."""
