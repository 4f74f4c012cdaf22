"""The planner: the domain models' models as pure functions, fed by measured results."""
