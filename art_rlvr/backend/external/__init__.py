"""Engines past TorchBackend that a run reaches over the network: SkyRL's Tinker-API engine
(`backend=tinker` on your own machines, `external.skyrl`, run as
`python -m art_rlvr.backend.external.skyrl`) and ART's Tinker backend with supervised steps for
expert iteration (`external.tinker`). Each module imports its heavy dependencies only when a
function runs."""
