"""Rollouts: one record (an `Example`) run as an episode against any ART backend, scored into an
`art.Trajectory`; sampling settings, tools, verifiers environments."""
