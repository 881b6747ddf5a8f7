"""Reward functions, named after the paper equations they implement (pure: strings in, floats out; the QAgent
stage-2 scorer also calls its frozen generator, as Eq. 9 requires). Import them from their modules
(`ragteam.rewards.maps`, `ragteam.rewards.qagent`, ...)."""
