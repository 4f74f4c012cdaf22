"""MLPerf Storage's run rules, each with the section or file it is written in.

``datasize`` is mlcommons/storage ``mlpstorage/rules.py`` ``calculate_training_data_size``
(Submission_guidelines.md §7): the larger of 5x the clients' memory and 500 steps per epoch
for every accelerator.  ``Rule`` is one line of a result's compliance block: what MLPerf requires,
what this run used, whether that holds, and where the rule is written.  A result is
"rule-compliant" only when every rule holds; otherwise "not rule-compliant: " and the rules broken.
"""

from __future__ import annotations

from dataclasses import dataclass

MEMORY_MULTIPLE = 5          # mlpstorage/config.py MOST_MEMORY_MULTIPLIER; Submission_guidelines.md §6.6.2, §7
STEPS_PER_EPOCH = 500        # mlpstorage/config.py STEPS_PER_EPOCH; Submission_guidelines.md §7
DEFAULT_RUNS = 5             # Submission_guidelines.md §3 "a benchmark result is the mean of 5 run results"
WARMUP_RUNS = 1              # Submission_guidelines.md §6.6.1 "a warm-up run before the 5 test runs"

GUIDE = "mlcommons/storage Submission_guidelines.md"
RULES_PY = "mlcommons/storage mlpstorage/rules.py"


@dataclass(frozen=True)
class DataSize:
    files: int
    samples: int
    bytes: int
    required_bytes: int            # 5x the aggregate client memory
    files_by_memory: int           # 5 x memory // file bytes
    files_by_steps: int            # 500 x batch x accelerators // samples per file
    samples_per_file: int
    sample_bytes: float            # record length
    bound_by: str                  # "memory" | "steps": which rule decided the count

    @property
    def source(self) -> str:
        return f"{RULES_PY} calculate_training_data_size; {GUIDE} §7"


def datasize(client_memory_bytes: int, nodes: int, accelerators_per_node: int, samples_per_file: int,
             sample_bytes: float, batch_size: int) -> DataSize:
    """MLPerf's minimum file count, computed as ``calculate_training_data_size`` does (integer division,
    as there): max(5 x memory // file bytes, 500 x batch x accelerators // samples per file)."""
    required = MEMORY_MULTIPLE * client_memory_bytes * nodes
    file_bytes = samples_per_file * sample_bytes
    by_memory = int(required // file_bytes)
    by_steps = STEPS_PER_EPOCH * accelerators_per_node * nodes * batch_size // samples_per_file
    files = max(by_memory, by_steps)
    return DataSize(files, files * samples_per_file, int(files * file_bytes), required, by_memory, by_steps,
                    samples_per_file, sample_bytes, "memory" if by_memory > by_steps else "steps")


@dataclass(frozen=True)
class Rule:
    rule: str                      # short name, e.g. "dataset size"
    required: str                  # what MLPerf requires
    used: str                      # what this run did
    ok: bool
    source: str                    # the file and section it is written in

    def as_dict(self) -> dict:
        return {"rule": self.rule, "required": self.required, "used": self.used, "ok": self.ok,
                "source": self.source}


@dataclass(frozen=True)
class Compliance:
    rules: tuple[Rule, ...]

    @property
    def compliant(self) -> bool:
        return all(r.ok for r in self.rules)

    @property
    def broken(self) -> list[Rule]:
        return [r for r in self.rules if not r.ok]

    @property
    def verdict(self) -> str:
        if self.compliant:
            return "rule-compliant"
        return "not rule-compliant: " + ", ".join(r.rule for r in self.broken)

    def as_dict(self) -> dict:
        return {"compliant": self.compliant, "verdict": self.verdict, "rules": [r.as_dict() for r in self.rules]}


def rule(name: str, required: str, used: str, ok: bool, source: str) -> Rule:
    return Rule(name, required, used, bool(ok), source)
