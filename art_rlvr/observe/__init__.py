"""Watching a run: Weave tracing (`tracing`) and the alarms that stop or warn (`alarms`)."""
