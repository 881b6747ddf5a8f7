"""Agent workflows: MAPS (`maps_workflow`), the retrieval debate DRAG (`debate`) and the Table 1 baselines
(`baselines`, `ircot`, `sure`); MAPS's prompts and output parsers (`maps`); shared pool / step / cost machinery
(`core`). The joint systems' roles and workflows (M-ASK, JADE, DECOR, QAgent) live in their packages,
`ragteam.systems.<system>.roles` and `.workflow`."""
