"""Agent workflows: MAPS (`maps_workflow`), JADE (`jade_workflow`), DECOR (`decor_workflow`), QAgent
(`qagent_workflow`), the retrieval debate DRAG (`debate`) and the Table 1 baselines (`baselines`); prompts and output
parsers per system (`maps`, `jade`, `decor`, `qagent`); shared pool / step / cost
machinery (`core`)."""
