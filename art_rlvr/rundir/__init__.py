"""The run folder: typed events, atomic writers, stored trajectories, one reader."""
