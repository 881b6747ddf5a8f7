"""Reward functions, named after the paper equations they implement (pure: strings in, floats out). Import them from
their modules (`ragteam.rewards.maps`, `ragteam.rewards.team`); a joint system's rewards live in its own package
(`ragteam.systems.<system>.rewards`)."""
