"""A module that exports two Taskset classes: verifiers refuses it."""

import verifiers.v1 as vf


class OneTaskset(vf.Taskset[vf.Task, vf.TasksetConfig]):
    def load(self):
        return iter(())


class TwoTaskset(vf.Taskset[vf.Task, vf.TasksetConfig]):
    def load(self):
        return iter(())


__all__ = ["OneTaskset", "TwoTaskset"]
