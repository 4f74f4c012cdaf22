"""The planner: the seed's models as pure functions, fed by measured results."""
