"""TOML presets -> Sweep / Case objects.

Config files live in the repository's ``configs/`` (override the folder with the environment
variable ``QLABENCH_CONFIG_DIR``):
    heads.toml      ``[presets.hkN_hvM]`` with h_qk, h_v and a model label
    seqlens.toml    ``cut_seed``, ``[defaults]`` (phase -> set), ``[sets.<name>] patterns = [...]``
    sweeps/*.toml   a named sweep: phases, presets, seqlens, backends, gate_profile, ...; optionally
                    ``[[groups]]``, each its own cross product (the sweep is their union)

Every malformed file, key or value raises ``ConfigError`` (a ValueError) naming the file and key.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

import qlabench

from .workload import (
    DEFAULT_BETA_PROFILE,
    DEFAULT_CUT_SEED,
    DEFAULT_H0_SCALE,
    GATE_PROFILES,
    Pattern,
    check_beta_profile,
    check_h0_scale,
    inputs_label,
    parse_pattern,
)

PHASES = ("fwd", "bwd", "fwdbwd")
_PRESET_NAME = re.compile(r"^hk(\d+)_hv(\d+)$")
_SWEEP_KEYS = {"description", "arch", "phases", "presets", "seqlens", "backends", "gate_profile",
               "dtype", "warmup", "repeats", "beta_profile", "h0_scale", "groups"}
# Activation dtypes a sweep may ask for (``dtype``; q, k, v, do): the GPU kernels take bf16 and fp16.
DTYPES = ("bfloat16", "float16")
# GPU architectures a sweep may name (``arch``): recorded as the run's arch and, on a GPU of another
# one, announced; `qlabench run --arch` enforces it (qlabench/kernels/dispatch.py knows the same names).
ARCHS = ("sm90", "sm100", "sm120")
# The keys a [[groups]] table may set; the same keys at the top level are every group's defaults.
_GROUP_KEYS = {"presets", "phases", "seqlens", "gate_profile", "beta_profile", "h0_scale"}


class ConfigError(ValueError):
    """A malformed config file, key or value; the message names the file and the key."""


def config_dir() -> Path:
    """The configs folder: $QLABENCH_CONFIG_DIR, else ``configs/`` next to the package."""
    env = os.environ.get("QLABENCH_CONFIG_DIR")
    path = Path(env) if env else Path(qlabench.__file__).resolve().parent.parent / "configs"
    if not path.is_dir():
        how = "QLABENCH_CONFIG_DIR" if env else "the repository's configs/ folder"
        raise ConfigError(f"config folder {path} not found (from {how}); set QLABENCH_CONFIG_DIR "
                          "to the folder holding heads.toml, seqlens.toml and sweeps/")
    return path


def _load_toml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: malformed TOML: {e}") from None


def _int(path: Path, key: str, value, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{path}: {key} must be an int >= {minimum}, got {value!r}")
    return value


def _str_list(path: Path, key: str, value) -> list[str]:
    """A string, a comma list in one string, or a list of strings -> list of names."""
    if isinstance(value, str):
        items = [s.strip() for s in value.split(",")]
    elif isinstance(value, list) and all(isinstance(s, str) for s in value):
        items = [s.strip() for s in value]
    else:
        raise ConfigError(f"{path}: {key} must be a string or a list of strings, got {value!r}")
    if not items or any(not s for s in items):
        raise ConfigError(f"{path}: {key} has an empty entry: {value!r}")
    return items


def _split(spec, where: str) -> list[str]:
    """Like _str_list, for command-line values: ``where`` already names the option or file/key."""
    if isinstance(spec, str):
        items = [s.strip() for s in spec.split(",")]
    elif isinstance(spec, (list, tuple)) and all(isinstance(s, str) for s in spec):
        items = [s.strip() for s in spec]
    else:
        raise ConfigError(f"{where}: expected a string or a list of strings, got {spec!r}")
    if not items or any(not s for s in items):
        raise ConfigError(f"{where}: empty entry in {spec!r}")
    return items


# --- head presets ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Preset:
    """A head configuration: name ``hk{h_qk}_hv{h_v}`` and the model it stands for."""

    name: str
    h_qk: int
    h_v: int
    model: str


def load_presets(directory: Path | None = None) -> dict[str, Preset]:
    path = (directory or config_dir()) / "heads.toml"
    data = _load_toml(path)
    table = data.get("presets")
    if not isinstance(table, dict) or not table:
        raise ConfigError(f"{path}: expected a [presets.<name>] table, found keys {sorted(data)}")
    presets = {}
    for name, entry in table.items():
        key = f"presets.{name}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: {key} must be a table, got {entry!r}")
        unknown = set(entry) - {"h_qk", "h_v", "model"}
        if unknown:
            raise ConfigError(f"{path}: {key} has unknown keys {sorted(unknown)}")
        h_qk = _int(path, f"{key}.h_qk", entry.get("h_qk"))
        h_v = _int(path, f"{key}.h_v", entry.get("h_v"))
        if h_v % h_qk:
            raise ConfigError(f"{path}: {key}: h_v={h_v} is not a multiple of h_qk={h_qk}")
        if name != f"hk{h_qk}_hv{h_v}":
            raise ConfigError(f"{path}: {key}: name must be hk{h_qk}_hv{h_v} for h_qk={h_qk}, h_v={h_v}")
        model = entry.get("model", name)
        if not isinstance(model, str):
            raise ConfigError(f"{path}: {key}.model must be a string, got {model!r}")
        presets[name] = Preset(name, h_qk, h_v, model)
    return presets


def resolve_preset(name: str, presets: dict[str, Preset] | None = None) -> Preset:
    """A listed preset, or any ``hkN_hvM`` (label = the name); ValueError for anything else."""
    name = name.strip()
    if presets is None:
        presets = load_presets()
    if name in presets:
        return presets[name]
    m = _PRESET_NAME.match(name)
    if not m:
        raise ConfigError(f"bad head preset {name!r}: expected hk<h_qk>_hv<h_v> (e.g. hk16_hv32); "
                          f"listed: {', '.join(presets)}")
    h_qk, h_v = int(m.group(1)), int(m.group(2))
    if h_qk < 1 or h_v < 1 or h_v % h_qk:
        raise ConfigError(f"bad head preset {name!r}: h_v must be a positive multiple of h_qk >= 1")
    return Preset(name, h_qk, h_v, name)


# --- sequence-length sets --------------------------------------------------------------------------


@dataclass(frozen=True)
class SeqlenSets:
    sets: dict[str, tuple[str, ...]]
    defaults: dict[str, str]
    cut_seed: int = DEFAULT_CUT_SEED
    path: Path | None = None

    def patterns(self, spec, where: str = "--seqlens") -> list[Pattern]:
        """Set names and/or patterns (list or comma string) -> parsed patterns, duplicates dropped."""
        items = _split(spec, where)
        out: list[Pattern] = []
        for item in items:
            texts = self.sets.get(item, (item,))
            for text in texts:
                try:
                    p = parse_pattern(text, self.cut_seed)
                except (TypeError, ValueError) as e:
                    raise ConfigError(f"{where}: {e}") from None
                if p.name not in {x.name for x in out}:
                    out.append(p)
        return out

    def default_for(self, phase: str) -> list[Pattern]:
        name = self.defaults.get(phase)
        if name is None:
            raise ConfigError(f"{self.path}: [defaults] has no set for phase {phase!r}")
        return self.patterns([name], where=f"{self.path}: defaults.{phase}")


def load_seqlens(directory: Path | None = None) -> SeqlenSets:
    path = (directory or config_dir()) / "seqlens.toml"
    data = _load_toml(path)
    cut_seed = _int(path, "cut_seed", data.get("cut_seed", DEFAULT_CUT_SEED), minimum=0)
    raw_sets = data.get("sets")
    if not isinstance(raw_sets, dict) or not raw_sets:
        raise ConfigError(f"{path}: expected [sets.<name>] tables with a patterns list")
    sets = {}
    for name, entry in raw_sets.items():
        if not isinstance(entry, dict) or "patterns" not in entry:
            raise ConfigError(f"{path}: sets.{name} must be a table with a 'patterns' list")
        pats = _str_list(path, f"sets.{name}.patterns", entry["patterns"])
        for text in pats:
            try:
                parse_pattern(text, cut_seed)
            except ValueError as e:
                raise ConfigError(f"{path}: sets.{name}.patterns: {e}") from None
        sets[name] = tuple(pats)
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise ConfigError(f"{path}: [defaults] must be a table of phase = set name")
    for phase, name in defaults.items():
        if phase not in PHASES:
            raise ConfigError(f"{path}: defaults.{phase}: unknown phase; known: {', '.join(PHASES)}")
        if name not in sets:
            raise ConfigError(f"{path}: defaults.{phase} = {name!r} is not a set ({', '.join(sets)})")
    return SeqlenSets(sets, dict(defaults), cut_seed, path)


# --- sweeps ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One measured point: a head preset, a seqlen pattern, a phase and the input recipe (gate
    profile, beta profile, h0 scale; qlabench/workload.py)."""

    phase: str
    preset: Preset
    pattern: Pattern
    gate_profile: str = "bench"
    dtype: str = "bfloat16"
    beta_profile: str = DEFAULT_BETA_PROFILE
    h0_scale: float = DEFAULT_H0_SCALE

    @property
    def inputs(self) -> str:
        """The input recipe in words: ``qwen``, ``extreme beta=near1``, ``bench h0x100``."""
        return inputs_label(self.gate_profile, self.beta_profile, self.h0_scale)

    @property
    def label(self) -> str:
        return f"{self.phase}-{self.preset.name}-{self.pattern.name}-{self.inputs.replace(' ', '-')}"


