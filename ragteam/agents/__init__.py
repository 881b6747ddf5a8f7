"""Agent workflows: MAPS (`maps_workflow`), DECOR (`decor_workflow`), the retrieval debate DRAG (`debate`) and the
Table 1 baselines (`baselines`); prompts and output parsers per system (`maps`, `decor`); shared pool / step / cost
machinery (`core`)."""
