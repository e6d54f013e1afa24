"""Who weighs what: user and group weights from the config, looked up for the fairness policies."""

from __future__ import annotations

from scheduler_svc.config import WeightsConfig


class WeightResolver:
    """Resolves a user's weight and group. A user outside any group is a group of its own."""

    def __init__(self, config: WeightsConfig | None = None) -> None:
        self._config = config or WeightsConfig()

    def use(self, config: WeightsConfig) -> None:
        """Weights from a reloaded configuration, for the service charged from now on (counters keep what
        they hold). Its `members` must be the same: a user's group is part of every band's state for it."""
        assert config.members == self._config.members, "group members change at restart only"
        self._config = config

    def group_of(self, user: str) -> str:
        """The user's group; `user:<id>` for a user in no group."""
        group = self._config.members.get(user)
        return f"group:{group}" if group is not None else f"user:{user}"

    def is_shared(self, group: str) -> bool:
        """Whether `group` is a configured group (its users are compared with each other), not the implicit
        group of one user."""
        return group.startswith("group:")

    def user_weight(self, user: str) -> float:
        return self._config.users.get(user, self._config.default)

    def group_weight(self, group: str) -> float:
        """A real group's configured weight; an implicit one-user group weighs what its user weighs."""
        kind, _, name = group.partition(":")
        if kind == "group":
            return self._config.groups.get(name, self._config.default)
        return self.user_weight(name)
