"""Agent workflows: MAPS (`maps_workflow`), M-ASK (`mask_workflow`), the retrieval debate DRAG (`debate`) and the
Table 1 baselines (`baselines`); prompts and output parsers per system (`maps`, `mask`); shared pool / step / cost
machinery (`core`)."""