@dataclass
class Sweep:
    """A named list of cases plus the backends and settings to run them with."""

    name: str
    cases: list[Case]
    backends: list[str] | None = None
    arch: str | None = None
    description: str = ""
    settings: dict = field(default_factory=dict)  # warmup / repeats from the sweep file
    dtype: str = "bfloat16"  # of every case (its inputs q, k, v, do)

    @property
    def phases(self) -> list[str]:
        return list(dict.fromkeys(c.phase for c in self.cases))


def parse_phases(spec) -> list[str]:
    items = _split(spec, "phases")
    out = []
    for p in items:
        if p == "all":
            out.extend(PHASES)
        elif p in PHASES:
            out.append(p)
        else:
            raise ConfigError(f"unknown phase {p!r}; known: {', '.join(PHASES)}, all")
    return list(dict.fromkeys(out))


def check_gate_profile(profile: str, where: str = "--gate-profile") -> str:
    if profile not in GATE_PROFILES:
        raise ConfigError(f"{where}: unknown gate profile {profile!r}; known: {', '.join(GATE_PROFILES)}")
    return profile


def build_cases(presets: list[Preset], phases: list[str], seqlens: SeqlenSets, seqlen_spec=None,
                gate_profile: str = "bench", where: str = "--seqlens",
                beta_profile: str = DEFAULT_BETA_PROFILE, h0_scale: float = DEFAULT_H0_SCALE) -> list[Case]:
    """Cases grouped per head preset (all its phases and patterns together: compile caches stay warm).

    ``seqlen_spec``: None (each phase's default set), a list/comma string of sets or patterns for all
    phases, or a dict phase -> such a spec.
    """
    check_gate_profile(gate_profile)
    cases = []
    for preset in presets:
        for phase in phases:
            spec = seqlen_spec.get(phase) if isinstance(seqlen_spec, dict) else seqlen_spec
            patterns = (seqlens.default_for(phase) if spec is None
                        else seqlens.patterns(spec, where=where))
            cases.extend(Case(phase, preset, p, gate_profile, beta_profile=beta_profile, h0_scale=h0_scale)
                         for p in patterns)
    return cases


