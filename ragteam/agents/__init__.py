"""Agent workflows: MAPS (`maps_workflow`), M-ASK (`mask_workflow`), JADE (`jade_workflow`), DECOR (`decor_workflow`),
QAgent (`qagent_workflow`), the retrieval debate DRAG (`debate`) and the Table 1 baselines (`baselines`, `ircot`,
`sure`); prompts and output parsers per system (`maps`, `mask`, `jade`, `decor`, `qagent`); shared pool / step / cost
machinery (`core`)."""
