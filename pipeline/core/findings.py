"""Findings are plain data: checks return them, reporters only format them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# Ordered from most to least severe. `advice` never fails a run on its own.
SEVERITIES = ("error", "warning", "advice", "info")


@dataclass(frozen=True)
class Finding:
    check_id: str
    severity: str
    path: str  # relative to the package root ("" for the package itself)
    message: str
    hint: str = ""
    pointer: str = ""  # JSON pointer, tensor or node name
    members: tuple[str, ...] = ()  # one finding standing for many: every tensor, file or node it names

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["members"] = list(self.members)
        if not self.members:
            del d["members"]
        return d


@dataclass
class Result:
    """What one package's validation produced."""

    root: str
    profile: str
    profile_reason: str
    findings: list[Finding] = field(default_factory=list)
    checks_run: list[str] = field(default_factory=list)
    files: int = 0
    seconds: float = 0.0

    def count(self, severity: str) -> int:
        return sum(1 for f in self.findings if f.severity == severity)

    def failed(self, strict: bool = False, strict_advice: bool = False) -> bool:
        failing = {"error"} | ({"warning"} if strict else set()) | ({"advice"} if strict_advice else set())
        return any(f.severity in failing for f in self.findings)

    def to_dict(self) -> dict:
        return {
            "root": self.root,
            "profile": self.profile,
            "profile_reason": self.profile_reason,
            "files": self.files,
            "seconds": round(self.seconds, 4),
            "checks_run": self.checks_run,
            "counts": {s: self.count(s) for s in SEVERITIES},
            "findings": [f.to_dict() for f in self.findings],
        }