def describe_cases(cases: list[Case]) -> list[str]:
    """One line per case (phase, preset, pattern, sequences, tokens, padding tail, inputs) under a header."""
    lines = [f"{'phase':6} {'preset':10} {'pattern':28} {'seqs':>5} {'tokens':>7} {'pad':>5}  inputs"]
    for c in cases:
        p = c.pattern
        lines.append(f"{c.phase:6} {c.preset.name:10} {p.name:28} {p.n_seqs:5d} {p.total_tokens:7d} "
                     f"{p.pad:5d}  {c.inputs}")
    return lines


def group_by_preset(cases: list[Case], phases: list[str] | None = None) -> list[Case]:
    """Duplicates dropped, then a stable sort by preset (first appearance), and by ``phases`` order
    inside a preset when given."""
    cases = list(dict.fromkeys(cases))
    order = {p: i for i, p in enumerate(dict.fromkeys(c.preset for c in cases))}
    rank = {p: i for i, p in enumerate(phases or ())}
    return sorted(cases, key=lambda c: (order[c.preset], rank.get(c.phase, 0)))


def reselect(cases: list[Case], seqlens: SeqlenSets, presets: list[Preset] | None = None,
             phases: list[str] | None = None, seqlen_spec=None, gate_profile: str | None = None) -> list[Case]:
    """A sweep's cases with what the command line replaces; None keeps the sweep's choice.

    ``phases``: the sweep's cases of those phases; a phase the sweep lacks gets each preset's default
    set under every input recipe of the sweep. ``seqlen_spec`` replaces the patterns of every (phase,
    preset, inputs) the sweep has; ``presets`` the presets of every (phase, pattern, inputs); and
    ``gate_profile`` every case's gate. On a plain sweep (no [[groups]]) this is the cross product the
    options name; on a grouped one it keeps the groups' pairings.
    """
    if gate_profile is not None:
        check_gate_profile(gate_profile)
    recipes = list(dict.fromkeys((c.gate_profile, c.beta_profile, c.h0_scale) for c in cases))
    if phases is not None:
        have = {c.phase for c in cases}
        kept = [c for c in cases if c.phase in phases]
        for phase in (p for p in phases if p not in have):
            kept += [Case(phase, preset, pattern, g, beta_profile=b, h0_scale=h)
                     for preset in dict.fromkeys(c.preset for c in cases)
                     for pattern in seqlens.default_for(phase) for g, b, h in recipes]
        cases = kept
    if seqlen_spec is not None:
        patterns = seqlens.patterns(seqlen_spec)
        cases = [replace(c, pattern=p) for c in dict.fromkeys(replace(c, pattern=None) for c in cases)
                 for p in patterns]
    if presets is not None:
        rest = list(dict.fromkeys(replace(c, preset=None) for c in cases))
        cases = [replace(c, preset=p) for p in presets for c in rest]
    if gate_profile is not None:
        cases = [replace(c, gate_profile=gate_profile) for c in cases]
    return group_by_preset(cases, phases)


