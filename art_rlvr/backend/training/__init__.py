"""Training: token data from trajectories, the losses, and the optimizer steps."""
