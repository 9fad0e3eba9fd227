"""Every family and mechanism, which part each case belongs to, and the list of cases."""
from __future__ import annotations

from .design import FAULTY_ROWS, HEALTHY_ROWS, Case, rows
from .families import FAMILIES, Family, Variation
from .faults import MECHANISMS, Mechanism
from . import heldout

HELDOUT_FAMILIES: frozenset = frozenset(heldout.FAMILIES)
HELDOUT_MECHANISMS: frozenset = frozenset(heldout.MECHANISMS)
_FAMILIES: dict[str, Family] = {**FAMILIES, **heldout.FAMILIES}
_MECHANISMS: dict[str, Mechanism] = {**MECHANISMS, **heldout.MECHANISMS}


def family(name: str) -> Family:
    return _FAMILIES[name]


def mechanism(name: str) -> Mechanism:
    return _MECHANISMS[name]


def families() -> list[Family]:
    return list(_FAMILIES.values())


def mechanisms() -> list[Mechanism]:
    return list(_MECHANISMS.values())


def part(case: Case) -> str:
    held = case.family in HELDOUT_FAMILIES or case.mechanism in HELDOUT_MECHANISMS
    return "heldout" if held else "dev"


def pairs() -> list[tuple[str, str]]:
    return [(f.name, m.name) for m in mechanisms() for f in families() if m.applies(f)]


def rows_for(mech: str) -> int:
    """Three rows per pair; six where a mechanism fits only one or two families, so that each cause
    keeps enough runs."""
    n_families = sum(1 for f, m in pairs() if m == mech)
    return FAULTY_ROWS if n_families > 2 else 2 * FAULTY_ROWS


def cases(part_: str = "all") -> list[Case]:
    out = [Case(f, m, v) for f, m in pairs() for v in rows(f"{f}/{m}", rows_for(m))]
    out += [Case(f.name, None, v) for f in families() for v in rows(f"{f.name}/healthy", HEALTHY_ROWS)]
    return [c for c in out if part_ == "all" or part(c) == part_]


def case(case_id: str) -> Case:
    from .runner import variation

    fam, mech, key = case_id.split("/")
    return Case(fam, None if mech == "healthy" else mech, variation(key))


SLICE_SEEDS = (0, 1)


def slice_cases(part_: str = "dev") -> list[Case]:
    """The small slice the test suite runs: every (family, mechanism) pair of the part, and every family
    healthy, at two initialisation seeds, at the cheapest variation (narrow, shallow, 150 steps, batch 16)."""
    out = [Case(f, m, Variation(s, 0, 0, 0, 150, 16)) for f, m in pairs() for s in SLICE_SEEDS]
    out += [Case(f.name, None, Variation(s, 0, 0, 0, 150, 16)) for f in families() for s in SLICE_SEEDS]
    return [c for c in out if part_ == "all" or part(c) == part_]