def _group_cases(path: Path, entry: dict, where: str, presets, seqlens: SeqlenSets) -> list[Case]:
    """The cross product of one group (or of a sweep without groups): presets x phases x patterns x
    gate profiles x beta profiles x h0 scales. ``where`` prefixes key names in messages."""
    if "presets" not in entry:
        raise ConfigError(f"{path}: missing key '{where}presets'")
    try:
        chosen = [resolve_preset(n, presets) for n in _str_list(path, f"{where}presets", entry["presets"])]
    except ConfigError as e:
        raise ConfigError(f"{path}: {where}presets: {e}") from None
    try:
        phases = parse_phases(entry.get("phases", ["fwd"]))
    except ConfigError as e:
        raise ConfigError(f"{path}: {where}phases: {e}") from None
    gates = _str_list(path, f"{where}gate_profile", entry.get("gate_profile", "bench"))
    for gate in gates:
        check_gate_profile(gate, where=f"{path}: {where}gate_profile")
    betas = _str_list(path, f"{where}beta_profile", entry.get("beta_profile", DEFAULT_BETA_PROFILE))
    try:
        betas = [check_beta_profile(b) for b in betas]
    except ValueError as e:
        raise ConfigError(f"{path}: {where}beta_profile: {e}") from None
    scales = entry.get("h0_scale", DEFAULT_H0_SCALE)
    try:
        scales = [check_h0_scale(x) for x in (scales if isinstance(scales, list) and scales else [scales])]
    except ValueError as e:
        raise ConfigError(f"{path}: {where}h0_scale: {e}") from None
    spec = entry.get("seqlens")
    if isinstance(spec, dict):
        bad = set(spec) - set(PHASES)
        if bad:
            raise ConfigError(f"{path}: {where}seqlens has unknown phases {sorted(bad)}")
    elif spec is not None:
        spec = _str_list(path, f"{where}seqlens", spec)
    cases = []
    for gate in gates:
        for beta in betas:
            for scale in scales:
                cases += build_cases(chosen, phases, seqlens, spec, gate, where=f"{path}: {where}seqlens",
                                     beta_profile=beta, h0_scale=scale)
    return cases


def sweep_names(directory: Path | None = None) -> list[str]:
    folder = (directory or config_dir()) / "sweeps"
    return sorted(p.stem for p in folder.glob("*.toml")) if folder.is_dir() else []


def load_sweep(name_or_path: str, directory: Path | None = None, presets=None, seqlens=None) -> Sweep:
    """A sweep by name (``configs/sweeps/<name>.toml``) or by path to a .toml file."""
    directory = directory or config_dir()
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = directory / "sweeps" / f"{name_or_path}.toml"
        if not path.is_file():
            raise ConfigError(f"unknown sweep {name_or_path!r}; known: "
                              f"{', '.join(sweep_names(directory)) or '(none)'} in {directory / 'sweeps'}")
    data = _load_toml(path)
    unknown = set(data) - _SWEEP_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown keys {sorted(unknown)}; known: {sorted(_SWEEP_KEYS)}")
    presets = presets if presets is not None else load_presets(directory)
    seqlens = seqlens if seqlens is not None else load_seqlens(directory)
    top = {k: v for k, v in data.items() if k in _GROUP_KEYS}
    groups = data.get("groups")
    if groups is None:
        cases = _group_cases(path, top, "", presets, seqlens)
    else:
        if not (isinstance(groups, list) and groups and all(isinstance(g, dict) for g in groups)):
            raise ConfigError(f"{path}: groups must be one or more [[groups]] tables, got {groups!r}")
        cases = []
        for i, group in enumerate(groups):
            unknown = set(group) - _GROUP_KEYS
            if unknown:
                raise ConfigError(f"{path}: groups[{i}] has unknown keys {sorted(unknown)}; "
                                  f"known: {sorted(_GROUP_KEYS)}")
            cases += _group_cases(path, {**top, **group}, f"groups[{i}].", presets, seqlens)
        cases = group_by_preset(cases)
    backends = _str_list(path, "backends", data["backends"]) if "backends" in data else None
    settings = {k: _int(path, k, data[k], minimum=0 if k == "warmup" else 1)
                for k in ("warmup", "repeats") if k in data}
    arch = data.get("arch")
    if arch is not None and arch not in ARCHS:
        raise ConfigError(f"{path}: arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    dtype = data.get("dtype", "bfloat16")
    if dtype not in DTYPES:
        raise ConfigError(f"{path}: dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return Sweep(name=path.stem, cases=[replace(c, dtype=dtype) for c in cases], backends=backends, arch=arch,
                 description=str(data.get("description", "")), settings=settings, dtype=dtype)
